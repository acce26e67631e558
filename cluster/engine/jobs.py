"""Jobs: every unit of work a measuring worker does, in one prioritised queue per device type.

    Job(kind, study, builds) ─► compile (CPU tasks, a build cache) ─► ready queue of its device
        type, by (priority, submission order) ─► a free worker of that type ─► JobResult

A baseline comes first (every other job of its study waits for its outputs); then the agents'
checks, the search, the finals and reviews of every study in the order they came; last the
winners' profiles.
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


class JobKind(StrEnum):
    BASELINE = "baseline"  # measure: the reference outputs and time of a study
    VERIFY = "verify"  # measure: an agent's variant against the baseline's outputs
    SANITIZE = "sanitize"  # compute-sanitizer tools on a build
    GUARD = "guard"  # the cheat checks of a variant against the baseline
    SEARCH = "search"  # measure: a candidate the sampler asked for
    FINAL = "final"  # measure: the best few again, on fresh seeds, for the selection
    REVIEW = "review"  # a suspiciously fast candidate against the baseline on fresh seeds
    PROFILE = "profile"  # Nsight Compute
    EVALUATE = "evaluate"  # measure: a configuration tuned elsewhere


# Baselines first (every study waits for its own); then every study's work in the order it came
# (verification, search, finals, reviews): a study's search does not wait behind the agents' checks of
# another. With the search last (as until 2026-11-26), one GPU with the agents on measured no search
# candidate for 6 minutes of a 7-target sweep, while a study whose agent stage was done waited behind
# the others' sanitizer runs. The winners' Nsight Compute profiles last (the analysts' baseline
# profile is submitted at 1).
PRIORITY = {JobKind.BASELINE: 0, JobKind.VERIFY: 1, JobKind.SANITIZE: 1, JobKind.GUARD: 1, JobKind.FINAL: 1,
            JobKind.REVIEW: 1, JobKind.EVALUATE: 1, JobKind.SEARCH: 1, JobKind.PROFILE: 2}
# The worker method that does each kind (cluster.engine.workers.MeasureWorker).
METHOD = {JobKind.SANITIZE: "sanitize", JobKind.GUARD: "guard", JobKind.REVIEW: "reverify",
          JobKind.PROFILE: "profile"}
MEASURES = frozenset({JobKind.BASELINE, JobKind.VERIFY, JobKind.SEARCH, JobKind.FINAL, JobKind.EVALUATE})
_sequence = itertools.count()


@dataclass(frozen=True)
class Build:
    """One build a job needs: the sources (a target or an agent's variant) and the candidate."""

    target: Target
    target_ref: ray.ObjectRef
    candidate: Candidate


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
    args: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None  # default: PRIORITY[kind]
    future: Future[JobResult] | None = None  # for a thread waiting on it (the agents' stage)
    # Filled in as it moves along:
    seq: int = field(default_factory=lambda: next(_sequence))
    attempts: int = 0  # times its worker died while it ran alone there
    suspect: bool = False  # its worker died with it in flight: it runs alone from now on
    alone: bool = False  # dispatched with nothing else on its worker
    artifacts: list[BuildArtifact] = field(default_factory=list)
    binary_refs: list[ray.ObjectRef] = field(default_factory=list)
    worker: int | None = None
    submitted_at: float = 0.0
    compiled_at: float = 0.0
    dispatched_at: float = 0.0

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
    def rank(self) -> tuple[int, int]:
        return (PRIORITY[self.kind] if self.priority is None else self.priority, self.seq)


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

    @property
    def built(self) -> bool:
        return self.artifact.status is Status.OK
