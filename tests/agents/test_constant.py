"""The constant-memory expert: a read-only table that every thread of a warp reads at the same
indices, with a compile-time extent, moves to `__constant__` with a copy before each launch; the
reasons where not; the variant builds with fewer registers, passes the static checks, and (on a
GPU) gives the baseline's outputs where a planted wrong copy does not."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.experts.constant import ConstantExpert
from agents.patch import variant_target
from agents.workflow.steps import Finding
from cluster.config import Target, load_target
from cluster.core.types import KernelResources
from cluster.engine.verification.verify import static_verdicts
from cluster.toolchains import get_toolchain
from tests.agents.test_padding import changed_lines, kernel_target
from tests.conftest import REPO, gpu_present, needs

ARCH = "sm_90"

# poly caches 81 coefficients in a register array for a Horner loop (a first version's habit).
SOURCE = r"""#include <cuda_runtime.h>
#define kTerms 81

__global__ void poly(const float* __restrict__ x, const float* __restrict__ coef, float* __restrict__ out, int n,
                     int steps) {
  float c[kTerms];
#pragma unroll
  for (int k = 0; k < kTerms; ++k) c[k] = coef[k];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const float v = x[s * n + i];
    float p = c[kTerms - 1];
#pragma unroll
    for (int k = kTerms - 2; k >= 0; --k) p = fmaf(p, v, c[k]);
    acc += p;
  }
  out[i] = acc;
}
__global__ void by_thread(const float* table, float* out) { out[threadIdx.x] = table[threadIdx.x % 8]; }
__global__ void decay(float* w) { w[0] = w[1] * 0.5f; }
__global__ void partial(const float* coef, float* out, int n) {
  float s = 0.0f;
  for (int k = 0; k < n; ++k) s += coef[k];
  out[threadIdx.x] = s;
}
__device__ float first(const float* t) { return t[0]; }
__global__ void handed(const float* coef, float* out) { out[threadIdx.x] = first(coef); }
__global__ void orphan(const float* coef, float* out) { out[threadIdx.x] = coef[3]; }

