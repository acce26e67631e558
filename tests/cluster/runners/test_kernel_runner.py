"""The kernel runner's plumbing on the CPU: which runs go to the host process, which run as a
process of their own (ncu, compute-sanitizer, variables), and what its request says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from cluster.config import load_target
from cluster.core.registry import RUNNERS
from cluster.runners._base import Invocation
from cluster.runners.kernel import REQUEST_FILE, KernelRunner
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
    assert result.ok and result.stdout.split() == [sys.executable, "-m", "cluster.runners.host", "once",
                                                    str(staged.workdir / REQUEST_FILE)]
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
