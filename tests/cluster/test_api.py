"""cluster/api.py: the CLI's logging handler (rich's on a terminal, the plain line elsewhere) and
the names a script reads a run with (read_table, run_meta, verified, selected)."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator

import pytest
from rich.logging import RichHandler

from cluster import api
from cluster.config import load_target
from cluster.core.errors import ConfigError
from cluster.core.types import Phase
from cluster.store.rundir import RunDir
from cluster.store.tables import JOBS_SCHEMA, REVIEW_SCHEMA, Tables
from cluster.store.variants import VARIANT_SCHEMA
from tests.cluster.outputs.fake_runs import Row, gpu, write_run
from tests.conftest import REPO

ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.fixture
def bare_logger() -> Iterator[logging.Logger]:
    """The warpfleet logger with no handler (an earlier CLI test may have installed the CLI's),
    given back as it was."""
    logger = logging.getLogger(api.LOGGER)
    handlers, level = list(logger.handlers), logger.level
    logger.handlers.clear()
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_on_a_terminal_the_cli_logs_through_rich_with_the_message_as_it_is(bare_logger, monkeypatch):
    stderr = _Stream(terminal=True)
    monkeypatch.setattr(sys, "stderr", stderr)
    api.configure_logging()
    [handler] = bare_logger.handlers
    assert isinstance(handler, RichHandler)
    logging.getLogger("warpfleet.cluster.engine.flow").warning("saxpy: [bold]3[/bold] rows :smile:")
    shown = ANSI.sub("", stderr.getvalue())
    assert "saxpy: [bold]3[/bold] rows :smile:" in shown  # no markup or emoji codes read in it
    assert "WARNING" in shown
    api.configure_logging()  # again: nothing more
    assert bare_logger.handlers == [handler]


def test_elsewhere_the_cli_logs_the_message_alone_a_plain_line(bare_logger, monkeypatch):
    stderr = _Stream(terminal=False)
    monkeypatch.setattr(sys, "stderr", stderr)
    api.configure_logging()
    [handler] = bare_logger.handlers
    assert not isinstance(handler, RichHandler)
    logging.getLogger("warpfleet.cluster.engine.flow").info("saxpy: [bold]3[/bold] rows")
    logging.getLogger("warpfleet.cluster.engine.flow").warning("a warning")
    assert stderr.getvalue() == "saxpy: [bold]3[/bold] rows\na warning\n"


def test_the_terminal_can_be_named_whatever_stderr_is(bare_logger, capsys):
    api.configure_logging(terminal=True)
    assert isinstance(bare_logger.handlers[0], RichHandler)
    logging.getLogger("warpfleet.x").info("reached the console")
    assert "reached the console" in ANSI.sub("", capsys.readouterr().err)


def _run(tmp_path):
    """A saxpy study stopped in its search (baseline 1.0 ms; a candidate of a variant at 0.25 ms,
    one of the target's own sources at 0.5 ms), with the side tables a sweep writes beside it."""
    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    run = write_run(tmp_path, "stopped", target, gpu("NVIDIA H100 80GB HBM3", "9.0"), [
        Row({"BLOCK": 256, "ITEMS": 1}, (1.0, 1.01, 0.99), phase=Phase.BASELINE),
        Row({"BLOCK": 128, "ITEMS": 4}, (0.5, 0.5, 0.51)),
    ], meta={"kind": "evaluate"})
    tables = Tables(run)
    variant = {"run_id": "stopped", "target": "saxpy", "study": "saxpy@gpu", "source_hash": "v1",
               "optimization": "unroll", "location": "k", "attempt": 0, "stage": "accepted", "checks": ""}
    tables.append(RunDir.VARIANTS, VARIANT_SCHEMA, {**variant, "created_at": 1.0})
    tables.append(RunDir.VARIANTS, VARIANT_SCHEMA, {**variant, "created_at": 2.0, "checks": "passed"})
    tables.append(RunDir.JOBS, JOBS_SCHEMA, {"run_id": "stopped", "kind": "ncu", "service_s": 3.5})
    tables.append(RunDir.REVIEWS, REVIEW_SCHEMA, {"candidate_key": "k20", "status": "failed"})
    tables.close()
    return run


def test_read_table_reads_the_tables_beside_the_results(tmp_path):
    run = _run(tmp_path)
    [variant] = api.read_table(run, "variants").to_dict("records")  # the latest record of the outcome
    assert variant["checks"] == "passed"
    assert api.read_table(run, "jobs")[["kind", "service_s"]].values.tolist() == [["ncu", 3.5]]
    profiles = api.read_table(run, "profiles")
    assert profiles.empty and "candidate_key" in profiles.columns
    with pytest.raises(ValueError, match="read_results"):
        api.read_table(run, "results")


def test_run_meta_and_what_is_not_a_run(tmp_path):
    run = _run(tmp_path)
    assert api.run_meta(str(run))["kind"] == "evaluate"
    with pytest.raises(ConfigError, match="not a warpfleet run directory"):
        api.run_meta(tmp_path / "nope")


def test_verified_says_which_rows_count_and_selected_uses_it(tmp_path):
    run = _run(tmp_path)
    trust = api.verified(run)
    assert trust.variants == {"v1": "passed"} and trust.reviews == {"k20": "failed"}
    [best] = api.selected(run)  # no finals: the best so far, verified
    assert best.params == {"BLOCK": 128, "ITEMS": 4} and not best.remeasured
    assert api.select_best(api.read_results(run))[0].speedup == 1.0  # the rows alone: finals only
