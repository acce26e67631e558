"""Step 4 of the workflow: verify an agent's proposal, whoever made it.

    Proposal ─► static checks (declared sources only, read-only regions unchanged, every host
                function's kernel dependences kept) ─► variant Target ─► build ─► run against the
                baseline's outputs (and the target's tests) ─► compute-sanitizer ─► Verification

``RayVerifier`` builds in a compile task and runs on the study's measuring worker, and hands each
run to ``record`` so that the row lands in the results like any other. Proposals that change no
file (a ``-maxrregcount`` search) pass through: the sweep checks every candidate's outputs anyway.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import ray

from agents._base import AnalysisContext, Proposal
from agents.contracts import CUDA_SOURCES, violations
from agents.cuda_source import HostOpKind, analyze
from agents.depgraph import check, extract
from agents.patch import MarkerError, readonly_regions, source_files, variant_target
from agents.workflow.steps import Plan, Verdict, Verification, Verifier
from agents.workflow.steps import VerdictStatus as V
from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, Measurement, Phase, Status
from cluster.runners.sanitize import SanitizerResult

Record = Callable[[Target, Candidate, BuildArtifact, Measurement | None], None]


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
    guards = guard_verdict(target, proposal)
    if guards.failed or not proposal.files:
        return [guards]
    return [guards, depgraph_verdict(target, proposal), contracts_verdict(target, proposal)]


# -- the variant as a target --------------------------------------------------------------------

def run_verdicts(artifact: BuildArtifact, measurement: Measurement | None) -> list[Verdict]:
    if artifact.status is not Status.OK:
        return [Verdict("build", V.FAILED, f"{artifact.status.value}: {_last_line(artifact.error_tail)}")]
    build = Verdict("build", V.PASSED)
    if measurement is None:
        return [build, Verdict("outputs", V.FAILED, "not run: the measuring worker was lost")]
    status, tail = measurement.status, _last_line(measurement.error_tail)
    if status is Status.OK:
        return [build, Verdict("outputs", V.PASSED, "match the baseline's on every seed"),
                Verdict("tests", V.PASSED)]
    if status is Status.TEST_FAILED:
        return [build, Verdict("outputs", V.PASSED), Verdict("tests", V.FAILED, tail)]
    if status is Status.VERIFY_FAILED:
        return [build, Verdict("outputs", V.FAILED, tail)]
    return [build, Verdict("outputs", V.FAILED, f"{status.value}: {tail}")]


def sanitizer_verdicts(results: tuple[SanitizerResult, ...],
                       baseline: Mapping[str, SanitizerResult]) -> list[Verdict]:
    verdicts = []
    for r in results:
        base = baseline.get(r.tool)
        if r.outcome == "clean":
            verdicts.append(Verdict(r.tool, V.PASSED, r.detail))
        elif r.outcome == "errors" and base is not None and base.outcome == "errors":
            verdicts.append(Verdict(r.tool, V.SKIPPED, f"the baseline fails {r.tool} too: {base.detail}"))
        elif r.outcome == "errors":
            verdicts.append(Verdict(r.tool, V.FAILED, r.detail))
        elif r.outcome == "timeout":
            verdicts.append(_timeout_verdict(r, base))
        else:
            verdicts.append(Verdict(r.tool, V.SKIPPED, f"inconclusive: {r.detail}"))
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

class RayVerifier(Verifier):
    """Builds each variant in a compile task and checks it on one of the study's measuring workers."""

    def __init__(self, baseline: Candidate, reference: ray.ObjectRef, runs: int, worker: ray.actor.ActorHandle,
                 record: Record, sanitizer: tuple[str, ...] = (), sanitizer_timeout_s: float = 300,
                 guardrails: bool = False) -> None:
        self.baseline = baseline
        self.reference = reference
        self.runs = runs
        self.worker = worker
        self.record = record
        self.sanitizer = sanitizer
        self.timeout = sanitizer_timeout_s
        self.guardrails = guardrails
        self._baseline_sanitizer: dict[str, SanitizerResult] | None = None
        self._baseline_refs: tuple[ray.ObjectRef, ray.ObjectRef] | None = None  # (artifact, binary)
        self.measured: dict[str, Measurement] = {}  # proposal key -> its verification run (profile-guided rounds)

    def candidate(self, variant: Target) -> Candidate:
        params = {**dict(self.baseline.params), **variant.baseline_params}
        return dataclasses.replace(self.baseline, source_hash=variant.bundle.hash, params=tuple(params.items()),
                                   phase=Phase.VERIFY)

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        verdicts = static_verdicts(context.target, proposal)
        if any(v.failed for v in verdicts) or not proposal.files:
            if not proposal.files and not any(v.failed for v in verdicts):
                verdicts.append(Verdict("build", V.SKIPPED, "no source change: the sweep checks each flag value"))
            return Verification(tuple(verdicts))
        from cluster.engine.workers import compile_task  # the Ray task, imported late: tests use the rest alone

        variant = variant_target(context.target, proposal)
        candidate = self.candidate(variant)
        artifact_ref, binary = compile_task.remote(variant, candidate)
        artifact = ray.get(artifact_ref)
        measurement = None
        if artifact.status is Status.OK:
            measurement = ray.get(self.worker.measure.remote(variant, candidate, binary, self.reference, self.runs,
                                                             time.time()))
        self.record(variant, candidate, artifact, measurement)
        verdicts += run_verdicts(artifact, measurement)
        ran = measurement is not None and measurement.status is Status.OK
        if ran:
            from agents.workflow.engine import proposal_key

            self.measured[proposal_key(proposal)] = measurement
        if self.sanitizer and ran:
            results = ray.get(self.worker.sanitize.remote(variant, candidate, binary, self.sanitizer, self.timeout))
            verdicts += sanitizer_verdicts(results, self._baseline_results(context.target))
        if self.guardrails and ran:
            verdicts += ray.get(self.worker.guard.remote(context.target, self.baseline_binary(context.target), binary,
                                                         dict(proposal.files)))
        return Verification(tuple(verdicts))

    def _baseline_build(self, target: Target) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        """The baseline built once per verifier, for every check that runs it beside a variant."""
        if self._baseline_refs is None:
            from cluster.engine.workers import compile_task

            self._baseline_refs = tuple(compile_task.remote(target, self.baseline))
        return self._baseline_refs

    def baseline_binary(self, target: Target) -> ray.ObjectRef:
        return self._baseline_build(target)[1]

    def _baseline_results(self, target: Target) -> dict[str, SanitizerResult]:
        """The baseline under the same tools, once: errors it has too are not the variant's fault."""
        if self._baseline_sanitizer is None:
            artifact_ref, binary = self._baseline_build(target)
            if ray.get(artifact_ref).status is not Status.OK:
                self._baseline_sanitizer = {}
            else:
                results = ray.get(self.worker.sanitize.remote(target, self.baseline, binary, self.sanitizer,
                                                              self.timeout))
                self._baseline_sanitizer = {r.tool: r for r in results}
        return self._baseline_sanitizer


