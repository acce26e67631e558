"""The occupancy calculator against NVIDIA's published examples and against cuda_occupancy.h itself."""

from __future__ import annotations

import glob
import itertools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.core.occupancy import (
    UNLIMITED,
    DeviceLimits,
    limits_for,
    limits_from_properties,
    occupancy,
    occupancy_of_kernel,
    register_steps,
)
from cluster.core.types import KernelResources

KB = 1024

# --- published examples -----------------------------------------------------------------------


def test_best_practices_guide_register_granularity_example() -> None:
    # CUDA C++ Best Practices Guide, "Calculating Occupancy": on compute capability 7.0, 37
    # registers per thread give 12 blocks of 128 threads (75%) but only four of 320 threads (63%).
    small = occupancy(limits_for("7.0"), 128, 37, 0)
    assert (small.active_blocks_per_sm, small.percent, small.limiting_factor) == (12, 75.0, "registers")
    large = occupancy(limits_for("7.0"), 320, 37, 0)
    assert (large.active_blocks_per_sm, large.active_warps_per_sm) == (4, 40)
    assert large.percent == 62.5  # the guide rounds it to 63%
    assert large.registers_per_block == 10 * 1280  # 37 x 32 = 1184 rounded up to 1280 per warp


def test_programming_guide_block_slot_example() -> None:
    # CUDA Programming Guide, "Kernel Launch and Occupancy", compute capability 10.0: 32-thread
    # blocks stop at the 32 block slots, 1,024 threads, 50% occupancy.
    result = occupancy(limits_for("10.0"), 32, 32, 0)
    assert (result.active_blocks_per_sm, result.active_warps_per_sm, result.percent) == (32, 32, 50.0)
    assert result.limiting_factors == ("blocks",)


def test_hopper_shared_memory_example() -> None:
    # 256 threads, 40 registers, 48 KB of shared memory on an H100: registers allow 6 blocks,
    # shared memory 4, so 32 warps, 50%.
    result = occupancy(limits_for("9.0"), 256, 40, 48 * KB)
    assert (result.limit_warps, result.limit_registers, result.limit_shared) == (8, 6, 4)
    assert (result.active_blocks_per_sm, result.percent, result.limiting_factor) == (4, 50.0, "shared")


def test_reserved_shared_memory_counts_per_block() -> None:
    # A widely copied H100 example (32 threads, 8 registers, 12 KB) divides 228 KB by 12 KB and
    # gets 19 blocks; the driver's 1 KB per block makes it 228 // 13 = 17, as cuda_occupancy.h says.
    result = occupancy(limits_for("9.0"), 32, 8, 12 * KB)
    assert (result.shared_per_block, result.active_blocks_per_sm, result.limiting_factor) == (13 * KB, 17, "shared")
    # Volta reserves nothing and rounds to 256 bytes.
    assert occupancy(limits_for("7.0"), 32, 8, 12 * KB + 1).shared_per_block == 12 * KB + 256


def test_tabulated_limits_match_the_guides() -> None:
    # Hopper Tuning Guide: 64 warps, 32 blocks, 64K registers, 255 per thread, 228 KB per SM, 227 KB per block.
    hopper = limits_for("9.0")
    assert (hopper.max_warps_per_sm, hopper.max_blocks_per_sm, hopper.registers_per_sm) == (64, 32, 65536)
    assert (hopper.max_registers_per_thread, hopper.shared_per_sm, hopper.shared_per_block_optin) == (
        255, 228 * KB, 227 * KB)
    # Programming Guide: 1,536 threads on 8.6/8.9/12.x, 1,024 on Turing; 100 KB and 99 KB on 8.9 and 12.x.
    assert [limits_for(cc).max_threads_per_sm for cc in ("7.5", "8.0", "8.6", "8.9", "12.0")] == [
        1024, 2048, 1536, 1536, 1536]
    assert [limits_for(cc).max_blocks_per_sm for cc in ("7.0", "7.5", "8.0", "8.6", "8.9", "12.0")] == [
        32, 16, 32, 16, 24, 24]
    assert (limits_for("12.0").shared_per_sm, limits_for("12.0").shared_per_block_optin) == (100 * KB, 99 * KB)
    assert limits_for("8.0").shared_per_block_optin == 163 * KB


# --- limits -----------------------------------------------------------------------------------


def test_limits_for_accepts_arch_names_and_lists_the_known_ones() -> None:
    assert limits_for("sm_90a") is limits_for("9.0")
    assert limits_for("sm_100").compute_capability == "10.0"
    with pytest.raises(KeyError, match=r"known: 7\.0, 7\.5, .*9\.0"):
        limits_for("6.1")


