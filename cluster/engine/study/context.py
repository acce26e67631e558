"""What the flows of one sweep share (``SweepContext``): the scheduler, the results' writers, the
config, the agents and the time plan."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from cluster.config import RunConfig, Target
from cluster.engine.plan.budget import TimePlan
from cluster.engine.scheduling.scheduler import Scheduler
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
