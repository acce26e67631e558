"""The persistent runner: a program built as a shared library and run inside a host process, on
the CPU with C programs (a CUDA one on a GPU, marked). What it must keep from a process per run:
the same samples and outputs, a fresh program each time, and every failure a status while the
next candidate still runs."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.measure import Reference, measure_candidate
from cluster.platform.devices import cpu_device
from cluster.runners._base import Invocation, ProcessRunner
from cluster.runners.persistent import PersistentRunner
from tests.conftest import REPO, gpu_present, needs

PROGRAM = textwrap.dedent(r"""
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>
    #include <signal.h>
    static int calls = 0;  /* a static: 1 on every run if each run loads a fresh program */
    int main(int argc, char** argv) {
        int seed = 0, c;
        const char* mode = "ok";
        while ((c = getopt(argc, argv, "s:m:")) != -1) {  /* getopt's state must start afresh */
            if (c == 's') seed = atoi(optarg);
            if (c == 'm') mode = optarg;
        }
        if (!strcmp(mode, "segv")) raise(SIGSEGV);
        if (!strcmp(mode, "exit")) exit(3);
        if (!strcmp(mode, "hang")) for (;;) sleep(1);
        const char* cap = getenv("WARPFLEET_MAX_SAMPLES");
        if (!strcmp(mode, "cap")) printf("cap=%s\n", cap ? cap : "none");
        calls++;
        FILE* f = fopen("out.bin", "wb");
        float v[3] = {(float)seed, (float)calls, 2.0f};
        fwrite(v, sizeof v, 1, f);
        fclose(f);
        for (int i = 0; i < 3; i++) printf("@warpfleet time_ms=%d.25\n", i + 1 + seed);
        return 0;
    }
""")


def target_with(tmp_path: Path, mode: str = "ok", runner: str = "persistent"):
    (tmp_path / "prog.c").write_text(PROGRAM)
    spec = {"name": "prog", "toolchain": "cc", "sources": ["prog.c"], "runner": runner,
            "run": ["{binary}", "-s", "{seed}", "-m", mode], "verify": {"outputs": ["out.bin"]},
            "timeouts": {"build": 60, "run": 3}}
    path = tmp_path / f"{mode}-{runner}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_target(path)


def built(target):
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), (), Phase.BASELINE,
                          runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return candidate, artifact


def with_mode(target, mode: str):
    return dataclasses.replace(target, spec=target.spec.model_copy(
        update={"run": ["{binary}", "-s", "{seed}", "-m", mode]}))


def test_a_persistent_run_gives_what_a_process_run_gives(tmp_path):
    persistent, process = target_with(tmp_path), target_with(tmp_path, runner="process")
    assert persistent.runner == "persistent" and process.runner == "process"
    host = PersistentRunner(cuda=False)
    try:
        (c1, a1), (c2, a2) = built(persistent), built(process)
        assert c1.key != c2.key  # another build of the same configuration: a shared library
        got = measure_candidate(persistent, c1, a1, cpu_device("w"), None, 3, host)
        want = measure_candidate(process, c2, a2, cpu_device("w"), None, 3, ProcessRunner())
        assert got.status is want.status is Status.OK
        assert got.samples == want.samples == (1.25, 2.25, 3.25, 2.25, 3.25, 4.25, 3.25, 4.25, 5.25)
        assert got.outputs == want.outputs  # seeds 0..2, and calls == 1 each time: a fresh program per run
        again = measure_candidate(persistent, c1, a1, cpu_device("w"), Reference(got.outputs), 3, host)
        assert again.status is Status.OK and host.host.starts == 1  # one host for all six runs
    finally:
        host.close()


@pytest.mark.parametrize(("mode", "status", "says"), [("segv", Status.CRASHED, "SIGSEGV"),
                                                       ("exit", Status.CRASHED, "exit status 3"),
                                                       ("hang", Status.TIMEOUT, "timed out")])
def test_a_candidate_that_takes_the_host_down_is_a_status_and_the_next_one_runs(tmp_path, mode, status, says):
    target = target_with(tmp_path)
    host = PersistentRunner(cuda=False)
    try:
        candidate, artifact = built(target)
        bad = measure_candidate(with_mode(target, mode), candidate, artifact, cpu_device("w"), None, 1, host)
        assert bad.status is status and says in bad.error_tail, bad.error_tail
        good = measure_candidate(target, candidate, artifact, cpu_device("w"), None, 1, host)
        assert good.status is Status.OK and host.host.starts == 2  # restarted for the next candidate
    finally:
        host.close()


def test_runs_that_must_not_share_the_host_run_the_library_as_a_process(tmp_path):
    target = target_with(tmp_path)
    host = PersistentRunner(cuda=False)
    _, artifact = built(target)
    with host.stage(target, {}, "host", artifact.binary) as staged:
        result = staged.run(Invocation(seed=4, env={"WARPFLEET_PROFILE": "1"}))
        assert result.ok and "@warpfleet time_ms=5.25" in result.stdout
        assert host.host.proc is None  # no host was started for it
    host.close()


def test_the_finals_poisoned_runs_share_the_host(tmp_path):
    """Every final's runs have WARPFLEET_POISON (the cheat checks folded into the finals): in a
    process they would pay a process's and a context's start that the baseline's clock did not."""
    target = target_with(tmp_path)
    host = PersistentRunner(cuda=False)
    _, artifact = built(target)
    try:
        with host.stage(target, {}, "host", artifact.binary) as staged:
            result = staged.run(Invocation(seed=4, env={"WARPFLEET_POISON": "1"}))
            assert result.ok and "@warpfleet time_ms=5.25" in result.stdout
            assert host.host.proc is not None and host.host.starts == 1
    finally:
        host.close()