def test_limits_from_properties_uses_reported_values_over_the_table() -> None:
    # Reported by an H100 through cudaGetDeviceProperties; the table fills in what is not reported.
    reported = limits_from_properties("9.0", max_threads_per_multiprocessor=2048, regs_per_multiprocessor=65536,
                                      shared_mem_per_multiprocessor=233472, shared_mem_per_block_optin=232448,
                                      reserved_shared_mem_per_block=1024, max_blocks_per_multiprocessor=32)
    assert reported == limits_for("9.0")
    # A smaller reported SM changes the results and keeps only the carveouts it can hold.
    small = limits_from_properties("9.0", max_threads_per_multiprocessor=1024, shared_mem_per_multiprocessor=100 * KB)
    assert small.max_warps_per_sm == 32
    assert small.shared_carveouts[-1] == 100 * KB
    assert occupancy(small, 256, 32, 0).active_blocks_per_sm == 4
    # An unknown minor takes its family's nearest entry; an unknown major is an error.
    assert limits_from_properties("12.7").max_blocks_per_sm == 24
    with pytest.raises(KeyError):
        limits_from_properties("6.1")


# --- edge cases ---------------------------------------------------------------------------------


def test_launches_that_cannot_run_have_zero_blocks_and_name_the_cause() -> None:
    hopper = limits_for("9.0")
    assert occupancy(hopper, 1025, 32, 0).limiting_factors == ("warps",)
    assert occupancy(hopper, 1024, 255, 0).limiting_factors == ("registers",)
    assert occupancy(hopper, 1024, 72, 0).active_blocks_per_sm == 0  # 72 x 1024 > 64K registers per block
    assert occupancy(hopper, 32, 256, 0).active_blocks_per_sm == 0  # more than ptxas can give a thread
    too_big = occupancy(hopper, 128, 32, 227 * KB + 1)
    assert (too_big.active_blocks_per_sm, too_big.limiting_factor) == (0, "shared")
    assert occupancy(hopper, 128, 32, 227 * KB).active_blocks_per_sm == 1
    with pytest.raises(ValueError):
        occupancy(hopper, 0, 32, 0)


def test_registers_limit_whole_warps_per_sub_partition() -> None:
    # 40 registers: 1280 per warp. The whole file would hold 65536 // 1280 = 51 warps, 17 blocks
    # of 3 warps; each 16K quarter holds only 12 whole warps, so 48 warps and 16 blocks.
    assert occupancy(limits_for("9.0"), 96, 40, 0).limit_registers == 16
    # 168 registers: 5376 per warp, 3 warps per quarter, 12 warps: one 8-warp block.
    assert occupancy(limits_for("9.0"), 256, 168, 0).limit_registers == 1
    assert occupancy(limits_for("9.0"), 128, 0, 0).limit_registers == UNLIMITED


def test_register_launch_check_rounds_warps_to_sub_partitions() -> None:
    # cuda_occupancy.h checks the per-block register limit as if the block's warps were rounded up
    # to a multiple of the four sub-partitions. It only bites where a block may hold fewer
    # registers than the SM: 7 warps x 4608 = 32256 fit in 32K, but 8 x 4608 = 36864 do not.
    small_blocks = limits_from_properties("9.0", regs_per_block=32 * KB)
    assert occupancy(small_blocks, 224, 144, 0).active_blocks_per_sm == 0
    assert occupancy(limits_for("9.0"), 224, 144, 0).active_blocks_per_sm == 1


def test_carveout_rounds_up_and_grows_to_fit_one_block() -> None:
    hopper = limits_for("9.0")
    assert occupancy(hopper, 128, 32, 0).shared_per_sm == 228 * KB  # no preference: the largest
    assert occupancy(hopper, 128, 32, 0, shared_carveout_bytes=50 * KB).shared_per_sm == 64 * KB
    # An 8 KB carveout holds 8 blocks of 1 KB (the reserved share alone) ...
    assert occupancy(hopper, 32, 32, 0, shared_carveout_bytes=0).limit_shared == 8
    # ... and one too small for a block becomes the smallest size that holds one.
    grown = occupancy(hopper, 128, 32, 40 * KB, shared_carveout_bytes=16 * KB)
    assert (grown.shared_per_sm, grown.active_blocks_per_sm) == (64 * KB, 1)
    with pytest.raises(ValueError):
        occupancy(hopper, 128, 32, 0, shared_carveout_bytes=229 * KB)
    # Turing has no carveout under 32 KB.
    assert occupancy(limits_for("7.5"), 128, 32, 0, shared_carveout_bytes=0).shared_per_sm == 32 * KB


def test_occupancy_of_kernel_adds_dynamic_shared_memory() -> None:
    kernel = KernelResources(kernel="k", arch="sm_90", registers=64, shared_bytes=16 * KB)
    result = occupancy_of_kernel(limits_for("9.0"), kernel, 256, dynamic_shared_bytes=32 * KB)
    assert result == occupancy(limits_for("9.0"), 256, 64, 48 * KB)
    assert result.active_blocks_per_sm == 4


