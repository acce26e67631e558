"""Portability: how a configuration tuned on one device does on another.

For each target, a matrix whose rows are configurations (the winner of each sweep study, tuned on
device type X, and the baseline) and whose columns are the device types measured. A cell is the
configuration's performance on Y as a share of Y's own best, the configuration tuned on Y:
``t_best / t_config`` for a time (``v_config / v_best`` for a metric to maximize). 100% is as
good as tuning on Y; less is what reusing X's tuning on Y costs (BAT 2.0's measure: published
cross-architecture reuse kept 58.5-99.9% of the optimum). A budget-limited search on Y can miss
what X found, so a share above 100% happens and is shown as it is.

Configurations are matched across runs by what was built, not by candidate key (which includes
the arch): the target, its source hash, and the flag and define arguments (``config_id``). A cell
comes, in order of preference, from

- one run that measured both the configuration and Y's best on Y (``warpfleet evaluate`` measures
  every winner it is given; a sweep's search may have hit the configuration too), the run with the
  most samples of the two; or
- two runs on Y that each measured the baseline, the configuration's speedup over its run's
  baseline against the best's over its own (``via baselines``);

and is ``not measured`` otherwise, or the failure's status when every measurement failed. The
best worst case is the configuration whose lowest share over all device types is highest, among
those measured on every one of them.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cluster.compile.build import compile_candidate
from cluster.config import Target
from cluster.core.encodings import (
    FLAG_PREFIX,
    PARAM_PREFIX,
    agent_param_text,
    config_id,
    readable_configuration,
    settings,
)
from cluster.core.types import Candidate, Phase, Scalar, Stats, Status
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from cluster.store.select import load_verified, select_best
from cluster.store.variants import stored_variant
from cluster.toolchains import get_toolchain


@dataclass(frozen=True)
class Run:
    """A run directory as compare reads it: its rows (with ``config_id``) and its meta.json."""

    run_id: str
    path: Path
    rows: pd.DataFrame
    meta: dict[str, Any]

    @property
    def is_evaluation(self) -> bool:
        return self.meta.get("kind") == "evaluate"


def load_run_dir(path: str | Path) -> Run:
    run_dir = RunDir.open(path)
    rows = read_results(run_dir.path)
    if len(rows):
        rows["config_id"] = [config_id(t, h, shlex.split(f), shlex.split(d)) for t, h, f, d in
                             zip(rows["target"], rows["source_hash"], rows["flags"], rows["defines"], strict=True)]
    else:
        rows["config_id"] = pd.Series(dtype=str)
    return Run(run_dir.run_id, run_dir.path, rows, run_dir.read_meta())


@dataclass(frozen=True)
class Config:
    """A row of a matrix: one configuration of a target, and the device types it was tuned on."""

    config_id: str
    tuned_on: tuple[str, ...]  # device types it won on; () for the baseline alone
    flag_options: tuple[tuple[str, str], ...]  # (flag name, option) as given, "" options left out
    params: tuple[tuple[str, Scalar], ...]
    source_hash: str
    is_baseline: bool = False
    tuned_in: tuple[str, ...] = ()  # the run each tuned_on entry won in ("" when not known)
    noisy: bool = False  # a win whose re-measurements were noisy (select.noisy_advice)
    unconfirmed: bool = False  # a study's best so far, never re-measured (select.NOT_REMEASURED_NOTE)

    @property
    def label(self) -> str:
        """What it is, and where it was tuned: by device type and run, since two runs on one device
        type (two sweeps on the same CPU) tune two different configurations."""
        runs = self.tuned_in or ("",) * len(self.tuned_on)
        where = [f"{device} in {run}" if run else device for device, run in zip(self.tuned_on, runs, strict=True)]
        tuned = "tuned on " + ", ".join(where) if where else ""
        return "; ".join(filter(None, ["baseline" if self.is_baseline else "", tuned]))

    @property
    def arguments(self) -> str:
        flags = [arg for _, option in self.flag_options for arg in shlex.split(option)]
        return readable_configuration(flags, dict(self.params), False) or "(none)"


@dataclass(frozen=True)
class Cell:
    share: float | None  # of the column's best; None when not measured or failed
    how: str  # "own best", "same run", "via baselines", "not measured", or a failure's status
    run_id: str = ""


@dataclass(frozen=True)
class Resources:
    """ptxas's report of one configuration built for one arch (max over kernels; spills summed)."""

    registers: int | None
    spill_bytes: int | None
    shared_bytes: int | None
    compile_only: bool = False  # built here for the comparison, never run
    error: str = ""


