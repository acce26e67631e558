"""The ``warpfleet`` command line: sweep, optimize, show, export, validate."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from cluster.config import RunPlan, load_run
from cluster.core.errors import ConfigError
from cluster.core.registry import EXPORT_FORMATS


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends in one line on stderr and exit status 2, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper


class _OneLineErrors(click.Group):
    """Usage errors (an unknown option, a bad value) in one line, like every other bad input."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx else ""
            click.echo(f"error: {where}{exc.format_message()}", err=True)
            sys.exit(2)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)


@click.group(cls=_OneLineErrors)
@click.version_option(package_name="warpfleet")
def main() -> None:
    """Profile-guided tuning of CUDA (and C) programs, swept over a Ray cluster."""


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--address", help="Ray cluster to join (auto, HOST:PORT, ray://...); default: a local instance.")
@click.option("--resume", "resume", type=click.Path(file_okay=False), help="Continue this run directory.")
@click.option("--trials", type=click.IntRange(min=1), help="Evaluated candidates per study (overrides the config).")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), help="Seconds of search (overrides).")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where run directories go (overrides).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@_one_line_errors
def sweep(config: str, address: str | None, resume: str | None, trials: int | None,
          time_budget: float | None, output_dir: str | None, progress: bool | None, unsandboxed: bool) -> None:
    """Sweep the targets of CONFIG, then print the best configurations."""
    from cluster.engine.driver import Sweep
    from cluster.store.rundir import RunDir

    plan = _override(load_run(config), trials, time_budget, output_dir)
    policy = _isolate(plan, unsandboxed)
    run_dir = RunDir.open(resume) if resume else RunDir.create(plan)
    _record_sandbox(run_dir.path, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    show_progress = sys.stderr.isatty() if progress is None else progress
    summary = Sweep(plan, run_dir, log=lambda m: click.echo(m, err=True)).run(address, show_progress)
    click.echo(f"{summary.evaluated} rows written to {run_dir.path / 'results'}", err=True)
    _show(run_dir.path)


def _override(plan: RunPlan, trials: int | None, time_budget: float | None, output_dir: str | None) -> RunPlan:
    search = plan.config.search.model_copy(update={
        k: v for k, v in {"trials": trials, "time_budget_s": time_budget}.items() if v is not None})
    update: dict[str, Any] = {"search": search}
    if output_dir:
        update["output_dir"] = output_dir
    return RunPlan(plan.config.model_copy(update=update), plan.file, plan.targets)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@_one_line_errors
def validate(config: str) -> None:
    """Check CONFIG and its targets without running anything."""
    plan = load_run(config)
    for target in plan.targets:
        click.echo(f"{target.name}: {target.spec.toolchain}, space {target.space.name}, "
                   f"{target.space_size()} configurations")


@main.command()
@click.argument("run", type=click.Path(file_okay=False))
@_one_line_errors
def show(run: str) -> None:
    """Best configuration per target and GPU, with its speedup over the baseline."""
    _show(Path(run))


def _show(path: Path) -> None:
    from cluster.outputs.select import select_best
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir

    run_dir = RunDir.open(path)
    rows = read_results(run_dir.path)
    best = {(b.target, b.device_type): b for b in select_best(rows)}
    table = Table(title=f"warpfleet run {run_dir.run_id}")
    for column in ("target", "device", "evaluated", "failed", "baseline", "best", "speedup", "configuration"):
        table.add_column(column, justify="right" if column in {"evaluated", "failed", "speedup"} else "left",
                         overflow="fold")
    console = Console() if sys.stdout.isatty() else Console(width=200)  # files and pipes get whole lines
    if rows.empty:
        console.print("no results yet")
        return
    for (target, device), group in rows.groupby(["target", "device_type"], sort=True):
        search = group[group["phase"].isin(["search", "evaluate"])]  # evaluate: a run of warpfleet evaluate
        failed = search[search["status"] != "ok"]
        b = best.get((str(target), str(device)))
        if b is None:
            status = ", ".join(f"{s} {n}" for s, n in group["status"].value_counts().items())
            table.add_row(str(target), str(device), str(len(search)), str(len(failed)), "-", "-", "-",
                          f"no correct candidate ({status})")
            continue
        config = " ".join([*b.flag_argv, *b.defines]) or "(baseline)"
        table.add_row(b.target, b.device_type, str(len(search)), str(len(failed)),
                      f"{b.baseline_median:.4g} {b.unit}", f"{b.median:.4g} ± {b.iqr:.2g} {b.unit}",
                      f"{b.speedup:.2f}x", config)
    console.print(table)
    _show_pareto(console, rows)
    _show_profiles(console, run_dir.path, rows, best)


def _show_profiles(console: Console, run: Path, rows: Any, best: dict[tuple[str, str], Any]) -> None:
    """What Nsight Compute saw for each study's baseline and winner: the metrics behind a speedup."""
    import pandas as pd

    from cluster.core.types import Status
    from cluster.runners.profile import (
        BANK_CONFLICT_METRICS,
        LOCAL_MEMORY_METRICS,
        PROFILE_SCHEMA,
        MetricValue,
        Profile,
        top_stalls,
    )
    from cluster.store.results import read_table

    profiles = read_table(run, "profiles", PROFILE_SCHEMA)
    profiles = profiles[profiles["status"] == "ok"]
    if profiles.empty:
        return
    table = Table(title="Nsight Compute: baseline and winner")
    for column in ("target", "candidate", "duration", "bank conflicts (ld+st)", "achieved occupancy",
                   "local memory (ld+st)", "top stalls"):
        table.add_column(column, overflow="fold")
    baselines = rows[rows["phase"] == "baseline"].set_index(["target", "device_type"])["candidate_key"].to_dict()
    for (target, device), group in profiles.groupby(["target", "device_type"], sort=True):
        winner = best.get((str(target), str(device)))
        for label, key in (("baseline", baselines.get((target, device))),
                           ("winner", winner.candidate_key if winner else None)):
            mine = group[group["candidate_key"] == key]
            if key is None or mine.empty or (label == "winner" and key == baselines.get((target, device))):
                continue
            values = tuple(MetricValue(int(r.launch), r.kernel, r.metric, r.unit, r.value)
                           for r in mine.itertuples() if pd.notna(r.value))
            profile = Profile(key, Status.OK, values)

            def total(*names: str, p: Profile = profile) -> float:
                return sum(v for name in names for v in p.metric(name))

            occupancy = profile.metric("sm__warps_active.avg.pct_of_peak_sustained_active")
            stalls = ", ".join(f"{reason} {value:.2g}" for reason, value in top_stalls(profile, 3))
            table.add_row(str(target), label,
                          f"{total('gpu__time_duration.sum') / 1e6:.4g} ms",
                          f"{total(*BANK_CONFLICT_METRICS):,.0f}",
                          f"{sum(occupancy) / len(occupancy):.1f}%" if occupancy else "-",
                          f"{total(*LOCAL_MEMORY_METRICS):,.0f} B",
                          stalls or "-")
    console.print(table)


def _show_pareto(console: Console, rows: Any) -> None:
    """The time/energy Pareto front of each study that measured energy (GPU workers)."""
    from cluster.outputs.select import pareto_front

    for (target, device), group in rows.groupby(["target", "device_type"], sort=True):
        front = pareto_front(group)
        if front.empty:
            continue
        table = Table(title=f"time/energy Pareto front: {target} on {device}")
        for column in ("time", "energy per sample", "power", "configuration"):
            table.add_column(column, overflow="fold")
        for _, row in front.iterrows():
            config = " ".join(filter(None, [row["flags"], row["defines"]])) or "(baseline)"
            power = f"{row['power_w']:.0f} W" if row["power_w"] == row["power_w"] else "-"
            table.add_row(f"{row['median']:.4g} {row['unit']}", f"{row['energy_j'] * 1000:.4g} mJ", power, config)
        console.print(table)


@main.command()
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--experts", default="registers,unroll,padding,streamify", show_default=True,
              help="Comma-separated rule-based experts to run.")
