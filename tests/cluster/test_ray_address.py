"""RAY_ADDRESS, as Ray's own tools read it (`ray job submit` sets it for its job): a sweep joins the
cluster it names instead of starting a local instance of its own; ``--address`` and the config's
``cluster.address`` win over it; a bad one is one line that names it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import env
from cluster.store.results import read_results
from tests.conftest import REPO, repo_pythonpath, write_config, write_target

RAY = Path(sys.executable).with_name("ray")
NOBODY = "127.0.0.1:9"  # the discard port: nothing listens


def test_ray_address_is_read_when_set_and_not_empty():
    assert env.ray_address({"RAY_ADDRESS": " 10.0.0.5:6379 "}) == "10.0.0.5:6379"
    assert env.ray_address({"RAY_ADDRESS": " "}) is None and env.ray_address({}) is None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[tuple[str, Path]]:
    """A Ray head as `ray start --head` starts one (in a process group of its own, ended by its id
    afterwards: `ray stop` would stop every Ray on the machine), with a temporary folder of its own
    (short: Ray's socket paths must fit 107 bytes). Yields its address and its session folder."""
    temp = Path(tempfile.mkdtemp(prefix="wf-head-"))
    address = f"127.0.0.1:{_free_port()}"
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # PATH: bwrap for its workers
    log = temp / "head.log"
    with log.open("w") as out:
        head = subprocess.Popen([str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                                 f"--port={address.rpartition(':')[2]}", "--num-cpus=2", "--num-gpus=0",
                                 "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
                                env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180  # a guard against a head that never comes up, not a speed target
        while "will now block" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        yield address, temp / "session_latest"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # what outlived it (its GCS server and raylet linger)
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _sweep(tmp_path: Path, ray_address: str, *args: str, **config: object) -> tuple[subprocess.Popen, str, Path]:
    """`warpfleet sweep` as a process of its own with ``RAY_ADDRESS``, run to its end: the process,
    its stderr and its own Ray folder (where a local instance of its own would have gone)."""
    write_target(tmp_path / "t", params={"N": [1000]})  # the flags change nothing the run writes
    path = write_config(tmp_path, ["t/target.yaml"], search={"trials": 2}, **config)
    own = tmp_path / "own-ray"
    own.mkdir()
    environ = {**os.environ, "RAY_ADDRESS": ray_address, "PYTHONPATH": repo_pythonpath(), "RAY_TMPDIR": str(own)}
    sweep = subprocess.Popen([sys.executable, "-m", "cluster.cli", "sweep", str(path), "--no-progress", *args],
                             cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, stderr = sweep.communicate(timeout=300)
    return sweep, stderr, own


def test_a_sweep_joins_the_cluster_ray_address_names_and_starts_no_ray_of_its_own(tmp_path, ray_head):
    address, session = ray_head
    sweep, stderr, own = _sweep(tmp_path, address)
    assert sweep.returncode == 0, stderr
    assert list((session / "logs").glob(f"python-core-driver-*_{sweep.pid}.log")), "it never joined the head"
    assert not list(own.iterdir())  # a local instance of its own would have made its session folder here
    [run] = (tmp_path / "runs").iterdir()
    rows = read_results(run)
    assert len(rows[rows["phase"] == "search"]) == 2 and (rows["status"] == "ok").all(), rows["error_tail"]


def test_a_bad_ray_address_is_one_line_naming_it_and_writes_nothing(tmp_path):
    sweep, stderr, own = _sweep(tmp_path, NOBODY)
    lines = stderr.strip().splitlines()
    assert sweep.returncode == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"error: RAY_ADDRESS: cannot join a Ray cluster at {NOBODY} (")
    assert lines[0].endswith("; unset it for a local instance")
    assert not (tmp_path / "runs").exists() and not list(own.iterdir())


def test_the_address_option_and_the_config_win_over_ray_address(tmp_path, ray_head):
    """RAY_ADDRESS names a working cluster; the error names the one that was tried instead."""
    address, _ = ray_head
    given, stderr, _ = _sweep(tmp_path / "given", address, "--address", NOBODY)
    assert given.returncode == 2 and f"run.yaml: --address: cannot join a Ray cluster at {NOBODY}" in stderr, stderr
    configured, stderr, _ = _sweep(tmp_path / "configured", address, cluster={"address": NOBODY})
    assert configured.returncode == 2 and f"run.yaml: cluster.address: cannot join a Ray cluster at {NOBODY}" \
        in stderr, stderr