# -- here, without Ray ---------------------------------------------------------------------------

class LocalVerifier(Verifier):
    """Builds and (where ``device`` can run it) runs each variant in this process: for tools,
    tests and machines without a cluster. ``reference`` None: outputs are not compared."""

    def __init__(self, baseline: Candidate, device, reference=None, runs: int = 1, run: bool = True) -> None:
        self.baseline, self.device, self.reference, self.runs, self.run = baseline, device, reference, runs, run

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        from cluster.runners.build import compile_candidate
        from cluster.runners.measure import measure_candidate

        verdicts = static_verdicts(context.target, proposal)
        if any(v.failed for v in verdicts) or not proposal.files:
            return Verification(tuple(verdicts))
        variant = variant_target(context.target, proposal)
        params = {**dict(self.baseline.params), **variant.baseline_params}
        candidate = dataclasses.replace(self.baseline, source_hash=variant.bundle.hash, params=tuple(params.items()),
                                        phase=Phase.VERIFY)
        artifact = compile_candidate(variant, candidate)
        if artifact.status is not Status.OK or not self.run:
            verdicts += run_verdicts(artifact, None)[:1]
            if artifact.status is Status.OK:
                verdicts.append(Verdict("outputs", V.SKIPPED, "not run: no device here to run it"))
            return Verification(tuple(verdicts))
        measurement = measure_candidate(variant, candidate, artifact, self.device, self.reference, self.runs)
        return Verification(tuple(verdicts + run_verdicts(artifact, measurement)))
