"""The streamify expert: independent default-stream launches spread over streams with events for
the dependencies that cross streams, verified by depgraph.check before anything is proposed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from agents._base import AnalysisContext
from agents.cuda_source import HostOpKind, analyze
from agents.depgraph import KernelGraph, Node, check, extract
from agents.experts.streamify import StreamifyExpert, streamify_function
from cluster.config import Target, load_target
from tests.agents.test_depgraph import COPY_LINE, END, KERNELS, SERIAL
from tests.conftest import needs

MULTIKERNEL = Path(__file__).resolve().parents[2] / "configs" / "targets" / "multikernel"
ARCH = "sm_90"

JOIN_KERNEL = """__global__ void join_kernel(const float* y, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = y[i] + b[i];
}

"""
# The consumer reads two producers: one stream continues, the other needs an event.
JOIN = SERIAL.replace("combine_kernel<<<grid, block>>>(d_y, d_out, n)",
                      "join_kernel<<<grid, block>>>(d_y, d_b, d_out, n)")

CHAIN = """
    scale_kernel<<<grid, block>>>(d_x, d_a, n);
    poly_kernel<<<grid, block>>>(d_a, d_y, n);
    combine_kernel<<<grid, block>>>(d_y, d_out, n);
    cudaMemcpy(h_out, d_out, n * sizeof(float), cudaMemcpyDeviceToHost);
