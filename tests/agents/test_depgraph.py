"""agents.depgraph: hazards of a host function's CUDA work, the ordering its streams guarantee,
and the check that a streamified program keeps every dependency."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agents.cuda_source import analyze
from agents.depgraph import Dependency, Hazard, KernelGraph, base_buffer, check, extract, ordering
from tests.conftest import needs

KERNELS = r"""#include <cuda_runtime.h>

__global__ void scale_kernel(const float* x, float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = 2.0f * x[i];
}
__global__ void poly_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * x[i] * x[i] + 1.0f;
}
__global__ void square_kernel(const float* x, float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] = x[i] * x[i];
}
__global__ void shift_kernel(const float* x, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = x[i] + 1.0f;
}
__global__ void combine_kernel(const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.5f * y[i];
}

void run(const float* d_x, float* d_a, float* d_b, float* d_y, float* d_c, float* d_out, float* h_out, int n) {
    dim3 block(256), grid((n + 255) / 256);
"""
END = "}\n"

SERIAL = """
    scale_kernel<<<grid, block>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_x, d_y, n);
    square_kernel<<<grid, block>>>(d_x, d_b, n);
    shift_kernel<<<grid, block>>>(d_x, d_c, n);
    combine_kernel<<<grid, block>>>(d_y, d_out, n);
    cudaMemcpy(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost);
"""

STREAMIFIED = """
    cudaStream_t s_scale, s_poly, s_square, s_shift, s_combine;
    cudaStreamCreateWithFlags(&s_scale, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s_poly, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s_square, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s_shift, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s_combine, cudaStreamNonBlocking);
    cudaEvent_t y_ready;
    cudaEventCreateWithFlags(&y_ready, cudaEventDisableTiming);
    scale_kernel<<<grid, block, 0, s_scale>>>(d_x, d_a, n);
    poly_kernel<<<grid, block, 0, s_poly>>>(d_x, d_y, n);
    cudaEventRecord(y_ready, s_poly);
    square_kernel<<<grid, block, 0, s_square>>>(d_x, d_b, n);
    shift_kernel<<<grid, block, 0, s_shift>>>(d_x, d_c, n);
    cudaStreamWaitEvent(s_combine, y_ready, 0);
    combine_kernel<<<grid, block, 0, s_combine>>>(d_y, d_out, n);
    cudaDeviceSynchronize();
    cudaMemcpy(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaEventDestroy(y_ready);
"""

EVENT_LINES = ("    cudaEventRecord(y_ready, s_poly);\n", "    cudaStreamWaitEvent(s_combine, y_ready, 0);\n")
SYNC_LINE = "    cudaDeviceSynchronize();\n"
COPY_LINE = "    cudaMemcpy(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost);\n"


def program(body: str) -> str:
    return KERNELS + body + END


def graph(body: str) -> KernelGraph:
    model = analyze(program(body), "synthetic.cu")
    assert model.errors == ()
    return extract(model, "run")


def without(body: str, *lines: str) -> str:
    for line in lines:
        assert line in body
        body = body.replace(line, "", 1)
    return body


def named(g: KernelGraph, dep: Dependency) -> tuple[str, str, Hazard, str]:
    return g.nodes[dep.source].label, g.nodes[dep.target].label, dep.hazard, dep.buffer


def index(g: KernelGraph, label: str) -> int:
    return next(n.index for n in g.nodes if n.label == label)


def reasons(original: str, transformed: str) -> list[str]:
    return [v.reason for v in check(graph(original), graph(transformed)).violations]


# -- the graph -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "buffer"), [
    ("d_y", "d_y"), ("&d_y[4]", "d_y"), ("d_y + offset", "d_y"), ("(float*)d_y", "d_y"),
    ("static_cast<float*>(d_y) + 1", "d_y"), ("reinterpret_cast<float4*>(&d_y[2 * i])", "d_y"),
    ("(d_y) + 4", "d_y"), ("state->y", "state->y"), ("v.data()", "v"), ("nullptr", None), ("0", None),
])
def test_base_buffer_strips_casts_address_offsets_and_indexing(expr: str, buffer: str | None) -> None:
    assert base_buffer(expr) == buffer


def test_four_independent_kernels_and_one_consumer_have_exactly_one_raw_edge() -> None:
    g = graph(without(SERIAL, COPY_LINE))
    assert [n.label for n in g.nodes] == ["scale_kernel", "poly_kernel", "square_kernel", "shift_kernel",
                                          "combine_kernel"]
    assert g.nodes[1].reads == {"d_x"} and g.nodes[1].writes == {"d_y"}
    assert [named(g, e) for e in g.edges] == [("poly_kernel", "combine_kernel", Hazard.RAW, "d_y")]


def test_the_copy_back_depends_on_the_consumer_and_sync_points_are_nodes() -> None:
    g = graph(STREAMIFIED)
    assert [named(g, e) for e in g.edges] == [
        ("poly_kernel", "combine_kernel", Hazard.RAW, "d_y"),
        ("combine_kernel", "memcpy(h_out, d_out)", Hazard.RAW, "d_out"),
    ]
    kinds = [n.kind.value for n in g.nodes if not n.is_data]
    assert kinds == ["event_record", "stream_wait_event", "device_sync"]


def test_war_and_waw_edges() -> None:
    body = """
    scale_kernel<<<grid, block>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_a, d_x, n);
    square_kernel<<<grid, block>>>(d_y, d_x + 0, n);
    cudaMemset(d_a, 0, n * sizeof(float));