int main() {
  const int n = 1 << 16;
  float *d_x, *d_coef, *d_out, *d_w;
  cudaMalloc(&d_x, 32 * n * sizeof(float));
  cudaMalloc(&d_coef, kTerms * sizeof(float));
  cudaMalloc(&d_out, n * sizeof(float));
  cudaMalloc(&d_w, 2 * sizeof(float));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  poly<<<n / 256, 256, 0, stream>>>(d_x, d_coef, d_out, n, 32);
  by_thread<<<1, 32>>>(d_x, d_out);
  decay<<<1, 1>>>(d_w);
  partial<<<1, 32>>>(d_coef, d_out, kTerms);
  handed<<<1, 32>>>(d_coef, d_out);
  cudaStreamSynchronize(stream);
  return 0;
}
"""


def findings(tmp_path: Path, source: str = SOURCE, params: dict[str, list[int]] | None = None,
             kernels: tuple[KernelResources, ...] = ()) -> dict[str, Finding]:
    context = AnalysisContext(kernel_target(tmp_path, source, params), ARCH, kernels=kernels)
    return {f.location.split()[-1]: f for f in ConstantExpert().analyse(context)}


def proposal(target: Target) -> Proposal:
    made = ConstantExpert().propose(AnalysisContext(target, ARCH))
    assert [p.description.split(" of ")[1].split(":")[0] for p in made] == ["poly"]
    return made[0]


def test_a_cached_coefficient_table_moves_with_its_extent_and_evidence(tmp_path: Path) -> None:
    found = findings(tmp_path, kernels=(KernelResources("_Z4polyPKfS0_Pfii", ARCH, registers=94),))
    poly = found["poly"]
    assert poly.applies and poly.kernel == "poly"
    assert poly.reason == ("coef (81 x float, 324 B) of poly: never written, read at indices the same for every "
                           "thread of a warp: to __constant__, copied before its launch")
    assert poly.evidence == ("ptxas: 94 registers, 0 B spill stores", "no profile: decided from the source alone")
    plan = ConstantExpert().plan(AnalysisContext(kernel_target(tmp_path, SOURCE), ARCH), poly)
    assert plan is not None and plan.changes == (
        "declare `__constant__ float wf_const_poly_coef[81];` before line 4 and read coef[...] of poly from it",
        "copy `d_coef` to the table(s) before the launch at line 41, on stream `stream`")


def test_the_reasons_where_it_does_not_apply(tmp_path: Path) -> None:
    found = findings(tmp_path)
    assert not any(f.applies for name, f in found.items() if name != "poly")
    assert found["by_thread"].reason == (
        "table: `table[threadIdx.x % 8]` (line 21) depends on the thread: a warp reads different elements, which "
        "the constant cache serves one at a time; out: written by the kernel")
    assert found["decay"].reason == "w: written by the kernel"
    assert found["partial"].reason == ("coef: extent not a compile-time constant: `coef[k]` (line 25); "
                                       "out: written by the kernel")
    assert found["handed"].reason == ("coef: handed to first (line 29), which would read the table; "
                                      "out: written by the kernel")
    assert found["orphan"].reason == "launched nowhere in this file: no launch to copy the table before"


def test_what_the_launches_and_the_bank_can_refuse(tmp_path: Path) -> None:
    again = "  poly<<<n / 256, 256>>>(d_x, d_coef, d_out, n, 8);\n"
    two_streams = SOURCE.replace("  cudaStreamSynchronize(stream);\n", again + "  cudaStreamSynchronize(stream);\n")
    assert findings(tmp_path / "a", two_streams)["poly"].reason == (
        "launched on `stream`, the default stream: one table for all, overwritten while another launch may read it")
    unbraced = SOURCE.replace("  poly<<<", "  if (n > 0)\n    poly<<<")
    assert findings(tmp_path / "b", unbraced)["poly"].reason == ("the launch at line 42 is not a statement of its "
                                                                "own in a block")
    swept = SOURCE.replace("#define kTerms 81\n", "#ifndef kTerms\n#define kTerms 81\n#endif\n")
    assert findings(tmp_path / "c", swept, {"kTerms": [81, 41]})["poly"].reason == (
        "x: `x[s * n + i]` (line 15) depends on the thread: a warp reads different elements, which the constant "
        "cache serves one at a time; coef: its extent follows the param kTerms: a table sized at the baseline would "
        "not hold another value's; out: written by the kernel")
    full = SOURCE.replace("#define kTerms 81\n", "#define kTerms 81\n__constant__ float lut[16310];\n")
    assert findings(tmp_path / "d", full)["poly"].reason == (
        "coef: 324 B with the file's 65240 B of __constant__ data exceed the 64 KB constant bank")
    aliased = SOURCE.replace("(d_x, d_coef, d_out, n, 32);", "(d_x, d_coef, d_coef, n, 32);")
    assert findings(tmp_path / "e", aliased)["poly"].reason == (
        "coef: its argument `d_coef` may share memory with out's `d_coef`, which the kernel writes (line 41)")


TWO_TABLES = r"""#include <cuda_runtime.h>
__global__ void mix(const float* a, const float* b, float* out) { out[threadIdx.x] = a[0] + b[1]; }
int main() {
  float *d_b, *d_out;
  cudaMalloc(&d_b, 2 * sizeof(float));
  cudaMalloc(&d_out, 32 * sizeof(float));
  mix<<<1, 32>>>(d_out, d_b, d_out);
  return 0;
}
"""


def test_a_table_left_out_leaves_the_others_with_their_own_arguments(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, TWO_TABLES)
    [finding] = ConstantExpert().analyse(AnalysisContext(target, ARCH))
    assert finding.applies and finding.reason == (
        "b (2 x float, 8 B) of mix: never written, read at indices the same for every thread of a warp: to "
        "__constant__, copied before its launch (a: its argument `d_out` may share memory with out's `d_out`, which "
        "the kernel writes (line 7))")
    [made] = ConstantExpert().propose(AnalysisContext(target, ARCH))
    assert changed_lines(TWO_TABLES, dict(made.files)["kernel.cu"].replace(
        "__constant__ float wf_const_mix_b[2];\n", "").replace(
        "  cudaMemcpyToSymbolAsync(wf_const_mix_b, d_b, 2 * sizeof(float), 0, cudaMemcpyDeviceToDevice, 0);\n", "")) \
        == [("__global__ void mix(const float* a, const float* b, float* out) { out[threadIdx.x] = a[0] + b[1]; }",
             "__global__ void mix(const float* a, const float* b, float* out) { out[threadIdx.x] = a[0] + "
             "wf_const_mix_b[1]; }")]


def test_the_patch_declares_the_table_reads_it_and_copies_before_the_launch(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, SOURCE)
    text = dict(proposal(target).files)["kernel.cu"]
    assert text.split("\n")[3] == "__constant__ float wf_const_poly_coef[81];"
    assert "  cudaMemcpyToSymbolAsync(wf_const_poly_coef, d_coef, 81 * sizeof(float), 0, cudaMemcpyDeviceToDevice, " \
           "stream);\n  poly<<<n / 256, 256, 0, stream>>>(d_x, d_coef, d_out, n, 32);\n" in text
    unpatched = text.replace("__constant__ float wf_const_poly_coef[81];\n", "").replace(
        "  cudaMemcpyToSymbolAsync(wf_const_poly_coef, d_coef, 81 * sizeof(float), 0, cudaMemcpyDeviceToDevice, "
        "stream);\n", "")
    assert changed_lines(SOURCE, unpatched) == [
        ("  for (int k = 0; k < kTerms; ++k) c[k] = coef[k];",
         "  for (int k = 0; k < kTerms; ++k) c[k] = wf_const_poly_coef[k];")]


def test_the_guards_and_contracts_accept_the_variant(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, SOURCE)
    verdicts = {v.check: v for v in static_verdicts(target, proposal(target))}
    assert verdicts["guards"].status.value == "passed" and verdicts["contracts"].status.value == "passed"


def test_the_dependence_check_accepts_the_added_copy(tmp_path: Path) -> None:
    """The copy into the new table writes nothing the original touches, after the writes of its
    source (agents.depgraph, tested there with misplaced copies). No static check would reject a
    copy too short: the outputs on a GPU do (the GPU test)."""
    target = kernel_target(tmp_path, SOURCE)
    verdicts = {v.check: v for v in static_verdicts(target, proposal(target))}
    assert verdicts["depgraph"].status.value == "passed", verdicts["depgraph"].detail


def registers(folder: Path, name: str, source: str) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.cu").write_text(source)
    done = subprocess.run(["nvcc", f"-arch={ARCH}", "-cubin", "-Xptxas", "-v", "-o", str(folder / f"{name}.cubin"),
                           str(folder / f"{name}.cu")], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    [poly] = [k for k in get_toolchain("nvcc").parse_resources(done.stderr) if k.kernel == "_Z4polyPKfS0_Pfii"]
    return poly.registers


@pytest.mark.nvcc
@needs("nvcc")
def test_the_variant_compiles_and_frees_the_cached_registers(tmp_path: Path) -> None:
    text = dict(proposal(kernel_target(tmp_path / "t", SOURCE)).files)["kernel.cu"]
    before, after = registers(tmp_path, "original", SOURCE), registers(tmp_path, "patched", text)
    assert after < before - 40, (before, after)  # the 81 coefficients leave the registers for the constant bank


REGPRESSURE = REPO / "configs" / "targets" / "regpressure" / "target.yaml"


def measured_baseline(target: Target):
    """On GPU 0: the device, the target's baseline candidate and build, and its outputs as the
    reference a variant's must match (what the verifier holds before it checks a variant)."""
    from cluster.compile.build import compile_candidate
    from cluster.core.types import Candidate, Phase, Status
    from cluster.measure.measure import Reference, measure_candidate
    from cluster.platform.devices import gpu_device

    device = gpu_device(0, "gpu-0")
    baseline = Candidate(target.name, "nvcc", device.name, device.arch, target.bundle.hash,
                         tuple(target.space.baseline.items()), tuple(target.baseline_params.items()), Phase.BASELINE)
    artifact = compile_candidate(target, baseline)
    measured = measure_candidate(target, baseline, artifact, device, None, runs=1)
    assert measured.status is Status.OK, measured.error_tail
    return device, baseline, artifact, Reference(measured.outputs)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")
