"""What a sweep shows while it runs: a bar per study with its stage, done/total, failures and the
best so far with its speedup; and a line for the queues (compiling, waiting, on the workers).
Without a terminal (a log file, CI), each study's change of stage is a line instead."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cluster.core.encodings import speedup

if TYPE_CHECKING:
    from cluster.engine.flow import StudyFlow
    from cluster.engine.scheduler import Scheduler


class SweepProgress:
    def __init__(self, flows: list[StudyFlow], trials: int | None, scheduler: Scheduler, enabled: bool = True,
                 log: Callable[[str], None] | None = None) -> None:
        self.flows, self.scheduler, self.enabled, self.log = flows, scheduler, enabled, log
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"), TextColumn("{task.fields[best]}"),
            TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled,
        )
        self.tasks = {
            f.name: self.progress.add_task(f.name, total=min(trials or f.state.space_size, f.state.space_size) or None,
                                           failed=0, best="")
            for f in flows
        }
        self.queue = self.progress.add_task("queue", total=None, failed=0, best="")
        self.stages = {f.name: None for f in flows}

    def update(self) -> None:
        for flow in self.flows:
            self._study(flow)
        if self.enabled:
            self.progress.update(self.queue, description=self.queue_line())

    def queue_line(self) -> str:
        s = self.scheduler
        waiting = sum(len(q) for q in s.ready.values())
        return (f"queue: {len(s.compiling)} compiling, {waiting} waiting for a worker, "
                f"{len(s.running)} on {len(s.workers)} workers")

    def _study(self, flow: StudyFlow) -> None:
        state = flow.state
        if self.stages[flow.name] != flow.stage:
            self.stages[flow.name] = flow.stage
            if not self.enabled and self.log:
                self.log(f"{flow.name}: {flow.stage.value}" + (f" ({flow.reason})" if flow.reason else ""))
        if not self.enabled:
            return
        text = ""
        if state.best is not None:
            text = f"best {state.best:.4g} {state.target.spec.metric.unit}"
            ratio = speedup(state.best, state.baseline_median, state.goal)
            if ratio is not None:
                text += f" ({ratio:.2f}x)"
        self.progress.update(self.tasks[flow.name], description=f"{flow.name} [{flow.stage.value}]",
                             completed=state.n_search, failed=state.n_failed, best=text)

    def __enter__(self) -> SweepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.update()
        self.progress.__exit__(kind, exc, tb)
