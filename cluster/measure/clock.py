"""The independent clock: what a program says its runs took, against what warpfleet saw them take.

A program prints its own metric, and a program can lie: ``time_ms=0.000001`` with correct outputs
won a sweep at 2,001,000x. So every run is also timed by warpfleet itself (the process around it,
sandbox and all, or the persistent host's request, from the worker's side), and a candidate's
claim is compared with the baseline's, per run (medians over the runs):

    claimed saving  S = the seconds the baseline's samples add up to - the candidate's
    seen saving     W = the baseline's wall time - the candidate's

A claimed saving must show in the wall clock: ``W >= FRACTION * S - floor``, the floor being the
wall clock's own noise: ``FLOOR_S``, the spread of the baseline's run times (``Clock``), or ``UNTIMED_SHARE``
of the baseline's untimed time, whichever is largest. A claim too small to show above the floor
(``FRACTION * S <= floor``) is not judged: a run slower than the baseline's by noise alone must
never fail a candidate that claims next to nothing. Setup that dominates a run (inputs generated,
a CUDA context made) raises the floor with it, so an honest candidate is never judged by a small
timed region inside a large run; the rule compares savings, never the share of the run that is
timed. And what it claims must be at least ``REST`` of what the wall clock saw remain of the
baseline's time, less the floor: a real saving does not carry a lie about the rest (a real 2x printed
as 1000x), though a claim within that (a real 2x printed as up to about 6x) passes. A candidate
that fails it is re-run up to ``CONFIRM_RUNS`` times (medians again); one that
still fails is judged once more on runs made in turn with the baseline (``measure.beside``, the
load of the moment on both sides; ``paired_problem``) before it is ``clock_mismatch``.

What it cannot see (README, Security): a claimed saving under ``2 * floor`` a run (a
program that times a few microseconds, or prints a per-iteration average); a program that takes
more samples when faster (the harness's time-based stopping rule: its samples add up to about the
same time, and so claim no saving here); and a node whose load falls sharply between the baseline's
runs and the candidate's (a small lie can then pass against the study's first clock, which is only
re-taken for a claim that fails it). Metrics that
are not times (a rate to maximize, cycles) and the kernel runner (its samples are warpfleet's own
CUDA events around the launch, not the program's words) are not checked.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from cluster.config import MetricSpec
from cluster.core.types import Clock

FRACTION = 0.5  # of a claimed saving that must show in the wall clock
REST = 0.25  # of what the wall clock saw remain of the baseline's time, that the candidate's must be at least
FLOOR_S = 0.005  # the wall clock's noise at the least: a process start in bubblewrap varies by milliseconds
UNTIMED_SHARE = 0.25  # ... or this share of the baseline's time outside its samples (start-up noise grows with it)
DEVICE_FLOOR_S = 20e-6  # the device clock's noise at the least: a few launches' jitter
DEVICE_SHARE = 0.02  # ... or this share of the baseline's busy time (clocks and caches vary run to run)
# No sample can take less: nothing a program times, or averages per item of real work, takes under
# a picosecond (a clock cycle is 200 of them), and no GPU work timed with events (a kernel's launch
# and its two events) takes under a microsecond.
TICK_S = 1e-12
LAUNCH_S = 1e-6
CONFIRM_RUNS = 3  # runs a candidate gets, at the least, before its claim is found unsupported
PAIRS = (3, 6)  # runs in turn with the baseline (measure.beside): a first round, and more where it fails
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def seconds_per_unit(metric: MetricSpec) -> float | None:
    """Seconds in one unit of a time to minimize; None for any other metric (not checked)."""
    return SECONDS.get(metric.unit) if metric.goal == "minimize" else None


def at_count(candidate: Clock, baseline: Clock) -> Clock:
    """The baseline as if its runs had stopped at the candidate's count of samples, where the
    candidate printed fewer (a search candidate capped at ``measure.search_samples`` against a
    baseline that sampled to its stopping rule): its claim and its wall less the time of the
    samples it made beyond the count. Else the baseline itself. Only ever fewer: the count is the
    program's word, and printing fewer samples than it ran only takes time off the baseline's side
    of a liar's comparison (a run's extra samples still take their time on its wall); scaling up
    on a printed count would hand a liar the baseline's time of samples it never made. On an H200
    an honest 3.3x capped at 100 samples was compared with a baseline's 178: a claim of 416 ms,
    of which 220 ms were the counts' difference."""
    if not (candidate.samples and baseline.samples) or candidate.samples >= baseline.samples:
        return baseline
    dropped = baseline.claimed_s * (1.0 - candidate.samples / baseline.samples)
    return dataclasses.replace(baseline, claimed_s=baseline.claimed_s - dropped, wall_s=baseline.wall_s - dropped,
                               samples=candidate.samples)


