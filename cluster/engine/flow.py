"""Each study moves on by itself: baseline ─► agents ─► search ─► finals ─► reviews ─► profiles.

A ``StudyFlow`` submits the jobs of its current stage to the scheduler and moves to the next
stage when they are in; the driver asks it for search candidates while the look-ahead of its
device type has room, and hands it every result of its jobs. One study's slow stage never holds
another study: they share the queues, not the stages.
"""

from __future__ import annotations

import dataclasses
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import ray

from cluster.config import RunConfig, Target
from cluster.core.encodings import speedup, suspect_speedup
from cluster.core.placeholders import expand
from cluster.core.types import BuildArtifact, Candidate, Measurement, Phase, Status
from cluster.engine.jobs import Build, Job, JobKind, JobResult
from cluster.engine.scheduler import Scheduler
from cluster.engine.studies import Evaluated, StudyState, load_reference, save_reference
from cluster.runners.measure import Reference
from cluster.runners.profile import DEFAULT_METRICS, Profile, profile_records
from cluster.store.results import ResultWriter, make_row
from cluster.store.rundir import RunDir

REVIEW_SCHEMA = pa.schema([("run_id", pa.string()), ("study", pa.string()), ("candidate_key", pa.string()),
                           ("speedup", pa.float64()), ("status", pa.string()), ("detail", pa.string())])


class Stage(StrEnum):
    BASELINE = "baseline"
    AGENTS = "agents"
    SEARCH = "search"
    FINAL = "final"
    REVIEW = "review"
    PROFILE = "profile"
    DONE = "done"
    FAILED = "failed"  # its baseline did not run: nothing else can be measured against it


@dataclass
class SweepContext:
    """What the flows of one sweep share."""

    run_id: str
    run_dir: Path
    config: RunConfig
    scheduler: Scheduler
    results: ResultWriter
    log: Callable[[str], None]
    cover: Callable[[list[Target]], None]  # widen the results' schema for variants' params
    agents: Any = None  # AgentStage, when the agents' workflow is on
    executor: Executor | None = None  # the agents' threads
    reviewed: frozenset[str] = frozenset()  # candidate keys reviewed by an earlier invocation
    profiled: frozenset[str] = frozenset()


def profiled_keys(candidates: str, baseline: str, winners: list[str], measured_ok: list[str],
                  analysts: bool) -> list[str]:
    """The candidates a study's profile stage hands to Nsight Compute (``profile.candidates``): none;
    the baseline (unless the analysts profiled it already, ahead of the search); the baseline and the
    winners; every candidate measured ok."""
    if candidates == "all":
        return measured_ok
    if candidates == "best":
        return [baseline, *winners]
    if candidates == "baseline":
        return [] if analysts else [baseline]
    return []


class StudyJobs:
    """The jobs of one study, made for its flow or, through the scheduler's inbox, for the agents'
    thread (``threadsafe``): each returns a future of its result."""

    def __init__(self, state: StudyState, scheduler: Scheduler, threadsafe: bool = True) -> None:
        self.state, self.scheduler, self.threadsafe = state, scheduler, threadsafe

    def build(self, source: Target | None = None, candidate: Candidate | None = None) -> Build:
        """A build of the study: ``candidate`` (default: the baseline) from ``source`` (default:
        the target's own sources; a variant is put in the object store once)."""
        state = self.state
        candidate = candidate or state.baseline_candidate()
        if source is None or source.bundle.hash == state.target.bundle.hash:
            return Build(state.target, state.target_ref, candidate)
        if source.bundle.hash not in state.variant_refs:
            state.variant_refs[source.bundle.hash] = ray.put(source)
        return Build(source, state.variant_refs[source.bundle.hash], candidate)

    def job(self, kind: JobKind, *builds: Build, **fields: Any) -> Job:
        state = self.state
        return Job(kind, state.name, state.workers, state.device, tuple(builds), **fields)

    def submit(self, job: Job) -> Future[JobResult]:
        if self.threadsafe:
            return self.scheduler.submit_threadsafe(job)
        job.future = Future()
        self.scheduler.submit(job)
        return job.future

    def variant_candidate(self, variant: Target, phase: Phase = Phase.VERIFY) -> Candidate:
        """The baseline's flags and params with the variant's sources (and its own params' defaults)."""
        baseline = self.state.baseline_candidate()
        params = {**dict(baseline.params), **variant.baseline_params}
        return dataclasses.replace(baseline, source_hash=variant.bundle.hash, params=tuple(params.items()),
                                   phase=phase)

    def verify(self, variant: Target, runs: int) -> Future[JobResult]:
        build = self.build(variant, self.variant_candidate(variant))
        return self.submit(self.job(JobKind.VERIFY, build, runs=runs, reference=self.state.reference))

    def sanitize(self, variant: Target | None, tools: tuple[str, ...], timeout: float,
                 timeouts: dict[str, float] | None) -> Future[JobResult]:
        build = self.build() if variant is None else self.build(variant, self.variant_candidate(variant))
        return self.submit(self.job(JobKind.SANITIZE, build, args={"tools": tools, "timeout": timeout,
                                                                   "timeouts": timeouts}))

    def guard(self, variant: Target, files: dict[str, str]) -> Future[JobResult]:
        build = self.build(variant, self.variant_candidate(variant))
        return self.submit(self.job(JobKind.GUARD, build, self.build(), args={"files": files}))

    def profile(self, candidate: Candidate | None, metrics: tuple[str, ...], timeout: float,
                launches: int | None, priority: int | None = None) -> Future[JobResult]:
        source = self.state.source_of(candidate)[0] if candidate else None
        return self.submit(self.job(JobKind.PROFILE, self.build(source, candidate), priority=priority,
                                    args={"metrics": metrics, "timeout": timeout, "launches": launches}))


