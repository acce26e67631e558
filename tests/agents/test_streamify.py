"""Streamify in each of its forms: independent launches in a row, in a counted loop (in its body
or through a helper, writing disjoint slices), in a loop of unknown count (a pool), separated by
host code, on an explicit stream, through helpers; each verified by depgraph.check and by the
verifier's static verdicts, and each with a planted wrong schedule that must be rejected."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.experts import StreamifyExpert
from agents.experts._streams import Plan
from agents.experts.streamify import Finding, streamify
from cluster.config import Target, load_target
from cluster.engine.verification.verify import depgraph_verdict, static_verdicts
from tests.agents.test_depgraph import END, SERIAL
from tests.agents.test_depgraph import KERNELS as GRAPH_KERNELS
from tests.configs._builds import SUITE_BUILDS, build_once
from tests.conftest import needs

ARCH = "sm_90"

KERNELS = r"""#include <cuda_runtime.h>
#include <cstdio>
#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { std::printf("%d\n", (int)e_); } } while (0)
constexpr int kFilters = 4;
constexpr int kTaps = 9;

__global__ void filter(const float* in, const float* taps, float* out, int f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * taps[f % kTaps];
}
__global__ void combine(const float* parts, float* res, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) res[i] = parts[i] + parts[n + i] + parts[2 * n + i] + parts[3 * n + i];
}
__global__ void combine4(const float* a, const float* b, const float* c, const float* d, float* res, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) res[i] = a[i] + b[i] + c[i] + d[i];
}
__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""

# The motivating program: four small independent kernels in a loop over the filter index, each
# writing its own slice, then a kernel reading all four.
LOOP_BODY = KERNELS + r"""
void run(const float* d_in, const float* d_taps, float* d_out, float* d_res, float* h_res, int n) {
    const int threads = 256, blocks = (n + threads - 1) / threads;
    for (int f = 0; f < kFilters; ++f) {
        filter<<<blocks, threads>>>(d_in, d_taps, d_out + f * n, f, n);
    }
    combine<<<blocks, threads>>>(d_out, d_res, n);
    CHECK(cudaMemcpy(h_res, d_res, n * sizeof(float), cudaMemcpyDeviceToHost));
}
"""

# The same through a helper that takes the stream, each filter's output a buffer of its own.
HELPER_LOOP = KERNELS + r"""
static void enqueue(int f, const float* in, const float* taps, float* out, int n, cudaStream_t stream) {
    filter<<<(n + 255) / 256, 256, 0, stream>>>(in, taps, out, f, n);
}
void run(const float* d_in, const float* d_taps, float* d_res, float* h_res, int n) {
    float* outs[kFilters];
    for (int f = 0; f < kFilters; ++f) CHECK(cudaMalloc(&outs[f], n * sizeof(float)));
    for (int f = 0; f < kFilters; ++f) enqueue(f, d_in, d_taps, outs[f], n, 0);
    combine4<<<(n + 255) / 256, 256>>>(outs[0], outs[1], outs[2], outs[3], d_res, n);
    CHECK(cudaMemcpy(h_res, d_res, n * sizeof(float), cudaMemcpyDeviceToHost));
}
"""

# A loop whose count is only known at run time: a pool of streams.
POOL = KERNELS + r"""
void run(const float* d_in, const float* d_taps, float* d_out, float* d_res, int count, int n) {
    for (int f = 0; f < count; ++f) filter<<<(n + 255) / 256, 256>>>(d_in, d_taps, d_out + f * n, f, n);
    combine<<<(n + 255) / 256, 256>>>(d_out, d_res, n);
}
"""

# Launches on a stream of the program's own, with host code between them.
EXPLICIT = KERNELS + r"""
void run(const float* d_x, float* d_a, float* d_b, float* d_res, float* h, int n) {
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    scale<<<(n + 255) / 256, 256, 0, s>>>(d_x, d_a, n);
    double checksum = 0.0;
    for (int i = 0; i < 16; ++i) checksum += h[i];
    std::printf("host work between the launches: %f\n", checksum);
    scale<<<(n + 255) / 256, 256, 0, s>>>(d_x, d_b, n);
    combine<<<(n + 255) / 256, 256, 0, s>>>(d_a, d_res, n);
    CHECK(cudaStreamSynchronize(s));
}
"""

