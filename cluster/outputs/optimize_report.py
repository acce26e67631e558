"""Step 6 of the workflow, as a report: what the agents found, what survived verification, what
each optimization gained, and why the winner is faster, from the Nsight Compute deltas.

    results/ + variants/ + profiles/ ─► OptimizationResult per (study, optimization) ─► report.md
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cluster.core.encodings import readable_configuration
from cluster.core.types import BestConfig, Phase, Status
from cluster.measure.profile import BANK_CONFLICT_METRICS, LOCAL_MEMORY_METRICS, PROFILE_SCHEMA
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir, is_current_study, read_generations
from cluster.store.select import select_best
from cluster.store.variants import VARIANT_SCHEMA, latest_outcomes

OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"


@dataclass(frozen=True)
class OptimizationResult:
    """The best an optimization reached in one study: alone (its verification run, baseline flags)
    and with the searched flags and params."""

    study: str
    target: str
    optimization: str
    level: str
    evidence: str
    accepted: int
    rejected: int
    alone: float | None  # speedup of the variant at baseline flags and params
    best: float | None  # best speedup of any candidate built from it
    best_key: str = ""


def metric_summary(profiles: pd.DataFrame, key: str) -> dict[str, float]:
    """Duration, bank conflicts, achieved occupancy, local-memory bytes and registers of one candidate."""
    mine = profiles[(profiles["candidate_key"] == key) & (profiles["status"] == "ok") & profiles["value"].notna()]
    if mine.empty:
        return {}

    def total(*names: str) -> float:
        return float(mine.loc[mine["metric"].isin(names), "value"].sum())

    out = {"duration_ms": total("gpu__time_duration.sum") / 1e6, "bank_conflicts": total(*BANK_CONFLICT_METRICS),
           "local_bytes": total(*LOCAL_MEMORY_METRICS)}
    occupancy = mine.loc[mine["metric"] == OCCUPANCY, "value"]
    if len(occupancy):
        out["occupancy_pct"] = float(occupancy.mean())
    registers = mine.loc[mine["metric"] == "launch__registers_per_thread", "value"]
    if len(registers):
        out["registers"] = float(registers.max())
    return out


def _si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def explain(before: dict[str, float], after: dict[str, float], threshold: float = 0.1) -> str:
    """The metric deltas worth a sentence: "bank conflicts 65.6M -> 0; duration 0.335 -> 0.192 ms"."""
    parts = []
    labels = (("bank_conflicts", "bank conflicts", _si), ("occupancy_pct", "achieved occupancy", lambda v: f"{v:.1f}%"),
              ("registers", "registers per thread", lambda v: f"{v:.0f}"),
              ("local_bytes", "local-memory traffic", lambda v: f"{_si(v)}B"),
              ("duration_ms", "kernel time", lambda v: f"{v:.4g} ms"))
    for key, label, fmt in labels:
        a, b = before.get(key), after.get(key)
        if a is None or b is None or (a == 0 and b == 0):
            continue
        if abs(b - a) > threshold * max(abs(a), abs(b)):
            parts.append(f"{label} {fmt(a)} -> {fmt(b)}")
    return "; ".join(parts)


def optimization_results(rows: pd.DataFrame, variants: pd.DataFrame) -> list[OptimizationResult]:
    out = []
    # the search's and verifications' rows: each speedup over the baseline's first measurement (a
    # final row's is over the baseline's re-measurement, which is the winner's line above the table)
    ok = rows[(rows["status"] == Status.OK.value) & rows["speedup"].notna() & (rows["phase"] != Phase.FINAL.value)]
    for (study, optimization), group in variants.groupby(["study", "optimization"], sort=True):
        accepted = group[group["stage"] == "accepted"]
        mine = ok[ok["study"] == study]
        hashes = set(accepted["source_hash"]) - {""}
        registers = [v for s in accepted["search"] for v in json.loads(s or "{}").get("maxrregcount", [])]
        built = mine[mine["source_hash"].isin(hashes)]
        if registers and "f_maxrregcount" in mine:
            base = rows.loc[(rows["study"] == study) & (rows["phase"] == Phase.BASELINE.value), "source_hash"]
            options = {f"-maxrregcount={v}" for v in registers}
            built = pd.concat([built, mine[mine["f_maxrregcount"].isin(options)
                                           & mine["source_hash"].isin(set(base))]])
        # Alone: every flag and every param of the target as the baseline's; a variant's own new
        # params (an unroll factor) and the register cap being studied may take any value.
        alone = built[built["phase"] == Phase.VERIFY.value]
        baseline_rows = rows[(rows["study"] == study) & (rows["phase"] == Phase.BASELINE.value)]
        if len(baseline_rows) and len(built):
            b = baseline_rows.iloc[0]
            others = [c for c in mine.columns if c != "f_maxrregcount"
                      and (c.startswith("f_") or (c.startswith("p_") and _text(b[c]) != ""))]
            same = (built[others].map(_text) == b[others].map(_text)).all(axis=1)
            alone = pd.concat([alone, built[same]])
        built = built[~built.index.duplicated()]
        best_row = built.loc[built["speedup"].idxmax()] if len(built) else None
        evidence = "; ".join(dict.fromkeys(e for e in group["evidence"] if e)).replace("\n", "; ")
        out.append(OptimizationResult(
            str(study), str(group["target"].iloc[0]), str(optimization), str(group["level"].iloc[0]), evidence[:400],
            len(accepted), int((group["stage"] == "rejected").sum()),
            float(alone["speedup"].max()) if len(alone) else None,
            float(best_row["speedup"]) if best_row is not None else None,
            str(best_row["candidate_key"]) if best_row is not None else ""))
    return out


def _text(value: object) -> str:
    return "" if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)) else str(value)


def _fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def _winner_lines(best: BestConfig, rows: pd.DataFrame, variants: pd.DataFrame, profiles: pd.DataFrame) -> list[str]:
    study_rows = rows[rows["target"] == best.target]
    base = study_rows[study_rows["phase"] == Phase.BASELINE.value]
    base_key = str(base["candidate_key"].iloc[0]) if len(base) else ""
    config = readable_configuration(best.flag_argv, best.params, False) \
        or "(baseline flags)"  # the label names the variant
    label = "the target's own sources"
    if best.is_variant:
        match = variants[(variants["source_hash"] == best.source_hash) & (variants["stage"] == "accepted")]
        label = f"variant {best.source_hash}" + (f" ({match['optimization'].iloc[0]} at {match['location'].iloc[0]})"
                                                 if len(match) else "")
    lines = [f"- winner: {label}, {config}",
             f"- speedup {best.speedup:.2f}x: {best.median:.4g} ± {best.iqr:.2g} {best.unit} against the "
             f"baseline's {best.baseline_median:.4g} {best.unit} (median ± IQR of the final runs; {best.reason})"]
    why = explain(metric_summary(profiles, base_key), metric_summary(profiles, best.candidate_key))
    if why:
        lines.append(f"- Nsight Compute, baseline -> winner: {why}")
    return lines


def render(run_dir: Path) -> str:
    rows = read_results(run_dir)
    variants = latest_outcomes(read_table(run_dir, RunDir.VARIANTS, VARIANT_SCHEMA))
    generations = read_generations(run_dir)
    # a mask, not a list: an empty list would select no columns, and the report had no "target"
    variants = variants[variants["study"].map(lambda study: is_current_study(str(study), generations)).astype(bool)]
    profiles = read_table(run_dir, RunDir.PROFILES, PROFILE_SCHEMA)
    best = {b.target: b for b in select_best(rows)} if len(rows) else {}
    lines = [f"# warpfleet optimize: {run_dir.name}", ""]
    if rows.empty and variants.empty:
        lines += ["No study ran: nothing was measured.", ""]
    for target in sorted(set(rows["target"]) | set(variants["target"])):
        lines += [f"## {target}", ""]
        if target in best:
            lines += _winner_lines(best[target], rows, variants, profiles)
        else:
            lines.append("- no correct candidate")
        mine = variants[variants["target"] == target]
        results = [r for r in optimization_results(rows, mine) if r.target == target]
        if results:
            lines += ["", "Speedups measured in the search, over the baseline's first measurement:", "",
                      "| optimization | level | accepted | rejected | alone | best with flags | evidence |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {r.optimization} | {r.level} | {r.accepted} | {r.rejected} | {_fmt(r.alone)} | "
                      f"{_fmt(r.best)} | {r.evidence.replace('|', '/')} |" for r in results]
        lines += ["", "| optimization | where | stage | agents | why |", "|---|---|---|---|---|"]
        for r in mine.itertuples():
            agents = "/".join(dict.fromkeys(a for a in (r.analyst, r.planner, r.transformer) if a))
            reason = (r.reason or "").replace("|", "/").replace("\n", " ")[:200]
            lines.append(f"| {r.optimization} | {r.location} | {r.stage} | {agents} | {reason} |")
        diffs = mine[(mine["stage"] == "accepted") & (mine["diff"] != "")]
        for r in diffs.itertuples():
            lines += ["", f"<details><summary>{r.optimization} at {r.location}: diff</summary>", "",
                      "```diff", r.diff.rstrip(), "```", "</details>"]
        lines.append("")
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path) -> Path:
    path = run_dir / RunDir.REPORT
    path.write_text(render(run_dir))
    return path
