"""The shared-staging expert: a `__constant__` table read at run-time indices, in a kernel whose warps
stall on constant-cache misses, is copied into shared memory first in the kernel; the reasons where
not (no profile, another stall on top, compile-time indices, too large, shadowed); the variant
builds and passes the static checks, and (on a GPU) gives the baseline's outputs where a planted
short copy does not."""

from __future__ import annotations

import dataclasses

import pytest

from agents._base import AnalysisContext, Proposal
from agents.experts.shared_stage import IMC, STALL_PREFIX, SharedStageExpert
from agents.patch import variant_target
from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, KernelResources, Phase
from cluster.engine.verification.verify import static_verdicts
from tests.agents.test_padding import kernel_target
from tests.conftest import REPO, gpu_present, needs

ARCH = "sm_90"
UNROLL = REPO / "configs" / "targets" / "unroll" / "target.yaml"

SOURCE = r"""#include <cuda_runtime.h>
#define kMaxTaps 1024
__constant__ float c_taps[kMaxTaps];
__constant__ float c_coef[8];
__constant__ int c_lut[16];
__constant__ float c_big[8192];
__constant__ float c_grid[4][4];

__global__ void fir(const float* x, float* out, int taps) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float sum = 0.0f;
  for (int t = 0; t < taps; ++t) sum = fmaf(c_taps[t], x[i + t], sum);
  out[i] = sum;
}
__global__ void fixed(const float* x, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) sum += c_coef[k] * x[i + k];
  out[i] = sum;
}
__global__ void by_thread(int* out) {
  out[threadIdx.x] = c_lut[threadIdx.x % 16];
}
__global__ void big(float* out, int n) {
  float s = 0.0f;
  for (int k = 0; k < n; ++k) s += c_big[k];
  out[threadIdx.x] = s;
}
__global__ void shadow(float* out, int n) {
  float c_taps[4] = {1, 2, 3, 4};
  out[threadIdx.x] = c_taps[n % 4];
}
__global__ void grid(float* out, int r) {
  out[threadIdx.x] = c_grid[r][threadIdx.x % 4];
}
__global__ void plain(float* out) { out[threadIdx.x] = 1.0f; }
__global__ void header_bound(float* out) {  // RADIUS comes from a header this file does not show
  float s = 0.0f;
#pragma unroll
  for (int j = -RADIUS; j <= RADIUS; j++) s += c_coef[RADIUS - j];
  out[threadIdx.x] = s;
}
__global__ void derived(float* out) {
  float s = 0.0f;
#pragma unroll
  for (int r = 0; r < 6; ++r)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int k = r - t;
      if (k >= 0) s += c_coef[k];
    }
  out[threadIdx.x] = s;
}
__constant__ float c_poly[4];
__device__ float head(const float* p) { return p[0]; }
__global__ void whole(float* out) { out[threadIdx.x] = head(c_poly); }

int main() { return 0; }
"""


def profile(imc: float, other: float = 0.5) -> dict[str, float]:
    return {IMC: imc, f"{STALL_PREFIX}long_scoreboard_per_issue_active.ratio": other}


def findings(tmp_path, metrics: dict[str, float], kernels: tuple[KernelResources, ...] = ()) -> dict:
    context = AnalysisContext(kernel_target(tmp_path, SOURCE), ARCH, kernels=kernels, metrics=metrics)
    return {f.location.split()[-1]: f for f in SharedStageExpert().analyse(context)}


def test_tables_read_at_run_time_indices_are_staged_where_the_constant_cache_stalls(tmp_path):
    found = findings(tmp_path, profile(46.6))
    assert {k for k, f in found.items() if f.applies} == {"fir", "by_thread", "grid", "whole"}
    assert "`c_taps[t]` (line 12): `t` varies at run time" in found["fir"].reason
    assert any("46.60 cycles per issued instruction" in e for e in found["fir"].evidence)
    assert "4096 B staged" in found["fir"].reason
    # Each reason where it does not apply.
    assert "compile-time indices only" in found["fixed"].reason  # unrolled: constant-bank operands
    assert "over the 16384 B staged" in found["big"].reason  # 32 KB
    assert "a local of the kernel is named c_taps" in found["shadow"].reason
    assert found["plain"].reason == "reads no __constant__ array"
    # Compile-time after unrolling: a bare pragma over a header's macro bounds; a const local of
    # unrolled loop variables. A table handed on whole has indices the analysis does not see.
    assert "compile-time indices only" in found["header_bound"].reason
    assert "compile-time indices only" in found["derived"].reason
    assert "`c_poly` (line 57) is used whole, in `(c_poly)`: its indices are not seen" in found["whole"].reason


def test_the_profile_decides(tmp_path):
    none = findings(tmp_path, {})
    assert not none["fir"].applies and none["fir"].reason.startswith("no profile")
    other = findings(tmp_path, profile(imc=0.3, other=12.0))
    assert not other["fir"].applies and "the largest stall is long_scoreboard (12.00)" in other["fir"].reason
    small = findings(tmp_path, profile(imc=0.6, other=0.1))  # on top, but under a cycle an instruction
    assert not small["fir"].applies
    # The kernel's own shared memory counts: 46 KB of it leaves no room for 4 KB more.
    full = findings(tmp_path, profile(46.6), (KernelResources("_Z3firPKfPfi", ARCH, shared_bytes=46 * 1024),))
    assert not full["fir"].applies and "49152 B static shared memory" in full["fir"].reason