# Straight-line calls of helpers that take the stream.
HELPERS = KERNELS + r"""
static void first(const float* x, float* y, int n, cudaStream_t stream) { scale<<<1, 256, 0, stream>>>(x, y, n); }
static void second(const float* x, float* y, int n, cudaStream_t stream) {
    float* half = y + n / 2;
    scale<<<1, 256, 0, stream>>>(x, half, n / 2);
}
void run(const float* d_x, float* d_a, float* d_b, float* d_res, int n, cudaStream_t stream) {
    first(d_x, d_a, n, stream);
    second(d_x, d_b, n, stream);
    combine<<<1, 256, 0, stream>>>(d_b, d_res, n);
}
"""


def kernel_target(folder: Path, source: str) -> Target:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(source)
    spec = {"name": "k", "toolchain": "nvcc", "sources": ["kernel.cu"], "run": ["{binary}"], "params": {}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec))
    return load_target(folder / "target.yaml")


def findings(source: str, sabotage=None) -> list[Finding]:
    model = analyze(source, "kernel.cu")
    return streamify({"kernel.cu": source}, ["kernel.cu"], "kernel.cu", model, "run", sabotage=sabotage)


def proposed(tmp_path: Path, source: str) -> tuple[Target, Proposal, str]:
    target = kernel_target(tmp_path, source)
    [proposal] = StreamifyExpert().propose(AnalysisContext(target, ARCH))
    assert "depgraph.check: ok" in proposal.description
    assert all(not v.failed for v in static_verdicts(target, proposal))
    return target, proposal, dict(proposal.files)["kernel.cu"]


def line(source: str, fragment: str) -> int:
    return next(i for i, text in enumerate(source.split("\n"), 1) if fragment in text)


def rejected(target: Target, text: str, path: str = "kernel.cu") -> str:
    """The verifier's verdict on a planted wrong schedule: it must fail, and say why."""
    verdict = depgraph_verdict(target, Proposal("planted", "", ((path, text),)))
    assert verdict.failed, verdict
    return verdict.detail


def without(text: str, pattern: str) -> str:
    lines = [line for line in text.split("\n") if not re.search(pattern, line)]
    assert len(lines) < len(text.split("\n")), pattern
    return "\n".join(lines)


# -- launches in a row -------------------------------------------------------------------------

JOIN_KERNEL = """__global__ void join_kernel(const float* y, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = y[i] + b[i];
}

"""
# The consumer reads two producers: one stream continues, the other needs an event.
JOIN = SERIAL.replace("combine_kernel<<<grid, block>>>(d_y, d_out, n)",
                      "join_kernel<<<grid, block>>>(d_y, d_b, d_out, n)")


def program(body: str) -> str:
    return GRAPH_KERNELS.replace("void run(", JOIN_KERNEL + "void run(") + body + END


def test_four_independent_kernels_and_a_consumer_of_one_continue_its_stream(tmp_path: Path) -> None:
    target, proposal, text = proposed(tmp_path, program(SERIAL))
    assert "5 tasks on 4 non-blocking streams forked from the default stream" in proposal.description
    assert "combine_kernel<<<grid, block, 0, wf_st0[1]>>>" in text  # a chain stays on poly_kernel's stream
    assert "wf_dep0" not in text and "cudaEventRecord(wf_fork0, 0);" in text
    assert text.index("cudaStreamWaitEvent(0, wf_join0[wf_i], 0);") < text.index("cudaMemcpy(h_out")
    assert "memcpy(h_out, d_out) (line" in rejected(target, without(text, r"cudaStreamWaitEvent\(0, wf_join0"))


def test_a_consumer_of_two_streams_waits_on_an_event(tmp_path: Path) -> None:
    target, proposal, text = proposed(tmp_path, program(JOIN))
    assert "join_kernel (line 36) waits for poly_kernel (line 33)" in proposal.description
    assert text.index("poly_kernel<<<grid, block, 0, wf_st0[1]>>>") < text.index(
        "cudaEventRecord(wf_dep0[0], wf_st0[1]);") < text.index("cudaStreamWaitEvent(wf_st0[2], wf_dep0[0], 0);") \
        < text.index("join_kernel<<<grid, block, 0, wf_st0[2]>>>")
    detail = rejected(target, without(text, r"cudaStreamWaitEvent\(wf_st0\[2\], wf_dep0"))
    assert "join_kernel (line" in detail and "reads d_y written by poly_kernel" in detail


def test_a_chain_of_dependent_kernels_gets_nothing() -> None:
    chain = program("""
    scale_kernel<<<grid, block>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_a, d_y, n);
    combine_kernel<<<grid, block>>>(d_y, d_out, n);
""")
    [finding] = findings(chain)
    assert not finding.applicable and finding.reason.startswith("no two tasks are independent: nothing to overlap")


