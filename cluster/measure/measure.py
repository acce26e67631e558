"""Measure stage: run a built candidate, read its metric, check its outputs against the baseline's.

Order of checks: exit status (crash, timeout), metric samples in stdout, then every output file
and optionally stdout numbers against the baseline's, then the user's test command; and once every
run passed, the time the samples claim against warpfleet's own clock (``cluster.measure.clock``).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cluster.config import MetricSpec, OutputSpec, Target, VerifySpec
from cluster.core.compare import compare
from cluster.core.placeholders import names_in
from cluster.core.types import (
    BuildArtifact,
    Candidate,
    Clock,
    DeviceInfo,
    DeviceRecord,
    Measurement,
    RunOutputs,
    Status,
)
from cluster.measure.clock import (
    CONFIRM_RUNS,
    PAIRS,
    clock_problem,
    device_problem,
    judged_in_turn,
    paired_problem,
    sample_floor_s,
    seconds_per_unit,
    wall_judges,
)
from cluster.measure.telemetry import Monitor
from cluster.runners._base import POISON_ENV, Invocation, ProcessRunner, Runner, Staged
from cluster.sandbox.sandbox import read_output
from cluster.sandbox.untrusted_dir import UntrustedDir

PROTOCOL_PREFIX = "@warpfleet"
POISONED = "poisoned_outputs"  # what an outputs' problem under ``poison`` says first
CACHE_SPEEDUP = 3.0  # a later run of the same inputs this much faster than the first holds a cache
RACED = " raced=1 "  # in the summary line of a run that stopped sampling early (kernel_harness.summary_line)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)", re.IGNORECASE)


@dataclass(frozen=True)
class Reference:
    """The baseline's outputs on this device type, one per seed: what every candidate must reproduce;
    and its ``clock`` (``Measurement.clock``), what a candidate's claimed time is checked against.

    A target whose run command takes ``{seed}`` gets fresh inputs on every run (run ``i`` of any
    candidate uses seed ``i``), so outputs cached from an earlier run cannot pass; its reference
    holds one set of outputs per seed the baseline ran with, and run ``i`` is compared with
    ``runs[i % len(runs)]``.
    """

    runs: tuple[RunOutputs, ...]
    clock: Clock | None = None

    def for_run(self, index: int) -> RunOutputs:
        return self.runs[index % len(self.runs)]  # matches the seed measure_candidate gave that run


@dataclass(frozen=True)
class Baseline:
    """The baseline's build, run again beside a candidate whose claimed saving the clock did not
    bear out against the baseline's clock of the study's start: the load on a node changes, and a
    claim is judged fairly only against a baseline timed under the same load (``beside``)."""

    target: Target
    candidate: Candidate
    binary: bytes


def parse_samples(stdout: str, metric: MetricSpec) -> list[float]:
    """Metric samples from a run's stdout: each regex match, or each protocol line's value.

    The line protocol is ``@warpfleet name=value [name=value ...]``, one sample per line.
    """
    if metric.regex:
        found = re.findall(metric.regex, stdout)
    else:
        found = []
        for line in stdout.splitlines():
            if not line.startswith(PROTOCOL_PREFIX):
                continue
            for token in line[len(PROTOCOL_PREFIX):].split():
                name, _, value = token.partition("=")
                if name == metric.name:
                    found.append(value)
    samples = []
    for text in found:
        try:
            samples.append(float(text))
        except ValueError:
            continue
    return samples


def _load_numbers(content: bytes, spec: OutputSpec) -> np.ndarray:
    if spec.is_text:
        values = _NUMBER.findall(content.decode(errors="replace"))
        return np.array([float(v) for v in values], dtype=np.float64)
    dtype = np.dtype(spec.dtype)
    if len(content) % dtype.itemsize:
        raise ValueError(f"{len(content)} bytes is not a whole number of {spec.dtype} values")
    return np.frombuffer(content, dtype=dtype)


def verify_outputs(workdir: Path | UntrustedDir, stdout: str, verify: VerifySpec, reference: RunOutputs | None,
                   verified: frozenset[str] = frozenset()) -> str | None:
    """Compare this run's outputs with the reference's; with no reference, only check they exist.
    ``verified``: outputs the runner already found to match the reference (``Runner.verified_outputs``)."""
    if not isinstance(workdir, UntrustedDir):
        with UntrustedDir(workdir) as files:
            return verify_outputs(files, stdout, verify, reference, verified)
    wanted = dict(reference.files) if reference else {}
    for spec in verify.outputs:
        if reference is not None and spec.path in verified:
            continue
        content = read_output(workdir, spec.path)  # a link (out of the scratch directory or not) is not an output
        if content is None:
            return f"{spec.path}: not written"
        if reference is not None and spec.path not in wanted:
            return f"{spec.path}: the reference has none"
        try:
            got = _load_numbers(content, spec)
            want = _load_numbers(wanted[spec.path], spec) if reference else got
        except ValueError as exc:
            return f"{spec.path}: {exc}"
        problem = compare(spec.path, got, want, verify.rtol if spec.rtol is None else spec.rtol,
                          verify.atol if spec.atol is None else spec.atol)
        if problem:
            return problem
    if verify.stdout_regex and reference is not None:
        got = np.array([float(v) for v in re.findall(verify.stdout_regex, stdout)])
        return compare("stdout", got, np.array(reference.stdout_values), verify.rtol, verify.atol)
    return None


def harness_region(stdout: str) -> tuple[float, float, int] | None:
    """The timed region that the harness's summary line marks: (start, end, samples)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROTOCOL_PREFIX) and "region_start_unix=" in line:
            fields = dict(token.partition("=")[::2] for token in line.split()[1:])
            try:
                return float(fields["region_start_unix"]), float(fields["region_end_unix"]), int(fields["samples"])
            except (KeyError, ValueError):
                return None
    return None


