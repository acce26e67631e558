"""Step 4's static checks and verdicts: guards, the dependence graph, runs, the sanitizer."""

from __future__ import annotations

import pytest

from agents._base import Proposal
from agents.cuda_source import analyze
from agents.experts._streams import Plan
from agents.experts.streamify import streamify
from agents.patch import source_files, variant_target
from agents.workflow import VerdictStatus
from cluster.config import load_target
from cluster.core.types import BuildArtifact, DeviceInfo, Measurement, Status
from cluster.engine.verification.verify import (
    ADMIT_ORDER,
    NO_TESTS,
    QueueVerifier,
    depgraph_verdict,
    guard_verdict,
    run_verdicts,
    sanitizer_verdicts,
    static_verdicts,
)
from cluster.measure.sanitize import ERROR_EXIT, SanitizerResult, interpret, sanitizer_command
from tests.agents.test_streamify import JOIN, kernel_target, program
from tests.conftest import write_target

GUARDED = """int main(void) {
    int x = 1;
    // warpfleet: readonly begin
    x = x + 1;
    // warpfleet: readonly end
    return x;
}
"""


@pytest.fixture
def guarded(tmp_path):
    path = write_target(tmp_path / "g")
    (tmp_path / "g" / "tiny.c").write_text(GUARDED)
    return load_target(path)


def test_guards_pass_an_edit_outside_and_reject_one_inside_or_elsewhere(guarded):
    ok = Proposal("a", "", (("tiny.c", GUARDED.replace("int x = 1;", "int x = 2;")),))
    assert guard_verdict(guarded, ok).status is VerdictStatus.PASSED
    inside = Proposal("a", "", (("tiny.c", GUARDED.replace("x = x + 1;", "x = x + 2;")),))
    assert guard_verdict(guarded, inside).failed and "read-only region" in guard_verdict(guarded, inside).detail
    unmarked = Proposal("a", "", (("tiny.c", GUARDED.replace("    // warpfleet: readonly end\n", "")),))
    assert guard_verdict(guarded, unmarked).failed
    other = Proposal("a", "", (("harness.h", "int y;"),))
    assert "not a declared source" in guard_verdict(guarded, other).detail
    assert [v.check for v in static_verdicts(guarded, inside)] == ["guards"]  # nothing else runs


def test_depgraph_verdict_keeps_a_correct_streamify_and_rejects_a_dropped_event(tmp_path):
    target = kernel_target(tmp_path, program(JOIN))
    files = source_files(target)
    model = analyze(files["kernel.cu"], "kernel.cu")
    [good] = streamify(files, ["kernel.cu"], "kernel.cu", model, "run")
    assert depgraph_verdict(target, good.proposal).status is VerdictStatus.PASSED
    [broken] = streamify(files, ["kernel.cu"], "kernel.cu", model, "run", sabotage=lambda plan: Plan(plan.streams))
    assert broken.proposal is None and broken.check is not None  # the expert itself refuses to propose it
    # ... and had an agent proposed it anyway, the verifier rejects it on its own:
    text = dict(good.proposal.files)["kernel.cu"]
    wait = next(line for line in text.splitlines() if "cudaStreamWaitEvent(wf_st0[2], wf_dep0[0], 0);" in line)
    verdict = depgraph_verdict(target, Proposal("careless", "", (("kernel.cu", text.replace(wait + "\n", "")),)))
    assert verdict.failed and "kernel.cu:run" in verdict.detail and "reads d_y written by poly_kernel" in verdict.detail


def test_depgraph_verdict_rejects_a_dropped_kernel(tmp_path):
    target = kernel_target(tmp_path, program(JOIN))
    text = source_files(target)["kernel.cu"]
    line = next(line for line in text.splitlines() if "join_kernel<<<" in line)
    verdict = depgraph_verdict(target, Proposal("a", "", (("kernel.cu", text.replace(line + "\n", "")),)))
    assert verdict.failed


def test_variant_target_adds_searched_params_with_the_first_as_default(guarded):
    files = (("tiny.c", GUARDED.replace("int x = 1;", "int x = WF_K;")),)
    variant = variant_target(guarded, Proposal("a", "", files, {"WF_K": (4, 8), "maxrregcount": (64,)}))
    assert variant.spec.params["WF_K"] == [4, 8] and variant.baseline_params["WF_K"] == 4
    assert "maxrregcount" not in variant.spec.params  # a flag of the space, not a define
    assert variant.bundle.hash != guarded.bundle.hash and variant.name == guarded.name