@dataclass(frozen=True)
class Matrix:
    target: str
    unit: str
    goal: str
    devices: tuple[str, ...]
    configs: tuple[Config, ...]
    cells: dict[tuple[str, str], Cell]  # (config_id, device type)
    references: dict[str, str]  # device type -> config_id of its best
    best_worst_case: tuple[str, float, str] | None  # config_id, its lowest share, where
    notes: tuple[str, ...] = ()
    resources: dict[tuple[str, str], Resources] = field(default_factory=dict)  # (config_id, arch)
    archs: tuple[str, ...] = ()

    def config(self, cid: str) -> Config:
        return next(c for c in self.configs if c.config_id == cid)


@dataclass(frozen=True)
class _Measured:
    median: float
    n: int


def _settings(row: pd.Series, prefix: str) -> tuple[tuple[str, Any], ...]:
    """The set flags or params of a row (unset flags, "", left out)."""
    return tuple((k, v) for k, v in settings(row, prefix).items() if v != "")


def _measurements(runs: Sequence[Run], target: str) -> tuple[dict[tuple[str, str, str], _Measured], dict]:
    """Per (run, device type, config_id): the pooled samples' median (final re-measurements when
    the run has them); and per (device type, config_id) the statuses of failed measurements."""
    measured: dict[tuple[str, str, str], _Measured] = {}
    failed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for run in runs:
        rows = run.rows[run.rows["target"] == target] if len(run.rows) else run.rows
        for (device, cid), group in rows.groupby(["device_type", "config_id"], sort=False):
            ok = group[group["status"] == Status.OK.value]
            final = ok[ok["phase"] == Phase.FINAL.value]
            samples = [float(s) for arr in (final if len(final) else ok)["samples"] if arr is not None for s in arr]
            stats = Stats.of(samples)
            if stats is not None:
                measured[(run.run_id, str(device), str(cid))] = _Measured(stats.median, stats.n)
            else:
                failed[(str(device), str(cid))].update(map(str, group["status"]))
    return measured, failed