def measure_candidate(
    target: Target,
    candidate: Candidate,
    artifact: BuildArtifact,
    device: DeviceInfo,
    reference: Reference | None,
    runs: int,
    runner: Runner | None = None,
    monitor: Monitor | None = None,
    first_seed: int = 0,
    stop_above: float | None = None,
    max_samples: int | None = None,
    baseline: Callable[[], Baseline] | None = None,
    poison: bool = False,
    cache_check: bool = False,
    judge_s: float | None = None,
    earlier: float | None = None,
) -> Measurement:
    """Run a built candidate ``runs`` times through ``runner`` (default: a process per run), each
    run with its own ``{seed}``: ``first_seed``, ``first_seed + 1``, ...

    ``reference`` None: this is the baseline, and its outputs (one per seed) are returned as the
    reference. ``monitor``: device telemetry (NVML) recorded over the runs. ``stop_above``: racing
    (``Invocation.stop_above``), for a runner that can stop sampling early. ``max_samples``: the
    search's cap on samples a run (``Invocation.max_samples``). ``baseline``: the baseline's build
    (fetched only when needed), run in turn with the candidate when its claimed time fails the clock
    rule against the reference's clock: the claim is judged again against that fresh clock.

    ``poison`` (an agent's variant's admission run and finals): each run with its outputs
    poisoned (``POISON_ENV``: a harness fills its registered output buffers with NaN before every
    launch, untimed), so that a launch that leaves its output to an earlier one fails the outputs'
    check; the cheat checks' poisoned-outputs run, folded into runs the candidate has anyway, where a
    candidate that knows the check's variable gains nothing by behaving only then. ``cache_check``
    (a finalist's runs on a target without ``{seed}``, which all have the same inputs): a run whose
    samples' median is ``CACHE_SPEEDUP`` times below the first run's is a cache kept across runs (in a
    persistent host's memory: the directories are fresh), ``verify_failed``; with ``earlier`` (its
    median in an earlier measurement, its search's: a first run of its own in a stage of its own),
    only where they are that much below it too: a load that slowed the first run alone is no cache.
    ``judge_s``: the most seconds the runs beside the baseline may take (the time plan's bound on
    one job; None: no bound).
    """
    started = time.time()
    spec = target.spec
    samples: list[float] = []
    outputs: list[RunOutputs] = []
    regions: list[tuple[float, float, int]] = []
    run_s = verify_s = 0.0
    raced = False
    seeded = "seed" in names_in(spec.run)

    def done(status: Status, error: str = "") -> Measurement:
        telemetry = monitor.summary(regions, len(samples)) if monitor and status is Status.OK else None
        return Measurement(candidate.key, status, device, tuple(samples), run_s, verify_s,
                           error_tail=error, started_at=started, finished_at=time.time(),
                           outputs=tuple(outputs) if reference is None else (), telemetry=telemetry,
                           raced=raced, clock=clock() if status in (Status.OK, Status.CLOCK_MISMATCH) else None)

    runner = runner or ProcessRunner()
    clocked = not runner.samples_are_warpfleets and seconds_per_unit(spec.metric) is not None
    claims: list[float] = []  # per run: the seconds its samples add up to
    walls: list[float] = []  # per run: the seconds warpfleet's own clock saw it take
    busy: list[DeviceRecord | None] = []  # per run: the device clock's record (None: none)
    floor_s = sample_floor_s(device.kind == "gpu")
    medians: list[float] = []  # per run: its samples' median (``cache_check``)
    counts: list[int] = []  # per run: how many samples it printed

    def clock() -> Clock | None:
        return _clock(claims, walls, busy, counts) if clocked else None

    with runner.stage(target, dict(candidate.params), candidate.arch, artifact.binary) as staged, \
            monitor or nullcontext():
        index, last = first_seed, first_seed + runs
        while index < last:
            # The baseline runs seeds 0..runs-1; candidates cycle through the seeds it ran.
            seed = index if reference is None or not reference.runs else index % len(reference.runs)
            wanted = reference.for_run(seed) if reference else None
            tampered = staged.reset() if index > first_seed else None  # nothing a run left serves the next
            if tampered:
                return done(Status.CRASHED, f"refused: {tampered}")
            result = staged.run(Invocation(seed=seed, stop_above=stop_above, max_samples=max_samples,
                                              reference=wanted, env={POISON_ENV: "1"} if poison else {}))
            run_s += result.seconds
            if result.timed_out:
                return done(Status.TIMEOUT, result.tail())
            if not result.ok:
                return done(Status.TOO_MANY_FILES if result.limit_exceeded == "files" else Status.CRASHED,
                            result.tail())
            found = parse_samples(result.stdout, spec.metric)
            problem = metric_problem(found, spec.metric, floor_s)
            if problem:
                status = Status.METRIC_MISSING if not found or problem.startswith("no ") else Status.METRIC_INVALID
                return done(status, f"{problem}\n{result.stdout[-2048:]}")
            samples.extend(found)
            if cache_check:
                medians.append(statistics.median(found))
            claims.append(sum(found) * (seconds_per_unit(spec.metric) or 0.0))
            counts.append(len(found))
            walls.append(result.seconds)
            if result.device is not None and not result.device.complete and reference is not None and clocked:
                return done(Status.CLOCK_MISMATCH, "its device record was begun and never ended (it left without "
                            "its exit handlers, or wrote the record itself): the device's work cannot be seen")
            busy.append(result.device if result.device is not None and result.device.complete else None)
            region = harness_region(result.stdout)
            if region:
                regions.append(region)
            raced = raced or RACED in result.stdout
            t0 = time.perf_counter()
            verified = runner.verified_outputs(staged, wanted) if wanted else frozenset()
            problem = verify_outputs(staged.files, result.stdout, spec.verify, wanted, verified)
            if reference is None and not problem and (seeded or not outputs):
                outputs.append(_run_outputs(staged.files, result.stdout, spec.verify))
            verify_s += time.perf_counter() - t0
            if problem and poison:
                problem = (f"{POISONED}: with its output buffers poisoned ({POISON_ENV}=1: NaN before every launch), "
                           f"{problem} (outputs left unwritten, or reused from an earlier launch?)")
            if problem:
                return done(Status.VERIFY_FAILED, problem)
            if spec.verify.test:
                t0 = time.perf_counter()
                test = staged.run(Invocation("test", seed=seed))
                verify_s += time.perf_counter() - t0
                if not test.ok:
                    return done(Status.TEST_FAILED, test.tail())
            index += 1
            if index == last and last - first_seed < CONFIRM_RUNS and (
                    _clock_problem(clock(), reference) or _device_problem(clock(), reference)):
                last = first_seed + CONFIRM_RUNS  # a claim the clock does not bear out: confirmed on more runs
        cached = _cached(medians, spec.metric.goal, earlier) if cache_check and not seeded else None
        if cached:
            return done(Status.VERIFY_FAILED, cached)
        measured = clock()
        problem = _device_problem(measured, reference)
        if problem and not (reference is not None and reference.clock is not None and measured is not None
                            and wall_judges(measured, reference.clock)):
            return done(Status.CLOCK_MISMATCH, problem)  # too small a claim for any wall clock: the record stands
        # A claim the device's busy time does not bear out, large enough for the wall clock, is judged
        # on runs in turn with the baseline: a program bound by its launches saves the GPU's idle
        # gaps between them, which its timer sees and the busy time does not (on an H200, honest
        # flags saving 44-115 ms of a sorting network's 66 launches a run were failed on the record).
        problem = problem or _clock_problem(measured, reference)
        if problem is None and _finalists_claim(measured, reference, runs):
            problem = "a finalist's claim with no device record to judge it"
        if problem and baseline is not None and reference is not None:
            cost = _pair_cost(reference, walls)
            if judge_s is not None and cost * (PAIRS[0] + 1) > judge_s:
                # Not begun: a claim not judged stays unsupported, and the job ends within its bound
                # (nine pairs of an fdtd2d's 3 s runs held an H200 63 s of a 300 s sweep).
                return done(Status.CLOCK_MISMATCH, f"{problem}; not judged again beside the baseline: its "
                            f"{2 * PAIRS[0] + 2} runs in turn would take about {cost * (PAIRS[0] + 1):.0f} s, "
                            f"more than the {judge_s:.0f} s one job may take now")
            again, seconds = beside(staged, runner, baseline(), reference, first_seed=first_seed,
                                    bound_s=judge_s, pair_s=cost, max_samples=_common_count(measured, reference))
            run_s += seconds
            problem = again and f"{problem}; judged again beside the baseline: {again}"
        if problem:
            return done(Status.CLOCK_MISMATCH, problem)
        return done(Status.OK)


