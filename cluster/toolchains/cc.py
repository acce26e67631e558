"""The system C compiler: CPU targets, measured by CPU workers on the host they run on."""

from __future__ import annotations

from typing import ClassVar

from cluster.core.types import DeviceInfo, KernelResources
from cluster.toolchains._base import Toolchain


class Cc(Toolchain):
    """Plain C through ``cc``; the binary is built for, and run on, the worker's host."""

    name: ClassVar[str] = "cc"
    device_kind: ClassVar[str] = "cpu"
    default_build: ClassVar[tuple[str, ...]] = (
        "cc", "{flags}", "{defines}", "-o", "{binary}", "{sources}", "-lm",
    )  # fmt: skip
    shared_flags: ClassVar[tuple[str, ...]] = ("-fPIC", "-shared", "-Dmain=wf_user_main")
    entry_source: ClassVar[str] = "wf_entry.c"

    def arch_for(self, device: DeviceInfo) -> str:
        """Always ``host``: a CPU candidate is built on, and for, the machine that runs it."""
        return "host"

    def parse_resources(self, compiler_output: str) -> tuple[KernelResources, ...]:
        """Nothing: a C compiler reports no per-kernel resources."""
        return ()
