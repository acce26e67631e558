"""The in-flight engine: compile tasks feed measuring actors, with bounded work in flight.

A job goes compile task -> (ready queue) -> a measuring actor of its device type -> done.
Compiles run as soon as they are submitted (Ray spreads them over the cluster's CPUs); each
actor holds at most ``per_worker`` measurements, so a queue of compiled binaries waits for the
GPU rather than the GPU for the compiler. Nothing here ends a sweep: a lost task or actor
becomes a status.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError, RayError

from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, DeviceInfo, Measurement, Status
from cluster.engine.workers import compile_task


@dataclass
class Job:
    target_ref: ray.ObjectRef  # the Target, put in the object store once per sweep
    target: Target
    candidate: Candidate
    workers: Sequence[int]  # indices of the actors that may measure it (its device type)
    device: DeviceInfo  # a representative device, for rows of jobs that never reach one
    runs: int
    reference: ray.ObjectRef | None  # None: this job is a baseline
    reusable: bool = True  # may take the measurement of an identical binary
    attempts: int = 0  # measurements lost with their worker so far
    artifact: BuildArtifact | None = None
    binary_ref: ray.ObjectRef | None = None
    worker: int | None = None
    compiled_at: float = 0.0


@dataclass(frozen=True)
class Done:
    job: Job
    artifact: BuildArtifact
    measurement: Measurement | None  # None when it never got as far as a run


@dataclass
class Pipeline:
    """Jobs in flight. A worker that dies mid-measurement is probed until it answers again (Ray
    restarts it) or is declared dead; its job is retried elsewhere, and a job that has taken down
    ``max_attempts`` workers is quarantined: a row, never a loop."""

    workers: Sequence[ray.actor.ActorHandle]
    per_worker: int
    # Returns the measurement of an identical binary already measured, if any.
    reuse: Callable[[Job, BuildArtifact], Measurement | None] = lambda job, artifact: None
    compiling: dict[ray.ObjectRef, Job] = field(default_factory=dict)
    ready: deque[Job] = field(default_factory=deque)
    measuring: dict[ray.ObjectRef, Job] = field(default_factory=dict)
    _finished: list[Done] = field(default_factory=list)
    max_attempts: int = 3
    probe_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        self.load = [0] * len(self.workers)
        self._turn = 0
        self.alive = [True] * len(self.workers)  # False: probing after a failure, or dead
        self.dead: set[int] = set()
        self.probes: dict[ray.ObjectRef, tuple[int, float]] = {}  # probe -> (worker, deadline)

    def submit(self, job: Job) -> None:
        summary_ref, binary_ref = compile_task.remote(job.target_ref, job.candidate)
        job.binary_ref = binary_ref
        self.compiling[summary_ref] = job

    def in_flight(self, workers: Sequence[int]) -> int:
        """Jobs not yet done that belong to this set of workers (one device type)."""
        wanted = set(workers)
        return sum(1 for job in self._jobs() if set(job.workers) == wanted)

    def idle(self) -> bool:
        return not (self.compiling or self.ready or self.measuring or self._finished)

    def poll(self, timeout: float) -> list[Done]:
        """Advance every stage; return the jobs that finished."""
        refs = [*self.compiling, *self.measuring, *self.probes]
        if refs and not self._finished:
            ray.wait(refs, num_returns=1, timeout=timeout)
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                # Each ref is fetched alone so that one lost task fails only its own job.
                if ref in self.compiling:
                    self._compiled(self.compiling.pop(ref), ref)
                elif ref in self.measuring:
                    self._measured(self.measuring.pop(ref), ref)
                else:
                    self._probed(ref)
        self._expire_probes()
        self._dispatch()
        finished, self._finished = self._finished, []
        return finished

    def _jobs(self) -> list[Job]:
        return [*self.compiling.values(), *self.ready, *self.measuring.values(),
                *(d.job for d in self._finished)]

    def _compiled(self, job: Job, ref: ray.ObjectRef) -> None:
        try:
            artifact: BuildArtifact = ray.get(ref)
        except RayError as exc:
            artifact = BuildArtifact(job.candidate.key, Status.COMPILE_ERROR,
                                     error_tail=f"compile task lost: {exc}"[-4096:])
        job.artifact, job.compiled_at = artifact, time.time()
        if artifact.status is not Status.OK:
            self._finished.append(Done(job, artifact, None))
            return
        reused = self.reuse(job, artifact) if job.reusable else None
        if reused is not None:
            self._finished.append(Done(job, artifact, reused))
        else:
            self.ready.append(job)

    def _measured(self, job: Job, ref: ray.ObjectRef) -> None:
        assert job.artifact is not None and job.worker is not None
        self.load[job.worker] -= 1
        try:
            measurement: Measurement = ray.get(ref)
        except RayActorError as exc:
            self._worker_failed(job.worker)
            job.attempts += 1
            if job.attempts < self.max_attempts:
                self.ready.appendleft(job)  # measured again, on whichever worker is alive first
                return
            measurement = self._lost(job, Status.QUARANTINED,
                                     f"quarantined: its measuring worker died {job.attempts} times: {exc}")
        except RayError as exc:
            measurement = self._lost(job, Status.WORKER_LOST, f"measurement lost: {exc}")
        self._finished.append(Done(job, job.artifact, measurement))

    def _lost(self, job: Job, status: Status, error: str) -> Measurement:
        return Measurement(job.candidate.key, status, job.device, error_tail=error[-4096:],
                           started_at=job.compiled_at, finished_at=time.time())

    def _worker_failed(self, worker: int) -> None:
        if self.alive[worker]:
            self.alive[worker] = False
            self.probes[self.workers[worker].device_info.remote()] = (worker, time.monotonic() + self.probe_timeout_s)

    def _probed(self, ref: ray.ObjectRef) -> None:
        worker, deadline = self.probes.pop(ref)
        try:
            ray.get(ref)
            self.alive[worker] = True  # restarted by Ray: back in service
        except ray.exceptions.ActorUnavailableError:
            # still restarting (a loaded node takes a while): ask again until the deadline
            self.probes[self.workers[worker].device_info.remote()] = (worker, deadline)
        except RayError:
            self.dead.add(worker)

    def _expire_probes(self) -> None:
        now = time.monotonic()
        for ref, (worker, deadline) in list(self.probes.items()):
            if now > deadline:  # a restart that never comes (its node is gone, no resources left)
                del self.probes[ref]
                self.dead.add(worker)

    def _dispatch(self) -> None:
        waiting: deque[Job] = deque()
        while self.ready:
            job = self.ready.popleft()
            if all(w in self.dead for w in job.workers):
                assert job.artifact is not None
                self._finished.append(Done(job, job.artifact, self._lost(
                    job, Status.WORKER_LOST, "every measuring worker of this device type is gone")))
                continue
            free = [w for w in job.workers if self.alive[w] and self.load[w] < self.per_worker]
            if not free:
                waiting.append(job)
                continue
            # Least loaded first; among equals, round robin, so every worker (and node) takes a share.
            worker = min(free, key=lambda w: (self.load[w], (w - self._turn) % len(self.workers)))
            self._turn = worker + 1
            self.load[worker] += 1
            job.worker = worker
            ref = self.workers[worker].measure.remote(job.target_ref, job.candidate, job.binary_ref,
                                                      job.reference, job.runs, job.compiled_at)
            self.measuring[ref] = job
        self.ready = waiting
