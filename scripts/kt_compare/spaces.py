"""The four kernels of the comparison, each defined once: parameter values, defaults, constraints,
launch geometry, inputs and correctness check. Both tools' inputs are derived from that one
definition: Kernel Tuner's ``tune_kernel`` arguments (``kt_arguments``) and warpfleet's target
(``write_wf_target``: the same params as ``-D`` defines, the same problem size, the same check).

Two kernels are the suite's (matmul, stencil): Kernel Tuner gets the kernel's text cut out of the
suite program (``kernel_text``), warpfleet the whole program. Two are written in Kernel Tuner's
own style (convolution, reduction): a kernel file that warpfleet's program includes.
"""

from __future__ import annotations

import itertools
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from search_spaces import compile_constraint

REPO = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parent / "kernels"
SUITE = REPO / "configs" / "targets"
AXES = "xyz"


def fill_uniform(n: int, seed: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    """``wf::fill_uniform`` (harness_core.hpp) in NumPy, to the bit: element i is lo + (hi - lo) * u_i,
    u_i the top 24 bits of the i-th splitmix64 output from ``seed``, rounded once to float32."""
    with np.errstate(over="ignore"):
        state = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (state ^ (state >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float64) * 2.0**-24
    # (hi - lo) * u + lo is exact in float64 for these ranges, so one rounding to float32: an fma.
    v = (np.float64(np.float32(hi) - np.float32(lo)) * u + np.float64(np.float32(lo))).astype(np.float32)
    top = np.nextafter(np.float32(hi), np.float32(lo))
    return np.where(v < np.float32(hi), v, top).astype(np.float32)


@dataclass(frozen=True)
class Inputs:
    """A kernel's arguments in Kernel Tuner's form (NumPy arrays and scalars, in the kernel's order),
    its constant-memory arguments, and which argument is the output."""

    arguments: list[Any]
    output: int
    cmem: dict[str, np.ndarray]


@dataclass(frozen=True)
class KernelSpace:
    name: str
    kernel_name: str
    source: Path  # the file that holds the kernel
    program: Path  # warpfleet's program: the suite program itself, or one that includes `source`
    params: dict[str, tuple[int, ...]]
    defaults: dict[str, int]
    constraints: tuple[str, ...]
    block: tuple[str, ...]  # threads per block in x, y, z: expressions over the params
    problem_size: tuple[int | str, ...]  # Kernel Tuner's meaning: grid = ceil(problem / grid_div)
    grid_div: tuple[tuple[str, ...], ...]
    run_args: tuple[str, ...]  # the program's own arguments (problem size)
    make_inputs: Callable[[int], Inputs]
    rtol: float
    atol: float
    compare_sums: bool = False  # the check compares the sums of the outputs (partial sums)
    output_dtype: str = "float32"  # of warpfleet's out.bin

    @property
    def names(self) -> list[str]:
        return list(self.params)

    def satisfies(self, config: Mapping[str, int]) -> bool:
        return all(compile_constraint(expr, self.params)(config) for expr in self.constraints)

    def configs(self) -> list[dict[str, int]]:
        """Every valid point, in the order of the product of the values (warpfleet's meaning)."""
        points = (dict(zip(self.names, values, strict=True)) for values in itertools.product(*self.params.values()))
        return [p for p in points if self.satisfies(p)]

    def threads(self, config: Mapping[str, int]) -> tuple[int, int, int]:
        x, y, z = [*(evaluate(expr, config) for expr in self.block), 1, 1, 1][:3]
        return x, y, z

    def grid(self, config: Mapping[str, int]) -> tuple[int, int, int]:
        dims = []
        for size, divisors in zip(self.problem_size, self.grid_div, strict=True):
            extent = config[size] if isinstance(size, str) else size
            dims.append(math.ceil(extent / math.prod(config[d] for d in divisors)))
        x, y, z = [*dims, 1, 1, 1][:3]
        return x, y, z

    def outputs_match(self, got: np.ndarray, want: np.ndarray) -> bool:
        """The correctness check both tools and the independent timer apply: within rtol/atol of
        the baseline configuration's output (its total, for partial sums)."""
        if self.compare_sums:
            g, w = float(np.sum(got, dtype=np.float64)), float(np.sum(want, dtype=np.float64))
            return math.isfinite(g) and abs(g - w) <= self.rtol * abs(w) + self.atol
        return got.shape == want.shape and bool(np.isfinite(got).all()) and \
            bool(np.allclose(got, want, rtol=self.rtol, atol=self.atol))


def evaluate(expr: str, config: Mapping[str, int]) -> int:
    """An integer expression over params (a block dimension). The expressions are this module's
    own constants, never input, and see no builtins."""
    return int(eval(expr, {"__builtins__": {}}, dict(config)))


def config_key(config: Mapping[str, Any], names: Sequence[str]) -> str:
    """The canonical name of a configuration, the same for both tools: ``TILE=16,WPT=2,UNROLL=4``."""
    return ",".join(f"{name}={int(config[name])}" for name in names)


# --- the kernel text both tools compile ---------------------------------------------------------


def kernel_text(space: KernelSpace) -> str:
    """The source Kernel Tuner compiles: the kernel file, or for a suite program the text after its
    last #include up to the end of the kernel (macro defaults, constants, the kernel itself)."""
    text = space.source.read_text()
    if space.source != space.program:
        return text
    lines = text.splitlines(keepends=True)
    last_include = max(i for i, line in enumerate(lines) if line.lstrip().startswith("#include"))
    body = "".join(lines[last_include + 1:])
    start = body.index(f" {space.kernel_name}(")
    return body[:_closing_brace(body, body.index("{", start)) + 1] + "\n"


def _closing_brace(text: str, open_at: int) -> int:
    """The index of the brace that closes the one at ``open_at``, skipping comments and literals."""
    depth, i = 0, open_at
    while i < len(text):
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 1
        elif text[i] in "\"'":
            i = text.index(text[i], i + 1)  # the suite kernels hold no escaped quotes
        elif text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


# --- Kernel Tuner's arguments -------------------------------------------------------------------


def kt_tune_params(space: KernelSpace) -> tuple[dict[str, list[int]], list[str], list[str]]:
    """``tune_params``, ``restrictions`` and ``block_size_names`` for Kernel Tuner. It reads block
    dimensions from params only, so a dimension that is an expression (matmul's TILE // WPT) becomes
    a derived param ``kt_block_y`` tied to it by a restriction: the valid points are the same."""
    tune_params = {name: list(values) for name, values in space.params.items()}
    restrictions = list(space.constraints)
    names = []
    valid = space.configs()
    for axis, expr in zip(AXES, space.block, strict=False):
        if expr in space.params:
            names.append(expr)
            continue
        derived = f"kt_block_{axis}"
        tune_params[derived] = sorted({evaluate(expr, c) for c in valid})
        restrictions.append(f"{derived} == {expr}")
        names.append(derived)
    return tune_params, restrictions, names


def kt_arguments(space: KernelSpace, inputs: Inputs) -> dict[str, Any]:
    """Everything ``tune_kernel`` needs besides the strategy, the budget and the answer."""
    tune_params, restrictions, block_names = kt_tune_params(space)
    divs = list(space.grid_div) + [()] * (3 - len(space.grid_div))
    return {
        "kernel_name": space.kernel_name, "kernel_source": kernel_text(space),
        "problem_size": tuple(space.problem_size), "arguments": inputs.arguments,
        "tune_params": tune_params, "restrictions": restrictions, "block_size_names": block_names,
        "grid_div_x": list(divs[0]), "grid_div_y": list(divs[1]), "grid_div_z": list(divs[2]),
        "cmem_args": dict(inputs.cmem) or None, "lang": "cupy", "compiler_options": ["-std=c++17"],
    }


def kt_verify(space: KernelSpace) -> Callable[..., bool]:
    """Kernel Tuner's ``verify``: every output the answer names must pass ``outputs_match``."""

    def verify(answer: list[Any], result: list[Any], atol: float | None = None) -> bool:
        return all(want is None or space.outputs_match(np.asarray(got), np.asarray(want))
                   for want, got in zip(answer, result, strict=True))

    return verify


# --- warpfleet's target -------------------------------------------------------------------------


def write_wf_target(space: KernelSpace, folder: Path, harness_args: Sequence[str]) -> Path:
    """A warpfleet target for ``space`` in ``folder``: the program (and kernel file), the params as
    -D defines, the same constraints, no compiler flags (the flags space has one empty option)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [space.program] + ([space.source] if space.source != space.program else [])
    for file in files:
        shutil.copyfile(file, folder / file.name)
    (folder / "space.yaml").write_text(yaml.safe_dump({"name": "params_only", "toolchain": "nvcc",
                                                      "flags": {"none": [""]}}))
    spec = {
        "name": space.name, "toolchain": "nvcc", "space": "space.yaml",
        "sources": [space.program.name], "files": [f.name for f in files[1:]],
        "build": ["nvcc", "{flags}", "{defines}", "{harness_include}", "-std=c++17", "-arch={arch}",
                  "-o", "{binary}", "{sources}"],
        "run": ["{binary}", "--seed", "{seed}", *space.run_args, *harness_args],
        "params": {k: list(v) for k, v in space.params.items()}, "defaults": dict(space.defaults),
        "constraints": list(space.constraints),
        "verify": {"outputs": [{"path": "out.bin", "dtype": space.output_dtype}], "rtol": space.rtol,
                   "atol": space.atol},
        "timeouts": {"build": 120, "run": 60},
    }
    path = folder / "target.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# --- the four kernels ---------------------------------------------------------------------------

MATMUL_N, STENCIL_N, REDUCTION_N = 1024, 2048, 1 << 24
CONV_IMAGE, CONV_FILTER, CONV_BORDER = 1024, 17, 16
REDUCTION_MAX_BLOCKS = 2048


def _matmul_inputs(seed: int) -> Inputs:
    n = MATMUL_N
    ab = fill_uniform(2 * n * n, seed)  # A then B, one stream, as matmul.cu fills them
    return Inputs([np.int32(n), ab[:n * n], ab[n * n:], np.zeros(n * n, np.float32)], 3, {})


def _stencil_inputs(seed: int) -> Inputs:
    n = STENCIL_N
    return Inputs([np.int32(n), fill_uniform(n * n, seed), np.zeros(n * n, np.float32)], 2, {})


def _convolution_inputs(seed: int) -> Inputs:
    side = CONV_IMAGE + CONV_BORDER
    values = fill_uniform(side * side + CONV_FILTER**2, seed)  # the padded image, then the filter
    output = np.zeros(CONV_IMAGE * CONV_IMAGE, np.float32)
    return Inputs([output, values[:side * side]], 0, {"d_filter": values[side * side:]})


def _reduction_inputs(seed: int) -> Inputs:
    partial = np.zeros(REDUCTION_MAX_BLOCKS, np.float32)
    return Inputs([partial, fill_uniform(REDUCTION_N, seed, 0.0, 1.0), np.int32(REDUCTION_N)], 0, {})


KERNEL_SPACES: dict[str, KernelSpace] = {s.name: s for s in (
    KernelSpace(
        name="matmul", kernel_name="sgemm_tiled", source=SUITE / "matmul" / "matmul.cu",
        program=SUITE / "matmul" / "matmul.cu",
        params={"TILE": (8, 16, 32), "WPT": (1, 2, 4, 8), "UNROLL": (1, 2, 4, 8, 16)},
        defaults={"TILE": 16, "WPT": 1, "UNROLL": 1},
        constraints=("TILE % WPT == 0", "TILE * (TILE // WPT) >= 32", "TILE * (TILE // WPT) <= 1024",
                     "2 * TILE * TILE * 4 <= 49152"),
        block=("TILE", "TILE // WPT"), problem_size=(MATMUL_N, MATMUL_N), grid_div=(("TILE",), ("TILE",)),
        run_args=("--n", str(MATMUL_N)), make_inputs=_matmul_inputs, rtol=1e-3, atol=1e-4),
    KernelSpace(
        name="stencil", kernel_name="jacobi_step", source=SUITE / "stencil" / "stencil.cu",
        program=SUITE / "stencil" / "stencil.cu",
        params={"BLOCK_X": (32, 64, 128, 256), "BLOCK_Y": (1, 2, 4, 8, 16), "OUTPUTS_Y": (1, 2, 4, 8)},
        defaults={"BLOCK_X": 32, "BLOCK_Y": 8, "OUTPUTS_Y": 1},
        constraints=("BLOCK_X * BLOCK_Y >= 64", "BLOCK_X * BLOCK_Y <= 1024"),
        block=("BLOCK_X", "BLOCK_Y"), problem_size=(STENCIL_N, STENCIL_N),
        grid_div=(("BLOCK_X",), ("BLOCK_Y", "OUTPUTS_Y")), run_args=("--n", str(STENCIL_N)),
        make_inputs=_stencil_inputs, rtol=1e-5, atol=1e-6),
    KernelSpace(
        name="convolution", kernel_name="convolution_kernel", source=KERNELS / "convolution.cu",
        program=KERNELS / "convolution_main.cu",
        params={"block_size_x": (16, 32, 64), "block_size_y": (1, 2, 4, 8, 16), "tile_size_x": (1, 2, 4),
                "tile_size_y": (1, 2, 4)},
        defaults={"block_size_x": 16, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1},
        constraints=("block_size_x * block_size_y >= 32", "block_size_x * block_size_y <= 1024",
                     "(block_size_y * tile_size_y + 16) * (block_size_x * tile_size_x + 16) * 4 <= 49152"),
        block=("block_size_x", "block_size_y"), problem_size=(CONV_IMAGE, CONV_IMAGE),
        grid_div=(("block_size_x", "tile_size_x"), ("block_size_y", "tile_size_y")), run_args=(),
        make_inputs=_convolution_inputs, rtol=1e-5, atol=1e-5),
    KernelSpace(
        name="reduction", kernel_name="sum_floats", source=KERNELS / "reduction.cu",
        program=KERNELS / "reduction_main.cu",
        params={"block_size_x": (128, 256, 512, 1024), "vector_width": (1, 2, 4),
                "num_blocks": (256, 512, 1024, 2048), "use_shuffle": (0, 1)},
        defaults={"block_size_x": 256, "vector_width": 1, "num_blocks": 512, "use_shuffle": 0},
        constraints=(), block=("block_size_x",), problem_size=("num_blocks",), grid_div=((),),
        run_args=("--n", str(REDUCTION_N)), make_inputs=_reduction_inputs, rtol=1e-5, atol=0.0,
        compare_sums=True, output_dtype="float64"),
)}
