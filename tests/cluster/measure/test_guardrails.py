"""The guardrails against faked speed: each planted cheating variant (tests/fixtures/targets/guarded,
unguarded: C built with cc and run for real) passes the sweep's own verification and is rejected
by its check; the honest faster variant passes every check. The CUDA cheat compiles with nvcc."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.patch import Variant, variant_bundle
from agents.workflow.steps import Finding, Level, Plan, Verdict, VerdictStatus, Verification, Verifier
from cluster.compile.build import HARNESS_INCLUDE, compile_candidate
from cluster.config import Target, load_target
from cluster.core.types import BuildArtifact, Candidate, DeviceInfo, Status
from cluster.engine.verification.verify import GuardedVerifier
from cluster.measure.guardrails import (
    FRESH_SEEDS,
    cheat_checks,
    check_cached_results,
    check_poisoned_outputs,
    check_timing_code,
    check_untimed_work,
    reverify_fresh_seeds,
    sample_lines_problem,
    suspect_speedup,
)
from cluster.measure.measure import Reference, measure_candidate
from tests.conftest import REPO, needs

FIXTURES = REPO / "tests" / "fixtures" / "targets"
CPU = DeviceInfo("cpu", "host", "host")


def variant(target: Target, source: str | None) -> Target:
    """The target with its one source replaced by the fixture file ``source`` (None: itself)."""
    if source is None:
        return target
    [path] = target.spec.sources
    text = (Path(target.file).parent / source).read_text()
    bundle = variant_bundle(target, Variant(((path, text),), "", source, target.bundle.hash))
    return dataclasses.replace(target, bundle=bundle)


def build(target: Target) -> BuildArtifact:
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), ())
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return artifact


@pytest.fixture(scope="module")
def guarded() -> Target:
    return load_target(FIXTURES / "guarded" / "target.yaml")


@pytest.fixture(scope="module")
def unguarded() -> Target:
    return load_target(FIXTURES / "unguarded" / "target.yaml")


@pytest.fixture(scope="module")
def baseline(guarded: Target) -> BuildArtifact:
    return build(guarded)


def passes_the_sweep(target: Target, baseline: BuildArtifact, cheat: Target, artifact: BuildArtifact) -> None:
    """The cheat gets through the sweep's own verification (one run a candidate, seed 0)."""
    base = measure_candidate(target, Candidate(target.name, "cc", "host", "host", "b", (), ()), baseline, CPU,
                             None, runs=1)
    assert base.status is Status.OK, base.error_tail
    got = measure_candidate(cheat, Candidate(target.name, "cc", "host", "host", "c", (), ()), artifact, CPU,
                            Reference(base.outputs), runs=1)
    assert got.status is Status.OK, got.error_tail


def test_the_honest_faster_variant_passes_every_check(guarded: Target, baseline: BuildArtifact) -> None:
    honest = variant(guarded, "honest_fast.c")
    files = {"work.c": (FIXTURES / "guarded" / "honest_fast.c").read_text()}
    verdicts = cheat_checks(guarded, baseline, build(honest), files)
    assert [v.check for v in verdicts] == ["timing_code", "poisoned_outputs", "cached_results", "untimed_work"]
    assert all(v.status is VerdictStatus.PASSED for v in verdicts), verdicts
    assert all(v.seconds > 0 for v in verdicts[1:])  # each check that runs the programs is timed


def test_outputs_left_unwritten_are_caught_by_poisoned_outputs(guarded: Target, baseline: BuildArtifact) -> None:
    cheat = variant(guarded, "skip_reps.c")
    artifact = build(cheat)
    passes_the_sweep(guarded, baseline, cheat, artifact)
    verdict = check_poisoned_outputs(guarded, baseline, artifact)
    assert verdict.status is VerdictStatus.FAILED
    assert "NaN" in verdict.detail and "poisoned" in verdict.detail
    assert check_cached_results(guarded, baseline, artifact).status is VerdictStatus.PASSED  # not this check's