# --- register steps -----------------------------------------------------------------------------


def test_register_steps_hopper_256_threads() -> None:
    steps = register_steps(limits_for("9.0"), 256, 0)
    assert [(s.registers, s.occupancy.active_blocks_per_sm, s.occupancy.active_warps_per_sm) for s in steps] == [
        (255, 1, 8), (128, 2, 16), (80, 3, 24), (64, 4, 32), (48, 5, 40), (40, 6, 48), (32, 8, 64)]


def test_register_steps_start_at_zero_blocks_when_the_block_does_not_fit() -> None:
    steps = register_steps(limits_for("9.0"), 1024, 0)
    assert [(s.registers, s.occupancy.active_blocks_per_sm) for s in steps] == [(255, 0), (64, 1), (32, 2)]


def test_register_steps_under_a_shared_memory_limit_stop_early() -> None:
    # With 100 KB per block only 2 blocks fit; registers cannot buy more than that.
    steps = register_steps(limits_for("9.0"), 128, 100 * KB)
    assert [(s.registers, s.occupancy.active_blocks_per_sm) for s in steps] == [(255, 2)]


@pytest.mark.parametrize("cc", ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "12.0"])
@pytest.mark.parametrize("threads", [32, 96, 128, 256, 384, 640, 1024])
@pytest.mark.parametrize("shared", [0, 8 * KB, 40 * KB])
def test_register_steps_are_the_exact_changes(cc: str, threads: int, shared: int) -> None:
    limits = limits_for(cc)
    steps = register_steps(limits, threads, shared)
    registers = [step.registers for step in steps]
    blocks = [step.occupancy.active_blocks_per_sm for step in steps]
    assert registers[0] == 255
    assert registers == sorted(registers, reverse=True) and len(set(registers)) == len(registers)
    assert blocks == sorted(blocks) and len(set(blocks)) == len(blocks)
    assert all(r == 255 or r % limits.register_step == 0 for r in registers)
    # Between a step and the next, every register count gives the step's occupancy; one more
    # register than a step (after the first) gives the previous, lower level.
    bounds = [*registers, 0]
    for step, lower in itertools.pairwise(bounds):
        level = occupancy(limits, threads, step, shared).active_blocks_per_sm
        assert all(occupancy(limits, threads, r, shared).active_blocks_per_sm == level
                   for r in range(lower + 1, step + 1))
    for previous, step in itertools.pairwise(steps):
        above = occupancy(limits, threads, step.registers + 1, shared)
        assert above.active_blocks_per_sm == previous.occupancy.active_blocks_per_sm
        assert step.occupancy == occupancy(limits, threads, step.registers, shared)


# --- cross-check against cuda_occupancy.h -------------------------------------------------------

# cudaOccDeviceProp values as cudaGetDeviceProperties reports them on one product per
# architecture; typed in independently of cluster/occupancy.py's table.
HARNESS = r"""
#include <cstdio>
#include <cuda_occupancy.h>

struct Arch { int major, minor, threadsPerSm; size_t smemPerSm, optin, reserved; };
static const Arch ARCHS[] = {
    {7, 0, 2048, 98304, 98304, 0},        // V100
    {7, 5, 1024, 65536, 65536, 0},        // T4
    {8, 0, 2048, 167936, 166912, 1024},   // A100
    {8, 6, 1536, 102400, 101376, 1024},   // RTX 3090
    {8, 9, 1536, 102400, 101376, 1024},   // L4
    {9, 0, 2048, 233472, 232448, 1024},   // H100
    {10, 0, 2048, 233472, 232448, 1024},  // B200
    {12, 0, 1536, 102400, 101376, 1024},  // RTX 5090
};

int main() {
    int major, minor, threads, regs, carveoutPct;
    size_t shared;
    while (std::scanf("%d %d %d %d %zu %d", &major, &minor, &threads, &regs, &shared, &carveoutPct) == 6) {
        const Arch *arch = nullptr;
        for (const Arch &a : ARCHS) if (a.major == major && a.minor == minor) arch = &a;
        if (!arch) { std::printf("unknown\n"); continue; }
        cudaOccDeviceProp prop;
        prop.computeMajor = major; prop.computeMinor = minor;
        prop.maxThreadsPerBlock = 1024; prop.maxThreadsPerMultiprocessor = arch->threadsPerSm;
        prop.regsPerBlock = 65536; prop.regsPerMultiprocessor = 65536; prop.warpSize = 32;
        prop.sharedMemPerBlock = 49152; prop.sharedMemPerMultiprocessor = arch->smemPerSm;
        prop.numSms = 100; prop.sharedMemPerBlockOptin = arch->optin;
        prop.reservedSharedMemPerBlock = arch->reserved;
        cudaOccFuncAttributes attr;  // as converted from cudaFuncAttributes, with the opt-in set
        attr.maxThreadsPerBlock = 1024; attr.numRegs = regs; attr.sharedSizeBytes = 0;
        attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; attr.maxDynamicSharedSizeBytes = arch->optin;
        attr.numBlockBarriers = 1;
        cudaOccDeviceState state;
        state.carveoutConfig = carveoutPct;  // -1: no preference
        cudaOccResult r = cudaOccResult();
        cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &prop, &attr, &state, threads, shared);
        std::printf("%d %d %d %d %d %d %d %zu\n", (int)e, r.activeBlocksPerMultiprocessor, r.blockLimitWarps,
                    r.blockLimitBlocks, r.blockLimitRegs, r.blockLimitSharedMem, r.allocatedRegistersPerBlock,
                    r.allocatedSharedMemPerBlock);
    }
    return 0;
}
"""

