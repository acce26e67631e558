"""The rule-based experts on the suite targets and on small synthetic kernels."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from agents._base import AnalysisContext
from agents.cuda_source import analyze
from agents.experts import RegisterExpert, UnrollExpert
from agents.experts.registers import block_size, evaluate
from cluster.config import Target, load_target
from cluster.core.types import Candidate, KernelResources
from tests.configs._builds import SUITE_BUILDS, compile_once
from tests.conftest import needs

TARGETS = Path(__file__).resolve().parents[2] / "configs" / "targets"
ARCH = "sm_90"
SERIES_SUM = "_Z10series_sumPKfS0_Pfii"

SYNTHETIC = r"""#include <cstdio>
constexpr int kTile = 8;

__global__ void axpy_rows(const float* __restrict__ x, float* __restrict__ y, int n, int cols) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  float acc = 0.0f;
  for (int c = 0; c < cols; ++c) acc += x[row * cols + c];
  float tile[kTile];
  for (int k = 0; k < kTile; ++k) tile[k] = acc * k;
  float s = 0.0f;
#pragma unroll 1
  for (int k = 0; k < kTile; ++k) s += tile[k];
  y[row] = s;
}

int main() {
  int threads = 128;
  axpy_rows<<<4, threads>>>(nullptr, nullptr, 0, 0);
  return 0;
}
"""

READONLY = r"""__global__ void guarded(float* y, int n) {
  float acc = 0.0f;
  // warpfleet: readonly begin
  for (int i = 0; i < n; ++i) acc += y[i];
  // warpfleet: readonly end
  y[0] = acc;
}
"""


def _target(folder: Path, source: str, name: str = "k.cu") -> Target:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(source)
    spec = {"name": "synthetic", "toolchain": "nvcc", "sources": [name], "run": ["{binary}"],
            "verify": {"outputs": ["out.bin"]}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_target(folder / "target.yaml")


# --- RegisterExpert --------------------------------------------------------------------------

@pytest.mark.nvcc
@needs("nvcc")
@SUITE_BUILDS  # the baseline's build is shared with the other modules that build it
def test_register_expert_on_regpressure_from_a_real_ptxas_report() -> None:
    target = load_target(TARGETS / "regpressure" / "target.yaml")
    candidate = Candidate(target.name, "nvcc", "H100", ARCH, target.bundle.hash, (), ())
    built = compile_once(target, candidate)
    assert built.result.ok, built.result.tail()
    kernel = next(k for k in built.target_kernels if "series_sum" in k.kernel)
    assert kernel.registers > 64, kernel
    [proposal] = RegisterExpert().propose(AnalysisContext(target, ARCH, kernels=built.target_kernels))
    steps = proposal.search_params["maxrregcount"]
    assert 64 in steps  # the sweep's best on an H100: 4 blocks of 256 instead of 2
    assert all(24 <= int(v) < kernel.registers for v in steps)
    assert list(steps) == sorted(steps, reverse=True)
    assert proposal.files == ()
    assert "limiting factor registers" in proposal.description
    assert f"{kernel.registers} registers" in proposal.description
    assert "64 -> 50% (32 warps)" in proposal.description


def test_register_expert_steps_for_94_registers_of_256_threads() -> None:
    target = load_target(TARGETS / "regpressure" / "target.yaml")
    kernels = (KernelResources(SERIES_SUM, ARCH, registers=94),)
    [proposal] = RegisterExpert().propose(AnalysisContext(target, ARCH, kernels=kernels))
    assert proposal.search_params == {"maxrregcount": (80, 64, 48, 40, 32)}
    assert "occupancy 25% (16 of 64 warps)" in proposal.description


def test_register_expert_drops_steps_below_its_floor() -> None:
    target = load_target(TARGETS / "regpressure" / "target.yaml")
    kernels = (KernelResources(SERIES_SUM, ARCH, registers=94),)
    [proposal] = RegisterExpert(min_registers=48).propose(AnalysisContext(target, ARCH, kernels=kernels))
    assert proposal.search_params == {"maxrregcount": (80, 64, 48)}


@pytest.mark.parametrize("resources", [
    KernelResources(SERIES_SUM, ARCH, registers=32),  # full occupancy: warps limit
    KernelResources(SERIES_SUM, ARCH, registers=64, shared_bytes=100 * 1024),  # shared memory limits to 2 blocks
])
def test_register_expert_is_silent_when_registers_do_not_limit(resources: KernelResources) -> None:
    target = load_target(TARGETS / "regpressure" / "target.yaml")
    assert RegisterExpert().propose(AnalysisContext(target, ARCH, kernels=(resources,))) == []


def test_register_expert_block_size_from_metrics_when_the_launch_does_not_say(tmp_path: Path) -> None:
    target = _target(tmp_path, SYNTHETIC)  # launched with a run-time `threads`
    kernels = (KernelResources("_Z9axpy_rowsPKfPfii", ARCH, registers=72),)
    # 72 registers: 3 blocks of 256 threads; a block of 1024 does not fit (0 blocks) until 64.
    at_256 = RegisterExpert().propose(AnalysisContext(target, ARCH, kernels=kernels))
    at_1024 = RegisterExpert().propose(AnalysisContext(target, ARCH, kernels=kernels, metrics={"block_size": 1024}))
    assert "256 threads per block" in at_256[0].description
    assert "1024 threads per block" in at_1024[0].description
    assert at_1024[0].search_params == {"maxrregcount": (64, 32)}


def test_block_size_resolves_constants_and_dim3() -> None:
    assert evaluate("kBlock", {"kBlock": 256}) == 256
    assert evaluate("dim3(kTile, 8)", {"kTile": 32}) == 256
    assert evaluate("threads", {}) is None
    model = analyze((TARGETS / "regpressure" / "regpressure.cu").read_text(), "regpressure.cu")
    assert block_size(SERIES_SUM, [model], {"block_size": 64}) == 256
    assert block_size("_Z5otheri", [model], {"block_size": 64}) == 64


# --- UnrollExpert ----------------------------------------------------------------------------

def test_unroll_expert_leaves_the_pragmad_tap_loop_of_unroll_cu_alone() -> None:
    target = load_target(TARGETS / "unroll" / "target.yaml")
    proposals = UnrollExpert().propose(AnalysisContext(target, ARCH))
    tap_loop = next(loop for loop in analyze((TARGETS / "unroll" / "unroll.cu").read_text()).kernel("fir").loops
                    if loop.variable == "t")
    assert tap_loop.unroll is not None and tap_loop.unroll.argument == "kUnroll"
    assert all(f":{tap_loop.span.start_line} " not in p.description for p in proposals)
    for proposal in proposals:  # the staging loop may be proposed; the tap loop's pragma stays single
        [(_, text)] = proposal.files
        assert text.count("#pragma unroll kUnroll\n  for (int t = 0;") == 1


def test_unroll_expert_proposes_a_factor_for_runtime_loops_and_full_unroll_for_constant_ones(tmp_path: Path) -> None:
    target = _target(tmp_path, SYNTHETIC)
    proposals = UnrollExpert().propose(AnalysisContext(target, ARCH))
    by_line = {int(p.description.split(":")[1].split()[0]): p for p in proposals}
    assert sorted(by_line) == [8, 10, 13]  # the runtime loop, the constant loop, the `unroll 1` loop
    runtime = by_line[8]
    assert runtime.search_params == {"WF_UNROLL_N": (1, 2, 4, 8, 16)}
    [(path, text)] = runtime.files
    assert path == "k.cu"
    assert ("#ifndef WF_UNROLL_N\n#define WF_UNROLL_N 1\n#endif\n#ifndef WF_UNROLL_N_DECLARED\n"
            "#define WF_UNROLL_N_DECLARED\nconstexpr int kWfUnrollN = WF_UNROLL_N;\n#endif\n") in text
    assert "  #pragma unroll kWfUnrollN\n  for (int c = 0; c < cols; ++c)" in text
    for line in (10, 13):
        assert by_line[line].search_params == {}
        [(_, full)] = by_line[line].files
        assert "WF_UNROLL_N" not in full
        assert full.count("#pragma unroll\n") == 1
        assert ("#pragma unroll 1" in full) == (line == 10)  # line 13's `unroll 1` is replaced
        loops = analyze(full).kernel("axpy_rows").loops
        bare = [loop.header for loop in loops if loop.unroll is not None and loop.unroll.argument is None]
        assert bare == ["for (int k = 0; k < kTile; ++k)"]


def test_unroll_expert_skips_a_loop_in_a_readonly_region(tmp_path: Path) -> None:
    target = _target(tmp_path, READONLY)
    assert UnrollExpert().propose(AnalysisContext(target, ARCH)) == []
    unguarded = _target(tmp_path / "open", READONLY.replace("  // warpfleet: readonly begin\n", "")
                        .replace("  // warpfleet: readonly end\n", ""))
    assert len(UnrollExpert().propose(AnalysisContext(unguarded, ARCH))) == 1


def test_unroll_expert_does_not_propose_twice_on_its_own_variant(tmp_path: Path) -> None:
    target = _target(tmp_path, SYNTHETIC)
    runtime = next(p for p in UnrollExpert().propose(AnalysisContext(target, ARCH)) if p.search_params)
    again = _target(tmp_path / "again", runtime.files[0][1])
    assert all(not p.search_params for p in UnrollExpert().propose(AnalysisContext(again, ARCH)))


@pytest.mark.nvcc
@needs("nvcc")
def test_unroll_variant_compiles_and_the_pragma_takes_the_macro(tmp_path: Path) -> None:
    target = _target(tmp_path / "t", SYNTHETIC)
    runtime = next(p for p in UnrollExpert().propose(AnalysisContext(target, ARCH)) if p.search_params)
    [(_, text)] = runtime.files
    source = tmp_path / "variant.cu"
    source.write_text(text)

    def build(factor: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nvcc", f"-arch={ARCH}", "-c", f"-DWF_UNROLL_N={factor}", str(source),
                               "-o", str(tmp_path / f"v{factor}.o")], capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(build, (1, 8)))
    for result in results:
        assert result.returncode == 0, result.stderr
    for factor in (1, 8):
        loop = next(loop for loop in analyze(text, defines={"WF_UNROLL_N": factor}).kernel("axpy_rows").loops
                    if loop.variable == "c")
        assert loop.unroll is not None and (loop.unroll.argument, loop.unroll.value) == ("kWfUnrollN", factor)


TWO_KERNELS = r"""__global__ void scale(float* y, int n, int reps) {
  float acc = y[threadIdx.x];
  for (int r = 0; r < reps; ++r) acc *= 0.5f;
  y[threadIdx.x] = acc;
}

