"""What the flows of one sweep share (``SweepContext``), and what a study's finals and its gate see
of its flow (``StudyView``): the seam that keeps them below ``cluster.engine.flow``, which makes them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from cluster.config import RunConfig, Target
from cluster.core.types import BuildArtifact, Candidate, Measurement, Stats
from cluster.engine.budget import TimePlan
from cluster.engine.checks import DeepChecks
from cluster.engine.jobs import Job
from cluster.engine.scheduler import Scheduler
from cluster.engine.studies import StudyState
from cluster.engine.study_jobs import StudyJobs
from cluster.store.results import ResultWriter
from cluster.store.tables import Tables


@dataclass
class SweepContext:
    """What the flows of one sweep share."""

    run_id: str
    run_dir: Path
    config: RunConfig
    scheduler: Scheduler
    results: ResultWriter
    cover: Callable[[list[Target]], None]  # widen the results' schema for variants' params
    agents: Any = None  # AgentStage, when the agents' workflow is on
    executor: Executor | None = None  # the agents' threads
    reviewed: dict[str, str] = field(default_factory=dict)  # candidate key -> an earlier invocation's review
    profiled: frozenset[str] = frozenset()
    plan: TimePlan | None = None  # the sweep's time budget, when it has one
    tables: Tables | None = None  # variants/, reviews/, profiles/ (default: a writer per record)

    def append(self, subdir: str, schema: pa.Schema, record: dict[str, Any]) -> None:
        if self.tables is not None:
            self.tables.append(subdir, schema, record)
            return
        with ResultWriter(self.run_dir, schema, subdir=subdir) as writer:
            writer.append_record(record)


class StudyView(Protocol):
    """A study's flow as its finals and its gate use it (``cluster.engine.flow.StudyFlow``)."""

    name: str
    device_type: str
    ctx: SweepContext
    state: StudyState
    jobs: StudyJobs
    checks: DeepChecks
    rows: list[dict[str, Any]]  # the study's rows, for its selection
    stats: dict[str, Stats]  # candidate key -> the samples' statistics of its ok row
    awaited: set[int]  # the current stage's jobs (by seq) not yet in
    run_estimate: float | None  # worker-seconds a run takes, once measured (the time plan's unit)
    job_overhead: float  # worker-seconds of a job besides its runs

    def submit(self, job: Job) -> None:
        """Queue one of the current stage's jobs."""

    def work_left(self) -> tuple[float, float]:
        """Worker-seconds it needs once its search is closed: finals, and the checks they wait for."""

    def record_row(self, source: Target, candidate: Candidate, artifact: BuildArtifact,
                   measurement: Measurement | None) -> None:
        """Write a row of the results table for ``candidate``."""
