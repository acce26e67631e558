"""Selection: the best configuration per (target, device type), from the rows alone.

Only a configuration that passed verification on seeds other than the search's may be selected:
the baseline, or a candidate with an ``ok`` row of phase ``final`` (re-run by the sweep on fresh
seeds 1..final_runs; the search ran seed 0) or ``evaluate`` (``warpfleet evaluate``). A candidate
that failed any final run is out, whatever its other runs said, and so is one whose metric is not
positive. With no such candidate the baseline is selected, and its reason says why.

The winner is chosen by median over those re-measurements. A faster candidate must beat a simpler
one by more than the measured noise: the larger of the two interquartile ranges, and at least
``MIN_DIFFERENCE`` of the median, because the spread between separate runs of one program
(measured on an H100: up to 0.9%) is larger than the spread of the samples inside one run. Within
the noise, the configuration that changes fewer flags and params from the baseline wins. The
baseline itself takes part, so a sweep that found nothing real selects the baseline. A winner whose
re-measurements were ``noisy`` (IQR/median above ``measure.max_noise``) is marked so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cluster.core.encodings import FLAG_PREFIX, PARAM_PREFIX, settings, speedup
from cluster.core.types import BestConfig, Phase, Stats, Status

MIN_DIFFERENCE = 0.01  # relative: differences below 1% of the median are not trusted



REVERIFIED = (Phase.FINAL.value, Phase.EVALUATE.value)  # phases run on seeds other than the search's
NOT_REVERIFIED = "no candidate passed a re-run on fresh seeds (phase final): the baseline"
NOISY_ADVICE = ("the winner's re-measurements spread more than measure.max_noise (IQR/median), so its lead may "
                "be noise: raise measure.final_runs, pin the GPU clocks (nvidia-smi -lgc) and keep other "
                "processes off the machine (or pin them to other cores), or give the target a bigger problem")


def _pooled(rows: pd.DataFrame) -> dict[str, tuple[Stats, pd.Series]]:
    pooled = {}
    for key, group in rows.groupby("candidate_key", sort=False):
        samples = [float(s) for arr in group["samples"] if arr is not None for s in arr]
        stats = Stats.of(samples)
        if stats is not None and np.isfinite(stats.median) and stats.median > 0:  # a metric is positive
            pooled[str(key)] = (stats, group.iloc[0])
    return pooled


def _eligible(rows: pd.DataFrame, baseline_key: str | None) -> pd.DataFrame:
    """The ok rows selection may use: of each re-verified candidate its re-verified rows; of the
    baseline those, else its other ok rows."""
    failed_final = set(rows.loc[(rows["phase"] == Phase.FINAL.value) & (rows["status"] != Status.OK.value),
                                "candidate_key"])
    ok = rows[(rows["status"] == Status.OK.value) & ~rows["candidate_key"].isin(failed_final)]
    reverified = ok[ok["phase"].isin(REVERIFIED)]
    base = ok[ok["candidate_key"] == baseline_key]
    if baseline_key is not None and not base["phase"].isin(REVERIFIED).any():
        reverified = pd.concat([reverified, base])
    return reverified


def select_study(rows: pd.DataFrame, min_difference: float = MIN_DIFFERENCE) -> BestConfig | None:
    """The winner of one study's rows, or None when nothing ran correctly."""
    goal = str(rows["goal"].iloc[0])
    sign = 1.0 if goal == "minimize" else -1.0
    baseline_rows = rows[rows["phase"] == Phase.BASELINE.value]
    baseline = baseline_rows.iloc[0] if len(baseline_rows) else None
    baseline_key = str(baseline["candidate_key"]) if baseline is not None else None
    final = _eligible(rows, baseline_key)
    pool = _pooled(final)
    if not pool:
        return None
    base_flags = settings(baseline, FLAG_PREFIX) if baseline is not None else {}
    base_params = settings(baseline, PARAM_PREFIX) if baseline is not None else {}

    def complexity(row: pd.Series) -> int:
        flags, params = settings(row, FLAG_PREFIX), settings(row, PARAM_PREFIX)
        changed_source = baseline is not None and row.get("source_hash") != baseline.get("source_hash")
        return sum(flags[k] != base_flags.get(k) for k in flags) + \
            sum(params[k] != base_params.get(k) for k in params) + int(changed_source)

    objective = str(rows["objective"].iloc[0]) if "objective" in rows else "time"
    energy = _energy(final, objective)
    if objective in ("energy", "edp") and energy:
        pool = {k: v for k, v in pool.items() if k in energy}
    if objective in ("energy", "edp") and pool:
        winner_key = min(pool, key=lambda k: energy[k])
        reason = f"lowest {'energy per sample' if objective == 'energy' else 'energy-delay product'}"
    else:
        fastest_key = min(pool, key=lambda k: sign * pool[k][0].median)
        fastest = pool[fastest_key][0]
        tied = [k for k, (s, _) in pool.items()
                if abs(s.median - fastest.median) <= max(fastest.iqr, s.iqr, min_difference * fastest.median)]
        winner_key = min(tied, key=lambda k: (complexity(pool[k][1]), sign * pool[k][0].median))
        reason = "fastest" if winner_key == fastest_key else \
            f"simplest within noise of the fastest ({fastest_key}: {fastest.median:.4g})"
    if set(pool) == {baseline_key}:
        reason = NOT_REVERIFIED
    stats, row = pool[winner_key]
    base_median = pool[baseline_key][0].median if baseline_key in pool else \
        (float(baseline["median"]) if baseline is not None and not pd.isna(baseline["median"]) else np.nan)
    ratio = speedup(stats.median, float(base_median), goal) if base_median > 0 else None
    mine = final[(final["candidate_key"] == winner_key) & final["phase"].isin(REVERIFIED)]
    noisy = "noisy" in mine and bool(mine["noisy"].eq(True).any())
    return BestConfig(
        target=str(row["target"]), device_type=str(row["device_type"]), arch=str(row["arch"]),
        toolchain=str(row["toolchain"]), candidate_key=winner_key,
        flags={k: str(v) for k, v in settings(row, FLAG_PREFIX).items()}, params=settings(row, PARAM_PREFIX),
        median=stats.median, baseline_median=float(base_median), speedup=np.nan if ratio is None else ratio,
        unit=str(row["unit"]), iqr=stats.iqr, reason=reason, source_hash=str(row.get("source_hash", "") or ""),
        baseline_source_hash=str(baseline.get("source_hash", "") or "") if baseline is not None else "",
        noisy=noisy,
    )


