"""Checks against the known ways that generated code fakes speed, run on built candidates in the
verification step, each a ``Verdict``:

    poisoned_outputs  outputs left unwritten: the run gets ``WARPFLEET_POISON=1`` (a harness that
                      knows its output buffers fills them with 0xFF bytes, a NaN, before every
                      timed launch) and its output files pre-filled with the same bytes; what it
                      writes must still match the baseline's on the same inputs
    cached_results    results cached across runs: two runs in one directory on two fresh seeds,
                      each compared with the baseline's on that seed (without ``{seed}``: the
                      second run must not be much faster than the first)
    untimed_work      work moved outside the timed region: the wall time the candidate saves must
                      match the time its samples save; what the samples lost and the process did
                      not is work done where no timer sees it
    timing_code       timing code edited: no changed line may touch a timing call, a helper that
                      makes one, a variable it sets, or the line that prints the metric; and a
                      harness's sample lines must agree with its own summary

The baseline's runs that the output checks compare with are kept in the process for the next
variant's checks (``_baseline_run``: the same binary, seed and staged files give the same run).

``suspect_speedup`` and ``reverify_fresh_seeds`` are the 10x rule: a candidate that much faster is
run again on inputs that no run has seen before it is believed, and flagged for review.
``cluster.engine.verification.verify.GuardedVerifier`` adds the checks to any verifier's, on this machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cluster.config import Target
from cluster.core.encodings import SUSPECT_SPEEDUP, suspect_speedup  # noqa: F401  (re-exported: the 10x rule)
from cluster.core.placeholders import names_in
from cluster.core.types import BuildArtifact, RunOutputs, Verdict, VerdictStatus
from cluster.measure.clock import median_bounds
from cluster.measure.measure import PROTOCOL_PREFIX, parse_samples, verify_outputs
from cluster.runners._base import POISON_ENV, Invocation, ProcessRunner, Runner, Staged
from cluster.sandbox.sandbox import read_output, scratch_dir, write_bundle

POISON_BYTE = 0xFF  # four of them are a NaN as float32 (and as float64, eight)
FRESH_SEEDS = (1_000_003, 2_000_029)  # far from the seeds 0..runs-1 that a sweep's runs use
CACHE_SPEEDUP = 3.0  # a second run in the same directory this much faster holds a cache
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Run:
    """One run of a built binary, for the checks."""

    ok: bool
    error: str
    samples: tuple[float, ...]
    wall_s: float
    outputs: RunOutputs
    stdout: str
    timed_out: bool = False


def run_binary(staged: Staged, *, seed: int = 0, poison: bool = False) -> Run:
    """Run a staged candidate once; a second run in the same directory sees what the first left."""
    spec = staged.target.spec
    if poison:
        for output in spec.verify.outputs:  # a run that leaves a file as it found it leaves poison
            before = read_output(staged.files, output.path)
            size = len(before) if before is not None else 4096
            try:  # made afresh: an earlier run's link is replaced, never written through
                staged.files.write(output.path, bytes([POISON_BYTE]) * max(size, 8))
            except OSError:
                continue  # a link where a folder of the path should be: the run cannot write there either
    result = staged.run(Invocation(seed=seed, env={POISON_ENV: "1"} if poison else {}))
    found = {o.path: read_output(staged.files, o.path) for o in spec.verify.outputs}
    files = tuple((name, content) for name, content in found.items() if content is not None)
    stdout_values: tuple[float, ...] = ()
    if spec.verify.stdout_regex:
        stdout_values = tuple(float(v) for v in re.findall(spec.verify.stdout_regex, result.stdout))
    samples = tuple(parse_samples(result.stdout, spec.metric))
    return Run(result.ok, "" if result.ok else result.tail(), samples, result.seconds,
               RunOutputs(files, stdout_values), result.stdout, result.timed_out)


@contextmanager
def _staged(target: Target, artifact: BuildArtifact, runner: Runner | None) -> Iterator[Staged]:
    with (runner or ProcessRunner()).stage(target, target.baseline_params, "", artifact.binary,
                                           prefix="guard-") as staged:
        yield staged


def _fresh(target: Target, artifact: BuildArtifact, runner: Runner | None, *, seed: int = 0,
           poison: bool = False) -> Run:
    with _staged(target, artifact, runner) as staged:
        return run_binary(staged, seed=seed, poison=poison)


# The baseline's runs that the output checks compare with, kept in this process (a worker) for the
# next variant of the same target: its binary, seed and staged files are the same, so is its run.
BASELINE_RUNS_KEPT = 6
_baseline_runs: OrderedDict[str, Run] = OrderedDict()
_baseline_lock = threading.Lock()


def _baseline_key(target: Target, baseline: BuildArtifact, seed: int, poison: bool) -> str:
    """What a run of the baseline's binary depends on when staged as ``target`` (a variant: its own
    sources, which the binary does not read): the binary, the files staged besides the sources, the
    run command and the params it names, what is collected of the outputs, the runner, the seed and
    the poison."""
    spec = target.spec
    sources = set(spec.sources)
    data = [(path, hashlib.sha256(content).hexdigest()) for path, content in sorted(target.bundle.files)
            if path not in sources]
    used = names_in(spec.run)
    params = sorted((name, str(value)) for name, value in target.baseline_params.items() if name in used)
    outputs = [o.path for o in spec.verify.outputs]
    described = json.dumps([data, [str(a) for a in spec.run], params, outputs, spec.verify.stdout_regex,
                            target.runner, seed, poison], default=str)
    return hashlib.sha256((baseline.binary or b"") + described.encode()).hexdigest()


def _baseline_run(target: Target, baseline: BuildArtifact, runner: Runner | None, *, seed: int,
                  poison: bool = False) -> Run:
    """The baseline's run on ``seed``, from an earlier variant's checks where this process made it."""
    key = _baseline_key(target, baseline, seed, poison)
    with _baseline_lock:
        if key in _baseline_runs:
            _baseline_runs.move_to_end(key)
            return _baseline_runs[key]
    run = _fresh(target, baseline, runner, seed=seed, poison=poison)
    if run.ok:
        with _baseline_lock:
            _baseline_runs[key] = run
            while len(_baseline_runs) > BASELINE_RUNS_KEPT:
                _baseline_runs.popitem(last=False)
    return run


def _differs(target: Target, run: Run, reference: Run) -> str | None:
    """Why ``run``'s outputs do not match ``reference``'s, or None."""
    if not run.ok:  # the status and the last thing the run said (the exception, the error)
        lines = [line.strip() for line in run.error.splitlines() if line.strip()]
        return "; ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else "the run failed"
    with scratch_dir(None, "guard-cmp-") as workdir:
        write_bundle(run.outputs.files, workdir)
        return verify_outputs(workdir, run.stdout, target.spec.verify, reference.outputs)


def _seeded(target: Target) -> bool:
    return "seed" in names_in(target.spec.run)


def check_poisoned_outputs(target: Target, baseline: BuildArtifact, candidate: BuildArtifact,
                           runner: Runner | None = None) -> Verdict:
    name = "poisoned_outputs"
    seed = FRESH_SEEDS[0] if _seeded(target) else 0
    want = _baseline_run(target, baseline, runner, seed=seed, poison=True)
    if not want.ok:
        return Verdict(name, VerdictStatus.SKIPPED, "the baseline itself fails with poisoned outputs")
    got = _fresh(target, candidate, runner, seed=seed, poison=True)
    problem = _differs(target, got, want)
    if problem:
        return Verdict(name, VerdictStatus.FAILED, f"with its output buffers poisoned: {problem} (outputs left "
                                                   f"unwritten, or reused from an earlier launch)")
    return Verdict(name, VerdictStatus.PASSED)


def check_cached_results(target: Target, baseline: BuildArtifact, candidate: BuildArtifact,
                         runner: Runner | None = None) -> Verdict:
    name = "cached_results"
    with _staged(target, candidate, runner) as staged:
        if not _seeded(target):
            first = run_binary(staged)
            second = run_binary(staged)
            if not (first.ok and second.ok and first.samples and second.samples):
                return Verdict(name, VerdictStatus.SKIPPED, "no {seed} in the run command, and no samples to compare")
            ratio = statistics.median(first.samples) / max(statistics.median(second.samples), 1e-300)
            if ratio > CACHE_SPEEDUP:
                return Verdict(name, VerdictStatus.FAILED, f"a second run in the same directory was {ratio:.1f}x "
                                                           f"faster than the first: results cached across runs")
            return Verdict(name, VerdictStatus.PASSED, "no {seed} in the run command: timing compared only")
        for index, seed in enumerate(FRESH_SEEDS):
            got = run_binary(staged, seed=seed)
            problem = _differs(target, got, _baseline_run(target, baseline, runner, seed=seed))
            if problem:
                return Verdict(name, VerdictStatus.FAILED, f"run {index + 1} on fresh seed {seed}, in the directory "
                                                           f"of the run before: {problem} (results cached across runs "
                                                           f"or inputs)")
    return Verdict(name, VerdictStatus.PASSED)


def check_untimed_work(target: Target, baseline: BuildArtifact, candidate: BuildArtifact,
                       repeats: int = 3, confirm: int = 6, runner: Runner | None = None) -> Verdict:
    """The time a run spends outside its samples (start-up, inputs, outputs) must not grow while
    its samples shrink: what the samples lost and the process did not is work that no timer saw.
    The runs are made in pairs, baseline then candidate, and each pair's growth counts. Where the
    median growth of ``repeats`` pairs passes the tolerance, ``confirm`` more pairs are made, and
    the variant fails only if moved work shows in nearly all of them: the sign test's lower
    confidence bound on the median growth (``clock.median_bounds``) must pass the tolerance too.
    Work moved is there in every run; a loaded node's noise, tens of milliseconds either way, is
    not (an honest variant's median grew 50 ms over nine pairs with two test workers and two
    spinning processes on two cores). The tolerance is half a baseline sample, a quarter of the
    baseline's untimed time (CUDA start-up is noisy) or 10 ms."""
    name = "untimed_work"
    metric = target.spec.metric
    scale = _UNIT_SECONDS.get(metric.unit)
    if scale is None or metric.goal != "minimize":
        return Verdict(name, VerdictStatus.SKIPPED, f"the metric ({metric.unit}, {metric.goal}) is not a time")
    runs: dict[str, list[Run]] = {"baseline": [], "candidate": []}
    paired: list[tuple[Run, Run]] = []  # (baseline, candidate) of one turn, both with samples

    def more(pairs: int) -> None:
        for _ in range(pairs):  # interleaved, so that a burst of load on the node hits both sides
            pair = [_fresh(target, artifact, runner) for artifact in (baseline, candidate)]
            for label, run in zip(runs, pair, strict=True):
                if run.ok and run.samples:
                    runs[label].append(run)
            if all(run.ok and run.samples for run in pair):
                paired.append((pair[0], pair[1]))

    def timed(r: Run) -> float:
        return sum(r.samples) * scale

    def moved() -> tuple[float, list[float], float]:
        # Medians: a process's time outside its samples is bimodal on a busy node (seen: 7 ms or
        # 24 ms for the same binary); a minimum of a few runs compares a lucky run with an unlucky one.
        timed_b = statistics.median(timed(r) for r in runs["baseline"])
        timed_c = statistics.median(timed(r) for r in runs["candidate"])
        untimed_b = statistics.median(r.wall_s - timed(r) for r in runs["baseline"])
        sample = statistics.median(s for r in runs["baseline"] for s in r.samples) * scale
        tolerance = max(0.5 * sample, 0.25 * untimed_b, 0.010)
        gained = timed_b - timed_c if timed_c < timed_b else 0.0
        # Grown: the median of each turn's difference, which a load common to the pair cancels (the
        # medians of each side apart failed an honest variant by 127 ms under two spinning processes).
        growth = sorted((c.wall_s - timed(c)) - (b.wall_s - timed(b)) for b, c in paired)
        return gained, growth, tolerance

    more(repeats)
    for label, good in runs.items():
        if not good:
            return Verdict(name, VerdictStatus.SKIPPED, f"the {label} gave no samples")
    gained, growth, tolerance = moved()
    if not (gained and growth and statistics.median(growth) > tolerance):
        return Verdict(name, VerdictStatus.PASSED)
    if confirm:
        more(confirm)
        gained, growth, tolerance = moved()
    if gained and median_bounds(growth)[0] > tolerance:  # the bound is at most the median: both pass
        grown, beyond = statistics.median(growth), sum(g > tolerance for g in growth)
        return Verdict(name, VerdictStatus.FAILED,
                       f"its samples take {1e3 * gained:.1f} ms less than the baseline's, but the rest of the run "
                       f"{1e3 * grown:.1f} ms more (beyond {1e3 * tolerance:.1f} ms in {beyond} of {len(growth)} "
                       f"pairs of runs): work outside the timed region")
    return Verdict(name, VerdictStatus.PASSED)


