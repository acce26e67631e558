"""What a sweep shows while it runs, without a terminal (a log file): each study's stage as it
changes (with its agents beside the search), a line a study every STATUS_EVERY_S (stage, candidates
searched, variants, best so far), and every job that runs past LONG_JOB_S, named with its seconds."""

from __future__ import annotations

import types

from cluster.engine import progress as progress_module
from cluster.engine.flow import Stage
from cluster.engine.progress import SweepProgress
from cluster.engine.scheduling.jobs import Job, JobKind
from tests.conftest import logged_lines


def study(name: str) -> types.SimpleNamespace:
    target = types.SimpleNamespace(spec=types.SimpleNamespace(metric=types.SimpleNamespace(unit="ms")))
    state = types.SimpleNamespace(n_search=12, n_failed=0, space_size=100, best=0.5, baseline_median=1.0,
                                  goal="minimize", target=target, variants={"a": None, "b": None})
    return types.SimpleNamespace(name=name, state=state, stage=Stage.SEARCH, reason="", agents_running=True)


class Scheduler:
    def __init__(self, running: list) -> None:
        self.ready, self.compiling, self.workers, self._running = {}, {}, [object()], running
        self.running = {object(): job for job, _ in running}

    def running_jobs(self) -> list:
        return self._running

    def worker_id(self, worker: int | None) -> str:
        return "gpu-0"


def test_a_log_names_each_stage_a_status_line_a_study_and_every_long_job(monkeypatch) -> None:
    flow = study("pb_2mm@H100")
    check = Job(JobKind.SANITIZE, flow.name, [0], None, (), label="memcheck, racecheck on restrict 2mm.cu:40")
    check.worker = 0
    scheduler = Scheduler([(check, 45.0)])
    lines = logged_lines()
    progress = SweepProgress([flow], 40, scheduler, enabled=False)
    monkeypatch.setattr(progress, "last_status", progress.last_status - progress_module.STATUS_EVERY_S)
    progress.update()
    assert lines[0] == "pb_2mm@H100: search + agents"
    assert "gpu-0: sanitize of pb_2mm@H100 (memcheck, racecheck on restrict 2mm.cu:40): 45 s so far" in lines
    assert "pb_2mm@H100: search + agents, 12 searched, 2 variants, best so far 0.5 ms (2.00x)" in lines
    lines.clear()
    progress.update()  # the same job, named again only after another LONG_JOB_S
    assert lines == []
    scheduler._running = [(check, 45.0 + progress_module.LONG_JOB_S)]
    flow.agents_running, flow.stage = False, Stage.FINAL
    progress.update()
    assert lines[0] == "pb_2mm@H100: final" and any("75 s so far" in line for line in lines)


def test_at_80_columns_the_bars_keep_their_stage_and_words(monkeypatch) -> None:
    """Seen: "[search]" was read as rich markup and vanished, and at 80 columns the lines were cut
    mid-word with no room left for the bar."""
    from io import StringIO

    from rich.console import Console

    flow = study("matmul_unroll@NVIDIA H100 80GB HBM3 (sm_90)")
    check = Job(JobKind.FINAL, flow.name, [0], None, (), label="the final of -DUNROLL=4 -DTILE=32")
    scheduler = Scheduler([(check, 45.0)])
    console = Console(width=80, file=StringIO())
    with SweepProgress([flow], 40, scheduler, console=console) as progress:
        progress.update()
    text = console.file.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text, text
    words = text.split()  # the columns wrap side by side: each word whole, somewhere
    for word in ["matmul_unroll@NVIDIA", "H100", "80GB", "HBM3", "(sm_90):", "search", "+", "agents", "12/40",
                 "(2.00x)", "-DUNROLL=4", "-DTILE=32):"]:
        assert word in words, (word, text)
