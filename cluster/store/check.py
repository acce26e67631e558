"""``warpfleet check``: the part files of a run's tables read whole, the damaged ones (truncated,
zeroed, empty, or a Parquet file of another schema) named and moved to ``<run>/quarantine/<table>/``,
outside the dataset folders, so that readers and a resume go on without them; the resume runs the
points whose rows they held again. The Optuna journal is replayed too: a damaged one is moved to
``<run>/quarantine/``, and the resume rebuilds the studies from the rows, as it does when the journal
is gone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.core.errors import ConfigError
from cluster.store.journal import journal_problem
from cluster.store.results import bad_part, part_files, part_problem
from cluster.store.rundir import RunDir


def _damaged(run_dir: Path) -> Iterator[tuple[Path, Path, str]]:
    """(the folder it goes to in quarantine, file, problem) of each part of the run's tables that does
    not read whole, then of the journal if it cannot be replayed."""
    quarantine = Path(run_dir) / RunDir.QUARANTINE
    for table in RunDir.TABLES:
        for part in part_files(Path(run_dir) / table):
            if problem := part_problem(part):
                yield quarantine / table, part, problem
    journal = Path(run_dir) / RunDir.JOURNAL
    if problem := journal_problem(journal):
        yield quarantine, journal, problem


def bad_journal(journal: Path, problem: str) -> ConfigError:
    """The one line that names a damaged journal and what to do about it."""
    return ConfigError(journal, "", f"not a readable Optuna journal ({problem}); `warpfleet check {journal.parent}` "
                       "moves it aside, and a resume rebuilds it from the rows")


def check_tables(run_dir: Path) -> None:
    """Raise the ConfigError that names the first damaged part of the run's tables, or its damaged
    journal, if any: what a resume checks before it starts anything."""
    for _, path, problem in _damaged(run_dir):
        raise bad_journal(path, problem) if path.name == RunDir.JOURNAL else bad_part(path, problem)


@dataclass(frozen=True)
class BadPart:
    path: Path  # where it was: a part file, or the journal
    problem: str
    moved_to: Path | None  # under <run>/quarantine/, or None when left in place

    @property
    def is_journal(self) -> bool:
        return self.path.name == RunDir.JOURNAL


def check_run(run_dir: Path, move: bool = True) -> list[BadPart]:
    """Every part file of the run's tables that cannot be read, and a journal that cannot be
    replayed, moved (``move``) to ``<run>/quarantine/``: outside the dataset folders, so readers and
    a resume go on without them; the rows a part held are run again, a journal is rebuilt from the rows."""
    bad = []
    for folder, path, problem in list(_damaged(run_dir)):
        moved = None
        if move:
            folder.mkdir(parents=True, exist_ok=True)
            moved = folder / path.name
            for n in range(2, 1000):  # a journal moved aside before keeps its place
                if not moved.exists():
                    break
                moved = folder / f"{path.name}.{n}"
            os.replace(path, moved)
        bad.append(BadPart(path, problem, moved))
    return bad
