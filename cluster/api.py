"""warpfleet as a library: the few names a script needs, none of the internals.

    plan = load_run("configs/demo.yaml")
    plan = configured(plan, search={"trials": 8}, output_dir="runs")  # the config, changed in code
    configure_logging()                                  # the sweep's lines on stderr, as the CLI prints them
    with log_to(print): ...                              # or to a script's own log, meanwhile
    summary = run_sweep(plan)                            # a new run directory: summary.run_dir
    summary = run_sweep(plan, create_run(plan))          # or one made first, to name or watch meanwhile
    rows = read_results(summary.run_dir)                 # every row (pandas), as `warpfleet show` reads them
    jobs = read_table(summary.run_dir, "jobs")           # a table beside them: profiles, variants, reviews, jobs
    meta = run_meta(summary.run_dir)                     # its meta.json
    best = selected(summary.run_dir)                     # the winners, as `warpfleet show` selects them
    best = select_best(rows)                             # or from rows of one's own choosing
    trust = verified(summary.run_dir)                    # which measured rows its checks let count

Everything else of ``cluster`` and ``agents`` may change shape between versions; these do not
without a note in the README.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cluster.config import RunPlan, load_run, load_target
from cluster.core.types import BestConfig

if TYPE_CHECKING:  # the engine and the tables are imported when used: the CLI imports this module for its logging
    import pandas as pd

    from cluster.engine.driver import SweepSummary
    from cluster.store.select import Verified

__all__ = ["BestConfig", "RunPlan", "configure_logging", "configured", "create_run", "load_run", "load_target",
           "log_to", "read_results", "read_table", "run_meta", "run_sweep", "select_best", "selected", "verified"]

LOGGER = "warpfleet"  # every module's logger is below it: warpfleet.cluster.engine.flow, ...
_STDERR = "warpfleet-stderr"  # the name of the handler configure_logging installs


def configured(plan: RunPlan, **changes: Any) -> RunPlan:
    """``plan`` with its config changed: a section's fields as a dict (``search={"trials": 8}``), a
    top-level field as its value (``output_dir="runs"``). Not validated again: change what a
    config file could say."""
    update = {}
    for name, value in changes.items():
        current = getattr(plan.config, name)
        update[name] = current.model_copy(update=value) if isinstance(value, dict) and hasattr(current, "model_copy") \
            else value
    return RunPlan(plan.config.model_copy(update=update), plan.file, plan.targets)


def create_run(plan: RunPlan) -> Path:
    """A new run directory for ``plan`` under its config's ``output_dir``: what ``run_sweep`` makes
    when given none, for a script that names or watches it while the sweep runs."""
    from cluster.store.rundir import RunDir

    return RunDir.create(plan).path


def run_sweep(plan: RunPlan, run_dir: str | Path | None = None, *, address: str | None = None,
              show_progress: bool = False, **engine: Any) -> SweepSummary:
    """Sweep ``plan``'s targets into ``run_dir`` (one ``create_run`` made, or an earlier run to
    resume; default: a new one), as ``warpfleet sweep`` does. ``engine``: the sweep's own options
    (a simulated fleet: ``cluster.engine.scheduling.simulate``)."""
    from cluster.engine.driver import Sweep
    from cluster.store.rundir import RunDir

    run = RunDir.open(run_dir) if run_dir is not None else RunDir.create(plan)
    return Sweep(plan, run, **engine).run(address, show_progress)


def read_results(run_dir: str | Path) -> pd.DataFrame:
    """Every row of the run's results table (its current studies'), as ``warpfleet show`` reads them."""
    from cluster.store.results import read_results as read

    return read(Path(run_dir))


def read_table(run_dir: str | Path, name: str) -> pd.DataFrame:
    """A table of the run beside its results, by its folder's name (README: A run directory):
    ``profiles`` (Nsight Compute's metrics), ``variants`` (the agents' outcomes, the latest record
    of each, as the selection and the optimize report read them), ``reviews`` (the fresh-seed
    re-verifications), ``jobs`` (every job a measuring worker did, with its times). With the
    table's columns and no rows where the run has none; a ValueError for another name."""
    from cluster.measure.profile import PROFILE_SCHEMA
    from cluster.store.results import read_table as read
    from cluster.store.rundir import RunDir
    from cluster.store.tables import JOBS_SCHEMA, REVIEW_SCHEMA
    from cluster.store.variants import VARIANT_SCHEMA, latest_outcomes

    schemas = {RunDir.PROFILES: PROFILE_SCHEMA, RunDir.VARIANTS: VARIANT_SCHEMA, RunDir.REVIEWS: REVIEW_SCHEMA,
               RunDir.JOBS: JOBS_SCHEMA}
    if name not in schemas:
        raise ValueError(f"{name!r} is not a table beside a run's results ({', '.join(schemas)}); "
                         "the results: read_results")
    rows = read(Path(run_dir), name, schemas[name])
    return latest_outcomes(rows) if name == RunDir.VARIANTS else rows


