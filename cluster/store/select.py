"""Selection: the best configuration per (target, device type), from the rows alone.

Only a configuration that passed verification on seeds other than the search's may be selected:
the baseline, or a candidate with an ``ok`` row of phase ``final`` (re-run by the sweep on fresh
seeds 1..final_runs; the search ran seed 0) or ``evaluate`` (``warpfleet evaluate``). A candidate
that failed any final run is out, whatever its other runs said, and so is one whose metric is not
positive. With no such candidate the baseline is selected, and its reason says why.

The fastest is the best median over those re-measurements. A simpler configuration (fewer flags
and params changed from the baseline, the sources unchanged) is kept instead unless the fastest
beats it (``beats``): its samples lower by a one-sided Mann-Whitney U test at ``ALPHA`` (ranks, so
that neither side's spread alone decides: a baseline whose IQR is four times its median does not
hide a candidate whose every sample is below the baseline's least), and its median lower by more
than ``MIN_DIFFERENCE``, because the spread between separate runs of one program (measured on an
H100: up to 0.9%) is larger than the spread of the samples inside one run, which the test pools.
The baseline itself takes part, so a sweep that found nothing real selects the baseline. A winner
whose re-measurements were ``noisy`` (IQR/median above ``measure.max_noise``) is marked so; where a
configuration has a quiet re-measurement beside noisy ones (the finals run a noisy final once more),
the quiet one stands for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cluster.core.encodings import FLAG_PREFIX, PARAM_PREFIX, settings, speedup, suspect_speedup
from cluster.core.types import BestConfig, Phase, Stats, Status

MIN_DIFFERENCE = 0.01  # relative: differences below 1% of the median are not trusted
ALPHA = 0.05  # a faster configuration beats a simpler one at this one-sided significance (3 runs each can)
EXACT_PAIRS = 2500  # samples n1 * n2 up to which the U test's p-value is exact (no ties), else normal
REVERIFIED = (Phase.FINAL.value, Phase.EVALUATE.value)  # phases run on seeds other than the search's
NOT_REVERIFIED = "no candidate passed a re-run on fresh seeds (phase final): the baseline"


def noisy_advice(archs: Iterable[str]) -> str:
    """What to do about noisy winners measured on ``archs`` (``sm_*`` a GPU's, else the host's):
    only what fits the device, and nothing that changes a machine's settings (its clocks)."""
    archs = list(archs)
    keep = [*(["other work off the GPU"] if any(a.startswith("sm_") for a in archs) else []),
            *(["other processes off the machine's cores (or pin them to other cores)"]
              if any(not a.startswith("sm_") for a in archs) else [])]
    return ("the winner's re-measurements spread more than measure.max_noise (IQR/median), so its lead may be "
            f"noise: raise measure.final_runs, keep {' and '.join(keep) or 'the machine otherwise idle'}, or give "
            "the target a bigger problem")


def mann_whitney_p(lower: Sequence[float], higher: Sequence[float]) -> float:
    """The one-sided p-value of a Mann-Whitney U test that ``lower``'s samples are smaller than
    ``higher``'s: the chance of a U this small were both from one distribution. Exact where there
    are no ties and at most ``EXACT_PAIRS`` pairs, else the normal approximation with the tie
    correction and a continuity correction. 1.0 where a side has no samples."""
    x, y = np.asarray(lower, dtype=float), np.asarray(higher, dtype=float)
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    both = np.concatenate([x, y])
    values, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # ties share the mean of their ranks
    u = float(average_rank[inverse[:n1]].sum()) - n1 * (n1 + 1) / 2.0  # pairs where x is the larger
    if len(values) == len(both) and n1 * n2 <= EXACT_PAIRS:
        return float(_u_distribution(n1, n2)[: round(u) + 1].sum())
    n = n1 + n2
    variance = n1 * n2 / 12.0 * ((n + 1) - float((counts ** 3 - counts).sum()) / (n * (n - 1)))
    if variance <= 0:
        return 1.0  # every sample the same value: nothing to tell them apart
    z = (u - n1 * n2 / 2.0 + 0.5) / math.sqrt(variance)
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _u_distribution(n1: int, n2: int) -> np.ndarray:
    """P(U = u) for u = 0..n1*n2 when two samples of n1 and n2 come from one distribution. Counts
    of arrangements by U: the largest value is an x (above all n y's: f(m-1, n) shifted by n) or a
    y (f(m, n-1))."""
    rows = [np.ones(1)] * (n2 + 1)  # f(0, n) for n = 0..n2: one arrangement, U = 0
    for m in range(1, n1 + 1):
        current = [np.ones(1)]  # f(m, 0)
        for n in range(1, n2 + 1):
            counts = np.zeros(m * n + 1)
            counts[n:n + len(rows[n])] += rows[n]  # f(m-1, n), shifted by n
            counts[:len(current[n - 1])] += current[n - 1]  # f(m, n-1)
            current.append(counts)
        rows = current
    total = rows[n2]
    return total / total.sum()


