"""The scheduler: compile ahead on every CPU, four ready queues (lanes) per device type, every
worker of a type serving them by priority and a fair share of its time.

    submit(job) ─► builds (compile tasks; one per distinct build, cached) ─► ready[device type, lane]
        ─► a free worker of that type (at most ``per_worker`` jobs each; a check only to an idle
           one, and nothing queued behind a check) ─► poll() ─► JobResult

The critical lane (baselines, finals) goes first. The search, admission and check lanes share the
workers by weighted fair queueing (``jobs.WEIGHT``): each lane's virtual time grows by the
worker-seconds its jobs take over its weight, and a free worker serves the lane with work that is
furthest behind; a lane that had no work comes back at the others' virtual time, so that idleness
earns no credit. While other work waits, at most the check lane's share of a type's workers run
checks at once (at least one); while a baseline of the type is still to come (compiling or
queued), no check starts. An ``URGENT`` job goes first in any lane. Within a lane and priority, the
job of most ``value`` goes first (a check: what its candidate may gain, so that the largest wins are
confirmed first when time is short), then the studies take turns: each job's ``turn`` is its
study's count of jobs in that lane. The search lane's turns go by time instead: its next job is
the study's whose share of the shared lanes' time so far (search, admissions and checks, finished
and running: ``used``) is least, so that what a study's agents cost comes out of its own share; a
study with nothing for the agents to do searches as it would with them off. Except that a study
whose search count is under ``STARVED`` of the median study's of its type goes first while its search's
time is at most ``STARVED_TIME`` times the others' mean (``starved``):
on an H200 (300 s, eight public programs, agents on) time alone left pb_3mm, whose admissions and
checks had spent its share, 2 search candidates where the others had 9-17.

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
import statistics
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

from cluster.core.types import BuildArtifact, DeviceInfo, Measurement, Status
from cluster.engine.scheduling.jobs import LANE, MEASURES, METHOD, URGENT, WEIGHT, Build, Job, JobKind, JobResult, Lane
from cluster.engine.scheduling.workers import compile_task

CRITICAL_KINDS = frozenset(kind for kind, lane in LANE.items() if lane is Lane.CRITICAL)
FIRST_SEARCH_HOLD_S = 60.0  # at most this long the check lane waits for a study's first search candidate
BUILD_CACHE = 512  # builds whose binaries stay in the object store for later jobs (finals, profiles)
EMA = 0.2  # weight of the newest compile or run time in the look-ahead's estimates
STARVED = 0.5  # a study's search count under this share of the median study's goes first ...
STARVED_TIME = 2.0  # ... while its search's time is at most this many times the others' mean
LOOKAHEAD_SPARE = 1.25  # compiles in flight beyond what the workers finish during one, for its spread


class Scheduler:
    def __init__(self, workers: Sequence[ray.actor.ActorHandle], devices: Sequence[DeviceInfo],
                 per_worker: int, cpu_slots: int, max_attempts: int = 3, probe_timeout_s: float = 300.0,
                 reuse: Callable[[Job, BuildArtifact], Measurement | None] | None = None,
                 compile: Callable[[ray.ObjectRef, Any], tuple[ray.ObjectRef, ray.ObjectRef]] | None = None,
                 weights: dict[Lane, float] | None = None) -> None:
        """``compile``: submits a build, returning its (artifact, binary) refs (default: the
        compile task; a simulation passes its own). ``weights``: the shared lanes' (``jobs.WEIGHT``)."""
        self.workers, self.per_worker, self.cpu_slots = list(workers), per_worker, max(1, cpu_slots)
        self.worker_type = [d.device_type for d in devices]
        self.worker_ids = [d.worker_id or d.uuid or str(i) for i, d in enumerate(devices)]
        self.max_attempts, self.probe_timeout_s = max_attempts, probe_timeout_s
        self.reuse = reuse or (lambda job, artifact: None)
        self.compile = compile or compile_task.remote
        self.load = [0] * len(self.workers)
        self.alive = [True] * len(self.workers)
        self.dead: set[int] = set()
        self.isolated: set[int] = set()  # workers running a suspect job alone
        self.probes: dict[ray.ObjectRef, tuple[int, float]] = {}
        self.ready: dict[tuple[str, Lane], list[tuple[tuple[float, ...], Job]]] = defaultdict(list)
        self.vtime: dict[tuple[str, Lane], float] = defaultdict(float)  # fair queueing of the lanes
        self.on_worker: list[list[Job]] = [[] for _ in self.workers]  # dispatched, in order: the first runs
        self.last_done = [0.0] * len(self.workers)  # when each worker finished its last job
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
        self.closed = False
        self.weight = dict(weights or WEIGHT)
        self.turns: dict[tuple[str, Lane, str], int] = defaultdict(int)
        self.spent: dict[str, float] = defaultdict(float)  # per study, its finished jobs' time in the shared lanes
        self.search_spent: dict[str, float] = defaultdict(float)  # ... and of that, its search jobs' alone
        self.search_s: dict[str, float] = {}  # per study, the running average of its search jobs' time
        # Studies whose first search job is submitted and not yet done: (device type, when submitted).
        # The check lane waits for them (FIRST_SEARCH_HOLD_S at most): a long check (Nsight Compute on
        # a baseline, 62 s on an H100) on the only worker held every study's first search behind it.
        self.first_search: dict[str, tuple[str, float]] = {}
        self.searched: set[str] = set()

    # -- submitting ------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Start ``job``'s builds (or take them from the cache); it queues once they are in (once
        the sweep has ended: its future, if it has one, fails at once)."""
        if self.closed:
            if job.future is not None and not job.future.done():
                job.future.set_result(_ended(job))
            return
        job.submitted_at = time.time()
        self.counts[(job.device_type, job.kind)] += 1
        if job.kind is JobKind.SEARCH and job.study not in self.searched:
            self.first_search.setdefault(job.study, (job.device_type, job.submitted_at))
        for build in job.builds:
            self._build(build)
        self._check_built(job)

    def submit_threadsafe(self, job: Job) -> Future[JobResult]:
        """From another thread: the job is submitted at the next poll; the future gets its result
        (at once a failure, once the sweep has ended: ``close``)."""
        job.future = Future()
        if self.closed:
            job.future.set_result(_ended(job))
        else:
            self.inbox.put(job)
        return job.future

    def drop(self, study: str, kinds: frozenset[JobKind]) -> int:
        """Take ``study``'s jobs of ``kinds`` that no worker has yet off the queues; each comes back
        from ``poll`` as a dropped result. Returns how many."""
        gone: list[Job] = []
        for heap in self.ready.values():
            mine = [entry for entry in heap if entry[1].study == study and entry[1].kind in kinds]
            if mine:
                heap[:] = [entry for entry in heap if entry not in mine]
                heapq.heapify(heap)
                gone += [job for _, job in mine]
        for key, jobs in self.waiting.items():
            mine = [job for job in jobs if job.study == study and job.kind in kinds]
            if mine:
                self.waiting[key] = [job for job in jobs if job not in mine]
                gone += mine
        for job in gone:
            artifact = job.artifacts[0] if job.artifacts else BuildArtifact(job.candidate.key, Status.OK)
            self._finish(JobResult(job, artifact, dropped=True))
        return len(gone)

    def close(self) -> list[Job]:
        """The sweep has ended: every job not done fails (a thread waiting on one goes on), later
        submissions fail at once. Returns the jobs that were still on a worker."""
        self.closed = True
        left: list[Job] = []
        while not self.inbox.empty():
            left.append(self.inbox.get())
        left += [job for heap in self.ready.values() for _, job in heap]
        left += [job for jobs in self.waiting.values() for job in jobs]
        on_workers = list(self.running.values())
        for job in [*left, *on_workers]:
            if job.future is not None and not job.future.done():
                job.future.set_result(_ended(job))
        return on_workers

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
        self._push(job)

    def _push(self, job: Job, rank: tuple[float, ...] | None = None) -> None:
        key = (job.device_type, job.lane)
        if rank is None:
            job.turn = self.turns[(job.device_type, job.lane, job.study)]
            self.turns[(job.device_type, job.lane, job.study)] += 1
            rank = job.rank
        if job.lane in self.weight and not self.ready[key] and not self._running_in(key):
            busy = [self.vtime[(job.device_type, lane)] for lane in self.weight
                    if lane is not job.lane and (self.ready[(job.device_type, lane)]
                                                 or self._running_in((job.device_type, lane)))]
            if busy:  # back from idle: no credit for the time it had nothing to do
                self.vtime[key] = max(self.vtime[key], min(busy))
        heapq.heappush(self.ready[key], (rank, job))

    def _running_in(self, key: tuple[str, Lane]) -> int:
        return sum(1 for job in self.running.values() if (job.device_type, job.lane) == key)

    def promote(self, study: str, kinds: frozenset[JobKind] | None = None) -> None:
        """Make ``study``'s queued jobs (of ``kinds``, default all) urgent: it waits for them to go on."""
        for heap in self.ready.values():
            mine = [i for i, (_, job) in enumerate(heap) if job.study == study and (kinds is None or job.kind in kinds)]
            for index in mine:
                rank, job = heap[index]
                job.priority = URGENT
                heap[index] = ((URGENT, *rank[1:]), job)
            if mine:
                heapq.heapify(heap)

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
        now = time.time()
        worker_s = now - job.dispatched_at
        job.service_s = now - self.service_start(job)  # a measurement's own clock, below, where there is one
        if job.lane in self.weight:
            self.vtime[(job.device_type, job.lane)] += job.service_s / self.weight[job.lane]
            self.spent[job.study] += job.service_s
            if job.lane is Lane.SEARCH:
                self.search_spent[job.study] += job.service_s
        if job in self.on_worker[job.worker]:
            self.on_worker[job.worker].remove(job)
        self.last_done[job.worker] = now
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            self._worker_failed(job.worker)
            # A job queued behind the one that killed the worker dies with it: only a death while
            # it ran alone counts; until then it runs alone (``suspect``), so the culprit shows.
            job.attempts += job.alone
            job.suspect = True
            if job.attempts < self.max_attempts:
                self._push(job, (URGENT, -job.value, 0, job.seq))  # first, on a live worker
                return
            self._finish(JobResult(job, job.artifacts[0], failure=Status.QUARANTINED,
                                   error=f"quarantined: its measuring worker died {job.attempts} times: {exc}"[-4096:]))
            return
        except RayError as exc:
            self._finish(JobResult(job, job.artifacts[0], failure=Status.WORKER_LOST, error=raised(exc)[-4096:]))
            return
        if isinstance(value, Measurement) and value.finished_at > value.started_at > 0:
            job.service_s = value.finished_at - value.started_at
        if job.kind is JobKind.SEARCH:
            self._learn(job, value, worker_s)
        self._finish(JobResult(job, job.artifacts[0], value, worker_s=worker_s))

    def _learn(self, job: Job, value: Any, worker_s: float) -> None:
        """The look-ahead's inputs, from a search job done: the actor's own time on it (dispatch to
        result also counts its wait behind the job before it on the actor, which with two a worker
        halved the look-ahead), and the compile's time in the pipeline (asked to compiled: the
        task's start and its wait for a CPU too, not only the compiler's own time)."""
        actor_s = value.finished_at - value.started_at if isinstance(value, Measurement) else 0.0
        run_s = actor_s if actor_s > 0 else worker_s
        self._average(self.run_s, job.device_type, run_s)
        self._average(self.search_s, job.study, run_s)
        self._average(self.compile_s, job.device_type, max(job.compiled_at - job.submitted_at,
                                                           job.artifacts[0].compile_s))

    def _finish(self, result: JobResult) -> None:
        self.counts[(result.job.device_type, result.job.kind)] -= 1
        if result.job.kind is JobKind.SEARCH:
            self.searched.add(result.job.study)
            self.first_search.pop(result.job.study, None)
        self.finished.append(result)

    @staticmethod
    def _average(averages: dict[str, float], key: str, value: float) -> None:
        averages[key] = value if key not in averages else (1 - EMA) * averages[key] + EMA * value

    # -- workers ---------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        for device_type in {t for t, _ in self.ready}:
            while (job := self._next(device_type)) is not None:
                self._take(device_type, job)
                if all(w in self.dead for w in job.workers):
                    self._finish(JobResult(job, job.artifacts[0], failure=Status.WORKER_LOST,
                                           error="every measuring worker of this device type is gone"))
                    continue
                free = self._free(job)
                # Least loaded first; among equals, the one whose current job has run the shortest
                # (a job that has run long tends to run longer: a short job is not queued behind it),
                # then round robin, so every worker (and node) takes a share.
                now = time.time()
                worker = min(free, key=lambda w: (self.load[w], self._head_elapsed(w, now),
                                                  (w - self._turn) % len(self.workers)))
                self._turn = worker + 1
                self.load[worker] += 1
                job.worker, job.dispatched_at, job.alone = worker, time.time(), job.suspect
                self.on_worker[worker].append(job)
                if job.suspect:
                    self.isolated.add(worker)
                self.running[self._call(self.workers[worker], job)] = job

    def _head_elapsed(self, worker: int, now: float) -> float:
        queue = self.on_worker[worker]
        return now - self.service_start(queue[0]) if queue else 0.0

    def _free(self, job: Job) -> list[int]:
        return [w for w in job.workers if self.alive[w] and self.load[w] < self.per_worker
                and w not in self.isolated and (not job.suspect or self.load[w] == 0) and self._beside(job, w)]

    def _beside(self, job: Job, worker: int) -> bool:
        """A check or profile (the long jobs) goes only to a worker with nothing on it, and nothing
        queues on a worker behind one: with two jobs an actor, a check queued behind a search job,
        or a final behind a 72 s compute-sanitizer run, waited while another GPU was free."""
        if job.lane is Lane.CHECK:
            return self.load[worker] == 0
        return not any(queued.lane is Lane.CHECK for queued in self.on_worker[worker])

    def _next(self, device_type: str) -> Job | None:
        """The job a free worker of this type takes next, or None: an urgent one first, then the
        critical lane, else the shared lane furthest behind in virtual time (the check lane within
        its share of the workers while other work waits; no check, urgent or not, while a baseline
        or final of the type waits for a worker, nor before each study's first search candidate)."""
        ready = {lane: self._head(device_type, lane) for lane in Lane if self.ready.get((device_type, lane))}
        tops = {lane: top for lane, top in ready.items()
                if all(w in self.dead for w in top[1].workers) or self._free(top[1])}
        # A check waits for a worker with nothing on it; while the search keeps every worker busy
        # (two jobs an actor), none would ever be: a check whose turn it is has one drain for it.
        draining = Lane.CHECK in ready and Lane.CHECK not in tops and any(
            self.alive[w] for w in ready[Lane.CHECK][1].workers)
        if self._critical_waits(device_type):
            tops.pop(Lane.CHECK, None)  # baselines and finals first (compiling or queued), urgent checks too
            draining = False
        urgent = [top for top in tops.values() if top[0][0] == URGENT]
        if urgent:
            return min(urgent, key=lambda top: top[0])[1]
        if Lane.CRITICAL in tops:
            return tops[Lane.CRITICAL][1]
        if draining and ready[Lane.CHECK][0][0] == URGENT:
            return None  # a check its study's finals wait for: the next worker to drain takes it
        if self._first_search_waits(device_type):
            tops.pop(Lane.CHECK, None)  # then each study's first search candidate (compiling or queued)
            draining = False
        if Lane.CHECK in ready and self._checks_at_share(device_type):
            draining = False
            if len(tops) > 1:
                tops.pop(Lane.CHECK, None)
        if not tops:
            return None
        lane = min(tops, key=lambda lane: self._virtual(device_type, lane))
        if draining and self._virtual(device_type, Lane.CHECK) < self._virtual(device_type, lane):
            return None  # the check lane's turn: what is on the workers ends first, then the check goes
        return tops[lane][1]

    def _head(self, device_type: str, lane: Lane) -> tuple[tuple[float, ...], Job]:
        """A lane's next entry: its heap's top; in the search lane, among the entries of the top's
        priority and value, a study's first search candidate (one run: the search starts seconds
        after each baseline, whatever the study's agents took of its share before: on an H200 a
        program of 3.5 s runs waited 55 s behind its admission run and profile), then a starved
        study's, then the one of the study that has used least of the shared lanes' time. In the
        admission lane, the studies take turns by the admissions they have had, and a study's
        turn goes to its most valuable variant (``Job.value``: the level of its change)."""
        heap = self.ready[(device_type, lane)]
        if lane not in (Lane.SEARCH, Lane.ADMIT) or len(heap) == 1:
            return heap[0]
        if lane is Lane.ADMIT:
            top = heap[0][0][0]
            queued = Counter(entry[1].study for entry in heap)

            def had(study: str) -> int:
                return self.turns[(device_type, Lane.ADMIT, study)] - queued[study]

            return min((entry for entry in heap if entry[0][0] == top),
                       key=lambda entry: (had(entry[1].study), -entry[1].value, entry[0]))
        first = heap[0][0][:2]
        counts = {study: n for (kind, lane, study), n in self.turns.items()
                  if kind == device_type and lane is Lane.SEARCH}
        used = self.used()
        first_served = starved(counts, self.used(Lane.SEARCH))
        running = {job.study for job, _ in self.running_jobs() if job.kind is JobKind.SEARCH}
        waiting = set(self.first_search) - running  # a study's first search candidate, not its look-ahead
        return min((entry for entry in heap if entry[0][:2] == first),
                   key=lambda entry: (entry[1].study not in waiting, entry[1].study not in first_served,
                                      used[entry[1].study], entry[0]))

    def _take(self, device_type: str, job: Job) -> None:
        heap = self.ready[(device_type, job.lane)]
        if heap[0][1] is job:
            heapq.heappop(heap)
        else:
            heap[:] = [entry for entry in heap if entry[1] is not job]
            heapq.heapify(heap)

    def used(self, lane: Lane | None = None) -> defaultdict[str, float]:
        """Each study's worker seconds in the shared lanes (search, admissions, checks), or in the
        ``lane`` (the search's) alone: its finished jobs' and, for the time they have run so far,
        its running ones' (0 for a study with none)."""
        used = defaultdict(float, self.spent if lane is None else self.search_spent)
        for job, seconds in self.running_jobs():
            if job.lane in self.weight and lane in (None, job.lane):
                used[job.study] += seconds
        return used

    def search_cost(self, study: str, device_type: str) -> float:
        """What a search job of the study is expected to take: its own average, else its device
        type's, else a second."""
        return self.search_s.get(study) or self.run_s.get(device_type) or 1.0

    def _checks_at_share(self, device_type: str) -> bool:
        """Whether the type's workers run as many checks as the check lane's share allows (one at least)."""
        checking = sum(1 for j in self.running.values() if j.device_type == device_type and j.lane is Lane.CHECK)
        return checking >= max(1, math.floor(self.weight[Lane.CHECK] * len(self.workers_of(device_type))))

    def _critical_waits(self, device_type: str) -> bool:
        """Whether a critical job (a baseline, a final, a reference) of the type is submitted and not
        yet on a worker. A check started then holds it for as long as the check runs: on an H100 a
        117 s compute-sanitizer run of one study's baseline started while two studies' finals were
        compiling, and the public suite's time budget ended with seven studies before their finals."""
        submitted = sum(self.counts[(device_type, kind)] for kind in CRITICAL_KINDS)
        if not submitted:
            return False
        dispatched = sum(1 for job in self.running.values()
                         if job.device_type == device_type and job.kind in CRITICAL_KINDS)
        return submitted > dispatched

    def _first_search_waits(self, device_type: str) -> bool:
        now = time.time()
        return any(kind == device_type and now - since < FIRST_SEARCH_HOLD_S
                   for kind, since in self.first_search.values())

    def _virtual(self, device_type: str, lane: Lane) -> float:
        """A lane's virtual time, its jobs on the workers counted for the time they have run so far."""
        running = sum(seconds for job, seconds in self.running_jobs()
                      if job.device_type == device_type and job.lane is lane)
        return self.vtime[(device_type, lane)] + running / self.weight[lane]

    def service_start(self, job: Job) -> float:
        """When its worker started on it: jobs run one at a time on an actor, in dispatch order."""
        assert job.worker is not None
        return max(job.dispatched_at, self.last_done[job.worker])

    def worker_id(self, worker: int) -> str:
        return self.worker_ids[worker] if worker < len(self.worker_ids) else str(worker)

    def running_jobs(self) -> list[tuple[Job, float]]:
        """The job each worker runs now, and for how many seconds so far."""
        now = time.time()
        return [(queue[0], now - self.service_start(queue[0])) for queue in self.on_worker if queue]

    def _call(self, worker: ray.actor.ActorHandle, job: Job) -> ray.ObjectRef:
        main, binary = job.builds[0], job.binary_refs[0]
        if job.kind in MEASURES:
            # ``args``: the measurement's own keywords (stop_above, max_samples, telemetry, poison, ...)
            return worker.measure.remote(main.target_ref, main.candidate, binary, job.reference, job.runs,
                                         job.compiled_at, job.first_seed, baseline=job.baseline, **job.args)
        method = getattr(worker, METHOD[job.kind])
        if job.kind is JobKind.REVIEW:  # against the baseline's build
            base = job.builds[1]
            return method.remote(base.target_ref, main.target_ref, job.binary_refs[1], binary, job.args.get("timeout"))
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


