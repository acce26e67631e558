"""The figures, from the part files alone (pure pandas; no GPU, no tool imported).

- The exhaustive optimum of a kernel is the fastest configuration the independent timer saw pass
  the check; the "within 1%" set holds every configuration whose median is at most 1.01 x that.
- Time to within 1%: seconds from the start of a tuning call to the first evaluation, by that tool,
  of a configuration in the set that the tool also found correct. A run that never evaluates one is
  censored: infinite, so a median over seeds is infinite when half the runs or more never got there.
  Medians compare like with like: only the seeds that both tools completed (each tool's own when
  they share none).
- Configurations per minute: distinct configurations evaluated / the run's whole wall time (from the
  call to its return: the tool's setup, its final re-measure and its shutdown included).
- The winner: each run's own pick, re-measured at the end by the independent timer with the optimum;
  its ratio to the fastest re-measured configuration.
- Winner changes: distinct winners among the repeated runs (best strategy, seed 0, the same run
  three times), and whether they all lie within 1% of each other when re-measured.
- Scaling: configurations per minute on two GPUs over one GPU, same tool, strategy and seed.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from scripts.kt_compare.records import read_table

WITHIN = 1.01


@dataclass
class Data:
    evals: pd.DataFrame
    runs: pd.DataFrame
    reference: pd.DataFrame
    remeasure: pd.DataFrame
    blocks: pd.DataFrame

    @classmethod
    def load(cls, outs: list[Path]) -> Data:
        return cls(*(read_table(outs, t) for t in ("evals", "runs", "reference", "remeasure", "blocks")))


def optima(reference: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: configurations, how many passed, the optimum and the keys within 1% of it."""
    rows = []
    for kernel, group in reference.groupby("kernel", sort=True):
        ok = group[group["status"] == "ok"].sort_values("median_ms")
        if ok.empty:
            rows.append({"kernel": kernel, "configs": len(group), "ok": 0})
            continue
        best = float(ok["median_ms"].iloc[0])
        good = ok[ok["median_ms"] <= WITHIN * best]
        rows.append({"kernel": kernel, "configs": len(group), "ok": len(ok), "optimum_ms": best,
                     "optimum_key": ok["key"].iloc[0], "within_1pct": len(good),
                     "good_keys": json.dumps(sorted(good["key"]))})
    return pd.DataFrame(rows)


