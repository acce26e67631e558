"""``warpfleet check``: the part files of a run's tables read whole, the damaged ones (truncated,
zeroed, empty) named and moved to ``<run>/quarantine/<table>/``, outside the dataset folders, so that
readers and a resume go on without them; the resume runs the points whose rows they held again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.store.results import bad_part, part_files, part_problem
from cluster.store.rundir import RunDir


def _damaged(run_dir: Path) -> Iterator[tuple[str, Path, str]]:
    """(table, part, problem) of each part of the run's tables that does not read whole."""
    for table in RunDir.TABLES:
        for part in part_files(Path(run_dir) / table):
            if problem := part_problem(part):
                yield table, part, problem


def check_tables(run_dir: Path) -> None:
    """Raise the ConfigError that names the first damaged part of the run's tables, if any: what a
    resume checks before it starts anything."""
    for _, part, problem in _damaged(run_dir):
        raise bad_part(part, problem)


@dataclass(frozen=True)
class BadPart:
    path: Path  # where it was
    problem: str
    moved_to: Path | None  # under <run>/quarantine/<table>/, or None when left in place


def check_run(run_dir: Path, move: bool = True) -> list[BadPart]:
    """Every part file of the run's tables that cannot be read, moved (``move``) to
    ``<run>/quarantine/<table>/``: outside the dataset folders, so readers and a resume go on
    without it, and the rows it held are run again by the resume."""
    bad = []
    for table, part, problem in list(_damaged(run_dir)):
        moved = None
        if move:
            folder = Path(run_dir) / RunDir.QUARANTINE / table
            folder.mkdir(parents=True, exist_ok=True)
            moved = folder / part.name
            os.replace(part, moved)
        bad.append(BadPart(part, problem, moved))
    return bad


