"""Jobs: every unit of work a measuring worker does, in one prioritised queue per device type.

    Job(kind, study, builds) ─► compile (CPU tasks, a build cache) ─► ready queue of its device
        type, by (priority, submission order) ─► a free worker of that type ─► JobResult

Two lanes (``Lane``): short measurements, and long checks that get at most a share of the workers'
time while measurements wait, so that a study's search never waits behind another's checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import ray

from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, DeviceInfo, Measurement, Status
from cluster.measure.measure import Baseline


class JobKind(StrEnum):
    BASELINE = "baseline"  # measure: the reference outputs and time of a study
    VERIFY = "verify"  # measure: an agent's variant against the baseline's outputs
    SANITIZE = "sanitize"  # compute-sanitizer tools on a build
    SEARCH = "search"  # measure: a candidate the sampler asked for
    FINAL = "final"  # measure: the best few again, on fresh seeds, for the selection
    REFERENCE = "reference"  # measure: the baseline's outputs on the finals' seeds it has not run (no row)
    REVIEW = "review"  # a suspiciously fast candidate against the baseline on fresh seeds
    PROFILE = "profile"  # Nsight Compute
    EVALUATE = "evaluate"  # measure: a configuration tuned elsewhere


# Four lanes per device type (issue 25). The critical lane goes first, always: baselines (every
# study waits for its own), finals (a study's result), the finals' references, evaluations. The other
# three share the workers by weighted fair queueing (``WEIGHT``): the search; the agents' admission
# runs (one run of a variant: they unlock its search); the long checks (Nsight Compute,
# compute-sanitizer, the fresh-seed reviews), the analysts' baseline profile first
# and the winners' profiles last. So no long check holds every study's search behind it (with one
# queue, one GPU measured no search candidate for minutes while compute-sanitizer and the cheat
# checks ran back to back), and neither do a study's dozens of admissions (with the admissions ahead
# of the search in one lane, an H100 measured no search candidate of eight programs in ten
# minutes). Within a lane, the studies take turns (``Job.turn``). A study waiting for its checks
# before its finals has them promoted (``URGENT``: first in any lane).
class Lane(StrEnum):
    CRITICAL = "critical"
    SEARCH = "search"
    ADMIT = "admit"
    CHECK = "check"


LANE = {JobKind.BASELINE: Lane.CRITICAL, JobKind.FINAL: Lane.CRITICAL, JobKind.REFERENCE: Lane.CRITICAL,
        JobKind.EVALUATE: Lane.CRITICAL, JobKind.SEARCH: Lane.SEARCH, JobKind.VERIFY: Lane.ADMIT,
        JobKind.SANITIZE: Lane.CHECK, JobKind.REVIEW: Lane.CHECK,
        JobKind.PROFILE: Lane.CHECK}
# Shares of the workers' time, lanes with work. The admissions are the variants' first measurements,
# beside the variants' own share of the search (``StudyState``): on an H200 at 0.4 and 0.3, eight
# public programs of 3-4 s a run had a quarter of a 300 s sweep in admission runs and a third in
# the search, and their flags' wins went unfound.
WEIGHT = {Lane.SEARCH: 0.5, Lane.ADMIT: 0.2, Lane.CHECK: 0.3}
PRIORITY = {JobKind.BASELINE: 0, JobKind.FINAL: 1, JobKind.REFERENCE: 1, JobKind.EVALUATE: 1, JobKind.SEARCH: 1,
            JobKind.VERIFY: 1, JobKind.SANITIZE: 1, JobKind.REVIEW: 1, JobKind.PROFILE: 2}
ANALYSTS_PROFILE = 0  # the priority of the analysts' baseline profile in the check lane: experts wait for it
URGENT = -1  # a job whose study waits for it to go on (a check before its finals; a requeued suspect)
CHECK_SHARE = WEIGHT[Lane.CHECK]  # while other work waits, at most this share of the workers runs checks


# The worker method that does each kind (cluster.engine.scheduling.workers.MeasureWorker).
METHOD = {JobKind.SANITIZE: "sanitize", JobKind.REVIEW: "reverify",
          JobKind.PROFILE: "profile"}
MEASURES = frozenset({JobKind.BASELINE, JobKind.VERIFY, JobKind.SEARCH, JobKind.FINAL, JobKind.REFERENCE,
                      JobKind.EVALUATE})
_sequence = itertools.count()


@dataclass(frozen=True)
class Build:
    """One build a job needs: the sources (a target or an agent's variant) and the candidate."""

    target: Target
    target_ref: ray.ObjectRef
    candidate: Candidate


@dataclass(frozen=True)
class BaselineBuild:
    """A study's baseline build in the object store, handed to each of its measurements: a worker
    fetches it only to run the baseline beside a candidate whose claimed time the clock does not
    bear out (``cluster.measure.measure.beside``)."""

    target_ref: ray.ObjectRef
    candidate: Candidate
    binary_ref: ray.ObjectRef

    def fetch(self) -> Baseline:
        return Baseline(ray.get(self.target_ref), self.candidate, ray.get(self.binary_ref))


@dataclass(eq=False)
class Job:
    """A unit of worker time. ``builds[0]`` is what the job is about; a cheat check or a review
    also needs the baseline's build (``builds[1]``). ``args`` are the worker method's own."""

    kind: JobKind
    study: str
    workers: Sequence[int]  # the actors that may run it: its device type's
    device: DeviceInfo  # a representative device, for rows of jobs that never reach one
    builds: tuple[Build, ...]
    runs: int = 1
    first_seed: int = 0
    reference: ray.ObjectRef | None = None  # None for a baseline: it makes the reference
    reusable: bool = False  # may take the measurement of a build already measured the same way
    baseline: BaselineBuild | None = None  # a measurement's: the baseline to time beside it if need be
    args: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None  # default: PRIORITY[kind]
    # What finishing it may gain its study (a check: the speedup its candidate would bring over the
    # study's best that needs none, ``Gate.gain``): within a priority, the most valuable first.
    value: float = 0.0
    label: str = ""  # what it is about, for the log: "memcheck, racecheck on unroll kernel.cu:12"
    future: Future[JobResult] | None = None  # for a thread waiting on it (the agents' stage)
    # Filled in as it moves along:
    seq: int = field(default_factory=lambda: next(_sequence))
    turn: int = 0  # its study's how-manieth job in its lane: the studies take turns
    attempts: int = 0  # times its worker died while it ran alone there
    suspect: bool = False  # its worker died with it in flight: it runs alone from now on
    alone: bool = False  # dispatched with nothing else on its worker
    artifacts: list[BuildArtifact] = field(default_factory=list)
    binary_refs: list[ray.ObjectRef] = field(default_factory=list)
    worker: int | None = None
    submitted_at: float = 0.0
    compiled_at: float = 0.0
    dispatched_at: float = 0.0
    service_s: float = 0.0  # its worker's time on it (not its wait behind another job there)

    @property
    def candidate(self) -> Candidate:
        return self.builds[0].candidate

    @property
    def target(self) -> Target:
        return self.builds[0].target

    @property
    def device_type(self) -> str:
        return self.device.device_type

    @property
    def rank(self) -> tuple[float, ...]:
        """(priority, -value, turn, seq): the heaps' order."""
        return (PRIORITY[self.kind] if self.priority is None else self.priority, -self.value, self.turn, self.seq)

    @property
    def lane(self) -> Lane:
        return LANE[self.kind]

    def describe(self) -> str:
        """One line for the log: the kind, the study and what it is about."""
        return f"{self.kind.value} of {self.study}" + (f" ({self.label})" if self.label else "")


@dataclass(frozen=True)
class JobResult:
    """What became of a job: its build and what the worker returned (a ``Measurement`` for the
    measuring kinds), or ``failure`` when it never got that far or its worker was lost."""

    job: Job
    artifact: BuildArtifact
    value: Any = None
    failure: Status | None = None
    error: str = ""
    worker_s: float = 0.0  # from dispatch to the result: the worker's time on it

    @property
    def measurement(self) -> Measurement | None:
        return self.value if isinstance(self.value, Measurement) else None

    dropped: bool = False  # taken off its queue before it ran (the search closed): nothing to record

    @property
    def built(self) -> bool:
        return self.artifact.status is Status.OK