def raised(exc: RayError) -> str:
    """What a job's call ended with: the worker's own exception and the last frame it passed
    (Ray's text of a RayTaskError opens with its banner, which a shortened detail kept alone),
    else Ray's own error."""
    cause = getattr(exc, "cause", None)
    if cause is None or cause is exc:
        return f"lost: {exc}"
    frames = [line.strip() for line in str(getattr(exc, "traceback_str", "")).splitlines()
              if line.strip().startswith("File ")]
    return f"raised {type(cause).__name__}: {cause}" + (f" ({frames[-1]})" if frames else "")


def starved(counts: dict[str, float], used: dict[str, float]) -> dict[str, float]:
    """The studies of a device type whose search is starved, each with the count it goes first
    until (``counts``: each study's search count, ``used``: its search jobs' time): a count under
    ``STARVED`` of the median study's, while its search's time is at most ``STARVED_TIME`` times the
    others' mean. They go before the studies that have used less time: so neither its agents' costs
    nor its slow runs leave a study a search of one or two, and a study of very slow runs (a minute
    a run) still takes no more than a few shares. The search's time alone: on an H200 (600 s,
    sixteen programs, agents on) softmax_rows' three compute-sanitizer runs of one variant (48 s)
    put its time in the shared lanes past twice the others' mean, and it searched 1 candidate to
    the others' 8-41 (23 with the agents off)."""
    if len(counts) < 2:
        return {}
    floor = STARVED * statistics.median(counts.values())
    total = sum(used.get(s, 0.0) for s in counts)

    def share(study: str) -> float:
        return STARVED_TIME * (total - used.get(study, 0.0)) / (len(counts) - 1)

    return {s: floor for s, n in counts.items() if n < floor and used.get(s, 0.0) <= share(s)}


def _ended(job: Job) -> JobResult:
    artifact = job.artifacts[0] if job.artifacts else BuildArtifact(job.candidate.key, Status.OK)
    return JobResult(job, artifact, failure=Status.WORKER_LOST, error="not run: the sweep ended first")
