"""compute-sanitizer bounded by a budget: a tool that hangs is a ``sanitizer_timeout`` verdict
within its budget, never a stall. The CPU has no compute-sanitizer: a fake one on PATH hangs."""

from __future__ import annotations

import os
import stat
from concurrent.futures import Future

from agents.workflow import VerdictStatus
from cluster.core.types import Status
from cluster.engine.scheduling.jobs import JobResult
from cluster.engine.verification.verify import SANITIZER_FACTOR, SANITIZER_FLOOR_S, sanitizer_verdicts
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
    """The study's jobs as the expensive checks see them, answered at once: the variant's first run
    under the tool times out within its first budget, the baseline's takes ``baseline_seconds``;
    each budget a variant's run was given is recorded."""

    def __init__(self, baseline_seconds: float, target) -> None:
        self.baseline_seconds, self.budgets, self.values = baseline_seconds, [], []
        self.state = type("S", (), {"name": "study", "target": target})()

    def sanitize(self, variant, tools, timeout, timeouts, label="", value=0.0, kernels=(), launches=None):
        from cluster.core.types import BuildArtifact

        self.values.append(value)
        if variant is None:
            value = tuple(SanitizerResult(t, "clean", seconds=self.baseline_seconds) for t in tools)
        else:
            self.budgets.append(timeouts)
            first = len(self.budgets) == 1
            value = tuple(SanitizerResult(t, "timeout" if first else "clean", seconds=timeouts[t]) for t in tools)
        future = Future()
        future.set_result(JobResult(type("J", (), {})(), BuildArtifact("k", Status.OK), value))
        return future


def test_a_variants_budget_is_the_larger_of_the_floor_and_a_multiple_of_the_baselines_time(tmp_path):
    """A variant's first run under the tool gets the floor (the baseline's time under it unknown, and
    a run of the program short); where it times out, the baseline runs under the tool, and the variant
    runs again within the larger of the floor and a multiple of the baseline's time, capped, unless
    that budget is no larger than the one it ran out of."""
    from cluster.engine.verification.checks import DeepChecks, Trust
    from cluster.store.variants import AcceptedVariant

    target = target_with(tmp_path, runner="process")
    cap = 300.0
    for baseline_s, again in ((1.0, None), (50.0, SANITIZER_FACTOR * 50.0), (500.0, cap)):
        jobs, written = RecordingJobs(baseline_s, target), []
        checks = DeepChecks(jobs, ("memcheck",), cap, False, written.append)
        checks.run_s = 0.01
        checks.add(AcceptedVariant(target, "variant", {}, True), None)
        checks.request(target.bundle.hash, "faster", value=1.7)
        assert jobs.budgets[0] == {"memcheck": SANITIZER_FLOOR_S}
        assert set(jobs.values) == {1.7}  # the variant's runs and the baseline's take its place in the lane
        if again is None:  # the baseline's own budget is the floor: the timeout stands, a failed check
            assert len(jobs.budgets) == 1 and checks.trust(target.bundle.hash) is Trust.FAILED
        else:
            assert jobs.budgets[1:] == [{"memcheck": again}] and checks.trust(target.bundle.hash) is Trust.PASSED
        [record] = written  # the checks' record, once they are in
        assert record["checks"] == checks.trust(target.bundle.hash).value
