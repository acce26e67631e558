"""The scheduler: compile ahead on every CPU, one ready queue per device type, every worker of a
type serving its queue by priority.

    submit(job) ─► builds (compile tasks; one per distinct build, cached) ─► ready[device type]
        ─► a free worker of that type (at most ``per_worker`` jobs each) ─► poll() ─► JobResult

Nothing here ends a sweep: a lost compile task, a dead worker or a lost node becomes a result
with a status. A worker that dies under a job is probed until Ray has restarted it (or declared
dead); the job goes back to the front of its queue, and a job that has taken down
``max_attempts`` workers is quarantined. Jobs may be submitted from other threads (the agents'
stage): ``submit_threadsafe`` returns a future that the driver completes.
"""

from __future__ import annotations

import heapq
import math
import queue
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

from cluster.core.types import BuildArtifact, DeviceInfo, Measurement, Status
from cluster.engine.jobs import MEASURES, METHOD, Build, Job, JobKind, JobResult
from cluster.engine.workers import compile_task

BUILD_CACHE = 512  # builds whose binaries stay in the object store for later jobs (finals, profiles)
EMA = 0.2  # weight of the newest compile or run time in the look-ahead's estimates
LOOKAHEAD_SPARE = 1.25  # compiles in flight beyond what the workers finish during one, for its spread


