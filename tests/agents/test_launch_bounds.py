"""The launch-bounds expert: register-limited kernels get `__launch_bounds__` with the resident
warps searched, the bound following the block size (a constant, a param's macro, a template
parameter); the verifier's contracts reject a bound that a launch exceeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.experts.launch_bounds import LaunchBoundsExpert
from cluster.config import Target
from cluster.core.types import Candidate, KernelResources, Phase, Status
from cluster.engine.verify import contracts_verdict, static_verdicts
from cluster.runners.build import compile_candidate
from tests.agents.test_padding import kernel_target
from tests.conftest import needs

ARCH = "sm_90"

SOURCE = r"""#include <cuda_runtime.h>
#ifndef BLOCK
#define BLOCK 256
#endif
__global__ void heavy(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc[40];
#pragma unroll
  for (int k = 0; k < 40; ++k) acc[k] = x[(i + k * 977) % n];
  float s = 0.0f;
#pragma unroll
  for (int r = 1; r < 8; ++r)
#pragma unroll
    for (int k = 0; k < 40; ++k) s += acc[k] * acc[(k + r) % 40];
  y[i] = s;
}
template <int B>
__global__ void tiled(const float* x, float* y, int n) {
  const int i = blockIdx.x * B + threadIdx.x;
  if (i < n) y[i] = x[i];
}
__global__ void __launch_bounds__(64) bounded(float* y) { y[threadIdx.x] = 0.0f; }
__global__ void runtime_block(float* y) { y[threadIdx.x] = 0.0f; }

void run(const float* x, float* y, int n, int threads) {
  heavy<<<(n + BLOCK - 1) / BLOCK, BLOCK>>>(x, y, n);
  tiled<128><<<n / 128, 128>>>(x, y, n);
  tiled<256><<<n / 256, 256>>>(x, y, n);
  bounded<<<1, 64>>>(y);
  runtime_block<<<1, threads>>>(y);
}
int main() { return 0; }  // linked, never run
"""

PTXAS = (KernelResources("_Z5heavyPKfPfi", ARCH, registers=94),
         KernelResources("_Z5tiledILi128EEvPKfPfi", ARCH, registers=100),
         KernelResources("_Z7boundedPf", ARCH, registers=90),
         KernelResources("_Z13runtime_blockPf", ARCH, registers=90))


def target(tmp_path: Path) -> Target:
    return kernel_target(tmp_path, SOURCE, {"BLOCK": [256, 512]})


def findings(tmp_path: Path, kernels: tuple[KernelResources, ...] = PTXAS) -> dict[str, object]:
    found = LaunchBoundsExpert().analyse(AnalysisContext(target(tmp_path), ARCH, kernels=kernels))
    return {f.location.split()[-1]: f for f in found}


def test_the_analysis_says_where_it_applies_and_why_not_elsewhere(tmp_path: Path) -> None:
    found = findings(tmp_path)
    assert found["heavy"].applies and found["tiled"].applies
    assert found["heavy"].reason.startswith("heavy: 94 registers per thread hold occupancy at 25% (16 of 64 warps); "
                                            "__launch_bounds__(BLOCK, ...) for 24 warps (3 blocks)")
    assert "theoretical occupancy 25%, limited by registers" in found["heavy"].evidence
    assert not found["bounded"].applies and found["bounded"].reason == "declares __launch_bounds__(64) already"
    assert not found["runtime_block"].applies
    assert found["runtime_block"].reason == "the block size `threads` (line 31) is not a compile-time constant"


def test_no_report_or_no_register_limit_is_a_reason(tmp_path: Path) -> None:
    light = (KernelResources("_Z5heavyPKfPfi", ARCH, registers=32),)
    found = findings(tmp_path, light)
    assert found["heavy"].reason == "occupancy is limited by warps, not registers"
    assert found["tiled"].reason == "no ptxas report of it (the baseline's build gives one)"


def proposals(tmp_path: Path) -> dict[str, Proposal]:
    made = LaunchBoundsExpert().propose(AnalysisContext(target(tmp_path), ARCH, kernels=PTXAS))
    return {next(iter(p.search_params)).removeprefix("WF_LB_WARPS_"): p for p in made}


def test_the_bound_follows_the_param_macro_and_the_template_parameter(tmp_path: Path) -> None:
    made = proposals(tmp_path)
    heavy = dict(made["heavy"].files)["kernel.cu"]
    assert made["heavy"].search_params == {"WF_LB_WARPS_heavy": (24, 32, 40, 48, 64)}
    assert "#ifndef WF_LB_WARPS_heavy\n#define WF_LB_WARPS_heavy 24\n#endif\n__global__ void __launch_bounds__(" \
           "BLOCK, (WF_LB_WARPS_heavy * 32 / (BLOCK) > 1 ? WF_LB_WARPS_heavy * 32 / (BLOCK) : 1)) heavy(" in heavy
    tiled = dict(made["tiled"].files)["kernel.cu"]
    assert "__global__ void __launch_bounds__(B, (WF_LB_WARPS_tiled * 32 / (B) > 1 ?" in tiled
    tgt = target(tmp_path / "t")
    for proposal in made.values():
        assert [v.status.value for v in static_verdicts(tgt, proposal)] == ["passed", "passed", "passed"]


def test_a_planted_bound_below_a_launch_is_rejected(tmp_path: Path) -> None:
    made = proposals(tmp_path)
    text = dict(made["heavy"].files)["kernel.cu"].replace("__launch_bounds__(BLOCK, ", "__launch_bounds__(128, ")
    verdict = contracts_verdict(target(tmp_path / "t"), Proposal("planted", "", (("kernel.cu", text),)))
    assert verdict.failed and verdict.detail == ("kernel.cu: heavy declares __launch_bounds__(128) but is launched "
                                                 "with 256 threads per block (line 30)")
    template = dict(made["tiled"].files)["kernel.cu"].replace("__launch_bounds__(B, ", "__launch_bounds__(128, ")
    verdict = contracts_verdict(target(tmp_path / "u"), Proposal("planted", "", (("kernel.cu", template),)))
    assert verdict.failed and "tiled declares __launch_bounds__(128) but is launched with 256 threads" in verdict.detail


@pytest.mark.nvcc
@needs("nvcc")
def test_the_bound_caps_the_registers_ptxas_gives_the_kernel(tmp_path: Path) -> None:
    tgt = target(tmp_path / "t")
    base = Candidate(tgt.name, "nvcc", "H100", ARCH, tgt.bundle.hash, (), tuple(tgt.baseline_params.items()),
                     Phase.BASELINE)
    artifact = compile_candidate(tgt, base)
    assert artifact.status is Status.OK, artifact.error_tail
    [heavy] = [k for k in artifact.kernels if "heavy" in k.kernel]
    found = LaunchBoundsExpert().propose(AnalysisContext(tgt, ARCH, kernels=artifact.kernels))
    [proposal] = [p for p in found if "WF_LB_WARPS_heavy" in p.search_params]
    from agents.patch import variant_target

    variant = variant_target(tgt, proposal)
    for warps in proposal.search_params["WF_LB_WARPS_heavy"][:2]:
        params = (*tgt.baseline_params.items(), ("WF_LB_WARPS_heavy", warps))
        built = compile_candidate(variant, dataclasses.replace(base, source_hash=variant.bundle.hash, params=params))
        assert built.status is Status.OK, built.error_tail
        [capped] = [k for k in built.kernels if "heavy" in k.kernel]
        assert capped.registers <= 65536 // (warps * 32) < heavy.registers
