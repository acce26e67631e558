"""What a sweep shows while it runs: a bar per study with its stage (and whether its agents are
still at work), done/total, failures and the best so far with its speedup; a line for the queues
(compiling, waiting, on the workers) and the longest job running. Without a terminal (a log file,
CI), each study's change of stage is a line, every ``STATUS_EVERY_S`` a line per study (stage,
candidates measured, best so far), and every job that runs past ``LONG_JOB_S`` is named, with its
seconds so far, each ``LONG_JOB_S`` while it runs."""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

from cluster.core.encodings import speedup

if TYPE_CHECKING:
    from cluster.engine.flow import Flow, StudyFlow
    from cluster.engine.scheduling.jobs import JobResult
    from cluster.engine.scheduling.scheduler import Scheduler


log = logging.getLogger(f"warpfleet.{__name__}")

STATUS_EVERY_S = 60.0
LONG_JOB_S = 30.0


def _wrapped(ratio: int) -> Column:
    """A column of words that wraps between them: rich's default cuts a progress line at the
    terminal's edge mid-word, and at 80 columns left no room for the bar."""
    return Column(ratio=ratio, no_wrap=False, overflow="fold")


class SweepProgress:
    def __init__(self, flows: list[StudyFlow], trials: int | None, scheduler: Scheduler, enabled: bool = True,
                 console: Console | None = None) -> None:
        self.flows, self.scheduler, self.enabled = flows, scheduler, enabled
        self.progress = Progress(
            TextColumn("{task.description}", markup=False, table_column=_wrapped(2)), BarColumn(bar_width=10),
            MofNCompleteColumn(), TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("{task.fields[best]}", markup=False, table_column=_wrapped(1)),
            TimeRemainingColumn(), console=console or Console(stderr=True), disable=not enabled,
        )
        self.tasks = {
            f.name: self.progress.add_task(f.name, total=min(trials or f.state.space_size, f.state.space_size) or None,
                                           failed=0, best="")
            for f in flows
        }
        self.queue = self.progress.add_task("queue", total=None, failed=0, best="")
        self.stages: dict[str, str | None] = {f.name: None for f in flows}
        self.last_status = time.monotonic()
        self.long_named: dict[int, float] = {}  # job seq -> seconds when last named

    def update(self) -> None:
        for flow in self.flows:
            self._study(flow)
        if self.enabled:
            self.progress.update(self.queue, description=self.queue_line())
            return
        for job, seconds in self.scheduler.running_jobs():
            if seconds >= LONG_JOB_S and seconds - self.long_named.get(job.seq, 0.0) >= LONG_JOB_S:
                self.long_named[job.seq] = seconds
                log.info(f"{self.scheduler.worker_id(job.worker)}: {job.describe()}: {seconds:.0f} s so far")
        if time.monotonic() - self.last_status >= STATUS_EVERY_S:
            self.last_status = time.monotonic()
            for flow in self.flows:
                log.info(self.status_line(flow))

    def queue_line(self) -> str:
        s = self.scheduler
        waiting = sum(len(q) for q in s.ready.values())
        line = (f"queue: {len(s.compiling)} compiling, {waiting} waiting for a worker, "
                f"{len(s.running)} on {len(s.workers)} workers")
        longest = max(s.running_jobs(), key=lambda pair: pair[1], default=None)
        if longest is not None and longest[1] >= LONG_JOB_S:
            line += f"; {longest[0].describe()}: {longest[1]:.0f} s"
        return line

    @staticmethod
    def stage_of(flow: StudyFlow) -> str:
        return flow.stage.value + (" + agents" if getattr(flow, "agents_running", False) else "")

    def status_line(self, flow: StudyFlow) -> str:
        state = flow.state
        line = f"{flow.name}: {self.stage_of(flow)}, {state.n_search} searched"
        if state.variants:
            line += f", {len(state.variants)} variants"
        if state.best is not None:
            ratio = speedup(state.best, state.baseline_median, state.goal)
            line += f", best so far {state.best:.4g} {state.target.spec.metric.unit}" + (
                f" ({ratio:.2f}x)" if ratio is not None else "")
        return line

    def _study(self, flow: StudyFlow) -> None:
        state = flow.state
        stage = self.stage_of(flow)
        if self.stages[flow.name] != stage:
            self.stages[flow.name] = stage
            if not self.enabled:
                log.info(f"{flow.name}: {stage}" + (f" ({flow.reason})" if flow.reason else ""))
        if not self.enabled:
            return
        text = ""
        if state.best is not None:
            text = f"best {state.best:.4g} {state.target.spec.metric.unit}"
            ratio = speedup(state.best, state.baseline_median, state.goal)
            if ratio is not None:
                text += f" ({ratio:.2f}x)"
        self.progress.update(self.tasks[flow.name], description=f"{flow.name}: {stage}",
                             completed=state.n_search, failed=state.n_failed, best=text)

    def __enter__(self) -> SweepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.update()
        self.progress.__exit__(kind, exc, tb)


class EvaluationProgress:
    """What ``warpfleet evaluate`` shows while it runs, on a terminal: a bar per study (target on a
    device type) with its stage and the measurements done (its baseline and each configuration)."""

    def __init__(self, flows: list[Flow], enabled: bool = True) -> None:
        self.flows = {f.name: f for f in flows}
        self.progress = Progress(TextColumn("{task.description}", markup=False, table_column=_wrapped(1)),
                                 BarColumn(bar_width=10), MofNCompleteColumn(), console=Console(stderr=True),
                                 disable=not enabled)
        self.tasks = {name: self.progress.add_task(name, total=None) for name in self.flows}

    def measured(self, result: JobResult) -> None:
        """A job of a study is in (``run_flows``'s ``on_job``)."""
        flow = self.flows.get(result.job.study)
        if flow is not None:
            self.progress.update(self.tasks[flow.name], advance=1, description=f"{flow.name}: {flow.stage.value}")

    def __enter__(self) -> EvaluationProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for name, flow in self.flows.items():
            done = self.progress.tasks[self.tasks[name]].completed
            self.progress.update(self.tasks[name], total=done, description=f"{name}: {flow.stage.value}")
        self.progress.__exit__(kind, exc, tb)