@dataclass(frozen=True)
class Pooled:
    """One configuration's samples over its eligible rows."""

    stats: Stats
    samples: np.ndarray
    row: pd.Series


def _pooled(rows: pd.DataFrame) -> dict[str, Pooled]:
    pooled = {}
    for key, group in rows.groupby("candidate_key", sort=False):
        samples = [float(s) for arr in group["samples"] if arr is not None for s in arr]
        stats = Stats.of(samples)
        if stats is not None and np.isfinite(stats.median) and stats.median > 0:  # a metric is positive
            pooled[str(key)] = Pooled(stats, np.asarray(samples, dtype=float), group.iloc[0])
    return pooled


def beats(better: Pooled, other: Pooled, sign: float = 1.0, min_difference: float = MIN_DIFFERENCE,
          alpha: float = ALPHA) -> tuple[bool, str]:
    """Whether ``better`` beats ``other`` beyond noise (``sign`` -1 where the goal maximizes), and
    the evidence in words: the one-sided U test's p-value and the difference of medians."""
    p = mann_whitney_p(sign * better.samples, sign * other.samples)
    gap = sign * (other.stats.median - better.stats.median) / other.stats.median
    evidence = f"Mann-Whitney U p={p:.2g}, medians {100 * gap:+.1f}% apart"
    return p <= alpha * (1 + 1e-9) and gap > min_difference, evidence  # 3 runs each, all apart: p = 1/20


def _eligible(rows: pd.DataFrame, baseline_key: str | None) -> pd.DataFrame:
    """The ok rows selection may use: of each re-verified candidate its re-verified rows; of the
    baseline those, else its other ok rows."""
    failed_final = set(rows.loc[(rows["phase"] == Phase.FINAL.value) & (rows["status"] != Status.OK.value),
                                "candidate_key"])
    ok = rows[(rows["status"] == Status.OK.value) & ~rows["candidate_key"].isin(failed_final)]
    reverified = _quiet_over_noisy(ok[ok["phase"].isin(REVERIFIED)])
    base = ok[ok["candidate_key"] == baseline_key]
    if baseline_key is not None and not base["phase"].isin(REVERIFIED).any():
        reverified = pd.concat([reverified, base])
    return reverified


def _quiet_over_noisy(rows: pd.DataFrame) -> pd.DataFrame:
    """A configuration's re-measurements without its ``noisy`` ones where it has a quiet one: the
    finals run a noisy final once more (``cluster.engine.finals``), and a run the host slowed is not
    the configuration's time."""
    if "noisy" not in rows or rows.empty:
        return rows
    noisy = rows["noisy"].eq(True)
    quiet = set(rows.loc[~noisy, "candidate_key"])
    return rows[~(noisy & rows["candidate_key"].isin(quiet))]


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
    fastest_key = ""
    if objective in ("energy", "edp") and energy:
        pool = {k: v for k, v in pool.items() if k in energy}
    if objective in ("energy", "edp") and pool:
        winner_key = min(pool, key=lambda k: energy[k])
        reason = f"lowest {'energy per sample' if objective == 'energy' else 'energy-delay product'}"
    else:
        fastest_key = min(pool, key=lambda k: sign * pool[k].stats.median)
        fastest = pool[fastest_key]
        verdicts = {k: beats(fastest, c, sign, min_difference) for k, c in pool.items() if k != fastest_key}
        kept = [fastest_key, *(k for k, (won, _) in verdicts.items() if not won)]
        winner_key = min(kept, key=lambda k: (complexity(pool[k].row), sign * pool[k].stats.median))
        reason = "fastest" if winner_key == fastest_key else (
            f"simpler than the fastest ({fastest_key}, median {fastest.stats.median:.4g} against "
            f"{pool[winner_key].stats.median:.4g}), which does not beat it beyond noise "
            f"({verdicts[winner_key][1]}; beating it takes p<={ALPHA:g} and more than {100 * min_difference:g}%)")
    if set(pool) == {baseline_key}:
        reason = NOT_REVERIFIED
    stats, row = pool[winner_key].stats, pool[winner_key].row
    base_median = pool[baseline_key].stats.median if baseline_key in pool else \
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
        noisy=noisy, fastest=fastest_key if fastest_key != winner_key else "",
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


NOT_REMEASURED_MARK = "(not re-measured)"  # beside a winner; the footnote under a table says what it means
NOT_REMEASURED_NOTE = ("the best measured so far, verified, of a study with no finals (the run stopped or its time "
                       "budget ended first); resume the run to re-measure it")