"""
    g = graph(body)
    assert sorted(named(g, e) for e in g.edges) == sorted([
        ("scale_kernel", "poly_kernel", Hazard.RAW, "d_a"),
        ("scale_kernel", "poly_kernel", Hazard.WAR, "d_x"),
        ("scale_kernel", "square_kernel", Hazard.WAR, "d_x"),
        ("poly_kernel", "square_kernel", Hazard.WAW, "d_x"),
        ("scale_kernel", "memset(d_a)", Hazard.WAW, "d_a"),
        ("poly_kernel", "memset(d_a)", Hazard.WAR, "d_a"),
    ])


# -- ordering ------------------------------------------------------------------------------------


def _two_streams(create: str) -> KernelGraph:
    return graph(f"""
    cudaStream_t s1, s2;
    {create}(&s1{", cudaStreamNonBlocking" if create.endswith("WithFlags") else ""});
    cudaStreamCreate(&s2);
    scale_kernel<<<grid, block, 0, s1>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_x, d_y, n);
    square_kernel<<<grid, block, 0, s1>>>(d_x, d_b, n);
    shift_kernel<<<grid, block, 0, s2>>>(d_x, d_c, n);
""")


def test_blocking_streams_order_with_the_legacy_default_stream() -> None:
    order = ordering(_two_streams("cudaStreamCreate"))
    scale, poly, square, shift = range(4)
    assert {(scale, poly), (poly, square), (poly, shift), (scale, square)} <= order
    assert (scale, shift) in order  # s1 -> default -> s2, transitively


def test_non_blocking_streams_do_not_order_with_the_default_stream() -> None:
    order = ordering(_two_streams("cudaStreamCreateWithFlags"))
    scale, poly, square, shift = range(4)
    assert (scale, square) in order  # the same stream
    assert (poly, shift) in order  # s2 is blocking
    assert not {(scale, poly), (poly, square), (scale, shift)} & order


def test_an_event_orders_only_what_was_recorded_before_it() -> None:
    g = graph("""
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEvent_t e;
    scale_kernel<<<grid, block, 0, s1>>>(d_x, d_a, n);
    cudaEventRecord(e, s1);
    poly_kernel<<<grid, block, 0, s1>>>(d_x, d_y, n);
    cudaStreamWaitEvent(s2, e, 0);
    square_kernel<<<grid, block, 0, s2>>>(d_x, d_b, n);