def _cached(medians: list[float], goal: str, earlier: float | None = None) -> str | None:
    """Why the runs of one candidate on the same inputs look like a cache kept across them, or None:
    a later run's median ``CACHE_SPEEDUP`` times better than the first run's, and than ``earlier``
    (its median in a measurement of its own before, where known). The first run alone is no proof:
    on a loaded 2-core machine an honest finalist's first run of a C stencil took 5.2 ms a sample
    and its second 1.16 ms, and it failed as a cache; its search, a first run too, had measured
    what the later runs did."""
    if len(medians) < 2 or medians[0] <= 0:
        return None
    later = statistics.median(medians[1:])

    def faster(than: float) -> float:
        return than / max(later, 1e-300) if goal == "minimize" else later / max(than, 1e-300)

    ratio = faster(medians[0])
    if ratio <= CACHE_SPEEDUP or (earlier is not None and earlier > 0 and faster(earlier) <= CACHE_SPEEDUP):
        return None
    return (f"cached_results: its runs after the first, on the same inputs in fresh directories, were {ratio:.1f}x "
            f"faster than the first: results kept across runs")


def _common_count(measured: Clock | None, reference: Reference) -> int | None:
    """The samples both sides of runs in turn stop at: the fewer of the two sides' counts so far,
    where they differ (None: each its own rule). A harness that samples for a fixed time makes its
    samples add up to the same time on both sides whatever their speed, so that the pairs compared
    claims of nothing and the faster side's extra samples on the wall (on an H200, an honest 3.3x
    made 3.3 times the baseline's samples, 26 ms more a run, and was failed)."""
    counts = (measured.samples if measured is not None else None,
              reference.clock.samples if reference.clock is not None else None)
    if None in counts or counts[0] == counts[1]:
        return None
    return max(1, int(min(counts)))


