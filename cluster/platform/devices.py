"""What a measuring worker runs on: its GPU through the platform (NVML: read only, never a clock set),
its CPU from /proc; and where: its Ray node and host."""

from __future__ import annotations

import dataclasses
import platform
import socket
from pathlib import Path

from cluster.core.types import DeviceInfo
from cluster.platform import node_platform


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
    """The GPUs this process may use: those the platform's variable (CUDA_VISIBLE_DEVICES) lists
    where it is set, else the driver's count; 0 without a driver."""
    return node_platform().visible_gpu_count()


def gpu_device(physical_index: int, worker_id: str = "") -> DeviceInfo:
    """Describe one GPU through the platform (NVML). ``physical_index`` is the driver's index (Ray's GPU id)."""
    node_id, host = _node()
    return dataclasses.replace(node_platform().describe(physical_index),
                               accelerator_type=accelerator_type(node_id) if node_id else "",
                               node_id=node_id, hostname=host, worker_id=worker_id)
