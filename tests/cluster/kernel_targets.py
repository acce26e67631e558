"""Kernel targets written on the fly for the kernel tests (sources in tests/fixtures/kernels/)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO

KERNELS = REPO / "tests" / "fixtures" / "kernels"
N = 1 << 16


def vadd_kernel(**fields: Any) -> dict[str, Any]:
    """The ``kernel:`` section of the vector add (c = a + b), ``fields`` replacing or adding."""
    kernel: dict[str, Any] = {
        "name": "vadd", "sizes": {"n": N}, "problem_size": ["n"], "grid_div_x": ["block_size_x", "ITEMS"],
        "arguments": [
            {"name": "c", "dtype": "float32", "shape": ["n"], "output": True},
            {"name": "a", "dtype": "float32", "shape": ["n"], "uniform": [-1.0, 1.0]},
            {"name": "b", "dtype": "float32", "shape": ["n"], "uniform": [-1.0, 1.0]},
            {"name": "n", "dtype": "int32", "value": "n"},
        ],
        "bench": {"min_time_s": 0.01},
    }
    kernel.update(fields)
    return kernel


def write_kernel_target(folder: Path, source: str = "vadd.cu", **fields: Any) -> Path:
    """A valid kernel target in ``folder``, the vector add; ``fields`` replace or add top-level
    fields (``kernel`` among them; None removes one)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KERNELS / source, folder / source)
    spec: dict[str, Any] = {
        "name": Path(source).stem, "kind": "kernel", "sources": [source],
        "kernel": vadd_kernel(),
        "params": {"block_size_x": [128, 256, 512], "ITEMS": [1, 2, 4]},
    }
    spec.update(fields)
    spec = {k: v for k, v in spec.items() if v is not None}
    path = folder / "target.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