NOT_REMEASURED = f"not re-measured: {NOT_REMEASURED_NOTE}"  # a winner's reason


@dataclass(frozen=True)
class Verified:
    """What a run's expensive checks found (issue 25), for the best so far of a study with no
    finals: each admitted variant's checks ("", passed, failed; by source hash) and each fresh-seed
    review (by candidate key). A variant's candidate counts only once its checks passed, and one
    over 10x the baseline only once its review did."""

    variants: Mapping[str, str] = field(default_factory=dict)
    reviews: Mapping[str, str] = field(default_factory=dict)

    def trusted(self, row: pd.Series, baseline: pd.Series | None, ratio: float | None) -> bool:
        source = str(row.get("source_hash") or "")
        own = baseline is None or source == str(baseline.get("source_hash") or "")
        if not own and self.variants.get(source) != "passed":
            return False
        reviewed = self.reviews.get(str(row["candidate_key"])) in ("passed", "skipped")
        return reviewed or not suspect_speedup(ratio)


def load_verified(run_dir: Path) -> Verified:
    """A run's ``Verified``, from its variants/ and reviews/ tables."""
    from cluster.store.results import read_table
    from cluster.store.rundir import RunDir
    from cluster.store.tables import REVIEW_SCHEMA
    from cluster.store.variants import VARIANT_SCHEMA, latest_outcomes

    variants = latest_outcomes(read_table(run_dir, RunDir.VARIANTS, VARIANT_SCHEMA))
    checks: dict[str, str] = {}
    for record in variants.to_dict("records"):
        source = record["source_hash"]
        if source and (record.get("checks") or source not in checks):
            checks[source] = "failed" if record["stage"] == "rejected" else str(record.get("checks") or "")
    reviews = read_table(run_dir, RunDir.REVIEWS, REVIEW_SCHEMA)
    return Verified(checks, dict(zip(reviews["candidate_key"].astype(str), reviews["status"].astype(str), strict=True)))


def best_so_far(rows: pd.DataFrame, verified: Verified) -> BestConfig | None:
    """The best candidate a study measured correctly and verified, where it had no finals: marked
    not re-measured. None where it has finals, or nothing measured beats the baseline."""
    goal = str(rows["goal"].iloc[0])
    finals = rows[(rows["phase"] == Phase.FINAL.value) & (rows["status"] == Status.OK.value)]
    baseline_rows = rows[(rows["phase"] == Phase.BASELINE.value) & (rows["status"] == Status.OK.value)]
    if baseline_rows.empty:
        return None
    baseline = baseline_rows.iloc[0]
    if (finals["candidate_key"] != baseline["candidate_key"]).any():
        return None  # finals ran: the selection's own rule
    failed = set(rows.loc[(rows["phase"] == Phase.FINAL.value) & (rows["status"] != Status.OK.value), "candidate_key"])
    measured = rows[rows["phase"].isin([Phase.SEARCH.value, Phase.VERIFY.value]) & (rows["status"] == Status.OK.value)
                    & rows["median"].notna() & (rows["median"] > 0) & ~rows["candidate_key"].isin(failed)]
    base_median = float(baseline["median"])
    best, best_ratio = None, 1.0
    for _, row in measured.iterrows():
        ratio = speedup(float(row["median"]), base_median, goal)
        if ratio is not None and ratio > best_ratio and verified.trusted(row, baseline, ratio):
            best, best_ratio = row, ratio
    if best is None:
        return None
    return BestConfig(
        target=str(best["target"]), device_type=str(best["device_type"]), arch=str(best["arch"]),
        toolchain=str(best["toolchain"]), candidate_key=str(best["candidate_key"]),
        flags={k: str(v) for k, v in settings(best, FLAG_PREFIX).items()}, params=settings(best, PARAM_PREFIX),
        median=float(best["median"]), baseline_median=base_median, speedup=best_ratio, unit=str(best["unit"]),
        iqr=float(best["iqr"]) if pd.notna(best.get("iqr")) else 0.0, reason=NOT_REMEASURED,
        source_hash=str(best.get("source_hash", "") or ""),
        baseline_source_hash=str(baseline.get("source_hash", "") or ""), remeasured=False)


def select_best(rows: pd.DataFrame, verified: Verified | None = None) -> list[BestConfig]:
    """One BestConfig per (target, device type) that has a correct candidate. With ``verified`` (a
    run's checks: ``load_verified``), a study that had no finals gives its best so far, marked not
    re-measured, where one beats the baseline: never 1.00x while a faster verified candidate exists."""
    if rows.empty:
        return []
    best = []
    for _, group in rows.groupby(["target", "device_type"], sort=True):
        choice = select_study(group)
        interim = best_so_far(group, verified) if verified is not None else None
        choice = interim or choice
        if choice is not None:
            best.append(choice)
    return best