def _pair_cost(reference: Reference, walls: list[float]) -> float:
    """A pair of runs in turn, estimated: the baseline's run (its clock) and the candidate's (its
    runs so far)."""
    own = statistics.median(walls) if walls else 0.0
    return own + (reference.clock.wall_s if reference.clock is not None else own)


def beside(staged: Staged, runner: Runner, baseline: Baseline, reference: Reference,
           rounds: tuple[int, ...] = PAIRS, first_seed: int = 0, bound_s: float | None = None,
           pair_s: float = 0.0, max_samples: int | None = None) -> tuple[str | None, float]:
    """Runs of the baseline and the candidate in turn (baseline, candidate, baseline, ...) on the
    same seeds, both under the load of the moment, and the candidate's claim judged on them
    (``clock.paired_problem``): ``rounds[0]`` pairs, then each next round's more while it fails;
    and the seconds the runs took. A run that fails or gives no valid metric ends it with the
    claim unsupported. ``bound_s``: a next round that would take the runs past it (at the pairs'
    time so far; ``pair_s`` before the first) is not begun, and the claim stays unsupported.
    ``max_samples``: both sides' runs capped there (``Invocation.max_samples``), the same count each."""
    metric = staged.target.spec.metric
    unit = seconds_per_unit(metric) or 0.0
    claims: tuple[list[float], list[float]] = ([], [])
    walls: tuple[list[float], list[float]] = ([], [])
    seconds, problem, indices = 0.0, None, itertools.count(first_seed)
    params = dict(baseline.candidate.params)
    with runner.stage(baseline.target, params, baseline.candidate.arch, baseline.binary, prefix="beside-") as base:
        # Each run leaves nothing for the other side to find (a persistent host's candidates share a
        # folder that holds both directories), nor for its own next run.
        staged.reset()
        for which in (base, staged):  # a warm-up each, left out: a first run's costs are not the program's claim
            seconds += which.run(Invocation(seed=first_seed % len(reference.runs) if reference.runs else first_seed,
                                            max_samples=max_samples)).seconds
            which.reset()
        done_pairs = 0
        for pairs in rounds:
            if bound_s is not None and done_pairs:
                pair_s = seconds / (done_pairs + 1)  # the warm-ups count as a pair
                if seconds + pairs * pair_s > bound_s:
                    return (f"{problem}; {pairs} more pairs would take about {pairs * pair_s:.0f} s, past the "
                            f"{bound_s:.0f} s one job may take now"), seconds
            done_pairs += pairs
            for index in itertools.islice(indices, pairs):
                seed = index % len(reference.runs) if reference.runs else index
                for side, which in enumerate((base, staged)):
                    result = which.run(Invocation(seed=seed, max_samples=max_samples))
                    which.reset()
                    seconds += result.seconds
                    found = parse_samples(result.stdout, metric) if result.ok and not result.timed_out else []
                    invalid = metric_problem(found, metric)
                    if invalid:
                        return f"{('the baseline', 'it')[side]}, run in turn with the other: {invalid}", seconds
                    claims[side].append(sum(found) * unit)
                    walls[side].append(result.seconds)
            problem = paired_problem(claims[1], walls[1], claims[0], walls[0])
            if problem is None:
                return None, seconds
    return problem, seconds


