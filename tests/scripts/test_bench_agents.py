"""scripts/bench_agents.py's table from a real (CPU) agent sweep: the figures it reports are the
run's own, and the share is the found speedup over the hand-optimized one."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from cluster.api import read_results, read_table, select_best
from tests.cluster.engine.test_agent_stage import FAST, LOOP, WRONG, Scripted, patched, run_sweep
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_local")


def load_script():
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("bench_agents", REPO / "scripts" / "bench_agents.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_reports_the_runs_figures(tmp_path):
    bench = load_script()
    agent = Scripted({"fast": [patched(LOOP, FAST[1], {"WF_SPLIT": (1, 2)}, FAST[0])], "wrong": [patched(LOOP, WRONG)]})
    run = run_sweep(tmp_path, agent).path
    text, [record] = bench.table(run, {"agent_c": {"hand_speedup": 100.0}})
    # The figures are the rows': which of the variant's flags won, and by how much, is the clock's
    # word on a loaded machine; that the table reports the winner the rows select is not.
    rows, variants = read_results(run), read_table(run, "variants")
    best = select_best(rows)[0]
    fast_source = variants.loc[(variants["optimization"] == "fast") & (variants["stage"] == "accepted"), "source_hash"]
    assert record["target"] == "agent_c" and record["winner"] == ("fast" if best.source_hash in set(fast_source)
                                                                    else "flags only")
    assert record["speedup"] == best.speedup and record["flags"] == " ".join([*best.flag_argv, *best.defines])
    assert record["share"] == pytest.approx(record["speedup"] / 100.0)
    fast = next(f for f in record["found"] if f["optimization"] == "fast")
    wrong = next(f for f in record["found"] if f["optimization"] == "wrong")
    assert fast["accepted"] == 1 and wrong["accepted"] == 0 and wrong["rejected"] == 1
    on_fast = rows[rows["source_hash"].isin(set(fast_source)) & (rows["status"] == "ok") & (rows["phase"] != "final")]
    verified = on_fast.loc[on_fast["phase"] == "verify", "speedup"]
    assert fast["best"] == on_fast["speedup"].max() and fast["alone"] >= verified.max() > 1
    row = text.splitlines()[2]
    assert row.startswith("| agent_c | fast (kernel) |") and f"{100 * record['share']:.0f}%" in row
    assert f"| {record['speedup']:.2f}x | {record['winner']}: `{record['flags'] or '-'}` |" in row
    steps = record["steps_s"]  # the agents' step, the search and the finals, each took time
    assert set(steps) == {"agents", "search", "finals"} and all(v >= 0 for v in steps.values())
    assert f"| {', '.join(f'{k} {v:.0f}' for k, v in steps.items())} |" in row
    # Verification: both variants reached it; the wrong one was rejected by the outputs check.
    checked = record["verification"]
    assert checked["variants"] == 2 and checked["rejected"] == 1
    assert checked["checks"]["outputs"] == {"passed": 1, "failed": 1} and checked["checks"]["build"] == {"passed": 2}
    ran = ", ".join(c for c, n in checked["checks"].items() if n.get("passed") or n.get("failed"))
    took = checked["seconds"]  # where verification's time went: both builds at least took some
    assert took["build"] > 0 and list(took.values()) == sorted(took.values(), reverse=True)
    assert row.endswith(f"| 2 verified, 1 rejected (failed: outputs 1); checks run: {ran}; seconds: "
                        + ", ".join(f"{k} {s:.0f}" for k, s in took.items()) + " |")
    assert f"fast {fast['alone']:.2f}x ({fast['best']:.2f}x)" in row  # each accepted one alone and with flags
    # Each optimization's verdict with its evidence or reason, a line each.
    lines = bench.verdicts(run).splitlines()
    assert any(line.startswith("| agent_c | fast | accepted |") for line in lines)
    assert any(line.startswith("| agent_c | wrong | rejected |") for line in lines)


def test_hand_figures_leave_out_a_target_without_a_hand_optimized_version(tmp_path):
    """The suite's stencil (a control) has no target_opt.yaml: the hand-optimized step, which now runs
    before the sweep, must pass over it rather than end the command (it did, on the GPU)."""
    bench = load_script()
    folders = [REPO / "configs" / "targets" / "stencil", tmp_path / "missing"]
    assert not any((f / "target_opt.yaml").exists() for f in folders)
    assert bench.hand_speedups(folders, repeats=1) == {}  # no GPU asked for: nothing to measure


def test_step_times_leave_out_what_did_not_run():
    """A study a time box ended in its search has no finals: the table then says unfinished."""
    import pandas as pd

    bench = load_script()
    at = pd.Timestamp("2026-11-26 12:00:00", tz="UTC")
    rows = pd.DataFrame({"phase": ["baseline", "search", "search"],
                         "started_at": [at, at + pd.Timedelta(seconds=100), at + pd.Timedelta(seconds=110)],
                         "finished_at": [at + pd.Timedelta(seconds=10), at + pd.Timedelta(seconds=105),
                                         at + pd.Timedelta(seconds=130)]})
    variants = pd.DataFrame({"created_at": [at.timestamp() + 50, at.timestamp() + 90]})
    assert bench.step_times(rows, variants) == {"agents": 80.0, "search": 30.0}
    assert bench.step_times(rows, variants.iloc[:0]) == {"search": 30.0}


def test_winner_label_credits_the_register_expert_only_with_its_own_cap():
    """rodinia_hotspot won with `-maxrregcount=128` from the flags space, where the register expert
    had proposed 32: the table said "registers (-maxrregcount)" for a win of flags alone."""
    import pandas as pd

    from cluster.core.types import BestConfig

    bench = load_script()
    variants = pd.DataFrame({"optimization": ["registers", "restrict"], "stage": ["accepted", "accepted"],
                             "search": ['{"maxrregcount": [32]}', "{}"], "source_hash": ["base", "r1"]})

    def best(cap: str, source: str = "base") -> BestConfig:
        return BestConfig("t", "H200", "sm_90", "nvcc", "k", {"f_maxrregcount": cap, "f_opt": "-O3"}, {}, 1.0, 2.0,
                          2.0, "ms", source_hash=source, baseline_source_hash="base")

    assert bench.winner_label(best("-maxrregcount=128"), variants) == "flags only"
    assert bench.winner_label(best("-maxrregcount=32"), variants) == "registers (-maxrregcount)"
    assert bench.winner_label(best("-maxrregcount=32", "r1"), variants) == "restrict + -maxrregcount"
    assert bench.winner_label(best(""), variants) == "flags only"
    assert bench.winner_label(None, variants) == "flags only"