def test_a_run_that_fails_poisoned_says_why(guarded: Target, baseline: BuildArtifact, tmp_path: Path) -> None:
    """The verdict carries the run's status and its last words, not the status alone: on a GPU a
    kernel's poisoned run once failed as just 'exit status 1'."""
    source = (FIXTURES / "guarded" / "work.c").read_text()
    source = source.replace("int main(", 'static int real_main(int argc, char **argv);\n'
                                         'int main(int argc, char **argv) {\n'
                                         '    if (getenv("WARPFLEET_POISON")) {\n'
                                         '        fputs("out.bin: Permission denied\\n", stderr);\n'
                                         '        return 1;\n'
                                         '    }\n'
                                         '    return real_main(argc, argv);\n'
                                         '}\n'
                                         'static int real_main(', 1)
    (tmp_path / "refuses.c").write_text(source)
    [path] = guarded.spec.sources
    refuses = dataclasses.replace(guarded, bundle=variant_bundle(
        guarded, Variant(((path, source),), "", "refuses.c", guarded.bundle.hash)))
    verdict = check_poisoned_outputs(guarded, baseline, build(refuses))
    assert verdict.status is VerdictStatus.FAILED
    assert "exit status 1" in verdict.detail and "out.bin: Permission denied" in verdict.detail, verdict.detail


def test_results_cached_across_runs_are_caught_by_cached_results(guarded: Target, baseline: BuildArtifact) -> None:
    cheat = variant(guarded, "cache_file.c")
    artifact = build(cheat)
    passes_the_sweep(guarded, baseline, cheat, artifact)
    verdict = check_cached_results(guarded, baseline, artifact)
    assert verdict.status is VerdictStatus.FAILED
    assert f"fresh seed {FRESH_SEEDS[1]}" in verdict.detail and "differ" in verdict.detail
    assert check_poisoned_outputs(guarded, baseline, artifact).status is VerdictStatus.PASSED  # its reps do write


def test_work_moved_outside_the_timed_region_is_caught_by_untimed_work(unguarded: Target) -> None:
    base = build(unguarded)
    cheat = variant(unguarded, "untimed.c")
    artifact = build(cheat)
    passes_the_sweep(unguarded, base, cheat, artifact)
    verdict = check_untimed_work(unguarded, base, artifact)
    assert verdict.status is VerdictStatus.FAILED, verdict
    assert "outside the timed region" in verdict.detail
    honest = variant(unguarded, None)
    assert check_untimed_work(unguarded, base, build(honest)).status is VerdictStatus.PASSED


def _scripted_runs(monkeypatch: pytest.MonkeyPatch, baseline: BuildArtifact, growth_ms: list[float]) -> None:
    """Runs of the unguarded target as a loaded node gives them: the baseline's 4 samples of 20 ms
    in 100 ms, the candidate's of 5 ms, its untimed part longer by ``growth_ms[i]`` in pair i."""
    from cluster.measure import guardrails

    made: list[str] = []

    def fresh(target, artifact, runner, *, seed=0, poison=False):
        if artifact is baseline:
            made.append("b")
            return guardrails.Run(True, "", (20.0,) * 4, 0.100, None, "")
        grown = growth_ms[made.count("c") % len(growth_ms)] * 1e-3
        made.append("c")
        return guardrails.Run(True, "", (5.0,) * 4, 0.040 + grown, None, "")

    monkeypatch.setattr(guardrails, "_fresh", fresh)


