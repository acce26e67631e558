"""The engine on a simulated fleet (cluster.engine.scheduling.simulate): Ray's multi-node test cluster with
fake GPU resources, fake workers that sleep a modelled run time and fake compiles; the driver,
scheduler, Optuna and Parquet are the real ones. Throughput is for scripts/bench_sim.py; here, that
every planned candidate runs exactly once and every worker on every node takes a share."""

from __future__ import annotations

import pytest

from cluster.config import RunPlan, load_run
from cluster.config.run import RACE
from cluster.engine.driver import Sweep
from cluster.engine.scheduling.simulate import SAMPLES_PER_RUN, SIMULATED_GPU, Model, simulated_fleet
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from tests.conftest import REPO


@pytest.fixture(scope="module")  # one cluster for the module's tests: a start costs seconds
def two_gpu_nodes():
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=4)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    cluster.shutdown()


def test_eight_simulated_gpus_on_two_nodes_share_the_queue(tmp_path, two_gpu_nodes):
    plan = load_run(REPO / "configs" / "demo.yaml")
    saxpy = [t for t in plan.targets if t.name == "saxpy"]
    config = plan.config.model_copy(update={
        "output_dir": str(tmp_path), "targets": ["targets/saxpy/target.yaml"],
        "search": plan.config.search.model_copy(update={"sampler": "random", "trials": 64}),
        "measure": plan.config.measure.model_copy(update={"final_top_k": 1, "final_runs": 1, "search_samples": 4}),
        "profile": plan.config.profile.model_copy(update={"candidates": "none"})})
    plan = RunPlan(config, plan.file, tuple(saxpy))
    run_dir = RunDir.create(plan)
    fleet, compile_model = simulated_fleet(8, Model(compile_s=0.05, run_s=0.02))
    summary = Sweep(plan, run_dir, fleet=fleet, compile=compile_model).run(show_progress=False)
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    assert len(search) == 64 and search["candidate_key"].is_unique and (search["status"] == "ok").all()
    assert set(rows["phase"]) == {"baseline", "search", "final"}
    assert rows["gpu_name"].eq(SIMULATED_GPU).all()
    per_worker = search.groupby("worker_id").size()
    assert len(per_worker) == 8 and per_worker.min() >= 2  # every simulated GPU took a share
    assert summary.bookkeeping_s > 0 and summary.ready_s > 0
    # Racing (measure.race, default 1.10): search candidates asked for after the baseline carry the
    # study's best x 1.10; the losers past it are marked, never the baseline or the finals.
    raced = rows[rows["raced"].eq(True)]
    assert len(raced) > 0 and set(raced["phase"]) == {"search"}
    assert (raced["median"] > RACE * rows["median"].min()).all()
    # measure.search_samples caps the search's samples a run; the baseline and finals take the full rule.
    assert search["n_samples"].eq(4).all()
    others = rows[rows["phase"] != "search"]["n_samples"]
    assert len(others) >= 2 and (others % SAMPLES_PER_RUN).eq(0).all() and others.ge(SAMPLES_PER_RUN).all()
    # measure.search_telemetry (default off for a time objective): no NVML monitor on the search's jobs,
    # always on the baseline's and the finals'.
    assert search["energy_j"].isna().all() and search["power_w"].isna().all()
    assert rows[rows["phase"] != "search"]["energy_j"].notna().all()


def test_search_telemetry_and_an_energy_objective_monitor_every_search_job(tmp_path, two_gpu_nodes):
    plan = load_run(REPO / "configs" / "demo.yaml")
    saxpy = [t for t in plan.targets if t.name == "saxpy"]
    for name, search, measure in (("on", {}, {"search_telemetry": True}), ("energy", {"objective": "energy"}, {})):
        config = plan.config.model_copy(update={
            "name": f"telemetry-{name}", "output_dir": str(tmp_path), "targets": ["targets/saxpy/target.yaml"],
            "search": plan.config.search.model_copy(update={"sampler": "random", "trials": 8, **search}),
            "measure": plan.config.measure.model_copy(update={"final_top_k": 1, "final_runs": 1, **measure}),
            "profile": plan.config.profile.model_copy(update={"candidates": "none"})})
        run_dir = RunDir.create(RunPlan(config, plan.file, tuple(saxpy)))
        fleet, compile_model = simulated_fleet(2, Model(compile_s=0.01, run_s=0.01))
        Sweep(RunPlan(config, plan.file, tuple(saxpy)), run_dir, fleet=fleet,
              compile=compile_model).run(show_progress=False)
        search_rows = read_results(run_dir.path).query("phase == 'search' and status == 'ok'")
        assert len(search_rows) == 8 and search_rows["energy_j"].notna().all(), name