__global__ void shift(float* y, int n, int reps) {
  float acc = y[threadIdx.x];
  for (int r = 0; r < reps; ++r) acc += 0.5f;
  y[threadIdx.x] = acc;
}
"""


@pytest.mark.nvcc
@needs("nvcc")
def test_a_stack_of_unrolls_in_two_kernels_declares_the_factor_once_and_builds(tmp_path: Path) -> None:
    """Each searched unroll puts its factor's declaration above its own kernel; a stack of two, one
    in each kernel of a file, had it twice and did not compile (fastWalshTransform on an H200)."""
    from agents.workflow import Level
    from agents.workflow.stack import Part, stack

    target = _target(tmp_path / "t", TWO_KERNELS)
    proposals = [p for p in UnrollExpert().propose(AnalysisContext(target, ARCH)) if p.search_params]
    assert len(proposals) == 2
    parts = [Part(f"unroll {i}", Level.COMPILER_HINT, p) for i, p in enumerate(proposals)]
    result = stack({"k.cu": TWO_KERNELS}, parts)
    assert result is not None and len(result.parts) == 2
    text = dict(result.proposal.files)["k.cu"]
    assert text.count("constexpr int kWfUnrollN") == 2 and text.count("#pragma unroll kWfUnrollN") == 2
    source = tmp_path / "stacked.cu"
    source.write_text(text)
    built = subprocess.run(["nvcc", f"-arch={ARCH}", "-c", "-DWF_UNROLL_N=4", str(source), "-o", str(tmp_path / "s.o")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    for kernel in ("scale", "shift"):
        [loop] = analyze(text, defines={"WF_UNROLL_N": 4}).kernel(kernel).loops
        assert loop.unroll is not None and loop.unroll.value == 4