def clock_problem(candidate: Clock, baseline: Clock) -> str | None:
    """Why warpfleet's clock does not bear out the candidate's claimed time, or None."""
    baseline = at_count(candidate, baseline)
    claimed = baseline.claimed_s - candidate.claimed_s
    floor = max(FLOOR_S, baseline.wall_spread_s, UNTIMED_SHARE * max(0.0, baseline.wall_s - baseline.claimed_s))
    seen = baseline.wall_s - candidate.wall_s
    if not _borne_out(claimed, seen, floor):
        return (f"its samples add up to {_ms(candidate.claimed_s)} a run against the baseline's "
                f"{_ms(baseline.claimed_s)}, {_ms(claimed)} less, but warpfleet's own clock saw its runs take "
                f"{_ms(candidate.wall_s)} against the baseline's {_ms(baseline.wall_s)}, {_ms(seen)} less: a "
                f"saving that real shows at least {FRACTION:.0%} of itself, less {_ms(floor)} of noise (its metric "
                f"is not what its runs took)")
    return _rest_problem(candidate.claimed_s, baseline.claimed_s, seen, claimed, floor)


def _rest_problem(claims: float, baseline_claims: float, seen: float, claimed: float, floor: float) -> str | None:
    """Why the candidate's claimed time is too small for what the clock saw remain of the baseline's
    (its samples' sum less the saving seen), or None: it must be at least ``REST`` of that, less the
    noise. The savings' rule alone let a lie ride on a real saving of half the claim or more: a real
    2x that printed a thousandth of its time would win at 1000x over an honest 3x."""
    if FRACTION * claimed <= floor or claims >= REST * (baseline_claims - seen) - floor:
        return None
    return (f"its samples add up to {_ms(claims)} a run, but of the baseline's {_ms(baseline_claims)} warpfleet's "
            f"own clock saw it save {_ms(seen)}: {_ms(baseline_claims - seen)} remain, and a time that real is "
            f"at least {REST:.0%} of what remains, less {_ms(floor)} of noise (it claims far more than it saves)")


def _borne_out(claimed: float, seen: float, floor: float) -> bool:
    """Whether a clock's ``seen`` saving bears out the ``claimed`` one: a claim too small for the clock's
    noise (``floor``) to judge, or at least ``FRACTION`` of it seen, less that noise."""
    return FRACTION * claimed <= floor or seen >= FRACTION * claimed - floor


def device_problem(candidate: Clock, baseline: Clock) -> str | None:
    """Why the device's own record does not bear out the candidate's claimed saving, or None: the
    seconds its samples save must show in the GPU's busy time (the union of its activity
    intervals, ``Clock.device_s``), or in its kernels' busy time alone (``Clock.kernel_s``), at
    least ``FRACTION`` of them less the record's noise (``DEVICE_FLOOR_S``, ``DEVICE_SHARE`` of the
    baseline's busy time, or the spread of its runs'). Work moved to a stream the program's timer
    does not wait on, and a printed time lower than the one measured, save nothing in either;
    streams that really overlap do. The kernels' time alone judges a kernel's saving that the
    copies' noise hides (on an H200, a 17 ms run of pageable input copies varied by 1.5 ms, and
    honest block sizes saving 1.2 ms of kernel time were failed); the kernels' span (first start to
    last end, ``Clock.span_s``) a saving of the idle gaps between launches, beyond its noise. Each
    is judged on a run's totals, then sample for sample where the two sides' runs made the same
    launches a sample (``per_sample``). None where either side has no record (no GPU work seen, or
    no device clock on the node: the wall clock judges alone)."""
    if candidate.device_s is None or baseline.device_s is None:
        return None
    if _device_bears_out(candidate, baseline):
        return None
    scaled = per_sample(candidate, baseline)
    if scaled is not None and _device_bears_out(candidate, scaled):
        return None
    claimed, seen = baseline.claimed_s - candidate.claimed_s, baseline.device_s - candidate.device_s
    return (f"its samples add up to {_ms(claimed)} less a run than the baseline's, but the device's own record "
            f"(CUPTI: the GPU busy {_ms(candidate.device_s)} a run against the baseline's {_ms(baseline.device_s)}) "
            f"shows {_ms(seen)} less: its timer does not time the GPU's work (work on a stream its events do not "
            f"wait for, or a time it did not measure)")