@click.option("--trials", type=click.IntRange(min=1), default=24, show_default=True,
              help="Candidates searched over the verified variants and the flags.")
@click.option("--sanitizer", default="memcheck,racecheck", show_default=True,
              help="compute-sanitizer tools run on every transformed source (GPU); '' for none.")
@click.option("--address", help="Ray cluster to join; default: a local instance.")
@click.option("--output-dir", type=click.Path(file_okay=False), default="runs", show_default=True)
@click.option("--resume", "resume", type=click.Path(file_okay=False), help="Continue this run directory.")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@_one_line_errors
def optimize(target: str, experts: str, trials: int, sanitizer: str, address: str | None, output_dir: str,
             resume: str | None, progress: bool | None, unsandboxed: bool) -> None:
    """Run the optimization workflow on TARGET: analysis, plan, patch, verify, then a search over the
    verified variants and the compiler flags; writes report.md in the run directory and prints it."""
    import yaml

    from cluster.config import load_target
    from cluster.engine.driver import Sweep
    from cluster.outputs.optimize_report import write_report
    from cluster.store.rundir import RunDir

    spec = load_target(target)
    config = {"name": f"optimize-{spec.name}", "output_dir": str(Path(output_dir).resolve()),
              "targets": [str(Path(target).resolve())], "search": {"trials": trials},
              "agents": {"enabled": True, "experts": [e for e in experts.split(",") if e],
                         "sanitizer": [t for t in sanitizer.split(",") if t]}}
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    config_path = Path(output_dir) / f"optimize-{spec.name}.yaml"
    config_path.write_text("# written by `warpfleet optimize`; `warpfleet sweep` takes it as it is\n"
                           + yaml.safe_dump(config, sort_keys=False))
    plan = load_run(config_path)
    policy = _isolate(plan, unsandboxed)
    run_dir = RunDir.open(resume) if resume else RunDir.create(plan)
    _record_sandbox(run_dir.path, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    show_progress = sys.stderr.isatty() if progress is None else progress
    Sweep(plan, run_dir, log=lambda m: click.echo(m, err=True)).run(address, show_progress)
    report = write_report(run_dir.path)
    click.echo(report.read_text())
    click.echo(f"report: {report}", err=True)


@main.command()
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(list(EXPORT_FORMATS)), default="flags", show_default=True,
              help="t4: Kernel Tuner's results format, one target on one device; bundle: all of them in a folder.")
