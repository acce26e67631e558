"""The four comparison kernels as warpfleet kernel targets (``kind: kernel``): the kernel text that
Kernel Tuner compiles (``spaces.kernel_text``), the same params, constraints, launch geometry,
inputs and check, measured in-process by warpfleet's kernel runner instead of a program per
configuration (``bench_kerneltuner.py --wf-kind kernel``).

The inputs are filled as the programs fill them: one ``wf::fill_uniform`` stream from the run's seed,
over the uniform arrays in argument order and then the ``__constant__`` symbols (matmul: A then B;
convolution: the padded image, then the filter), so that every tool sees the same values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scripts.kt_compare.spaces import (
    CONV_BORDER,
    CONV_FILTER,
    CONV_IMAGE,
    MATMUL_N,
    REDUCTION_MAX_BLOCKS,
    REDUCTION_N,
    STENCIL_N,
    KernelSpace,
    kernel_text,
)

_F32 = "float32"


def _uniform(name: str, count: Any, lo: float = -1.0, hi: float = 1.0) -> dict[str, Any]:
    return {"name": name, "dtype": _F32, "shape": [count], "uniform": [lo, hi]}


def _zeros(name: str, count: Any, **output: Any) -> dict[str, Any]:
    return {"name": name, "dtype": _F32, "shape": [count], "output": True, **output}


ARGUMENTS: dict[str, dict[str, Any]] = {
    "matmul": {"sizes": {"n": MATMUL_N}, "arguments": [
        {"name": "n", "dtype": "int32", "value": "n"}, _uniform("a", "n * n"), _uniform("b", "n * n"),
        _zeros("c", "n * n")]},
    "stencil": {"sizes": {"n": STENCIL_N}, "arguments": [
        {"name": "n", "dtype": "int32", "value": "n"}, _uniform("in", "n * n"), _zeros("out", "n * n")]},
    "convolution": {"sizes": {"side": CONV_IMAGE + CONV_BORDER}, "arguments": [
        _zeros("output", CONV_IMAGE * CONV_IMAGE), _uniform("input", "side * side")],
        "constants": [_uniform("d_filter", CONV_FILTER**2)]},
    "reduction": {"sizes": {"n": REDUCTION_N}, "arguments": [
        _zeros("partial", REDUCTION_MAX_BLOCKS, compare="sum"), _uniform("input", "n", 0.0, 1.0),
        {"name": "n", "dtype": "int32", "value": "n"}]},
}


def write_wf_kernel_target(space: KernelSpace, folder: Path, min_time_s: float) -> Path:
    """A kernel target for ``space`` in ``folder``: its kernel text, the params (as -D defines, like
    Kernel Tuner's), the same constraints and geometry, no compiler flags (a one-option space)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = f"{space.name}_kernel.cu"
    (folder / source).write_text(kernel_text(space))
    (folder / "space.yaml").write_text(yaml.safe_dump({"name": "params_only", "toolchain": "nvcc",
                                                      "flags": {"none": [""]}}))
    problem = [f"{p}" if isinstance(p, str) else p for p in space.problem_size]
    kernel: dict[str, Any] = {
        "name": space.kernel_name, **ARGUMENTS[space.name], "problem_size": problem,
        "block": list(space.block), "compiler_options": ["-std=c++17"],
        "bench": {"min_time_s": min_time_s},
    }
    for axis, divisors in zip("xyz", space.grid_div, strict=False):
        kernel[f"grid_div_{axis}"] = list(divisors)
    spec = {
        "name": space.name, "kind": "kernel", "toolchain": "nvcc", "space": "space.yaml", "sources": [source],
        "kernel": kernel, "params": {k: list(v) for k, v in space.params.items()},
        "defaults": dict(space.defaults), "constraints": list(space.constraints),
        "verify": {"rtol": space.rtol, "atol": space.atol}, "timeouts": {"build": 120, "run": 60},
    }
    path = folder / "target.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
