"""Step 4 of the workflow: verify an agent's proposal, whoever made it.

    Proposal ─► static checks (declared sources only, read-only regions unchanged, every host
                function's kernel dependences kept) ─► variant Target ─► build ─► run against the
                baseline's outputs (and the target's tests) ─► Verification: admitted
    (later, for a variant that measures faster: compute-sanitizer, the cheat checks, cluster.engine.verification.checks)

``QueueVerifier`` checks each proposal through the sweep's job queue (its verification run is a
row of the results like any other); ``LocalVerifier`` in this process. Proposals that change no
file (a ``-maxrregcount`` search) pass through: the sweep checks every candidate's outputs anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from agents._base import AnalysisContext, Proposal
from agents.contracts import CUDA_SOURCES, violations
from agents.cuda_source import analyze
from agents.depgraph import check, extract
from agents.patch import MarkerError, readonly_regions, source_files
from agents.source_model import HostOpKind
from agents.workflow.engine import COMPUTING
from agents.workflow.steps import Level, Plan, Verifier
from cluster.compile.build import compile_candidate
from cluster.config import Target
from cluster.config.target import variant_target
from cluster.core.types import BuildArtifact, Candidate, Measurement, Phase, Status, Verdict, Verification
from cluster.core.types import VerdictStatus as V
from cluster.measure.guardrails import cheat_checks
from cluster.measure.sanitize import SanitizerResult

if TYPE_CHECKING:
    from cluster.engine.study.study_jobs import StudyJobs


# -- static checks -----------------------------------------------------------------------------

def _regions(text: str) -> list[str]:
    lines = text.split("\n")
    return ["\n".join(lines[a - 1:b]) for a, b in readonly_regions(text)]


def guard_verdict(target: Target, proposal: Proposal) -> Verdict:
    """Only declared sources changed, and every read-only region is still there, word for word."""
    original = source_files(target)
    for path, text in proposal.files:
        if path not in original:
            return Verdict("guards", V.FAILED, f"{path} is not a declared source of {target.name}")
        try:
            before, after = _regions(original[path]), _regions(text)
        except MarkerError as exc:
            return Verdict("guards", V.FAILED, f"{path}: read-only markers broken: {exc}")
        if before != after:
            return Verdict("guards", V.FAILED, f"{path}: a read-only region was changed, moved or removed")
    return Verdict("guards", V.PASSED, f"{len(proposal.files)} declared sources changed, read-only regions intact")


def depgraph_verdict(target: Target, proposal: Proposal) -> Verdict:
    """Every host function that launches kernels, itself or through helpers of its file, keeps
    every kernel and every dependence (agents.depgraph follows the helpers and unfolds loops)."""
    original = source_files(target)
    defines = {name: str(value) for name, value in target.baseline_params.items()}
    checked, problems = 0, []
    for path, text in proposal.files:
        before, after = analyze(original[path], path, defines=defines), analyze(text, path, defines=defines)
        functions = dict.fromkeys(op.function for op in before.host_ops
                                  if op.function and op.kind in (HostOpKind.LAUNCH, HostOpKind.CALL))
        for function in functions:
            checked += 1
            result = check(extract(before, function), extract(after, function))
            problems += [f"{path}:{function}: {v.reason}" for v in result.violations]
    if not checked:
        return Verdict("depgraph", V.SKIPPED, "no kernel launches in the changed files")
    if problems:
        return Verdict("depgraph", V.FAILED, "; ".join(problems[:3]))
    return Verdict("depgraph", V.PASSED, f"{checked} host functions keep every kernel and dependence")


def contracts_verdict(target: Target, proposal: Proposal) -> Verdict:
    """The kernel-level promises the variant adds hold (agents.contracts): launch bounds that
    every launch fits, `__restrict__` only where no launch hands aliasing arguments, vector
    accesses under an alignment test."""
    if not any(path.endswith(CUDA_SOURCES) for path, _ in proposal.files):
        return Verdict("contracts", V.SKIPPED, "no CUDA source changed")
    defines = {name: str(value) for name, value in target.baseline_params.items()}
    problems = violations(source_files(target), dict(proposal.files), defines)
    if problems:
        return Verdict("contracts", V.FAILED, "; ".join(problems[:3]))
    return Verdict("contracts", V.PASSED, "launch bounds, __restrict__ and vector accesses hold")


def static_verdicts(target: Target, proposal: Proposal) -> list[Verdict]:
    """The checks that need no build, as the experts' computing is: one thread at a time
    (``agents.workflow.engine.COMPUTING``)."""
    with COMPUTING:
        guards = guard_verdict(target, proposal)
        if guards.failed or not proposal.files:
            return [guards]
        return [guards, depgraph_verdict(target, proposal), contracts_verdict(target, proposal)]


# -- the variant as a target --------------------------------------------------------------------

def run_verdicts(artifact: BuildArtifact, measurement: Measurement | None, tested: bool = True) -> list[Verdict]:
    """The build's, the outputs' and the user's tests' verdicts from a verification run; ``tested``
    False: the target declares no ``verify.test``, so its tests are skipped, not passed."""
    if artifact.status is not Status.OK:
        return [Verdict("build", V.FAILED, f"{artifact.status.value}: {_last_line(artifact.error_tail)}")]
    build = Verdict("build", V.PASSED, seconds=artifact.compile_s)
    if measurement is None:
        return [build, Verdict("outputs", V.FAILED, "not run: the measuring worker was lost")]
    status, tail, ran = measurement.status, _last_line(measurement.error_tail), measurement.run_s + measurement.verify_s
    if status is Status.OK:
        tests = Verdict("tests", V.PASSED) if tested else Verdict("tests", V.SKIPPED, NO_TESTS)
        return [build, Verdict("outputs", V.PASSED, "match the baseline's on every seed", ran), tests]
    if status is Status.TEST_FAILED:
        return [build, Verdict("outputs", V.PASSED, seconds=ran), Verdict("tests", V.FAILED, tail)]
    if status is Status.VERIFY_FAILED:
        return [build, Verdict("outputs", V.FAILED, tail, ran)]
    return [build, Verdict("outputs", V.FAILED, f"{status.value}: {tail}", ran)]


NO_TESTS = "the target declares no verify.test"


def sanitizer_verdicts(results: tuple[SanitizerResult, ...],
                       baseline: Mapping[str, SanitizerResult]) -> list[Verdict]:
    verdicts = []
    for r in results:
        base = baseline.get(r.tool)
        if r.outcome == "clean":
            verdict = Verdict(r.tool, V.PASSED, r.detail)
        elif r.outcome == "errors" and base is not None and base.outcome == "errors":
            verdict = Verdict(r.tool, V.SKIPPED, f"the baseline fails {r.tool} too: {base.detail}")
        elif r.outcome == "errors":
            verdict = Verdict(r.tool, V.FAILED, r.detail)
        elif r.outcome == "timeout":
            verdict = _timeout_verdict(r, base)
        else:
            verdict = Verdict(r.tool, V.SKIPPED, f"inconclusive: {r.detail}")
        verdicts.append(dataclasses.replace(verdict, seconds=r.seconds))
    return verdicts


SANITIZER_TIMEOUT = "sanitizer_timeout"


def _timeout_verdict(result: SanitizerResult, base: SanitizerResult | None) -> Verdict:
    """The policy for a sanitizer that ran out of its budget (README, "Bounded verification"): when
    the baseline itself ran out, the tool cannot judge this target (skipped, and said so); when the
    baseline finished within its budget, a variant that does not is rejected (a hang, or far more
    work than the program it replaces)."""
    if base is None or base.outcome == "timeout":
        return Verdict(result.tool, V.SKIPPED, f"{SANITIZER_TIMEOUT}: the baseline's own {result.tool} run does not "
                                              f"finish within its budget either; give verify.sanitize_run a "
                                              f"smaller problem")
    return Verdict(result.tool, V.FAILED, f"{SANITIZER_TIMEOUT}: no verdict within {result.seconds:.0f} s "
                                          f"(the baseline took {base.seconds:.1f} s)")


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# -- on the cluster ------------------------------------------------------------------------------

SANITIZER_FLOOR_S = 60.0  # a variant's budget per tool is at least this ...
SANITIZER_FACTOR = 4.0  # ... or this many times the baseline's own time, whichever is larger


class SearchClosed(RuntimeError):
    """A variant's verification was not run: its study's search had closed (its time was up)."""


# A study's turn in the admission lane goes to its variant of the highest level (``Job.value``;
# the studies still take turns): a change of the program's structure first, a hint last. A short
# budget admits a few variants of each study (configs/suite at 240 s on an H200: two of
# multikernel's, both `#pragma unroll`, and its streams never ran); the higher a change's level,
# the more of the program's work it can change.
ADMIT_ORDER = {Level.APPLICATION: 3.0, Level.KERNEL: 2.0, Level.COMPILER_HINT: 1.0, Level.COMPILER_OPTION: 0.0}


class QueueVerifier(Verifier):
    """Verification in tiers (issue 25), through the sweep's job queue, from the agents' thread.

    The cheap tier admits: the static checks, then a build and a run against the baseline's outputs
    (a ``verify`` row: its time too). A variant that passes is handed to ``admit`` at once: it joins
    the running search, and the expensive tier (compute-sanitizer, the timing code it changed:
    ``cluster.engine.verification.checks``) runs for it if it measured faster than the baseline. ``admit``'s
    future brings those verdicts back (none, for a variant no faster), so that a transformer that
    takes feedback hears of a failed check and can try again (the cheat checks that need runs are
    its finals' runs, later). Without ``admit`` (the
    profile-guided rounds' trials), only the cheap tier runs. ``jobs`` is the study's job factory
    whose ``submit`` is the scheduler's ``submit_threadsafe``."""

    def __init__(self, jobs: StudyJobs, runs: int, known: frozenset[str] = frozenset(),
                 admit: Callable[[Target, Plan, Proposal], Future[tuple[Verdict, ...]]] | None = None) -> None:
        self.jobs, self.runs, self.known, self.admit = jobs, runs, known, admit  # known: admitted before (resume)
        self.measured: dict[str, Measurement] = {}  # proposal key -> its verification run (profile-guided rounds)

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        verdicts = static_verdicts(context.target, proposal)
        if any(v.failed for v in verdicts) or not proposal.files:
            if not proposal.files and not any(v.failed for v in verdicts):
                verdicts.append(Verdict("build", V.SKIPPED, "no source change: the sweep checks each flag value"))
            return Verification(tuple(verdicts))
        variant = variant_target(context.target, proposal)
        if variant.bundle.hash in self.known:
            return Verification((*verdicts, Verdict("admitted", V.PASSED, "admitted by an earlier invocation")))
        result = self.jobs.verify(variant, self.runs, label=plan.finding.location,
                                  value=ADMIT_ORDER.get(plan.finding.level, 0.0)).result()
        if result.dropped:
            raise SearchClosed("the study's search closed before this variant's verification ran")
        verdicts += run_verdicts(result.artifact, result.measurement, bool(variant.spec.verify.test))
        measurement = result.measurement
        if measurement is None or measurement.status is not Status.OK:
            return Verification(tuple(verdicts))
        from agents.workflow.engine import proposal_key

        self.measured[proposal_key(proposal)] = measurement
        if self.admit is not None:
            verdicts += self.admit(variant, plan, proposal).result()
        return Verification(tuple(verdicts))


# -- here, without Ray ---------------------------------------------------------------------------

class LocalVerifier(Verifier):
    """Builds and (where ``device`` can run it) runs each variant in this process: for tools,
    tests and machines without a cluster. ``reference`` None: outputs are not compared. ``build``:
    how a variant is built (``compile_candidate``'s arguments and result), for a caller that builds
    the same variants more than once and keeps its builds."""

    def __init__(self, baseline: Candidate, device, reference=None, runs: int = 1, run: bool = True,
                 build: Callable[[Target, Candidate], BuildArtifact] = compile_candidate) -> None:
        self.baseline, self.device, self.reference, self.runs, self.run = baseline, device, reference, runs, run
        self.build = build

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        from cluster.measure.measure import measure_candidate

        verdicts = static_verdicts(context.target, proposal)
        if any(v.failed for v in verdicts) or not proposal.files:
            return Verification(tuple(verdicts))
        variant = variant_target(context.target, proposal)
        params = {**dict(self.baseline.params), **variant.baseline_params}
        candidate = dataclasses.replace(self.baseline, source_hash=variant.bundle.hash, params=tuple(params.items()),
                                        phase=Phase.VERIFY)
        artifact = self.build(variant, candidate)
        if artifact.status is not Status.OK or not self.run:
            verdicts += run_verdicts(artifact, None)[:1]
            if artifact.status is Status.OK:
                verdicts.append(Verdict("outputs", V.SKIPPED, "not run: no device here to run it"))
            return Verification(tuple(verdicts))
        measurement = measure_candidate(variant, candidate, artifact, self.device, self.reference, self.runs)
        return Verification(tuple(verdicts + run_verdicts(artifact, measurement, bool(variant.spec.verify.test))))


class GuardedVerifier(Verifier):
    """``base``'s verification and then, for a variant that passed it with changed files, every
    cheat check, built and run on this machine (a CPU target anywhere, a CUDA one on a GPU node).
    On a cluster the same checks belong on the measuring worker: ``cheat_checks`` with the binaries
    the verifier already has."""

    def __init__(self, base: Verifier, baseline: Candidate, scratch_root: Path | None = None) -> None:
        self.base, self.baseline, self.scratch_root = base, baseline, scratch_root
        self._baseline_artifacts: dict[str, BuildArtifact] = {}

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        verification = self.base.verify(context, plan, proposal)
        if not verification.passed or not proposal.files:
            return verification
        target = context.target
        if target.bundle.hash not in self._baseline_artifacts:
            self._baseline_artifacts[target.bundle.hash] = compile_candidate(target, self.baseline, self.scratch_root)
        baseline = self._baseline_artifacts[target.bundle.hash]
        variant = variant_target(target, proposal)
        candidate = dataclasses.replace(self.baseline, source_hash=variant.bundle.hash, phase=Phase.VERIFY)
        artifact = compile_candidate(variant, candidate, self.scratch_root)
        if baseline.status is not Status.OK or artifact.status is not Status.OK:
            skipped = Verdict("cheat_checks", V.SKIPPED, "a build for the checks failed")
            return Verification((*verification.verdicts, skipped))
        return Verification((*verification.verdicts, *cheat_checks(target, baseline, artifact, dict(proposal.files))))
