"""The sweep driver: studies (target x device type) that each move on by themselves, one job
queue per device type, and the rows they write.

    RunPlan ─► StudyState + StudyFlow per study ─► jobs ─► Scheduler (compile ─► queue ─► worker)
        ─► JobResult ─► the study's flow ─► ResultRow ─► ResultWriter
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ray

from agents.workflow import Steps
from cluster.config import RunPlan, Target, env
from cluster.core.types import BuildArtifact, DeviceInfo, Measurement
from cluster.engine.agent_stage import AgentStage
from cluster.engine.flow import REVIEW_SCHEMA, Flow, Stage, StudyFlow
from cluster.engine.plan.budget import TimePlan
from cluster.engine.progress import SweepProgress
from cluster.engine.scheduling.jobs import Job, JobKind, JobResult, Lane
from cluster.engine.scheduling.scheduler import Scheduler, starved
from cluster.engine.scheduling.workers import KeptFleet, start_fleet, stop_fleet
from cluster.engine.study.context import SweepContext
from cluster.engine.study.state import StudyState, open_storage
from cluster.measure.profile import PROFILE_SCHEMA
from cluster.sandbox.isolation import protect_ray_token, ray_env_vars, secrets_withheld  # sandbox
from cluster.store.journal import BatchedJournalStorage
from cluster.store.results import ResultWriter, read_results, read_table, results_schema
from cluster.store.rundir import RunDir
from cluster.store.tables import JOBS_SCHEMA, Tables
from cluster.toolchains import get_toolchain

log = logging.getLogger(f"warpfleet.{__name__}")

POLL_S = 0.2  # longest wait for a result when nothing else is due
POLL_THREADS_S = 0.02  # while agents' threads may submit jobs
ASK_RETRIES = 32  # sampler proposals of known or forbidden points tried per study and feed (a few ms each)


@dataclass(frozen=True)
class SweepSummary:
    run_dir: Path
    evaluated: int  # rows written by this invocation
    skipped: tuple[str, ...]  # why targets or studies were left out
    wall_s: float = 0.0
    bookkeeping_s: float = 0.0  # driver time spent asking, submitting and recording
    no_baseline: tuple[str, ...] = ()  # studies whose baseline failed: nothing was measured against it
    ready_s: float = 0.0  # wall time once Ray and the workers were up: what the workers' busy time is over
    unfinished: tuple[str, ...] = ()  # studies the time budget stopped before their finals were done (not a profile)


def init_ray(address: str | None) -> None:
    """Join the cluster at ``address``, else the one ``RAY_ADDRESS`` names (as Ray's own tools do:
    ``ray job submit`` sets it for its job), else start a local instance. Worker nodes get this
    project's packages through the runtime environment."""
    if ray.is_initialized():
        return
    import agents
    import cluster
    import search_spaces

    address = address or env.ray_address()
    if env.token_auth_wanted(address):
        # Ray 2.60 only sends a token to an explicit address when told to; with one at hand, do. It
        # reads the mode when it is imported, so its config is read again (as Ray itself does when
        # it turns the mode on for a local instance); the variable alone was never seen.
        from ray._raylet import Config

        os.environ[env.RAY_AUTH_MODE] = "token"
        Config.initialize("")
    runtime_env: dict = {"py_modules": [cluster, agents, search_spaces]} if address else {}
    runtime_env["env_vars"] = ray_env_vars()  # sandbox: the sandbox policy to every node; the driver's secrets blanked
    # No address: a local instance of our own ("local"), never a cluster that happens to run on this
    # node (a plain ray.init() may join one that another program started, or the next RAY_ADDRESS).
    with secrets_withheld():  # sandbox: a local Ray's processes start without the driver's secrets
        ray.init(address=address or "local", runtime_env=runtime_env, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    protect_ray_token()  # sandbox: Ray writes ~/.ray/auth_token readable by all


class Sweep:
    """A sweep: its studies, each moving through its stages on its own (cluster.engine.flow), all
    sharing one scheduler whose queues every worker of a device type serves."""

    def __init__(self, plan: RunPlan, run_dir: RunDir,
                 agent_steps: Callable[[], list[Steps]] | None = None, fleet: Callable[..., Any] = start_fleet,
                 compile: Callable[..., Any] | None = None, started_at: float | None = None) -> None:
        """``agent_steps``: who does the workflow's steps 1-3 (default: the config's experts);
        ``fleet`` and ``compile``: how workers start and builds are made (default: the real ones;
        cluster.engine.scheduling.simulate passes its fakes; a ``KeptFleet`` keeps its actors for the next
        sweep of this process, where the others are stopped when the sweep ends); ``started_at``:
        when the sweep's wall clock started (``time.monotonic``; default: now), what the time
        budget counts from (the command line's start: Ray's and the workers' start count too)."""
        self.plan, self.run_dir = plan, run_dir
        self.started_at = time.monotonic() if started_at is None else started_at
        self.agent_steps, self.fleet, self.compile = agent_steps, fleet, compile
        self.config = plan.config
        self.skipped: list[str] = []
        self.bookkeeping_s = 0.0
        self.schema_targets: list[Target] = list(plan.targets)  # plus agents' variants with params of their own
        self.writer: ResultWriter | None = None
        self.journal: BatchedJournalStorage | None = None  # the Optuna journal, written in batches

    def run(self, address: str | None = None, show_progress: bool = True) -> SweepSummary:
        start = time.monotonic()
        init_ray(address or self.config.cluster.address)
        states, workers, devices = self._start()
        try:
            return self._run(start, states, workers, devices, show_progress)
        finally:
            if not isinstance(self.fleet, KeptFleet):
                stop_fleet(workers)

    def _run(self, start: float, states: list[StudyState], workers: list[ray.actor.ActorHandle],
             devices: list[DeviceInfo], show_progress: bool) -> SweepSummary:
        flows_by_name: dict[str, StudyFlow] = {}

        def reuse(job: Job, artifact: BuildArtifact) -> Measurement | None:
            return flows_by_name[job.study].reuse(job, artifact)

        cluster = self.config.cluster
        scheduler = Scheduler(workers, devices, cluster.inflight_per_worker, self._compile_slots(),
                              cluster.max_attempts, reuse=reuse, compile=self.compile)
        ready_at = time.monotonic()
        tables = Tables(self.run_dir.path, self.config.flush_interval_s)
        budget = self.config.search.time_budget_s
        finals = (max(1, self.config.measure.final_top_k), self.config.measure.final_runs)
        plan = TimePlan(budget, self.started_at, finals) if budget else None
        agents = self._agent_stage(tables)
        if agents is not None and plan is not None:
            agents.bound = plan.check_bound
        restored = {s.name: agents.restore(s) for s in states} if agents else {}
        existing = read_results(self.run_dir.path)
        self._cover(v for s in states for v in s.variants.values())
        reviews = read_table(self.run_dir.path, RunDir.REVIEWS, REVIEW_SCHEMA)
        reviewed = {str(k): "failed" if s == "failed" else "passed"
                    for k, s in zip(reviews["candidate_key"], reviews["status"], strict=True)}
        profiled = frozenset(read_table(self.run_dir.path, RunDir.PROFILES, PROFILE_SCHEMA)["candidate_key"])
        with ResultWriter(self.run_dir.path, results_schema(self.schema_targets), self.config.flush_interval_s) \
                as writer, ThreadPoolExecutor(max(1, len(states)), thread_name_prefix="agents") as executor:
            self.writer = writer
            ctx = SweepContext(self.run_dir.run_id, self.run_dir.path, self.config, scheduler, writer,
                               self._widen, agents, executor, reviewed, profiled, plan, tables)
            flows = []
            for state in states:
                rows = existing[existing["study"] == state.name] if len(existing) else existing
                state.restore(rows)
                state.open_study()
                done, variants = restored.get(state.name, (False, []))
                flow = StudyFlow(state, ctx, done)
                flow.rows = rows.to_dict("records") if len(rows) else []
                flow.restore_variants(variants)
                flows.append(flow)
                flows_by_name[state.name] = flow
            try:
                with SweepProgress(flows, self.config.search.trials, scheduler, enabled=show_progress) as progress:
                    self._loop(flows, scheduler, writer, progress, plan, tables)
            finally:
                left = scheduler.close()  # a stopped loop: the agents' threads waiting on jobs go on
                for flow in flows:
                    flow.close()
                tables.close()
            if left:
                log.info(f"time budget: stopped with {len(left)} jobs on the workers: "
                         + ", ".join(sorted({job.describe() for job in left}))[:400])
        failed = tuple(f.name for f in flows if f.stage is Stage.FAILED)
        unfinished = tuple(f.name for f in flows if f.stage in (Stage.BASELINE, Stage.SEARCH, Stage.FINAL))
        self.skipped += [f"{f.name}: {f.reason}" for f in flows if f.stage is Stage.FAILED]
        end = time.monotonic()
        return SweepSummary(self.run_dir.path, writer.written, tuple(self.skipped), end - start,
                            self.bookkeeping_s, no_baseline=failed, ready_s=end - ready_at, unfinished=unfinished)

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self, flows: list[StudyFlow], scheduler: Scheduler, writer: ResultWriter,
              progress: SweepProgress, plan: TimePlan | None, tables: Tables) -> None:
        run_id = self.run_dir.run_id

        def record_job(result: JobResult) -> None:
            tables.append(RunDir.JOBS, JOBS_SCHEMA, job_record(run_id, result, scheduler))

        try:
            self.bookkeeping_s += run_flows(flows, scheduler, writer, progress, self.journal, plan=plan,
                                            on_job=record_job, tables=tables)
        finally:
            if self.journal is not None:
                self.journal.flush()

    # -- setup -------------------------------------------------------------------------------
    def _cover(self, targets: Iterable[Target]) -> bool:
        """Take in the targets whose params the results' schema lacks; True when it grew."""
        known = {name for t in self.schema_targets for name in t.spec.params}
        new = [t for t in targets if set(t.spec.params) - known]
        self.schema_targets += new
        return bool(new)

    def _widen(self, targets: list[Target]) -> None:
        if self._cover(targets) and self.writer is not None:
            self.writer.widen(results_schema(self.schema_targets))

    def _agent_stage(self, tables: Tables) -> AgentStage | None:
        if not self.config.agents.enabled:
            return None
        return AgentStage(self.run_dir.path, self.run_dir.run_id, self.config.agents, self.config.profile,
                          self.config.measure.runs,
                          (lambda verifier: self.agent_steps()) if self.agent_steps else None,
                          self.config.search.trials, append=tables.append)

    def _start(self) -> tuple[list[StudyState], list[ray.actor.ActorHandle], list[DeviceInfo]]:
        kinds = {get_toolchain(t.spec.toolchain).device_kind for t in self.plan.targets}
        workers, devices, left_out = self.fleet(self.config.cluster, kinds, self.plan.file)
        self.skipped += left_out
        groups: dict[str, list[int]] = defaultdict(list)
        for i, device in enumerate(devices):
            groups[device.device_type].append(i)
        storage = open_storage(self.config.search, self.run_dir.path, self.config.flush_interval_s)
        self.journal = storage if isinstance(storage, BatchedJournalStorage) else None
        generations = self.run_dir.generations()
        studies = []
        for target in self.plan.targets:
            toolchain = get_toolchain(target.spec.toolchain)
            target_ref = ray.put(target)
            matching = [(t, idx) for t, idx in groups.items() if devices[idx[0]].kind == toolchain.device_kind]
            if not matching:
                self.skipped.append(f"{target.name}: no {toolchain.device_kind.upper()} worker in the cluster")
                continue
            for _, indices in matching:
                device = devices[indices[0]]
                generation = generations.get(target.name, 1)
                studies.append(StudyState(target, target_ref, device, indices, None, toolchain.arch_for(device),
                                          self.config.search.objective, generation=generation,
                                          space_size=target.space_size(), search=self.config.search,
                                          storage=storage, run_id=self.run_dir.run_id))
        for reason in self.skipped:
            log.info(f"skipped {reason}")
        return studies, workers, devices

    def _compile_slots(self) -> int:
        return self.config.cluster.compile_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_flows(flows: Sequence[Flow], scheduler: Scheduler, writer: ResultWriter,
              progress: SweepProgress | None = None, journal: BatchedJournalStorage | None = None,
              plan: TimePlan | None = None, on_job: Callable[[JobResult], None] | None = None,
              tables: Tables | None = None) -> float:
    """The loop of a sweep or an evaluation: each flow submits what its stage needs, the search is
    fed, the scheduler advances, results go to their flows; until every flow is done, or the time
    plan's hard stop. Returns the driver's own time in it (bookkeeping)."""
    by_name = {f.name: f for f in flows}
    bookkeeping = 0.0
    while True:
        t0 = time.perf_counter()
        if plan is not None:
            plan.update(flows, lambda device_type: len(scheduler.workers_of(device_type)))
        for flow in flows:
            flow.step()
        feed_search(flows, scheduler)
        if all(f.done for f in flows) and scheduler.idle():
            return bookkeeping + time.perf_counter() - t0
        if plan is not None and plan.expired():
            left = [f"{f.name} ({f.stage.value})" for f in flows if not f.done]
            log.info(f"time budget: {plan.budget_s:.0f} s spent; stopped with {', '.join(left)} (a study "
                     f"stopped before its finals shows its best so far)")
            return bookkeeping + time.perf_counter() - t0
        threads = any(getattr(f, "agents_running", False) for f in flows)
        bookkeeping += time.perf_counter() - t0
        finished = scheduler.poll(POLL_THREADS_S if threads else POLL_S)
        t0 = time.perf_counter()
        for result in finished:
            by_name[result.job.study].on_result(result)
            if on_job is not None and not result.dropped:
                on_job(result)
        writer.maybe_flush()
        if tables is not None:
            tables.maybe_flush()
        if journal is not None:
            journal.maybe_flush()
        if progress is not None:
            progress.update()
        bookkeeping += time.perf_counter() - t0