""")
    order = ordering(g)
    scale, poly, square = (index(g, k) for k in ("scale_kernel", "poly_kernel", "square_kernel"))
    assert (scale, square) in order
    assert (poly, square) not in order


def test_a_stream_synchronize_covers_only_its_stream() -> None:
    g = graph("""
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    scale_kernel<<<grid, block, 0, s1>>>(d_x, d_a, n);
    poly_kernel<<<grid, block, 0, s2>>>(d_x, d_y, n);
    cudaStreamSynchronize(s1);
    square_kernel<<<grid, block, 0, s2>>>(d_a, d_b, n);
""")
    order = ordering(g)
    scale, poly, square = (index(g, k) for k in ("scale_kernel", "poly_kernel", "square_kernel"))
    assert (scale, square) in order
    assert (poly, square) in order  # the same stream
    assert check(g, g).ok


# -- check ---------------------------------------------------------------------------------------


def test_a_correct_streamified_version_passes() -> None:
    result = check(graph(SERIAL), graph(STREAMIFIED))
    assert result.ok, [v.reason for v in result.violations]


def test_streamified_without_the_event_is_rejected_naming_the_dependency() -> None:
    broken = without(STREAMIFIED, *EVENT_LINES)
    g = graph(broken)
    poly, combine = (g.nodes[index(g, k)] for k in ("poly_kernel", "combine_kernel"))
    assert reasons(SERIAL, broken) == [
        f"combine_kernel (line {combine.line}) reads d_y written by poly_kernel (line {poly.line}) but may run "
        "before it: different streams (s_poly, s_combine), no event or synchronize between them"]


def test_a_dropped_kernel_is_rejected() -> None:
    dropped = without(STREAMIFIED, "    square_kernel<<<grid, block, 0, s_square>>>(d_x, d_b, n);\n")
    found = reasons(SERIAL, dropped)
    assert len(found) == 1 and found[0].startswith("square_kernel (line ")
    assert "not in the transformed program" in found[0]


def test_an_added_launch_is_rejected() -> None:
    extra = STREAMIFIED + "    shift_kernel<<<grid, block, 0, s_shift>>>(d_x, d_c, n);\n"
    found = reasons(SERIAL, extra)
    assert len(found) == 1 and found[0].startswith("shift_kernel #2 (line ")


@pytest.mark.parametrize(("create", "ok"), [("cudaStreamCreateWithFlags(&{}, cudaStreamNonBlocking)", False),
                                            ("cudaStreamCreate(&{})", True)])
def test_a_copy_back_before_the_synchronize_needs_blocking_streams(create: str, ok: bool) -> None:
    body = without(STREAMIFIED, SYNC_LINE, COPY_LINE).replace(
        "    cudaEventDestroy", COPY_LINE + SYNC_LINE + "    cudaEventDestroy")
    for name in ("s_scale", "s_poly", "s_square", "s_shift", "s_combine"):
        body = body.replace(f"cudaStreamCreateWithFlags(&{name}, cudaStreamNonBlocking)", create.format(name))
    found = reasons(SERIAL, body)
    if ok:
        assert found == []
    else:
        assert len(found) == 1
        assert found[0].startswith("memcpy(h_out, d_out) (line ")
        assert "reads d_out written by combine_kernel" in found[0]
        assert "s_combine is not synchronised with the default stream" in found[0]


def test_a_broken_war_dependency_is_rejected() -> None:
    serial = """
    scale_kernel<<<grid, block>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_y, d_x, n);
"""
    streamed = """
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    scale_kernel<<<grid, block, 0, s1>>>(d_x, d_a, n);
    poly_kernel<<<grid, block, 0, s2>>>(d_y, d_x, n);
