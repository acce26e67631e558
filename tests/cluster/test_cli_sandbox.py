"""The command line and the sandbox: a sweep refuses to run where the sandbox cannot start, unless
given --unsandboxed (recorded in meta.json); ``warpfleet doctor`` says whether it works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from cluster.config import SandboxSpec
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import SandboxError
from tests.conftest import REPO, repo_pythonpath, write_config, write_target

NO_BWRAP = {"WARPFLEET_BWRAP": "/nonexistent/bwrap"}


def _cli(*args: str, cwd, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": repo_pythonpath(), **(env or {})}, timeout=timeout)


def _sandbox_works() -> bool:
    try:
        start_bubblewrap(SandboxSpec())
        return True
    except SandboxError:
        return False


@pytest.mark.parametrize("command", ["sweep", "optimize"])
def test_a_sweep_refuses_to_run_where_the_sandbox_cannot_start(tmp_path, command):
    target = write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    args = [command, str(config if command == "sweep" else target), "--output-dir", str(tmp_path / "runs")]
    result = _cli(*args, cwd=tmp_path, env=NO_BWRAP)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "sandbox: cannot start on this node: '/nonexistent/bwrap' not found" in lines[0]
    assert "--unsandboxed" in lines[0] and "warpfleet doctor" in lines[0]
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(p.is_dir() for p in runs.iterdir())  # no run directory


def test_unsandboxed_runs_anyway_and_says_so_in_meta_json(tmp_path, ray_address):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 1}, measure={"final_top_k": 0})
    result = _cli("sweep", str(config), "--no-progress", "--unsandboxed", "--address", ray_address, cwd=tmp_path,
                  env=NO_BWRAP)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: --unsandboxed" in result.stderr
    meta = json.loads(next((tmp_path / "runs").iterdir()).joinpath("meta.json").read_text())
    assert meta["unsandboxed"] is True and meta["sandbox"]["mode"] == "off"


def test_doctor_says_what_is_missing(tmp_path):
    result = _cli("doctor", cwd=tmp_path, env=NO_BWRAP)
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL bwrap: '/nonexistent/bwrap' not found")
    assert "sweeps refuse to run unless given --unsandboxed" in result.stdout


@pytest.mark.skipif(not _sandbox_works(), reason="no sandbox here")
def test_doctor_passes_where_the_sandbox_works(tmp_path):
    config = write_config(tmp_path, ["t/target.yaml"], sandbox={"pids": 77})
    write_target(tmp_path / "t")
    result = _cli("doctor", "--config", str(config), "--no-gpu", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    for name in ("bwrap", "uid", "limits", "trial", "isolation", "warpfleet", "cc"):
        assert f"ok   {name}:" in result.stdout
    assert "77 processes" in result.stdout and "the sandbox works here" in result.stdout


@pytest.mark.skipif(not _sandbox_works(), reason="no sandbox here")
def test_a_warpfleet_under_the_private_tmp_is_bound_into_the_sandbox(tmp_path):
    """A clone in /tmp (the sandbox's /tmp is its own): the runners' hosts must still import this
    warpfleet, and builds find its harness headers by the worker's path."""
    copy = tmp_path / "clone"
    for package in ("cluster", "agents", "search_spaces"):  # warpfleet's top-level packages
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert copy.is_relative_to("/tmp")
    result = _cli("doctor", "--no-gpu", cwd=tmp_path, env={"PYTHONPATH": str(copy)})
    assert f"ok   warpfleet: its Python, packages and harness headers are readable inside ({copy})" \
        in result.stdout, result.stdout


@pytest.mark.skipif(not _sandbox_works(), reason="no sandbox here")
def test_of_a_checkout_under_tmp_only_warpfleets_packages_are_bound_not_the_users_files(tmp_path):
    copy = tmp_path / "clone"
    for package in ("cluster", "agents", "search_spaces"):
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "secret.env").write_text("TOKEN=abc\n")
    probe = ("import sys; from pathlib import Path; from cluster.config import SandboxSpec; "
             "from cluster.sandbox.isolation import start_bubblewrap; from cluster.sandbox.sandbox import run_command; "
             "sandbox = start_bubblewrap(SandboxSpec(pids=32, memory_mb=512)); work = Path(sys.argv[1]); "
             "work.mkdir(); r = run_command(['sh', '-c', sys.argv[2]], work, 20, sandbox=sandbox); "
             "print(r.stdout.strip())")
    script = f"test -f {copy}/cluster/__init__.py && echo package; cat {copy}/secret.env 2>/dev/null || echo hidden"
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "work"), script], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(copy)}, timeout=120,
                            cwd=tmp_path)  # not the repository's root, whose packages -c would import first
    assert result.stdout.split() == ["package", "hidden"], result.stdout + result.stderr


def test_doctor_json_is_each_check_and_whether_the_sandbox_works(tmp_path):
    result = _cli("doctor", "--json", cwd=tmp_path, env=NO_BWRAP)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["works"] is False
    first = document["checks"][0]
    assert (first["name"], first["ok"]) == ("bwrap", False)
    assert first["detail"].startswith("'/nonexistent/bwrap' not found")