def _configs(runs: Sequence[Run], target: str) -> list[Config]:
    """The baseline and every winner of the runs' sweep studies of ``target``, plus the origins
    that evaluation runs list (configurations tuned in runs not given here), merged by config_id."""
    found: dict[str, Config] = {}

    def add(cid: str, tuned_on: str, flags: tuple, params: tuple, source_hash: str, baseline: bool = False,
            run_id: str = "", noisy: bool = False, unconfirmed: bool = False) -> None:
        known = found.get(cid) or Config(cid, (), flags, params, source_hash)
        pairs = list(zip(known.tuned_on, known.tuned_in or ("",) * len(known.tuned_on), strict=True))
        if tuned_on and (tuned_on, run_id) not in pairs and not (not run_id and tuned_on in known.tuned_on):
            pairs = [(d, r) for d, r in pairs if (d, r) != (tuned_on, "")] + [(tuned_on, run_id)]  # a run beats none
        found[cid] = dataclasses.replace(known, tuned_on=tuple(d for d, _ in pairs),
                                         tuned_in=tuple(r for _, r in pairs), source_hash=source_hash,
                                         is_baseline=known.is_baseline or baseline, noisy=known.noisy or noisy,
                                         unconfirmed=known.unconfirmed or unconfirmed)

    for run in runs:
        rows = run.rows[run.rows["target"] == target] if len(run.rows) else run.rows
        for _, row in rows[rows["phase"] == Phase.BASELINE.value].drop_duplicates("config_id").iterrows():
            add(row["config_id"], "", _settings(row, FLAG_PREFIX), _settings(row, PARAM_PREFIX), row["source_hash"],
                baseline=True)
        if run.is_evaluation:
            continue
        for best in select_best(rows, load_verified(run.path)):
            row = rows[rows["candidate_key"] == best.candidate_key].iloc[0]
            add(row["config_id"], best.device_type, _settings(row, FLAG_PREFIX), _settings(row, PARAM_PREFIX),
                row["source_hash"], run_id=run.run_id, noisy=best.noisy, unconfirmed=not best.remeasured)
    for run in runs:
        for origin in run.meta.get("evaluated", []) if run.is_evaluation else []:
            if origin["target"] != target:
                continue
            source_hash = origin.get("source_hash") or run.meta.get("targets", {}).get(target, "")
            flags = tuple((k, v) for k, v in origin["flags"] if v)
            params = tuple((k, v) for k, v in origin["params"])
            flag_args = [arg for _, option in flags for arg in shlex.split(option)]
            cid = config_id(target, source_hash, flag_args, [f"-D{k}={v}" for k, v in params])
            add(cid, origin.get("tuned_on", ""), flags, params, source_hash, run_id=origin.get("run_id", ""))
    # the same rows, and the same order within a label, whatever the order the runs were given in
    ordered = [dataclasses.replace(c, tuned_on=tuple(d for d, _ in pairs), tuned_in=tuple(r for _, r in pairs))
               for c in found.values() for pairs in [sorted(zip(c.tuned_on, c.tuned_in, strict=True))]]
    tuned = sorted((c for c in ordered if c.tuned_on), key=lambda c: (c.tuned_in, c.tuned_on, c.config_id))
    return tuned + sorted((c for c in ordered if c.is_baseline and not c.tuned_on), key=lambda c: c.config_id)


def _ratio(best: float, mine: float, goal: str) -> float:
    return best / mine if goal == "minimize" else mine / best


def _cell(cid: str, ref: str, device: str, runs: Sequence[Run], measured: dict, failed: dict, goal: str,
          baseline_ids: set[str]) -> Cell:
    if cid == ref:
        return Cell(1.0, "own best")
    same = [r for r in runs if (r.run_id, device, cid) in measured and (r.run_id, device, ref) in measured]
    if same:
        run_id = max(same, key=lambda r: _preference(r, device, (cid, ref), measured)).run_id
        share = _ratio(measured[(run_id, device, ref)].median, measured[(run_id, device, cid)].median, goal)
        return Cell(share, "same run", run_id)
    for base in sorted(baseline_ids):  # speedups over one baseline, measured in each of two runs
        mine = [r for r in runs if (r.run_id, device, cid) in measured and (r.run_id, device, base) in measured]
        best = [r for r in runs if (r.run_id, device, ref) in measured and (r.run_id, device, base) in measured]
        if mine and best:
            run_a = max(mine, key=lambda r: _preference(r, device, (cid, base), measured)).run_id
            run_b = max(best, key=lambda r: _preference(r, device, (ref, base), measured)).run_id
            a, b = measured[(run_a, device, cid)], measured[(run_b, device, ref)]
            share = _ratio(b.median, a.median, goal) * _ratio(measured[(run_a, device, base)].median,
                                                               measured[(run_b, device, base)].median, goal)
            return Cell(share, "via baselines", f"{run_a} / {run_b}")
    statuses = failed.get((device, cid))
    return Cell(None, ", ".join(sorted(statuses)) if statuses else "not measured")


def _preference(run: Run, device: str, cids: tuple[str, ...], measured: dict) -> tuple[bool, int, str]:
    """Which run's measurement of ``cids`` on ``device`` a cell takes, whatever the order the runs
    were given in: an evaluation (it measured each configuration beside the others on purpose, by
    the same rule) before a sweep (whose search may have hit a configuration once, under other
    load); then the most samples of the fewer measured; then the latest run (ids begin with the
    name and UTC time)."""
    return run.is_evaluation, min(measured[(run.run_id, device, cid)].n for cid in cids), run.run_id