def _energy(rows: pd.DataFrame, objective: str) -> dict[str, float]:
    """Mean energy per sample (or energy x median time) per candidate key, where measured."""
    if "energy_j" not in rows:
        return {}
    measured = rows[rows["energy_j"].notna()]
    out = {}
    for key, group in measured.groupby("candidate_key"):
        value = float(group["energy_j"].mean())
        out[str(key)] = value * float(group["median"].mean()) if objective == "edp" else value
    return out


def pareto_front(rows: pd.DataFrame) -> pd.DataFrame:
    """The correct candidates of one study not beaten on both time and energy, fastest first."""
    if "energy_j" not in rows:
        return rows.iloc[0:0]
    ok = rows[(rows["status"] == Status.OK.value) & rows["energy_j"].notna() & (rows["phase"] != Phase.FINAL.value)]
    ok = ok.drop_duplicates("candidate_key").sort_values(["median", "energy_j"])
    front, best_energy = [], float("inf")
    for index, row in ok.iterrows():
        if row["energy_j"] < best_energy:
            front.append(index)
            best_energy = row["energy_j"]
    return ok.loc[front]


def select_best(rows: pd.DataFrame) -> list[BestConfig]:
    """One BestConfig per (target, device type) that has a correct candidate."""
    if rows.empty:
        return []
    best = []
    for _, group in rows.groupby(["target", "device_type"], sort=True):
        choice = select_study(group)
        if choice is not None:
            best.append(choice)
    return best
