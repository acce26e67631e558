"""scripts/bench_runners.py --actor on the CPU: a C target through the process runner, the NVML
monitor on the package's fake source. Where a job's time goes comes out as figures that add up."""

from __future__ import annotations

import pytest

from cluster.config import load_target
from cluster.platform.nvidia import FakeNvmlSource
from tests.conftest import needs, write_target


@needs("cc")
def test_actor_jobs_split_a_job_into_its_run_and_what_is_outside(tmp_path):
    from scripts.bench_runners import actor_jobs, actor_table

    target = load_target(write_target(tmp_path, params={}))
    row = actor_jobs(target, "process", repeats=3, max_samples=10, source=FakeNvmlSource())
    assert row["jobs"] == 3 and row["runner"] == "process" and row["target"] == "tiny"
    assert 0 < row["run_s"] < row["job_s"] and row["verify_s"] >= 0
    assert row["outside_run_s"] == pytest.approx(row["job_s"] - row["run_s"] - row["verify_s"])
    assert row["outside_run_s"] > 0 and row["monitor_s"] > 0 and row["stage_s"] > 0 and row["nvml_read_s"] > 0
    table = actor_table([row])
    assert table.count("\n") == 3 and "| tiny | process |" in table
    assert f"**{1e3 * row['outside_run_s']:.2f} ms**" in table


@needs("cc")
def test_split_runs_divide_a_runs_time_into_pieces_that_add_up(tmp_path):
    from scripts.bench_runners import context_program, split_runs, split_table

    target = load_target(write_target(tmp_path / "t", params={}))
    row = split_runs(target, 2, context_program(tmp_path, gpu=False), max_samples=100)
    assert row["target"] == "tiny" and row["repeats"] == 2
    assert all(row[k] > 0 for k in ("context_s", "bare_s", "timed_s", "sandbox_s", "engine_s", "job_s"))
    assert row["own_untimed_s"] == pytest.approx(row["bare_s"] - row["context_s"] - row["timed_s"])
    assert row["device_clock_s"] == pytest.approx(row["engine_s"] - row["sandbox_s"])  # no device clock on a CPU
    table = split_table([row])
    assert table.count("\n") == 3 and table.splitlines()[2].startswith("| tiny | ")