def _device_bears_out(candidate: Clock, baseline: Clock) -> bool:
    assert candidate.device_s is not None and baseline.device_s is not None
    claimed = baseline.claimed_s - candidate.claimed_s
    floor = max(DEVICE_FLOOR_S, DEVICE_SHARE * baseline.device_s, baseline.device_spread_s)
    if _borne_out(claimed, baseline.device_s - candidate.device_s, floor):
        return True
    if candidate.kernel_s is not None and baseline.kernel_s is not None and _borne_out(
            claimed, baseline.kernel_s - candidate.kernel_s,
            max(DEVICE_FLOOR_S, DEVICE_SHARE * baseline.kernel_s, baseline.kernel_spread_s)):
        return True
    if candidate.span_s is not None and baseline.span_s is not None:
        # The kernels' timeline, idle gaps included: a program bound by its launches saves those
        # (on an H200, rodinia_nw's larger blocks made 2-4x fewer launches, their events saved 2.3-6.3
        # ms a run, and the kernels' busy time grew). Strictly: the noise is added to what must show,
        # never taken off it, so a timeline stretched by host work between kernels judges nothing;
        # and the timeline may not save far more than the claim: tiny kernels moved to a stream the
        # events do not wait on run back to back, without the host's waits between samples, and
        # shorten the timeline by those waits, not by the kernels' time their events claim.
        noise = max(DEVICE_FLOOR_S, DEVICE_SHARE * baseline.span_s, baseline.span_spread_s, candidate.span_spread_s)
        return FRACTION * claimed + noise <= baseline.span_s - candidate.span_s <= claimed / FRACTION + noise
    return False


SAME_LAUNCHES = 0.02  # records a sample within this share of each other: the same launches a sample


def per_sample(candidate: Clock, baseline: Clock) -> Clock | None:
    """The baseline as if its runs had made the candidate's count of samples (its totals scaled by
    the ratio of the counts), where both runs made the same launches a sample: their device records
    a sample within ``SAME_LAUNCHES`` of each other; None where not (or a count is missing).

    A harness that samples for a fixed time (pb_fdtd2d's two seconds) makes more samples when
    faster: its samples add up to about the same time and its busy time grows with the count, so a
    run's totals compare the counts, not the speed (on an H200 an honest restrict variant, 1.05x a
    sample, 109 samples to the baseline's 98-104, was failed on its totals). The count is the
    program's word; the device's records a sample hold it to the launches it made: a liar that
    prints more samples of less time each makes fewer records a sample, and is judged on totals."""
    if not (candidate.samples and baseline.samples and candidate.records and baseline.records):
        return None
    mine, theirs = candidate.records / candidate.samples, baseline.records / baseline.samples
    if abs(mine - theirs) > SAME_LAUNCHES * theirs or candidate.samples == baseline.samples:
        return None
    ratio = candidate.samples / baseline.samples

    def scale(value: float | None) -> float | None:
        return None if value is None else value * ratio

    return dataclasses.replace(
        baseline, claimed_s=baseline.claimed_s * ratio, device_s=scale(baseline.device_s),
        device_spread_s=baseline.device_spread_s * ratio, kernel_s=scale(baseline.kernel_s),
        kernel_spread_s=baseline.kernel_spread_s * ratio, span_s=scale(baseline.span_s),
        span_spread_s=baseline.span_spread_s * ratio, samples=candidate.samples, records=baseline.records * ratio)


WALL_JUDGES_S = 0.040  # a claim the device's record refutes goes to runs in turn only above this a run


def wall_judges(candidate: Clock, baseline: Clock) -> bool:
    """Whether a claimed saving that the device's record does not bear out is large enough for runs
    in turn on the wall clock to judge it again (``WALL_JUDGES_S``: the wall's noise is the node's
    load; on a 2-core machine at load 7-8, a 27 ms and a 40 ms lie passed runs in turn)."""
    return baseline.claimed_s - candidate.claimed_s > WALL_JUDGES_S


def sample_floor_s(gpu: bool) -> float:
    """The least time a sample can take (``TICK_S``; ``LAUNCH_S`` on a GPU): a metric below is not
    a measurement."""
    return LAUNCH_S if gpu else TICK_S