@click.option("--output", type=click.Path(), help="Write here instead of stdout (bundle: the folder, required).")
@click.option("--target", help="Only this target.")
@click.option("--device", help="Only device types whose name contains this (H100, sm_90).")
@_one_line_errors
def export(run: str, fmt: str, output: str | None, target: str | None, device: str | None) -> None:
    """Export the best configurations of RUN for a build."""
    from cluster.outputs.exports import WRITES_FOLDER, ExportError, ExportRequest, render
    from cluster.outputs.select import select_best
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir

    run_dir = RunDir.open(run)
    rows = read_results(run_dir.path)
    best = select_best(rows)
    if target:
        best = [b for b in best if b.target == target]
        if not best:
            raise ConfigError(run, "--target", f"no selected configuration for target {target!r}")
    if device:
        best = [b for b in best if device.lower() in b.device_type.lower()]
        if not best:
            raise ConfigError(run, "--device", f"no selected configuration on a device matching {device!r}")
    if not best:
        raise ConfigError(run, "results", "no correct candidate to export")
    request = ExportRequest(best, rows, run_dir.path, Path(output) if output else None)
    try:
        text = render(fmt, request)
    except ExportError as exc:
        raise ConfigError(output if exc.option == "--output" and output else run, exc.option, str(exc)) from None
    if fmt in WRITES_FOLDER:
        click.echo(text, err=True)
    elif output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=not text.endswith("\n"))


# -- portability: evaluate, compare, report (issue 6) ------------------------------------------
@main.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("--config", type=click.Path(dir_okay=False),
              help="The run config of the configurations' targets (default: the first run directory's).")
@click.option("--runs", type=click.IntRange(min=1),
              help="Program runs per configuration (default: measure.final_runs).")
@click.option("--address", help="Ray cluster to join (auto, HOST:PORT, ray://...); default: a local instance.")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where the run directory goes (overrides).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@_one_line_errors
def evaluate(sources: tuple[str, ...], config: str | None, runs: int | None, address: str | None,
             output_dir: str | None, unsandboxed: bool) -> None:
    """Measure the configurations of SOURCES (run directories: their winners; export files from
    warpfleet export --format json or yaml) on the devices at hand, with the baseline measured again."""
    from cluster.engine.evaluate import Evaluation, create_run_dir, plan_for

    plan, origins = plan_for(list(sources), config)
    policy = _isolate(plan, unsandboxed)
    run_dir = create_run_dir(plan, origins, list(sources), output_dir)
    _record_sandbox(run_dir.path, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    summary = Evaluation(plan, origins, run_dir, runs, log=lambda m: click.echo(m, err=True)).run(address)
    click.echo(f"{summary.rows} rows written to {run_dir.path / 'results'}", err=True)
    click.echo(f"compare: warpfleet compare {' '.join(sources)} {run_dir.path}", err=True)



@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--arch", "archs", multiple=True, callback=lambda ctx, param, value: _archs(value),
              help="Also compile each configuration for this arch (sm_80): ptxas's registers, spills and "
              "shared memory where no GPU of it is at hand. Repeatable.")