"""


def program(body: str) -> str:
    return KERNELS.replace("void run(", JOIN_KERNEL + "void run(") + body + END


def kernel_target(folder: Path, source: str) -> Target:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu").write_text(source)
    spec = {"name": "k", "toolchain": "nvcc", "sources": ["kernel.cu"], "run": ["{binary}"], "params": {}}
    (folder / "target.yaml").write_text(yaml.safe_dump(spec))
    return load_target(folder / "target.yaml")


def context(target: Target) -> AnalysisContext:
    return AnalysisContext(target, ARCH)


def streamified(tmp_path: Path, body: str = JOIN) -> str:
    [proposal] = StreamifyExpert().propose(context(kernel_target(tmp_path, program(body))))
    files = dict(proposal.files)
    assert list(files) == ["kernel.cu"]
    return files["kernel.cu"]


def verified_graphs(tmp_path: Path, body: str) -> tuple[str, KernelGraph, dict[str, Node]]:
    target = kernel_target(tmp_path, program(body))
    [proposal] = StreamifyExpert().propose(context(target))
    assert proposal.agent == "streamify" and "depgraph.check: ok" in proposal.description
    text = dict(proposal.files)["kernel.cu"]
    before, after = analyze(program(body), "kernel.cu"), analyze(text, "kernel.cu")
    assert after.errors == ()
    original, transformed = extract(before, "run"), extract(after, "run")
    assert check(original, transformed).ok
    launches = {n.label: n for n in transformed.nodes if n.kind == HostOpKind.LAUNCH}
    assert len({n.stream for n in launches.values()}) >= 2 and None not in {n.stream for n in launches.values()}
    for label, node in launches.items():
        assert f"{label}->{node.stream}" in proposal.description  # the assignment is reported
    # synchronised before the copy back, cleaned up after
    last = max(n.index for n in launches.values())
    sync = next(n for n in transformed.nodes if n.kind == HostOpKind.DEVICE_SYNC)
    assert last < sync.index < next(n.index for n in transformed.nodes if n.label.startswith("memcpy"))
    assert "cudaStreamCreateWithFlags(&wf_s0, cudaStreamNonBlocking);" in text
    assert text.count("cudaStreamDestroy(") == len({n.stream for n in launches.values()})
    return text, transformed, launches


def test_four_independent_kernels_and_a_consumer_of_one_continue_its_stream(tmp_path: Path) -> None:
    text, transformed, launches = verified_graphs(tmp_path, SERIAL)
    assert len({n.stream for n in launches.values()}) == 4
    assert launches["combine_kernel"].stream == launches["poly_kernel"].stream  # a chain stays on one stream
    assert not [n for n in transformed.nodes if n.kind in (HostOpKind.EVENT_RECORD, HostOpKind.STREAM_WAIT_EVENT)]
    assert "cudaEvent" not in text


def test_a_consumer_of_two_streams_waits_on_an_event(tmp_path: Path) -> None:
    text, transformed, launches = verified_graphs(tmp_path, JOIN)
    poly, square, join = launches["poly_kernel"], launches["square_kernel"], launches["join_kernel"]
    assert join.stream == square.stream != poly.stream  # continues the later producer's stream
    records = [n for n in transformed.nodes if n.kind == HostOpKind.EVENT_RECORD]
    waits = [n for n in transformed.nodes if n.kind == HostOpKind.STREAM_WAIT_EVENT]
    assert [(r.event, r.stream) for r in records] == [("wf_e0", poly.stream)]
    assert [(w.event, w.stream) for w in waits] == [("wf_e0", join.stream)]
    assert poly.index < records[0].index < waits[0].index < join.index
    assert "cudaEventCreateWithFlags(&wf_e0, cudaEventDisableTiming);" in text and "cudaEventDestroy(wf_e0);" in text


def test_an_existing_error_check_macro_wraps_the_new_calls_and_shared_memory_is_kept(tmp_path: Path) -> None:
    macro = "#define WF_CHECK(x) do { if ((x) != cudaSuccess) return; } while (0)\n"
    body = JOIN.replace("poly_kernel<<<grid, block>>>", "poly_kernel<<<grid, block, 64>>>").replace(
        COPY_LINE, "    WF_CHECK(" + COPY_LINE.strip()[:-1] + ");\n")
    source = program(body).replace("#include <cuda_runtime.h>\n", "#include <cuda_runtime.h>\n" + macro)
    [proposal] = StreamifyExpert().propose(context(kernel_target(tmp_path, source)))
    text = dict(proposal.files)["kernel.cu"]
    assert "WF_CHECK(cudaEventRecord(wf_e0, wf_s1));" in text
    assert "WF_CHECK(cudaStreamWaitEvent(" in text and "WF_CHECK(cudaDeviceSynchronize());" in text
    assert "poly_kernel<<<grid, block, 64, wf_s1>>>" in text and "scale_kernel<<<grid, block, 0, wf_s0>>>" in text


@pytest.mark.nvcc
@needs("nvcc")
def test_the_streamified_program_compiles(tmp_path: Path) -> None:
    source = tmp_path / "out" / "streamified.cu"
    source.parent.mkdir()
    source.write_text(streamified(tmp_path / "target"))
    done = subprocess.run(["nvcc", "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "streamified.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr


def test_a_chain_of_dependent_kernels_gets_nothing(tmp_path: Path) -> None:
    target = kernel_target(tmp_path, program(CHAIN))
    expert = StreamifyExpert()
    assert expert.propose(context(target)) == []
    assert expert.explain(context(target)) == ["kernel.cu:run: no two launches are independent: nothing to overlap"]


def test_launches_in_a_readonly_region_are_left_alone(tmp_path: Path) -> None:
    body = "    // warpfleet: readonly begin\n" + SERIAL.lstrip("\n") + "    // warpfleet: readonly end\n"
    target = kernel_target(tmp_path, program(body))
    expert = StreamifyExpert()
    assert expert.propose(context(target)) == []
    [reason] = expert.explain(context(target))
    assert "the patch was refused" in reason and "[readonly]" in reason


def test_multikernel_the_helper_is_left_alone_and_its_loop_is_streamified() -> None:
    target = load_target(MULTIKERNEL / "target.yaml")
    expert = StreamifyExpert()
    [proposal] = expert.propose(context(target))
    assert proposal.description.startswith("streamify the loop at multikernel.cu:188")  # streamify_loop's
    reasons = dict(r.split(": ", 1) for r in expert.explain(context(target)))
    assert set(reasons) == {"multikernel.cu:enqueue_task"}
    assert "helper function called from main line 188 (in a loop)" in reasons["multikernel.cu:enqueue_task"]


def test_a_launch_in_a_loop_or_on_a_stream_is_not_applicable(tmp_path: Path) -> None:
    looped = SERIAL.replace("    scale_kernel<<<grid, block>>>(d_x, d_a, n);\n",
                            "    for (int r = 0; r < 2; ++r) {\n"
                            "        scale_kernel<<<grid, block>>>(d_x, d_a, n);\n    }\n")
    [reason] = StreamifyExpert().explain(context(kernel_target(tmp_path / "loop", program(looped))))
    assert reason.startswith("kernel.cu:run: the launch of scale_kernel") and reason.endswith("inside a loop")
    streamed = "    cudaStream_t s;\n    cudaStreamCreate(&s);\n" + SERIAL.replace(
        "scale_kernel<<<grid, block>>>", "scale_kernel<<<grid, block, 0, s>>>")
    [reason] = StreamifyExpert().explain(context(kernel_target(tmp_path / "stream", program(streamed))))
    assert "already uses streams" in reason


def test_the_gate_rejects_the_transformation_without_its_events(tmp_path: Path) -> None:
    text = program(JOIN)
    model = analyze(text, "kernel.cu")
    files, editable = {"kernel.cu": text}, ["kernel.cu"]
    good = streamify_function(files, editable, "kernel.cu", model, "run")
    assert good.applicable and good.check is not None and good.check.ok
    broken = streamify_function(files, editable, "kernel.cu", model, "run", drop_events=True)
    assert broken.proposal is None and broken.check is not None and not broken.check.ok
    [violation] = broken.check.violations
    assert violation.reason.startswith("join_kernel (line ") and "reads d_y written by poly_kernel" in \
        violation.reason
    assert broken.reason.startswith("depgraph.check rejected the transformation: join_kernel")
