"""Issue 16: the attacks that got through the old sandbox, each a target whose ATTACK=1 candidate
attacks (its baseline, ATTACK=0, does not), swept together by ``warpfleet sweep`` under the
sandbox. Each test asserts its attack was stopped and its target has every row.

The same tests run with CUDA targets on a GPU machine (the ``nvcc`` parameter, marked gpu):
``pytest -m gpu tests/cluster/engine/test_attacks.py``.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster.config import SandboxSpec
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import SandboxError
from tests.conftest import REPO, gpu_present, repo_pythonpath

ATTACKS = REPO / "tests" / "fixtures" / "attacks"
SECRETS = {"OPENAI_API_KEY": "sk-warpfleet-attack-test-0123456789", "AWS_SECRET_ACCESS_KEY": "warpfleet/attack/test/42",
           "WARPFLEET_DSN": "postgres://u:PASSWORD-attack-test@host/db"}  # issue 26: not secret by its name
SANDBOX = {"cc": {"memory_mb": 256, "pids": 64}, "nvcc": {"memory_mb": 4096, "pids": 256}}  # CUDA needs more
NAMES = ("environ", "setsid", "writes", "forkbomb", "memory", "network", "include_shadow", "link_output",
         "capture_links", "many_files")


@dataclass
class Attacked:
    """One sweep of every attack, and what the tests check on the host afterwards."""

    toolchain: str
    work: Path
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    run_dir: Path = Path()
    log: str = ""
    markers: tuple[str, str] = ("", "")
    listener: socket.socket | None = None
    written: dict[str, Path] = field(default_factory=dict)  # what the write attack aimed at on the host
    sources: dict[str, bytes] = field(default_factory=dict)

    def target(self, name: str) -> pd.DataFrame:
        return self.rows[self.rows["target"] == name]

    def attack(self, name: str) -> pd.Series:
        """The target's attacking row, once its baseline (ATTACK=0) is known to be fine."""
        rows = self.target(name)
        rows = rows[rows["phase"] != "final"]  # the finals re-run the best (or the baseline) on fresh seeds
        everything = f"{self.rows[['target', 'phase', 'status', 'error_tail']]}\n{self.log[-3000:]}"
        assert list(rows["phase"]) == ["baseline", "search"], everything
        assert rows.iloc[0]["status"] == "ok", everything
        return rows.iloc[1]


@pytest.fixture(scope="module", params=["cc", pytest.param("nvcc", marks=pytest.mark.gpu)])
def attacked(request) -> Iterator[Attacked]:
    toolchain = request.param
    if toolchain == "nvcc" and not gpu_present():
        pytest.skip("no NVIDIA GPU and nvcc")
    try:
        start_bubblewrap(SandboxSpec())
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    # Not under /tmp: the sandbox hides /tmp, and these files must be in sight (read-only) to be attacked.
    work = Path(tempfile.mkdtemp(prefix="warpfleet-attacks-", dir="/var/tmp"))
    work.chmod(0o755)
    attacked = Attacked(toolchain, work)
    try:
        _sweep(attacked)
        yield attacked
    finally:
        if attacked.listener:
            attacked.listener.close()
        for path in attacked.written.values():
            if path.is_relative_to(Path.home()):
                path.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def _sweep(attacked: Attacked) -> None:
    work, toolchain = attacked.work, attacked.toolchain
    secret = work / "credentials"
    secret.write_text("warpfleet-attack-credential\n")
    secret.chmod(0o600)
    attacked.markers = tuple(f"{random.randint(1000, 9999)}.{os.getpid()}{i}" for i in (1, 2))  # type: ignore[assignment]
    attacked.listener = socket.create_server(("0.0.0.0", 0))
    attacked.listener.setblocking(False)
    port = str(attacked.listener.getsockname()[1])
    home_file = Path.home() / f"warpfleet-attack-{os.getpid()}.txt"
    attacked.written = {"absolute": work / "absolute.txt", "dotdot": work / "escape.txt", "home": home_file}
    runs = {"capture_links": [str(work / "targets" / "capture_links" / f"capture_links.{_suffix(toolchain)}")],
            "environ": [str(secret), str(Path.home() / ".ray" / "auth_token")],
            "setsid": list(attacked.markers),
            "writes": [str(attacked.written["absolute"]), "../../escape.txt", str(home_file),
                       str(work / "targets" / "writes" / f"writes.{_suffix(toolchain)}")],
            "network": [port, "127.0.0.1", *_host_address()]}
    targets = [_write_target(work / "targets", name, toolchain, runs.get(name, [])) for name in NAMES]
    attacked.sources = {name: (work / "targets" / name / f"{name}.{_suffix(toolchain)}").read_bytes()
                        for name in NAMES}
    config = work / "attacks.yaml"
    config.write_text(yaml.safe_dump({
        "name": f"attacks-{toolchain}", "targets": targets, "output_dir": str(work / "runs"),
        # Two runs a candidate: the second finds what the first left in the directory (issue 26).
        "search": {"sampler": "grid", "trials": 2}, "measure": {"final_top_k": 0, "runs": 2},
        "profile": {"candidates": "none"}, "sandbox": SANDBOX[toolchain]}, sort_keys=False))
    (work / "scratch").mkdir()
    env = {**os.environ, **SECRETS, "PYTHONPATH": repo_pythonpath(), "WARPFLEET_SCRATCH": str(work / "scratch")}
    result = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", str(config), "--no-progress"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=900)
    attacked.log = result.stdout + result.stderr
    assert result.returncode == 0, attacked.log[-4000:]  # the driver survived every attack
    from cluster.store.results import read_results

    attacked.run_dir = next((work / "runs").iterdir())
    attacked.rows = read_results(attacked.run_dir).sort_values(["target", "phase"])