def _reference(device: str, configs: list[Config], runs: Sequence[Run], measured: dict,
               goal: str) -> tuple[str | None, str]:
    """Y's best: the configuration tuned on Y, else the best measured there (and why)."""
    tuned = next((c.config_id for c in configs if device in c.tuned_on), None)
    if tuned is not None:
        return tuned, ""
    here = [(m.median, cid) for (run_id, dev, cid), m in measured.items() if dev == device]
    if not here:
        return None, f"{device}: nothing measured correctly"
    sign = 1.0 if goal == "minimize" else -1.0
    _, best = min(here, key=lambda pair: (sign * pair[0], pair[1]))
    return best, f"{device}: no sweep of this target here; shares are of the best configuration measured on it"


def build_matrix(runs: Sequence[Run], target: str) -> Matrix:
    """The portability matrix of ``target`` over ``runs`` (see the module docstring)."""
    rows = pd.concat([r.rows[r.rows["target"] == target] for r in runs if len(r.rows)])
    goal, unit = str(rows["goal"].iloc[0]), str(rows["unit"].iloc[0])
    devices = tuple(sorted(set(rows["device_type"])))
    configs = _configs(runs, target)
    measured, failed = _measurements(runs, target)
    baseline_ids = {c.config_id for c in configs if c.is_baseline}
    cells: dict[tuple[str, str], Cell] = {}
    references: dict[str, str] = {}
    notes = []
    for device in devices:
        ref, note = _reference(device, configs, runs, measured, goal)
        if note:
            notes.append(note)
        if ref is None:
            continue
        references[device] = ref
        for config in configs:
            cells[(config.config_id, device)] = _cell(config.config_id, ref, device, runs, measured, failed, goal,
                                                      baseline_ids)
    best, note = _best_worst_case(configs, devices, cells)
    return Matrix(target, unit, goal, devices, tuple(configs), cells, references, best,
                  (*notes, *([note] if note else [])))


def _best_worst_case(configs: list[Config], devices: tuple[str, ...],
                     cells: dict[tuple[str, str], Cell]) -> tuple[tuple[str, float, str] | None, str]:
    complete = []
    for config in configs:
        shares = [(cell.share, device) for device in devices
                  if (cell := cells.get((config.config_id, device))) and cell.share is not None]
        if len(shares) == len(devices) and shares:
            worst, where = min(shares)
            complete.append((worst, config.config_id, where))
    if not complete:
        return None, "no configuration is measured on every device type: no best worst case"
    worst, cid, where = max(complete, key=lambda t: t[0])  # max keeps the first among equals
    return (cid, worst, where), ""


def differences(a: Config, b: Config) -> list[str]:
    """What differs between two configurations: params by value, flags by option."""
    params_a, params_b = dict(a.params), dict(b.params)
    def text(name: str, params: dict[str, Any]) -> str:
        value = params.get(name, "-")
        return agent_param_text(name, value) or f"{name} {value}" if name in params else "-"

    out = [f"{text(name, params_a)} vs {text(name, params_b)}"
           for name in dict.fromkeys([*params_a, *params_b]) if params_a.get(name) != params_b.get(name)]
    options_a = {o for _, o in a.flag_options}
    options_b = {o for _, o in b.flag_options}
    out += [f"{option} only in the first" for option in sorted(options_a - options_b)]
    out += [f"{option} only in the second" for option in sorted(options_b - options_a)]
    return out


def host_targets(runs: Sequence[Run]) -> dict[str, str]:
    """The runs' targets that no GPU arch builds (a ``cc`` target's binary is the host's), with
    their toolchains: ``--arch`` means nothing for them."""
    found = {}
    for run in runs:
        if len(run.rows):
            for target, toolchain in run.rows[["target", "toolchain"]].drop_duplicates().itertuples(index=False):
                if get_toolchain(str(toolchain)).device_kind != "gpu":
                    found[str(target)] = str(toolchain)
    return dict(sorted(found.items()))


def targets_of(runs: Sequence[Run]) -> list[str]:
    return sorted({str(t) for r in runs if len(r.rows) for t in r.rows["target"]})


def build_matrices(runs: Sequence[Run]) -> list[Matrix]:
    return [build_matrix(runs, target) for target in targets_of(runs)]


