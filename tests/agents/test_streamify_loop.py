"""Streamify for launches made through a helper called in a counted loop (multikernel's shape):
per-iteration regions, the dependencies between iterations, the rewritten loop and its check."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import _ts
from agents._base import AnalysisContext
from agents.cuda_source import analyze
from agents.experts import StreamifyExpert
from agents.experts.streamify import plan_streams
from agents.experts.streamify_loop import check, dependencies, find_loops, instantiate, rewrite, stream_parameter
from agents.patch import variant_target
from cluster.config import load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.engine.verify import static_verdicts
from cluster.runners.build import compile_candidate
from tests.conftest import needs

MULTIKERNEL = Path(__file__).resolve().parents[2] / "configs" / "targets" / "multikernel"

HELPER = r"""#include <cuda_runtime.h>
__global__ void scale(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 2 * x[i]; }
__global__ void add(const float* x, const float* z, float* y, int n) {
    int i = threadIdx.x;
    if (i < n) y[i] = x[i] + z[i];
}
constexpr int kTasks = 4;
static void task(int t, const float* x, float* y, int n, cudaStream_t stream) {
    const float* xt = x + (size_t)t * n;
    float* yt = y + (size_t)t * n;
    if (t == 3) {
        add<<<1, 256, 0, stream>>>(xt, REF, yt, n);
    } else {
        scale<<<1, 256, 0, stream>>>(xt, yt, n);
    }
}
void run(const float* dx, float* dy, int n, cudaStream_t stream) {
    for (int t = 0; t < kTasks; ++t) task(t, dx, dy, n, stream);
}
"""


def model_of(source: str):
    root = _ts.parser().parse(_ts.preprocess(source.encode()).masked).root_node
    return analyze(source, "k.cu"), root


@pytest.mark.parametrize("ref, edges", [
    ("y + (size_t)1 * n", [(1, 3)]),       # task 3 reads task 1's slot: one dependency
    ("x + (size_t)1 * n", []),             # reads an input: none
    ("y", [(0, 3), (1, 3), (2, 3)]),       # the whole of y: after every writer of it
])
def test_iterations_regions_and_dependencies(ref, edges):
    model, root = model_of(HELPER.replace("REF", ref))
    [loop] = find_loops(model, HELPER, "run")
    assert (loop.values, loop.helper, loop.args) == ((0, 1, 2, 3), "task", ("t", "dx", "dy", "n", "stream"))
    assert stream_parameter(root, "task") == 4
    iterations = instantiate(model, root, loop)
    assert [it.kernels for it in iterations] == [("scale",), ("scale",), ("scale",), ("add",)]
    assert iterations[2].reads == {"dx[2]"} and iterations[2].writes == {"dy[2]"}
    graph = dependencies(iterations)
    assert [(d.source, d.target) for d in graph.edges] == edges


def test_a_condition_that_is_not_constant_keeps_both_branches():
    source = HELPER.replace("REF", "y + (size_t)1 * n").replace("if (t == 3)", "if (t == n)")
    model, root = model_of(source)
    [loop] = find_loops(model, source, "run")
    iterations = instantiate(model, root, loop)
    assert all(it.kernels == ("add", "scale") for it in iterations)  # either may run: both counted
    assert {(d.source, d.target) for d in dependencies(iterations).edges} >= {(1, 2), (1, 3)}


def test_the_rewritten_loop_keeps_every_dependency_and_a_broken_one_is_caught():
    source = HELPER.replace("REF", "y + (size_t)1 * n")
    model, root = model_of(source)
    [loop] = find_loops(model, source, "run")
    graph = dependencies(instantiate(model, root, loop))
    plan = plan_streams(graph)
    block = rewrite(loop, plan, 4, source)
    assert check(graph, block, loop) == []
    assert "wf_lstream[4] = {0, 1, 2, 1}" in block  # task 3 continues task 1's stream
    broken = block.replace("wf_lstream[4] = {0, 1, 2, 1}", "wf_lstream[4] = {0, 1, 2, 3}")
    assert check(graph, broken, loop) == ["iteration 3 RAW on dy[1] after iteration 1: different streams and no event"]


def test_multikernel_gets_the_hand_optimized_schedule_and_the_verifier_passes_it():
    target = load_target(MULTIKERNEL / "target.yaml")
    findings = StreamifyExpert().findings(AnalysisContext(target, "sm_90"))
    [loop] = [f for f in findings if f.applicable]
    assert loop.function == "main (loop at line 188)" and "7 non-blocking streams" in loop.reason
    text = dict(loop.proposal.files)["multikernel.cu"]
    assert "wf_lstream[8] = {0, 1, 2, 3, 4, 5, 6, 6}" in text  # 6 and its consumer 7 share a stream
    assert all(not v.failed for v in static_verdicts(target, loop.proposal))


@pytest.mark.nvcc
@needs("nvcc")
def test_the_streamified_multikernel_builds_for_sm_90():
    target = load_target(MULTIKERNEL / "target.yaml")
    [loop] = [f for f in StreamifyExpert().findings(AnalysisContext(target, "sm_90")) if f.applicable]
    variant = variant_target(target, loop.proposal)
    candidate = Candidate(variant.name, "nvcc", "H100", "sm_90", variant.bundle.hash, (), (), Phase.VERIFY)
    artifact = compile_candidate(variant, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
