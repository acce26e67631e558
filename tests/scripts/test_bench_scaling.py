"""scripts/bench_scaling.py on the CPU: a child sweep per worker count in its own process, and
the table's figures taken from the runs' rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert 0 < result["first_search_after_s"] < result["wall_s"] and result["search_rate_per_min"] > 0
    assert result["busy_mid_search"] is None  # 3 search candidates: too few for a mid-search window
    steps = result["steps_median"]
    assert steps["run_s"] > 0 and steps["row_on_worker_s"] >= steps["run_s"]
    assert (tmp_path / "count-1.log").read_text().strip()  # the sweep's own log, line by line
    row = (tmp_path / "scaling.md").read_text().splitlines()[2]
    assert row.startswith("| 1 | ") and "| 100%, 100% | 1/1; 1/1; 0.0% |" in row
    # A count that was stopped is read from the rows it wrote: the same figures, no winner picked.
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_scaling

    killed = bench_scaling.figures(Path(result["run_dir"]), 1, 0.0, 100.0, None, finished=False)
    assert killed["search_candidates"] == 3 and killed["winners"] == {} and not killed["finished"]
    assert bench_scaling.per_count("1:200, 4:70") == {1: 200.0, 4: 70.0}
    # --report: the table again from the counts' JSON, without a run.
    again = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_scaling.py"),
                            str(REPO / "tests" / "fixtures" / "demo_cpu.yaml"), "--out", str(tmp_path / "merged"),
                            "--report", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp_path / "merged" / "scaling.md").read_text() == (tmp_path / "scaling.md").read_text()


def test_counts_placed_on_cards_and_cores_of_their_own():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_scaling

    # Concurrent counts 1 and 2 on a four-GPU host of 64 cores: card 0 with cores 0-15, cards 1-2 with 16-47.
    assert bench_scaling.placement([1, 2], True, 16) == {1: ([0], "0-15"), 2: ([1, 2], "16-47")}
    # One after the other, every count starts at card 0; 16 cores a GPU, or all cores without a figure.
    assert bench_scaling.placement([4, 1], False, 16) == {4: ([0, 1, 2, 3], "0-63"), 1: ([0], "0-15")}
    assert bench_scaling.placement([2], False, 0) == {2: ([0, 1], "")}
    assert bench_scaling.parse_cores("0-3,8") == [0, 1, 2, 3, 8] and bench_scaling.parse_cores("") == []


def test_winners_agree_by_candidate_by_params_and_by_speedup():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_scaling

    one = {"a": {"key": "k1", "config": "-maxrregcount=48 -DTILE=4", "speedup": 2.0},
           "b": {"key": "k2", "config": "-DX=1", "speedup": 1.5}}
    # Another count: a's winner differs only in a flag (same code params), b's in its params.
    other = {"a": {"key": "k9", "config": "-Xptxas -dlcm=ca -DTILE=4", "speedup": 2.01},
             "b": {"key": "k8", "config": "-DX=2", "speedup": 1.47}}
    keys, params, spread = bench_scaling.agreement(one, other)
    assert (keys, params) == (0, 1) and abs(spread - 0.02) < 1e-9
    assert bench_scaling.agreement(one, one) == (2, 2, 0.0) and bench_scaling.agreement(one, {}) == (0, 0, None)


def test_report_without_counts_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_scaling.py"), "x.yaml", "--out",
                           str(tmp_path), "--report"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0 and "no count-N.json" in done.stderr
