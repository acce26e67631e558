"""The padding expert: which shared tiles it pads (rows a multiple of 128 bytes, read column-wise,
conflicts in the profile when there is one), how (the last dimension only, through the patch
tools), and that the padded transpose compiles with one more column of shared memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.experts.padding import BANK_CONFLICTS_METRIC, PaddingExpert, find_padding
from agents.patch import Patched, variant_bundle
from cluster.config import Target, load_target
from cluster.core.types import Candidate, Status
from tests.configs._builds import SUITE_BUILDS, build_once
from tests.conftest import needs

TRANSPOSE = Path(__file__).resolve().parents[2] / "configs" / "targets" / "transpose"
ARCH = "sm_90"


def context(target: Target, metrics: dict[str, float] | None = None) -> AnalysisContext:
    return AnalysisContext(target, ARCH, metrics=metrics or {})


def kernel_target(folder: Path, source: str, params: dict[str, list[int]] | None = None) -> Target:
    """A one-file target around `source` (kernel.cu)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(source)
    spec = {"name": "k", "toolchain": "nvcc", "sources": ["kernel.cu"], "run": ["{binary}"], "params": params or {}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec))
    return load_target(folder / "target.yaml")


def patched_text(proposal: Proposal, path: str) -> str:
    files = dict(proposal.files)
    assert list(files) == [path]
    return files[path]


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    old, new = before.split("\n"), after.split("\n")
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new, strict=True) if a != b]


# --- the transpose targets ------------------------------------------------------------------


def test_pads_the_transpose_tile_and_nothing_else() -> None:
    target = load_target(TRANSPOSE / "target.yaml")
    proposals = PaddingExpert().propose(context(target))
    assert len(proposals) == 1
    proposal = proposals[0]
    assert proposal.agent == "padding" and "tile" in proposal.description and "32-way" in proposal.description
    original = (TRANSPOSE / "transpose.cu").read_text()
    text = patched_text(proposal, "transpose.cu")
    assert changed_lines(original, text) == [("  __shared__ float tile[TILE][TILE + PAD];",
                                              "  __shared__ float tile[TILE][TILE + PAD + 1];")]
    defines = target.baseline_params
    before = analyze(original, defines=defines).shared[0]
    after = analyze(text, defines=defines).shared
    assert [(a.name, a.dim_values) for a in after] == [("tile", (32, 33))]
    assert [a.indices for a in after[0].accesses] == [a.indices for a in before.accesses]  # indexing untouched


def test_the_hand_padded_transpose_gets_nothing() -> None:
    target = load_target(TRANSPOSE / "target_opt.yaml")
    assert PaddingExpert().propose(context(target)) == []
    [finding] = find_padding(context(target))
    assert finding.array.dim_values == (32, 33) and not finding.pad and "132 B" in finding.reason


def test_the_profile_vetoes_or_confirms() -> None:
    target = load_target(TRANSPOSE / "target.yaml")
    assert PaddingExpert().propose(context(target, {BANK_CONFLICTS_METRIC: 0.0})) == []
    [proposal] = PaddingExpert().propose(context(target, {BANK_CONFLICTS_METRIC: 65.6e6}))
    assert f"{BANK_CONFLICTS_METRIC} = 6.56e+07" in proposal.description
    # Other metrics say nothing about shared-memory bank conflicts.
    assert len(PaddingExpert().propose(context(target, {"sm__throughput.avg.pct_of_peak_sustained_elapsed": 0}))) == 1


@pytest.mark.nvcc
@needs("nvcc")
@SUITE_BUILDS  # the padded variant's build is shared with the workflow's test of transpose
def test_padded_transpose_compiles_with_one_more_column_of_shared_memory(tmp_path: Path) -> None:
    target = load_target(TRANSPOSE / "target.yaml")
    [proposal] = PaddingExpert().propose(context(target))
    padded = dataclasses.replace(target, bundle=variant_bundle(target, Patched(proposal.files, "", 1)))
    candidate = Candidate(target=target.name, toolchain="nvcc", device_type="t", arch=ARCH,
                          source_hash=padded.bundle.hash, flags=(), params=tuple(target.baseline_params.items()))
    artifact = build_once(padded, candidate, tmp_path)
    assert artifact.status == Status.OK, artifact.error_tail
    [kernel] = [k for k in artifact.kernels if "transpose" in k.kernel]
    assert kernel.shared_bytes == 32 * 33 * 4 == 4224  # the baseline's is 32 * 32 * 4 = 4096


# --- which arrays ---------------------------------------------------------------------------

ACCESSES = r"""#define N 32
__global__ void k(float* out) {
  __shared__ float rowwise[N][N];
  __shared__ float bywarp[N][N];
  __shared__ int derived[N][32];
  __shared__ float narrow[N][16];
  int tx = threadIdx.x;
  const int lane = tx % 32;
  int warp = threadIdx.x / 32;
  int col = blockIdx.x + threadIdx.y;
  rowwise[threadIdx.y][threadIdx.x] = out[tx];
  bywarp[warp][lane] = rowwise[col][(threadIdx.x + 1) % N];
  derived[lane][threadIdx.y] = 1;
  narrow[threadIdx.x][0] = 2.0f;
  __syncthreads();
  out[tx] = rowwise[threadIdx.y][lane] + bywarp[warp][0] + derived[threadIdx.y][0] + narrow[0][0];
}
"""


