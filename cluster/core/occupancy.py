"""Theoretical occupancy of a kernel launch, computed as NVIDIA's occupancy calculator does.

The rules are those of ``cuda_occupancy.h`` in the CUDA toolkit, the host-side twin of
``cudaOccupancyMaxActiveBlocksPerMultiprocessor``: warps per block rounded up; registers
allocated per warp in units of 256 and held by one of the SM's four sub-partitions; shared
memory rounded to its allocation unit, plus the driver's 1 KB per block from 8.0 on, on an SM
whose shared-memory carveout is one of the sizes the architecture supports. The limits per
compute capability come from the CUDA Programming Guide's "Compute Capabilities" tables and the
values ``cudaGetDeviceProperties`` reports. The block-barrier limit (Hopper on) never binds for
a kernel with one barrier, and the virtual-resource limit needs data ptxas does not report, so
neither is modelled.

A tuner reads :attr:`Occupancy.limiting_factor` to see which resource caps a kernel, and
:func:`register_steps` for the ``-maxrregcount`` values at which occupancy changes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from cluster.core.types import KernelResources

KB = 1024
UNLIMITED = 2**31 - 1  # a limit that does not bind; cuda_occupancy.h reports INT_MAX
FACTORS = ("warps", "blocks", "registers", "shared")  # tie order: fixed limits before resources


@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM limits of one compute capability. Sizes in bytes, registers in 32-bit words."""

    compute_capability: str
    max_warps_per_sm: int
    max_blocks_per_sm: int
    shared_per_sm: int  # the largest carveout, what cudaDeviceProp.sharedMemPerMultiprocessor says
    shared_per_block_optin: int
    shared_carveouts: tuple[int, ...]  # the shared-memory sizes the SM can be configured to, ascending
    reserved_shared_per_block: int = 1 * KB  # taken by the driver for each block, from 8.0 on
    shared_allocation_unit: int = 128
    shared_per_block: int = 48 * KB  # without the per-kernel opt-in
    warp_size: int = 32
    max_threads_per_block: int = 1024
    registers_per_sm: int = 64 * KB
    max_registers_per_block: int = 64 * KB
    max_registers_per_thread: int = 255
    register_allocation_unit: int = 256  # registers, allocated per warp
    register_allocation_granularity: str = "warp"
    sub_partitions: int = 4  # each holds a quarter of the register file and whole warps

    @property
    def max_threads_per_sm(self) -> int:
        return self.max_warps_per_sm * self.warp_size

    @property
    def register_step(self) -> int:
        """Registers per thread that one allocation unit holds: counts between steps cost the same."""
        return self.register_allocation_unit // self.warp_size


_VOLTA = (0, 8, 16, 32, 64, 96)
_TURING = (32, 64)
_GA100 = (0, 8, 16, 32, 64, 100, 132, 164)
_GA10X = (0, 8, 16, 32, 64, 100)
_HOPPER = (*_GA100, 196, 228)


def _entry(cc: str, warps: int, blocks: int, shared_kb: int, carveouts_kb: tuple[int, ...],
           reserved: int = 1 * KB, unit: int = 128) -> DeviceLimits:
    shared = shared_kb * KB
    return DeviceLimits(cc, max_warps_per_sm=warps, max_blocks_per_sm=blocks, shared_per_sm=shared,
                        shared_per_block_optin=shared - reserved,
                        shared_carveouts=tuple(kb * KB for kb in carveouts_kb),
                        reserved_shared_per_block=reserved, shared_allocation_unit=unit)


_KNOWN: dict[str, DeviceLimits] = {
    entry.compute_capability: entry
    for entry in (
        _entry("7.0", 64, 32, 96, _VOLTA, reserved=0, unit=256),  # V100
        _entry("7.5", 32, 16, 64, _TURING, reserved=0, unit=256),  # T4, RTX 20xx
        _entry("8.0", 64, 32, 164, _GA100),  # A100
        _entry("8.6", 48, 16, 100, _GA10X),  # RTX 30xx, A10, A40
        _entry("8.7", 48, 16, 164, _GA100),  # Jetson Orin
        _entry("8.9", 48, 24, 100, _GA10X),  # L4, L40, RTX 40xx
        _entry("9.0", 64, 32, 228, _HOPPER),  # H100, H200
        _entry("10.0", 64, 32, 228, _HOPPER),  # B200
        _entry("10.3", 64, 32, 228, _HOPPER),  # B300: cuda_occupancy.h treats it as 10.0
        _entry("12.0", 48, 24, 100, _GA10X),  # RTX 50xx, RTX PRO 6000
        _entry("12.1", 48, 24, 100, _GA10X),  # DGX Spark
    )
}


def _normalize(compute_capability: str) -> str:
    """``9.0``, ``sm_90``, ``sm_90a`` and ``compute_100f`` name the same kinds of SM."""
    match = re.fullmatch(r"(?:sm_|compute_)(\d+)(\d)[a-z]?", compute_capability.strip())
    return f"{match[1]}.{match[2]}" if match else compute_capability.strip()


