"""The read-only-pointer expert: `const T* __restrict__` for pointers a kernel never writes and no
launch aliases with one it writes; the reasons where not; the verifier's contract rejecting a
`__restrict__` on an aliased argument."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.experts.restrict import LOAD_REQUESTS, RestrictExpert
from cluster.config import Target
from cluster.engine.verification.verify import contracts_verdict, static_verdicts
from tests.agents.test_padding import changed_lines, kernel_target
from tests.conftest import needs

ARCH = "sm_90"

SOURCE = r"""#include <cuda_runtime.h>
__global__ void axpy(float a, float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void shift(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + 1 < n) out[i] = in[i + 1];
}
__global__ void widen(float* in, float* out) {
  float4* v = reinterpret_cast<float4*>(in);
  out[threadIdx.x] = v[threadIdx.x].x;
}
template <typename T>
__global__ void gather(const T* table, const int* index, T* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = table[index[i]];
}
__global__ void unused(float* p) { p[0] = 1.0f; }
void run(float* d_x, float* d_y, float* d_z, int* d_i, int n) {
  axpy<<<n / 256, 256>>>(2.0f, d_x, d_y, n);
  shift<<<n / 256, 256>>>(d_y, d_y, n);
  widen<<<1, 32>>>(d_x, d_z);
  gather<float><<<n / 256, 256>>>(d_x, d_i, d_z, n);
}
int main() {
  float *x, *y, *z;
  int* i;
  cudaMalloc(&x, 4096); cudaMalloc(&y, 4096); cudaMalloc(&z, 4096); cudaMalloc(&i, 4096);
  run(x, y, z, i, 1024);
  return 0;
}
"""


def target(tmp_path: Path, source: str = SOURCE) -> Target:
    return kernel_target(tmp_path, source)


def findings(tmp_path: Path, source: str = SOURCE, metrics: dict[str, float] | None = None) -> dict[str, object]:
    found = RestrictExpert().analyse(AnalysisContext(target(tmp_path, source), ARCH, metrics=metrics or {}))
    return {f.location.split()[-1]: f for f in found}


def test_read_only_unaliased_pointers_and_the_reasons_for_the_rest(tmp_path: Path) -> None:
    found = findings(tmp_path)
    assert found["axpy"].applies and found["axpy"].reason.startswith("x of axpy: never written")
    assert found["gather"].applies and found["gather"].reason.startswith("table, index of gather: never written")
    assert found["shift"].reason == "in: its argument `y` may share memory with out's `y` (line 22)"
    assert found["widen"].reason == "in: line 11 keeps it in a non-const pointer"
    assert found["unused"].reason == "p, not const __restrict__ yet, is written (or never read)"
    assert found["axpy"].evidence == ("no profile: decided from the source alone",)


def test_entry_function_parameters_may_alias_each_other(tmp_path: Path) -> None:
    library = SOURCE[:SOURCE.index("int main()")]  # run() called from elsewhere: x and y may be one buffer
    found = findings(tmp_path, library)
    assert found["axpy"].reason == "x: its argument `d_x` may share memory with y's `d_y` (line 21)"


def test_a_reason_names_buffers_the_analysis_lost_as_the_source_does(tmp_path: Path) -> None:
    """Pointers from a call the analysis cannot see may be any buffer; the reason names them as the
    source does (`x`), not by the analysis's own token for them (`__wf_any_x_0`)."""
    allocated = "  cudaMalloc(&x, 4096); cudaMalloc(&y, 4096); cudaMalloc(&z, 4096); cudaMalloc(&i, 4096);\n"
    unknown = SOURCE.replace(allocated, "  x = make(); y = make(); z = make(); i = (int*)make();\n")
    found = findings(tmp_path, unknown.replace("int main() {", "float* make();\nint main() {"))
    assert found["axpy"].reason == "x: its argument `x` may share memory with y's `y` (line 21)"
    assert not any("__wf_any" in f.reason for f in found.values())