def test_only_column_wise_conflicting_tiles_are_padded(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, ACCESSES)
    verdicts = {f.array.name: f for f in find_padding(context(target))}
    assert {name for name, f in verdicts.items() if f.pad} == {"derived"}  # `lane` derives from threadIdx.x
    for name in ("rowwise", "bywarp"):  # a first index of threadIdx.y, or threadIdx.x / 32: one row per warp
        assert "no column-wise access" in verdicts[name].reason
    assert "64 B" in verdicts["narrow"].reason  # 16 floats a row: rows already start in different banks
    [proposal] = PaddingExpert().propose(context(target))
    assert changed_lines(ACCESSES, patched_text(proposal, "kernel.cu")) == [
        ("  __shared__ int derived[N][32];", "  __shared__ int derived[N][32 + 1];")]


def test_row_wise_access_only_is_left_alone(tmp_path: Path) -> None:
    source = ACCESSES.replace("derived[lane][threadIdx.y] = 1;", "derived[threadIdx.y][lane] = 1;")
    assert PaddingExpert().propose(context(kernel_target(tmp_path, source))) == []


READONLY = r"""#ifndef TILE
#define TILE 16
#endif
// warpfleet: readonly begin
__shared__ float frozen[32][32];
// warpfleet: readonly end
__global__ void k(float* out) {
  __shared__ float free_tile[TILE][TILE];
  free_tile[threadIdx.y][threadIdx.x] = out[threadIdx.x];
  frozen[threadIdx.y][threadIdx.x] = out[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = free_tile[threadIdx.x][threadIdx.y] + frozen[threadIdx.x][threadIdx.y];
}
"""


def test_a_declaration_in_a_read_only_region_is_left_alone(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, READONLY, params={"TILE": [32]})  # TILE resolved from the baseline params
    verdicts = {f.array.name: f for f in find_padding(context(target))}
    assert not verdicts["frozen"].pad and "read-only" in verdicts["frozen"].reason
    [proposal] = PaddingExpert().propose(context(target))
    assert changed_lines(READONLY, patched_text(proposal, "kernel.cu")) == [
        ("  __shared__ float free_tile[TILE][TILE];", "  __shared__ float free_tile[TILE][TILE + 1];")]


def test_the_row_length_is_resolved_with_the_baseline_params(tmp_path: Path) -> None:
    # TILE = 16 by the file's default: 64-byte rows, no conflict to pad away.
    target = kernel_target(tmp_path, READONLY.replace("__shared__ float frozen[32][32];", ""))
    assert PaddingExpert().propose(context(target)) == []


# --- 8-byte elements, odd dimension expressions, dynamic arrays -------------------------------

DOUBLES = r"""__global__ void k(double* out) {
  __shared__ double wide[16][16];
  __shared__ double wider[16][24];
  __shared__ float shifted[8][1 << 5];
  extern __shared__ float dynamic_tile[];
  int lane = threadIdx.x;
  wide[lane][0] = out[lane];
  wider[lane][0] = out[lane];
  shifted[lane % 8][0] = dynamic_tile[lane];
  out[lane] = wide[0][lane] + wider[0][lane] + shifted[0][lane];
}
"""


def test_eight_byte_elements_pad_by_one_element_when_rows_span_128_bytes(tmp_path: Path) -> None:
    # 16 doubles = 128 B a row: a half-warp wavefront of 16 lanes reads one bank pair, 16-way.
    # 24 doubles = 192 B: rows start 16 banks apart, two lanes a bank pair at most; not padded.
    target = kernel_target(tmp_path, DOUBLES)
    verdicts = {f.array.name: f for f in find_padding(context(target))}
    assert verdicts["wide"].pad and "16-way" in verdicts["wide"].reason and "bank pair" in verdicts["wide"].reason
    assert not verdicts["wider"].pad and "192 B" in verdicts["wider"].reason
    proposals = {p.description.split()[1]: p for p in PaddingExpert().propose(context(target))}
    assert set(proposals) == {"kernel.cu:2", "kernel.cu:4"}
    wide = patched_text(proposals["kernel.cu:2"], "kernel.cu")
    assert changed_lines(DOUBLES, wide) == [("  __shared__ double wide[16][16];",
                                             "  __shared__ double wide[16][16 + 1];")]
    assert analyze(wide).shared[0].dim_values == (16, 17)


def test_a_low_precedence_dimension_is_parenthesised(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, DOUBLES)
    proposals = PaddingExpert().propose(context(target))
    [proposal] = [p for p in proposals if p.description.startswith("pad kernel.cu:4 shifted")]
    text = patched_text(proposal, "kernel.cu")
    assert changed_lines(DOUBLES, text) == [("  __shared__ float shifted[8][1 << 5];",
                                             "  __shared__ float shifted[8][(1 << 5) + 1];")]
    assert [a.dim_values for a in analyze(text).shared if a.name == "shifted"] == [(8, 33)]


def test_dynamic_arrays_are_reported_not_changed(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, DOUBLES)
    verdicts = {f.array.name: f for f in find_padding(context(target))}
    assert not verdicts["dynamic_tile"].pad and "extern __shared__" in verdicts["dynamic_tile"].reason
    proposals = PaddingExpert().propose(context(target))
    assert proposals and all("Dynamic shared arrays, not changed: kernel.cu:5 dynamic_tile[]" in p.description
                             for p in proposals)
    assert all("extern __shared__ float dynamic_tile[];" in patched_text(p, "kernel.cu") for p in proposals)


def test_the_profile_is_needed_only_where_a_tile_would_be_padded() -> None:
    """The analyst waits for Nsight Compute only where the source has a tile it would pad: the hand-
    padded transpose and a program without 2D shared tiles spare the GPU the profile."""
    expert = PaddingExpert()
    assert expert.needs_profile(context(load_target(TRANSPOSE / "target.yaml")))
    assert not expert.needs_profile(context(load_target(TRANSPOSE / "target_opt.yaml")))
    assert not expert.needs_profile(context(load_target(TRANSPOSE.parent / "saxpy" / "target.yaml")))