"""
    found = reasons(serial, streamed)
    assert len(found) == 1 and "poly_kernel (line" in found[0] and "writes d_x read by scale_kernel" in found[0]
    assert reasons(serial, streamed.replace("cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking)",
                                            "cudaStreamCreate(&s2)").replace(", s2>>>", ", s1>>>")) == []


STAGED_SERIAL = """
    cudaMemcpy(d_x, h_x, n * sizeof(float), cudaMemcpyHostToDevice);
    poly_kernel<<<grid, block>>>(d_x, d_y, n);
"""
STAGE_LINE = "    cudaMemcpyToSymbolAsync(wf_table, d_x, 4 * sizeof(float), 0, cudaMemcpyDeviceToDevice, 0);\n"


def test_a_copy_staging_new_memory_before_its_launch_passes_and_a_misplaced_one_does_not() -> None:
    """The constant expert's copy into a new __constant__ table: it writes nothing the original
    touches, so it may be added, if it sees what its launch would have read."""
    h2d, launch = STAGED_SERIAL.splitlines(keepends=True)[1:]
    assert reasons(STAGED_SERIAL, h2d + STAGE_LINE + launch) == []
    early = reasons(STAGED_SERIAL, STAGE_LINE + h2d + launch)  # reads d_x before it is filled
    assert len(early) == 1 and early[0].startswith("memcpy(wf_table, d_x) (line ")
    assert "which memcpy(d_x, h_x) (line" in early[0] and "may not run after it" in early[0]
    late = reasons(STAGED_SERIAL, h2d + launch + STAGE_LINE)  # after the launch it should stage for
    assert len(late) == 1 and "stages memory that no later launch on its stream reads" in late[0]
    into_old = reasons(STAGED_SERIAL, h2d + STAGE_LINE.replace("wf_table", "d_y") + launch)  # the original's memory
    assert len(into_old) == 1 and "is in the transformed program but not in the original" in into_old[0]


TIMED = """
    cudaMemcpy(d_y, h_out, n * sizeof(float), cudaMemcpyHostToDevice);
    wf::bench(opt, [&](cudaStream_t stream) {
        combine_kernel<<<grid, block, 0, stream>>>(d_y, d_out, n);
    }STREAM);
"""


def test_the_harness_hands_its_launch_lambda_the_default_stream_unless_told_otherwise() -> None:
    """wf::bench(opt, launch) runs `launch` on the legacy default stream: the copy before it is
    ordered with the timed kernel, so a schedule that breaks that order is refused; a non-blocking
    stream handed to bench orders nothing with the copy."""
    timed = graph(TIMED.replace("STREAM", ""))
    copy, kernel = index(timed, "memcpy(d_y, h_out)"), index(timed, "combine_kernel")
    assert (copy, kernel) in ordering(timed) and "stream" in timed.blocking_streams
    moved = TIMED.replace("STREAM", "").replace(", 0, stream>>>", ", 0, s_new>>>").replace(
        "    wf::bench", "    cudaStream_t s_new;\n    cudaStreamCreateWithFlags(&s_new, cudaStreamNonBlocking);\n"
        "    wf::bench")
    found = reasons(TIMED.replace("STREAM", ""), moved)
    assert len(found) == 1 and "combine_kernel (line" in found[0] and "reads d_y written by memcpy" in found[0]
    handed = graph("    cudaStream_t s_nb;\n    cudaStreamCreateWithFlags(&s_nb, cudaStreamNonBlocking);\n"
                   + TIMED.replace("STREAM", ", s_nb"))
    assert "stream" not in handed.blocking_streams
    assert (index(handed, "memcpy(d_y, h_out)"), index(handed, "combine_kernel")) not in ordering(handed)


# -- the programs are real CUDA ------------------------------------------------------------------


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("body", [SERIAL, STREAMIFIED], ids=["serial", "streamified"])
def test_the_synthetic_programs_compile(body: str, tmp_path: Path) -> None:
    source = tmp_path / "synthetic.cu"
    source.write_text(program(body))
    done = subprocess.run(["nvcc", "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "synthetic.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr


# A launch on a stream the function was given (the harness's `stream`): the analysis cannot tell
# that it is the default stream, so the original leaves the copy before it unordered.
PASSED_STREAM = """
    cudaStream_t given = pick_stream();
    cudaMemcpy(d_out, h_out, n * sizeof(float), cudaMemcpyHostToDevice);
    combine_kernel<<<grid, block, 0, given>>>(d_y, d_out, n);
