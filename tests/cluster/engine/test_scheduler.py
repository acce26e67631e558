"""The scheduler: jobs in a prioritised queue per device type, studies that move on by themselves.
The sweep tests run on the CPU (Ray, gcc, C targets); the look-ahead and the order are checked
without Ray."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agents._base import AnalysisContext, Proposal
from agents.patch import source_files
from agents.workflow import Analyst, Finding, Level, Plan, Planner, Steps, Transformer
from cluster.config import load_run
from cluster.core.types import DeviceInfo, Measurement, Status
from cluster.engine.driver import Sweep
from cluster.engine.jobs import PRIORITY, JobKind
from cluster.engine.scheduler import Scheduler
from cluster.store.results import read_results
from cluster.store.rundir import RunDir

PROGRAM = textwrap.dedent(r"""
    #include <stdio.h>
    #include <unistd.h>
    #ifndef N
    #define N 1
    #endif
    int main(void) {
        /* SLOW */
        FILE* f = fopen("out.bin", "wb");
        float v[2] = {1.0f, 2.0f};
        fwrite(v, sizeof v, 1, f);
        fclose(f);
        for (int i = 0; i < 3; i++) printf("@warpfleet time_ms=%d.5\n", i + N);
        return 0;
    }
""")


class SlowVariant(Analyst, Planner, Transformer):
    """Proposes, for the study of ``slow`` only, a variant that waits outside its timed work until
    ``go`` exists (at most 30 s a run): its verification (a build and two runs) lasts until the test
    says so, as a slow sanitizer or test would. (It slept 3 s: on a loaded machine the other study's
    search was not done by then, its compiles waiting for Ray to start worker processes.)"""

    name = "slow_variant"
    takes_feedback = False

    def __init__(self, go: Path) -> None:
        self.go = go

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        return [Finding("slow", Level.KERNEL, "prog.c:main", context.target.name == "slow", ("scripted",))]

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan:
        return Plan(finding, ("sleep",))

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        wait = f'for (int i = 0; i < 300 && access("{self.go}", F_OK) != 0; i++) usleep(100000);'
        text = source_files(context.target)["prog.c"].replace("/* SLOW */", wait)
        return [Proposal(self.name, "sleep", (("prog.c", text),))]


@pytest.fixture
def four_cpus():
    """Two CPU workers and CPUs to compile: a Ray instance of its own (the shared one has 2 CPUs)."""
    import ray

    ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture
def go() -> Iterator[Path]:
    """Where the slow variant looks for its signal: outside /tmp, which the sandbox makes its own
    (unseen there, each of its runs waits its 30 s: slower, the same outcome)."""
    folder = Path(tempfile.mkdtemp(prefix="wf-slow-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    folder.chmod(0o755)  # the sandbox runs the command as another user
    yield folder / "go"
    shutil.rmtree(folder, ignore_errors=True)


def _signal_when_searched(run: Path, target: str, trials: int, go: Path, stop: threading.Event) -> None:
    """Create ``go`` once ``target``'s search rows are all written."""
    while not stop.is_set():
        rows = read_results(run)
        if len(rows) and ((rows["target"] == target) & (rows["phase"] == "search")).sum() >= trials:
            go.touch()
            return
        stop.wait(0.1)


def test_a_slow_agent_stage_in_one_study_does_not_hold_another_studys_search(tmp_path, four_cpus, go):
    for name in ("slow", "fast"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "prog.c").write_text(PROGRAM)
        (folder / "target.yaml").write_text(yaml.safe_dump({
            "name": name, "toolchain": "cc", "sources": ["prog.c"], "run": ["{binary}"],
            "verify": {"outputs": ["out.bin"]}, "params": {"N": [1, 2, 3, 4]}}))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "name": "two", "targets": ["slow/target.yaml", "fast/target.yaml"], "output_dir": str(tmp_path / "runs"),
        # One job at a time on each worker: with two, a fast candidate could be queued behind the slow
        # variant's verification on its worker, which is not what this test is about.
        "search": {"sampler": "random", "trials": 3}, "cluster": {"cpu_workers": 2, "inflight_per_worker": 1},
        "measure": {"final_top_k": 1, "final_runs": 1}, "profile": {"candidates": "none"},
        "agents": {"enabled": True, "guardrails": False}, "flush_interval_s": 0.1}))
    plan = load_run(config)
    run_dir = RunDir.create(plan)
    stop = threading.Event()
    signal = threading.Thread(target=_signal_when_searched, args=(run_dir.path, "fast", 3, go, stop))
    signal.start()
    try:
        Sweep(plan, run_dir, log=lambda m: None, agent_steps=lambda: [Steps.of(SlowVariant(go))]).run(
            show_progress=False)
    finally:
        stop.set()
        signal.join()
    rows = read_results(run_dir.path)
    slow_verified = rows[(rows["target"] == "slow") & (rows["phase"] == "verify")]
    fast_search = rows[(rows["target"] == "fast") & (rows["phase"] == "search")]
    assert len(slow_verified) == 1 and slow_verified["status"].iloc[0] == "ok"
    assert len(fast_search) == 3
    # Every search candidate of the fast study was measured while the slow study's variant was still
    # being verified: the studies share the workers, not the stages. (Were the fast search held until
    # the slow stage ends, the variant's runs would wait their 30 s for nothing, and this fails.)
    assert fast_search["finished_at"].max() < slow_verified["finished_at"].iloc[0]
    assert (rows.groupby("study")["phase"].apply(lambda p: (p == "search").sum()) == 3).all()


