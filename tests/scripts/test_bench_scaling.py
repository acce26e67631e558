"""scripts/bench_scaling.py on the CPU: a child sweep per worker count in its own process, and
the table's figures taken from the runs' rows."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_one_worker_count_end_to_end(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_scaling.py"),
                           str(REPO / "tests" / "fixtures" / "demo_cpu.yaml"), "--counts", "1", "--trials", "3",
                           "--out", str(tmp_path), "--cpu"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [result] = json.loads((tmp_path / "scaling.json").read_text())
    assert result["count"] == 1 and result["search_candidates"] == 3
    assert result["rate_per_min"] == 60 * 3 / result["wall_s"]
    assert list(result["winners"]) == ["stencil_c"] and result["winners"]["stencil_c"]["found_after_s"] >= 0
    assert len(result["busy"]) == 1 and 0 < next(iter(result["busy"].values())) < 1
    row = (tmp_path / "scaling.md").read_text().splitlines()[2]
    assert row.startswith("| 1 |") and "| 100% | 1/1 |" in row
