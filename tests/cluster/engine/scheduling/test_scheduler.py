"""The scheduler: jobs in a prioritised queue per device type, studies that move on by themselves.
The sweep tests run on the CPU (Ray, gcc, C targets); the look-ahead and the order are checked
without Ray."""

from __future__ import annotations

import heapq
import os
import shutil
import tempfile
import textwrap
import threading
import time
import types
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
from cluster.engine.scheduling.jobs import LANE, PRIORITY, URGENT, WEIGHT, Build, Job, JobKind, JobResult, Lane
from cluster.engine.scheduling.scheduler import FIRST_SEARCH_HOLD_S, Scheduler, raised
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
        Sweep(plan, run_dir, agent_steps=lambda: [Steps.of(SlowVariant(go))]).run(
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
    search = rows[rows["phase"] == "search"]
    own = search[search["source_hash"].isin(set(rows.loc[rows["phase"] == "baseline", "source_hash"]))]
    assert (own.groupby("study").size() == 3).all()  # the own sources' trials; a variant's are its stream's
    assert len(search) - len(own) <= 3


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
    job = types.SimpleNamespace(device_type=a, study="s", submitted_at=100.0, compiled_at=100.1,
                                artifacts=[types.SimpleNamespace(compile_s=0.076)])
    measured = Measurement("k", Status.OK, device("A"), (1.0,), started_at=200.0, finished_at=200.013)
    scheduler._learn(job, measured, worker_s=0.030)  # 17 ms of it behind another job
    assert scheduler.run_s[a] == pytest.approx(0.013) and scheduler.compile_s[a] == pytest.approx(0.1)
    assert scheduler.lookahead(a) == 2 + 11  # ceil(1.25 x 0.1 / 0.013) + 1: one 13 ms actor, 100 ms compiles
    scheduler._learn(job, None, worker_s=0.030)  # no actor times (a failure): dispatch to result
    assert scheduler.run_s[a] == pytest.approx(0.8 * 0.013 + 0.2 * 0.030)
    assert scheduler.search_cost("s", a) == scheduler.run_s[a] and scheduler.search_cost("new", a) == scheduler.run_s[a]


class FakeActor:
    """An actor handle whose every method's ``remote`` returns a fresh reference (nothing runs)."""

    def __getattr__(self, name: str):
        return types.SimpleNamespace(remote=lambda *args, **kwargs: object())


def ready_job(scheduler: Scheduler, kind: JobKind, study: str = "s", workers=(0,), priority=None,
              value: float = 0.0) -> Job:
    from cluster.core.types import BuildArtifact, Candidate

    candidate = Candidate("t", "nvcc", device("A").device_type, "sm_90", f"{kind}{len(scheduler.running)}", (), ())
    job = Job(kind, study, list(workers), device("A"), (Build(None, None, candidate),), priority=priority,
              value=value)
    job.artifacts, job.binary_refs = [BuildArtifact(candidate.key, Status.OK)], [None]
    scheduler._push(job)
    return job


def test_the_lanes_baselines_and_finals_first_then_checks_within_their_share():
    """Baselines and finals before anything else; the search, the agents' admission runs and the long
    checks in lanes of their own: while other work waits, at most the checks' share of the workers
    runs checks."""
    assert {LANE[k] for k in (JobKind.BASELINE, JobKind.FINAL)} == {Lane.CRITICAL}
    assert PRIORITY[JobKind.BASELINE] < PRIORITY[JobKind.FINAL]
    assert {LANE[k] for k in (JobKind.SANITIZE, JobKind.REVIEW, JobKind.PROFILE)} == {Lane.CHECK}
    assert LANE[JobKind.SEARCH] is Lane.SEARCH and LANE[JobKind.VERIFY] is Lane.ADMIT
    scheduler = Scheduler([FakeActor(), FakeActor()], [device("A")] * 2, per_worker=1, cpu_slots=4)
    for _ in range(3):
        ready_job(scheduler, JobKind.SANITIZE, workers=(0, 1))
        ready_job(scheduler, JobKind.SEARCH, workers=(0, 1))
    scheduler._dispatch()
    running = list(scheduler.running.values())
    assert len(running) == 2 and {j.kind for j in running} == {JobKind.SANITIZE, JobKind.SEARCH}


def test_a_lane_behind_in_virtual_time_goes_next_and_idleness_earns_no_credit():
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    scheduler.vtime[(a, Lane.CHECK)] = 20.0  # a 6 s check ran (its weight 0.3)
    ready_job(scheduler, JobKind.SANITIZE)
    search = ready_job(scheduler, JobKind.SEARCH)
    admission = ready_job(scheduler, JobKind.VERIFY)
    scheduler.vtime[(a, Lane.ADMIT)] = 30.0
    assert scheduler._next(a) is search
    scheduler.vtime[(a, Lane.SEARCH)] = 25.0
    assert scheduler._next(a).kind is JobKind.SANITIZE
    scheduler.vtime[(a, Lane.CHECK)] = 40.0
    assert scheduler._next(a) is search
    scheduler.vtime[(a, Lane.SEARCH)] = 35.0
    assert scheduler._next(a) is admission
    baseline = ready_job(scheduler, JobKind.BASELINE)
    assert scheduler._next(a) is baseline  # the critical lane first, whatever the shares
    # A lane that had nothing to do comes back at the others' virtual time, not with its credit.
    idle = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    idle.vtime[(a, Lane.SEARCH)] = 500.0
    ready_job(idle, JobKind.SEARCH)
    ready_job(idle, JobKind.SANITIZE)
    assert idle.vtime[(a, Lane.CHECK)] == 500.0


def test_a_check_whose_turn_it_is_has_a_worker_drain_for_it():
    """Seen on a fake GPU (one worker, two jobs an actor, a 40 s budget): the search kept the worker
    busy, a check only goes to a worker with nothing on it, and a variant's cheat checks queued from
    1 s in waited until the search closed, 16 s later, then held the worker the finals needed. When
    the check lane's turn comes, no more search is put on the worker: it drains, and the check goes."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=2, cpu_slots=4)
    running = ready_job(scheduler, JobKind.SEARCH)
    heapq.heappop(scheduler.ready[(a, Lane.SEARCH)])
    running.worker, running.dispatched_at = 0, time.time()
    scheduler.load[0], scheduler.on_worker[0] = 1, [running]
    search = ready_job(scheduler, JobKind.SEARCH)
    check = ready_job(scheduler, JobKind.SANITIZE)
    scheduler.vtime[(a, Lane.CHECK)] = 100.0  # behind on its share: the search goes on the busy worker
    assert scheduler._next(a) is search
    scheduler.vtime[(a, Lane.SEARCH)] = 200.0  # the check lane's turn: nothing more on the worker
    assert scheduler._next(a) is None
    scheduler.load[0], scheduler.on_worker[0] = 0, []
    assert scheduler._next(a) is check
    # A check its study's finals wait for drains the worker whatever the shares.
    scheduler.vtime[(a, Lane.SEARCH)] = 0.0
    scheduler.load[0], scheduler.on_worker[0] = 1, [running]
    assert scheduler._next(a) is search
    scheduler.promote("s", frozenset({JobKind.SANITIZE}))
    assert scheduler._next(a) is None


def test_within_a_lane_the_studies_take_turns():
    """A study with many admissions in the queue does not hold another's first one behind them."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    many = [ready_job(scheduler, JobKind.VERIFY, study="many") for _ in range(5)]
    other = ready_job(scheduler, JobKind.VERIFY, study="other")
    assert scheduler._next(a) is many[0]
    heapq.heappop(scheduler.ready[(a, Lane.ADMIT)])
    assert scheduler._next(a) is other


def test_the_search_lane_serves_the_study_that_has_used_least_of_the_shared_lanes_time():
    """Seen on an H200 (300 s, eight public programs, agents on against off): a program the agents
    had nothing for searched 8 candidates, 15 with them off, while the others' admissions and checks
    took its turns. In the search lane a study's turn goes by the time its jobs took in the shared
    lanes (search, admissions, checks; finished and running), not by its count of search jobs."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor(), FakeActor()], [device("A")] * 2, per_worker=1, cpu_slots=4)
    checked = [ready_job(scheduler, JobKind.SEARCH, study="checked") for _ in range(2)]
    plain = [ready_job(scheduler, JobKind.SEARCH, study="plain") for _ in range(2)]
    assert scheduler._next(a) is checked[0]  # nothing used yet: queued first, first
    sanitize = ready_job(scheduler, JobKind.SANITIZE, study="checked", workers=(1,))
    scheduler._take(a, sanitize)
    sanitize.worker, sanitize.dispatched_at = 1, time.time() - 30.0
    scheduler.on_worker[1] = [sanitize]  # a check of 30 s so far, running: counted
    assert scheduler.used()["checked"] >= 30.0 and scheduler.used()["plain"] == 0.0
    assert scheduler._next(a) is plain[0]
    scheduler._take(a, plain[0])
    assert scheduler._next(a) is plain[1] and [e[1] for e in scheduler.ready[(a, Lane.SEARCH)]].count(plain[1]) == 1
    scheduler._take(a, plain[1])
    assert scheduler._next(a) is checked[0]
    scheduler.on_worker[1] = []
    scheduler.spent["plain"] = 40.0  # finished jobs count as well
    late = ready_job(scheduler, JobKind.SEARCH, study="plain")
    assert scheduler._next(a) is checked[0] and late is not checked[0]
    # A study whose search count is under half the median study's goes first, whatever its time.
    for _ in range(6):
        ready_job(scheduler, JobKind.SEARCH, study="third")
    scheduler.spent["plain"] = 100.0
    assert scheduler.turns[(a, Lane.SEARCH, "plain")] == 3 and scheduler.turns[(a, Lane.SEARCH, "checked")] == 2
    assert scheduler._next(a) is checked[0]  # 2 of a median 3: not starved; least time
    scheduler.turns[(a, Lane.SEARCH, "third")] = 20  # median 3 of (2, 3, 20)... raise the others
    scheduler.turns[(a, Lane.SEARCH, "plain")] = 20
    assert scheduler._next(a) is checked[0]  # 2 < half of 20: starved, and least time anyway
    scheduler.spent["checked"] = 1000.0
    assert scheduler._next(a) is checked[0]  # its checks' time, however large, does not end it (softmax_rows)
    scheduler.search_spent.update(checked=100.0, plain=100.0)
    assert scheduler._next(a) is checked[0]  # starved goes first having searched as long as any (the others' mean 50)
    scheduler.search_spent["checked"] = 101.0
    assert scheduler._next(a).study == "third"  # its search more than twice the others' mean: time decides again
    scheduler.spent["checked"] = scheduler.search_spent["checked"] = 0.0
    scheduler.turns[(a, Lane.SEARCH, "checked")] = 10
    assert scheduler._next(a).study == "checked"  # no longer starved, and least time (tied with third)
    scheduler.spent["checked"] = 1.0
    assert scheduler._next(a).study == "third"
    # Priority and value still come first: an urgent search job of the study that used most goes.
    urgent = ready_job(scheduler, JobKind.SEARCH, study="plain", priority=URGENT)
    assert scheduler._next(a) is urgent


def test_an_urgent_check_goes_first_and_promote_makes_a_studys_checks_urgent():
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    ready_job(scheduler, JobKind.SEARCH, study="other")
    guard = ready_job(scheduler, JobKind.REVIEW, study="finalist")
    scheduler.vtime[(a, Lane.CHECK)] = 100.0  # far behind on share: it would wait
    assert scheduler._next(a).kind is JobKind.SEARCH
    scheduler.promote("finalist", frozenset({JobKind.REVIEW}))
    assert scheduler._next(a) is guard and guard.priority == URGENT


def test_the_check_lane_takes_the_most_valuable_check_first():
    """Seen on an H100 (2026-11-27, eight unseen programs, a 300 s budget): the checks queued in
    turn, a 1.01x variant's 72 s compute-sanitizer run went first, and a 1.91x variant's checks and
    a 3.92x variant's final missed the deadline. A check's value is what its candidate may gain;
    an urgent check still goes before any other, and among the urgent the most valuable."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    small = ready_job(scheduler, JobKind.SANITIZE, study="small", value=1.01)
    ready_job(scheduler, JobKind.SANITIZE, study="small", value=1.01)
    large = ready_job(scheduler, JobKind.REVIEW, study="large", value=1.91)
    assert scheduler._next(a) is large  # not the first queued, nor the turns' order
    scheduler.promote("small")
    assert scheduler._next(a) is small
    scheduler.promote("large")
    assert scheduler._next(a) is large
    search = ready_job(scheduler, JobKind.SEARCH, value=0.0)
    assert search.rank[:2] == (PRIORITY[JobKind.SEARCH], 0.0)  # other jobs: their order as before


def test_drop_takes_queued_search_jobs_back_and_close_answers_every_waiting_future():
    from concurrent.futures import Future

    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    queued = [ready_job(scheduler, JobKind.SEARCH, study="s") for _ in range(3)]
    kept = ready_job(scheduler, JobKind.SEARCH, study="other")
    assert scheduler.drop("s", frozenset({JobKind.SEARCH})) == 3
    dropped = scheduler.finished
    assert {id(r.job) for r in dropped} == {id(j) for j in queued} and all(r.dropped for r in dropped)
    assert scheduler._next(device("A").device_type) is kept
    waiting = ready_job(scheduler, JobKind.VERIFY)
    waiting.future = Future()
    scheduler.close()
    assert waiting.future.result().failure is Status.WORKER_LOST
    late = scheduler.submit_threadsafe(Job(JobKind.VERIFY, "s", [0], device("A"), waiting.builds))
    assert late.done() and "ended" in late.result().error


def test_the_checks_wait_for_each_studys_first_search_candidate():
    """Seen on an H100 (2026-11-27, the public suite on one GPU): Nsight Compute on one study's
    baseline (62 s) took the only worker while every study's first search candidate was compiling,
    and each came 72 to 101 s after its baseline. The check lane now waits while a study has a first
    search job submitted and not done (compiling or queued), for FIRST_SEARCH_HOLD_S at the most."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    profile = ready_job(scheduler, JobKind.PROFILE, study="x")
    scheduler.first_search["y"] = (a, time.time())  # as submit() records it: y's first search compiles
    assert scheduler._next(a) is None  # the worker waits for it rather than start a long check
    search = ready_job(scheduler, JobKind.SEARCH, study="y")
    assert scheduler._next(a) is search
    heapq.heappop(scheduler.ready[(a, Lane.SEARCH)])
    scheduler.counts[(a, JobKind.SEARCH)] += 1
    scheduler._finish(JobResult(search, search.artifacts[0]))
    assert scheduler._next(a) is profile and "y" in scheduler.searched
    scheduler.first_search["z"] = (a, time.time() - FIRST_SEARCH_HOLD_S - 1)  # compiling for too long
    assert scheduler._next(a) is profile
    scheduler.first_search["z"] = (a, time.time())
    assert scheduler._next(a) is None
    scheduler.first_search["z"] = ("another GPU", time.time())  # another device type's study holds nothing here
    assert scheduler._next(a) is profile


def test_no_check_starts_while_a_baseline_or_final_waits_for_a_worker():
    """Seen on an H100 (2026-11-27, the public suite on one GPU, 600 s): a 117 s compute-sanitizer run
    (urgent: a finalist's) started while two studies' finals were compiling; they ran after it, and
    the budget ended with seven studies before their finals. A check, urgent or not, now waits while
    a critical job of its type is submitted and not on a worker; one already running holds nothing."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor(), FakeActor()], [device("A")] * 2, per_worker=1, cpu_slots=4)
    scheduler.searched.add("s")
    check = ready_job(scheduler, JobKind.SANITIZE, workers=(0, 1))
    scheduler.promote("s", frozenset({JobKind.SANITIZE}))
    assert check.priority == URGENT and scheduler._next(a) is check
    scheduler.counts[(a, JobKind.FINAL)] += 1  # a final submitted: compiling
    assert scheduler._next(a) is None
    final = ready_job(scheduler, JobKind.FINAL, workers=(0, 1))
    assert scheduler._next(a) is final  # built: it goes first
    scheduler._dispatch()  # the final on one worker, then the check on the other
    assert sorted(j.kind for j in scheduler.running.values()) == [JobKind.FINAL, JobKind.SANITIZE]


def test_a_check_goes_to_an_idle_worker_and_nothing_queues_behind_one():
    """With two jobs an actor, a check queued behind a search job (or a final behind a 72 s compute-
    sanitizer run) waited while the other GPU was free: a check now goes only to a worker with
    nothing on it, and a worker running a check takes nothing more until it is done."""
    scheduler = Scheduler([FakeActor(), FakeActor()], [device("A")] * 2, per_worker=2, cpu_slots=4)
    scheduler.searched.add("s")
    search = ready_job(scheduler, JobKind.SEARCH, workers=(0, 1))
    scheduler._dispatch()
    assert search.worker is not None
    check = ready_job(scheduler, JobKind.SANITIZE, workers=(0, 1))
    scheduler._dispatch()
    assert check.worker is not None and check.worker != search.worker  # the idle GPU, not behind the search
    late = [ready_job(scheduler, JobKind.SEARCH, workers=(0, 1)) for _ in range(2)]
    scheduler._dispatch()
    assert [j.worker for j in late] == [search.worker, None]  # behind the search job, never behind the check
    other = ready_job(scheduler, JobKind.REVIEW, workers=(0, 1))
    scheduler._dispatch()
    assert other.worker is None  # no idle worker: it waits in its queue


def test_while_the_search_waits_the_admissions_take_at_most_their_share():
    """With search candidates and the agents' admission runs always queued, runs of one second each,
    the worker serves them 5 to 2 (``WEIGHT``): the admissions are the variants' first measurements,
    beside the variants' own share of the search, not an equal of the search (on an H200, eight
    public programs of 3-4 s a run spent a quarter of a 300 s sweep in admission runs and a third in
    their search)."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    served = {Lane.SEARCH: 0, Lane.ADMIT: 0}
    for _ in range(70):
        for kind in (JobKind.SEARCH, JobKind.VERIFY):  # never empty: a lane that idled would restart
            while len(scheduler.ready.get((a, LANE[kind]), ())) < 2:
                ready_job(scheduler, kind)
        job = scheduler._next(a)
        heapq.heappop(scheduler.ready[(a, job.lane)])
        scheduler.vtime[(a, job.lane)] += 1.0 / WEIGHT[job.lane]
        served[job.lane] += 1
    assert served == {Lane.SEARCH: 50, Lane.ADMIT: 20}


def test_a_job_that_raised_in_its_worker_says_what_it_raised_and_where() -> None:
    # A review that raised in the worker read "lost: ray::MeasureWorker.reverify() (pid=...", cut
    # before the exception: the candidate's row said nothing of why its 11.75x was failed.
    from ray.exceptions import RayActorError, RayTaskError

    trace = ('Traceback (most recent call last):\n  File "/w/cluster/measure/guardrails.py", line 150, in _differs\n'
             "    return verify_outputs(workdir)\nValueError: cannot reshape array of size 3 into shape (2,)")
    error = RayTaskError("reverify", trace, ValueError("cannot reshape array of size 3 into shape (2,)"))
    assert raised(error) == ('raised ValueError: cannot reshape array of size 3 into shape (2,) '
                             '(File "/w/cluster/measure/guardrails.py", line 150, in _differs)')
    assert raised(RayActorError()).startswith("lost: ")


def test_a_studys_first_search_candidate_goes_first_whatever_its_agents_used():
    """Seen on an H200 (configs/suite, agents on, 240 s): a program of 3.5 s runs measured its first
    search candidate 55 s after its baseline, its share of the time taken by its variant's admission
    run and the analysts' profile while the others searched."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor(), FakeActor()], [device("A")] * 2, per_worker=1, cpu_slots=4)
    others = [ready_job(scheduler, JobKind.SEARCH, study="other") for _ in range(3)]
    scheduler.searched.add("other")
    scheduler.spent["slow"] = 60.0  # its admission runs and the profile
    first = ready_job(scheduler, JobKind.SEARCH, study="slow")
    scheduler.first_search["slow"] = (a, time.time())  # what submit records of a study's first search job
    second = ready_job(scheduler, JobKind.SEARCH, study="slow")
    assert scheduler._next(a) is first
    scheduler._take(a, first)
    first.worker, first.dispatched_at = 0, time.time()
    scheduler.on_worker[0] = [first]  # its first running: its look-ahead waits its turn
    assert scheduler._next(a) is others[0]
    scheduler.on_worker[0] = []
    scheduler._take(a, second)
    scheduler.first_search.pop("slow")  # measured: time decides again
    scheduler.searched.add("slow")
    ready_job(scheduler, JobKind.SEARCH, study="slow")
    assert scheduler._next(a) is others[0]


def test_the_admission_lane_takes_turns_by_study_and_a_studys_turn_by_its_variants_level():
    """On an H200 (configs/suite, 240 s) multikernel's two `#pragma unroll` admissions ran while its
    streams waited until the search closed. The studies still take turns; a study's turn goes to its
    variant of the highest level (its job's value)."""
    a = device("A").device_type
    scheduler = Scheduler([FakeActor()], [device("A")], per_worker=1, cpu_slots=4)
    hint = ready_job(scheduler, JobKind.VERIFY, study="multi", value=1.0)
    other = ready_job(scheduler, JobKind.VERIFY, study="other", value=1.0)
    kernel = ready_job(scheduler, JobKind.VERIFY, study="multi", value=2.0)
    streams = ready_job(scheduler, JobKind.VERIFY, study="multi", value=3.0)
    order = []
    for _ in range(4):
        job = scheduler._next(a)
        scheduler._take(a, job)
        order.append(job)
    assert order == [streams, other, kernel, hint]  # by value alone, other's hint would wait for all three
