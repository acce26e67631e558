"""The real GPU path: NVML device info, sm_XX builds, ptxas reports and a CUDA sweep.

Marked ``gpu``: skipped where no NVIDIA GPU answers NVML (CI); run on the GPU machine.
"""

from __future__ import annotations

import pytest

from cluster.config import load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from tests.conftest import REPO, gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")]


def test_gpu_device_is_described_by_nvml():
    from cluster.platform.devices import gpu_device

    device = gpu_device(0, "gpu-0")
    assert device.kind == "gpu" and "NVIDIA" in device.name
    major, minor = device.compute_capability.split(".")
    assert device.arch == f"sm_{major}{minor}" and device.uuid.startswith("GPU-")
    assert device.driver_version and device.cuda_version


def test_cuda_sweep_on_the_gpu(tmp_path, ray_local):
    plan = load_run(REPO / "configs" / "demo.yaml")
    saxpy = [t for t in plan.targets if t.name == "saxpy"]
    config = plan.config.model_copy(update={
        "output_dir": str(tmp_path), "search": plan.config.search.model_copy(update={"trials": 6})})
    plan = type(plan)(config, plan.file, tuple(saxpy))
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)
    rows = read_results(run_dir.path)
    assert (rows["phase"] == "search").sum() == 6
    ok = rows[rows["status"] == "ok"]
    assert len(ok) >= 4, rows[["status", "error_tail"]].to_string()
    assert ok["gpu_name"].str.contains("NVIDIA").all() and ok["gpu_uuid"].str.startswith("GPU-").all()
    assert ok["arch"].str.startswith("sm_").all() and ok["accelerator_type"].ne("").all()
    assert (ok["registers"] > 0).all() and ok["kernels_json"].str.contains("saxpy").all()
    assert (ok["n_samples"] >= 10).all()
    monitored = ok[ok["phase"] != "search"]  # measure.search_telemetry: off by default for a time objective
    assert len(monitored) >= 2 and ok[ok["phase"] == "search"]["energy_j"].isna().all()
    assert monitored["energy_j"].gt(0).all() and monitored["power_w"].gt(0).all()
    assert monitored["sm_clock_mhz"].gt(0).all()
    best = select_best(rows)
    assert len(best) == 1 and best[0].arch.startswith("sm_") and best[0].speedup > 0


def test_nvml_monitor_reads_energy_and_clocks():
    import time

    from cluster.measure.telemetry import Monitor
    from cluster.platform.nvidia import NvmlSource

    with Monitor(NvmlSource(0), interval_s=0.01) as monitor:
        time.sleep(0.3)
    telemetry = monitor.summary([], samples=1)
    assert telemetry.readings >= 10
    assert telemetry.energy_j is not None and telemetry.energy_j > 0  # an idle H100 still draws ~70 W
    assert telemetry.power_w and telemetry.power_w > 10 and telemetry.sm_clock_mhz and telemetry.sm_clock_mhz > 0


def test_ncu_profile_sees_bank_conflicts_and_agrees_with_the_occupancy_calculator(tmp_path):
    """The transpose baseline (32x32 tile, no padding) conflicts on every column read; its
    hand-padded variant does not. ncu's theoretical occupancy equals the calculator's."""
    import shutil as sh

    from cluster.compile.build import compile_candidate
    from cluster.config import load_target
    from cluster.core.occupancy import limits_for, occupancy
    from cluster.core.types import Candidate, Phase, Status
    from cluster.measure.profile import DEFAULT_METRICS, profile_candidate
    from cluster.platform.devices import gpu_device

    if sh.which("ncu") is None:
        pytest.skip("ncu not on PATH")
    device = gpu_device(0)
    conflicts = {}
    for name in ("target.yaml", "target_opt.yaml"):
        target = load_target(REPO / "configs" / "targets" / "transpose" / name)
        candidate = Candidate(target.name, "nvcc", device.device_type, device.arch, target.bundle.hash, (),
                              tuple(target.baseline_params.items()), Phase.BASELINE)
        artifact = compile_candidate(target, candidate)
        assert artifact.status is Status.OK, artifact.error_tail
        profile = profile_candidate(target, candidate, artifact.binary, DEFAULT_METRICS, timeout=300)
        assert profile.status is Status.OK, profile.error_tail
        assert all("wf_l2_flush" not in v.kernel for v in profile.values)
        conflicts[name] = sum(profile.metric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"))
        [kernel] = artifact.kernels
        block = int(profile.metric("launch__block_size")[0])
        ours = occupancy(limits_for(device.compute_capability), block, kernel.registers, kernel.shared_bytes)
        assert ours.percent == pytest.approx(profile.metric("sm__maximum_warps_per_active_cycle_pct")[0], abs=0.5)
    assert conflicts["target.yaml"] > 1e6 and conflicts["target_opt.yaml"] < conflicts["target.yaml"] / 100
