"""What a tuning run leaves behind, the same for both tools, and the part files it is written to.

Every block of work writes its own Parquet file under ``OUT/parts/<table>/`` (written to a
temporary name, then renamed), so a run cut short by a timeout loses only the block in flight.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

TABLES = ("evals", "runs", "reference", "remeasure", "blocks")


@dataclass(frozen=True)
class Evaluation:
    """One configuration a tool compiled and measured, in the order it finished."""

    key: str  # spaces.config_key
    status: str  # ok, or the tool's own word for what went wrong
    t_s: float | None  # seconds from the start of the tuning call to when its result was in
    tool_ms: float | None  # the tool's own measurement of it
    worker: str = ""  # where it ran (Ray actor, GPU worker)
    # warpfleet's own row figures, where the tool has them: where a configuration's time went
    samples: int | None = None  # timed launches kept
    raced: bool | None = None  # stopped sampling early (measure.race)
    compile_s: float | None = None
    queue_s: float | None = None  # waiting for the measuring actor
    run_s: float | None = None  # the measuring actor's run of it (the host call: load, samples, check)
    verify_s: float | None = None  # the worker's own output compare


@dataclass
class RunResult:
    """One tuning run of one tool: its trace, its wall time and its own pick."""

    evaluations: list[Evaluation] = field(default_factory=list)
    wall_s: float = 0.0
    winner_key: str | None = None
    winner_tool_ms: float | None = None
    workers_requested: int = 1
    workers_used: int = 0
    error: str = ""
    notes: str = ""

    @property
    def unique_evaluations(self) -> int:
        return len({e.key for e in self.evaluations})


@dataclass(frozen=True)
class Block:
    """A unit of work for a lane: a kernel's exhaustive reference, one tuning run, or the
    re-measurement of the winners. Serialized to JSON for the lane processes."""

    kind: str  # reference, run, remeasure
    kernel: str = ""
    tool: str = ""  # warpfleet, kernel_tuner
    strategy: str = ""  # best, random
    seed: int = 0
    repeat: int = 0  # 0 for the seeds' runs; 1, 2 for the same run (seed 0) again
    gpus: int = 1
    variant: str = ""  # kernel_tuner, two GPUs: "shipped" or "repaired" (its parallel mode; see kt_run)

    @property
    def id(self) -> str:
        if self.kind != "run":
            return f"{self.kind}-{self.kernel}" if self.kernel else self.kind
        variant = f"-{self.variant}" if self.variant else ""
        return f"{self.gpus}gpu-{self.tool}{variant}-{self.kernel}-{self.strategy}-s{self.seed}-r{self.repeat}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Block:
        return cls(**data)


def run_records(block: Block, result: RunResult, strategy_name: str, started_at: float) -> tuple[list, list]:
    """The rows of the ``evals`` and ``runs`` tables for one tuning run."""
    base = {"run_id": block.id, "tool": block.tool, "variant": block.variant, "kernel": block.kernel,
            "strategy": block.strategy, "strategy_name": strategy_name, "seed": block.seed,
            "repeat": block.repeat, "gpus": block.gpus}
    evals = [{**base, "index": i, **asdict(e)} for i, e in enumerate(result.evaluations)]
    ok_times = [e.t_s for e in result.evaluations if e.t_s is not None]
    run = {**base, "wall_s": result.wall_s, "n_evals": len(result.evaluations),
           "n_unique": result.unique_evaluations,
           "n_ok": sum(e.status == "ok" for e in result.evaluations),
           "evals_per_min": 60.0 * result.unique_evaluations / result.wall_s if result.wall_s > 0 else None,
           "first_result_s": min(ok_times) if ok_times else None,
           "last_result_s": max(ok_times) if ok_times else None,
           "winner_key": result.winner_key, "winner_tool_ms": result.winner_tool_ms,
           "workers_requested": result.workers_requested, "workers_used": result.workers_used,
           "error": result.error, "notes": result.notes, "started_at": started_at}
    return evals, [run]


def write_part(out: Path, table: str, name: str, rows: list[dict[str, Any]]) -> Path | None:
    """One Parquet part file, renamed into place only once complete."""
    if not rows:
        return None
    folder = out / "parts" / table
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    for column in frame.columns:  # lists and dicts as JSON text: every part file then reads alike
        if frame[column].map(lambda v: isinstance(v, dict | list | tuple)).any():
            frame[column] = frame[column].map(lambda v: json.dumps(v) if isinstance(v, dict | list | tuple) else v)
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    frame.to_parquet(tmp, index=False)
    final = folder / f"{name}.parquet"
    tmp.replace(final)
    return final


def read_table(outs: list[Path], table: str) -> pd.DataFrame:
    """Every part of one table under each output folder (several folders: runs split by kernel)."""
    parts = [p for out in outs for p in sorted((out / "parts" / table).glob("*.parquet"))]
    frames = [pd.read_parquet(p) for p in parts]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def stamp() -> str:
    return time.strftime("%H:%M:%S")