"""


def test_a_dependency_the_original_leaves_unordered_is_not_the_transformations_to_keep():
    original = graph(PASSED_STREAM)
    assert original.edges and not check(original, original).violations
    unrolled = graph("\n    // an unroll pragma elsewhere moved every line down\n" + PASSED_STREAM)
    assert check(original, unrolled).ok
    dropped = graph(PASSED_STREAM.replace("    combine_kernel<<<grid, block, 0, given>>>(d_y, d_out, n);\n", ""))
    assert not check(original, dropped).ok  # a dropped kernel is still caught


def test_a_synchronize_under_a_condition_orders_nothing_but_an_early_return_guards_all_alike() -> None:
    guarded = """
    scale_kernel<<<grid, block, 0, s1>>>(d_x, d_a, n);
    if (n > 4096) cudaDeviceSynchronize();
    poly_kernel<<<grid, block, 0, s2>>>(d_a, d_y, n);
"""
    prefix = "    cudaStream_t s1, s2;\n    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);\n" \
             "    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);\n"
    g = graph(prefix + guarded)
    scale, poly = index(g, "scale_kernel"), index(g, "poly_kernel")
    assert (scale, poly) not in ordering(g)  # the synchronize may not have run
    early = graph(prefix + "    if (n < 0) return;\n" + guarded.replace("if (n > 4096) ", ""))
    assert all(node.conditional for node in early.nodes)  # everything after the return may not run...
    assert (index(early, "scale_kernel"), index(early, "poly_kernel")) in ordering(early)  # ...but together


def test_a_conditional_argument_is_read_through_both_arms() -> None:
    # `flag ? d_a : d_b`: the launch may read either; the memset of d_b after it must wait (WAR).
    g = graph("""
    int flag = n > 4;
    scale_kernel<<<grid, block>>>(flag ? d_a : d_b, d_y, n);
    cudaMemset(d_b, 0, n * sizeof(float));
""")
    assert g.nodes[index(g, "scale_kernel")].reads == {"d_a", "d_b"}
    assert ("scale_kernel", "memset(d_b)", Hazard.WAR, "d_b") in {named(g, e) for e in g.edges}


ONE_ELEMENT = r"""#include <cuda_runtime.h>
__global__ void total(const float* x, float* sum, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += x[i];
    if (threadIdx.x == 0) *sum = s;
}
__global__ void totals(const float* x, float* sum, int n) {
    if (threadIdx.x < 2) sum[threadIdx.x] = x[threadIdx.x];
}
void run(const float* d_x, float* d_sum, int n) {
    KERNEL<<<1, 32>>>(d_x, d_sum + 0, n);
    KERNEL<<<1, 32>>>(d_x + n, d_sum + 1, n);
    KERNEL<<<1, 32>>>(d_x, d_sum + 1, n);
}
"""


@pytest.mark.parametrize("kernel, disjoint", [("total", True), ("totals", False)])
def test_a_kernel_writing_one_element_through_a_pointer_writes_that_element_alone(kernel: str, disjoint: bool) -> None:
    # total writes only *sum: d_sum + 0 and d_sum + 1 are different elements, d_sum + 1 twice the
    # same one. totals writes sum[threadIdx.x]: any offset may overlap another.
    model = analyze(ONE_ELEMENT.replace("KERNEL", kernel), "one.cu")
    assert (model.kernel(kernel).single_element == {"sum"}) is disjoint
    g = extract(model, "run")
    waw = sorted((e.source, e.target) for e in g.edges if e.hazard is Hazard.WAW)
    assert waw == ([(1, 2)] if disjoint else [(0, 1), (0, 2), (1, 2)])