def run_meta(run_dir: str | Path) -> dict[str, Any]:
    """The run's ``meta.json`` (README: A run directory): its id, config file, targets' hashes, and
    for an evaluation ``kind: evaluate`` with what it evaluated. A one-line ConfigError where
    ``run_dir`` is not a run directory."""
    from cluster.store.rundir import RunDir

    return RunDir.open(run_dir).read_meta()


def select_best(rows: pd.DataFrame, verified: Verified | None = None) -> list[BestConfig]:
    """The best configuration per (target, device type) of ``rows`` (``cluster.store.select``)."""
    from cluster.store.select import select_best as select

    return select(rows, verified)


def selected(run_dir: str | Path) -> list[BestConfig]:
    """The run's best configuration per (target, device type), as ``warpfleet show`` selects it."""
    return select_best(read_results(run_dir), verified(run_dir))


def verified(run_dir: str | Path) -> Verified:
    """What the run's expensive checks found, as ``selected`` weighs it: ``trusted(row, baseline,
    speedup)`` says whether a measured row counts (an agent's variant once its checks passed, a
    candidate over 10x its baseline once its fresh-seed review did)."""
    from cluster.store.select import load_verified

    return load_verified(Path(run_dir))


class _Lines(logging.Handler):
    """A record's message alone, a line to ``write``: by default on stderr, what the CLI prints off a
    terminal (click's echo, so that a test's runner sees it)."""

    def __init__(self, write: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            if self.write is None:
                click.echo(message, err=True)
            else:
                self.write(message)
        except Exception:
            self.handleError(record)


def _terminal_handler() -> logging.Handler:
    """rich's handler: the message as it is (no markup read in it), after the time (once a second)
    and the level; no path."""
    from rich.console import Console
    from rich.logging import RichHandler

    # A console of its own on stderr: while a sweep's progress bars show, rich prints what reaches
    # stderr above them.
    return RichHandler(console=Console(stderr=True), show_path=False, markup=False, log_time_format="%H:%M:%S")


def _info_and_optuna_quiet() -> logging.Logger:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # Optuna's own lines from warnings up
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    return logger


def configure_logging(terminal: bool | None = None) -> None:
    """What a sweep says, a line each on stderr; Optuna's own lines from warnings up. Where stderr
    is a terminal (``terminal``: None asks it), through rich's handler (the time and the level
    before each message, warnings in colour); elsewhere (a log file, a pipe, CI) the message alone,
    a plain line. Once per process is enough; again changes nothing."""
    logger = _info_and_optuna_quiet()
    if any(h.get_name() == _STDERR for h in logger.handlers):
        return
    if terminal is None:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    handler = _terminal_handler() if terminal else _Lines()
    handler.set_name(_STDERR)
    logger.addHandler(handler)


@contextmanager
def log_to(write: Callable[[str], None]) -> Iterator[None]:
    """Inside, every line a sweep says also goes to ``write`` (``print``, a script's own log);
    Optuna's own lines from warnings up."""
    logger = _info_and_optuna_quiet()
    handler = _Lines(write)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
