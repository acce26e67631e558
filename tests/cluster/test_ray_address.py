"""RAY_ADDRESS, as Ray's own tools read it (`ray job submit` sets it for its job): a sweep joins the
cluster it names instead of starting a local instance of its own; ``--address`` and the config's
``cluster.address`` win over it; a bad one is one line that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config import env
from cluster.store.results import read_results
from tests.conftest import REPO, repo_pythonpath, write_config, write_target

NOBODY = "127.0.0.1:9"  # the discard port: nothing listens


def test_ray_address_is_read_when_set_and_not_empty():
    assert env.ray_address({"RAY_ADDRESS": " 10.0.0.5:6379 "}) == "10.0.0.5:6379"
    assert env.ray_address({"RAY_ADDRESS": " "}) is None and env.ray_address({}) is None


@pytest.fixture
def running_ray(ray_address: str) -> tuple[str, Path]:
    """A running Ray cluster to name: the tests' shared instance (a head of its own was one more
    start). Its address and its session folder."""
    import ray

    return ray_address, Path(ray._private.worker._global_node.get_session_dir_path())


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


def test_a_sweep_joins_the_cluster_ray_address_names_and_starts_no_ray_of_its_own(tmp_path, running_ray):
    address, session = running_ray
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


def test_the_address_option_and_the_config_win_over_ray_address(tmp_path, running_ray):
    """RAY_ADDRESS names a working cluster; the error names the one that was tried instead."""
    address, _ = running_ray
    given, stderr, _ = _sweep(tmp_path / "given", address, "--address", NOBODY)
    assert given.returncode == 2 and f"run.yaml: --address: cannot join a Ray cluster at {NOBODY}" in stderr, stderr
    configured, stderr, _ = _sweep(tmp_path / "configured", address, cluster={"address": NOBODY})
    assert configured.returncode == 2 and f"run.yaml: cluster.address: cannot join a Ray cluster at {NOBODY}" \
        in stderr, stderr
