"""The run's Optuna journal, written in batches.

Optuna's ``JournalFileBackend`` appends and fsyncs every operation of a trial (each suggested
param, each attribute, the tell): about ten fsyncs a candidate, most of the driver's time per
candidate. ``BatchedJournal`` keeps the operations of the last ``flush_interval_s`` in memory
(readers in this process see them at once) and appends them to the same file together, with one
fsync, as the results writer does with rows. What a killed driver had not flushed is at most that
interval of trials: ``--resume`` settles them from the rows, as it settles trials whose rows were
lost (cluster.engine.study.state.StudyState.restore), so that no candidate is evaluated twice.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend


class BatchedJournal(BaseJournalBackend):
    """A journal file whose appends are gathered and written every ``flush_interval_s``; this
    process must be the file's only writer (a sweep's driver is: ``.driver.lock``)."""

    def __init__(self, path: Path, flush_interval_s: float = 2.0) -> None:
        _cut_unfinished_line(path)
        self.file = JournalFileBackend(str(path))
        self.flushed = sum(1 for _ in self.file.read_logs(0))  # logs already in the file
        self.pending: list[dict[str, Any]] = []
        self.flush_interval_s = flush_interval_s
        self.last_flush = time.monotonic()
        self.lock = threading.Lock()  # the agents' threads enqueue trials too

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        with self.lock:
            written = list(self.file.read_logs(log_number_from)) if log_number_from < self.flushed else []
            pending = self.pending[max(0, log_number_from - self.flushed):]
        yield from written
        yield from pending

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with self.lock:
            self.pending.extend(logs)

    def maybe_flush(self) -> None:
        if self.pending and time.monotonic() - self.last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        """Append what is pending to the file, with one fsync."""
        with self.lock:
            if self.pending:
                self.file.append_logs(self.pending)
                self.flushed += len(self.pending)
                self.pending = []
            self.last_flush = time.monotonic()


def journal_problem(path: Path) -> str:
    """Why the Optuna journal at ``path`` cannot be replayed ("" when it can, or is not there): a
    line that is not JSON, an operation that does not fit the ones before it. A last line cut short
    (no newline: a driver killed mid-write) is no problem: Optuna leaves it out, and a resume cuts it
    off before it appends. A whole last line that is not JSON is damage: Optuna leaves it out too,
    but once a resume appends after it, every later read of the journal fails."""
    if not path.is_file():
        return ""
    try:
        JournalStorage(JournalFileBackend(str(path)))  # replays every operation
        _last_line_reads(path)
    except Exception as exc:  # json's, Optuna's (KeyError, ValueError, ...): whatever the bytes give
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
    return ""


def _last_line_reads(path: Path) -> None:
    """Raise json's error where the journal's last whole line is not JSON (the replay skips it)."""
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1].splitlines()
    if whole:
        json.loads(whole[-1])


def _cut_unfinished_line(path: Path) -> None:
    """Drop a last line with no newline (a driver killed mid-write): Optuna's reader leaves it out,
    but an append after it would glue the next operation to it, and every later read would fail."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


class BatchedJournalStorage(JournalStorage):
    """Optuna's journal storage on a ``BatchedJournal``; ``flush`` writes what is pending."""

    def __init__(self, path: Path, flush_interval_s: float = 2.0) -> None:
        self.journal = BatchedJournal(path, flush_interval_s)
        super().__init__(self.journal)

    def maybe_flush(self) -> None:
        self.journal.maybe_flush()

    def flush(self) -> None:
        self.journal.flush()