def limits_for(compute_capability: str) -> DeviceLimits:
    """The limits of a compute capability such as ``"9.0"`` (or ``"sm_90a"``); KeyError if unknown."""
    key = _normalize(compute_capability)
    if key not in _KNOWN:
        raise KeyError(f"no occupancy limits for compute capability {compute_capability!r}; "
                       f"known: {', '.join(_KNOWN)}")
    return _KNOWN[key]


def limits_from_properties(
    compute_capability: str,
    *,
    max_threads_per_block: int | None = None,
    max_threads_per_multiprocessor: int | None = None,
    max_blocks_per_multiprocessor: int | None = None,
    regs_per_multiprocessor: int | None = None,
    regs_per_block: int | None = None,
    warp_size: int | None = None,
    shared_mem_per_multiprocessor: int | None = None,
    shared_mem_per_block: int | None = None,
    shared_mem_per_block_optin: int | None = None,
    reserved_shared_mem_per_block: int | None = None,
) -> DeviceLimits:
    """Limits from what a device reports (the ``cudaDeviceProp`` fields, in snake case).

    What a device does not report (allocation units, carveouts, sub-partitions) comes from the
    table entry of the same compute capability, or of the nearest lower one of the same major.
    """
    key = _normalize(compute_capability)
    major, _, minor = key.partition(".")
    minor_number = int(minor) if minor.isdigit() else -1
    family = [cc for cc in _KNOWN if cc.split(".")[0] == major and int(cc.split(".")[1]) <= minor_number]
    if key not in _KNOWN and not family:
        limits_for(key)  # raises the KeyError that lists the known ones
    base = _KNOWN.get(key) or _KNOWN[max(family, key=lambda cc: int(cc.split(".")[1]))]
    reported = {
        "max_threads_per_block": max_threads_per_block,
        "max_blocks_per_sm": max_blocks_per_multiprocessor,
        "registers_per_sm": regs_per_multiprocessor,
        "max_registers_per_block": regs_per_block,
        "warp_size": warp_size,
        "shared_per_sm": shared_mem_per_multiprocessor,
        "shared_per_block": shared_mem_per_block,
        "shared_per_block_optin": shared_mem_per_block_optin,
        "reserved_shared_per_block": reserved_shared_mem_per_block,
    }
    limits = dataclasses.replace(base, compute_capability=key,
                                 **{name: value for name, value in reported.items() if value is not None})
    if max_threads_per_multiprocessor is not None:
        limits = dataclasses.replace(limits, max_warps_per_sm=max_threads_per_multiprocessor // limits.warp_size)
    carveouts = {size for size in limits.shared_carveouts if size <= limits.shared_per_sm}
    return dataclasses.replace(limits, shared_carveouts=tuple(sorted(carveouts | {limits.shared_per_sm})))


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of one launch configuration fit on an SM, and what stops more.

    The ``limit_*`` fields are the blocks each resource alone allows, as Nsight Compute's
    ``launch__occupancy_limit_{warps,blocks,registers,shared_mem}`` report them.
    """

    active_blocks_per_sm: int
    warps_per_block: int
    max_warps_per_sm: int
    limit_warps: int
    limit_blocks: int
    limit_registers: int
    limit_shared: int
    registers_per_block: int  # as allocated: per warp, in allocation units
    shared_per_block: int  # as allocated: rounded up, with the driver's reserved share
    shared_per_sm: int  # the carveout this launch gets

    @property
    def active_warps_per_sm(self) -> int:
        return self.active_blocks_per_sm * self.warps_per_block

    @property
    def theoretical_occupancy(self) -> float:
        """Active warps over the SM's maximum, from 0 to 1."""
        return self.active_warps_per_sm / self.max_warps_per_sm

    @property
    def percent(self) -> float:
        """Theoretical occupancy in percent: Nsight Compute's ``sm__maximum_warps_per_active_cycle_pct``."""
        return 100.0 * self.theoretical_occupancy

    @property
    def block_limits(self) -> dict[str, int]:
        return dict(zip(FACTORS, (self.limit_warps, self.limit_blocks, self.limit_registers, self.limit_shared),
                        strict=True))

    @property
    def limiting_factors(self) -> tuple[str, ...]:
        """Every limit that allows exactly the active blocks (several when they tie)."""
        return tuple(name for name, blocks in self.block_limits.items() if blocks == self.active_blocks_per_sm)

    @property
    def limiting_factor(self) -> str:
        """The first limiting factor, fixed limits before resources: lowering a resource that ties
        with the warp or block slots would not raise occupancy."""
        return self.limiting_factors[0]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _carveout(limits: DeviceLimits, size: int) -> int:
    """The smallest shared-memory configuration of the SM that holds ``size`` bytes."""
    for carveout in limits.shared_carveouts:
        if carveout >= size:
            return carveout
    raise ValueError(f"{size} bytes of shared memory exceed the largest carveout of "
                     f"{limits.compute_capability} ({limits.shared_carveouts[-1]} bytes)")


def _register_limit(limits: DeviceLimits, warps_per_block: int, registers_per_thread: int) -> tuple[int, int]:
    per_warp = _round_up(registers_per_thread * limits.warp_size, limits.register_allocation_unit)
    per_block = per_warp * warps_per_block
    # The launch check counts the block's warps as if spread over every sub-partition.
    checked = per_warp * _round_up(warps_per_block, limits.sub_partitions)
    too_many = registers_per_thread > limits.max_registers_per_thread
    if too_many or max(per_block, checked) > limits.max_registers_per_block:
        return 0, per_block
    if per_warp == 0:
        return UNLIMITED, per_block
    warps_per_partition = limits.registers_per_sm // limits.sub_partitions // per_warp
    return warps_per_partition * limits.sub_partitions // warps_per_block, per_block


def _shared_limit(limits: DeviceLimits, shared_bytes: int, carveout: int | None) -> tuple[int, int, int]:
    per_block = _round_up(shared_bytes + limits.reserved_shared_per_block, limits.shared_allocation_unit)
    if per_block > limits.shared_per_block_optin + limits.reserved_shared_per_block:
        return 0, per_block, 0
    preferred = _carveout(limits, limits.shared_per_sm if carveout is None else carveout)
    # A carveout too small for one block is raised to the smallest configuration that holds one.
    per_sm = preferred if preferred >= per_block else _carveout(limits, per_block)
    return (per_sm // per_block if per_block else UNLIMITED), per_block, per_sm


def occupancy(limits: DeviceLimits, threads_per_block: int, registers_per_thread: int,
              shared_bytes_per_block: int, shared_carveout_bytes: int | None = None) -> Occupancy:
    """Theoretical occupancy of blocks of ``threads_per_block`` threads on one SM.

    ``shared_bytes_per_block`` is static plus dynamic shared memory; above 48 KB the kernel is
    assumed to have opted in. ``shared_carveout_bytes`` is the preferred shared-memory size of
    the SM (rounded up to a supported configuration); None takes the largest, as the driver does
    when a kernel sets no preference.
    """
    if threads_per_block <= 0 or registers_per_thread < 0 or shared_bytes_per_block < 0:
        raise ValueError("threads_per_block must be positive, registers and shared bytes not negative")
    warps_per_block = -(-threads_per_block // limits.warp_size)
    by_warps = 0 if threads_per_block > limits.max_threads_per_block else limits.max_warps_per_sm // warps_per_block
    by_registers, registers_per_block = _register_limit(limits, warps_per_block, registers_per_thread)
    by_shared, shared_per_block, shared_per_sm = _shared_limit(limits, shared_bytes_per_block, shared_carveout_bytes)
    return Occupancy(
        active_blocks_per_sm=min(by_warps, limits.max_blocks_per_sm, by_registers, by_shared),
        warps_per_block=warps_per_block, max_warps_per_sm=limits.max_warps_per_sm,
        limit_warps=by_warps, limit_blocks=limits.max_blocks_per_sm,
        limit_registers=by_registers, limit_shared=by_shared,
        registers_per_block=registers_per_block, shared_per_block=shared_per_block, shared_per_sm=shared_per_sm,
    )


def occupancy_of_kernel(limits: DeviceLimits, kernel: KernelResources, threads_per_block: int,
                        dynamic_shared_bytes: int = 0, shared_carveout_bytes: int | None = None) -> Occupancy:
    """:func:`occupancy` of a kernel from its ptxas report, plus the dynamic shared memory of its launch."""
    return occupancy(limits, threads_per_block, kernel.registers, kernel.shared_bytes + dynamic_shared_bytes,
                     shared_carveout_bytes)


@dataclass(frozen=True)
class RegisterStep:
    """The largest registers-per-thread count that still reaches one occupancy level."""

    registers: int
    occupancy: Occupancy


def register_steps(limits: DeviceLimits, threads_per_block: int, shared_bytes_per_block: int,
                   shared_carveout_bytes: int | None = None) -> list[RegisterStep]:
    """Each occupancy level reachable by capping registers, from the most registers to the fewest.

    A step's ``registers`` is the ``-maxrregcount`` value to use for its level: any more and the
    occupancy drops to the step before. The first step is the per-thread maximum (255); the
    others are multiples of :attr:`DeviceLimits.register_step`, since counts in between cost the
    same. The first level may be zero blocks, when the block does not fit with 255 registers.
    """
    candidates = sorted({limits.max_registers_per_thread,
                         *range(limits.register_step, limits.max_registers_per_thread + 1, limits.register_step)},
                        reverse=True)
    steps: list[RegisterStep] = []
    for registers in candidates:
        result = occupancy(limits, threads_per_block, registers, shared_bytes_per_block, shared_carveout_bytes)
        if not steps or result.active_blocks_per_sm != steps[-1].occupancy.active_blocks_per_sm:
            steps.append(RegisterStep(registers, result))
    return steps