HEADER_ARCHS = ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
THREADS = [32, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
REGISTERS = [16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 128, 168, 200, 255]
SHARED = [0, 1024, 4096, 16384, 49152]


def _header_dir() -> Path | None:
    nvcc = shutil.which("nvcc")
    roots = [str(Path(nvcc).resolve().parent.parent)] if nvcc else []
    roots += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    return next((Path(r) / "include" for r in roots if (Path(r) / "include" / "cuda_occupancy.h").is_file()), None)


@pytest.fixture(scope="module")
def header_calculator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    include, gxx = _header_dir(), shutil.which("g++")
    if include is None or gxx is None:
        pytest.skip("needs cuda_occupancy.h (a CUDA toolkit) and g++")
    folder = tmp_path_factory.mktemp("occupancy_header")
    (folder / "harness.cpp").write_text(HARNESS)
    subprocess.run([gxx, "-std=c++17", "-O1", f"-I{include}", str(folder / "harness.cpp"), "-o",
                    str(folder / "harness")], check=True, capture_output=True, timeout=120)
    yield folder / "harness"


def _carveout_bytes(limits: DeviceLimits, percent: int) -> int | None:
    # cuda_occupancy.h turns a carveout percentage into bytes exactly so.
    return None if percent < 0 else percent * limits.shared_per_sm // 100


def _compare(harness: Path, cases: list[tuple[str, int, int, int, int]]) -> tuple[int, list[str]]:
    lines = []
    for cc, threads, registers, shared, percent in cases:
        major, minor = cc.split(".")
        lines.append(f"{major} {minor} {threads} {registers} {shared} {percent}")
    run = subprocess.run([str(harness)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                         check=True, timeout=120)
    outputs = run.stdout.splitlines()
    assert len(outputs) == len(cases)
    mismatches = []
    for case, line in zip(cases, outputs, strict=True):
        cc, threads, registers, shared, percent = case
        limits = limits_for(cc)
        ours = occupancy(limits, threads, registers, shared, _carveout_bytes(limits, percent))
        mine = [0, ours.active_blocks_per_sm, ours.limit_warps, ours.limit_blocks, ours.limit_registers,
                ours.limit_shared, ours.registers_per_block, ours.shared_per_block]
        theirs = [int(field) for field in line.split()] if line != "unknown" else None
        if theirs != mine:
            mismatches.append(f"{case}: header {theirs} != ours {mine}")
    return len(cases) - len(mismatches), mismatches


@pytest.mark.parametrize("cc", HEADER_ARCHS)
def test_grid_matches_cuda_occupancy_header(header_calculator: Path, cc: str) -> None:
    cases = [(cc, t, r, s, -1) for t, r, s in itertools.product(THREADS, REGISTERS, SHARED)]
    matched, mismatches = _compare(header_calculator, cases)
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ:\n" + "\n".join(mismatches[:10])
    assert matched == 700


@pytest.mark.parametrize("cc", HEADER_ARCHS)
def test_edges_match_cuda_occupancy_header(header_calculator: Path, cc: str) -> None:
    # Odd block sizes, no registers, shared memory at and past the opt-in limit, and carveouts.
    optin = limits_for(cc).shared_per_block_optin
    shared = [0, 1, 129, 48 * KB + 1, 60 * KB, optin - 1, optin, optin + 1]
    cases = [(cc, t, r, s, p) for t, r, s, p in itertools.product(
        [1, 33, 100, 200, 500, 992, 1000, 1023], [0, 1, 8, 33, 63, 65, 129, 254], shared, [-1, 0, 25, 50, 100])]
    matched, mismatches = _compare(header_calculator, cases)
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ:\n" + "\n".join(mismatches[:10])
    assert matched == len(cases)
