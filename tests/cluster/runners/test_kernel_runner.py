"""The kernel runner's plumbing on the CPU: which runs go to the host process, which run as a
process of their own (ncu, compute-sanitizer, variables), and what its request says."""

from __future__ import annotations

import contextlib
import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config import load_target
from cluster.core.registry import RUNNERS
from cluster.runners._base import Invocation
from cluster.runners.kernel import REQUEST_FILE, KernelRunner
from cluster.sandbox.host import host_python
from tests.cluster.kernel_targets import write_kernel_target


@pytest.fixture
def target(tmp_path):
    return load_target(write_kernel_target(tmp_path / "vadd"))


def test_a_kernel_target_runs_on_the_kernel_runner(target):
    assert target.runner == "kernel" and RUNNERS.load("kernel") is KernelRunner


def test_a_wrapped_run_is_the_host_once_on_a_written_request(target, tmp_path):
    runner = KernelRunner(scratch_root=tmp_path, cuda=False)
    with runner.stage(target, target.baseline_params, "sm_90", b"binary") as staged:
        # `echo` stands in for ncu or compute-sanitizer: it prints the command it was put in front of
        result = staged.run(Invocation(seed=7, wrapper=("echo",), env={"WARPFLEET_PROFILE": "1"}))
        request = json.loads((staged.workdir / REQUEST_FILE).read_text())
    assert result.ok and result.stdout.split()[2:] == [sys.executable, "-m", "cluster.sandbox.host", "once",
                                                        str(staged.workdir / REQUEST_FILE)]
    assert result.stdout.split()[:2] == ["env", f"PYTHONPATH={host_python()[1].split('=', 1)[1]}"]
    assert request["loader"] == "kernel" and request["seed"] == 7 and request["profile"] is True
    assert request["poison"] is False and request["binary"].endswith("candidate.bin")
    assert request["bench"]["min_time_s"] == 0.01  # the target's own bench options
    assert staged.argv(Invocation(seed=3))[-2:] == ["--seed", "3"]  # seeded: fresh inputs per run


def test_a_plain_run_goes_to_the_host_and_a_failure_comes_back_as_a_result(target, tmp_path):
    runner = KernelRunner(scratch_root=tmp_path, cuda=False)  # no GPU here: the loader fails in the host
    try:
        with runner.stage(target, target.baseline_params, "sm_90", b"not a kernel") as staged:
            result = staged.run(Invocation(seed=0, env={"WARPFLEET_POISON": "1"}))
            again = staged.run(Invocation(seed=1))
        assert not result.ok and not again.ok and "not a warpfleet kernel binary" in result.stderr
        assert runner.host.starts == 1  # one host served both: the loader's failure did not end it
    finally:
        runner.close()


