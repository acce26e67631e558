"""What a study's finals and its gate see of its flow (``StudyView``): the seam that keeps them
below ``cluster.engine.flow``, which makes them."""

from __future__ import annotations

from typing import Any, Protocol

from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, Measurement, Stats
from cluster.engine.scheduling.jobs import Job
from cluster.engine.study.context import SweepContext
from cluster.engine.study.state import StudyState
from cluster.engine.study.study_jobs import StudyJobs
from cluster.engine.verification.checks import DeepChecks


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
