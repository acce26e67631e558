"""Issue 25 on the CPU, with the simulated fleet (cluster.engine.scheduling.simulate: one fake GPU whose every
expensive check sleeps): the search starts from the baseline on while the agents work; a variant
joins it when the cheap checks admit it; only a variant faster than the baseline pays for the
expensive checks, which must pass before it is a final; the whole-sweep time budget ends the sweep
with re-measured winners. The driver, scheduler, Optuna, the agents' workflow and Parquet are real."""

from __future__ import annotations

import time

import pytest

from agents._base import AnalysisContext, Proposal
from agents.patch import source_files
from agents.workflow import Analyst, Finding, Level, Plan, Planner, Steps, Transformer
from cluster.config import RunPlan, load_run
from cluster.engine.driver import Sweep
from cluster.engine.plan.budget import grace_s
from cluster.engine.scheduling.simulate import Model, simulated_fleet
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.select import best_so_far, load_verified, select_best
from cluster.store.tables import JOBS_SCHEMA
from cluster.store.variants import VARIANT_SCHEMA, latest_outcomes
from tests.conftest import REPO

HEADER = "// A SAXPY-like CUDA kernel for the GPU demo"
CHECK_S = 2.0  # every simulated expensive check
# A run of the budgeted sweeps' fake GPU: at 0.05 s their search filled 45 s with 628 jobs, each some
# 30 ms of the driver's and Ray's CPU (18 CPU-seconds a test); what they assert needs a few.
BUDGETED_RUN_S = 0.25


