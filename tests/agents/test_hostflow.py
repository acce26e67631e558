"""agents.hostflow: a host function's CUDA operations as they run (helpers followed, loops
unfolded, constant conditions decided, names bound), and the regions agents.depgraph reads from
them (whole buffers, slots, elements of pointer arrays, lost pointers)."""

from __future__ import annotations

import pytest

from agents.cuda_source import analyze
from agents.depgraph import ANY, check, extract, overlap, region
from agents.hostflow import unfold

KERNELS = r"""#include <cuda_runtime.h>
constexpr int kParts = 3;
__global__ void fill(float* out, int n) { int i = threadIdx.x; if (i < n) out[i] = 1.0f; }
__global__ void copy(const float* in, float* out, int n) { int i = threadIdx.x; if (i < n) out[i] = in[i]; }
"""


def launches(body: str, function: str = "run") -> list[tuple[str, tuple[str, ...], str | None, bool]]:
    model = analyze(KERNELS + body, "k.cu")
    return [(s.op.api, s.op.launch.args, s.op.stream, s.conditional) for s in unfold(model, function)
            if s.op.launch is not None]


def test_a_counted_loop_is_unfolded_with_its_variable_bound() -> None:
    found = launches("void run(float* d, int n) { for (int p = 0; p < kParts; ++p) fill<<<1, 32>>>(d + p * n, n); }")
    assert found == [("fill", ("d + 0 * n", "n"), None, False), ("fill", ("d + 1 * n", "n"), None, False),
                     ("fill", ("d + 2 * n", "n"), None, False)]


def test_a_loop_of_unknown_count_is_unfolded_representatively_and_conditionally() -> None:
    found = launches("void run(float* d, int n, int m) { for (int p = 0; p < m; ++p) fill<<<1, 32>>>(d + p * n, n); }")
    assert len(found) == 8 and all(conditional for *_, conditional in found)
    assert found[7][1] == ("d + 7 * n", "n")
    looped = launches("void run(float* d, int n) { while (n > 0) { fill<<<1, 32>>>(d, n); n /= 2; } }")
    assert [args[0] for _, args, _, _ in looped] == ["d", "d"] and looped[0][1][1] == "n"
    assert looped[1][1][1].startswith("__wf_any_n_")  # n changed in the loop: a value the analysis lost


def test_helpers_are_followed_with_parameters_bound_and_constant_conditions_decided() -> None:
    body = r"""
static void step(int k, float* base, int n, cudaStream_t s) {
    float* mine = base + k * n;
    if (k == 2) { copy<<<1, 32, 0, s>>>(base, mine, n); } else { fill<<<1, 32, 0, s>>>(mine, n); }
}
void run(float* d, int n, cudaStream_t stream) {
    for (int k = 0; k < kParts; ++k) step(k, d, n, stream);
}
"""
    assert launches(body) == [("fill", ("(d + 0 * n)", "n"), "stream", False),
                              ("fill", ("(d + 1 * n)", "n"), "stream", False),
                              ("copy", ("d", "(d + 2 * n)", "n"), "stream", False)]
    undecided = body.replace("if (k == 2)", "if (k == n)")
    assert [(api, conditional) for api, _, _, conditional in launches(undecided)] == [
        ("copy", True), ("fill", True)] * 3


def test_allocations_swaps_lambdas_and_early_returns() -> None:
    body = r"""
void run(int n, bool quit) {
    float *a = nullptr, *b = nullptr;
    cudaMalloc(&a, n * sizeof(float));
    cudaMalloc(&b, n * sizeof(float));
    auto twice = [&](float* p) { fill<<<1, 32>>>(p, n); fill<<<1, 32>>>(p, n); };
    twice(a);
    std::swap(a, b);
    copy<<<1, 32>>>(a, b, n);
    if (quit) return;
    fill<<<1, 32>>>(b, n);
}
"""
    assert launches(body) == [("fill", ("a", "n"), None, False), ("fill", ("a", "n"), None, False),
                              ("copy", ("b", "a", "n"), None, False), ("fill", ("a", "n"), None, True)]


