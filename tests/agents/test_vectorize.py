"""The vectorizing expert: which loops load and store 16 bytes at a time (one thread's consecutive
iterations, or a grid-stride loop's elements), the reasons for the others, the rewrite (aligned
chunks, the loop as written for the tail), and its verification: the contract that every vector
access sits under an alignment test, and on a GPU the outputs of misaligned, odd-sized runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.experts.vectorize import VectorizeExpert
from cluster.config import Target
from cluster.engine.verification.verify import contracts_verdict, static_verdicts
from tests.agents.test_padding import kernel_target
from tests.conftest import gpu_present, needs

ARCH = "sm_90"

KERNELS = r"""#include <cuda_runtime.h>
#include <cstdio>
__global__ void row_sums(const float* __restrict__ a, float* __restrict__ sums, int rows, int cols) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int c = 0; c < cols; ++c) acc += a[r * cols + c];
  sums[r] = acc;
}
__global__ void saxpy(float a, const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}
__global__ void scale_rows(double* m, const double* f, int cols) {
  for (int c = 0; c < cols; ++c) m[threadIdx.x * cols + c] *= f[threadIdx.x * cols + c];
}
__global__ void stencil(const float* in, float* out, int n) {
  for (int i = 1; i < n; ++i) out[i] = in[i] - in[i - 1];
}
__global__ void guarded(const float* in, float* out, int n, int m) {
  for (int i = 0; i < n; ++i) if (i < m) out[i] = in[i];
}
__global__ void total(const float* x, float* out, int n) {
  float s = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += x[i];
  atomicAdd(out, s);
}
template <typename T>
__global__ void copy_rows(const T* in, T* out, int cols) {
  for (int c = 0; c < cols; ++c) out[blockIdx.x * cols + c] = in[blockIdx.x * cols + c];
}
__global__ void horner(const float* __restrict__ coef, const float* x, float* out, int n) {
  float c[8];
  for (int k = 0; k < 8; ++k) c[k] = coef[k];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.x * 8;
  float p = 0.0f;
  for (int k = 0; k < 8; ++k) p += c[k] * x[row + k];
  if (i < n) out[i] = p;
}
"""

# A program that runs the two float kernels on misaligned pointers and odd sizes, then aligned
# ones, and prints every result: the original and a variant must print the same.
MAIN = r"""
int main() {
  const int rows = 37, cols = 1003, n = rows * cols;
  float *a, *sums, *x, *y;
  cudaMalloc(&a, (n + 8) * sizeof(float)); cudaMalloc(&sums, 64 * sizeof(float));
  cudaMalloc(&x, (n + 8) * sizeof(float)); cudaMalloc(&y, (n + 8) * sizeof(float));
  float* h = new float[n + 8];
  for (int i = 0; i < n + 8; ++i) h[i] = (float)((i * 7919) % 1000) / 1000.0f;
  cudaMemcpy(a, h, (n + 8) * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(x, h, (n + 8) * sizeof(float), cudaMemcpyHostToDevice);
  for (int shift = 0; shift < 2; ++shift) {
    cudaMemcpy(y, h, (n + 8) * sizeof(float), cudaMemcpyHostToDevice);
    row_sums<<<1, 64>>>(a + shift, sums, rows, cols - shift);
    saxpy<<<7, 64>>>(2.0f, x + shift, y + shift, n - shift);
    cudaMemcpy(h, sums, rows * sizeof(float), cudaMemcpyDeviceToHost);
    for (int r = 0; r < rows; ++r) std::printf("%d sums %d %.6f\n", shift, r, h[r]);
    cudaMemcpy(h, y, (n + 8) * sizeof(float), cudaMemcpyDeviceToHost);
    double check = 0.0;
    for (int i = 0; i < n + 8; ++i) check += h[i] * (1 + i % 13);
    std::printf("%d saxpy %.6f\n", shift, check);
  }
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
"""


def target(tmp_path: Path, source: str = KERNELS) -> Target:
    return kernel_target(tmp_path, source)


def test_which_loops_and_why_not(tmp_path: Path) -> None:
    found = {f.location: f for f in VectorizeExpert().analyse(AnalysisContext(target(tmp_path), ARCH))}
    assert [k for k, f in found.items() if f.applies] == ["kernel.cu:7 in row_sums", "kernel.cu:11 in saxpy",
                                                          "kernel.cu:16 in scale_rows"]
    assert found["kernel.cu:7 in row_sums"].reason == ("every access of a is at `r * cols + c`: 4 of one thread's "
                                                       "consecutive iterations at a time as float4, where aligned")
    assert "as double2" in found["kernel.cu:16 in scale_rows"].reason
    assert found["kernel.cu:19 in stencil"].reason == "in[i - 1] (line 19) is not at an offset plus i"
    assert found["kernel.cu:22 in guarded"].reason.startswith("out[i] (line 22) is under a condition")
    assert found["kernel.cu:26 in total"].reason == "the body carries s from one element to the next"
    assert found["kernel.cu:31 in copy_rows"].reason == "element type 'T' has no 16-byte vector type here"
    # Loads every thread of a warp makes alike (no threadIdx in the offset or the start, directly or
    # through a local): broadcasts, which a vector load would not make fewer.
    for line in (35, 39):
        assert not found[f"kernel.cu:{line} in horner"].applies
        assert "the same for all threads of a warp" in found[f"kernel.cu:{line} in horner"].reason


def test_sectors_per_request_are_the_evidence_and_no_traffic_vetoes(tmp_path: Path) -> None:
    metrics = {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 3.2e6,
               "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 1e5}
    [first, *_] = VectorizeExpert().analyse(AnalysisContext(target(tmp_path / "a"), ARCH, metrics=metrics))
    assert first.evidence == ("32.0 sectors per global load request (100,000 requests)",)
    silent = {"l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 0.0,
              "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": 0.0}
    found = VectorizeExpert().analyse(AnalysisContext(target(tmp_path / "b"), ARCH, metrics=silent))
    assert not any(f.applies for f in found) and "no global loads or stores" in found[0].reason


def proposals(tmp_path: Path, source: str = KERNELS) -> tuple[Target, list[Proposal]]:
    tgt = target(tmp_path, source)
    return tgt, VectorizeExpert().propose(AnalysisContext(tgt, ARCH))


def test_the_rewrite_keeps_the_loop_for_the_tail_and_passes_the_static_checks(tmp_path: Path) -> None:
    tgt, made = proposals(tmp_path)
    row = dict(made[0].files)["kernel.cu"]
    assert "if (reinterpret_cast<unsigned long long>(a + (r * cols) + wf_v) % 16 == 0) {" in row
    assert "const float4 wf_a4 = *reinterpret_cast<const float4*>(&a[r * cols + wf_v]);" in row
    assert "acc += wf_a[wf_j];" in row and "for (int c = wf_v; c < cols; ++c) acc += a[r * cols + c];" in row
    saxpy = dict(made[1].files)["kernel.cu"]
    assert "for (int wf_g = blockIdx.x * blockDim.x + threadIdx.x; wf_g < (n) / 4; wf_g += blockDim.x * gridDim.x)" \
           in saxpy
    assert "*reinterpret_cast<float4*>(&y[wf_g * 4]) = make_float4(wf_y[0], wf_y[1], wf_y[2], wf_y[3]);" in saxpy
    assert "wf_y[wf_j] = a * wf_x[wf_j] + wf_y[wf_j];" in saxpy
    for proposal in made:
        assert [(v.check, v.status.value) for v in static_verdicts(tgt, proposal)] == [
            ("guards", "passed"), ("depgraph", "skipped"), ("contracts", "passed")]


def test_a_planted_vector_access_without_its_alignment_test_is_rejected(tmp_path: Path) -> None:
    tgt, made = proposals(tmp_path)
    row = dict(made[0].files)["kernel.cu"]
    planted = row.replace("if (reinterpret_cast<unsigned long long>(a + (r * cols) + wf_v) % 16 == 0) {", "if (true) {")
    verdict = contracts_verdict(tgt, Proposal("planted", "", (("kernel.cu", planted),)))
    assert verdict.failed and "is not under a test of a's alignment" in verdict.detail


@pytest.mark.nvcc
@needs("nvcc")
def test_the_vectorized_kernels_compile(tmp_path: Path) -> None:
    _, made = proposals(tmp_path / "t")
    for i, proposal in enumerate(made):
        source = tmp_path / f"v{i}.cu"
        source.write_text(dict(proposal.files)["kernel.cu"])
        done = subprocess.run(["nvcc", f"-arch={ARCH}", "-c", str(source), "-o", str(tmp_path / f"v{i}.o")],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr


def _run(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.cu"
    path.write_text(source)
    subprocess.run(["nvcc", "-arch=native", "-o", str(tmp_path / name), str(path)], check=True, timeout=300)
    return subprocess.run([str(tmp_path / name)], capture_output=True, text=True, check=True, timeout=60).stdout


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")
def test_on_a_gpu_the_variants_print_what_the_original_prints_and_a_planted_one_does_not(tmp_path: Path) -> None:
    _, made = proposals(tmp_path / "t", KERNELS + MAIN)
    baseline = _run(tmp_path, "baseline", KERNELS + MAIN)
    for i, proposal in enumerate(made[:2]):  # row_sums, saxpy: misaligned and odd sizes included
        assert _run(tmp_path, f"v{i}", dict(proposal.files)["kernel.cu"]) == baseline
    row = dict(made[0].files)["kernel.cu"]
    no_tail = row.replace("for (int c = wf_v; c < cols; ++c) acc += a[r * cols + c];", "")
    assert _run(tmp_path, "planted", no_tail) != baseline  # cols - shift is odd: the tail matters