def test_on_a_gpu_the_variant_gives_the_baselines_outputs_and_a_planted_short_copy_does_not() -> None:
    """The verifier's build and run (cluster.engine.verification.verify.run_verdicts) on the regpressure target:
    the static checks are tested on the CPU above."""
    from cluster.compile.build import compile_candidate
    from cluster.core.types import Phase
    from cluster.engine.verification.verify import run_verdicts
    from cluster.measure.measure import measure_candidate

    target = load_target(REGPRESSURE)
    device, baseline, artifact, reference = measured_baseline(target)
    [right] = ConstantExpert().propose(AnalysisContext(target, device.arch, kernels=artifact.kernels))
    text = dict(right.files)["regpressure.cu"]
    short = re.sub(r"81 \* sizeof\(float\)", "40 * sizeof(float)", text)  # half the table left zero
    assert short != text

    def outputs(source: str) -> tuple[str, str, int]:
        variant = variant_target(target, Proposal("constant", "", (("regpressure.cu", source),)))
        candidate = dataclasses.replace(baseline, source_hash=variant.bundle.hash, phase=Phase.VERIFY)
        built = compile_candidate(variant, candidate)
        [kernel] = [k for k in built.kernels if "series_sum" in k.kernel]
        verdict = run_verdicts(built, measure_candidate(variant, candidate, built, device, reference, runs=1))[-1]
        return verdict.check, verdict.status.value, kernel.registers

    [original] = [k.registers for k in artifact.kernels if "series_sum" in k.kernel]
    check, status, registers = outputs(text)
    assert (check, status) == ("tests", "passed") and registers < original
    assert outputs(short)[:2] == ("outputs", "failed")
