"""Which sandbox a process uses (the policy a sweep hands its workers), and the secrets kept out of
the processes that run candidates."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from cluster.config import SandboxSpec
from cluster.sandbox.isolation import (
    ENV_POLICY,
    Policy,
    Refused,
    node_sandbox,
    protect_ray_token,
    ray_env_vars,
    secrets_withheld,
)
from cluster.sandbox.sandbox import Unsandboxed, clean_stale_scratch, read_output, run_command, scratch_dir
from cluster.sandbox.untrusted_dir import UntrustedDir

MISSING = SandboxSpec(bwrap="/nonexistent/bwrap")


def test_a_policy_travels_as_one_variable(monkeypatch):
    policy = Policy("bwrap", SandboxSpec(memory_mb=512, pids=100, network=True, env=["MY_VAR"]))
    assert Policy.decode(policy.encode()) == policy
    monkeypatch.delenv(ENV_POLICY, raising=False)
    assert Policy.current() == Policy()
    policy.install()
    assert Policy.current() == policy


@pytest.mark.parametrize(("mode", "expected"), [("off", Unsandboxed), ("auto", Unsandboxed), ("bwrap", Refused)])
def test_where_bubblewrap_cannot_start_only_auto_and_off_run_bare(monkeypatch, mode, expected):
    monkeypatch.setenv(ENV_POLICY, Policy(mode, MISSING).encode())
    assert type(node_sandbox()) is expected


def test_a_refused_sandbox_fails_each_command_saying_why(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_POLICY, Policy("bwrap", MISSING).encode())
    result = run_command(["true"], tmp_path, 10, sandbox=node_sandbox())
    assert not result.ok and result.start_error
    assert "sandbox cannot start on this node: '/nonexistent/bwrap' not found" in result.tail()
    assert "warpfleet doctor" in result.tail() and "\n" not in result.tail()


def test_ray_workers_get_the_policy_and_no_secret(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("DB_PASSWORD", "pw")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv(ENV_POLICY, Policy("bwrap", SandboxSpec(pids=99)).encode())
    env = ray_env_vars()
    assert env["OPENAI_API_KEY"] == "" and env["DB_PASSWORD"] == ""
    assert "RAY_AUTH_MODE" not in env and "PATH" not in env  # Ray's own variables are Ray's business
    assert Policy.decode(env[ENV_POLICY]) == Policy("bwrap", SandboxSpec(pids=99))


def test_secrets_are_withheld_from_processes_started_meanwhile(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    with secrets_withheld():
        seen = subprocess.run(["env"], capture_output=True, text=True).stdout
        assert "OPENAI_API_KEY" not in os.environ
    assert "sk-x" not in seen and "PATH=" in seen
    assert os.environ["OPENAI_API_KEY"] == "sk-x"  # the LLM key stays in the driver


def test_the_ray_token_becomes_the_owners_only(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    other = tmp_path / "elsewhere.token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(other))
    (tmp_path / ".ray").mkdir(mode=0o755)
    for path in (tmp_path / ".ray" / "auth_token", other):
        path.write_text("token")
        path.chmod(0o644)
    assert sorted(protect_ray_token()) == sorted([tmp_path / ".ray" / "auth_token", other])
    assert (tmp_path / ".ray" / "auth_token").stat().st_mode & 0o777 == 0o600
    assert other.stat().st_mode & 0o777 == 0o600 and (tmp_path / ".ray").stat().st_mode & 0o777 == 0o700
    assert protect_ray_token() == []


def test_scratch_directories_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    with scratch_dir(tmp_path, "run-") as mine:
        host = mine.name.rsplit("@", 1)[1]
        stale = tmp_path / f"build-0123456789abcdef-xyz.wf{dead.pid}@{host}"
        elsewhere = tmp_path / f"run-abc.wf{dead.pid}@another-host"
        unrelated = tmp_path / "run-abc"
        for path in (stale, elsewhere, unrelated):
            path.mkdir()
        assert clean_stale_scratch(tmp_path) == 1
        assert not stale.exists() and elsewhere.exists() and unrelated.exists() and mine.exists()


def test_only_files_really_inside_the_scratch_directory_are_read(tmp_path):
    (tmp_path / "out.bin").write_bytes(b"1")
    os.symlink("/etc/hostname", tmp_path / "linked.bin")
    os.symlink(tempfile.gettempdir(), tmp_path / "sub")
    os.symlink("out.bin", tmp_path / "alias.bin")
    os.mkfifo(tmp_path / "fifo.bin")  # would block a plain open for reading
    with UntrustedDir(tmp_path) as files:
        assert read_output(files, "out.bin") == b"1"
        # No link is gone through, not even one to a file beside it: the worker never follows one.
        assert read_output(files, "alias.bin") is None and read_output(files, "linked.bin") is None
        assert read_output(files, "missing.bin") is None and read_output(files, "fifo.bin") is None
        with tempfile.NamedTemporaryFile() as outside:
            assert read_output(files, f"sub/{Path(outside.name).name}") is None
