"""NVIDIA's platform: NVML for the devices and their telemetry, /dev/nvidia* for the sandbox, Nsight
Compute (ncu) and compute-sanitizer."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from cluster.core.types import DeviceInfo
from cluster.platform._base import Platform, Reading


class Nvidia(Platform):
    name = "nvidia"
    device_nodes = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps")
    visible_env = "CUDA_VISIBLE_DEVICES"
    profiler = "ncu"
    sanitizer = "compute-sanitizer"
    query = ("nvidia-smi", "-L")

    def present(self) -> bool:
        return any(Path("/dev").glob("nvidia[0-9]*"))

    def prepare_nodes(self) -> None:
        """/dev/nvidia-uvm appears on a node's first CUDA use, made by the setuid nvidia-modprobe, which
        cannot run in the sandbox (no new privileges): make it now, for the sandbox to bind it."""
        if not Path("/dev/nvidia-uvm").exists() and shutil.which("nvidia-modprobe"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["nvidia-modprobe", "-u", "-c=0"], capture_output=True, timeout=30)

    def visible_gpu_count(self) -> int:
        listed = os.environ.get(self.visible_env)
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

    def describe(self, index: int) -> DeviceInfo:
        """Through NVML. ``index`` is NVML's index (Ray's GPU id)."""
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            return DeviceInfo(
                kind="gpu",
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                arch=f"sm_{major}{minor}",
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                compute_capability=f"{major}.{minor}",
                driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
                cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            )
        finally:
            pynvml.nvmlShutdown()

    def telemetry(self, index: int) -> NvmlSource:
        return NvmlSource(index)

    def profiler_prefix(self, metrics: Sequence[str], launches: Sequence[str]) -> list[str]:
        # --print-units base: bytes and nanoseconds, not "Kbyte" and "usecond" chosen per value.
        return ["ncu", "--csv", "--clock-control", "none", "--print-units", "base", "--target-processes", "all",
                *launches, "--metrics", ",".join(metrics)]

    def sanitizer_prefix(self, tool: str, error_exit: int) -> list[str]:
        return ["compute-sanitizer", "--tool", tool, "--error-exitcode", str(error_exit), "--print-limit", "10",
                "--target-processes", "all"]

    def sanitizer_filters(self, kernels: Sequence[str], launches: int | None) -> list[str]:
        # kns: a substring of the mangled name (a source name is one); the filters add up, and
        # --launch-count counts only the launches they match.
        names = [option for kernel in kernels for option in ("--kernel-name", f"kns={kernel}")]
        return [*names, *(["--launch-count", str(launches)] if launches else [])]

    def counters_note(self) -> str | None:
        params = Path("/proc/driver/nvidia/params")
        if params.exists() and "RmProfilingAdminOnly: 1" in params.read_text():
            return ("the driver lets only root read performance counters (RmProfilingAdminOnly: 1); Nsight "
                    "Compute profiles fail in the sandbox until the nvidia module gets "
                    "NVreg_RestrictProfilingToAdminUsers=0")
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSource:
    """Reads one GPU through NVML. ``index`` is NVML's (physical) index."""

    def __init__(self, index: int) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def _try(self, fn, *args) -> float | None:
        try:
            return float(fn(self._handle, *args))
        except self._nvml.NVMLError:
            return None  # not supported on this device: a missing value, not a failure

    def read(self) -> Reading:
        n = self._nvml
        reasons = self._try(n.nvmlDeviceGetCurrentClocksEventReasons) if hasattr(
            n, "nvmlDeviceGetCurrentClocksEventReasons") else self._try(n.nvmlDeviceGetCurrentClocksThrottleReasons)
        return Reading(time.time(), self._try(n.nvmlDeviceGetTotalEnergyConsumption),
                       self._try(n.nvmlDeviceGetPowerUsage), self._try(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
                       self._try(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_MEM),
                       self._try(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU), int(reasons or 0))


class FakeNvmlSource:
    """A stand-in for NVML where there is no GPU: a device drawing ``power_w`` watts steadily."""

    def __init__(self, power_w: float = 300.0, sm_clock_mhz: float = 1980.0, reasons: int = 0) -> None:
        self.power_w, self.sm_clock_mhz, self.reasons = power_w, sm_clock_mhz, reasons
        self._t0 = time.time()

    def read(self) -> Reading:
        now = time.time()
        return Reading(now, (now - self._t0) * self.power_w * 1000, self.power_w * 1000, self.sm_clock_mhz, 2619.0,
                       40.0, self.reasons)