_TIMING_CALLS = (r"\bclock_gettime\b", r"\bgettimeofday\b", r"\bstd::chrono\b", r"\bchrono::", r"\bclock\s*\(",
                 r"\bomp_get_wtime\b", r"\b__rdtsc\b", r"\bcudaEventElapsedTime\b", r"\bQueryPerformanceCounter\b",
                 r"\bwf::bench\b", r"\bCLOCK_(?:MONOTONIC|REALTIME)\w*")
_FUNCTION = re.compile(r"^[A-Za-z_][\w\s\*&:<>,]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:const\s*)?\{", re.MULTILINE)
_ASSIGNED = re.compile(r"\b([A-Za-z_]\w*)\s*[-+*/]?=(?!=)")
_LAMBDA_BODY = re.compile(r"(wf::bench\s*\([^{]*\{).*(\}\s*\)\s*;?)")
HELPER_LINES = 15  # a function this short that reads a clock is a timing helper


@dataclass(frozen=True)
class TimingCode:
    """What counts as timing code in one source: timing calls, short helpers that make them (their
    whole bodies, by line), the variables assigned from either, the protocol prefix and the metric."""

    patterns: tuple[re.Pattern[str], ...]
    helper_lines: frozenset[int]  # 0-based lines inside timing helpers

    @classmethod
    def of(cls, source: str, metric_name: str = "time_ms") -> TimingCode:
        calls = [re.compile(p) for p in _TIMING_CALLS]
        helpers, lines = [], set()
        for match in _FUNCTION.finditer(source):
            body = _body(source, match.end() - 1)
            if body.count("\n") <= HELPER_LINES and any(p.search(body) for p in calls):
                helpers.append(re.compile(rf"\b{re.escape(match.group(1))}\s*\("))
                first = source.count("\n", 0, match.start())
                last = source.count("\n", 0, match.end()) + body.count("\n")
                lines.update(range(first, last + 1))
        timing = calls + helpers
        variables = {m.group(1) for line in source.splitlines() if any(p.search(line) for p in timing)
                     for m in _ASSIGNED.finditer(line)}
        return cls((*timing, *(re.compile(rf"\b{re.escape(v)}\b") for v in sorted(variables)),
                    re.compile(re.escape(PROTOCOL_PREFIX)), re.compile(rf"\b{re.escape(metric_name)}\b")),
                   frozenset(lines))

    def lines(self, lines: Sequence[str], first: int, other: TimingCode) -> list[str]:
        """The timing code among ``lines`` (numbered from ``first``), whitespace-normalized, by this
        source's and ``other``'s patterns; the launch inside a one-line ``wf::bench(opt, [&](...)
        { ... });`` is the program's, not timing code."""
        out = []
        for number, line in enumerate(lines, first):
            text = " ".join(_LAMBDA_BODY.sub(r"\1\2", line).split())
            if number in self.helper_lines or any(p.search(text) for p in (*self.patterns, *other.patterns)):
                out.append(text)
        return out