@click.option("--config", type=click.Path(dir_okay=False),
              help="The run config of the targets, for compiling (default: each run's).")
@click.option("--compile/--no-compile", "compile_missing", default=True, show_default=True,
              help="Compile configurations for archs no run built them for.")
@_one_line_errors
def compare(runs: tuple[str, ...], fmt: str, output: str | None, archs: tuple[str, ...], config: str | None,
            compile_missing: bool) -> None:
    """The portability matrix per target over RUNS: each configuration tuned on one device type,
    measured on another, as a share of that one's own best; and the best worst case."""
    from cluster.outputs.compare import add_resources, build_matrices, load_run_dir, load_targets
    from cluster.outputs.compare_text import to_json, to_markdown

    loaded = [load_run_dir(run) for run in runs]
    targets, problems = load_targets(loaded, config) if compile_missing else ({}, [])
    for problem in problems:
        click.echo(problem, err=True)
    matrices = [add_resources(m, loaded, archs, targets if compile_missing else None) for m in build_matrices(loaded)]
    text = to_json(matrices) if fmt == "json" else to_markdown(matrices)
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)



def _archs(values: tuple[str, ...]) -> tuple[str, ...]:
    import re

    for arch in values:
        if not re.fullmatch(r"sm_\d+[a-z]?", arch):
            raise click.BadParameter(f"{arch!r}: an arch is sm_ and a compute capability's digits (sm_80, sm_90a)")
    return values



@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--output", type=click.Path(file_okay=False), help="The report's folder (default: FIRST_RUN/report).")
@_one_line_errors
def report(runs: tuple[str, ...], output: str | None) -> None:
    """An HTML report (self-contained) and markdown with PNG plots of RUNS: speedups, portability,
    search progress, time against energy, parameter importance."""
    from cluster.outputs.report import write_report

    out = Path(output) if output else Path(runs[0]) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(out, "--output", f"cannot be written ({exc.strerror})") from None
    page, markdown = write_report(list(runs), out)
    click.echo(f"wrote {page} and {markdown}", err=True)


# -- the sandbox (issue 16) ---------------------------------------------------------------------
def _isolate(plan: RunPlan, unsandboxed: bool) -> Any:
    """The run's sandbox policy, made this process's and its Ray workers'. Where the sandbox cannot
    start here, a one-line error, unless ``--unsandboxed``."""
    from cluster.runners.isolation import Policy, start_bubblewrap
    from cluster.runners.sandbox import SandboxError

    if unsandboxed:
        click.echo("warning: --unsandboxed: candidates run with this user's rights, files and network", err=True)
        policy = Policy("off", plan.config.sandbox)
    else:
        try:
            start_bubblewrap(plan.config.sandbox)
        except SandboxError as exc:
            raise ConfigError(plan.file, "sandbox", f"cannot start on this node: {exc}; `warpfleet doctor` says "
                              "more, --unsandboxed runs without it") from None
        policy = Policy("bwrap", plan.config.sandbox)
    policy.install()
    return policy


def _record_sandbox(run: Path, policy: Any) -> None:
    """meta.json says how this invocation isolated candidates, and whether any ever ran unsandboxed."""
    import json

    meta_path = run / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["sandbox"] = {"mode": policy.mode, **policy.spec.model_dump()}
    meta["unsandboxed"] = meta.get("unsandboxed", False) or policy.mode == "off"
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")


@main.command()
@click.option("--config", type=click.Path(dir_okay=False), help="A run config whose sandbox: section to check.")
@click.option("--gpu/--no-gpu", default=None, help="Check the GPU in the sandbox (default: where /dev/nvidia* is).")
@_one_line_errors
def doctor(config: str | None, gpu: bool | None) -> None:
    """Whether the sandbox works on this node, and why not: exit status 0 if it does, else 1."""
    from cluster.config import SandboxSpec
    from cluster.runners.doctor import diagnose

    spec = load_run(config).config.sandbox if config else SandboxSpec()
    checks = diagnose(spec, gpu)
    for check in checks:
        click.echo(check.line())
    works = all(check.ok is not False for check in checks)
    click.echo("the sandbox works here" if works else "the sandbox does not work here: sweeps refuse to run "
               "unless given --unsandboxed")
    sys.exit(0 if works else 1)


if __name__ == "__main__":
    main()