def device(name: str) -> DeviceInfo:
    return DeviceInfo("gpu", name, "sm_90")


def test_the_lookahead_covers_what_the_workers_finish_during_one_compile():
    scheduler = Scheduler([object()] * 4, [device("A")] * 4, per_worker=2, cpu_slots=64)
    a = device("A").device_type
    assert scheduler.lookahead(a) == 8 + 4  # before any figures: the slots and one per worker
    scheduler.compile_s[a], scheduler.run_s[a] = 2.0, 0.5  # 4 workers finish 16 candidates per compile
    assert scheduler.lookahead(a) == 8 + 21  # 16, a quarter to spare (LOOKAHEAD_SPARE), and one
    scheduler.compile_s[a], scheduler.run_s[a] = 0.1, 2.0  # compiles are cheap: one ahead per worker
    assert scheduler.lookahead(a) == 8 + 4
    small = Scheduler([object()] * 4, [device("A")] * 4, per_worker=2, cpu_slots=3)
    small.compile_s[a], small.run_s[a] = 2.0, 0.5
    assert small.lookahead(a) == 8 + 3  # no more compiles ahead than there are CPUs to run them
    assert scheduler.lookahead(device("B").device_type) == 0  # no worker of that type


def test_the_lookahead_learns_the_actors_own_time_and_the_compiles_time_in_the_pipeline():
    """A job waits on its actor behind the one before it: the time from dispatch to result is not
    the actor's time on it. And a compile takes longer in the pipeline than in the compiler."""
    import types

    scheduler = Scheduler([object()], [device("A")], per_worker=2, cpu_slots=64)
    a = device("A").device_type
    job = types.SimpleNamespace(device_type=a, submitted_at=100.0, compiled_at=100.1,
                                artifacts=[types.SimpleNamespace(compile_s=0.076)])
    measured = Measurement("k", Status.OK, device("A"), (1.0,), started_at=200.0, finished_at=200.013)
    scheduler._learn(job, measured, worker_s=0.030)  # 17 ms of it behind another job
    assert scheduler.run_s[a] == pytest.approx(0.013) and scheduler.compile_s[a] == pytest.approx(0.1)
    assert scheduler.lookahead(a) == 2 + 11  # ceil(1.25 x 0.1 / 0.013) + 1: one 13 ms actor, 100 ms compiles
    scheduler._learn(job, None, worker_s=0.030)  # no actor times (a failure): dispatch to result
    assert scheduler.run_s[a] == pytest.approx(0.8 * 0.013 + 0.2 * 0.030)


def test_baselines_go_first_then_every_studys_work_in_turn_and_the_winners_profiles_last():
    """A study's search is not queued behind another study's verification: after the baselines, the
    agents' checks, searches, finals and reviews go in the order they came (submission order)."""
    assert PRIORITY[JobKind.BASELINE] < PRIORITY[JobKind.SEARCH] < PRIORITY[JobKind.PROFILE]
    in_turn = (JobKind.VERIFY, JobKind.SANITIZE, JobKind.GUARD, JobKind.SEARCH, JobKind.FINAL, JobKind.REVIEW,
               JobKind.EVALUATE)
    assert {PRIORITY[kind] for kind in in_turn} == {PRIORITY[JobKind.SEARCH]}