def _clock(claims: list[float], walls: list[float], busy: list[DeviceRecord | None],
           counts: list[int]) -> Clock | None:
    """Medians over the runs (``Clock``), the first left out where there are more (its warm-up:
    a cache made, a JIT, a context, is no part of the program's steady runs nor of the noise);
    None with no runs. The device's busy times only where every run has a record; ``counts``: the
    samples each run printed."""
    if not walls:
        return None
    start = 1 if len(walls) > 1 else 0
    claims, walls, busy, counts = claims[start:], walls[start:], busy[start:], counts[start:]
    wall = statistics.median(walls)
    whole = all(b is not None for b in busy) and bool(busy)
    device_s, device_spread = _median_spread([b.busy_s for b in busy if b is not None] if whole else [])
    kernels = [b.kernel_s for b in busy if b is not None and b.kernel_s is not None]
    kernel_s, kernel_spread = _median_spread(kernels if whole and len(kernels) == len(busy) else [])
    spans = [b.span_s for b in busy if b is not None and b.span_s is not None]
    span_s, span_spread = _median_spread(spans if whole and len(spans) == len(busy) else [])
    records = statistics.median(b.records for b in busy if b is not None) if whole else None
    samples = statistics.median(counts) if counts else None
    return Clock(statistics.median(claims), wall, 2 * statistics.median(abs(w - wall) for w in walls),
                 device_s, device_spread, kernel_s, kernel_spread, span_s, span_spread, samples, records)


