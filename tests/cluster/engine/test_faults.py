"""Faults the sweep must survive with its results complete: every planned candidate has exactly
one row, nothing lost, nothing duplicated. (Crashing, hanging and wrong candidates are in
test_driver.py; the driver killed and resumed too; a flush interrupted in test_results.py.)"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from cluster.config import RunPlan, load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures"


def _plan(config, tmp_path, **search) -> RunPlan:
    plan = load_run(config)
    update = {"output_dir": str(tmp_path)}
    if search:
        update["search"] = plan.config.search.model_copy(update=search)
    return RunPlan(plan.config.model_copy(update=update), plan.file, plan.targets)


def test_a_candidate_that_kills_its_worker_is_quarantined(tmp_path, ray_unsandboxed):  # sandbox: inside, it could not
    plan = _plan(FIXTURES / "poison.yaml", tmp_path)
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)
    rows = read_results(run_dir.path)
    planned = rows[rows["phase"] != "final"]
    assert len(planned) == 4 and planned["candidate_key"].is_unique  # 2 x 2 points, each once
    poisoned = planned[planned["p_POISON"] == 1]
    assert (poisoned["status"] == "quarantined").all(), poisoned[["status", "error_tail"]]
    assert poisoned["error_tail"].str.contains("died 2 times").all()
    healthy = planned[planned["p_POISON"] == 0]
    assert (healthy["status"] == "ok").all()  # the restarted worker measured the rest


def test_a_locked_optuna_database_only_slows_the_sweep(tmp_path, ray_local):
    """Another process holds the SQLite study database locked for longer than SQLite's own
    5 s wait; the driver retries and finishes with every row."""
    db = tmp_path / "optuna.db"
    plan = _plan(FIXTURES / "demo_cpu.yaml", tmp_path, trials=4, storage=f"sqlite:///{db}")
    run_dir = RunDir.create(plan)
    locked = threading.Event()

    def hold_lock() -> None:
        while not db.exists():
            time.sleep(0.05)
        time.sleep(1.0)  # let the sweep create its tables first
        connection = sqlite3.connect(db, timeout=30)
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        time.sleep(7.0)
        connection.rollback()
        connection.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    Sweep(plan, run_dir).run(show_progress=False)
    holder.join()
    assert locked.is_set()
    rows = read_results(run_dir.path)
    assert (rows["phase"] == "search").sum() == 4 and (rows["status"] == "ok").all()


@pytest.mark.timeout(600)
@pytest.mark.own_ray
def test_candidates_spread_over_nodes_and_a_lost_node_is_survived(tmp_path):
    """Three Ray nodes on one machine (Ray's own multi-node test helper); a worker node is removed
    mid-sweep; its candidates are finished on the nodes left."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        plan = _plan(FIXTURES / "demo_cpu.yaml", tmp_path, trials=14)
        plan = RunPlan(plan.config.model_copy(update={
            "cluster": plan.config.cluster.model_copy(update={"cpu_workers": 2}),
            "flush_interval_s": 0.2}), plan.file, plan.targets)
        run_dir = RunDir.create(plan)
        removed = threading.Event()

        def remove_one_node() -> None:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                rows = read_results(run_dir.path)
                if (rows["phase"] == "search").sum() >= 4 if len(rows) else False:
                    cluster.remove_node(workers[0])
                    removed.set()
                    return
                time.sleep(0.2)

        remover = threading.Thread(target=remove_one_node)
        remover.start()
        Sweep(plan, run_dir).run(show_progress=False)
        remover.join()
        assert removed.is_set()
        rows = read_results(run_dir.path)
        search = rows[rows["phase"] == "search"]
        assert len(search) == 14 and search["candidate_key"].is_unique
        assert (rows["status"] == "ok").all(), rows[["status", "error_tail"]]
        assert rows["node_id"].nunique() >= 2  # measured on more than one node
    finally:
        ray.shutdown()
        cluster.shutdown()
