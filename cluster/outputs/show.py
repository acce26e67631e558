"""``warpfleet show``: the best configuration per target and device type, its speedup, the
time/energy Pareto fronts and what Nsight Compute saw, as rich tables; or (``--json``) the studies
and their winners as one JSON document (``run_record``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cluster.core.encodings import readable_configuration
from cluster.core.types import BestConfig, Status
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.select import (
    NOT_REMEASURED_MARK,
    NOT_REMEASURED_NOTE,
    load_verified,
    noisy_advice,
    pareto_front,
    select_best,
)

NOISY_MARK = "*"


def print_table(console: Console, table: Table) -> None:
    """``table`` where its words fit the console's width; else each row as one line of column and
    value, wrapped between words: a column narrower than a word gets it cut ("-DUNROL" / "L=1")."""
    unbounded = console.options.update_width(10_000)  # else rich measures the columns already narrowed
    if Measurement.get(console, unbounded, table).minimum <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(table.title)
    headers = [str(column.header) for column in table.columns]
    for row in zip(*(column.cells for column in table.columns), strict=True):
        console.print("- " + ", ".join(f"{header} {cell}" for header, cell in zip(headers, row, strict=True)
                                       if str(cell).strip()), highlight=False, markup=False)


def speedup_text(value: float) -> str:
    """A speedup as shown: ``-`` where there is none to show (no baseline time, or not positive)."""
    return f"{value:.2f}x" if math.isfinite(value) and value > 0 else "-"


def show(path: Path, console: Console | None = None) -> list[BestConfig]:
    """Print the run's tables; returns the selected configurations."""
    run_dir = RunDir.open(path)
    rows = read_results(run_dir.path)
    selected = select_best(rows, load_verified(run_dir.path))
    best = {(b.target, b.device_type): b for b in selected}
    console = console or (Console() if sys.stdout.isatty() else Console(width=200))  # pipes get whole lines
    if rows.empty:
        console.print("no results yet")
        return selected
    table = Table(title=f"warpfleet run {run_dir.run_id}")
    for column in ("target", "device", "evaluated", "failed", "baseline", "best", "speedup", "configuration"):
        table.add_column(column, justify="right" if column in {"evaluated", "failed", "speedup"} else "left",
                         overflow="fold")
    for (target, device), group in rows.groupby(["target", "device_type"], sort=True):
        search = group[group["phase"].isin(["search", "evaluate"])]  # evaluate: a run of warpfleet evaluate
        failed = search[search["status"] != "ok"]
        b = best.get((str(target), str(device)))
        if b is None:
            status = ", ".join(f"{s} {n}" for s, n in group["status"].value_counts().items())
            table.add_row(str(target), str(device), str(len(search)), str(len(failed)), "-", "-", "-",
                          f"no correct candidate ({status})")
            continue
        config = readable_configuration(b.flag_argv, b.params, b.is_variant) or "(baseline)"
        baseline = f"{b.baseline_median:.4g} {b.unit}" if math.isfinite(b.baseline_median) else "-"
        table.add_row(b.target, b.device_type, str(len(search)), str(len(failed)), baseline,
                      f"{b.median:.4g} ± {b.iqr:.2g} {b.unit}" + (f" {NOISY_MARK}" if b.noisy else "")
                      + ("" if b.remeasured else f" {NOT_REMEASURED_MARK}"),
                      speedup_text(b.speedup), config)
    print_table(console, table)
    for b in selected:  # a winner that is not the fastest: why
        if b.fastest:
            console.print(f"{b.target} on {b.device_type}: selected {b.candidate_key}, {b.reason}")
    if any(b.noisy for b in selected):
        console.print(f"{NOISY_MARK} noisy: {noisy_advice(b.arch for b in selected if b.noisy)}")
    if not all(b.remeasured for b in selected):
        console.print(f"{NOT_REMEASURED_MARK}: {NOT_REMEASURED_NOTE}; `warpfleet export --unconfirmed` exports it")
    _show_pareto(console, rows)
    _show_profiles(console, run_dir.path, rows, best)
    return selected


def run_record(path: Path) -> dict[str, Any]:
    """The run as ``show --json`` prints it: per study (target, device type) what was evaluated and
    failed, and its selected configuration as the json export writes it (null: no correct one)."""
    from cluster.outputs.exports.text import best_record

    run_dir = RunDir.open(path)
    rows = read_results(run_dir.path)
    best = {(b.target, b.device_type): b for b in select_best(rows, load_verified(run_dir.path))}
    studies = []
    for (target, device), group in (rows.groupby(["target", "device_type"], sort=True) if len(rows) else ()):
        search = group[group["phase"].isin(["search", "evaluate"])]
        b = best.get((str(target), str(device)))
        studies.append({"target": str(target), "device_type": str(device), "evaluated": len(search),
                        "failed": int((search["status"] != "ok").sum()),
                        "statuses": {str(s): int(n) for s, n in group["status"].value_counts().items()},
                        "selected": best_record(b) if b is not None else None})
    return {"run_id": run_dir.run_id, "run_dir": str(run_dir.path), "studies": studies}


def _show_profiles(console: Console, run: Path, rows: Any, best: dict[tuple[str, str], Any]) -> None:
    """What Nsight Compute saw for each study's baseline and winner: the metrics behind a speedup."""
    from cluster.measure.profile import (
        BANK_CONFLICT_METRICS,
        LOCAL_MEMORY_METRICS,
        PROFILE_SCHEMA,
        MetricValue,
        Profile,
        top_stalls,
    )

    profiles = read_table(run, RunDir.PROFILES, PROFILE_SCHEMA)
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
    print_table(console, table)


def _show_pareto(console: Console, rows: Any) -> None:
    """The time/energy Pareto front of each study that measured energy (GPU workers)."""
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
        print_table(console, table)


def next_commands(run: Path, selected: list[BestConfig]) -> list[str]:
    """What to run after a sweep: look at the run, and take its winners into a build."""
    unconfirmed = " --unconfirmed" if not all(b.remeasured for b in selected) else ""
    commands = [f"warpfleet show {run}",
                f"warpfleet export {run} --format flags{unconfirmed}   # or json, yaml, header, cmake, t4; "
                f"bundle --output DIR for all of them"]
    if any(b.is_variant for b in selected):
        commands.append(f"warpfleet export {run} --format patch > winner.patch   # the agents' source changes")
    return commands
