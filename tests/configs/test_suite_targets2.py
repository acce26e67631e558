"""The benchmark-suite targets multikernel, matmul and conv2d and their hand-optimized ``_opt``
variants: they load, their param spaces stay within the limits of a block, and each compiles for
sm_90 through the engine's own build command (``cluster.compile.build.build_command``), with ptxas's
report read as the engine reads it. Nothing here runs on a GPU.

Eight nvcc invocations in all, run in parallel once per module: the six targets at their
baseline params, and matmul and conv2d at their largest tiles. The baselines' builds are shared with
the other modules that build them (tests/configs/_builds.py: ``compile_once``).
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from cluster.config import Target, load_target
from cluster.core.types import Scalar
from tests.configs._builds import SUITE_BUILDS, Compiled, compile_params

TARGETS = Path(__file__).resolve().parents[2] / "configs" / "targets"
SUITE = ("multikernel", "matmul", "conv2d")
SHARED_MEMORY_LIMIT = 48 * 1024  # static shared memory per block, bytes
THREADS_LIMIT = 1024
ALL_NAMES = [*SUITE, *(f"{name}_opt" for name in SUITE)]
Test = TypeVar("Test", bound=Callable[..., None])
pytestmark = SUITE_BUILDS


def needs_nvcc(test: Test) -> Test:
    """Marked ``nvcc`` (compile only), and skipped where nvcc is not installed."""
    skip = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
    return pytest.mark.nvcc(skip(test))


def target_file(name: str) -> Path:
    base = name.removesuffix("_opt")
    return TARGETS / base / ("target_opt.yaml" if name.endswith("_opt") else "target.yaml")


# What the sources allocate, from the params (matmul.cu's and conv2d.cu's headers say the same).
def matmul_threads(p: dict[str, Scalar]) -> int:
    return int(p["TILE"]) * (int(p["TILE"]) // int(p["WPT"]))


def matmul_shared_bytes(p: dict[str, Scalar]) -> int:
    return 2 * int(p["TILE"]) ** 2 * 4  # the A and B tiles


def conv2d_shared_bytes(p: dict[str, Scalar]) -> int:
    return (int(p["BLOCK_X"]) + 6) * (int(p["BLOCK_Y"]) * int(p["TILE"]) + 6) * 4  # tile and 3-pixel halo


def valid_points(target: Target) -> list[dict[str, Scalar]]:
    names = list(target.spec.params)
    points = (dict(zip(names, values, strict=True)) for values in itertools.product(*target.spec.params.values()))
    return [p for p in points if target.satisfies(p)]


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_NAMES)
def test_target_loads_with_the_harness_build_and_a_seeded_run(name: str) -> None:
    target = load_target(target_file(name))
    assert (target.name, target.spec.toolchain, target.space.name) == (name, "nvcc", "nvcc")
    assert dict(target.bundle.files).keys() == {f"{name}.cu"}
    assert target.spec.build == ["nvcc", "{flags}", "{defines}", "{harness_include}", "-arch={arch}",
                                 "-o", "{binary}", "{sources}"]
    assert target.spec.run[:3] == ["{binary}", "--seed", "{seed}"]
    assert [(o.path, o.dtype, o.is_text) for o in target.spec.verify.outputs] == [("out.bin", "float32", False)]
    assert b"#include <warpfleet/harness.cuh>" in target.bundle.files[0][1]


@pytest.mark.parametrize("name", SUITE)
def test_opt_variant_runs_and_verifies_like_its_baseline(name: str) -> None:
    base, opt = load_target(target_file(name)), load_target(target_file(f"{name}_opt"))
    assert opt.spec.run == base.spec.run
    assert opt.spec.verify == base.spec.verify
    assert opt.spec.timeouts == base.spec.timeouts
    assert opt.spec.params == {}  # a single hand-tuned point


def test_matmul_space_keeps_blocks_within_the_limits() -> None:
    target = load_target(target_file("matmul"))
    assert target.baseline_params == {"TILE": 16, "WPT": 1, "UNROLL": 1}
    points = valid_points(target)
    assert len(points) == 10 * 3  # (TILE, WPT): 8 with WPT 1-2, 16 and 32 with any; times 3 UNROLLs
    for p in points:
        assert int(p["TILE"]) % int(p["WPT"]) == 0, p
        assert 32 <= matmul_threads(p) <= THREADS_LIMIT, p
        assert matmul_shared_bytes(p) <= SHARED_MEMORY_LIMIT, p
    assert not target.satisfies({"TILE": 8, "WPT": 8, "UNROLL": 1})  # 8 threads: less than a warp


def test_conv2d_space_keeps_blocks_within_the_limits() -> None:
    target = load_target(target_file("conv2d"))
    assert target.baseline_params == {"BLOCK_X": 32, "BLOCK_Y": 8, "TILE": 1}
    points = valid_points(target)
    assert len(points) == 3 * 4 * 3  # 64 x 16 = 1024 threads is the largest block, and allowed
    for p in points:
        assert int(p["BLOCK_X"]) * int(p["BLOCK_Y"]) <= THREADS_LIMIT, p
        assert conv2d_shared_bytes(p) <= SHARED_MEMORY_LIMIT, p


# --- compiling -------------------------------------------------------------------------------

# label -> (target name, params; None: the baseline's)
BUILDS: dict[str, tuple[str, dict[str, Scalar] | None]] = {
    **{name: (name, None) for name in ALL_NAMES},
    "matmul-largest": ("matmul", {"TILE": 32, "WPT": 8, "UNROLL": 4}),
    "conv2d-largest": ("conv2d", {"BLOCK_X": 64, "BLOCK_Y": 16, "TILE": 4}),
}


@pytest.fixture(scope="module")
def compiled() -> dict[str, Compiled]:
    with ThreadPoolExecutor(max_workers=min(len(BUILDS), os.cpu_count() or 1)) as pool:
        futures = {label: pool.submit(compile_params, load_target(target_file(name)), params)
                   for label, (name, params) in BUILDS.items()}
        return {label: future.result() for label, future in futures.items()}


@needs_nvcc
@pytest.mark.parametrize("label", list(BUILDS))
def test_builds_for_sm90_with_the_engine_command(compiled: dict[str, Compiled], label: str) -> None:
    build = compiled[label]
    assert build.result.ok, build.result.tail()
    assert build.binary.is_file()
    assert any(arg.startswith("-I") and arg.endswith("cluster/compile/include") for arg in build.argv)
    assert [f"-D{k}={v}" for k, v in build.params.items()] == [a for a in build.argv if a.startswith("-D")]
    assert build.kernels, "no ptxas report"
    for kernel in build.kernels:
        assert kernel.arch == "sm_90"
        assert 0 < kernel.registers <= 255, kernel
        assert (kernel.spill_stores, kernel.spill_loads, kernel.stack_bytes) == (0, 0, 0), kernel
    build.kernel("wf_l2_flush")  # the harness is in


@needs_nvcc
@pytest.mark.parametrize("label", ["multikernel", "multikernel_opt"])
def test_multikernel_has_its_three_kernels(compiled: dict[str, Compiled], label: str) -> None:
    for name in ("poly_kernel", "oscillator_kernel", "combine_kernel"):
        assert compiled[label].kernel(name).shared_bytes == 0


@needs_nvcc
@pytest.mark.parametrize("label", ["matmul", "matmul-largest"])
def test_matmul_shared_memory_is_what_the_params_say(compiled: dict[str, Compiled], label: str) -> None:
    build = compiled[label]
    assert build.kernel("sgemm_tiled").shared_bytes == matmul_shared_bytes(build.params)


@needs_nvcc
def test_matmul_opt_keeps_its_8x8_tile_in_registers(compiled: dict[str, Compiled]) -> None:
    kernel = compiled["matmul_opt"].kernel("sgemm_register_blocked")
    assert kernel.shared_bytes == 2 * 8 * 128 * 4  # A (transposed) and B tiles, one k-step of 8
    assert kernel.registers >= 64  # the 64 accumulators; no spills (checked above)


@needs_nvcc
@pytest.mark.parametrize("label", ["conv2d", "conv2d-largest"])
def test_conv2d_shared_memory_is_what_the_params_say(compiled: dict[str, Compiled], label: str) -> None:
    build = compiled[label]
    assert build.kernel("conv2d").shared_bytes == conv2d_shared_bytes(build.params)


@needs_nvcc
def test_conv2d_opt_tile_is_32x32_with_its_halo(compiled: dict[str, Compiled]) -> None:
    hand_tuned = {"BLOCK_X": 32, "BLOCK_Y": 8, "TILE": 4}
    assert compiled["conv2d_opt"].kernel("conv2d_reuse").shared_bytes == conv2d_shared_bytes(hand_tuned)