# -- ptxas resources per arch, compiled here where no run built a configuration for an arch ------
def load_targets(runs: Sequence[Run], config_file: str | None = None) -> tuple[dict[str, Target], list[str]]:
    """The targets of ``config_file``, else of each run's config (meta.json); why some are missing."""
    from cluster.config import load_run
    from cluster.core.errors import ConfigError

    files = [config_file] if config_file else list(dict.fromkeys(
        r.meta["config_file"] for r in runs if r.meta.get("config_file")))
    targets: dict[str, Target] = {}
    problems = []
    for file in files:
        try:
            targets |= {t.name: t for t in load_run(file).targets if t.name not in targets}
        except ConfigError as exc:
            problems.append(f"targets not at hand for compiling: {exc}")
    return targets, problems


def source_for(target: Target, config: Config, runs: Sequence[Run]) -> Target | None:
    """What builds ``config``: the target itself, or the agent's variant that a run stored (in the
    runs it was tuned in first); None when its sources are neither (the target changed since)."""
    if not config.source_hash or config.source_hash == target.bundle.hash:
        return target
    ordered = sorted(runs, key=lambda r: r.run_id not in config.tuned_in)
    return next((v for r in ordered if (v := stored_variant(r.path, target, config.source_hash))), None)


def compile_only(target: Target, config: Config, arch: str) -> Resources:
    """Build ``config`` for ``arch`` here (no GPU needed) and read ptxas's report. ``target`` is what
    builds it (``source_for``: an agent's variant for a variant's winner)."""
    if config.source_hash and config.source_hash != target.bundle.hash:
        return Resources(None, None, None, True, f"the sources of {target.name} changed since the run "
                         f"(no run given stored variant {config.source_hash})")
    candidate = Candidate(target.name, target.spec.toolchain, f"compile only ({arch})", arch, target.bundle.hash,
                          config.flag_options, config.params, Phase.EVALUATE)
    artifact = compile_candidate(target, candidate)
    if artifact.status is not Status.OK:
        lines = [line for line in artifact.error_tail.splitlines() if line.strip()]
        return Resources(None, None, None, True, f"{artifact.status.value}: {lines[-1][:160] if lines else ''}")
    kernels = artifact.kernels
    if not kernels:
        return Resources(None, None, None, True, "no resource report")
    return Resources(max(k.registers for k in kernels), sum(k.spill_stores + k.spill_loads for k in kernels),
                     max(k.shared_bytes for k in kernels), True)


def add_resources(matrix: Matrix, runs: Sequence[Run], archs: Sequence[str] = (),
                  targets: dict[str, Target] | None = None) -> Matrix:
    """The matrix with ptxas's registers, spills and shared memory of each configuration on each
    arch: from the runs' rows where one built it for that arch, else compiled here (``targets``
    given, GPU archs only). Targets whose compiler reports nothing get none."""
    rows = pd.concat([r.rows[r.rows["target"] == matrix.target] for r in runs if len(r.rows)])
    toolchain = str(rows["toolchain"].iloc[0])
    if not get_toolchain(toolchain).report_flags:
        return matrix
    all_archs = tuple(sorted({str(a) for a in rows["arch"]} | set(archs)))
    found: dict[tuple[str, str], Resources] = {}
    reported = rows[rows["registers"].notna()]
    for (cid, arch), group in reported.groupby(["config_id", "arch"], sort=False):
        row = group.iloc[0]
        spills = row["spill_stores"] + row["spill_loads"]
        found[(str(cid), str(arch))] = Resources(int(row["registers"]), int(spills), int(row["shared_bytes"]))
    missing = [(c, arch) for c in matrix.configs for arch in all_archs
               if (c.config_id, arch) not in found and arch.startswith("sm_")]
    if targets is not None and matrix.target in targets and missing:
        target = targets[matrix.target]
        sources = {c.config_id: source_for(target, c, runs) or target for c, _ in missing}
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            built = pool.map(lambda pair: compile_only(sources[pair[0].config_id], *pair), missing)
            found |= {(c.config_id, arch): r for (c, arch), r in zip(missing, built, strict=True)}
    return dataclasses.replace(matrix, resources=found, archs=all_archs)