def test_the_search_cap_reaches_the_harness_in_the_host_for_one_run_and_in_a_process(tmp_path):
    """Invocation.max_samples (measure.search_samples) is the harness's WARPFLEET_MAX_SAMPLES: set in
    the host for that run only (the host's next run has none), and in a process's environment."""
    target = with_mode(target_with(tmp_path), "cap")
    host = PersistentRunner(cuda=False)
    _, artifact = built(target_with(tmp_path))
    try:
        with host.stage(target, {}, "host", artifact.binary) as staged:
            assert "cap=7" in staged.run(Invocation(seed=1, max_samples=7)).stdout
            assert "cap=none" in staged.run(Invocation(seed=1)).stdout
            assert host.host.starts == 1  # both in the one host
            assert "cap=9" in host.run_process(staged, Invocation(max_samples=9)).stdout  # the library as a process
    finally:
        host.close()


def test_auto_takes_the_persistent_runner_for_harness_programs_only():
    matmul = load_target(REPO / "configs" / "targets" / "matmul" / "target.yaml")  # includes the harness
    saxpy = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")  # times itself
    assert matmul.runner == "persistent" and saxpy.runner == "process"


def test_persistent_needs_a_build_that_takes_flags_and_sources(tmp_path):
    from click.testing import CliRunner

    from cluster.cli import main

    (tmp_path / "prog.c").write_text(PROGRAM)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"name": "p", "toolchain": "cc", "sources": ["prog.c"],
                                                     "runner": "persistent", "build": ["cc", "-o", "{binary}",
                                                                                       "prog.c"],
                                                     "run": ["{binary}"]}))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"name": "r", "targets": ["t.yaml"]}))
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "run.yaml")])
    assert result.exit_code == 2
    assert "runner: persistent needs a shared-library build: the build command lacks {flags} and {sources}" \
        in result.output