DEVICE = DeviceInfo("cpu", "host", "host")


def test_run_verdicts_name_the_failing_check():
    ok = BuildArtifact("k", Status.OK)
    assert run_verdicts(BuildArtifact("k", Status.COMPILE_ERROR, error_tail="x.c:3: error: boom"), None)[0].detail \
        == "compile_error: x.c:3: error: boom"
    wrong = Measurement("k", Status.VERIFY_FAILED, DEVICE, error_tail="out.bin: 12 of 20000 differ")
    assert [(v.check, v.status.value) for v in run_verdicts(ok, wrong)] == [("build", "passed"), ("outputs", "failed")]
    test = Measurement("k", Status.TEST_FAILED, DEVICE, error_tail="test 3 failed")
    assert run_verdicts(ok, test)[-1].failed and run_verdicts(ok, test)[-1].check == "tests"
    assert not any(v.failed for v in run_verdicts(ok, Measurement("k", Status.OK, DEVICE, (1.0,))))
    # A target with no verify.test: its tests are skipped, and said so, not passed.
    untested = run_verdicts(ok, Measurement("k", Status.OK, DEVICE, (1.0,)), tested=False)[-1]
    assert (untested.check, untested.status.value, untested.detail) == ("tests", "skipped", NO_TESTS)


def test_sanitizer_output_is_read_and_the_baselines_own_errors_are_not_held_against_a_variant():
    hazard = ("========= Error: Race reported between Write access at 0x1 in k\n"
              "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    race = interpret("racecheck", ERROR_EXIT, False, hazard)
    assert race.outcome == "errors" and "1 errors" in race.detail
    assert interpret("memcheck", 0, False, "========= ERROR SUMMARY: 0 errors\n").outcome == "clean"
    assert interpret("memcheck", None, True, "").outcome == "timeout"
    assert interpret("memcheck", 1, False, "wf: out of memory").outcome == "inconclusive"
    clean = SanitizerResult("memcheck", "clean", seconds=12.5)
    verdicts = sanitizer_verdicts((clean, race), {"racecheck": SanitizerResult("racecheck", "clean")})
    assert [v.status.value for v in verdicts] == ["passed", "failed"]
    assert verdicts[0].seconds == 12.5  # each tool's time goes with its verdict, into the variants table
    both = sanitizer_verdicts((race,), {"racecheck": race})
    assert both[0].status is VerdictStatus.SKIPPED and "baseline" in both[0].detail
    assert sanitizer_command("memcheck", ["./a", "--seed", "0"])[:3] == ["compute-sanitizer", "--tool", "memcheck"]


def test_a_variants_admission_takes_its_place_in_the_lane_by_the_level_of_its_change(guarded):
    # configs/suite at 240 s on an H200: multikernel's admission lane ran its two `#pragma unroll`
    # variants, and its streams (5x on this card alone) waited until the search closed.
    from concurrent.futures import Future

    from agents._base import AnalysisContext
    from agents.workflow.steps import Finding, Level
    from agents.workflow.steps import Plan as StepPlan
    from cluster.engine.verification.verify import SearchClosed

    class Recorded:  # the study's job factory, recording what the verifier asks of it
        def __init__(self) -> None:
            self.asked: list[tuple[str, float]] = []

        def verify(self, variant, runs, label="", value=0.0):
            self.asked.append((label, value))
            done: Future = Future()
            done.set_result(type("Dropped", (), {"dropped": True})())  # the search closed: nothing runs
            return done

    jobs = Recorded()
    verifier = QueueVerifier(jobs, runs=1)
    for n, level in enumerate([Level.COMPILER_HINT, Level.APPLICATION, Level.KERNEL]):
        plan = StepPlan(Finding("x", level, f"tiny.c:{n}", True), ("a change",))
        with pytest.raises(SearchClosed):
            verifier.verify(AnalysisContext(guarded, "sm_90"), plan,
                            Proposal("x", "", (("tiny.c", GUARDED.replace("int x = 1;", f"int x = {n + 2};")),)))
    assert jobs.asked == [("tiny.c:0", 1.0), ("tiny.c:1", 3.0), ("tiny.c:2", 2.0)]
    assert ADMIT_ORDER[Level.APPLICATION] > ADMIT_ORDER[Level.KERNEL] > ADMIT_ORDER[Level.COMPILER_HINT]