def test_launches_in_a_readonly_region_are_left_alone() -> None:
    body = "    // warpfleet: readonly begin\n" + SERIAL.lstrip("\n") + "    // warpfleet: readonly end\n"
    [finding] = findings(program(body))
    assert "the patch was refused" in finding.reason and "[readonly]" in finding.reason


# -- independent launches in a counted loop ------------------------------------------------


def test_the_loop_of_filters_is_unrolled_into_tasks_and_the_combine_waits_for_each(tmp_path: Path) -> None:
    _, proposal, text = proposed(tmp_path, LOOP_BODY)
    assert "5 tasks on 4 non-blocking streams forked from the default stream" in proposal.description
    assert "static const int wf_tab0_0[4] = {0, 1, 2, 3};" in text
    assert "filter<<<blocks, threads, 0, wf_st0[wf_tab0_0[f]]>>>(d_in, d_taps, d_out + f * n, f, n);" in text
    for f, event in ((0, 0), (1, 1), (2, 2)):  # iteration 3 shares the combine's stream
        assert f"if (f == {f}) CHECK(cudaEventRecord(wf_dep0[{event}], wf_st0[{f}]));" in text
        assert f"CHECK(cudaStreamWaitEvent(wf_st0[3], wf_dep0[{event}], 0));" in text
    assert "combine<<<blocks, threads, 0, wf_st0[3]>>>" in text
    assert text.index("CHECK(cudaStreamWaitEvent(0, wf_join0[wf_i], 0));") < text.index("cudaMemcpy(h_res")


def test_a_planted_wrong_loop_schedule_is_rejected(tmp_path: Path) -> None:
    target, _, text = proposed(tmp_path, LOOP_BODY)
    planted = without(text, r"cudaStreamWaitEvent\(wf_st0\[3\], wf_dep0\[1\]")
    assert rejected(target, planted) == (
        f"kernel.cu:run: combine (line {line(planted, 'combine<<<')}) reads d_out written by filter #2 (line "
        f"{line(planted, 'filter<<<')}) but may run before it: different streams (wf_st0[1], wf_st0[3]), no event or "
        "synchronize between them")
    no_join = rejected(target, without(text, r"cudaStreamWaitEvent\(0, wf_join0"))
    assert "memcpy(h_res, d_res)" in no_join and "reads d_res written by combine" in no_join
    [broken] = findings(LOOP_BODY, sabotage=lambda plan: Plan(plan.streams))  # the events left out
    assert broken.proposal is None and broken.reason.startswith("depgraph.check rejected the transformation:")


def test_a_loop_through_a_helper_with_an_array_of_slices(tmp_path: Path) -> None:
    target, _, text = proposed(tmp_path, HELPER_LOOP)
    assert "for (int f = 0; f < kFilters; ++f) {\n        enqueue(f, d_in, d_taps, outs[f], n, wf_st0[wf_tab0_0[f]]);" \
           "\n        if (f == 0) CHECK(cudaEventRecord(wf_dep0[0], wf_st0[0]));" in text
    assert "static const int wf_tab0_0[4] = {0, 1, 2, 3};" in text
    assert "combine4<<<(n + 255) / 256, 256, 0, wf_st0[3]>>>" in text
    planted = text.replace("wf_tab0_0[4] = {0, 1, 2, 3}", "wf_tab0_0[4] = {0, 1, 2, 0}")  # 3 on 0: no event for it
    assert "combine4 (line" in rejected(target, planted) and "reads outs[3] written by filter #4" in rejected(
        target, planted)


def test_iterations_that_write_one_buffer_are_not_spread(tmp_path: Path) -> None:
    serial = LOOP_BODY.replace("d_out + f * n, f, n);", "d_out, f, n);")
    [finding] = findings(serial)
    assert not finding.applicable and "no two tasks are independent" in finding.reason


def test_a_helper_without_a_stream_parameter_is_named(tmp_path: Path) -> None:
    source = HELPER_LOOP.replace(", cudaStream_t stream) {", ") {").replace(", 0, stream>>>", ">>>").replace(
        "outs[f], n, 0);", "outs[f], n);")
    [finding] = findings(source)
    assert not finding.applicable and finding.reason.startswith(
        f"enqueue (line {line(source, 'enqueue(f, ')}) launches without taking a cudaStream_t to launch on")


# -- a loop of unknown count -----------------------------------------------------------------


