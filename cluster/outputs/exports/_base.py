"""The export contract: one function per format, ``(ExportRequest) -> str``, registered by name
in ``cluster.core.registry.EXPORT_FORMATS``.

A format returns the text to print or write; a format that writes a folder of its own (``bundle``)
writes it into ``request.output`` and returns a summary line. ``ExportError`` is a one-line reason
that the command line shows against ``--format`` (or ``--output``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cluster.core.registry import EXPORT_FORMATS
from cluster.core.types import BestConfig


class ExportError(ValueError):
    """Why a format cannot export these configurations (one line)."""

    def __init__(self, message: str, option: str = "--format") -> None:
        super().__init__(message)
        self.option = option


class NothingToExport(Exception):
    """The format has nothing to say about these configurations (a patch of winners that change no
    source): the command says why and writes nothing, rather than an empty file."""


@dataclass(frozen=True)
class ExportRequest:
    best: Sequence[BestConfig]  # the selected configurations, already filtered by --target/--device
    rows: pd.DataFrame  # the run's results (T4 and bundles carry whole studies)
    run_dir: Path
    output: Path | None = None  # where a folder-writing format writes; None: stdout


def render(fmt: str, request: ExportRequest) -> str:
    """The export of ``request`` in the registered format ``fmt``."""
    try:
        writer = EXPORT_FORMATS.load(fmt)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return writer(request)


WRITES_FOLDER = frozenset({"bundle"})  # formats that write into --output themselves
WHOLE_STUDIES = frozenset({"t4"})  # formats that carry a study's measurements, not its chosen configuration