@pytest.fixture(scope="module")
def one_fake_gpu():
    import ray

    ray.shutdown()
    ray.init(address="local", num_cpus=3, num_gpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


class Commented(Analyst, Planner, Transformer):
    """Proposes variants of saxpy that differ in a comment only (the simulated worker decides their
    speed by source hash); ``delay_s``: each transformation's time, as an expert's analysis takes."""

    name = "commented"

    def __init__(self, words: tuple[str, ...], delay_s: float = 0.0) -> None:
        self.words, self.delay_s = words, delay_s

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        return [Finding(word, Level.KERNEL, f"saxpy.cu:1 {word}", True, ("scripted",)) for word in self.words]

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan:
        return Plan(finding, ("comment",))

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        time.sleep(self.delay_s)
        return [Proposal(self.name, plan.optimization, (("saxpy.cu", variant_text(plan.optimization)),))]


def variant_text(word: str) -> str:
    from cluster.config import load_target

    text = source_files(load_target(REPO / "configs/targets/saxpy/target.yaml"))["saxpy.cu"]
    return text.replace(HEADER, f"{HEADER} ({word})")


def variant_hash(word: str) -> str:
    from agents.patch import variant_target
    from cluster.config import load_target

    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    return variant_target(target, Proposal("x", word, (("saxpy.cu", variant_text(word)),))).bundle.hash


def sweep(tmp_path, agent: Commented, model: Model, trials: int | None = 16, budget: float | None = None,
          started_at: float | None = None):
    plan = load_run(REPO / "configs" / "demo.yaml")
    saxpy = tuple(t for t in plan.targets if t.name == "saxpy")
    config = plan.config.model_copy(update={
        "output_dir": str(tmp_path), "targets": ["targets/saxpy/target.yaml"],
        "search": plan.config.search.model_copy(update={"sampler": "random", "trials": trials,
                                                        "time_budget_s": budget}),
        "measure": plan.config.measure.model_copy(update={"final_top_k": 2, "final_runs": 2}),
        "profile": plan.config.profile.model_copy(update={"candidates": "none"}),
        "agents": plan.config.agents.model_copy(update={"enabled": True})})
    plan = RunPlan(config, plan.file, saxpy)
    run_dir = RunDir.create(plan)
    fleet, compile_model = simulated_fleet(1, model)
    summary = Sweep(plan, run_dir, fleet=fleet, compile=compile_model,
                    agent_steps=lambda: [Steps.of(agent)], started_at=started_at).run(show_progress=False)
    return run_dir, summary


def test_the_search_starts_at_once_and_only_a_faster_variant_pays_for_the_expensive_checks(tmp_path, one_fake_gpu):
    fast, slow = variant_hash("fast"), variant_hash("slow")
    model = Model(compile_s=0.01, run_s=0.02, check_s=CHECK_S, speed=((fast, 0.25), (slow, 4.0)))
    run_dir, summary = sweep(tmp_path, Commented(("fast", "slow"), delay_s=1.0), model)
    rows = read_results(run_dir.path)
    jobs = read_table(run_dir.path, RunDir.JOBS, JOBS_SCHEMA)
    search = rows[rows["phase"] == "search"]
    verify = rows[rows["phase"] == "verify"]
    # The flags search ran while the agents were still transforming: before any variant was verified.
    assert len(verify) == 2 and search["started_at"].min() < verify["started_at"].min()
    # Both variants joined the running search.
    assert {fast, slow} <= set(search["source_hash"])
    # Only the faster variant paid for compute-sanitizer (the cheat checks: its timing code read, the
    # rest its finals' runs); its sanitizer runs came back clean, so the baseline's own were never needed.
    checks = jobs[jobs["kind"] == "sanitize"]
    fast_key = verify.loc[verify["source_hash"] == fast, "candidate_key"].iloc[0]
    slow_key = verify.loc[verify["source_hash"] == slow, "candidate_key"].iloc[0]
    assert fast_key in set(checks["candidate_key"]) and slow_key not in set(checks["candidate_key"])
    assert list(checks["kind"]) == ["sanitize"]
    variants = latest_outcomes(read_table(run_dir.path, RunDir.VARIANTS, VARIANT_SCHEMA))
    states = dict(zip(variants["source_hash"], variants["checks"], strict=True))
    assert states == {fast: "passed", slow: ""}
    # The winner is re-measured, from the faster variant, its checks passed before its finals.
    [best] = select_best(rows)
    assert best.source_hash == fast and best.speedup > 2
    finals = rows[(rows["phase"] == "final") & (rows["source_hash"] == fast)]
    assert len(finals) >= 1 and finals["started_at"].min() >= checks["finished_at"].max()
    assert summary.unfinished == ()


def test_a_variant_whose_outputs_are_wrong_when_poisoned_is_rejected_at_its_admission(tmp_path, one_fake_gpu):
    """Its admission run has its outputs poisoned: a launch that leaves its output to an earlier one
    fails there, with no check job of its own, and the variant never joins the search."""
    cheat = variant_hash("reuse")
    model = Model(compile_s=0.01, run_s=0.02, check_s=0.2, speed=((cheat, 0.2),), poisoned=(cheat,))
    run_dir, summary = sweep(tmp_path, Commented(("reuse",)), model)
    rows = read_results(run_dir.path)
    assert set(rows.loc[rows["source_hash"] == cheat, "phase"]) == {"verify"}
    variants = latest_outcomes(read_table(run_dir.path, RunDir.VARIANTS, VARIANT_SCHEMA))
    assert list(variants["stage"]) == ["rejected"] and "poisoned_outputs" in variants["reason"].iloc[0]
    jobs = read_table(run_dir.path, RunDir.JOBS, JOBS_SCHEMA)
    assert not jobs["kind"].isin(["sanitize"]).any()
    [best] = select_best(rows)
    assert best.source_hash != cheat and summary.unfinished == ()


def test_a_variant_whose_final_fails_its_clock_fails_its_checks_and_never_wins(tmp_path, one_fake_gpu):
    """The cheat checks that need runs are the finals' runs: a variant that passes its admission and
    compute-sanitizer, measures 5x in the search and fails its final (its clock) has failed its
    checks: its record says so (verdict ``finals``), it leaves the search, and neither the selection
    nor the best so far is one of its candidates."""
    liar = variant_hash("liar")
    model = Model(compile_s=0.01, run_s=0.02, check_s=0.2, speed=((liar, 0.2),), lying=(liar,))
    run_dir, summary = sweep(tmp_path, Commented(("liar",)), model)
    rows = read_results(run_dir.path)
    search = rows[(rows["phase"] == "search") & (rows["source_hash"] == liar)]
    assert len(search) >= 1 and set(search["status"]) == {"ok"}
    finals = rows[(rows["phase"] == "final") & (rows["source_hash"] == liar)]
    assert len(finals) >= 1 and set(finals["status"]) == {"clock_mismatch"}
    variants = latest_outcomes(read_table(run_dir.path, RunDir.VARIANTS, VARIANT_SCHEMA))
    assert list(variants["checks"]) == ["failed"] and list(variants["stage"]) == ["rejected"]
    assert '"finals"' in variants["verdicts"].iloc[0] and "clock_mismatch" in variants["reason"].iloc[0]
    [best] = select_best(rows)
    assert best.source_hash != liar and summary.unfinished == ()
    interim = best_so_far(rows, load_verified(run_dir.path))
    assert interim is None or interim.source_hash != liar


def test_a_faster_variant_that_fails_the_sanitizer_leaves_the_search_and_never_wins(tmp_path, one_fake_gpu):
    """Its sanitizer finds errors the baseline's run (made then, to compare) does not: it fails its
    expensive checks, leaves the search, and the winner is another candidate."""
    dirty = variant_hash("racy")
    model = Model(compile_s=0.01, run_s=0.02, check_s=0.5, speed=((dirty, 0.2),), dirty=(dirty,))
    run_dir, _ = sweep(tmp_path, Commented(("racy",)), model)
    rows = read_results(run_dir.path)
    jobs = read_table(run_dir.path, RunDir.JOBS, JOBS_SCHEMA)
    sanitized = jobs[jobs["kind"] == "sanitize"]
    assert len(sanitized) == 2 and "the baseline" in " ".join(sanitized["label"])  # the variant's, the baseline's
    variants = latest_outcomes(read_table(run_dir.path, RunDir.VARIANTS, VARIANT_SCHEMA))
    assert list(variants["checks"]) == ["failed"] and list(variants["stage"]) == ["rejected"]
    [best] = select_best(rows)
    assert best.source_hash != dirty
    assert not (rows[(rows["phase"] == "final")]["source_hash"] == dirty).any()


def test_a_time_budget_ends_the_sweep_in_time_with_re_measured_winners(tmp_path, one_fake_gpu):
    """No trial limit and slow checks: the budget alone ends the search, early enough for the finals
    and the checks that the finalists wait for. The budget counts from the sweep's start (here the
    test's, so that Ray's start counts as a user's would)."""
    fast = variant_hash("quick")
    model = Model(compile_s=0.01, run_s=BUDGETED_RUN_S, check_s=CHECK_S, speed=((fast, 0.5),))
    budget = 45.0  # at 30 s, under two spinning processes, the variant measured at 18 s and its checks did not fit
    started = time.monotonic()
    started_wall = time.time()
    run_dir, summary = sweep(tmp_path, Commented(("quick",)), model, trials=None, budget=budget,
                             started_at=started)
    rows = read_results(run_dir.path)
    search, finals = rows[rows["phase"] == "search"], rows[rows["phase"] == "final"]
    assert len(search) >= 3 and summary.unfinished == ()  # about 140 on an idle 2-core machine
    assert set(finals["status"]) == {"ok"} and len(set(finals["candidate_key"])) >= 2  # the baseline and a winner
    [best] = select_best(rows)
    assert best.source_hash == fast and best.reason != ""
    # The hard stop is the budget plus its grace: no row finishes after it (the loop has ended there).
    end = rows["finished_at"].max().timestamp()
    assert end <= started_wall + budget + grace_s(budget) + 1.0


def test_checks_that_would_take_minutes_are_bounded_and_the_search_keeps_most_of_the_budget(tmp_path, one_fake_gpu):
    """A fake GPU whose every expensive check would take five minutes, a budget of 40 s: each check
    job ends within the time plan's bound (5% of the budget, less near its end), so no check holds
    the GPU and the search goes on past half the budget, and the sweep ends by its grace with a
    re-measured winner. compute-sanitizer ran out of its budget on the baseline too: it cannot judge
    this target, the variant's record says so, and the cheat checks were its finals' runs."""
    from cluster.engine.plan.budget import CHECK_BOUND_SHARE

    fast = variant_hash("unchecked")
    model = Model(compile_s=0.01, run_s=BUDGETED_RUN_S, check_s=300.0, speed=((fast, 0.25),))
    budget = 40.0
    started, started_wall = time.monotonic(), time.time()
    run_dir, summary = sweep(tmp_path, Commented(("unchecked",)), model, trials=None, budget=budget,
                             started_at=started)
    rows = read_results(run_dir.path)
    jobs = read_table(run_dir.path, RunDir.JOBS, JOBS_SCHEMA)
    checks = jobs[jobs["kind"].isin(["sanitize", "review", "profile"])]
    assert len(checks) >= 1
    assert checks["service_s"].max() <= CHECK_BOUND_SHARE * budget + 1.0
    search = rows[rows["phase"] == "search"]
    assert search["started_at"].max().timestamp() - started_wall > budget / 2
    [best] = select_best(rows)
    assert best.remeasured and best.reason != ""
    assert rows["finished_at"].max().timestamp() <= started_wall + budget + grace_s(budget) + 1.0
    assert summary.unfinished == ()
    variants = latest_outcomes(read_table(run_dir.path, RunDir.VARIANTS, VARIANT_SCHEMA))
    checked = variants[variants["checks"] != ""]
    assert len(checked) == 1 and "sanitizer_timeout" in checked["verdicts"].iloc[0]