def test_the_patch_copies_first_and_renames_the_reads(tmp_path):
    target = kernel_target(tmp_path, SOURCE)
    proposals = SharedStageExpert().propose(AnalysisContext(target, ARCH, metrics=profile(46.6)))
    by_kernel = {p.description.split(":")[0]: p for p in proposals}  # the reason names the tables first
    assert set(by_kernel) == {"c_taps", "c_lut", "c_grid", "c_poly"}
    text = dict(by_kernel["c_taps"].files)["kernel.cu"]
    body = text[text.index("__global__ void fir"):text.index("__global__ void fixed")]
    lines = [line.strip() for line in body.splitlines()]
    assert lines[1].startswith("// warpfleet shared_stage")
    assert lines[2] == "__shared__ float wf_stage_c_taps[kMaxTaps];"
    assert lines[3].startswith("for (int wf_i = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x; "
                               "wf_i < int(sizeof(c_taps) / sizeof(float)); wf_i += blockDim.x * blockDim.y")
    assert lines[4] == "wf_stage_c_taps[wf_i] = c_taps[wf_i];" and lines[5] == "__syncthreads();"
    assert "fmaf(wf_stage_c_taps[t], x[i + t], sum)" in body and body.count("c_taps[t]") == 1  # renamed
    assert text.count("c_coef[k]") == 2 and "c_taps[4] = {1, 2, 3, 4}" in text  # other kernels as they were
    # A body on its kernel's line: the copy goes right after the brace, the rest of the line after it.
    whole = dict(by_kernel["c_poly"].files)["kernel.cu"].split("__global__ void whole")[1].splitlines()
    assert whole[0] == "(float* out) {" and whole[1].startswith("  // warpfleet shared_stage")
    assert whole[2] == "  __shared__ float wf_stage_c_poly[4];"
    assert whole[4] == "    wf_stage_c_poly[wf_i] = c_poly[wf_i];"
    assert whole[5] == "  __syncthreads(); out[threadIdx.x] = head(wf_stage_c_poly); }"
    grid = dict(by_kernel["c_grid"].files)["kernel.cu"]
    assert "__shared__ float wf_stage_c_grid[4][4];" in grid
    assert "reinterpret_cast<float*>(wf_stage_c_grid)[wf_i] = reinterpret_cast<const float*>(c_grid)[wf_i];" in grid
    assert "wf_stage_c_grid[r][threadIdx.x % 4]" in grid


@needs("nvcc")
def test_the_unroll_targets_variant_builds_and_passes_the_static_checks(tmp_path):
    target = load_target(UNROLL)
    [proposal] = SharedStageExpert().propose(AnalysisContext(target, ARCH, metrics=profile(46.6)))
    assert not any(v.failed for v in static_verdicts(target, proposal))
    variant = variant_target(target, proposal)
    candidate = Candidate(target.name, "nvcc", "H200", ARCH, variant.bundle.hash, (),
                          tuple(target.baseline_params.items()), Phase.VERIFY)
    built = compile_candidate(variant, candidate)
    assert built.binary, built.error_tail
    [fir] = [k for k in built.kernels if "fir" in k.kernel]
    assert fir.shared_bytes == (256 + 1024) * 4 + 1024 * 4  # the tile, and the taps staged


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no GPU")
def test_on_the_gpu_the_staged_taps_give_the_baselines_outputs_and_a_short_copy_does_not():
    from cluster.engine.verification.verify import run_verdicts
    from cluster.measure.measure import measure_candidate
    from tests.agents.test_constant import measured_baseline

    target = load_target(UNROLL)
    device, baseline, artifact, reference = measured_baseline(target)
    [right] = SharedStageExpert().propose(AnalysisContext(target, device.arch, kernels=artifact.kernels,
                                                          metrics=profile(46.6)))
    text = dict(right.files)["unroll.cu"]
    short = text.replace("wf_i < int(sizeof(c_taps) / sizeof(float))", "wf_i < 256")  # the first 256 taps only
    assert short != text

    def verdict(source: str) -> tuple[str, str]:
        variant = variant_target(target, Proposal("shared_stage", "", (("unroll.cu", source),)))
        candidate = dataclasses.replace(baseline, source_hash=variant.bundle.hash, phase=Phase.VERIFY)
        built = compile_candidate(variant, candidate)
        last = run_verdicts(built, measure_candidate(variant, candidate, built, device, reference, runs=1))[-1]
        return last.check, last.status.value

    assert verdict(text) == ("tests", "passed")
    assert verdict(short) == ("outputs", "failed")


def test_the_profile_collects_the_stall_the_expert_reads():
    from cluster.measure.profile import DEFAULT_METRICS

    assert IMC in DEFAULT_METRICS


def test_the_profile_is_needed_only_where_a_table_is_read_at_run_time_indices():
    expert = SharedStageExpert()
    assert expert.needs_profile(AnalysisContext(load_target(UNROLL), "sm_90"))
    transpose = load_target(REPO / "configs/targets/transpose/target.yaml")  # no __constant__ table
    assert not expert.needs_profile(AnalysisContext(transpose, "sm_90"))
