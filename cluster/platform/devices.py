"""What a measuring worker runs on: NVML for GPUs (read only, never a clock set), /proc for CPUs."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

from cluster.core.types import DeviceInfo


def _node() -> tuple[str, str]:
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # outside Ray: a plain process
        node_id = ""
    return node_id, socket.gethostname()


def accelerator_type(node_id: str) -> str:
    """The ``accelerator_type:X`` resource Ray gives a node with GPUs (``H100``, ``A100``)."""
    import ray

    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            for resource in node.get("Resources", {}):
                if resource.startswith("accelerator_type:"):
                    return resource.split(":", 1)[1]
    return ""


def cpu_device(worker_id: str = "") -> DeviceInfo:
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    node_id, host = _node()
    return DeviceInfo(kind="cpu", name=name, arch="host", node_id=node_id, hostname=host,
                      worker_id=worker_id)


def visible_gpu_count() -> int:
    """The GPUs this process may use: those CUDA_VISIBLE_DEVICES lists where it is set, else NVML's
    count; 0 without a driver."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip()])
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, or no driver: no GPU
        return 0


def gpu_device(physical_index: int, worker_id: str = "") -> DeviceInfo:
    """Describe one GPU through NVML. ``physical_index`` is NVML's index (Ray's GPU id)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(physical_index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        node_id, host = _node()
        return DeviceInfo(
            kind="gpu",
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            arch=f"sm_{major}{minor}",
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            compute_capability=f"{major}.{minor}",
            accelerator_type=accelerator_type(node_id) if node_id else "",
            driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            node_id=node_id,
            hostname=host,
            worker_id=worker_id,
        )
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
