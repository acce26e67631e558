"""The sweep end to end on the CPU: real Ray, real Optuna journal, real Parquet, real gcc."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from tests.conftest import REPO, TINY_C, write_config, write_target

pytestmark = pytest.mark.usefixtures("ray_local")
FIXTURES = REPO / "tests" / "fixtures"


def sweep(config: Path, tmp_path: Path, **search) -> tuple[RunDir, object]:
    plan = load_run(config)
    if search:
        plan = type(plan)(plan.config.model_copy(update={
            "search": plan.config.search.model_copy(update=search), "output_dir": str(tmp_path)}),
            plan.file, plan.targets)
    else:
        plan = type(plan)(plan.config.model_copy(update={"output_dir": str(tmp_path)}), plan.file, plan.targets)
    run_dir = RunDir.create(plan)
    summary = Sweep(plan, run_dir).run(show_progress=False)
    return run_dir, summary


def test_cpu_demo_end_to_end(tmp_path):
    run_dir, summary = sweep(FIXTURES / "demo_cpu.yaml", tmp_path)
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    assert len(search) == 8 and search["candidate_key"].is_unique
    baseline = rows[rows["phase"] == "baseline"]
    assert len(baseline) == 1 and baseline["status"].iloc[0] == "ok"
    assert baseline["flags"].iloc[0] == "-O2" and baseline["speedup"].iloc[0] == pytest.approx(1.0)  # the cc space
    assert set(rows["phase"]) == {"baseline", "search", "final"}
    assert (rows["status"] == "ok").all()
    ok = search[search["status"] == "ok"]
    assert (ok["speedup"] > 0).all() and ok["n_samples"].ge(5).all()
    assert rows["gpu_name"].notna().all() and (rows["arch"] == "host").all()
    # every row carries its own flags and params as columns
    assert {"f_opt_level", "f_march", "p_TILE", "p_UNROLL"} <= set(rows.columns)
    assert ((rows["p_TILE"] * rows["p_UNROLL"]) <= 256).all()
    assert summary.evaluated == len(rows)
    assert (run_dir.path / "optuna.journal").stat().st_size > 0
    # the dataset is readable by DuckDB as it is
    n = pytest.importorskip("duckdb").connect().execute(
        f"select count(*) from read_parquet('{run_dir.path}/results/*.parquet')").fetchone()[0]
    assert n == len(rows)
    best = select_best(rows)
    assert len(best) == 1 and best[0].target == "stencil_c" and best[0].speedup > 0


def test_a_finished_sweep_frees_its_workers_for_the_next(tmp_path):
    """The measuring actors go with the sweep that started them: their CPUs are free as it returns
    (before, handles in a reference cycle held them until the garbage collector ran, and a second
    sweep in the same process waited ~15 s for compile slots)."""
    import gc

    import ray

    gc.disable()  # the collector must not be what frees them
    try:
        sweep(FIXTURES / "demo_cpu.yaml", tmp_path, trials=2)
        deadline = time.monotonic() + 60  # at once here; a guard for a loaded machine (the cycle never freed them)
        while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
    finally:
        gc.enable()


def test_a_kept_fleet_serves_the_next_sweep_and_stops_when_closed(tmp_path):
    """A script of many short sweeps starts its measuring actors once (KeptFleet): the second sweep
    runs on the first one's actors, a fleet with an actor gone is replaced, and close stops them."""
    import ray

    from cluster.engine.scheduling.workers import KeptFleet, fleet_key

    plan = load_run(FIXTURES / "demo_cpu.yaml")
    seen = []

    def run(kept: KeptFleet, name: str) -> None:
        config = plan.config.model_copy(update={
            "output_dir": str(tmp_path / name), "search": plan.config.search.model_copy(update={"trials": 2})})
        this = type(plan)(config, plan.file, plan.targets)
        run_dir = RunDir.create(this)
        Sweep(this, run_dir, fleet=kept).run(show_progress=False)
        rows = read_results(run_dir.path)
        assert (rows["status"] == "ok").all() and (rows["phase"] == "search").sum() == 2
        seen.append({w._actor_id.hex() for w in kept._fleet[0]})

    with KeptFleet() as kept:
        run(kept, "a")
        run(kept, "b")
        assert kept.starts == 1 and seen[0] == seen[1]  # the same actors served both sweeps
        [worker] = kept._fleet[0]
        assert ray.get(worker.device_info.remote()).kind == "cpu"  # still running between sweeps
        ray.kill(worker, no_restart=True)
        run(kept, "c")  # its actor gone: a fresh fleet, and the sweep as usual
        assert kept.starts == 2 and seen[2] != seen[1]
        [last] = kept._fleet[0]
    with pytest.raises(ray.exceptions.RayActorError):  # closed: the actors are gone
        # ray.kill is asynchronous: a call sent just after it may still be served, so ask until the
        # death is seen (a live actor answers every time, and the test fails at the deadline).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ray.get(last.device_info.remote(), timeout=30)
            time.sleep(0.2)
    # What decides a fleet: the cluster, the CPU workers, the GPU types, the device kinds; not the
    # driver's own settings.
    spec = plan.config.cluster
    assert fleet_key(spec, {"cpu"}) == fleet_key(spec.model_copy(update={"inflight_per_worker": 5}), {"cpu"})
    assert fleet_key(spec, {"cpu"}) != fleet_key(spec.model_copy(update={"cpu_workers": 3}), {"cpu"})
    assert fleet_key(spec, {"cpu"}) != fleet_key(spec, {"cpu", "gpu"})