def test_a_run_with_other_variables_is_a_process(target, tmp_path):
    runner = KernelRunner(scratch_root=tmp_path, cuda=False)
    with runner.stage(target, target.baseline_params, "sm_90", b"not a kernel") as staged:
        result = staged.run(Invocation(seed=0, env={"SOME_TOOL": "1"}))
    assert not result.ok and "not a warpfleet kernel binary" in result.stderr and runner.host.proc is None


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not on PATH")
def test_the_l2_flush_ptx_assembles_for_sm90(tmp_path):
    from cluster.runners.kernel import FLUSH_PTX

    (tmp_path / "flush.ptx").write_bytes(FLUSH_PTX)
    done = subprocess.run(["ptxas", "-arch=sm_90", "-v", str(tmp_path / "flush.ptx"), "-o", str(tmp_path / "f.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Compiling entry function 'wf_l2_flush'" in done.stdout + done.stderr


# --- call_kernel on a stand-in driver (tests/cluster/runners/fake_driver.py) ---------------------

def _vadd(driver, grid, block, params):
    n = driver.scalar(params, 3, ctypes.c_int)
    c = driver.array(params, 0, "float32", n)
    a, b = driver.array(params, 1, "float32", n), driver.array(params, 2, "float32", n)
    half = n // 2 if driver.lazy else n
    c[:half] = a[:half] + b[:half]  # the fake memory is writable through the view
    return 0


def _crash(driver, grid, block, params):
    return 700


@pytest.fixture
def fake(monkeypatch):
    from cluster.runners import kernel
    from tests.cluster.runners.fake_driver import FakeDriver

    driver = FakeDriver({b"vadd-cubin": {"vadd": _vadd}, b"crash-cubin": {"vadd": _crash}})
    driver.lazy = False
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    import cuda.bindings

    monkeypatch.setattr(cuda.bindings, "driver", driver, raising=False)
    monkeypatch.setattr(kernel, "_DEVICE", None)
    return driver


def _request(target, tmp_path, cubin=b"vadd-cubin", **fields):
    from cluster.compile.kernel import KernelBinary

    plan = target.spec.kernel.plan(target.baseline_params)
    (tmp_path / "candidate.bin").write_bytes(KernelBinary(cubin, "vadd", plan, "nvrtc 13.0").pack())
    return {"loader": "kernel", "binary": str(tmp_path / "candidate.bin"), "cwd": str(tmp_path), "seed": 3,
            "bench": target.spec.kernel.bench.model_dump(), **fields}


def test_call_kernel_times_writes_outputs_and_keeps_its_buffers(target, tmp_path, fake, capsys):
    import numpy as np

    from cluster.config import MetricSpec
    from cluster.measure.measure import harness_region, parse_samples
    from cluster.runners.kernel import call_kernel
    from cluster.runners.kernel_harness import host_values

    assert call_kernel(_request(target, tmp_path)) == 0
    stdout = capsys.readouterr().out
    samples = parse_samples(stdout, MetricSpec())
    assert len(samples) == 10 and harness_region(stdout)[2] == 10  # 10 x 1 ms covers min_time_s 0.01
    values = host_values(target.spec.kernel.plan(target.baseline_params), 3, tmp_path)
    assert np.array_equal(np.fromfile(tmp_path / "c.bin", dtype=np.float32), values["a"] + values["b"])
    assert fake.launches[0] == ((512, 1, 1), (128, 1, 1), 0)  # the baseline: block_size_x 128, ITEMS 1
    allocations = fake.calls.count("cuMemAlloc")
    assert call_kernel(_request(target, tmp_path, seed=4)) == 0
    assert fake.calls.count("cuMemAlloc") == allocations  # the same layout: the same buffers
    assert fake.calls.count("cuModuleUnload") == 2


def test_call_kernel_poisons_outputs_and_profiles_once(target, tmp_path, fake, capsys):
    import numpy as np

    from cluster.runners.kernel import call_kernel

    fake.lazy = True  # writes half of c: under poison the other half is NaN, not the zeros it started as
    assert call_kernel(_request(target, tmp_path, poison=True, profile=True)) == 0
    c = np.fromfile(tmp_path / "c.bin", dtype=np.float32)
    assert np.isnan(c[len(c) // 2:]).all() and not np.isnan(c[: len(c) // 2]).any()
    kernel_launches = [launch for launch in fake.launches if launch[1] == (128, 1, 1)]  # not the L2 flush
    assert capsys.readouterr().out.count("time_ms=") == 1 and len(kernel_launches) == 1  # no warm-up


def test_call_kernel_races_a_loser_and_batches_its_samples(target, tmp_path, fake, capsys):
    import itertools

    from cluster.config import MetricSpec
    from cluster.measure.measure import RACED, parse_samples
    from cluster.runners.kernel import call_kernel

    times = itertools.cycle([0.02, 0.024])  # 20 us launches, never quiet enough to converge
    fake.elapsed_ms = lambda: next(times)
    assert call_kernel(_request(target, tmp_path, stop_above_ms=0.015)) == 0
    stdout = capsys.readouterr().out
    assert len(parse_samples(stdout, MetricSpec())) == 10 and RACED in stdout  # lost at min_samples
    syncs = fake.calls.count("cuEventSynchronize")
    assert syncs == 2 and fake.calls.count("cuEventRecord") >= 20  # batches: one wait for many samples
    assert (tmp_path / "c.bin").exists()  # a raced run still writes its outputs: they are verified
    assert call_kernel(_request(target, tmp_path, stop_above_ms=0.05)) == 0  # under the bound: the full rule
    stdout = capsys.readouterr().out
    assert len(parse_samples(stdout, MetricSpec())) > 10 and RACED not in stdout
    assert call_kernel(_request(target, tmp_path, stop_above_ms=0.015, profile=True)) == 0  # one launch, as ncu's
    assert len(parse_samples(capsys.readouterr().out, MetricSpec())) == 1


def test_call_kernel_caps_a_search_candidates_samples(target, tmp_path, fake, capsys):
    """measure.search_samples: at most max_samples samples, its minimum lowered with it; the
    profile's one launch wins over the cap; the request carries the invocation's cap."""
    import itertools

    from cluster.config import MetricSpec
    from cluster.measure.measure import parse_samples
    from cluster.runners.kernel import call_kernel

    times = itertools.cycle([0.02, 0.03])  # never quiet enough to converge: the full rule takes 1000
    fake.elapsed_ms = lambda: next(times)
    assert call_kernel(_request(target, tmp_path, max_samples=25)) == 0
    assert len(parse_samples(capsys.readouterr().out, MetricSpec())) == 25
    assert call_kernel(_request(target, tmp_path, max_samples=4)) == 0  # under min_samples (10): 4
    assert len(parse_samples(capsys.readouterr().out, MetricSpec())) == 4
    assert call_kernel(_request(target, tmp_path, max_samples=25, profile=True)) == 0
    assert len(parse_samples(capsys.readouterr().out, MetricSpec())) == 1
    runner = KernelRunner(scratch_root=tmp_path / "scratch", cuda=False)
    with runner.stage(target, target.baseline_params, "sm_90", b"binary") as staged:
        assert runner.request(staged, Invocation(max_samples=25))["max_samples"] == 25
        assert runner.request(staged, Invocation())["max_samples"] is None


def test_call_kernel_reports_a_broken_launch_in_one_line(target, tmp_path, fake, capsys):
    from cluster.runners.kernel import call_kernel

    assert call_kernel(_request(target, tmp_path, cubin=b"crash-cubin")) == 2
    assert "wf: cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS" in capsys.readouterr().err
    assert not (tmp_path / "c.bin").exists()


def test_outputs_are_checked_in_the_host_and_each_reference_handed_over_once(target, tmp_path, fake, monkeypatch):
    """The worker's side and the host's, the host in-process on the stand-in driver: the baseline
    writes its outputs (they become the reference); a candidate's matching outputs are checked in
    the host and written nowhere, each seed's reference handed over once; a wrong one comes back as
    a file and fails with the worker's own message."""
    import numpy as np

    from cluster.compile.kernel import KernelBinary
    from cluster.core.types import BuildArtifact, Candidate, DeviceInfo, Phase, Status
    from cluster.measure.measure import Reference, measure_candidate
    from cluster.runners.kernel import VERIFIED_FILE, KernelRunner, call_kernel
    from cluster.sandbox import host
    from cluster.sandbox.sandbox import Unsandboxed

    requests: list[dict] = []

    def in_process(self, request, timeout, over=None):  # the host's handle(): stdout and stderr to its files
        requests.append(request)
        assert not (Path(request["cwd"]) / VERIFIED_FILE).exists()  # no verdict of an earlier run left
        with open(request["stdout"], "w") as out, open(request["stderr"], "w") as err, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return host.Reply(call_kernel(request), 0.01)

    monkeypatch.setattr(host.HostProcess, "call", in_process)
    runner = KernelRunner(sandbox=Unsandboxed(), scratch_root=tmp_path / "scratch", cuda=False)
    plan = target.spec.kernel.plan(target.baseline_params)
    binary = KernelBinary(b"vadd-cubin", "vadd", plan, "nvrtc 13.0").pack()
    device = DeviceInfo("gpu", "stand-in", "sm_90")
    candidate = Candidate(target.name, "nvcc", "stand-in", "sm_90", target.bundle.hash, (),
                          tuple(target.baseline_params.items()), Phase.SEARCH, runner="kernel")
    artifact = BuildArtifact(candidate.key, Status.OK, binary)
    baseline = measure_candidate(target, candidate, artifact, device, None, 2, runner)
    assert baseline.status is Status.OK and len(baseline.outputs) == 2 and "verify" not in requests[-1]
    reference = Reference(baseline.outputs)

    calls: list[tuple] = []
    original = runner.verified_outputs
    monkeypatch.setattr(runner, "verified_outputs", lambda s, r: calls.append(original(s, r)) or calls[-1])
    for _ in range(2):  # the second time, the host has both references
        result = measure_candidate(target, candidate, artifact, device, reference, 2, runner)
        assert result.status is Status.OK, result.error_tail
    handed = [bool(r["verify"]["c.bin"]["file"]) for r in requests[-4:]]
    assert handed == [True, True, False, False] and calls == [frozenset({"c.bin"})] * 4

    fake.lazy = True  # writes half of c: the host finds it wrong, writes it, and the worker says why
    result = measure_candidate(target, candidate, artifact, device, reference, 1, runner)
    assert result.status is Status.VERIFY_FAILED and "values differ" in result.error_tail
    assert calls[-1] == frozenset() and np.isfinite(result.samples).all()


def test_the_hosts_kept_inputs_hold_the_last_used_few():
    from cluster.runners.kernel import _Kept

    kept = _Kept(2)
    kept["a"], kept["b"] = 1, 2
    assert kept.get("a") == 1  # used: now the newest
    kept["c"] = 3
    assert list(kept) == ["a", "c"] and kept.get("b") is None


def _plant_links(staged, victim: Path) -> None:
    """What a process in the staged directory could leave for the worker (issue 26): links to a file
    outside where the kernel runner keeps its files."""
    from cluster.runners.kernel import REFERENCE_PREFIX, VERIFIED_FILE

    for name in (".warpfleet.stdout", ".warpfleet.stderr", REQUEST_FILE, VERIFIED_FILE, REFERENCE_PREFIX + "c.bin"):
        (staged.workdir / name).unlink(missing_ok=True)
        (staged.workdir / name).symlink_to(victim)


def test_the_kernel_runner_never_writes_or_reads_through_a_link_in_its_directory(target, tmp_path):
    """Its host's run, with a reference to hand over, and its process run (a request file to write):
    the links are replaced or refused, the victim never touched, and no run passes."""
    from cluster.core.types import RunOutputs

    victim = tmp_path / "victim.json"
    victim.write_text('{"c.bin": "forged"}')
    runner = KernelRunner(scratch_root=tmp_path / "scratch", cuda=False)
    reference = RunOutputs((("c.bin", b"\0" * 16),))
    try:
        with runner.stage(target, target.baseline_params, "sm_90", b"not a kernel") as staged:
            _plant_links(staged, victim)
            in_host = staged.run(Invocation(seed=0, reference=reference))
            _plant_links(staged, victim)
            as_process = staged.run(Invocation(seed=0, env={"SOME_TOOL": "1"}))
            _plant_links(staged, victim)
            assert runner.verified_outputs(staged, reference) == frozenset()  # a verdict read through a link: none
    finally:
        runner.close()
    assert victim.read_text() == '{"c.bin": "forged"}'
    for result in (in_host, as_process):
        assert not result.ok and "refused" in result.tail() and "symbolic link" in result.tail(), result.tail()
