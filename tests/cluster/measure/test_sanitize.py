"""compute-sanitizer bounded by a budget: a tool that hangs is a ``sanitizer_timeout`` verdict
within its budget, never a stall. The CPU has no compute-sanitizer: a fake one on PATH hangs."""

from __future__ import annotations

import os
import stat
from concurrent.futures import Future

from agents.workflow import VerdictStatus
from cluster.core.types import Status
from cluster.engine.jobs import JobResult
from cluster.engine.verify import SANITIZER_FLOOR_S, QueueVerifier, sanitizer_verdicts
from cluster.measure.sanitize import SanitizerResult, sanitize_candidate
from cluster.runners._base import ProcessRunner
from cluster.sandbox.sandbox import Unsandboxed
from tests.cluster.runners.test_persistent import built, target_with


def fake_sanitizer(folder, seconds: int):
    """A `compute-sanitizer` that hangs for ``seconds`` (a fake: no GPU tools on a CPU machine)."""
    path = folder / "compute-sanitizer"
    path.write_text(f"#!/bin/sh\nsleep {seconds}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return folder


def test_a_hanging_sanitizer_is_a_timeout_verdict_within_its_budget(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{fake_sanitizer(bin_dir, 600)}{os.pathsep}{os.environ['PATH']}")
    target = target_with(tmp_path, runner="process")
    candidate, artifact = built(target)
    # Unsandboxed: the fake lives in this test's temporary folder, which a sandbox's private /tmp hides.
    runner = ProcessRunner(sandbox=Unsandboxed())
    [result] = sanitize_candidate(target, candidate, artifact.binary, ("racecheck",), timeout=300,
                                  runner=runner, timeouts={"racecheck": 1.0})
    assert result.outcome == "timeout" and result.seconds >= 0.9  # its 1 s, not the fake's 600 s (a hang)
    clean_baseline = {"racecheck": SanitizerResult("racecheck", "clean", seconds=0.2)}
    [verdict] = sanitizer_verdicts((result,), clean_baseline)
    assert verdict.status is VerdictStatus.FAILED and verdict.detail.startswith("sanitizer_timeout")
    timed_out_baseline = {"racecheck": SanitizerResult("racecheck", "timeout", seconds=300)}
    [verdict] = sanitizer_verdicts((result,), timed_out_baseline)
    assert verdict.status is VerdictStatus.SKIPPED and "smaller problem" in verdict.detail


class RecordingJobs:
    """The study's jobs as the verifier sees them, answered at once: records each sanitizer budget."""

    def __init__(self, baseline_seconds: float) -> None:
        self.baseline_seconds, self.budgets = baseline_seconds, []

    def _done(self, value=None, measurement=None):
        from cluster.core.types import BuildArtifact, DeviceInfo, Measurement

        future = Future()
        job = type("J", (), {})()
        value = value if measurement is None else Measurement("k", Status.OK, DeviceInfo("cpu", "c", "host"), (1.0,))
        future.set_result(JobResult(job, BuildArtifact("k", Status.OK), value))
        return future

    def verify(self, variant, runs):
        return self._done(measurement=True)

    def sanitize(self, variant, tools, timeout, timeouts):
        if variant is None:
            return self._done(tuple(SanitizerResult(t, "clean", seconds=self.baseline_seconds) for t in tools))
        self.budgets.append(timeouts)
        return self._done(tuple(SanitizerResult(t, "clean") for t in tools))


def test_a_variants_budget_is_the_larger_of_the_floor_and_a_multiple_of_the_baselines_time(tmp_path):
    from agents._base import AnalysisContext, Proposal
    from agents.patch import source_files
    from agents.workflow import Finding, Level, Plan

    target = target_with(tmp_path, runner="process")
    files = source_files(target)
    proposal = Proposal("a", "d", (("prog.c", files["prog.c"].replace("calls++;", "calls += 1;")),))
    plan = Plan(Finding("x", Level.KERNEL, "", True), ("change",))
    for baseline_s, want in ((1.0, SANITIZER_FLOOR_S), (50.0, 200.0), (500.0, 300.0)):
        jobs = RecordingJobs(baseline_s)
        verification = QueueVerifier(jobs, 1, ("memcheck",), sanitizer_timeout_s=300).verify(
            AnalysisContext(target, "host"), plan, proposal)
        assert verification.passed, verification.reason
        assert jobs.budgets == [{"memcheck": want}]