def test_failures_are_rows_and_the_sweep_goes_on(tmp_path):
    run_dir, _ = sweep(FIXTURES / "faulty.yaml", tmp_path)
    rows = read_results(run_dir.path)
    by_mode = rows[rows["phase"] != "final"].set_index("p_MODE")["status"].to_dict()
    assert by_mode == {0: "ok", 1: "crashed", 2: "timeout", 3: "verify_failed", 4: "metric_missing",
                       5: "compile_error", 6: "crashed", 7: "crashed", 8: "crashed", 9: "crashed"}
    tails = rows[rows["phase"] != "final"].set_index("p_MODE")["error_tail"].to_dict()
    assert "SIGSEGV" in tails[1] and "timed out" in tails[2] and "SIGABRT" in tails[6]
    assert "exit status 3" in tails[7] and "values differ" in tails[3] and "#error" in tails[5]
    assert "memory limit of 256 MB exceeded" in tails[8] and "disk limit of 64 MB exceeded" in tails[9]
    # MODE 0 is the baseline: the grid's trial for it was answered without running it again
    assert rows.loc[rows["phase"] != "final", "candidate_key"].is_unique
    best = select_best(rows)
    assert best[0].params == {"MODE": 0}


def test_resume_finishes_the_budget_without_evaluating_twice(tmp_path):
    run_dir, _ = sweep(FIXTURES / "demo_cpu.yaml", tmp_path, trials=3)
    first = read_results(run_dir.path)
    assert (first["phase"] == "search").sum() == 3
    plan = load_run(FIXTURES / "demo_cpu.yaml")
    plan = type(plan)(plan.config.model_copy(update={
        "search": plan.config.search.model_copy(update={"trials": 7})}), plan.file, plan.targets)
    Sweep(plan, RunDir.open(run_dir.path)).run(show_progress=False)
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    assert len(search) == 7 and search["candidate_key"].is_unique
    assert (rows["phase"] == "baseline").sum() == 1  # the baseline's reference was kept, not re-run
    # the resumed part files follow the first run's and nothing earlier was rewritten
    assert set(first["candidate_key"]) <= set(rows["candidate_key"])


