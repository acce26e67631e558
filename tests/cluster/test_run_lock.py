"""Issue 26: one driver per run. Two ``sweep --resume`` of one run at once both ran (144 rows where
83 were due, 61 duplicated): the second must refuse in one line while the first holds the run, and
a dead driver's lock must not keep the next one out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from tests.conftest import REPO, repo_pythonpath

FIXTURES = REPO / "tests" / "fixtures"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", *args]


def _holder(run: Path) -> int | None:
    try:
        return int(json.loads((run / RunDir.OWNER_LOCK).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_a_second_driver_refuses_in_one_line_and_a_dead_drivers_run_is_taken_over(tmp_path, ray_address):
    config = tmp_path / "run.yaml"
    config.write_text((FIXTURES / "demo_cpu.yaml").read_text().replace("../../configs", str(REPO / "configs")))
    env = {**os.environ, "PYTHONPATH": repo_pythonpath(), "RAY_ADDRESS": ray_address}  # the drivers join one Ray
    first = subprocess.Popen(_cli("sweep", str(config), "--output-dir", str(tmp_path / "runs"), "--no-progress"),
                             cwd=tmp_path, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    run = None
    try:
        deadline = time.monotonic() + 300
        while run is None and time.monotonic() < deadline and first.poll() is None:
            run = next((r for r in (tmp_path / "runs").glob("*") if _holder(r) == first.pid), None)
            time.sleep(0.05)
        assert run is not None, first.stderr.read().decode()[-2000:] if first.poll() is not None else "no lock"
        os.killpg(first.pid, signal.SIGSTOP)  # the first driver holds the run, frozen wherever it was
        second = subprocess.run(_cli("sweep", str(config), "--resume", str(run), "--no-progress"), cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=300)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr[-3000:]
        assert lines[0].startswith(f"error: {run / RunDir.OWNER_LOCK}: another driver is running this run")
        assert f"pid {first.pid} on " in lines[0]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # its lock dies with it
        first.wait()
    taken = subprocess.run(_cli("sweep", str(config), "--resume", str(run), "--no-progress"), cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=600)
    assert taken.returncode == 0, taken.stderr[-3000:]
    rows = read_results(run)
    search = rows[rows["phase"] == "search"]
    assert len(search) == 8 and search["candidate_key"].is_unique, rows[["phase", "candidate_key", "status"]]
    assert (rows["phase"] == "baseline").sum() == 1