def judged_in_turn(candidate: Clock, baseline: Clock) -> bool:
    """Whether a finalist's claim (no device record to judge it) goes to runs in turn with the
    baseline: any claim the least floor (``FLOOR_S``) could judge, whatever the study's first clock
    says. That clock was taken under the load of the study's start: a warm-up on a first run hid a
    liar under its floor (selected at 57,089,851x), and on a 2-core machine at load 7-8 a third
    printed, and a real 2x printed as 1000x, passed against a clock of heavier load, where the wall
    saw as much saved as they claimed."""
    baseline = at_count(candidate, baseline)
    return FRACTION * (baseline.claimed_s - candidate.claimed_s) > FLOOR_S


def paired_problem(candidate_claims: Sequence[float], candidate_walls: Sequence[float],
                   baseline_claims: Sequence[float], baseline_walls: Sequence[float]) -> str | None:
    """The rule again, on runs of the baseline and the candidate made in turn (pair ``i``: the
    baseline's run ``i`` and the candidate's): the seen saving is the median of the pairs' wall
    differences, which a load common to both sides cancels, and it must be at least ``FRACTION`` of
    the claim less ``FLOOR_S``: the midpoint between a lie (nothing seen) and the truth (all of it),
    with no floor that grows with the noise, so that a noisy node never lets a lie through unjudged.
    The caller takes more pairs when it fails (``measure.beside``); from five pairs on, a claim
    whose median falls short still passes where the upper bound on the median saving
    (``median_bounds``: the 8th of 9) reaches the whole claim less ``FLOOR_S``."""
    claimed = statistics.median(baseline_claims) - statistics.median(candidate_claims)
    differences = sorted(b - c for b, c in zip(baseline_walls, candidate_walls, strict=True))
    seen = statistics.median(differences)
    wanted = FRACTION * claimed - FLOOR_S
    # With enough pairs (the caller's later rounds), an honest claim whose median fell short is
    # rescued where the sign test's upper bound on the median saving reaches the whole claim: an
    # honest claim on a loaded node (two test workers and two spinning processes on two cores) fell
    # short in the median of nine pairs, yet showed all of itself in some of them; a lie shows
    # nothing but a burst of load on the baseline's side (on a loaded 2-core machine, two such
    # pairs of nine had lifted the bound over half a liar's claim, and it was selected).
    # The rescue wants the median to show half of what the rule asks as well: a liar's median sits
    # at nothing, and on a loaded 2-core machine (load 4-5) two bursts on the baseline's side lifted
    # a test liar's bound to its whole claim, and it won its finals.
    # And its lower bound above nothing (the 2nd of 9: at most one pair saw the candidate slower): a
    # liar's pairs scatter around nothing, and on a 2-core machine at load 7-8 a liar printing a third
    # of its time had a median at half of what the rule asks and a burst over its whole claim, and won
    # its finals.
    lower, upper = median_bounds(differences)  # infinite below five pairs: the median alone judges
    rescued = math.inf > upper >= claimed - FLOOR_S and seen >= wanted / 2 and lower > 0
    if seen >= wanted or rescued:
        return _rest_problem(statistics.median(candidate_claims), statistics.median(baseline_claims),
                             seen if seen >= wanted else upper, claimed, FLOOR_S)
    short = sum(d < wanted for d in differences)
    return (f"run in turn with the baseline ({len(differences)} pairs), its samples add up to "
            f"{_ms(claimed)} less a run than the baseline's, but warpfleet's own clock saw it take {_ms(seen)} "
            f"less (the pairs' median; short of {_ms(wanted)} in {short} of {len(differences)} pairs): its metric "
            f"is not what its runs took")


def median_bounds(ordered: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Bounds on the median of the distribution that ``ordered`` (ascending) was drawn from, each
    one-sided at ``confidence`` (the sign test's, no assumption on the distribution): the (k+1)-th
    smallest and the (k+1)-th largest value, k the most values that may lie beyond the median on
    one side with chance at most 1 - confidence. Infinite where there are too few values for a
    bound (fewer than five at 95%): (-inf, inf)."""
    n = len(ordered)
    beyond, chance = -1, 0.0
    while beyond + 1 < n:
        chance += math.comb(n, beyond + 1) / 2 ** n
        if chance > 1.0 - confidence:
            break
        beyond += 1
    if beyond < 0:
        return -math.inf, math.inf
    return ordered[beyond], ordered[n - 1 - beyond]


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.4g} ms"
