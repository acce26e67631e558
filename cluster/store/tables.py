"""The run's tables beside the results (``variants/``, ``reviews/``, ``jobs/``): one writer each,
appended to from any thread (the agents' threads record their outcomes as they come) and flushed
by the driver's loop with the results, so that a stopped run keeps what it learned.

``jobs/`` has a row for every job a measuring worker did (its kind, study, what it was about, when
its worker started and finished it): the worker time that the results' rows do not show
(Nsight Compute, compute-sanitizer, the cheat checks, the fresh-seed reviews), for time-to-result
figures and the workers' busy share.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from cluster.store.results import ResultWriter

_TIMESTAMP = pa.timestamp("us", tz="UTC")  # as the results' started_at and finished_at
JOBS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("study", pa.string()), ("kind", pa.string()), ("lane", pa.string()),
    ("label", pa.string()), ("candidate_key", pa.string()), ("worker", pa.int64()), ("worker_id", pa.string()),
    ("submitted_at", _TIMESTAMP), ("dispatched_at", _TIMESTAMP), ("started_at", _TIMESTAMP),
    ("finished_at", _TIMESTAMP), ("service_s", pa.float64()), ("outcome", pa.string()),
])


# The fresh-seed reviews of candidates over 10x their baseline (cluster.engine.flow writes them).
REVIEW_SCHEMA = pa.schema([("run_id", pa.string()), ("study", pa.string()), ("candidate_key", pa.string()),
                           ("speedup", pa.float64()), ("status", pa.string()), ("detail", pa.string())])


class Tables:
    """Thread-safe writers of the side tables of one run directory."""

    def __init__(self, run_dir: Path, flush_interval_s: float = 2.0) -> None:
        self.run_dir, self.flush_interval_s = Path(run_dir), flush_interval_s
        self._writers: dict[str, ResultWriter] = {}
        self._lock = threading.Lock()

    def append(self, subdir: str, schema: pa.Schema, record: dict[str, Any]) -> None:
        with self._lock:
            writer = self._writers.get(subdir)
            if writer is None:
                writer = self._writers[subdir] = ResultWriter(self.run_dir, schema, self.flush_interval_s, subdir)
            writer.append_record(record)

    def maybe_flush(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.maybe_flush()

    def close(self) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()