def _body(source: str, brace: int) -> str:
    depth = 0
    for i in range(brace, len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return source[brace:i + 1]
    return source[brace:]


def check_timing_code(target: Target, files: Mapping[str, str], stdout: str | None = None) -> Verdict:
    """``files`` (path -> new text) against the target's sources: every changed stretch must hold
    the same timing code before and after; and when ``stdout`` is a harness run's, its sample
    lines must match its summary."""
    import difflib

    name = "timing_code"
    originals = {path: content.decode("utf-8", "surrogateescape") for path, content in target.bundle.files}
    metric = target.spec.metric.name
    for path, text in files.items():
        before = originals.get(path, "")
        was, now = TimingCode.of(before, metric), TimingCode.of(text, metric)
        old, new = before.split("\n"), text.split("\n")
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            removed, added = was.lines(old[i1:i2], i1, now), now.lines(new[j1:j2], j1, was)
            if tag != "equal" and removed != added:
                pairs = [a for a, b in zip(added, removed, strict=False) if a != b]
                line = (pairs or added[len(removed):] or removed[len(added):])[0]
                where = j1 + 1 if added else i1 + 1
                return Verdict(name, VerdictStatus.FAILED, f"{path}:{where}: changes timing code: `{line[:120]}`")
    if stdout is not None:
        problem = sample_lines_problem(stdout, target)
        if problem:
            return Verdict(name, VerdictStatus.FAILED, problem)
    return Verdict(name, VerdictStatus.PASSED)


def sample_lines_problem(stdout: str, target: Target) -> str | None:
    """A harness prints one line per sample and a summary with their count: more or fewer sample
    lines than it counted were printed by someone else."""
    summary = [line for line in stdout.splitlines() if line.startswith(PROTOCOL_PREFIX) and " samples=" in line]
    if not summary:
        return None
    counted = re.search(r"\bsamples=(\d+)", summary[-1])
    printed = len(parse_samples(stdout, target.spec.metric))
    if counted and int(counted.group(1)) != printed:
        return f"{printed} sample lines but the harness took {counted.group(1)} samples: samples printed outside it"
    return None


def reverify_fresh_seeds(target: Target, baseline: BuildArtifact, candidate: BuildArtifact,
                         seeds: Sequence[int] = FRESH_SEEDS, runner: Runner | None = None) -> Verdict:
    """The candidate against the baseline on inputs from ``seeds``, each run in a fresh directory."""
    name = "fresh_seeds"
    if not _seeded(target):
        return Verdict(name, VerdictStatus.SKIPPED, "the run command takes no {seed}: no fresh inputs to give")
    done: list[int] = []
    for seed in seeds:
        # The baseline first (kept from an earlier review on this worker where it ran): a review
        # whose job bound ends in the baseline's run has not spent the candidate's.
        want = _baseline_run(target, baseline, runner, seed=seed)
        got = _fresh(target, candidate, runner, seed=seed) if want.ok else None
        if done and (got is None or got.timed_out):
            # The job's time ran out after a seed compared (a slow program's review bounded by the
            # plan): judged on the seeds compared, one fresh input at the least.
            why = f"the baseline's run: {want.error}" if got is None else got.error
            return Verdict(name, VerdictStatus.PASSED, f"seeds {', '.join(map(str, done))} (seed {seed} not "
                                                       f"compared: {_first_line(why)})")
        if not want.ok and not want.timed_out:
            return Verdict(name, VerdictStatus.SKIPPED, f"the baseline itself fails on seed {seed}: "
                                                        f"{_first_line(want.error)}")
        if not want.ok:  # a candidate never compared is not checked
            return Verdict(name, VerdictStatus.FAILED, f"not checked: the baseline's run on seed {seed} did not end "
                                                       f"within the review's time ({_first_line(want.error)})")
        problem = _differs(target, got, want)
        if problem:
            return Verdict(name, VerdictStatus.FAILED, f"seed {seed}: {problem}")
        done.append(seed)
    return Verdict(name, VerdictStatus.PASSED, f"seeds {', '.join(map(str, seeds))}")


def _first_line(text: str | None) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "failed")


def cheat_checks(target: Target, baseline: BuildArtifact, candidate: BuildArtifact,
                 files: Mapping[str, str], runner: Runner | None = None) -> tuple[Verdict, ...]:
    """Every check, for a candidate built from ``files`` (its changed sources), each with its time."""
    checks = (lambda: check_timing_code(target, files),
              lambda: check_poisoned_outputs(target, baseline, candidate, runner),
              lambda: check_cached_results(target, baseline, candidate, runner),
              lambda: check_untimed_work(target, baseline, candidate, runner=runner))
    verdicts = []
    for check in checks:
        start = time.monotonic()
        verdict = check()
        verdicts.append(dataclasses.replace(verdict, seconds=time.monotonic() - start))
    return tuple(verdicts)
