"""The launch-bounds expert: register-limited kernels get `__launch_bounds__` with the resident
warps searched, the bound following the block size (a constant, a param's macro, a template
parameter); the verifier's contracts reject a bound that a launch exceeds."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.experts.launch_bounds import LaunchBoundsExpert, max_threads
from agents.launch_sites import launch_sites
from cluster.compile.build import compile_candidate
from cluster.config import Target
from cluster.core.types import Candidate, KernelResources, Phase, Status
from cluster.engine.verification.verify import contracts_verdict, static_verdicts
from tests.agents.test_padding import kernel_target
from tests.conftest import needs

ARCH = "sm_90"

# A register-heavy body (40 live values a thread), after a kernel's first line computing i.
HEAVY_BODY = r"""  if (i >= n) return;
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
"""

SOURCE = r"""#include <cuda_runtime.h>
#ifndef BLOCK
#define BLOCK 256
#endif
__global__ void heavy(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
""" + HEAVY_BODY + r"""template <int B>
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


# A block given as a local dim3 of the params' macros (PolyBench-ACC's idiom), and block variables
# that are changed: by a field, as a whole, after the launch (in a loop), through a reference, in a
# branch (an int, which the host flow follows until then).
LOCAL_SOURCE = r"""#include <cuda_runtime.h>
#ifndef BX
#define BX 8
#endif
#ifndef BY
#define BY 8
#endif
__global__ void heavy2d(const float* x, float* y, int n) {
  const int i = (blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
""" + HEAVY_BODY + r"""__global__ void widened(float* y) { y[threadIdx.x] = 0.0f; }
__global__ void reassigned(float* y) { y[threadIdx.x] = 0.0f; }
__global__ void stepped(float* y) { y[threadIdx.x] = 0.0f; }
__global__ void grown(float* y) { y[threadIdx.x] = 0.0f; }
__global__ void branched(float* y) { y[threadIdx.x] = 0.0f; }

void grow(dim3& b) { b.x *= 2; }

void run(const float* x, float* y, int n) {
  dim3 block(BX, BY);
  dim3 grid((n + BX * BY - 1) / (BX * BY));
  heavy2d<<<grid, block>>>(x, y, n);
  dim3 wide(BX, BY);
  wide.x = 2 * BX;
  widened<<<1, wide>>>(y);
  dim3 other = dim3(BX);
  other = dim3(2 * BX);
  reassigned<<<1, other>>>(y);
  dim3 step{BX, BY};
  for (int r = 0; r < 2; ++r) {
    stepped<<<1, step>>>(y);
    step.x *= 2;
  }
  dim3 by_reference(BX);
  grow(by_reference);
  grown<<<1, by_reference>>>(y);
  int t = BX;
  if (n > 1) t = 2 * BX;
  branched<<<1, t>>>(y);
}
int main() { return 0; }  // linked, never run
"""

LOCAL_PTXAS = (KernelResources("_Z7heavy2dPKfPfi", ARCH, registers=94),
               *(KernelResources(f"_Z{len(name)}{name}Pf", ARCH, registers=94)
                 for name in ("widened", "reassigned", "stepped", "grown", "branched")))


def local_target(folder: Path) -> Target:
    return kernel_target(folder, LOCAL_SOURCE, {"BX": [8, 16, 32], "BY": [8, 4]})  # the baseline: 8 x 8


def test_a_local_dim3_of_macros_is_read_as_its_value(tmp_path: Path) -> None:
    tgt = local_target(tmp_path)
    model = analyze(LOCAL_SOURCE, "kernel.cu", defines={k: str(v) for k, v in tgt.baseline_params.items()})
    [site] = [s for s in launch_sites(model) if s.launch.kernel == "heavy2d"]
    assert (site.launch.block, site.threads(model), site.changed) == ("dim3(BX, BY)", 64, None)
    assert max_threads(model, model.kernel("heavy2d"), [site], {"BX", "BY"}) == ("(BX) * (BY)", 64)
    found = LaunchBoundsExpert().analyse(AnalysisContext(tgt, ARCH, kernels=LOCAL_PTXAS))
    [heavy] = [f for f in found if f.location.endswith(" heavy2d")]
    assert heavy.applies and "__launch_bounds__((BX) * (BY), ...) for " in heavy.reason
    assert "ptxas: 94 registers, 0 B shared; 64 threads per block" in heavy.evidence


def test_a_changed_block_variable_is_named_with_where_it_changes(tmp_path: Path) -> None:
    found = LaunchBoundsExpert().analyse(AnalysisContext(local_target(tmp_path), ARCH, kernels=LOCAL_PTXAS))
    reasons = {f.location.split()[-1]: f.reason for f in found if not f.applies}
    not_constant = "is not a compile-time constant"
    assert reasons == {
        "widened": f"the block size `wide` (line 35) {not_constant}: `wide.x` is written on line 34",
        "reassigned": f"the block size `other` (line 38) {not_constant}: `other` is written on line 37",
        "stepped": f"the block size `step` (line 41) {not_constant}: `step.x` is written on line 42",
        "grown": f"the block size `by_reference` (line 46) {not_constant}: `by_reference` is handed to grow's "
                 "reference parameter on line 45",
        "branched": f"the block size `t` (line 49) {not_constant}: `t` is written on line 48",
    }


def local_proposal(tgt: Target) -> Proposal:
    made = LaunchBoundsExpert().propose(AnalysisContext(tgt, ARCH, kernels=LOCAL_PTXAS))
    assert [next(iter(p.search_params)) for p in made] == ["WF_LB_WARPS_heavy2d"]
    return made[0]


def test_the_bound_follows_a_local_dim3_of_macros(tmp_path: Path) -> None:
    tgt = local_target(tmp_path)
    text = dict(local_proposal(tgt).files)["kernel.cu"]
    assert "__global__ void __launch_bounds__((BX) * (BY), (WF_LB_WARPS_heavy2d * 32 / ((BX) * (BY)) > 1 ? " \
           "WF_LB_WARPS_heavy2d * 32 / ((BX) * (BY)) : 1)) heavy2d(" in text
    assert [v.status.value for v in static_verdicts(tgt, local_proposal(tgt))] == ["passed", "passed", "passed"]
    planted = text.replace("__launch_bounds__((BX) * (BY), ", "__launch_bounds__(32, ")
    verdict = contracts_verdict(local_target(tmp_path / "t"), Proposal("planted", "", (("kernel.cu", planted),)))
    assert verdict.failed and verdict.detail == ("kernel.cu: heavy2d declares __launch_bounds__(32) but is launched "
                                                 "with 64 threads per block (line 35)")  # 32 + the 3-line prelude


def test_a_block_macro_defined_as_a_param_follows_it() -> None:
    source = ("#ifndef WG\n#define WG 16\n#endif\n#define TILE WG\n__global__ void k(float* y) { y[0] = 0.0f; }\n"
              "void run(float* y) {\n  dim3 block(TILE, TILE);\n  k<<<1, block>>>(y);\n}\n")
    model = analyze(source, "kernel.cu", defines={"WG": "16"})
    sites = launch_sites(model)
    assert max_threads(model, model.kernel("k"), sites, {"WG"}) == ("(TILE) * (TILE)", 256)
    assert max_threads(model, model.kernel("k"), sites, set()) == ("256", 256)  # nothing swept: a number


@pytest.mark.nvcc
@needs("nvcc")
def test_the_local_dim3_bound_compiles_and_follows_the_defines(tmp_path: Path) -> None:
    from agents.patch import variant_target

    tgt = local_target(tmp_path / "t")
    proposal = local_proposal(tgt)
    variant = variant_target(tgt, proposal)
    warps = proposal.search_params["WF_LB_WARPS_heavy2d"][0]
    patched = tmp_path / "patched.cu"
    patched.write_text(dict(proposal.files)["kernel.cu"])
    base = Candidate(tgt.name, "nvcc", "H100", ARCH, variant.bundle.hash, (), (), Phase.BASELINE)
    for bx, by in ((8, 8), (16, 8)):
        params = (("BX", bx), ("BY", by), ("WF_LB_WARPS_heavy2d", warps))
        built = compile_candidate(variant, dataclasses.replace(base, params=params))
        assert built.status is Status.OK, built.error_tail
        [capped] = [k for k in built.kernels if "heavy2d" in k.kernel]
        assert capped.registers <= 65536 // (warps * 32)
        # The bound is the block that the defines give: the PTX's .maxntid
        ptx = tmp_path / f"{bx}x{by}.ptx"
        subprocess.run(["nvcc", f"-arch={ARCH}", "-ptx", f"-DBX={bx}", f"-DBY={by}",
                        f"-DWF_LB_WARPS_heavy2d={warps}", "-o", str(ptx), str(patched)], check=True)
        entry = ptx.read_text().split(".entry _Z7heavy2dPKfPfi", 1)[1].split("{", 1)[0]
        assert f".maxntid {bx * by}, 1, 1" in entry, entry
