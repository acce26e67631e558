"""What this process may use: the GPU count the benchmark scripts plan their lanes and counts by."""

from __future__ import annotations

from cluster.platform.devices import cpu_device, visible_gpu_count


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert visible_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # set but empty: none, whatever the machine has
    assert visible_gpu_count() == 0


def test_cpu_device_describes_this_host():
    device = cpu_device("cpu-0")
    assert device.kind == "cpu" and device.arch == "host" and device.worker_id == "cpu-0" and device.name