def _suffix(toolchain: str) -> str:
    return "cu" if toolchain == "nvcc" else "c"


def _write_target(root: Path, name: str, toolchain: str, args: list[str]) -> str:
    folder = root / name
    folder.mkdir(parents=True)
    source = f"{name}.{_suffix(toolchain)}"
    shutil.copyfile(ATTACKS / f"{name}.c", folder / source)
    shutil.copyfile(ATTACKS / "attack.h", folder / "attack.h")
    shutil.copyfile(ATTACKS / f"space_{toolchain}.yaml", folder / "space.yaml")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": name, "toolchain": toolchain, "space": "space.yaml", "sources": [source], "files": ["attack.h"],
        "run": ["{binary}", *args], "verify": {"outputs": ["out.bin"]}, "params": {"ATTACK": [0, 1]},
        "timeouts": {"build": 120, "run": 30}}, sort_keys=False))
    return f"targets/{name}/target.yaml"


def _host_address() -> list[str]:
    """This host's address on its network (beside loopback), where it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
            address = probe.getsockname()[0]
        except OSError:
            return []
    return [] if address.startswith(("0.", "127.")) else [address]


def _shadow() -> bytes:
    """/etc/shadow, where the tests may read it (as root); else nothing to look for."""
    return Path("/etc/shadow").read_bytes() if os.access("/etc/shadow", os.R_OK) else b"\0unreadable\0"


def test_the_worker_environment_and_secret_files_are_out_of_reach(attacked):
    row = attacked.attack("environ")
    assert row["status"] == "ok", row["error_tail"]  # exit 3 and the loot in error_tail, had it read any
    texts = [attacked.log, *(p.read_bytes().decode(errors="replace") for p in attacked.run_dir.rglob("*")
                             if p.is_file())]
    for text in texts:
        for value in (*SECRETS.values(), "warpfleet-attack-credential"):
            assert value not in text


def test_setsid_and_a_double_fork_leave_no_process_behind(attacked):
    row = attacked.attack("setsid")
    assert row["status"] == "ok", row["error_tail"]
    time.sleep(0.5)
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and any(m in _cmdline(pid) for m in attacked.markers)]
    assert not left, f"still running: {[_cmdline(pid) for pid in left]}"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_writes_outside_the_scratch_directory_and_to_the_sources_do_not_land(attacked):
    row = attacked.attack("writes")
    assert row["status"] == "ok", row["error_tail"]
    for name, path in attacked.written.items():
        assert not path.exists(), f"the {name} write reached {path}"
    source = attacked.work / "targets" / "writes" / f"writes.{_suffix(attacked.toolchain)}"
    assert source.read_bytes() == attacked.sources["writes"]


def test_a_fork_bomb_hits_the_process_limit_and_the_sweep_goes_on(attacked):
    row = attacked.attack("forkbomb")
    pids = SANDBOX[attacked.toolchain]["pids"]
    assert row["status"] == "crashed" and f"processes limit of {pids} exceeded" in row["error_tail"], row["error_tail"]
    assert attacked.rows["target"].nunique() == len(NAMES)  # every target has its rows: the driver survived


def test_a_50_gb_allocation_hits_the_memory_limit(attacked):
    row = attacked.attack("memory")
    memory = SANDBOX[attacked.toolchain]["memory_mb"]
    assert row["status"] == "crashed" and f"memory limit of {memory} MB exceeded" in row["error_tail"], \
        row["error_tail"]


def test_no_network_socket_gets_out(attacked):
    row = attacked.attack("network")
    assert row["status"] == "ok", row["error_tail"]  # exit 3, had it connected
    with pytest.raises(BlockingIOError):
        attacked.listener.accept()


def test_an_include_of_etc_shadow_fails_without_its_content(attacked):
    row = attacked.attack("include_shadow")
    denied = ("Permission denied", "cannot open source file")  # gcc's words, nvcc's front end's
    assert row["status"] == "compile_error" and any(d in row["error_tail"] for d in denied), row["error_tail"]
    first_line = _shadow().decode(errors="replace").splitlines()[0]
    assert not attacked.rows["error_tail"].fillna("").str.contains(first_line, regex=False).any()


def test_an_output_linked_to_etc_shadow_is_not_read(attacked):
    row = attacked.attack("link_output")
    assert row["status"] == "verify_failed" and "out.bin: not written" in row["error_tail"], row["error_tail"]
    shadow = _shadow()
    for path in attacked.run_dir.rglob("*"):
        assert not path.is_file() or shadow[:32] not in path.read_bytes()


def test_capture_files_replaced_with_links_are_refused_and_the_source_is_untouched(attacked):
    """Issue 26: the worker (root, outside the sandbox) opened the next run's .warpfleet.stdout by
    name: through the candidate's link it overwrote the target's source, and the candidate won."""
    row = attacked.attack("capture_links")
    assert row["status"] == "crashed" and "refused" in row["error_tail"], row["error_tail"]
    assert "symbolic link" in row["error_tail"], row["error_tail"]
    source = attacked.work / "targets" / "capture_links" / f"capture_links.{_suffix(attacked.toolchain)}"
    assert source.read_bytes() == attacked.sources["capture_links"]


def test_an_inode_bomb_stops_at_the_file_limit(attacked):
    row = attacked.attack("many_files")
    assert row["status"] == "too_many_files" and "files limit of 20000 files exceeded" in row["error_tail"], \
        row["error_tail"]


def test_the_run_directory_records_the_sandbox(attacked):
    import json

    meta = json.loads((attacked.run_dir / "meta.json").read_text())
    assert meta["sandbox"]["mode"] == "bwrap" and meta["unsandboxed"] is False
    assert meta["sandbox"]["pids"] == SANDBOX[attacked.toolchain]["pids"]
