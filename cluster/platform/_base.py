"""The platform seam: what warpfleet asks of a GPU vendor's driver and tools, behind one class.

    Platform ─► the devices a worker may use, and what each one is (``visible_gpu_count``, ``describe``)
             ─► a telemetry source per device (``telemetry``: power, clocks, energy)
             ─► the device nodes a GPU command's sandbox lets through (``device_nodes``, ``prepare_nodes``)
             ─► the profiler and the sanitizer put in front of a run (``profiler_prefix``, ``sanitizer_prefix``)

NVIDIA's (``cluster.platform.nvidia``) is the one implementation; a port to another vendor is one
module beside it and one line in ``cluster.core.registry.PLATFORMS``. ``cluster.platform.node_platform``
picks this node's. Which device a worker owns and where it runs is ``cluster.platform.devices``'.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from cluster.core.types import DeviceInfo

# The clock event ("throttle") reason bits of a ``Reading``, by name: NVML's, read from nvml.h; another
# platform maps its own reasons onto them.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class Reading:
    t: float  # unix seconds
    energy_mj: float | None  # the device's energy counter since the driver loaded
    power_mw: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None
    reasons: int = 0


class ReadingSource(Protocol):
    def read(self) -> Reading: ...


class Platform(ABC):
    """One GPU vendor's driver and tools. Implementations register in ``cluster.core.registry.PLATFORMS``."""

    name: ClassVar[str]
    #: Globs under /dev: the nodes a GPU command's sandbox binds in (bubblewrap's /dev has no other).
    device_nodes: ClassVar[tuple[str, ...]]
    #: The variable that lists the devices a process may use (set by Ray for a GPU actor).
    visible_env: ClassVar[str]
    #: The profiler and the sanitizer, as commands on PATH.
    profiler: ClassVar[str]
    sanitizer: ClassVar[str]
    #: A device query run inside the sandbox by ``warpfleet doctor``.
    query: ClassVar[tuple[str, ...]]

    def device_paths(self) -> tuple[str, ...]:
        """The device nodes this node has, sorted."""
        return tuple(sorted(str(p) for pattern in self.device_nodes for p in Path("/dev").glob(pattern)))

    @abstractmethod
    def present(self) -> bool:
        """Whether this node has a device of this platform (its device nodes)."""

    def prepare_nodes(self) -> None:  # noqa: B027  (a platform whose nodes all exist has nothing to do)
        """Make the device nodes that appear only on a device's first use, before a sandbox binds them."""

    @abstractmethod
    def visible_gpu_count(self) -> int:
        """The devices this process may use: those ``visible_env`` lists where it is set, else all; 0
        without a driver."""

    @abstractmethod
    def describe(self, index: int) -> DeviceInfo:
        """What device ``index`` (the driver's, physical) is: name, arch, driver; where it runs is
        the caller's to fill in."""

    @abstractmethod
    def telemetry(self, index: int) -> ReadingSource:
        """A source of readings of device ``index``, read only (never a clock set)."""

    @abstractmethod
    def profiler_prefix(self, metrics: Sequence[str], launches: Sequence[str]) -> list[str]:
        """The profiler's argv put in front of a run: ``metrics`` per kernel as CSV, ``launches`` (the
        options that bound which launches it replays) passed on."""

    @abstractmethod
    def sanitizer_prefix(self, tool: str, error_exit: int) -> list[str]:
        """The sanitizer's argv put in front of a run: ``tool`` (memcheck, racecheck, ...), exiting
        with ``error_exit`` when it finds an error."""

    def sanitizer_filters(self, kernels: Sequence[str], launches: int | None) -> list[str]:
        """Options that bound what the sanitizer checks: the ``kernels`` named (all where empty), at
        most ``launches`` launches (every one where None). Default: none (the sanitizer checks all)."""
        return []

    def counters_note(self) -> str | None:
        """Why the profiler's performance counters may be unreadable in the sandbox here; None: no reason known."""
        return None