def test_cli_sweep_show_export(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["sweep", str(FIXTURES / "demo_cpu.yaml"), "--trials", "3",
                                  "--output-dir", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    run = next(tmp_path.iterdir())
    shown = runner.invoke(main, ["show", str(run)])
    assert shown.exit_code == 0 and "stencil_c" in shown.output and "x" in shown.output
    flags = runner.invoke(main, ["export", str(run), "--format", "flags"])
    assert flags.exit_code == 0 and "-DTILE=" in flags.output
    out = tmp_path / "best.h"
    header = runner.invoke(main, ["export", str(run), "--format", "header", "--output", str(out)])
    assert header.exit_code == 0 and "#define TILE" in out.read_text()
    missing = runner.invoke(main, ["export", str(run), "--target", "nope"])
    assert missing.exit_code == 2 and "--target" in missing.output


def test_driver_killed_mid_sweep_then_resumed(tmp_path, ray_address):
    """SIGKILL the driver once some rows are on disk; --resume completes the budget with every
    candidate exactly once, and no earlier row lost. The driver joins the tests' shared Ray, where
    the resume runs (a Ray of its own was one more start)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    config = tmp_path / "run.yaml"
    config.write_text((FIXTURES / "demo_cpu.yaml").read_text().replace(
        "../../configs", str(REPO / "configs")).replace("trials: 8", "trials: 10")
        + "flush_interval_s: 0.1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "sweep", str(config), "--output-dir", str(tmp_path / "runs"),
         "--no-progress"], cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "RAY_ADDRESS": ray_address})
    deadline = time.monotonic() + 120
    run = None
    while time.monotonic() < deadline:
        runs = list((tmp_path / "runs").glob("*/results/*.parquet"))
        if runs:
            run = runs[0].parent.parent
            if (read_results(run)["phase"] == "search").sum() >= 3:
                break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert run is not None, proc.stderr.read().decode()[-2000:]
    before = read_results(run)
    assert 3 <= (before["phase"] == "search").sum() < 10
    plan = load_run(config)
    Sweep(plan, RunDir.open(run)).run(show_progress=False)
    rows = read_results(run)
    search = rows[rows["phase"] == "search"]
    assert len(search) == 10 and search["candidate_key"].is_unique
    assert set(before["candidate_key"]) <= set(rows["candidate_key"])
    assert (rows["phase"] == "baseline").sum() == 1


def test_two_targets_keep_integer_params_in_exports(tmp_path):
    """A param column that another target lacks holds nulls; its values must still export as 16,
    not 16.0 (a -D define of 16.0 is a different program)."""
    write_target(tmp_path / "tiny")
    config = write_config(tmp_path, ["tiny/target.yaml", str(REPO / "configs/targets/stencil_c/target.yaml")],
                          search={"trials": 3, "sampler": "random"}, measure={"final_top_k": 1, "final_runs": 1})
    run_dir, _ = sweep(config, tmp_path)
    rows = read_results(run_dir.path)
    assert set(rows["target"]) == {"tiny", "stencil_c"}
    assert rows.loc[rows["target"] == "tiny", "p_TILE"].isna().all()
    runner = CliRunner()
    flags = runner.invoke(main, ["export", str(run_dir.path), "--format", "flags"])
    assert flags.exit_code == 0, flags.output
    assert "-DTILE=" in flags.output and ".0" not in flags.output
    assert "# tiny on" in flags.output and "# stencil_c on" in flags.output


SLEEP_AND_PAD = """
#ifndef PAD
#define PAD 0
#endif
    volatile int pad = PAD;
    (void)pad;
    usleep(1200000);
"""


def test_time_budget_and_an_rdb_storage(tmp_path):
    """The budget is the sweep's wall clock: the search closes in time for the finals, which run; the
    Optuna study in a shared database carries the run's id. The program sleeps through its run, so
    that the budget's clock passes with the cores free (the C stencil's builds and runs kept both
    busy for the whole budget: 28 CPU-seconds)."""
    import optuna

    # The flags (24 points) and PAD (4, a constant in the binary) change nothing the run writes.
    write_target(tmp_path / "t", params={"N": [1000], "PAD": [0, 1, 2, 3]})
    (tmp_path / "t" / "tiny.c").write_text(TINY_C.replace("return 0;", SLEEP_AND_PAD + "    return 0;")
                                           .replace("#include <stdio.h>", "#include <stdio.h>\n#include <unistd.h>"))
    config = write_config(tmp_path, ["t/target.yaml"], search={"sampler": "random", "seed": 0},
                          measure={"runs": 1, "final_top_k": 2, "final_runs": 2})
    target = load_run(config).targets[0]
    points = math.prod(len(values) for values in [*target.space.flags.values(), *target.spec.params.values()])
    url = f"sqlite:///{tmp_path}/optuna.db"
    # 25 s: at 15 s the suite under two spinning processes (load 6-7) had the baseline in at 14 s,
    # and no search at all.
    run_dir, summary = sweep(config, tmp_path, trials=None, time_budget_s=25.0, storage=url)
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    assert 1 <= len(search) < points and search["candidate_key"].is_unique  # stopped by time, not by the space
    finals = rows[rows["phase"] == "final"]
    assert summary.unfinished == () and len(finals) >= 2 and (finals["status"] == "ok").all()
    assert search["finished_at"].max() <= finals["started_at"].min()  # the search closed, then the finals
    [summary] = optuna.get_all_study_summaries(url)
    assert run_dir.run_id in summary.study_name
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    told = [t for t in study.trials if t.state.is_finished() and "key" in t.user_attrs]
    assert set(search["candidate_key"]) <= {t.user_attrs["key"] for t in told}
    assert not (run_dir.path / "optuna.journal").exists()


def test_show_prints_the_profiles_of_baseline_and_winner(tmp_path):
    """A GPU run's profiles table (written here by hand: no ncu on the CPU) appears in show. The
    run is written from given measurements, so that its winner is never the baseline (a real CPU
    sweep's could be, on a loaded machine, and the baseline's profile then went unchecked)."""
    from cluster.config import load_target
    from cluster.core.types import Phase
    from cluster.measure.profile import PROFILE_SCHEMA
    from cluster.store.results import ResultWriter
    from tests.cluster.outputs.fake_runs import Row, gpu, write_run

    saxpy = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
    tuned = {"BLOCK": 128, "ITEMS": 4}
    run = write_run(tmp_path, "run", saxpy, gpu("NVIDIA H100 80GB HBM3", "9.0"), [
        Row({"BLOCK": 256, "ITEMS": 1}, (2.0,) * 3, phase=Phase.BASELINE), Row(tuned, (1.0,) * 3),
        Row(tuned, (1.0,) * 5, phase=Phase.FINAL)])
    rows = read_results(run)
    baseline = rows.loc[rows["phase"] == "baseline", "candidate_key"].iloc[0]
    [winner] = select_best(rows)
    assert winner.candidate_key != baseline
    device = rows["device_type"].iloc[0]
    metrics = {baseline: (335_100.0, 65_579_100.0, "mio_throttle"), winner.candidate_key: (195_360.0, 0.0, "wait")}
    with ResultWriter(run, PROFILE_SCHEMA, subdir="profiles") as writer:
        for key, (duration_ns, conflicts, stall) in metrics.items():
            for metric, value in (("gpu__time_duration.sum", duration_ns),
                                  ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", conflicts),
                                  (f"smsp__average_warps_issue_stalled_{stall}_per_issue_active.ratio", 4.5)):
                writer.append_record({"run_id": "run", "target": "saxpy", "device_type": device,
                                      "candidate_key": key, "status": "ok", "error_tail": "", "launch": 1,
                                      "kernel": "k", "metric": metric, "unit": "", "value": value})
    shown = CliRunner().invoke(main, ["show", str(run)])
    assert shown.exit_code == 0, shown.output
    assert "Nsight Compute" in shown.output and "0.3351 ms" in shown.output and "65,579,100" in shown.output
    assert "mio_throttle 4.5" in shown.output
    assert "0.1954 ms" in shown.output and "wait 4.5" in shown.output


def test_the_search_is_fed_past_proposals_of_points_measured_already():
    """A converged sampler on a small space proposes points it has (each answered from the results
    at once): the look-ahead is still filled in one feed, not one candidate a poll; a study whose
    sampler proposes nothing new for ASK_RETRIES asks in a row gives the others their turn."""
    import types

    from cluster.engine.driver import ASK_RETRIES, feed_search
    from cluster.engine.flow import Stage, StudyFlow

    class Flow(StudyFlow):
        def __init__(self, name: str, answers: list[bool]) -> None:  # a study's search, no sampler behind it
            self.name, self.device_type, self.stage, self.entered = name, "gpu", Stage.SEARCH, True
            self.search_in_flight, self.answers, self.asked = 0, answers, 0
            self.state = types.SimpleNamespace(n_search=0)

        def wants_more(self) -> bool:
            return True

        def ask(self) -> bool:
            self.asked += 1
            new = self.answers.pop(0) if self.answers else False
            self.search_in_flight += new
            return new

    class Scheduler:
        def lookahead(self, device_type: str) -> int:
            return 4

        def in_flight(self, device_type: str, kind) -> int:
            return sum(f.search_in_flight for f in flows)

        def used(self, lane=None) -> dict[str, float]:
            return {f.name: spent.get(f.name, 0.0) for f in flows}

        def search_cost(self, study: str, device_type: str) -> float:
            return 1.0

    spent: dict[str, float] = {}
    converged = Flow("converged", [True, False, False, False, True, False, True, True])
    flows = [converged]
    feed_search(flows, Scheduler())
    assert converged.search_in_flight == 4 and converged.asked == 8  # one feed, duplicates skipped
    stuck, other = Flow("stuck", []), Flow("other", [True] * 4)
    flows = [stuck, other]
    feed_search(flows, Scheduler())
    assert stuck.asked == ASK_RETRIES and other.search_in_flight == 4


def test_the_search_goes_to_the_study_that_has_used_least_of_the_workers_time():
    """Each free slot goes to the study whose shared lanes' time (search, admissions, checks) is
    least, its candidates in flight counted at its search's average: a study whose agents took
    20 s of checks waits while one the agents had nothing for catches up, whatever the counts."""
    import types

    from cluster.engine.driver import feed_search
    from cluster.engine.flow import Stage, StudyFlow

    class Flow(StudyFlow):
        def __init__(self, name: str, measured: int) -> None:
            self.name, self.device_type, self.stage, self.entered = name, "gpu", Stage.SEARCH, True
            self.search_in_flight = 0
            self.state = types.SimpleNamespace(n_search=measured)

        def wants_more(self) -> bool:
            return True

        def ask(self) -> bool:
            self.search_in_flight += 1
            return True

    class Scheduler:
        def __init__(self, room: int) -> None:
            self.room = room

        def lookahead(self, device_type: str) -> int:
            return self.room

        def in_flight(self, device_type: str, kind) -> int:
            return sum(f.search_in_flight for f in flows)

        def used(self, lane=None) -> dict[str, float]:
            return {"checked": 26.0, "plain": 10.0}

        def search_cost(self, study: str, device_type: str) -> float:
            return {"checked": 1.0, "plain": 2.0}[study]

    checked, plain = Flow("checked", measured=6), Flow("plain", measured=10)
    flows = [checked, plain]
    feed_search(flows, Scheduler(8))
    # plain: 10 s + 2 s a candidate; checked: 26 s + 1 s. Plain takes the slots until 26 s, then turns.
    assert plain.search_in_flight == 8 and checked.search_in_flight == 0
    feed_search(flows, Scheduler(11))
    assert plain.search_in_flight == 9 and checked.search_in_flight == 2
    # A study under half the median study's count goes first, while its time is at most twice the
    # others' mean: time alone left an H200's pb_3mm, whose agents' admissions and checks had spent
    # its share, 2 candidates where the others had 9-17.
    Scheduler.used = lambda self, lane=None: {"checked": 26.0, "plain": 15.0}
    checked.state.n_search, plain.state.n_search = 1, 20
    feed_search(flows, Scheduler(16))  # 5 slots; counts 3 and 29, median 16: checked is under 8
    assert checked.search_in_flight == 7 and plain.search_in_flight == 9
    # ... but not once its time is over twice the median's (a study of minute-long runs), past its
    # first candidate, which goes first whatever its agents took (the search starts at once).
    checked.state.n_search, checked.search_in_flight, plain.search_in_flight = 0, 0, 0
    spent = {"checked": 60.0, "plain": 10.0}
    Scheduler.used = lambda self, lane=None: spent
    feed_search(flows, Scheduler(3))  # the other's 10 s: checked's 60 is over 20, time decides
    assert checked.search_in_flight == 1 and plain.search_in_flight == 2
    checked.state.n_search, checked.search_in_flight, plain.search_in_flight = 1, 0, 0
    feed_search(flows, Scheduler(3))
    assert checked.search_in_flight == 0 and plain.search_in_flight == 3
    plain.search_in_flight, spent["checked"] = 0, 20.0  # at most twice the other's: it goes first
    feed_search(flows, Scheduler(3))
    assert checked.search_in_flight == 3 and plain.search_in_flight == 0
    checked.search_in_flight, spent["checked"] = 0, 21.0
    feed_search(flows, Scheduler(3))
    assert checked.search_in_flight == 0 and plain.search_in_flight == 3
    # Its search's time decides whether it is starved, not its checks': 60 s of sanitizer runs and
    # 5 s of search (softmax_rows on an H200: 48 s of checks of one variant, 1 search candidate).
    searched = {"checked": 5.0, "plain": 10.0}
    Scheduler.used = lambda self, lane=None: spent if lane is None else searched
    checked.search_in_flight, plain.search_in_flight, spent["checked"] = 0, 0, 60.0
    feed_search(flows, Scheduler(3))
    assert checked.search_in_flight == 3 and plain.search_in_flight == 0
