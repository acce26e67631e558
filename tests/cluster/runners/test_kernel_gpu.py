"""Kernel targets on a GPU: the kernel runner in its host process, a crashing kernel, the sanitizer
and the cheat checks through it, ncu, and a whole sweep.

Marked ``gpu``: skipped where no NVIDIA GPU answers NVML; run on the GPU machine:
``pytest -m gpu tests/cluster/runners/test_kernel_gpu.py``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import BuildArtifact, Candidate, Status
from cluster.measure.measure import measure_candidate
from cluster.runners.kernel import KernelRunner
from cluster.runners.kernel_harness import host_values
from tests.cluster.kernel_targets import N, vadd_kernel, write_kernel_target
from tests.conftest import gpu_present, write_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")]


@pytest.fixture(scope="module")
def device():
    from cluster.platform.devices import gpu_device

    return gpu_device(0, "gpu-0")


@pytest.fixture
def runner(tmp_path):
    runner = KernelRunner(scratch_root=tmp_path)
    yield runner
    runner.close()


def _build(target, device, tmp_path, **params) -> tuple[Candidate, BuildArtifact]:
    values = {**target.baseline_params, **params}
    candidate = Candidate(target.name, "nvcc", device.name, device.arch, target.bundle.hash, (),
                          tuple(values.items()), runner="kernel")
    artifact = compile_candidate(target, candidate, tmp_path)
    assert artifact.status is Status.OK, artifact.error_tail
    return candidate, artifact


def test_the_kernel_runner_measures_and_its_outputs_are_right(tmp_path, device, runner):
    target = load_target(write_kernel_target(tmp_path / "vadd"))
    baseline, built = _build(target, device, tmp_path)
    measured = measure_candidate(target, baseline, built, device, None, 2, runner)
    assert measured.status is Status.OK, measured.error_tail
    assert len(measured.samples) >= 20 and min(measured.samples) > 0  # 10 or more per run
    plan = target.spec.kernel.plan(target.baseline_params)
    for seed, outputs in enumerate(measured.outputs):  # one reference per seed: fresh inputs per run
        values = host_values(plan, seed, tmp_path)
        got = np.frombuffer(dict(outputs.files)["c.bin"], dtype=np.float32)
        assert np.array_equal(got, values["a"] + values["b"])
    assert runner.host.starts == 1
    candidate, other = _build(target, device, tmp_path, block_size_x=512, ITEMS=4)
    from cluster.measure.measure import Reference

    result = measure_candidate(target, candidate, other, device, Reference(measured.outputs), 2, runner)
    assert result.status is Status.OK, result.error_tail
    assert runner.host.starts == 1  # the same host process measured both


def test_a_clear_loser_stops_sampling_on_the_gpu(tmp_path, device, runner):
    """Racing through the host: a bound under every sample stops the candidate at min_samples (its
    outputs still verified); a bound over them leaves the stopping rule to decide."""
    from cluster.measure.measure import Reference

    target = load_target(write_kernel_target(tmp_path / "vadd"))
    baseline, built = _build(target, device, tmp_path)
    reference = Reference(measure_candidate(target, baseline, built, device, None, 1, runner).outputs)
    candidate, other = _build(target, device, tmp_path, block_size_x=512)
    raced = measure_candidate(target, candidate, other, device, reference, 1, runner, stop_above=1e-6)
    assert raced.status is Status.OK and raced.raced and len(raced.samples) == target.spec.kernel.bench.min_samples
    full = measure_candidate(target, candidate, other, device, reference, 1, runner, stop_above=1e6)
    assert full.status is Status.OK and not full.raced and len(full.samples) >= len(raced.samples)


def test_a_wrong_kernel_fails_verification(tmp_path, device, runner):
    from cluster.measure.measure import Reference

    target = load_target(write_kernel_target(tmp_path / "vadd"))
    baseline, built = _build(target, device, tmp_path)
    reference = Reference(measure_candidate(target, baseline, built, device, None, 1, runner).outputs)
    wrong_path = write_kernel_target(tmp_path / "wrong")
    source = wrong_path.parent / "vadd.cu"
    source.write_text(source.read_text().replace("c[i] = a[i] + b[i]", "c[i] = a[i] - b[i]"))
    wrong = load_target(wrong_path)
    candidate, artifact = _build(wrong, device, tmp_path)
    result = measure_candidate(wrong, candidate, artifact, device, reference, 1, runner)
    assert result.status is Status.VERIFY_FAILED and "c.bin" in result.error_tail


def _faulty(tmp_path, **params):
    kernel = vadd_kernel(name="faulty", grid_div_x=None, arguments=[
        {"name": "out", "shape": ["n"], "output": True}, {"name": "in", "shape": ["n"], "uniform": [0, 1]},
        {"name": "n", "dtype": "int32", "value": "n"}], sizes={"n": 1000})
    return load_target(write_kernel_target(tmp_path / "faulty", source="faults.cu", kernel=kernel,
                                           params={"block_size_x": [128], "CRASH": [0, 1], "OVERRUN": [0, 8]}))


def test_a_crashing_kernel_is_a_crashed_row_and_the_next_candidate_runs(tmp_path, device, runner):
    target = _faulty(tmp_path)
    crash, crash_built = _build(target, device, tmp_path, CRASH=1)
    result = measure_candidate(target, crash, crash_built, device, None, 1, runner)
    assert result.status is Status.CRASHED and "CUDA_ERROR" in result.error_tail, result.error_tail
    assert runner.host.proc is None  # the broken context ended the host
    fine, fine_built = _build(target, device, tmp_path, CRASH=0)
    result = measure_candidate(target, fine, fine_built, device, None, 1, runner)
    assert result.status is Status.OK, result.error_tail
    assert runner.host.starts == 2  # a fresh host for the next candidate


def test_the_sanitizer_catches_an_out_of_bounds_write_through_the_kernel_runner(tmp_path, device, runner):
    from cluster.measure.sanitize import sanitize_candidate

    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer not on PATH")
    target = _faulty(tmp_path)
    bad, bad_built = _build(target, device, tmp_path, OVERRUN=8)
    [verdict] = sanitize_candidate(target, bad, bad_built.binary, ("memcheck",), 300, runner)
    assert verdict.outcome == "errors" and "Invalid __global__ write" in verdict.detail, verdict
    good, good_built = _build(target, device, tmp_path)
    [verdict] = sanitize_candidate(target, good, good_built.binary, ("memcheck",), 300, runner)
    assert verdict.outcome == "clean", verdict


def test_the_cheat_checks_run_through_the_kernel_runner(tmp_path, device, runner):
    from agents.workflow.steps import VerdictStatus
    from cluster.measure.guardrails import check_cached_results, check_poisoned_outputs, reverify_fresh_seeds

    target = load_target(write_kernel_target(tmp_path / "vadd"))
    _, baseline = _build(target, device, tmp_path)
    _, candidate = _build(target, device, tmp_path, block_size_x=512)
    for check in (check_poisoned_outputs, check_cached_results):
        verdict = check(target, baseline, candidate, runner)
        assert verdict.status is VerdictStatus.PASSED, verdict
    assert reverify_fresh_seeds(target, baseline, candidate, runner=runner).status is VerdictStatus.PASSED
    # a kernel that writes only half its output: its poisoned half is NaN
    lazy_path = write_kernel_target(tmp_path / "lazy")
    source = lazy_path.parent / "vadd.cu"
    source.write_text(source.read_text().replace("if (i < n) c[i]", "if (i < n / 2) c[i]"))
    lazy = load_target(lazy_path)
    _, lazy_built = _build(lazy, device, tmp_path)
    verdict = check_poisoned_outputs(target, baseline, lazy_built, runner)
    assert verdict.status is VerdictStatus.FAILED and "NaN" in verdict.detail, verdict


def test_ncu_profiles_the_kernel_not_the_flush(tmp_path, device, runner):
    from cluster.measure.profile import profile_candidate

    if shutil.which("ncu") is None:
        pytest.skip("ncu not on PATH")
    target = load_target(write_kernel_target(tmp_path / "vadd"))
    candidate, built = _build(target, device, tmp_path)
    profile = profile_candidate(target, candidate, built.binary, ("gpu__time_duration.sum",), 300, runner)
    assert profile.status is Status.OK, profile.error_tail
    assert {v.kernel for v in profile.values} == {"vadd"} and profile.metric("gpu__time_duration.sum")


def test_a_kernel_target_sweep_end_to_end(tmp_path, ray_local):
    from cluster.config import load_run
    from cluster.engine.driver import Sweep
    from cluster.outputs.exports import ExportRequest, render
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir
    from cluster.store.select import select_best

    target = write_kernel_target(tmp_path / "vadd", space="fast.yaml")
    (target.parent / "fast.yaml").write_text("name: fast\ntoolchain: nvcc\nflags:\n"
                                             "  fast_math: ['', '--use_fast_math']\n"
                                             "  maxrregcount: ['', '-maxrregcount=32']\n")
    config = write_config(tmp_path, [str(target.relative_to(tmp_path))],
                          search={"sampler": "tpe", "seed": 0, "trials": 12},
                          measure={"runs": 1, "final_top_k": 2, "final_runs": 2}, profile={"candidates": "none"})
    plan = load_run(config)
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)
    rows = read_results(run_dir.path)
    assert (rows["phase"] == "search").sum() == 12 and (rows["phase"] == "baseline").sum() == 1
    ok = rows[rows["status"] == "ok"]
    assert len(ok) >= 10, rows[["status", "error_tail"]].to_string()
    assert (ok["n_samples"] >= 10).all() and (ok["registers"] > 0).all()
    assert ok["kernels_json"].str.contains("vadd").all() and ok["gpu_name"].str.contains("NVIDIA").all()
    assert ok["compile_s"].max() < 5  # NVRTC: a fraction of a second per candidate
    [best] = select_best(rows)
    [record] = json.loads(render("launch-json", ExportRequest([best], rows, run_dir.path)))
    assert record["kernel"] == "vadd" and record["block"][0] == best.params["block_size_x"]
    assert record["grid"][0] == -(-N // (best.params["block_size_x"] * best.params["ITEMS"]))


def test_links_left_in_the_kernel_runners_directory_are_never_gone_through(tmp_path, device, runner):
    """Issue 26 through the kernel runner on the GPU: the baseline measured, then a candidate's staged
    directory holding links to a file outside where the runner keeps its capture files, its request,
    its verdict and the references it hands over. Nothing outside is written, the run is refused, and
    the host measures the next candidate as before."""
    from cluster.measure.measure import Reference
    from cluster.runners._base import Invocation
    from tests.cluster.runners.test_kernel_runner import _plant_links

    victim = tmp_path / "victim.json"
    victim.write_text('{"c.bin": "forged"}')
    target = load_target(write_kernel_target(tmp_path / "vadd"))
    baseline, built = _build(target, device, tmp_path)
    reference = Reference(measure_candidate(target, baseline, built, device, None, 1, runner).outputs)
    candidate, other = _build(target, device, tmp_path, block_size_x=512)
    with runner.stage(target, dict(candidate.params), device.arch, other.binary) as staged:
        _plant_links(staged, victim)
        in_host = staged.run(Invocation(seed=0, reference=reference.for_run(0)))
        _plant_links(staged, victim)
        poisoned = staged.run(Invocation(seed=0, env={"WARPFLEET_POISON": "1"}))
        _plant_links(staged, victim)
        wrapped = staged.run(Invocation(seed=0, env={"SOME_TOOL": "1"}))  # a process of its own
        _plant_links(staged, victim)
        assert runner.verified_outputs(staged, reference.for_run(0)) == frozenset()
    assert victim.read_text() == '{"c.bin": "forged"}'
    for result in (in_host, poisoned, wrapped):
        assert not result.ok and "refused" in result.tail(), result.tail()
    after = measure_candidate(target, candidate, other, device, reference, 1, runner)
    assert after.status is Status.OK, after.error_tail
