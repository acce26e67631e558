"""The toolchain contract: how a target's sources become a binary, and what the compiler said."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from cluster.core.types import DeviceInfo, KernelResources


class Toolchain(ABC):
    """One compiler family. Implementations register in ``cluster.core.registry.TOOLCHAINS``."""

    name: ClassVar[str]
    #: "gpu": candidates are measured by GPU workers; "cpu": by CPU workers.
    device_kind: ClassVar[str]
    #: Build command used when a target declares none (placeholders: see cluster.core.placeholders).
    default_build: ClassVar[tuple[str, ...]]
    #: Flags always added to ``{flags}`` so that the compiler reports resource usage.
    report_flags: ClassVar[tuple[str, ...]] = ()
    #: Flags that build the program as a shared library for the persistent runner (its ``main``
    #: renamed), and the entry point added to its sources (include/warpfleet/); empty: not supported.
    shared_flags: ClassVar[tuple[str, ...]] = ()
    entry_source: ClassVar[str] = ""

    @abstractmethod
    def arch_for(self, device: DeviceInfo) -> str:
        """The ``{arch}`` a candidate is built for to run on ``device`` (``sm_90``, ``host``)."""

    @abstractmethod
    def parse_resources(self, compiler_output: str) -> tuple[KernelResources, ...]:
        """Per-kernel resource usage from the compiler's output; empty if it reports none."""