class Scheduler:
    def __init__(self, workers: Sequence[ray.actor.ActorHandle], devices: Sequence[DeviceInfo],
                 per_worker: int, cpu_slots: int, max_attempts: int = 3, probe_timeout_s: float = 300.0,
                 reuse: Callable[[Job, BuildArtifact], Measurement | None] | None = None,
                 compile: Callable[[ray.ObjectRef, Any], tuple[ray.ObjectRef, ray.ObjectRef]] | None = None) -> None:
        """``compile``: submits a build, returning its (artifact, binary) refs (default: the
        compile task; a simulation passes its own)."""
        self.workers, self.per_worker, self.cpu_slots = list(workers), per_worker, max(1, cpu_slots)
        self.worker_type = [d.device_type for d in devices]
        self.max_attempts, self.probe_timeout_s = max_attempts, probe_timeout_s
        self.reuse = reuse or (lambda job, artifact: None)
        self.compile = compile or compile_task.remote
        self.load = [0] * len(self.workers)
        self.alive = [True] * len(self.workers)
        self.dead: set[int] = set()
        self.isolated: set[int] = set()  # workers running a suspect job alone
        self.probes: dict[ray.ObjectRef, tuple[int, float]] = {}
        self.ready: dict[str, list[tuple[tuple[int, int], Job]]] = defaultdict(list)
        self.running: dict[ray.ObjectRef, Job] = {}
        self.compiling: dict[ray.ObjectRef, str] = {}  # artifact ref -> build key
        self.builds: OrderedDict[str, tuple[ray.ObjectRef, ray.ObjectRef]] = OrderedDict()
        self.artifacts: OrderedDict[str, BuildArtifact] = OrderedDict()
        self.waiting: dict[str, list[Job]] = defaultdict(list)  # build key -> jobs waiting for it
        self.finished: list[JobResult] = []
        self.inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.counts: dict[tuple[str, JobKind], int] = defaultdict(int)  # jobs not yet finished
        self.compile_s: dict[str, float] = {}  # per device type, running averages for the look-ahead
        self.run_s: dict[str, float] = {}
        self._turn = 0

    # -- submitting ------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Start ``job``'s builds (or take them from the cache); it queues once they are in."""
        job.submitted_at = time.time()
        self.counts[(job.device_type, job.kind)] += 1
        for build in job.builds:
            self._build(build)
        self._check_built(job)

    def submit_threadsafe(self, job: Job) -> Future[JobResult]:
        """From another thread: the job is submitted at the next poll; the future gets its result."""
        job.future = Future()
        self.inbox.put(job)
        return job.future

    def build_refs(self, build: Build) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        """(artifact, binary) refs of a build, compiled once while cached."""
        return self._build(build)

    def _build(self, build: Build) -> tuple[ray.ObjectRef, ray.ObjectRef]:
        key = build.candidate.key
        if key in self.builds:
            self.builds.move_to_end(key)
            return self.builds[key]
        refs = self.compile(build.target_ref, build.candidate)
        self.builds[key] = refs
        self.compiling[refs[0]] = key
        while len(self.builds) > BUILD_CACHE:
            old, _ = self.builds.popitem(last=False)
            self.artifacts.pop(old, None)
        return refs

    def _check_built(self, job: Job) -> None:
        keys = [b.candidate.key for b in job.builds]
        missing = [k for k in keys if k not in self.artifacts]
        if missing:
            if job not in self.waiting[missing[0]]:
                self.waiting[missing[0]].append(job)
            return
        job.artifacts = [self.artifacts[k] for k in keys]
        job.binary_refs = [self.builds[k][1] if k in self.builds else self._build(b)[1]
                           for k, b in zip(keys, job.builds, strict=True)]
        job.compiled_at = time.time()
        main = job.artifacts[0]
        if main.status is not Status.OK:
            self._finish(JobResult(job, main))
            return
        if any(a.status is not Status.OK for a in job.artifacts[1:]):
            self._finish(JobResult(job, main, failure=Status.COMPILE_ERROR,
                                   error="the baseline it is checked against did not build"))
            return
        if job.reusable and job.kind in MEASURES:
            reused = self.reuse(job, main)
            if reused is not None:
                self._finish(JobResult(job, main, reused))
                return
        heapq.heappush(self.ready[job.device_type], (job.rank, job))

    # -- the loop --------------------------------------------------------------------------------
    def idle(self) -> bool:
        return not (self.compiling or self.running or self.finished or any(self.ready.values())
                    or not self.inbox.empty() or any(self.waiting.values()))

    def in_flight(self, device_type: str, kind: JobKind) -> int:
        """Jobs of this kind and device type submitted and not yet finished."""
        return self.counts[(device_type, kind)]

    def poll(self, timeout: float) -> list[JobResult]:
        """Advance every stage; return the jobs that finished since the last poll."""
        while not self.inbox.empty():
            self.submit(self.inbox.get())
        refs = [*self.compiling, *self.running, *self.probes]
        if refs and not self.finished:
            ray.wait(refs, num_returns=1, timeout=timeout)
        elif not refs and not self.finished:
            time.sleep(min(timeout, 0.01))
        if refs:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                # Each ref is fetched alone, so that one lost task fails only its own jobs.
                if ref in self.compiling:
                    self._compiled(ref)
                elif ref in self.running:
                    self._ran(self.running.pop(ref), ref)
                else:
                    self._probed(ref)
        self._expire_probes()
        self._dispatch()
        finished, self.finished = self.finished, []
        return finished

    def _compiled(self, ref: ray.ObjectRef) -> None:
        key = self.compiling.pop(ref)
        try:
            artifact: BuildArtifact = ray.get(ref)
        except RayError as exc:
            artifact = BuildArtifact(key, Status.COMPILE_ERROR, error_tail=f"compile task lost: {exc}"[-4096:])
            self.builds.pop(key, None)  # not cached: a later job compiles it again
        self.artifacts[key] = artifact
        for job in self.waiting.pop(key, []):
            self._check_built(job)

    def _ran(self, job: Job, ref: ray.ObjectRef) -> None:
        assert job.worker is not None
        self.load[job.worker] -= 1
        if job.alone:
            self.isolated.discard(job.worker)
        worker_s = time.time() - job.dispatched_at
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            self._worker_failed(job.worker)
            # A job queued behind the one that killed the worker dies with it: only a death while
            # it ran alone counts; until then it runs alone (``suspect``), so the culprit shows.
            job.attempts += job.alone
            job.suspect = True
            if job.attempts < self.max_attempts:
                heapq.heappush(self.ready[job.device_type], ((-1, job.seq), job))  # first, on a live worker
                return
            self._finish(JobResult(job, job.artifacts[0], failure=Status.QUARANTINED,
                                   error=f"quarantined: its measuring worker died {job.attempts} times: {exc}"[-4096:]))
            return
        except RayError as exc:
            self._finish(JobResult(job, job.artifacts[0], failure=Status.WORKER_LOST,
                                   error=f"lost: {exc}"[-4096:]))
            return
        if job.kind is JobKind.SEARCH:
            self._learn(job, value, worker_s)
        self._finish(JobResult(job, job.artifacts[0], value, worker_s=worker_s))

    def _learn(self, job: Job, value: Any, worker_s: float) -> None:
        """The look-ahead's inputs, from a search job done: the actor's own time on it (dispatch to
        result also counts its wait behind the job before it on the actor, which with two a worker
        halved the look-ahead), and the compile's time in the pipeline (asked to compiled: the
        task's start and its wait for a CPU too, not only the compiler's own time)."""
        actor_s = value.finished_at - value.started_at if isinstance(value, Measurement) else 0.0
        self._average(self.run_s, job.device_type, actor_s if actor_s > 0 else worker_s)
        self._average(self.compile_s, job.device_type, max(job.compiled_at - job.submitted_at,
                                                           job.artifacts[0].compile_s))

    def _finish(self, result: JobResult) -> None:
        self.counts[(result.job.device_type, result.job.kind)] -= 1
        self.finished.append(result)

    @staticmethod
    def _average(averages: dict[str, float], key: str, value: float) -> None:
        averages[key] = value if key not in averages else (1 - EMA) * averages[key] + EMA * value

    # -- workers ---------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        for heap in self.ready.values():
            while heap:
                job = heap[0][1]
                if all(w in self.dead for w in job.workers):
                    heapq.heappop(heap)
                    self._finish(JobResult(job, job.artifacts[0], failure=Status.WORKER_LOST,
                                           error="every measuring worker of this device type is gone"))
                    continue
                free = [w for w in job.workers if self.alive[w] and self.load[w] < self.per_worker
                        and w not in self.isolated and (not job.suspect or self.load[w] == 0)]
                if not free:
                    break
                heapq.heappop(heap)
                # Least loaded first; among equals, round robin, so every worker (and node) takes a share.
                worker = min(free, key=lambda w: (self.load[w], (w - self._turn) % len(self.workers)))
                self._turn = worker + 1
                self.load[worker] += 1
                job.worker, job.dispatched_at, job.alone = worker, time.time(), job.suspect
                if job.suspect:
                    self.isolated.add(worker)
                self.running[self._call(self.workers[worker], job)] = job

    def _call(self, worker: ray.actor.ActorHandle, job: Job) -> ray.ObjectRef:
        main, binary = job.builds[0], job.binary_refs[0]
        if job.kind in MEASURES:
            return worker.measure.remote(main.target_ref, main.candidate, binary, job.reference, job.runs,
                                         job.compiled_at, job.first_seed, job.args.get("stop_above"),
                                         job.args.get("max_samples"), job.args.get("telemetry", True))
        method = getattr(worker, METHOD[job.kind])
        if job.kind in (JobKind.GUARD, JobKind.REVIEW):  # against the baseline's build
            base = job.builds[1]
            if job.kind is JobKind.GUARD:
                return method.remote(base.target_ref, job.binary_refs[1], binary, job.args["files"])
            return method.remote(base.target_ref, main.target_ref, job.binary_refs[1], binary)
        return method.remote(main.target_ref, main.candidate, binary, **job.args)

    def _worker_failed(self, worker: int) -> None:
        if self.alive[worker]:
            self.alive[worker] = False
            self.probes[self.workers[worker].device_info.remote()] = (worker, time.monotonic() + self.probe_timeout_s)

    def _probed(self, ref: ray.ObjectRef) -> None:
        worker, deadline = self.probes.pop(ref)
        try:
            ray.get(ref)
            self.alive[worker] = True  # restarted by Ray: back in service
        except ActorUnavailableError:
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

    # -- look-ahead ------------------------------------------------------------------------------
    def workers_of(self, device_type: str) -> list[int]:
        return [i for i, t in enumerate(self.worker_type) if t == device_type and i not in self.dead]

    def lookahead(self, device_type: str) -> int:
        """Search jobs to keep in flight for a device type so that no worker waits for a compile:
        every slot filled, plus what the workers finish while one compile runs (from the compile
        and run times seen so far), within the CPUs that compile."""
        workers = len(self.workers_of(device_type))
        if not workers:
            return 0
        slots = workers * self.per_worker
        compile_s, run_s = self.compile_s.get(device_type), self.run_s.get(device_type)
        if compile_s is None or run_s is None:
            return slots + min(self.cpu_slots, max(workers, 2))
        during_compile = math.ceil(LOOKAHEAD_SPARE * workers * compile_s / max(run_s, 1e-3)) + 1
        return slots + min(self.cpu_slots, max(during_compile, workers))