def _median_spread(values: list[float]) -> tuple[float | None, float]:
    """The median of ``values`` and twice their median absolute deviation; (None, 0) for none."""
    if not values:
        return None, 0.0
    middle = statistics.median(values)
    return middle, 2 * statistics.median(abs(v - middle) for v in values)


def _clock_problem(measured: Clock | None, reference: Reference | None) -> str | None:
    if measured is None or reference is None or reference.clock is None:
        return None
    return clock_problem(measured, reference.clock)


def _device_problem(measured: Clock | None, reference: Reference | None) -> str | None:
    if measured is None or reference is None or reference.clock is None:
        return None
    return device_problem(measured, reference.clock)


def _finalists_claim(measured: Clock | None, reference: Reference | None, runs: int) -> bool:
    """A claim the finals (``CONFIRM_RUNS`` runs or more) would make, with no device record to judge
    it: judged on runs in turn with the baseline (``clock.judged_in_turn``), not against the study's
    first clock (a first run's warm-up, a load that came or went since, hid lies there)."""
    if measured is None or reference is None or reference.clock is None or runs < CONFIRM_RUNS:
        return False
    return measured.device_s is None and judged_in_turn(measured, reference.clock)


TIME_UNITS = {"s", "ms", "us", "µs", "ns", "cycles"}


def metric_problem(samples: list[float], metric: MetricSpec, floor_s: float = 0.0) -> str | None:
    """Why these samples cannot be measurements, or None. A time or an energy is positive and
    finite; any metric is finite; a time is no less than ``floor_s`` (``clock.sample_floor_s``:
    no timer resolves less, no GPU work takes less)."""
    if not samples:
        return "no metric samples in stdout"
    if not all(math.isfinite(s) for s in samples):
        return "no finite metric samples: NaN or Inf among them"
    if metric.unit in TIME_UNITS | {"J", "mJ"} and min(samples) <= 0:
        return f"a sample of {min(samples):g} {metric.unit}: a time or an energy must be positive"
    unit = seconds_per_unit(metric)
    if unit and min(samples) * unit < floor_s:
        return (f"a sample of {min(samples):g} {metric.unit}: less than {floor_s * 1e9:g} ns, which no "
                f"{'GPU work' if floor_s > 1e-9 else 'timer'} can measure")
    return None


def _run_outputs(workdir: Path | UntrustedDir, stdout: str, verify: VerifySpec) -> RunOutputs:
    if not isinstance(workdir, UntrustedDir):
        with UntrustedDir(workdir) as files:
            return _run_outputs(files, stdout, verify)
    files = tuple((o.path, workdir.read(o.path)) for o in verify.outputs)
    values: tuple[float, ...] = ()
    if verify.stdout_regex:
        values = tuple(float(v) for v in re.findall(verify.stdout_regex, stdout))
    return RunOutputs(files, values)