class Flow(ABC):
    """What the driver's loop moves along (``cluster.engine.driver.run_flows``): a study's jobs,
    submitted by ``step`` as its stage needs them, their results handed back to ``on_result``."""

    def __init__(self, name: str, device_type: str) -> None:
        self.name, self.device_type = name, device_type
        self.stage = Stage.BASELINE

    @property
    def done(self) -> bool:
        return self.stage in (Stage.DONE, Stage.FAILED)

    @abstractmethod
    def step(self) -> None:
        """Submit what the current stage needs, or move on when it is complete."""

    @abstractmethod
    def on_result(self, result: JobResult) -> None:
        """A job of this flow is done."""


class StudyFlow(Flow):
    """One study's way through the stages, driven by ``step`` and ``on_result``."""

    def __init__(self, state: StudyState, ctx: SweepContext, agents_done: bool = False) -> None:
        super().__init__(state.name, state.device.device_type)
        self.state, self.ctx = state, ctx
        self.jobs = StudyJobs(state, ctx.scheduler, threadsafe=False)
        self.agents_done = agents_done
        self.awaited: set[int] = set()  # the current stage's jobs (by seq) not yet in
        self.entered = False
        self.reason = ""  # why it failed
        self.rows: list[dict[str, Any]] = []  # this study's rows, for its selection
        self.measured: dict[tuple[str, str], Measurement] = {}  # (binary hash, run command) -> measurement
        self.search_in_flight = 0
        self.deadline = float("inf")
        self.agents_future: Future[Any] | None = None
        self.kernels: tuple = ()
        self.reviews: list[str] = []  # one word per review, for the summary line

    # -- the stages ------------------------------------------------------------------------------
    def step(self) -> None:
        """Submit what the current stage needs, or move on when it is complete."""
        if self.done:
            return
        if not self.entered:
            self.entered = True
            getattr(self, f"_enter_{self.stage.value}")()
        if self.stage is Stage.AGENTS and self.agents_future is not None and self.agents_future.done():
            self._agents_finished()
        elif self.stage is Stage.SEARCH and not self.wants_more() and self.search_in_flight == 0:
            self._advance(Stage.FINAL)
        elif self.stage in (Stage.FINAL, Stage.REVIEW, Stage.PROFILE) and not self.awaited:
            self._advance({Stage.FINAL: Stage.REVIEW, Stage.REVIEW: Stage.PROFILE,
                           Stage.PROFILE: Stage.DONE}[self.stage])

    def _advance(self, stage: Stage) -> None:
        if stage is Stage.PROFILE and self.reviews:
            counts = {word: self.reviews.count(word) for word in dict.fromkeys(self.reviews)}
            self.ctx.log(f"{self.name}: {len(self.reviews)} candidates over 10x the baseline, re-verified on fresh "
                         f"seeds: " + ", ".join(f"{n} {word}" for word, n in counts.items()))
        self.stage, self.entered = stage, False
        self.awaited.clear()
        self.step()

    def fail(self, reason: str) -> None:
        self.stage, self.reason = Stage.FAILED, reason
        self.ctx.log(f"skipped {self.name}: {reason}")

    def _enter_baseline(self) -> None:
        state = self.state
        baseline = state.baseline_candidate()
        state.candidates[baseline.key] = baseline
        reference = load_reference(self.ctx.run_dir, baseline.key)
        previous = state.results.get(baseline.key)
        if reference is not None and previous is not None and previous.status is Status.OK:
            state.reference = ray.put(reference)
            self._after_baseline()
            return
        measure = self.ctx.config.measure
        runs = max(measure.runs, measure.final_runs + 1)  # the finals' fresh seeds need references too
        self.jobs.submit(self.jobs.job(JobKind.BASELINE, self.jobs.build(), runs=runs))

    def _after_baseline(self) -> None:
        agents = self.ctx.agents
        self._advance(Stage.AGENTS if agents is not None and not self.agents_done else Stage.SEARCH)

    def _enter_agents(self) -> None:
        assert self.ctx.agents is not None and self.ctx.executor is not None
        threaded = StudyJobs(self.state, self.ctx.scheduler, threadsafe=True)
        if not self.kernels:  # resumed: the baseline's ptxas report from its build
            self.kernels = self._baseline_kernels()
        self.agents_future = self.ctx.executor.submit(self.ctx.agents.propose, self.state, threaded, self.kernels)

    def _baseline_kernels(self) -> tuple:
        refs = self.ctx.scheduler.build_refs(self.jobs.build())
        artifact: BuildArtifact = ray.get(refs[0])
        return artifact.kernels

    def _agents_finished(self) -> None:
        assert self.agents_future is not None
        try:
            accepted = self.agents_future.result()
        except Exception as exc:  # an agents' failure is a value: the search goes on without variants
            self.ctx.log(f"{self.name}: the agents' stage failed ({type(exc).__name__}: {exc}); searching without")
            accepted = []
        self.ctx.agents.join(self.state, accepted)
        self.ctx.cover(list(self.state.variants.values()))
        self._advance(Stage.SEARCH)

    def _enter_search(self) -> None:
        budget = self.ctx.config.search.time_budget_s
        self.deadline = time.monotonic() + budget if budget else float("inf")

    def _enter_final(self) -> None:
        """The best few and the baseline again, on seeds the search did not use (1..final_runs):
        what the selection trusts. The best is re-run even when ``final_top_k`` is 0."""
        state, measure = self.state, self.ctx.config.measure
        finals = {r["candidate_key"] for r in self.rows if r["phase"] == Phase.FINAL.value}
        chosen = {c.key: c for c in [*state.top(max(1, measure.final_top_k)), state.baseline_candidate()]}
        for candidate in chosen.values():
            if candidate.key in finals:
                continue
            source = state.source_of(candidate)[0]
            build = self.jobs.build(source, candidate.with_phase(Phase.FINAL))
            self._submit(self.jobs.job(JobKind.FINAL, build, runs=measure.final_runs, first_seed=1,
                                       reference=state.reference))

    def _enter_review(self) -> None:
        """Candidates more than 10x better than their baseline, run again against it on fresh seeds."""
        state = self.state
        if not state.baseline_median:
            return
        for key, result in state.results.items():
            if result.median is None or key in self.ctx.reviewed or key not in state.candidates:
                continue
            if key == state.baseline_candidate().key:
                continue
            if not suspect_speedup(speedup(result.median, state.baseline_median, state.goal)):
                continue
            candidate = state.candidates[key]
            build = self.jobs.build(state.source_of(candidate)[0], candidate)
            self._submit(self.jobs.job(JobKind.REVIEW, build, self.jobs.build()))

    def _enter_profile(self) -> None:
        spec = self.ctx.config.profile
        state = self.state
        if spec.candidates == "none" or state.device.kind != "gpu":
            return
        winners: list[str] = []
        if spec.candidates == "best" and self.rows:
            from cluster.outputs.select import select_best

            winners = [b.candidate_key for b in select_best(pd.DataFrame(self.rows))]
        keys = profiled_keys(spec.candidates, state.baseline_candidate().key, winners,
                             [k for k, r in state.results.items() if r.status is Status.OK],
                             analysts=self.ctx.agents is not None and self.ctx.config.agents.profile_baseline)
        metrics = tuple(spec.metrics or DEFAULT_METRICS)
        for key in dict.fromkeys(k for k in keys if k in state.candidates and k not in self.ctx.profiled):
            candidate = state.candidates[key]
            build = self.jobs.build(state.source_of(candidate)[0], candidate)
            self._submit(self.jobs.job(JobKind.PROFILE, build, args={"metrics": metrics, "timeout": spec.timeout_s,
                                                                     "launches": spec.launches}))

    def _enter_done(self) -> None:
        return None

    def _enter_failed(self) -> None:
        return None

    def _submit(self, job: Job) -> None:
        self.awaited.add(job.seq)
        self.ctx.scheduler.submit(job)

    # -- the search ------------------------------------------------------------------------------
    def wants_more(self) -> bool:
        trials = self.ctx.config.search.trials
        state = self.state
        trials_left = trials is None or state.n_search + len(state.pending) < trials
        return trials_left and not state.exhausted and time.monotonic() < self.deadline

    def race_bound(self) -> float | None:
        """Racing (``measure.race``): the time above which a search candidate's lower quartile
        stops its sampling, from the study's best median when the candidate is asked for; None
        where there is no best yet or the objective is not a time to minimize."""
        race, state = self.ctx.config.measure.race, self.state
        if race is None or state.best is None or state.best <= 0:
            return None
        if state.goal != "minimize" or state.objective != "time":
            return None
        return state.best * race

    def ask(self) -> bool:
        """One more search candidate submitted; False when the sampler proposed nothing new."""
        asked = self.state.ask()
        if asked is None:
            return False
        candidate = asked[1]
        self.state.pending.add(candidate.key)
        source = self.state.source_of(candidate)[0]
        measure = self.ctx.config.measure
        bound = self.race_bound()
        args = {"stop_above": bound} if bound is not None else {}
        if measure.search_samples is not None:
            args["max_samples"] = measure.search_samples
        if not measure.search_telemetry and self.state.objective == "time":
            args["telemetry"] = False  # the NVML monitor costs a short job a third of its time
        job = self.jobs.job(JobKind.SEARCH, self.jobs.build(source, candidate), runs=measure.runs,
                            reference=self.state.reference, reusable=True, args=args)
        self.search_in_flight += 1
        self.ctx.scheduler.submit(job)
        return True

    def reuse(self, job: Job, artifact: BuildArtifact) -> Measurement | None:
        """The measurement of a build already measured the same way: the same binary (its hash)
        run with the same command (params can be arguments of the run command)."""
        previous = self.measured.get((artifact.binary_hash, run_signature(job.target, job.candidate)))
        if previous is None or not artifact.binary_hash:
            return None
        now = time.time()
        return dataclasses.replace(previous, candidate_key=job.candidate.key, run_s=0.0, verify_s=0.0, queue_s=0.0,
                                   started_at=now, finished_at=now,
                                   error_tail=f"same binary and run command as {previous.candidate_key}; measured once")

    # -- results ---------------------------------------------------------------------------------
    def on_result(self, result: JobResult) -> None:
        job = result.job
        if job.kind is JobKind.PROFILE:
            self._profiled(result)
        elif job.kind is JobKind.REVIEW:
            self._reviewed(result)
        elif job.kind in (JobKind.SANITIZE, JobKind.GUARD):
            pass  # the verifier reads them from the job's future
        else:
            self._measured(result)
        self.awaited.discard(job.seq)
        if job.future is not None:
            job.future.set_result(result)

    def _measured(self, result: JobResult) -> None:
        job, state = result.job, self.state
        measurement = result.measurement
        if measurement is None and result.failure is not None:
            measurement = Measurement(job.candidate.key, result.failure, job.device, error_tail=result.error,
                                      started_at=job.compiled_at, finished_at=time.time())
        if job.kind is JobKind.BASELINE:
            self._baseline_measured(result.artifact, measurement)
        self.record_row(job.builds[0].target, job.candidate, result.artifact, measurement)
        if job.kind is JobKind.SEARCH:
            self.search_in_flight -= 1
            if measurement is not None and measurement.status is Status.OK and result.artifact.binary_hash:
                key = (result.artifact.binary_hash, run_signature(job.target, job.candidate))
                self.measured.setdefault(key, measurement)
        if job.kind is JobKind.BASELINE and state.reference is not None:
            self._after_baseline()

    def record_row(self, source: Target, candidate: Candidate, artifact: BuildArtifact,
                   measurement: Measurement | None) -> None:
        state, config = self.state, self.ctx.config
        if source.bundle.hash != state.target.bundle.hash:
            self.ctx.cover([source])  # an agent's variant may bring params of its own
        row = make_row(self.ctx.run_id, candidate, artifact, measurement, state.baseline_median, state.goal,
                       unit=state.target.spec.metric.unit, max_noise=config.measure.max_noise,
                       objective=state.objective)
        self.rows.append(self.ctx.results.append(row))
        stats = measurement.stats if measurement else None
        status = measurement.status if measurement else artifact.status
        median = stats.median if status is Status.OK and stats else None
        energy = measurement.telemetry.energy_j if measurement and measurement.telemetry else None
        state.record(candidate, Evaluated(status, median, energy))

    def _baseline_measured(self, artifact: BuildArtifact, measurement: Measurement | None) -> None:
        state = self.state
        stats = measurement.stats if measurement else None
        if measurement is None or measurement.status is not Status.OK or stats is None:
            status = measurement.status if measurement else artifact.status
            error = (measurement.error_tail if measurement else artifact.error_tail) or ""
            lines = [line for line in error.splitlines() if line.strip()]
            self.fail(f"its baseline failed ({status.value}" + (f": {lines[-1][:200]})" if lines else ")"))
            return
        self.kernels = artifact.kernels
        reference = Reference(measurement.outputs, measurement.clock)  # the clock: runners.clock
        save_reference(self.ctx.run_dir, measurement.candidate_key, reference)
        state.reference = ray.put(reference)
        state.baseline_median = stats.median

    def _reviewed(self, result: JobResult) -> None:
        from agents.workflow.steps import Verdict, VerdictStatus

        job, state = result.job, self.state
        if result.failure is not None:  # it took its worker down on fresh seeds, or every worker was lost
            verdict = Verdict("fresh_seeds", VerdictStatus.FAILED, f"the re-verification did not complete: "
                                                                   f"{result.failure.value}: {result.error}"[:300])
        elif isinstance(result.value, Verdict):
            verdict = result.value
        else:  # its build failed
            verdict = Verdict("fresh_seeds", VerdictStatus.SKIPPED,
                              f"not run: {result.error or result.artifact.error_tail}"[:300])
        key = job.candidate.key
        ratio = speedup(state.results[key].median, state.baseline_median, state.goal) if key in state.results else None
        self.reviews.append(verdict.status.value)
        with ResultWriter(self.ctx.run_dir, REVIEW_SCHEMA, subdir=RunDir.REVIEWS) as writer:
            writer.append_record({"run_id": self.ctx.run_id, "study": self.name, "candidate_key": key,
                                  "speedup": ratio, "status": verdict.status.value, "detail": verdict.detail})
        if verdict.failed:
            failed = Measurement(key, Status.VERIFY_FAILED, state.device,
                                 error_tail=f"fresh-seed re-verification: {verdict.detail}")
            self.record_row(job.target, job.candidate.with_phase(Phase.FINAL), result.artifact, failed)

    def _profiled(self, result: JobResult) -> None:
        if result.job.seq not in self.awaited:
            return  # the agents' baseline profile: their stage writes it
        from cluster.runners.profile import PROFILE_SCHEMA

        profile = result.value if isinstance(result.value, Profile) else Profile(
            result.job.candidate.key, result.failure or Status.CRASHED, error_tail=result.error)
        with ResultWriter(self.ctx.run_dir, PROFILE_SCHEMA, subdir=RunDir.PROFILES) as writer:
            for record in profile_records(self.ctx.run_id, self.state, profile):
                writer.append_record(record)


def run_signature(target: Target, candidate: Candidate) -> str:
    """The run command of a candidate as far as it depends on the candidate (its params)."""
    values = {**dict(candidate.params), "binary": "", "workdir": "", "arch": candidate.arch, "seed": "{seed}"}
    return json.dumps(expand(target.spec.run, values))