def time_to_target(runs: pd.DataFrame, evals: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """Each run with ``target_s``: when it first evaluated a configuration within 1% (inf: never;
    NaN: unknown, the kernel has no reference)."""
    good = {r.kernel: set(json.loads(r.good_keys)) for r in best.itertuples() if isinstance(r.good_keys, str)}
    out = runs.copy()
    times = []
    for run in out.itertuples():
        if run.kernel not in good:
            times.append(math.nan)
            continue
        trace = evals[(evals["run_id"] == run.run_id) & (evals["status"] == "ok")] if len(evals) else evals
        hits = trace[trace["key"].isin(good.get(run.kernel, set())) & trace["t_s"].notna()] if len(trace) else trace
        times.append(float(hits["t_s"].min()) if len(hits) else math.inf)
    out["target_s"] = times
    return out


def censored_median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def remeasured_ms(data: Data) -> dict[tuple[str, str], float]:
    """(kernel, key) -> the best estimate of its time: the re-measurement, else the reference."""
    out: dict[tuple[str, str], float] = {}
    for table in (data.reference, data.remeasure):  # the re-measurement overrides
        if len(table):
            for r in table[table["status"] == "ok"].itertuples():
                out[(r.kernel, r.key)] = float(r.median_ms)
    return out


def summary(data: Data) -> pd.DataFrame:
    """One row per (kernel, tool, variant, GPUs): every figure of the comparison."""
    if data.runs.empty:
        return pd.DataFrame()
    best = optima(data.reference) if len(data.reference) else pd.DataFrame(columns=["kernel", "good_keys"])
    every = time_to_target(data.runs, data.evals, best)
    every["error"] = every["error"].fillna("")
    runs = every[every["error"] == ""]
    judged = {r.kernel for r in best.itertuples() if isinstance(getattr(r, "good_keys", None), str)}
    times = remeasured_ms(data)
    fastest = {k: min(v for (kk, _), v in times.items() if kk == k) for k, _ in times}
    rows = []
    for (kernel, tool, variant, gpus), tried in every.groupby(["kernel", "tool", "variant", "gpus"], sort=True):
        group = tried[tried["error"] == ""]
        failed = tried[tried["error"] != ""]
        head = {"kernel": kernel, "tool": tool, "variant": variant, "gpus": int(gpus), "runs": len(group),
                "errors": len(failed), "error": str(failed["error"].iloc[0])[:160] if len(failed) else ""}
        if group.empty:  # every run ended in an error: the row says which
            rows.append(head)
            continue
        row = {**head, "evals_per_min": censored_median(list(group["evals_per_min"].dropna())),
               "reference": kernel in judged, "workers_used": int(group["workers_used"].max()),
               "workers_requested": int(group["workers_requested"].max()),
               "strategy_best": ", ".join(sorted(set(group.loc[group["strategy"] == "best", "strategy_name"])))}
        for strategy in ("best", "random"):
            seeds = _shared_seeds(runs, kernel, gpus, strategy) if not variant else None
            mine = group[(group["strategy"] == strategy) & (group["repeat"] == 0)]
            if seeds:  # none shared (one tool has no such run): its own seeds, the count says so
                mine = mine[mine["seed"].isin(seeds)]
            values = [v for v in mine["target_s"] if not math.isnan(v)]
            row[f"target_{strategy}_s"] = censored_median(values)
            row[f"target_{strategy}_reached"] = sum(math.isfinite(v) for v in values)
            row[f"target_{strategy}_runs"] = len(values)
        first = group[(group["strategy"] == "best") & (group["seed"] == 0) & (group["repeat"] == 0)]
        if len(first) and isinstance(first["winner_key"].iloc[0], str):
            key = first["winner_key"].iloc[0]
            row["winner_key"], row["winner_ms"] = key, times.get((kernel, key))
            if row["winner_ms"] and fastest.get(kernel):
                row["winner_vs_optimum"] = row["winner_ms"] / fastest[kernel]
        repeats = group[(group["strategy"] == "best") & (group["seed"] == 0)]
        winners = [k for k in repeats["winner_key"] if isinstance(k, str)]
        row["repeat_runs"], row["repeat_distinct_winners"] = len(repeats), len(set(winners))
        known = [times[(kernel, k)] for k in set(winners) if (kernel, k) in times]
        row["repeat_winners_within_1pct"] = bool(known) and len(known) == len(set(winners)) and \
            max(known) <= WITHIN * min(known)
        if gpus > 1:
            row["scaling"] = _scaling(runs, kernel, tool, variant, int(gpus))
            row["efficiency"] = row["scaling"] / int(gpus)
        rows.append(row)
    return pd.DataFrame(rows)


def _shared_seeds(runs: pd.DataFrame, kernel: str, gpus: int, strategy: str) -> set[int]:
    """The seeds of this strategy that every tool completed (first runs, no variant)."""
    plain = runs[(runs["kernel"] == kernel) & (runs["gpus"] == gpus) & (runs["strategy"] == strategy)
                 & (runs["repeat"] == 0) & (runs["variant"].fillna("") == "")]
    per_tool = [set(g["seed"]) for _, g in plain.groupby("tool")]
    return set.intersection(*per_tool) if len(per_tool) == 2 else set()


def _scaling(runs: pd.DataFrame, kernel: str, tool: str, variant: str, gpus: int = 2) -> float:
    """Median over the strategies run on both of (configurations per minute on ``gpus`` GPUs / on
    one), the same seed 0 run."""
    ratios = []
    for strategy in ("best", "random"):
        pick = runs[(runs["kernel"] == kernel) & (runs["tool"] == tool) & (runs["strategy"] == strategy)
                    & (runs["seed"] == 0) & (runs["repeat"] == 0)]
        two = pick[(pick["gpus"] == gpus) & (pick["variant"] == variant)]["evals_per_min"].dropna()
        one = pick[(pick["gpus"] == 1) & (pick["variant"] == "")]["evals_per_min"].dropna()
        if len(two) and len(one) and float(one.iloc[0]) > 0:
            ratios.append(float(two.iloc[0]) / float(one.iloc[0]))
    return statistics.median(ratios) if ratios else math.nan
