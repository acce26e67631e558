"""cluster/api.py: the CLI's logging handler (rich's on a terminal, the plain line elsewhere)."""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator

import pytest
from rich.logging import RichHandler

from cluster import api

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
