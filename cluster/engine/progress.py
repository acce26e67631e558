"""A rich progress bar per study: done/total, failures, best so far and its speedup, ETA."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

if TYPE_CHECKING:
    from cluster.engine.studies import StudyState


class SweepProgress:
    def __init__(self, studies: list[StudyState], trials: int | None, enabled: bool = True) -> None:
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"), TextColumn("{task.fields[best]}"),
            TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
        )
        self.tasks = {
            s.name: self.progress.add_task(s.name, total=min(trials or s.space_size, s.space_size) or None,
                                           failed=0, best="")
            for s in studies
        }

    def update(self, study: StudyState) -> None:
        best = study.best
        text = ""
        if best is not None:
            unit = study.target.spec.metric.unit
            text = f"best {best:.4g} {unit}"
            if study.baseline_median:
                ratio = study.baseline_median / best if study.goal == "minimize" else best / study.baseline_median
                text += f" ({ratio:.2f}x)"
        self.progress.update(self.tasks[study.name], completed=study.n_search, failed=study.n_failed, best=text)

    def __enter__(self) -> SweepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.__exit__(kind, exc, tb)
