"""Template kernels: their instances resolved from the launches' template arguments (constants,
-D params, defaults, types carrying constants), and the experts that size things by them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext
from agents.cuda_source import analyze
from agents.experts import PaddingExpert, UnrollExpert
from agents.experts.padding import find_padding
from tests.agents.test_padding import changed_lines, kernel_target, patched_text
from tests.conftest import needs

ARCH = "sm_90"

# A tiled transpose written as a template, launched with a host constant, a -D param and a type
# whose static member sizes the tile (the shapes of the CUDA samples).
TRANSPOSE = r"""#include <cuda_runtime.h>
#ifndef TILE
#define TILE 16
#endif
struct Wide { static constexpr int kTile = 32; };

template <int BLOCK_SIZE, int ROWS = BLOCK_SIZE / 4>
__global__ void transpose(float* out, const float* in, int n) {
  __shared__ float tile[BLOCK_SIZE][BLOCK_SIZE];
  const int x = blockIdx.x * BLOCK_SIZE + threadIdx.x, y = blockIdx.y * BLOCK_SIZE + threadIdx.y;
  for (int j = 0; j < BLOCK_SIZE; j += ROWS) tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * n + x];
  __syncthreads();
  const int tx = blockIdx.y * BLOCK_SIZE + threadIdx.x, ty = blockIdx.x * BLOCK_SIZE + threadIdx.y;
  for (int j = 0; j < BLOCK_SIZE; j += ROWS) out[(ty + j) * n + tx] = tile[threadIdx.x][threadIdx.y + j];
}

template <class Cfg>
__global__ void copy_tile(float* out, const float* in) {
  __shared__ float staged[Cfg::kTile][Cfg::kTile];
  staged[threadIdx.y][threadIdx.x] = in[threadIdx.y * Cfg::kTile + threadIdx.x];
  __syncthreads();
  out[threadIdx.y * Cfg::kTile + threadIdx.x] = staged[threadIdx.y][threadIdx.x];
}

void run(float* out, const float* in, int n) {
  const int small = 8;
  transpose<small><<<dim3(n / small, n / small), dim3(small, 2)>>>(out, in, n);
  transpose<TILE><<<dim3(n / TILE, n / TILE), dim3(TILE, TILE / 4)>>>(out, in, n);
  copy_tile<Wide><<<1, dim3(32, 32)>>>(out, in);
}
"""


def context(tmp_path: Path, tile: int | None = 32) -> AnalysisContext:
    params = {"TILE": [tile]} if tile is not None else None
    return AnalysisContext(kernel_target(tmp_path, TRANSPOSE, params), ARCH)


def test_instances_resolve_constants_params_defaults_and_type_members() -> None:
    model = analyze(TRANSPOSE, defines={"TILE": 32})
    found = {(k.name, k.template_values): k for k in model.instances}
    assert set(found) == {("transpose", (("BLOCK_SIZE", 8), ("ROWS", 2))),
                          ("transpose", (("BLOCK_SIZE", 32), ("ROWS", 8))),  # -DTILE=32, ROWS by its default
                          ("copy_tile", (("Cfg", "Wide"),))}
    wide = found[("transpose", (("BLOCK_SIZE", 32), ("ROWS", 8)))]
    assert wide.shared[0].dim_values == (32, 32)
    assert [loop.trip_count for loop in wide.loops] == [4, 4]
    assert found[("copy_tile", (("Cfg", "Wide"),))].shared[0].dim_values == (32, 32)
    generic = model.kernel("transpose")  # the definition itself stays unresolved
    assert generic.shared[0].dim_values == (None, None) and generic.loops[0].trip_param == "BLOCK_SIZE"
    assert [launch.template_values for launch in model.launches] == [(8,), (32,), ("Wide",)]


def test_the_file_default_applies_without_the_param() -> None:
    model = analyze(TRANSPOSE)
    assert {k.template_values for k in model.instances if k.name == "transpose"} == {
        (("BLOCK_SIZE", 8), ("ROWS", 2)), (("BLOCK_SIZE", 16), ("ROWS", 4))}


def test_padding_pads_the_template_tile_for_the_instance_that_conflicts(tmp_path: Path) -> None:
    findings = {f.array.name: f for f in find_padding(context(tmp_path))}
    tile = findings["tile"]
    assert tile.pad and tile.instance == "transpose<BLOCK_SIZE=32, ROWS=8>"
    assert tile.reason.startswith("transpose<BLOCK_SIZE=32, ROWS=8>: 4-byte elements, row of 32 = 128 B")
    assert not findings["staged"].pad and "no column-wise access" in findings["staged"].reason
    [proposal] = PaddingExpert().propose(context(tmp_path / "again"))
    assert changed_lines(TRANSPOSE, patched_text(proposal, "kernel.cu")) == [
        ("  __shared__ float tile[BLOCK_SIZE][BLOCK_SIZE];", "  __shared__ float tile[BLOCK_SIZE][BLOCK_SIZE + 1];")]


def test_padding_leaves_the_tile_when_no_instance_conflicts(tmp_path: Path) -> None:
    # TILE = 16 by the file's default, and 8 for `small`: rows of 64 and 32 bytes.
    findings = {f.array.name: f for f in find_padding(context(tmp_path, tile=None))}
    assert not findings["tile"].pad and findings["tile"].reason == (
        "transpose<BLOCK_SIZE=8, ROWS=2>: row of 8 x 4 B = 32 B is not a multiple of 128 B: rows already start in "
        "different banks; transpose<BLOCK_SIZE=16, ROWS=4>: row of 16 x 4 B = 64 B is not a multiple of 128 B: rows "
        "already start in different banks")
    assert PaddingExpert().propose(context(tmp_path / "again", tile=None)) == []


def test_unroll_reads_the_trip_count_the_instances_agree_on(tmp_path: Path) -> None:
    single = TRANSPOSE.replace("  transpose<small><<<dim3(n / small, n / small), dim3(small, 2)>>>(out, in, n);\n", "")
    proposals = UnrollExpert().propose(AnalysisContext(kernel_target(tmp_path, single, {"TILE": [32]}), ARCH))
    assert [p.search_params for p in proposals] == [{}, {}]  # 32 / 8 = 4 trips each: full unrolls
    assert all("trip count 4 is a small constant" in p.description for p in proposals)
    both = UnrollExpert().propose(context(tmp_path / "both"))  # 8 / 2 and 32 / 8: both 4
    assert [p.search_params for p in both] == [{}, {}]


@pytest.mark.nvcc
@needs("nvcc")
def test_the_padded_template_compiles(tmp_path: Path) -> None:
    [proposal] = PaddingExpert().propose(context(tmp_path / "t"))
    source = tmp_path / "padded.cu"
    source.write_text(patched_text(proposal, "kernel.cu"))
    done = subprocess.run(["nvcc", f"-arch={ARCH}", "-DTILE=32", "-c", str(source), "-o", str(tmp_path / "p.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