CUDA_PROGRAM = textwrap.dedent(r"""
    #include <cstdio>
    #include <cstring>
    #include <warpfleet/harness.cuh>
    __global__ void fill(float* out, int n, int stride) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i * stride] = i;  // stride 1 << 20 writes far outside: an illegal address
    }
    int main(int argc, char** argv) {
        std::vector<std::string> rest;
        wf::Options opt = wf::parse_options(argc, argv, &rest);
        int stride = (!rest.empty() && rest[0] == "corrupt") ? (1 << 20) : 1;
        const int n = 1 << 16;
        float* d;
        WF_CHECK(cudaMalloc(&d, n * sizeof(float)));
        wf::bench(opt, [&](cudaStream_t s) { fill<<<n / 256, 256, 0, s>>>(d, n, stride); });
        std::vector<float> h(n);
        WF_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
        wf::write_output("out.bin", h.data(), n);
        WF_CHECK(cudaFree(d));
        return 0;
    }
""")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU")
@needs("nvcc")
def test_the_host_survives_a_candidate_that_corrupts_the_cuda_context(tmp_path):
    from cluster.platform.devices import gpu_device
    from cluster.toolchains import get_toolchain

    (tmp_path / "fill.cu").write_text(CUDA_PROGRAM)
    spec = {"name": "fill", "toolchain": "nvcc", "sources": ["fill.cu"],
            "build": ["nvcc", "{flags}", "{defines}", "{harness_include}", "-arch={arch}", "-o", "{binary}",
                      "{sources}"],
            "run": ["{binary}", "--seed", "{seed}", "--min-time", "0.05"], "verify": {"outputs": ["out.bin"]},
            "timeouts": {"run": 30}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    target = load_target(tmp_path / "t.yaml")
    assert target.runner == "persistent"
    device = gpu_device(0, "test")
    arch = get_toolchain("nvcc").arch_for(device)
    candidate = Candidate("fill", "nvcc", device.device_type, arch, target.bundle.hash, (), (), Phase.BASELINE,
                          runner="persistent")
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    host = PersistentRunner(cuda=True)
    try:
        first = measure_candidate(target, candidate, artifact, device, None, 2, host)
        assert first.status is Status.OK, first.error_tail
        corrupt = dataclasses.replace(target, spec=target.spec.model_copy(
            update={"run": [*target.spec.run, "corrupt"]}))
        bad = measure_candidate(corrupt, candidate, artifact, device, None, 1, host)
        assert bad.status is Status.CRASHED, bad.error_tail
        after = measure_candidate(target, candidate, artifact, device, Reference(first.outputs), 2, host)
        assert after.status is Status.OK, after.error_tail
        assert host.host.starts == 2
    finally:
        host.close()


def test_a_file_the_worker_puts_in_a_staged_directory_is_the_candidates_to_overwrite(tmp_path):
    """The guardrails poison an output file between runs in one staged directory; a host that is
    already running, as the sandbox's uid, must still be able to write it (found with the kernel
    runner on a GPU: its poisoned runs go to the host, and the second one failed)."""
    from cluster.config.run import SandboxSpec
    from cluster.sandbox.isolation import start_bubblewrap
    from cluster.sandbox.sandbox import SandboxError

    try:
        sandbox = start_bubblewrap(SandboxSpec(pids=64, memory_mb=1024))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    if sandbox.uid is None:
        pytest.skip("not root: the sandbox keeps the worker's uid, so every file is the candidate's")
    target = target_with(tmp_path)
    _, artifact = built(target)
    host = PersistentRunner(cuda=False, sandbox=sandbox, scratch_root=tmp_path / "scratch")
    try:
        with host.stage(target, {}, "host", artifact.binary) as staged:
            assert staged.run(Invocation(seed=1)).ok  # the host starts, as the sandbox's uid
            out = staged.workdir / "out.bin"
            out.unlink()
            out.write_bytes(b"\xff" * 12)  # the worker's file now, mode 0644
            again = staged.run(Invocation(seed=2))
            assert again.ok, again.tail()
            assert out.read_bytes()[:4] == b"\x00\x00\x00\x40"  # 2.0f: the seed of the second run
            assert host.host.starts == 1
    finally:
        host.close()