@pytest.mark.parametrize(("expr", "extents", "expected"), [
    ("d_y", ["n"], "d_y"),
    ("d_y + 3 * n", ["n"], "d_y[3*n:4*n]"),
    ("&d_y[(size_t)2 * n]", ["n"], "d_y[2*n:3*n]"),
    ("(float*)d_y + 3 * n", ["n"], "d_y[3*n:4*n]"),
    ("d_y + 3 * n", ["m"], "d_y"),  # the kernel is not handed the extent: all of it
    ("d_y + n * n", ["n"], "d_y"),  # not linear in n
    ("outs[2]", [], "outs[2]"),
    ("outs[k]", [], "outs[?]"),
    ("__wf_any_p_3", [], ANY),
    ("0", [], None),
])
def test_regions(expr: str, extents: list[str], expected: str | None) -> None:
    assert region(expr, extents) == expected


def test_overlap() -> None:
    assert not overlap("d_y[0*n:1*n]", "d_y[1*n:2*n]") and overlap("d_y[1*n:2*n]", "d_y[1*n:2*n]")
    assert overlap("d_y", "d_y[1*n:2*n]") and overlap("d_y[1*n:2*n]", "d_y[1*m:2*m]")  # another extent: may
    assert not overlap("outs[1]", "outs[2]") and overlap("outs[?]", "outs[2]") and not overlap("d_x", "d_y")
    assert overlap(ANY, "d_x")


def test_the_graph_of_slices_and_the_check_of_a_loop_on_streams() -> None:
    serial = "void run(float* d, int n) { for (int p = 0; p < kParts; ++p) fill<<<1, 32>>>(d + p * n, n); " \
             "copy<<<1, 32>>>(d, d + 3 * n, n); }"
    graph = extract(analyze(KERNELS + serial, "k.cu"), "run")
    assert [(e.source, e.target, e.hazard.value) for e in graph.edges] == [(0, 3, "RAW"), (1, 3, "RAW"),
                                                                           (2, 3, "RAW")]
    streams = serial.replace("void run(float* d, int n) {", "void run(float* d, int n, cudaStream_t* s) {").replace(
        "fill<<<1, 32>>>", "fill<<<1, 32, 0, s[p]>>>").replace("copy<<<1, 32>>>", "copy<<<1, 32, 0, s[0]>>>")
    result = check(graph, extract(analyze(KERNELS + streams, "k.cu"), "run"))
    assert [v.dependency.source for v in result.violations if v.dependency] == [1, 2]  # 0 shares s[0]


def test_what_may_leave_a_statement_early() -> None:
    from agents import _ts
    from agents.hostflow import may_exit

    def statement(code: str) -> _ts.Node:
        root = _ts.parser().parse(f"void f() {{ {code} }}".encode()).root_node
        return next(n for n in _ts.walk(root) if n.type == "compound_statement").named_children[0]

    assert not may_exit(statement("for (int i = 0; i < 4; ++i) { if (i == 2) break; }"))
    assert not may_exit(statement("while (x) { continue; }"))
    assert may_exit(statement("if (x) return;")) and may_exit(statement("{ if (x) break; }"))
    assert may_exit(statement("for (int i = 0; i < 4; ++i) { return; }"))
    assert not may_exit(statement("g([&] { return 1; });"))  # a lambda's return is its own


def test_nested_counted_loops_are_unfolded_exactly_only_up_to_the_limit() -> None:
    nested = "void run(float* d, int n) { for (int i = 0; i < 16; ++i) for (int j = 0; j < 16; ++j) " \
             "fill<<<1, 32>>>(d + (i * 16 + j) * n, n); }"
    found = launches(nested)
    assert len(found) == 16 * 4 and all(conditional for *_, conditional in found)  # 64 // 16 of each inner loop
    assert found[5][1] == ("d + (1 * 16 + 1) * n", "n")
    small = launches(nested.replace("j < 16", "j < 4"))
    assert len(small) == 64 and not any(conditional for *_, conditional in small)
