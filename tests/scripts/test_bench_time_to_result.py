"""scripts/bench_time_to_result.py's account of the driver's loop (``--stacks``): from the main
thread's samples, the seconds by where it was and its longest stretch away from its workers."""

from __future__ import annotations

import pytest

from scripts.bench_time_to_result import driver_time, pair, plain_config

POLL = "worker.py:3237:wait <- client_mode_hook.py:134:wrapper <- scheduler.py:238:poll <- driver.py:274:run_flows"
PART = ("core.py:1216:write_table <- parts.py:41:write_atomically <- parts.py:114:unify_parts <- "
        "results.py:402:widen <- driver.py:206:_widen")
FLUSH = "parts.py:43:write_atomically <- results.py:438:_write_part <- results.py:423:flush <- driver.py:284:run_flows"
RAY_START = "services.py:1422:start_api_server <- worker.py:2040:init <- driver.py:86:init_ray"


def test_the_loops_time_by_where_it_was_and_its_longest_stretch_away_from_its_workers(tmp_path):
    lines = [f"M 0.00 0.050 {RAY_START}"] * 40  # 2 s of Ray's start: before the loop, no stretch
    lines += [f"M 1.00 0.050 {POLL}"] * 4
    lines += [f"M 2.00 1.200 {PART}", f"M 3.00 0.100 {PART}", "O 3.00 77 engine.py:183:_pursue"]  # a held-up sampler
    lines += [f"M 4.00 0.050 {POLL}", f"M 5.00 0.100 {FLUSH}", f"M 6.00 0.050 {POLL}"]
    (tmp_path / "stacks-1.txt").write_text("\n".join(lines) + "\n")
    found = driver_time(tmp_path)
    assert found["poll"] == pytest.approx(0.3) and found["parquet parts"] == pytest.approx(1.4)
    assert found["other"] == pytest.approx(2.0) and "optuna journal" not in found
    assert found["longest_away_from_poll"] == pytest.approx(1.3)
    assert driver_time(tmp_path / "none") == {"longest_away_from_poll": 0.0}


def test_the_pair_compares_each_programs_winners_and_searches_agents_off_and_on(tmp_path):
    def side(run, winners, searches, kinds):
        return {"run": run, "budget_s": 300, "worker_s_by_kind": kinds,
                "studies": [{"target": t, "winner": w, "search": n, "verify": 0}
                            for t, w, n in zip(("a", "b"), winners, searches, strict=True)]}

    text = pair(side("off", (2.0, 1.0), (24, 10), {"search": 90.0}) | {"search_closed_s": 177.2, "last_job_s": 250.4},
                side("on", (1.0, 4.0), (12, 3), {"search": 60.0, "sanitize": 20.0}))
    assert "agents off: the search's last start at 177 s, the last job's end at 250 s, of a budget of 300 s" in text
    assert "agents on: the search's last start" not in text  # a run that does not say
    assert "| a | 2.00x | 1.00x | 0.500 | 24 | 12 | 0 |" in text
    assert "| b | 1.00x | 4.00x | 4.000 | 10 | 3 | 0 |" in text
    assert "on/off >= 0.98: 1 of 2" in text and "off 1.414x, on 2.000x" in text
    assert "agents on: search 60.0 (75%), sanitize 20.0 (25%); search and admissions 75%" in text
    assert "per program: 0.30 at the least (1 of 2 at half or more)" in text  # a: 12 of 24, b: 3 of 10


def test_the_plain_config_turns_the_agents_on_or_off_and_nothing_else(tmp_path):
    import yaml

    from tests.conftest import REPO

    off = yaml.safe_load(plain_config(REPO / "configs/unseen.yaml", tmp_path / "off", False, agents=False).read_text())
    on = yaml.safe_load(plain_config(REPO / "configs/unseen.yaml", tmp_path / "on", False).read_text())
    assert off["agents"] == {"enabled": False} and on["agents"] == {"enabled": True}
    assert off["targets"] == on["targets"] and set(off) == set(on) == {"name", "targets", "output_dir", "agents"}