@pytest.mark.parametrize("growth_ms", [
    [60.0, 55.0, 70.0, -40.0, 80.0, -30.0, 65.0, -50.0, 75.0],  # noise: a median of 60 ms, in 6 of 9 pairs
    [300.0, 1.0, 250.0, 0.0, 280.0, 400.0, -3.0, 2.0, 260.0],  # bursts of load on the candidate's side, 5 of 9
])
def test_untimed_work_passes_growth_that_is_not_in_nearly_every_pair(unguarded: Target, growth_ms: list[float],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An honest variant on a loaded node (two test workers and two spinning processes on two cores):
    its untimed part grew by a median of 50 ms over nine pairs, though no work had moved."""
    base = build(unguarded)
    _scripted_runs(monkeypatch, base, growth_ms)
    verdict = check_untimed_work(unguarded, base, dataclasses.replace(base))
    assert verdict.status is VerdictStatus.PASSED, verdict


@pytest.mark.parametrize("growth_ms", [
    [60.0] * 9,  # the work moved, every run
    [55.0, 62.0, 48.0, -40.0, 70.0, 58.0, 61.0, 52.0, 66.0],  # and one pair that a burst of load hid
])
def test_untimed_work_fails_growth_in_nearly_every_pair(unguarded: Target, growth_ms: list[float],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    base = build(unguarded)
    _scripted_runs(monkeypatch, base, growth_ms)
    verdict = check_untimed_work(unguarded, base, dataclasses.replace(base))
    assert verdict.status is VerdictStatus.FAILED, verdict
    beyond = sum(g > 10.0 for g in growth_ms)  # the tolerance: half a 20 ms sample
    assert f"in {beyond} of 9 pairs of runs" in verdict.detail and "outside the timed region" in verdict.detail


def test_edited_timing_code_is_caught_by_timing_code(unguarded: Target) -> None:
    text = (FIXTURES / "unguarded" / "timing_edit.c").read_text()
    cheat = variant(unguarded, "timing_edit.c")
    passes_the_sweep(unguarded, build(unguarded), cheat, build(cheat))
    verdict = check_timing_code(unguarded, {"work.c": text})
    assert verdict.status is VerdictStatus.FAILED
    assert "t1 = t0 + (t1 - t0) / 10;" in verdict.detail and verdict.detail.startswith("work.c:")


@pytest.mark.parametrize(("old", "new", "flagged"), [
    ("    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;", "    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-7;", True),
    ('        printf("@warpfleet time_ms=%.6f\\n", t1 - t0);', '        printf("@warpfleet time_ms=%.6f\\n", 0.1);',
     True),
    ("        compute(out, in, N);", "        compute(out, in, N);\n        compute(out, in, N);", False),
    ("        for (int k = 0; k < K; ++k) acc += sinf(in[(i + k) % n]) * (float)(k + 1);",
     "        for (int k = 0; k < K; ++k) acc += sinf(in[(i + k) % n]) * (float)(k + 2);", False),
])
def test_timing_code_flags_timing_lines_and_helpers_only(unguarded: Target, old: str, new: str,
                                                         flagged: bool) -> None:
    source = (FIXTURES / "unguarded" / "work.c").read_text()
    assert old in source
    verdict = check_timing_code(unguarded, {"work.c": source.replace(old, new)})
    assert (verdict.status is VerdictStatus.FAILED) == flagged, verdict


def test_timing_code_lets_the_launch_inside_a_one_line_bench_change(tmp_path: Path) -> None:
    target = load_target(REPO / "configs" / "targets" / "matmul" / "target.yaml")
    source = dict(target.bundle.files)["matmul.cu"].decode()
    line = "wf::bench(opt, [&](cudaStream_t stream) { sgemm_tiled<<<grid, block, 0, stream>>>(n, da, db, dc); });"
    assert line in source
    relaunched = source.replace(line, line.replace("<<<grid, block, 0, stream>>>", "<<<grid, block, 64, stream>>>"))
    assert check_timing_code(target, {"matmul.cu": relaunched}).status is VerdictStatus.PASSED
    retimed = source.replace(line, line.replace("wf::bench(opt,", "wf::bench(wf::Options{},"))
    assert check_timing_code(target, {"matmul.cu": retimed}).status is VerdictStatus.FAILED


def test_sample_lines_beyond_the_harness_summary_are_flagged(guarded: Target) -> None:
    honest = "@warpfleet time_ms=1.5\n@warpfleet time_ms=1.6\n@warpfleet samples=2 median_ms=1.55 noise=0\n"
    assert sample_lines_problem(honest, guarded) is None
    faked = "@warpfleet time_ms=0.001\n" + honest
    assert "3 sample lines but the harness took 2" in (sample_lines_problem(faked, guarded) or "")
    assert sample_lines_problem("@warpfleet time_ms=2\n", guarded) is None  # no harness: nothing to compare


def test_reverify_fresh_seeds(guarded: Target, baseline: BuildArtifact, tmp_path: Path) -> None:
    honest = build(variant(guarded, "honest_fast.c"))
    assert reverify_fresh_seeds(guarded, baseline, honest).status is VerdictStatus.PASSED
    wrong_text = (FIXTURES / "guarded" / "work.c").read_text().replace("out[i] = acc;", "out[i] = acc + 1.0f;")
    wrong = dataclasses.replace(guarded, bundle=variant_bundle(guarded, Variant((("work.c", wrong_text),), "", "",
                                                                                "")))
    verdict = reverify_fresh_seeds(guarded, baseline, build(wrong))
    assert verdict.status is VerdictStatus.FAILED and f"seed {FRESH_SEEDS[0]}" in verdict.detail
    unseeded = dataclasses.replace(guarded, spec=guarded.spec.model_copy(update={"run": ["{binary}"]}))
    assert reverify_fresh_seeds(unseeded, baseline, honest).status is VerdictStatus.SKIPPED



@pytest.mark.parametrize("seed, act, status, words", [
    (1, "sleep", VerdictStatus.PASSED, "seeds {0} (seed {1} not compared: the baseline's run: timed out"),
    (0, "sleep", VerdictStatus.FAILED, "not checked: the baseline's run on seed {0} did not end within"),
    (0, "exit", VerdictStatus.SKIPPED, "the baseline itself fails on seed {0}"),
], ids=["second-seed-out-of-time", "first-seed-out-of-time", "baseline-fails"])
def test_a_review_the_baseline_cannot_finish_says_why(guarded: Target, seed: int, act: str, status: VerdictStatus,
                                                       words: str) -> None:
    # On an H200 a slow program's review ran out of its job's time in the baseline's run, and the
    # compare then raised on the baseline's missing output: the worker's exception failed a
    # candidate of 11.75x. Out of time after a seed compared, it is judged on that seed; out of time
    # before, it is not checked (never a winner); a baseline that fails by itself does not apply.
    stall = {"sleep": "{ struct timespec t = {6, 0}; nanosleep(&t, NULL); }", "exit": "return 2;"}[act]
    text = (FIXTURES / "guarded" / "work.c").read_text().replace(
        "    float *in = malloc(", f"    if (seed == {FRESH_SEEDS[seed]}ull) {stall}\n    float *in = malloc(", 1)
    quick = dataclasses.replace(guarded, spec=guarded.spec.model_copy(
        update={"timeouts": guarded.spec.timeouts.model_copy(update={"run": 2})}))
    baseline = build(dataclasses.replace(quick, bundle=variant_bundle(quick, Variant((("work.c", text),), "", "",
                                                                                      ""))))
    verdict = reverify_fresh_seeds(quick, baseline, build(variant(quick, "honest_fast.c")))
    assert verdict.status is status and words.format(*FRESH_SEEDS) in verdict.detail, verdict


def test_outputs_compared_with_a_reference_without_them_are_a_problem_not_an_error(tmp_path: Path) -> None:
    from cluster.core.types import RunOutputs
    from cluster.measure.measure import verify_outputs

    (tmp_path / "out.bin").write_bytes(b"\0" * 16)
    spec = load_target(FIXTURES / "guarded" / "target.yaml").spec.verify
    assert verify_outputs(tmp_path, "", spec, RunOutputs((), ())) == "out.bin: the reference has none"


def test_suspect_speedup_is_the_10x_rule() -> None:
    assert suspect_speedup(10.5) and not suspect_speedup(10.0) and not suspect_speedup(None)
    assert suspect_speedup(3.0, threshold=2.0)


# --- CUDA --------------------------------------------------------------------------------------

def test_the_harness_reads_the_poison_switch(tmp_path: Path) -> None:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    program = tmp_path / "p.cpp"
    program.write_text('#include <warpfleet/harness_core.hpp>\nint main() { return wf::detail::poison_requested(); }\n')
    subprocess.run([compiler, "-std=c++17", f"-I{HARNESS_INCLUDE}", str(program), "-o",
                    str(tmp_path / "p")], check=True)
    codes = {value: subprocess.run([str(tmp_path / "p")], env={"WARPFLEET_POISON": value} if value else {}).returncode
             for value in ("", "0", "1")}
    assert codes == {"": 0, "0": 0, "1": 1}


@pytest.mark.nvcc
@needs("nvcc")
def test_the_cuda_cheat_builds_and_registers_its_poisoned_output() -> None:
    target = load_target(FIXTURES / "cuda_guarded" / "target.yaml")
    cheat = variant(target, "skip_launches.cu")
    text = dict(cheat.bundle.files)["scale.cu"].decode()
    assert "if (g_done) return;" in text and "wf::poison_output(d_out" in text
    for each in (target, cheat):
        candidate = Candidate(each.name, "nvcc", "H100", "sm_90", each.bundle.hash, (), ())
        artifact = compile_candidate(each, candidate)
        assert artifact.status is Status.OK, artifact.error_tail
    # The cheat leaves timing, inputs and outputs alone: only running it poisoned tells.
    assert check_timing_code(target, {"scale.cu": text}).status is VerdictStatus.PASSED


class _Stub(Verifier):
    def __init__(self, status: VerdictStatus) -> None:
        self.status = status

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        return Verification((Verdict("outputs", self.status),))


def test_guarded_verifier_adds_the_checks_to_a_passing_variant_only(guarded: Target) -> None:
    baseline = Candidate(guarded.name, "cc", "host", "host", guarded.bundle.hash, (), ())
    context = AnalysisContext(guarded, "host")
    plan = Plan(Finding("x", Level.KERNEL, "work.c", True), ("change",))
    cheat = Proposal("llm", "skip", (("work.c", (FIXTURES / "guarded" / "skip_reps.c").read_text()),))
    checked = GuardedVerifier(_Stub(VerdictStatus.PASSED), baseline).verify(context, plan, cheat)
    assert [v.check for v in checked.verdicts] == ["outputs", "timing_code", "poisoned_outputs", "cached_results",
                                                   "untimed_work"]
    assert not checked.passed and checked.reason.startswith("poisoned_outputs: ")
    failed = GuardedVerifier(_Stub(VerdictStatus.FAILED), baseline).verify(context, plan, cheat)
    assert [v.check for v in failed.verdicts] == ["outputs"]  # nothing more to learn from a failed variant
    flags_only = Proposal("registers", "search", (), {"maxrregcount": (64,)})
    assert len(GuardedVerifier(_Stub(VerdictStatus.PASSED), baseline).verify(context, plan, flags_only).verdicts) == 1


def test_the_baselines_runs_serve_the_next_variants_output_checks(guarded: Target, baseline: BuildArtifact,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Three of a variant's eleven runs were the baseline's on the fresh seeds, the same for every
    variant of a target: the second variant's checks take them from the first's. A change to what
    the baseline's run depends on (here its run command) runs it again."""
    from cluster.measure import guardrails

    guardrails._baseline_runs.clear()
    seeded: list[tuple[int, bool]] = []  # the baseline's runs on fresh seeds: the output checks'
    real = guardrails._fresh

    def counting(target, artifact, runner, *, seed=0, poison=False):
        if artifact is baseline and seed in FRESH_SEEDS:
            seeded.append((seed, poison))
        return real(target, artifact, runner, seed=seed, poison=poison)

    monkeypatch.setattr(guardrails, "_fresh", counting)
    honest = variant(guarded, "honest_fast.c")
    files = {"work.c": (FIXTURES / "guarded" / "honest_fast.c").read_text()}
    first = cheat_checks(honest, baseline, build(honest), files)
    assert sorted(seeded) == sorted([(FRESH_SEEDS[0], True), *((s, False) for s in FRESH_SEEDS)])
    seeded.clear()
    second = cheat_checks(honest, baseline, build(honest), files)  # the next variant, on the same worker
    assert seeded == []
    assert [v for v in (*first, *second) if v.status is not VerdictStatus.PASSED] == []
    more = dataclasses.replace(honest, spec=honest.spec.model_copy(update={"run": [*honest.spec.run[:-1], "5"]}))
    check_poisoned_outputs(more, baseline, build(honest))
    assert seeded == [(FRESH_SEEDS[0], True)]
