"""Each study moves on by itself: baseline ─► search (the agents beside it) ─► finals ─► profiles.

    baseline ─► search of flags and params ───────────────► finals (the best few whose checks
            └► agents (their own thread): each variant     passed, and the baseline, on fresh
               admitted by the cheap checks joins the       seeds) ─► winners' profiles ─► done
               running search; one that measures faster
               than the baseline gets the expensive checks

A ``StudyFlow`` submits the jobs of its current stage to the scheduler and moves to the next
stage when they are in; the driver asks it for search candidates while the look-ahead of its
device type has room, and hands it every result of its jobs. One study's slow stage never holds
another study: they share the queues, not the stages. With a time budget, the sweep's
``TimePlan`` closes the search in time for the finals (``work_left``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import statistics
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from enum import StrEnum
from typing import Any

import ray

from cluster.config import Target
from cluster.core.placeholders import expand
from cluster.core.types import BuildArtifact, Candidate, Measurement, Phase, Stats, Status, Verdict
from cluster.engine.finals import Finals
from cluster.engine.plan.budget import SAFETY, bounded
from cluster.engine.scheduling.jobs import URGENT, BaselineBuild, Job, JobKind, JobResult
from cluster.engine.study.context import SweepContext
from cluster.engine.study.state import Evaluated, StudyState, save_reference
from cluster.engine.study.study_jobs import StudyJobs
from cluster.engine.verification.checks import DeepChecks, Trust
from cluster.engine.verification.gate import Gate
from cluster.measure.measure import Reference
from cluster.measure.profile import DEFAULT_METRICS, Profile, profile_records
from cluster.measure.profile import PROFILE_SCHEMA as _PROFILE_SCHEMA
from cluster.store.results import make_row
from cluster.store.rundir import RunDir
from cluster.store.tables import REVIEW_SCHEMA
from cluster.store.variants import VARIANT_SCHEMA, AcceptedVariant

log = logging.getLogger(f"warpfleet.{__name__}")

SEARCH_ONLY = frozenset({JobKind.SEARCH})
AGENTS_ONLY = frozenset({JobKind.VERIFY, JobKind.PROFILE})  # the agents' jobs (a study's own profiles come later)
# A variant's final with one of these failed the cheat checks its finals' runs are (DeepChecks.failed_in_finals):
# wrong outputs with the outputs poisoned or on fresh seeds, a cache, a claim the clocks do not bear out.
CHEATS_FAIL = frozenset({Status.VERIFY_FAILED, Status.TEST_FAILED, Status.CLOCK_MISMATCH, Status.METRIC_INVALID,
                         Status.METRIC_MISSING})


class Stage(StrEnum):
    BASELINE = "baseline"
    SEARCH = "search"
    FINAL = "final"
    PROFILE = "profile"
    DONE = "done"
    FAILED = "failed"  # its baseline did not run: nothing else can be measured against it


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

    def work_left(self) -> tuple[float, float]:
        """Worker-seconds it needs once its search is closed: finals, and the checks they wait for."""
        return 0.0, 0.0

    def in_search(self) -> bool:
        return False

    def searched(self) -> bool:
        return False

    def parked(self) -> bool:
        """Whether its finals are in and it waits for the time plan to reopen its search."""
        return False


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
        self.stats: dict[str, Stats] = {}  # candidate key -> the samples' statistics of its ok row
        self.search_in_flight = 0
        self.agents_future: Future[Any] | None = None
        self.threaded: StudyJobs | None = None  # the agents' thread's jobs
        # From the agents' thread: each admitted variant, and the future its admission waits on.
        self.admitted: queue.SimpleQueue[tuple[AcceptedVariant, Future[tuple[Verdict, ...]]]] = queue.SimpleQueue()
        self.closed = False
        self.kernels: tuple = ()
        self.run_estimate: float | None = None  # worker-seconds a run takes (the plan's unit): ``_timed``
        self.run_times: list[float] = []  # a run's worker-seconds in each full measurement (not the search's)
        self.job_overhead = 0.0  # worker-seconds of a job besides its runs (staging, the sandbox's start)
        self.profile_s: float | None = None  # Nsight Compute on this study's program, worker-seconds a job
        self.parking = False  # its finals are in; it waits for the time plan to reopen its search
        agents = ctx.config.agents
        gpu = state.device.kind == "gpu"
        self.checks = DeepChecks(self.jobs, tuple(agents.sanitizer) if gpu else (), agents.sanitizer_timeout_s,
                                 agents.guardrails, self._write_variant, self._record_of, self._retire)
        plan = ctx.plan
        self.checks.bound = (lambda: plan.check_bound(device_type=self.device_type)) if plan is not None \
            else (lambda: None)
        self.checks.launches = agents.sanitizer_launches
        self.jobs.judge_bound = self.checks.bound
        self.gate = Gate(self, {k: Trust(v) for k, v in ctx.reviewed.items()})
        self.checks.contends = self.gate.contends
        self.finals = Finals(self, self.gate)

    # -- the stages ------------------------------------------------------------------------------
    @property
    def agents_running(self) -> bool:
        return self.agents_future is not None and not self.agents_done

    def step(self) -> None:
        """Submit what the current stage needs, or move on when it is complete."""
        if self.done:
            return
        if not self.entered:
            self.entered = True
            getattr(self, f"_enter_{self.stage.value}")()
        self._take_admitted()
        if self.agents_future is not None and self.agents_future.done() and not self.agents_done:
            self._agents_finished()
        if self.stage is Stage.SEARCH:
            closed = self.ctx.plan is not None and not self.ctx.plan.search_open(self.device_type)
            if closed and self.ctx.scheduler.drop(self.name, SEARCH_ONLY):
                return  # the dropped jobs come back at the next poll
            if (closed or (not self.wants_more() and not self.agents_running)) and self.search_in_flight == 0:
                self._advance(Stage.FINAL)
        elif self.stage is Stage.FINAL and self.finals.step():
            self._after_finals()
        elif self.stage is Stage.PROFILE and not self.awaited:
            self._advance(Stage.DONE)

    def _after_finals(self) -> None:
        """Its finals are in: back to its search where the plan reopened it; waiting for that
        (``parked``) while the plan may still reopen it; else on to the profiles."""
        plan = self.ctx.plan
        if plan is not None and self.can_search() and plan.search_open(self.device_type):
            log.info(f"{self.name}: the search reopens ({plan.time_left():.0f} s left)")
            self.parking, self.jobs.urgent, self.finals.entered = False, False, False
            self._advance(Stage.SEARCH)
        elif plan is not None and self.can_search() and plan.may_reopen(self.device_type, self._one_final_s()):
            self.parking = True
        else:
            self.parking = False
            self._advance(Stage.PROFILE)

    def parked(self) -> bool:
        return self.parking and self.stage is Stage.FINAL

    def can_search(self) -> bool:
        """Whether its search has trials and points left, the time plan aside."""
        return any(self._streams()) and not self.state.exhausted

    def _one_final_s(self) -> float:
        return self.job_overhead + self.finals.runs * self._run_s()

    def _run_s(self) -> float:
        """A run's worker-seconds: its own once measured, else the device type's typical run."""
        if self.run_estimate is not None:
            return self.run_estimate
        return self.ctx.plan.typical_run(self.device_type) if self.ctx.plan is not None else 1.0

    def _advance(self, stage: Stage) -> None:
        if stage is Stage.PROFILE and self.gate.reviews:
            reviews = self.gate.reviews
            counts = {word: reviews.count(word) for word in dict.fromkeys(reviews)}
            log.info(f"{self.name}: {len(reviews)} candidates over 10x the baseline, re-verified on fresh "
                         f"seeds: " + ", ".join(f"{n} {word}" for word, n in counts.items()))
        self.stage, self.entered = stage, False
        self.awaited.clear()
        self.step()

    def fail(self, reason: str) -> None:
        self.stage, self.reason = Stage.FAILED, reason
        log.info(f"skipped {self.name}: {reason}")

    def in_search(self) -> bool:
        return self.stage in (Stage.BASELINE, Stage.SEARCH)

    def searched(self) -> bool:
        return self.state.n_search > 0

    def _enter_baseline(self) -> None:
        from cluster.engine.study.state import load_reference

        state = self.state
        baseline = state.baseline_candidate()
        state.candidates[baseline.key] = baseline
        reference = load_reference(self.ctx.run_dir, baseline.key)
        previous = state.results.get(baseline.key)
        if previous is not None and previous.status is Status.OK:
            self._estimate_from_rows()
            if reference is not None:
                state.reference, self.finals.reference = ray.put(reference), reference
                self._after_baseline()
                return
            # Its row is there, its outputs are not (references/ deleted): measured again, no second row.
            self.jobs.submit(self.jobs.job(JobKind.REFERENCE, self.jobs.build(), runs=self.ctx.config.measure.runs))
            return
        self.jobs.submit(self.jobs.job(JobKind.BASELINE, self.jobs.build(), runs=self.ctx.config.measure.runs))

    def _estimate_from_rows(self) -> None:
        """A resumed study's time a run, from its rows (the baseline's run over its runs)."""
        base = [r for r in self.rows if r.get("phase") == Phase.BASELINE.value and r.get("status") == "ok"]
        if base and base[0].get("run_s") and base[0].get("n_samples"):
            self._timed((float(base[0]["run_s"]) + float(base[0].get("verify_s") or 0.0)) / max(
                1, self.ctx.config.measure.runs))
        if base and base[0].get("median") is not None:
            self.stats.setdefault(base[0]["candidate_key"], Stats(float(base[0]["median"]), float(base[0]["median"]),
                                                                  float(base[0].get("iqr") or 0.0), 1))

    def _after_baseline(self) -> None:
        if self.state.baseline_build is None:  # kept in the object store for the study's measurements
            refs = self.ctx.scheduler.build_refs(self.jobs.build())
            self.state.baseline_build = BaselineBuild(self.state.target_ref, self.state.baseline_candidate(), refs[1])
        if self.ctx.agents is not None and not self.agents_done:
            self._start_agents()
        self._advance(Stage.SEARCH)

    def _start_agents(self) -> None:
        """The agents' workflow in its own thread, beside the search: each variant it admits is
        handed over through ``admitted`` and joins the search at the flow's next step."""
        assert self.ctx.agents is not None and self.ctx.executor is not None
        threaded = self.threaded = StudyJobs(self.state, self.ctx.scheduler, threadsafe=True)
        threaded.judge_bound = self.checks.bound
        if not self.kernels:  # resumed: the baseline's ptxas report from its build
            self.kernels = self._baseline_kernels()
        self.agents_future = self.ctx.executor.submit(self.ctx.agents.propose, self.state, threaded, self.kernels,
                                                      self.admit)

    def _baseline_kernels(self) -> tuple:
        refs = self.ctx.scheduler.build_refs(self.jobs.build())
        artifact: BuildArtifact = ray.get(refs[0])
        return artifact.kernels

    def admit(self, variant: AcceptedVariant) -> Future[tuple[Verdict, ...]]:
        """From the agents' thread: a variant the cheap checks admitted, for the search; the future
        gets the expensive checks' verdicts where it measured faster than the baseline, else none."""
        ticket: Future[tuple[Verdict, ...]] = Future()
        if self.closed:
            ticket.set_result(())
        else:
            self.admitted.put((variant, ticket))
        return ticket

    def _take_admitted(self) -> None:
        while not self.admitted.empty():
            variant, ticket = self.admitted.get()
            joined = variant.files_changed and variant.source_hash in self.state.variants
            if self.stage not in (Stage.SEARCH, Stage.BASELINE) or joined:
                if not joined:
                    log.info(f"{self.name}: {variant.label}: admitted after the search closed; not searched")
                ticket.set_result(())
                continue
            self.ctx.agents.join_variant(self.state, variant, self.best_flags())
            self.ctx.cover(list(self.state.variants.values()))
            if not variant.files_changed:
                ticket.set_result(())
                continue
            self.checks.add(variant, variant.record)
            verified = self.jobs.variant_candidate(variant.target).key
            if verified in self.stats:
                self.gate.consider(self.state.candidates.get(verified), self.stats[verified], ticket)
            if not ticket.done() and self.checks.trust(variant.source_hash) is Trust.NOT_RUN:
                ticket.set_result(())  # no faster than the baseline: no expensive checks now

    def close(self) -> None:
        """The sweep ended: every admission and check still waited on is answered."""
        self.closed = True
        while not self.admitted.empty():
            self.admitted.get()[1].set_result(())
        self.checks.close()

    def _retire(self, source_hash: str) -> None:
        if source_hash in self.state.variants:
            log.info(f"{self.name}: variant {source_hash} failed its expensive checks: out of the search")
            self.state.retire(source_hash)

    def _record_of(self, source_hash: str) -> dict[str, Any] | None:
        return self.ctx.agents.record_of(self.name, source_hash) if self.ctx.agents is not None else None

    def _write_variant(self, record: dict[str, Any]) -> None:
        self.ctx.append(RunDir.VARIANTS, VARIANT_SCHEMA, {"run_id": self.ctx.run_id, **record})

    def _agents_finished(self) -> None:
        assert self.agents_future is not None
        try:
            self.agents_future.result()
        except Exception as exc:  # an agents' failure is a value: the search goes on without more variants
            log.info(f"{self.name}: the agents' stage failed ({type(exc).__name__}: {exc}); searching without")
        self._take_admitted()
        self.agents_done = True

    def restore_variants(self, restored: list[tuple[AcceptedVariant, Trust, dict[str, Any]]]) -> None:
        """An earlier invocation's admitted variants and what their checks found (resume)."""
        for variant, trust, record in restored:
            if variant.files_changed:
                self.checks.add(variant, record, trust)

    def best_flags(self) -> dict[str, str] | None:
        """The flags of the best candidate on the target's own sources so far, where they are not the
        baseline's: a variant that joins is tried with them too."""
        own = self.state.target.bundle.hash
        for candidate in self.state.ranked():
            if candidate.source_hash == own:
                flags = dict(candidate.flags)
                return flags if flags != self.state.target.space.baseline else None
        return None

    def _enter_search(self) -> None:
        return None

    def _enter_final(self) -> None:
        if self.threaded is not None and not self.agents_done:
            # The search is over: the agents' further admissions and profiles could change nothing.
            self.threaded.closed = True
            self.ctx.scheduler.drop(self.name, AGENTS_ONLY)
            log.info(f"{self.name}: the search is over; the agents' proposals from now on are not verified")
        self.jobs.urgent = True  # the checks the finalists wait for go first
        self.finals.enter()

    def _enter_profile(self) -> None:
        spec = self.ctx.config.profile
        state = self.state
        if spec.candidates == "none" or state.device.kind != "gpu":
            return
        winners: list[str] = []
        if spec.candidates == "best" and self.rows:
            import pandas as pd

            from cluster.store.select import select_best

            winners = [b.candidate_key for b in select_best(pd.DataFrame(self.rows))]
        profiled_ahead = self.ctx.agents is not None and self.ctx.agents.profiled_baseline(state.name)
        keys = profiled_keys(spec.candidates, state.baseline_candidate().key, winners,
                             [k for k, r in state.results.items() if r.status is Status.OK], analysts=profiled_ahead)
        metrics = tuple(spec.metrics or DEFAULT_METRICS)
        keys = list(dict.fromkeys(k for k in keys if k in state.candidates and k not in self.ctx.profiled))
        plan = self.ctx.plan
        each = self.profile_s if self.profile_s is not None else PROFILE_GUESS_S
        if keys and plan is not None and plan.time_left() < SAFETY * each * len(keys):
            log.info(f"{self.name}: no time left in the budget for Nsight Compute on the winners "
                         f"(about {each * len(keys):.0f} s)")
            return
        for key in keys:
            candidate = state.candidates[key]
            build = self.jobs.build(state.source_of(candidate)[0], candidate)
            timeout = bounded(spec.timeout_s, self.checks.bound())
            self.submit(self.jobs.job(JobKind.PROFILE, build, label="the winner" if key in winners else "",
                                       args={"metrics": metrics, "timeout": timeout, "launches": spec.launches}))

    def _enter_done(self) -> None:
        return None

    def _enter_failed(self) -> None:
        return None

    def submit(self, job: Job) -> None:
        self.awaited.add(job.seq)
        self.ctx.scheduler.submit(job)

    # -- the search ------------------------------------------------------------------------------
    def wants_more(self) -> bool:
        """Room for another search candidate: trials left in a stream (``search.trials`` each: the
        own sources' as with the agents off, the variants' beside them), points left, the time
        plan's search open."""
        open_ = self.ctx.plan is None or self.ctx.plan.search_open(self.device_type)
        return any(self._streams()) and not self.state.exhausted and open_ and self.stage is Stage.SEARCH

    def _streams(self) -> tuple[bool, bool]:
        """(own, variants): whether each search stream has trials left (``StudyState.room``)."""
        return self.state.room(self.ctx.config.search.trials)

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
        asked = self.state.ask(*self._streams())
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

    # -- the time plan ---------------------------------------------------------------------------
    def work_left(self) -> tuple[float, float]:
        """Worker-seconds it still needs once its search closes: the finals (the baseline's with them),
        and the checks its finalists wait for; estimated from its baseline's time a run."""
        if self.done:
            return 0.0, 0.0
        if self.parked():  # what it needs if its search reopens: one more final
            return self._one_final_s(), 0.0
        run = self._run_s()
        # The checks count only where the finals wait for them (``Finals`` asks ``may_wait``); the
        # plan keeps nothing for them, so the driver's loop does not rank every study's candidates for it.
        checks = self.gate.checks_left(run) if self.stage is Stage.FINAL else 0.0
        return self.finals.work_left(run, self.job_overhead), checks

    # -- results ---------------------------------------------------------------------------------
    def on_result(self, result: JobResult) -> None:
        job = result.job
        if result.dropped:
            self._dropped(result)
        elif job.kind is JobKind.PROFILE:
            if job.service_s > 0:
                self.profile_s = job.service_s if self.profile_s is None else max(self.profile_s, job.service_s)
                if self.ctx.plan is not None:
                    self.ctx.plan.checked(self.device_type, job.service_s)
            self._profiled(result)
        elif job.kind is JobKind.REFERENCE:
            self._referenced(result)
        elif job.kind in (JobKind.SANITIZE, JobKind.REVIEW):
            self.gate.timed(job)  # their futures' callbacks (the checks, the review) read them
        else:
            self._measured(result)
        self.awaited.discard(job.seq)
        if job.future is not None:
            job.future.set_result(result)

    def _dropped(self, result: JobResult) -> None:
        """A search job taken off the queue when the search closed: its trials told it failed, no row
        (the agents' jobs dropped with it: their futures say so)."""
        if result.job.kind is not JobKind.SEARCH:
            return
        candidate = result.job.candidate
        self.search_in_flight -= 1
        self.state.pending.discard(candidate.key)
        for study, number in self.state.asked.pop(candidate.key, []):
            self.state._tell(study, number, Evaluated(Status.WORKER_LOST, None))

    def _measured(self, result: JobResult) -> None:
        job, state = result.job, self.state
        measurement = result.measurement
        if measurement is None and result.failure is not None:
            measurement = Measurement(job.candidate.key, result.failure, job.device, error_tail=result.error,
                                      started_at=job.compiled_at, finished_at=time.time())
        if job.kind is JobKind.BASELINE:
            self._baseline_measured(result, measurement)
        self.record_row(job.builds[0].target, job.candidate, result.artifact, measurement)
        if job.kind is JobKind.SEARCH:
            self.search_in_flight -= 1
            if measurement is not None and measurement.status is Status.OK and result.artifact.binary_hash:
                key = (result.artifact.binary_hash, run_signature(job.target, job.candidate))
                self.measured.setdefault(key, measurement)
        if job.kind is JobKind.FINAL:
            self.finals.measured(job.candidate.key, measurement, extended=job.reference is None)
            if measurement is not None and measurement.status in CHEATS_FAIL and \
                    job.candidate.source_hash in state.variants:
                self.checks.failed_in_finals(job.candidate.source_hash,
                                             f"{measurement.status.value}: {measurement.error_tail.strip()}")
        stats = measurement.stats if measurement is not None and measurement.status is Status.OK else None
        if stats is not None and job.kind in (JobKind.VERIFY, JobKind.FINAL) and measurement is not None:
            self._timed((measurement.run_s + measurement.verify_s) / max(1, job.runs))
        if stats is not None and job.kind in (JobKind.BASELINE, JobKind.SEARCH, JobKind.VERIFY):
            self.stats[job.candidate.key] = stats
            if job.kind is not JobKind.BASELINE:
                self.gate.consider(state.candidates.get(job.candidate.key), stats)
        if job.kind is JobKind.BASELINE and state.reference is not None:
            self._after_baseline()

    def record_row(self, source: Target, candidate: Candidate, artifact: BuildArtifact,
                   measurement: Measurement | None) -> None:
        state, config = self.state, self.ctx.config
        if source.bundle.hash != state.target.bundle.hash:
            self.ctx.cover([source])  # an agent's variant may bring params of its own
        row = make_row(self.ctx.run_id, candidate, artifact, measurement, self._speedup_base(candidate, measurement),
                       state.goal,
                       unit=state.target.spec.metric.unit, max_noise=config.measure.max_noise,
                       objective=state.objective)
        self.rows.append(self.ctx.results.append(row))
        stats = measurement.stats if measurement else None
        status = measurement.status if measurement else artifact.status
        median = stats.median if status is Status.OK and stats else None
        energy = measurement.telemetry.energy_j if measurement and measurement.telemetry else None
        state.record(candidate, Evaluated(status, median, energy))

    def _speedup_base(self, candidate: Candidate, measurement: Measurement | None) -> float | None:
        """What a row's speedup is over: the baseline's first measurement; for a final row the
        baseline's re-measurement (its final rows' samples pooled, this row's too where it is the
        baseline's), the median that show and export give a winner's speedup over
        (``cluster.store.select``); the first measurement where the baseline's final failed."""
        state = self.state
        if candidate.phase is not Phase.FINAL:
            return state.baseline_median
        key = state.baseline_candidate().key
        finals = [r for r in self.rows if r.get("phase") == Phase.FINAL.value and r.get("candidate_key") == key]
        runs = [(str(r.get("status")), r.get("samples")) for r in finals]
        if candidate.key == key:
            runs.append((measurement.status.value if measurement else "", measurement.samples if measurement else ()))
        if any(status != Status.OK.value for status, _ in runs):
            return state.baseline_median
        stats = Stats.of([float(s) for _, samples in runs if samples is not None for s in samples])
        return stats.median if stats is not None else state.baseline_median

    def _baseline_measured(self, result: JobResult, measurement: Measurement | None) -> None:
        state, artifact = self.state, result.artifact
        stats = measurement.stats if measurement else None
        if measurement is None or measurement.status is not Status.OK or stats is None:
            status = measurement.status if measurement else artifact.status
            error = (measurement.error_tail if measurement else artifact.error_tail) or ""
            lines = [line for line in error.splitlines() if line.strip()]
            self.fail(f"its baseline failed ({status.value}" + (f": {lines[-1][:200]})" if lines else ")"))
            return
        self.kernels = artifact.kernels
        reference = Reference(measurement.outputs, measurement.clock)  # the clock: measure.clock
        save_reference(self.ctx.run_dir, measurement.candidate_key, reference)
        state.reference, self.finals.reference = ray.put(reference), reference
        state.baseline_median = stats.median
        self._estimate(result.job, measurement)

    def _estimate(self, job: Job, measurement: Measurement) -> None:
        """The plan's units from the baseline's job: a run (the program and the check of its outputs)
        and the job's own overhead (staging, the sandbox's start, the telemetry)."""
        measured = measurement.run_s + measurement.verify_s
        on_worker = measurement.finished_at - measurement.started_at  # the actor's own clock
        self._timed(measured / max(1, job.runs))
        self.job_overhead = max(0.0, (on_worker if on_worker > 0 else job.service_s) - measured)
        self.checks.run_s = measurement.run_s / max(1, job.runs)

    def _timed(self, run_s: float) -> None:
        """A run's time in a measurement that samples fully (the baseline's, a variant's verification,
        a final; not the search's, whose samples are capped): the plan's unit is their median, so that
        the one-time costs of a worker's first run (its runner's start, the driver's) fade out."""
        self.run_times.append(run_s)
        self.run_estimate = statistics.median(self.run_times)

    def _referenced(self, result: JobResult) -> None:
        """The baseline's outputs on seeds it had not run (references/ lost, or the finals' seeds)."""
        measurement = result.measurement
        if measurement is None or measurement.status is not Status.OK:
            why = measurement.status.value if measurement else (result.failure or result.artifact.status).value
            if self.stage is Stage.BASELINE:
                self.fail(f"its baseline's outputs could not be made again ({why})")
            else:
                self.finals.reference_failed(why)
            return
        if self.stage is Stage.BASELINE:
            reference = Reference(measurement.outputs, measurement.clock)
            save_reference(self.ctx.run_dir, measurement.candidate_key, reference)
            self.state.reference, self.finals.reference = ray.put(reference), reference
            if self.run_estimate is None:
                self._estimate(result.job, measurement)
            self._after_baseline()
            return
        self.finals.referenced(measurement)

    def _profiled(self, result: JobResult) -> None:
        if result.job.seq not in self.awaited:
            return  # the agents' baseline profile: their stage writes it
        profile = result.value if isinstance(result.value, Profile) else Profile(
            result.job.candidate.key, result.failure or Status.CRASHED, error_tail=result.error)
        for record in profile_records(self.ctx.run_id, self.state.target.name, self.state.device.device_type, profile):
            self.ctx.append(RunDir.PROFILES, _PROFILE_SCHEMA, record)


PROFILE_GUESS_S = 60.0  # Nsight Compute on a program, until one of this study's profiles has been timed


def run_signature(target: Target, candidate: Candidate) -> str:
    """The run command of a candidate as far as it depends on the candidate (its params)."""
    values = {**dict(candidate.params), "binary": "", "workdir": "", "arch": candidate.arch, "seed": "{seed}"}
    return json.dumps(expand(target.spec.run, values))


__all__ = ["REVIEW_SCHEMA", "URGENT", "Flow", "Stage", "StudyFlow", "StudyJobs", "SweepContext", "run_signature"]
