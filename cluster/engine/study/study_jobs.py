"""The jobs of one study, made for its flow (on the driver's thread) or for the agents' thread
(through the scheduler's inbox): each ``submit`` returns a future of the job's result."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import ray

from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, Phase, Status
from cluster.engine.scheduling.jobs import ANALYSTS_PROFILE, URGENT, Build, Job, JobKind, JobResult
from cluster.engine.scheduling.scheduler import Scheduler
from cluster.engine.study.state import StudyState


class StudyJobs:
    def __init__(self, state: StudyState, scheduler: Scheduler, threadsafe: bool = True) -> None:
        self.state, self.scheduler, self.threadsafe = state, scheduler, threadsafe
        self.urgent = False  # its study waits for these jobs to go on (its finals for their checks)
        self.closed = False  # its study's search is over: the agents' jobs come back dropped, unrun
        # The time plan's bound on one job, for a measurement's runs beside the baseline (None: none).
        self.judge_bound: Callable[[], float | None] = lambda: None

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
        if kind in (JobKind.SEARCH, JobKind.VERIFY, JobKind.FINAL):
            fields.setdefault("baseline", state.baseline_build)
            fields["args"] = {"judge_s": self.judge_bound(), **fields.get("args", {})}
        return Job(kind, state.name, state.workers, state.device, tuple(builds), **fields)

    def submit(self, job: Job) -> Future[JobResult]:
        if self.closed:
            done: Future[JobResult] = Future()
            done.set_result(JobResult(job, BuildArtifact(job.candidate.key, Status.OK), dropped=True))
            return done
        if self.urgent and job.kind in (JobKind.SANITIZE, JobKind.REVIEW):
            job.priority = URGENT
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

    def verify(self, variant: Target, runs: int, label: str = "", value: float = 0.0) -> Future[JobResult]:
        """A variant's admission run, its outputs poisoned (``measure_candidate``'s ``poison``): a launch
        that leaves its output to an earlier one fails here, and the agent hears why. ``value``: its
        place in the admission lane (``ADMIT_ORDER``)."""
        build = self.build(variant, self.variant_candidate(variant))
        return self.submit(self.job(JobKind.VERIFY, build, runs=runs, reference=self.state.reference, label=label,
                                    value=value, args={"poison": True}))

    # The checks' ``value``: what their candidate may gain the study (``Job.value``, ``Gate.gain``).
    def sanitize(self, variant: Target | None, tools: tuple[str, ...], timeout: float,
                 timeouts: dict[str, float] | None, label: str = "", value: float = 0.0,
                 kernels: tuple[str, ...] = (), launches: int | None = None) -> Future[JobResult]:
        build = self.build() if variant is None else self.build(variant, self.variant_candidate(variant))
        return self.submit(self.job(JobKind.SANITIZE, build, label=label, value=value,
                                    args={"tools": tools, "timeout": timeout, "timeouts": timeouts,
                                          "kernels": kernels, "launches": launches}))

    def review(self, candidate: Candidate, label: str = "", value: float = 0.0,
               timeout: float | None = None) -> Future[JobResult]:
        """A candidate far faster than the baseline, run again against it on fresh seeds."""
        build = self.build(self.state.source_of(candidate)[0], candidate)
        return self.submit(self.job(JobKind.REVIEW, build, self.build(), label=label, value=value,
                                    args={"timeout": timeout}))

    def profile(self, candidate: Candidate | None, metrics: tuple[str, ...], timeout: float,
                launches: int | None, priority: int | None = ANALYSTS_PROFILE, label: str = "") -> Future[JobResult]:
        source = self.state.source_of(candidate)[0] if candidate else None
        return self.submit(self.job(JobKind.PROFILE, self.build(source, candidate), priority=priority, label=label,
                                    args={"metrics": metrics, "timeout": timeout, "launches": launches}))