def test_a_loop_of_unknown_count_goes_on_a_pool(tmp_path: Path) -> None:
    target, proposal, text = proposed(tmp_path, POOL)
    assert "on a pool of 4 non-blocking streams" in proposal.description
    assert "filter<<<(n + 255) / 256, 256, 0, wf_st0[(f) % 4]>>>" in text
    assert "cudaStreamWaitEvent(0, wf_join0[wf_i], 0);" in text
    detail = rejected(target, without(text, r"cudaStreamWaitEvent\(0, wf_join0"))
    assert "combine (line" in detail and "reads d_out written by filter" in detail


def test_dependent_iterations_of_unknown_count_are_not_pooled() -> None:
    [finding] = findings(POOL.replace("d_out + f * n, f, n)", "d_out, f, n)"))
    assert not finding.applicable
    assert finding.reason.startswith(f"iterations of the loop at line {line(POOL, 'for (int f')} depend on each other "
                                     "(WAW on d_out)")


# Independent problems in a counted loop, each an iteration chain too long to unroll: a step that
# reads the first input or the last result (`k == 0 ? ... : ...`), then a one-block kernel that
# writes the problem's result and one element of a shared array (`d_norm + p`, through `*norm`).
PROBLEMS = KERNELS + r"""
constexpr int kProblems = 4;
constexpr int kSteps = 24;
__global__ void step(int n, const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.5f * in[i] + 1.0f;
}
__global__ void rescale(int n, const float* y, float* x, float* norm) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += y[i] * y[i];
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = y[i] / (1.0f + s);
    if (threadIdx.x == 0) *norm = s;
}
void run(float* const* d_in, float* const* d_x, float* const* d_y, float* d_norm, float* h_norm, int n) {
    for (int p = 0; p < kProblems; ++p) {
        for (int k = 0; k < kSteps; ++k) {
            step<<<(n + 255) / 256, 256>>>(n, k == 0 ? d_in[p] : d_x[p], d_y[p]);
            rescale<<<1, 256>>>(n, d_y[p], d_x[p], d_norm + p);
        }
    }
    CHECK(cudaMemcpy(h_norm, d_norm, kProblems * sizeof(float), cudaMemcpyDeviceToHost));
}
"""


def test_independent_chains_writing_one_element_each_of_a_shared_array_go_on_streams(tmp_path: Path) -> None:
    # The inner loop's own tasks depend on each other in both directions (rescale feeds the next
    # step): that is no reason to fail the expert; the problems are what overlaps.
    target, proposal, text = proposed(tmp_path, PROBLEMS)
    assert "4 tasks on 4 non-blocking streams" in proposal.description
    assert "static const int wf_tab0_0[4] = {0, 1, 2, 3};" in text
    assert "rescale<<<1, 256, 0, wf_st0[wf_tab0_0[p]]>>>(n, d_y[p], d_x[p], d_norm + p);" in text
    detail = rejected(target, without(text, r"cudaStreamWaitEvent\(0, wf_join0"))  # the copy back before the join
    assert "memcpy(h_norm, d_norm) (line" in detail and "reads d_norm written by rescale" in detail


def test_chains_writing_a_shared_array_by_thread_are_not_spread() -> None:
    # rescale writing norm[threadIdx.x]: every problem's launch may write every element.
    source = PROBLEMS.replace("if (threadIdx.x == 0) *norm = s;", "norm[threadIdx.x] = s;")
    assert [f for f in findings(source) if f.applicable] == []


# -- host code between, an explicit stream, helpers ---------------------------------------------


def test_launches_on_an_explicit_stream_with_host_code_between(tmp_path: Path) -> None:
    target, proposal, text = proposed(tmp_path, EXPLICIT)
    assert "forked from `s`" in proposal.description
    assert "CHECK(cudaEventRecord(wf_fork0, s));" in text
    assert "CHECK(cudaStreamWaitEvent(s, wf_join0[wf_i], 0));" in text
    assert "std::printf(\"host work between the launches" in text  # the host code stays where it was
    assert "scale<<<(n + 255) / 256, 256, 0, wf_st0[1]>>>(d_x, d_b, n);" in text
    assert "combine<<<(n + 255) / 256, 256, 0, wf_st0[0]>>>(d_a, d_res, n);" in text  # after the first scale
    planted = text.replace("combine<<<(n + 255) / 256, 256, 0, wf_st0[0]>>>", "combine<<<(n + 255) / 256, 256, 0, "
                                                                              "wf_st0[1]>>>")
    assert "combine (line" in rejected(target, planted) and "reads d_a written by scale" in rejected(target, planted)