def test_an_allocation_through_a_cast_is_a_buffer_of_its_own(tmp_path: Path) -> None:
    """`cudaMalloc((void **)&x, ...)` and `cudaMalloc(reinterpret_cast<void **>(&y), ...)`, the
    CUDA samples' idiom, allocate as `cudaMalloc(&x, ...)` does: x and y are separate buffers."""
    allocated = "  cudaMalloc(&x, 4096); cudaMalloc(&y, 4096);"
    for cast in ("cudaMalloc((void **)&x, 4096); cudaMalloc((void**)&y, 4096);",
                 "cudaMalloc(reinterpret_cast<void **>(&x), 4096); cudaMalloc(reinterpret_cast<void **>(&y), 4096);"):
        found = findings(tmp_path / cast[11:15], SOURCE.replace(allocated, "  " + cast))
        assert found["axpy"].applies and found["axpy"].reason.startswith("x of axpy: never written"), cast


def test_a_prototype_or_no_launch_is_a_reason(tmp_path: Path) -> None:
    declared = SOURCE.replace("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n__global__ void axpy(float, "
                                                            "float*, float*, int);\n")
    assert findings(tmp_path / "a", declared)["axpy"].reason == ("declared again at line 2: the declarations would "
                                                                 "disagree")
    unlaunched = SOURCE.replace("  axpy<<<n / 256, 256>>>(2.0f, d_x, d_y, n);\n", "")
    assert findings(tmp_path / "b", unlaunched)["axpy"].reason == ("launched nowhere in this file: whether its "
                                                                   "arguments alias is unknown")


def test_the_profile_is_evidence_and_can_veto(tmp_path: Path) -> None:
    metrics = {LOAD_REQUESTS: 1000.0, "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 4000.0,
               "l1tex__t_sector_hit_rate.pct": 12.5}
    found = findings(tmp_path / "a", metrics=metrics)
    assert found["axpy"].evidence == ("4.0 sectors per global load request", "L1/tex hit rate 12.5% "
                                      "(l1tex__t_sector_hit_rate.pct)")
    vetoed = findings(tmp_path / "b", metrics={LOAD_REQUESTS: 0.0})
    assert not vetoed["axpy"].applies and "no global loads" in vetoed["axpy"].reason


def proposals(tmp_path: Path) -> tuple[Target, dict[str, Proposal]]:
    tgt = target(tmp_path)
    made = RestrictExpert().propose(AnalysisContext(tgt, ARCH))
    return tgt, {p.description.split(" of ")[1].split(":")[0]: p for p in made}


def test_the_declarations_are_rewritten_and_verified(tmp_path: Path) -> None:
    tgt, made = proposals(tmp_path)
    assert changed_lines(SOURCE, dict(made["axpy"].files)["kernel.cu"]) == [
        ("__global__ void axpy(float a, float* x, float* y, int n) {",
         "__global__ void axpy(float a, const float* __restrict__ x, float* y, int n) {")]
    assert changed_lines(SOURCE, dict(made["gather"].files)["kernel.cu"]) == [
        ("__global__ void gather(const T* table, const int* index, T* out, int n) {",
         "__global__ void gather(const T* __restrict__ table, const int* __restrict__ index, T* out, int n) {")]
    for proposal in made.values():
        assert [(v.check, v.status.value) for v in static_verdicts(tgt, proposal)] == [
            ("guards", "passed"), ("depgraph", "passed"), ("contracts", "passed")]


def test_a_planted_restrict_on_an_aliased_argument_is_rejected(tmp_path: Path) -> None:
    planted = SOURCE.replace("void shift(const float* in,", "void shift(const float* __restrict__ in,")
    verdict = contracts_verdict(target(tmp_path), Proposal("planted", "", (("kernel.cu", planted),)))
    assert verdict.failed and verdict.detail == ("kernel.cu: shift's in is __restrict__ but its argument `y` may share "
                                                 "memory with out's `y`, which the kernel writes (line 22)")


@pytest.mark.nvcc
@needs("nvcc")
def test_the_restricted_kernels_compile(tmp_path: Path) -> None:
    _, made = proposals(tmp_path / "t")
    for name, proposal in made.items():
        source = tmp_path / f"{name}.cu"
        source.write_text(dict(proposal.files)["kernel.cu"])
        done = subprocess.run(["nvcc", f"-arch={ARCH}", "-c", str(source), "-o", str(tmp_path / f"{name}.o")],
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
