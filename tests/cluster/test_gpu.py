"""The real GPU path: NVML device info, sm_XX builds, ptxas reports and a CUDA sweep.

Marked ``gpu``: skipped where no NVIDIA GPU answers NVML (CI); run on the GPU machine.
"""

from __future__ import annotations

import shutil

import pytest

from cluster.config import load_run
from cluster.driver import Sweep
from cluster.results import read_results
from cluster.rundir import RunDir
from cluster.select import select_best
from tests.conftest import REPO


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0 and shutil.which("nvcc") is not None
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu_present(), reason="no NVIDIA GPU and nvcc")]


def test_gpu_device_is_described_by_nvml():
    from cluster.devices import gpu_device

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
    Sweep(plan, run_dir, log=print).run(show_progress=False)
    rows = read_results(run_dir.path)
    assert (rows["phase"] == "search").sum() == 6
    ok = rows[rows["status"] == "ok"]
    assert len(ok) >= 4, rows[["status", "error_tail"]].to_string()
    assert ok["gpu_name"].str.contains("NVIDIA").all() and ok["gpu_uuid"].str.startswith("GPU-").all()
    assert ok["arch"].str.startswith("sm_").all() and ok["accelerator_type"].ne("").all()
    assert (ok["registers"] > 0).all() and ok["kernels_json"].str.contains("saxpy").all()
    assert (ok["n_samples"] >= 10).all()
    assert ok["energy_j"].gt(0).all() and ok["power_w"].gt(0).all() and ok["sm_clock_mhz"].gt(0).all()
    best = select_best(rows)
    assert len(best) == 1 and best[0].arch.startswith("sm_") and best[0].speedup > 0


def test_nvml_monitor_reads_energy_and_clocks():
    import time

    from cluster.telemetry import Monitor, NvmlSource

    with Monitor(NvmlSource(0), interval_s=0.01) as monitor:
        time.sleep(0.3)
    telemetry = monitor.summary([], samples=1)
    assert telemetry.readings >= 10
    assert telemetry.energy_j is not None and telemetry.energy_j > 0  # an idle H100 still draws ~70 W
    assert telemetry.power_w and telemetry.power_w > 10 and telemetry.sm_clock_mhz and telemetry.sm_clock_mhz > 0
