"""The suite's CUDA stencil (configs/targets/stencil): it loads with the suite's build and seeded run,
its space is the 64 block shapes and row counts its comments promise, its check and output are
read-only, and its baseline and largest point compile for sm_90 through the engine."""

from __future__ import annotations

import pytest

from cluster.compile.build import compile_candidate
from cluster.config import load_run, load_target
from cluster.core.types import Candidate, Status
from tests.conftest import REPO, needs

TARGET = REPO / "configs" / "targets" / "stencil" / "target.yaml"


def test_stencil_loads_like_the_other_suite_targets() -> None:
    target = load_target(TARGET)
    spec = target.spec
    assert (target.name, spec.toolchain, target.space.name) == ("stencil", "nvcc", "nvcc")
    assert spec.run[:3] == ["{binary}", "--seed", "{seed}"] and "{harness_include}" in spec.build
    assert [o.path for o in spec.verify.outputs] == ["out.bin"]
    assert target.baseline_params == {"BLOCK_X": 32, "BLOCK_Y": 8, "OUTPUTS_Y": 1}
    assert "targets/stencil/target.yaml" in load_run(REPO / "configs" / "suite.yaml").config.targets


def test_stencil_space_is_the_block_shapes_within_two_warps_and_1024_threads() -> None:
    target = load_target(TARGET)
    points = [dict(zip(["BLOCK_X", "BLOCK_Y"], (x, y), strict=True)) for x in (32, 64, 128, 256)
              for y in (1, 2, 4, 8, 16)]
    shapes = [p for p in points if target.satisfies({**p, "OUTPUTS_Y": 1})]
    assert len(shapes) == 16 and all(64 <= p["BLOCK_X"] * p["BLOCK_Y"] <= 1024 for p in shapes)
    flag_points = 3 * 10 * 2 * 3 * 2  # the nvcc flags space: opt level, registers, fast math, dlcm, vectorization
    assert target.space_size() == 16 * 4 * flag_points


def test_stencil_check_and_output_are_read_only() -> None:
    from agents.patch import readonly_regions

    text = TARGET.with_name("stencil.cu").read_text()
    guarded = {line for begin, end in readonly_regions(text) for line in range(begin, end + 1)}
    for marker in ("cudaMemcpyDeviceToHost", "wf::write_output(", "check(in, out, n)"):
        where = [i + 1 for i, line in enumerate(text.splitlines()) if marker in line]
        assert where and all(line in guarded for line in where), marker


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("params", [None, {"BLOCK_X": 256, "BLOCK_Y": 4, "OUTPUTS_Y": 8}])
def test_stencil_compiles_for_sm90(params: dict[str, int] | None) -> None:
    target = load_target(TARGET)
    chosen = target.baseline_params if params is None else params
    candidate = Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash, (), tuple(chosen.items()))
    artifact = compile_candidate(target, candidate)
    assert artifact.status == Status.OK, artifact.error_tail
    (kernel,) = [k for k in artifact.kernels if "jacobi_step" in k.kernel]
    assert kernel.arch == "sm_90" and (kernel.spill_stores, kernel.spill_loads) == (0, 0)