def feed_search(flows: Sequence[Flow], scheduler: Scheduler) -> None:
    """Ask the searching studies for candidates while their device type's look-ahead has room
    (enough compiled ahead that no worker waits for a compile), each free slot to the study served
    least so far: the least of the shared lanes' time used (``Scheduler.used``: search, admissions
    and checks), its candidates in flight counted at its search jobs' average, then the fewest
    measured; but first a study whose count is under half the median study's while its search's time
    is at most twice the others' mean (``starved``), and before it a study that has asked for none yet (its
    first candidate, whatever its agents took of its share). So every
    study of a type has an equal share of its workers' time, and what a study's agents cost comes
    out of its own, short of starving its search: on an H200 (300 s, eight public programs) a program the
    agents had nothing for searched 8 candidates with them on, 15 with them off, as the others'
    admissions and checks took their turns from it. (Asked in turn from the first study on every
    call, a freed slot went to the first study again and again: on four H200s a time-boxed suite
    sweep gave the first target 33 candidates and the last ones none.)"""
    by_type: dict[str, list[StudyFlow]] = defaultdict(list)
    for flow in flows:
        if isinstance(flow, StudyFlow) and flow.stage is Stage.SEARCH and flow.entered and flow.wants_more():
            by_type[flow.device_type].append(flow)
    for device_type, group in by_type.items():
        room = scheduler.lookahead(device_type) - scheduler.in_flight(device_type, JobKind.SEARCH)
        # Once a feed: the time used moves little while it asks.
        used = scheduler.used()
        cost = {f.name: scheduler.search_cost(f.name, device_type) for f in group}
        def asked(f: StudyFlow) -> int:
            return f.state.n_search + f.search_in_flight

        first = starved({f.name: asked(f) for f in group}, scheduler.used(Lane.SEARCH))
        misses: dict[str, int] = defaultdict(int)
        while room > 0 and group:
            flow = min(group, key=lambda f: (asked(f) > 0, asked(f) >= first.get(f.name, 0.0),
                                             used[f.name] + f.search_in_flight * cost[f.name], f.state.n_search))
            if flow.ask():
                room -= 1
            else:
                # The sampler proposed a point measured already (answered from the results at once)
                # or one the constraints forbid: ask again now, a few times. Waiting for the next
                # poll drained the look-ahead of a small space whose sampler had converged (Kernel
                # Tuner's strategies skip a visited point the same way).
                misses[flow.name] += 1
                if misses[flow.name] >= ASK_RETRIES or not flow.wants_more():
                    group.remove(flow)  # the others' turn
                continue
            if not flow.wants_more():
                group.remove(flow)


def job_record(run_id: str, result: JobResult, scheduler: Scheduler) -> dict[str, Any]:
    """A row of the ``jobs`` table: what a worker did and when."""
    job = result.job
    worker_id = scheduler.worker_id(job.worker) if job.worker is not None else ""
    finished = job.dispatched_at + result.worker_s if job.dispatched_at else time.time()
    outcome = result.failure.value if result.failure is not None else (
        result.artifact.status.value if not result.built else "ok")
    def stamp(epoch_s: float | None) -> datetime | None:
        return datetime.fromtimestamp(epoch_s, tz=UTC) if epoch_s else None

    return {"run_id": run_id, "study": job.study, "kind": job.kind.value, "lane": job.lane.value, "label": job.label,
            "candidate_key": job.candidate.key, "worker": job.worker, "worker_id": worker_id,
            "submitted_at": stamp(job.submitted_at), "dispatched_at": stamp(job.dispatched_at),
            "started_at": stamp(finished - job.service_s if job.dispatched_at else None),
            "finished_at": stamp(finished), "service_s": job.service_s, "outcome": outcome}
