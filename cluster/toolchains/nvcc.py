"""NVIDIA's nvcc: CUDA sources built for one SM architecture, with ptxas's resource report."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import ClassVar

from cluster.core.types import DeviceInfo, KernelResources
from cluster.toolchains._base import Toolchain

_COMPUTE_CAPABILITY = re.compile(r"(\d+)\.(\d+)")

# ptxas (nvcc 11-13). An entry function is a kernel; "Function properties for" without a
# preceding "Compiling entry function" of the same name belongs to a device function.
_ENTRY = re.compile(r"Compiling entry function '([^']+)'(?: for '([^']+)')?")
_PTXAS_PROPERTIES = re.compile(r"Function properties for ([^'\s]+)\s*$")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"\b[Uu]sed (\d+) registers\b(.*)")
_SMEM = re.compile(r"(\d+) bytes smem\b")
_CMEM0 = re.compile(r"(\d+) bytes cmem\[0\]")
# nvlink, which reports instead of ptxas under -rdc=true: only kernels, quoted, with no arch and
# no spill figures; its smem includes the block's reserved system shared memory.
_NVLINK_PROPERTIES = re.compile(r"Function properties for '([^']+)':")
_NVLINK_STACK = re.compile(r"\b(\d+) stack\b")


class Nvcc(Toolchain):
    """CUDA C++ through nvcc; candidates run on GPU workers of the architecture built for."""

    name: ClassVar[str] = "nvcc"
    device_kind: ClassVar[str] = "gpu"
    default_build: ClassVar[tuple[str, ...]] = (
        "nvcc", "{flags}", "{defines}", "-arch={arch}", "-o", "{binary}", "{sources}",
    )  # fmt: skip
    # Implies `-Xptxas -v` (prints on stderr), or nvlink's verbose report under -rdc=true,
    # where ptxas's allocation is not final and nvcc prints none.
    report_flags: ClassVar[tuple[str, ...]] = ("--resource-usage",)
    shared_flags: ClassVar[tuple[str, ...]] = ("-Xcompiler", "-fPIC", "-shared", "-Dmain=wf_user_main")
    entry_source: ClassVar[str] = "wf_entry.cpp"

    def arch_for(self, device: DeviceInfo) -> str:
        """``sm_`` and the compute capability's digits: 9.0 -> ``sm_90``, 12.0 -> ``sm_120``."""
        match = _COMPUTE_CAPABILITY.fullmatch(device.compute_capability.strip())
        if not match:
            raise ValueError(
                f"device {device.name!r} has no usable compute capability "
                f"({device.compute_capability!r}); nvcc cannot pick an arch for it"
            )
        return f"sm_{match.group(1)}{match.group(2)}"

    def parse_resources(self, compiler_output: str) -> tuple[KernelResources, ...]:
        """One entry per kernel and arch in a ptxas (or nvlink) verbose report, in report order.

        Kernel names are kept as printed (mangled). Device functions are skipped, and so is any
        line that does not parse: a report this cannot read yields fewer kernels, never an error.
        """
        kernels: list[KernelResources] = []
        current: int | None = None  # index in kernels of the kernel the next figures belong to
        for line in compiler_output.splitlines():
            if entry := _ENTRY.search(line):
                kernels.append(KernelResources(kernel=entry.group(1), arch=entry.group(2) or ""))
                current = len(kernels) - 1
            elif linked := _NVLINK_PROPERTIES.search(line):
                kernels.append(KernelResources(kernel=linked.group(1), arch=""))
                current = len(kernels) - 1
            elif props := _PTXAS_PROPERTIES.search(line):
                if current is not None and kernels[current].kernel != props.group(1):
                    current = None  # a device function's properties: not a kernel's
            elif current is not None:
                kernels[current] = _with_figures(kernels[current], line)
        return tuple(kernels)


def _with_figures(kernel: KernelResources, line: str) -> KernelResources:
    """``kernel`` updated with whatever figures ``line`` reports, or unchanged."""
    if frame := _FRAME.search(line):
        stack, stores, loads = map(int, frame.groups())
        return replace(kernel, stack_bytes=stack, spill_stores=stores, spill_loads=loads)
    used = _USED.search(line)
    if not used:
        return kernel
    rest = used.group(2)
    smem, cmem0, stack = _SMEM.search(rest), _CMEM0.search(rest), _NVLINK_STACK.search(rest)
    return replace(
        kernel,
        registers=int(used.group(1)),
        shared_bytes=int(smem.group(1)) if smem else kernel.shared_bytes,
        constant_bytes=int(cmem0.group(1)) if cmem0 else kernel.constant_bytes,
        stack_bytes=int(stack.group(1)) if stack else kernel.stack_bytes,
    )