def test_a_library_call_between_launches_ends_the_region() -> None:
    source = EXPLICIT.replace("    std::printf(",
                              "    cublasSaxpy(handle, n, &alpha, d_a, 1, d_b, 1);\n    std::printf(")
    [finding] = findings(source)  # the first launch stays before the call, the other two are a region
    assert finding.line == line(source, "scale<<<(n + 255) / 256, 256, 0, s>>>(d_x, d_b, n);")
    assert finding.reason.startswith(f"2 tasks on 2 non-blocking streams forked from `s` (scale (line {finding.line})")
    library = source.replace("cublasSaxpy(handle, n, &alpha, d_a, 1, d_b, 1);", "my_library_scale(d_b, n);")
    [finding] = findings(library)  # a function of another file handed a device buffer: the same
    assert finding.line == line(library, "scale<<<(n + 255) / 256, 256, 0, s>>>(d_x, d_b, n);")
    printed = source.replace("cublasSaxpy(handle, n, &alpha, d_a, 1, d_b, 1);", "std::puts(\"no device memory\");")
    [finding] = findings(printed)  # host code that touches no device memory: one region of all three
    assert finding.line == line(printed, "scale<<<(n + 255) / 256, 256, 0, s>>>(d_x, d_a, n);")


def test_helpers_taking_the_stream_are_followed(tmp_path: Path) -> None:
    target, _, text = proposed(tmp_path, HELPERS)
    assert "first(d_x, d_a, n, wf_st0[0]);" in text and "second(d_x, d_b, n, wf_st0[1]);" in text
    assert "combine<<<1, 256, 0, wf_st0[1]>>>(d_b, d_res, n);" in text  # continues second's stream
    planted = text.replace("combine<<<1, 256, 0, wf_st0[1]>>>", "combine<<<1, 256, 0, wf_st0[0]>>>")
    detail = rejected(target, planted)
    assert "combine (line" in detail and "reads d_b written by scale #2" in detail


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("source", [program(JOIN), LOOP_BODY, HELPER_LOOP, POOL, EXPLICIT, HELPERS, PROBLEMS],
                         ids=["in-a-row", "loop", "helper-loop", "pool", "explicit", "helpers", "problems"])
def test_the_streamified_programs_compile(source: str, tmp_path: Path) -> None:
    _, _, text = proposed(tmp_path / "t", source)
    path = tmp_path / "streamified.cu"
    path.write_text(text)
    done = subprocess.run(["nvcc", f"-arch={ARCH}", "-c", str(path), "-o", str(tmp_path / "s.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr


# -- the suite's multikernel (a regression check: its loop through a helper, in a lambda) -----

MULTIKERNEL = Path(__file__).resolve().parents[2] / "configs" / "targets" / "multikernel"


def test_multikernel_gets_the_hand_written_schedule_and_the_verifier_passes_it() -> None:
    target = load_target(MULTIKERNEL / "target.yaml")
    findings = StreamifyExpert().findings(AnalysisContext(target, ARCH))
    [loop] = [f for f in findings if f.applicable]
    assert loop.where == "multikernel.cu:main (line 188)" and "8 tasks on 7 non-blocking streams" in loop.reason
    text = dict(loop.proposal.files)["multikernel.cu"]
    assert "static const int wf_tab0_0[8] = {0, 1, 2, 3, 4, 5, 6, 6};" in text  # 6 and its consumer 7 share
    assert "enqueue_task(t, dx, dy, n, wf_st0[wf_tab0_0[t]]);" in text
    assert "WF_CHECK(cudaEventRecord(wf_fork0, stream));" in text
    assert all(not v.failed for v in static_verdicts(target, loop.proposal))
    [helper] = [f for f in findings if not f.applicable]
    assert helper.reason.startswith("a helper called from main line 188 (in a loop): fewer than two tasks")
    planted = rejected(target, text.replace("{0, 1, 2, 3, 4, 5, 6, 6}", "{0, 1, 2, 3, 4, 5, 6, 5}"), "multikernel.cu")
    assert planted.startswith("multikernel.cu:main: combine_kernel (line ")
    assert "reads dy[6*" in planted and "written by poly_kernel #4" in planted


@pytest.mark.nvcc
@needs("nvcc")
@SUITE_BUILDS  # the variant's build is shared with the workflow's test of multikernel
def test_the_streamified_multikernel_builds_for_sm_90() -> None:
    from agents.patch import variant_target
    from cluster.core.types import Candidate, Phase, Status

    target = load_target(MULTIKERNEL / "target.yaml")
    [loop] = [f for f in StreamifyExpert().findings(AnalysisContext(target, ARCH)) if f.applicable]
    variant = variant_target(target, loop.proposal)
    candidate = Candidate(variant.name, "nvcc", "H100", ARCH, variant.bundle.hash, (), (), Phase.VERIFY)
    artifact = build_once(variant, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
