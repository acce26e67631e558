"""`warpfleet show` on a narrow terminal: words are never cut (rich folds a word wider than its
column: "-DUNROL" over "L=1"); a table whose words do not fit becomes a line a row."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from rich.console import Console

from cluster.config import load_target
from cluster.core.types import DeviceInfo, Phase
from cluster.outputs.show import show
from tests.cluster.outputs.fake_runs import Row, write_run
from tests.conftest import REPO

CONFIGURATION = "-O3 -march=native -DTILE=16 -DUNROLL=1"


def _cpu_run(tmp_path: Path) -> Path:
    stencil = load_target(REPO / "configs" / "targets" / "stencil_c" / "target.yaml")
    cpu = DeviceInfo(kind="cpu", name="AMD EPYC 7763 64-Core Processor", arch="host", hostname="node")
    base, tuned = {"TILE": 64, "UNROLL": 1}, {"TILE": 16, "UNROLL": 1}
    flags = {"opt_level": "-O3", "march": "-march=native"}
    return write_run(tmp_path, "stencil-20261128-234120", stencil, cpu, [
        Row(base, (22.3,) * 3, phase=Phase.BASELINE), Row(tuned, (0.61,) * 3, flags),
        Row(tuned, (0.61,) * 5, flags, phase=Phase.FINAL), Row(base, (22.3,) * 5, phase=Phase.FINAL)])


def _shown(run: Path, width: int) -> str:
    console = Console(width=width, file=StringIO())
    show(run, console)
    return console.file.getvalue()


def test_at_80_columns_no_word_is_cut(tmp_path):
    run = _cpu_run(tmp_path)
    text = _shown(run, 80)
    assert all(len(line) <= 80 for line in text.splitlines()), text
    joined = " ".join(text.split())  # lines wrapped between words join back into the words
    for words in ("stencil_c", "AMD EPYC 7763 64-Core Processor (host)", "speedup 36.56x",
                  f"configuration {CONFIGURATION}"):
        assert words in joined, (words, text)


def test_a_wide_terminal_gets_the_table(tmp_path):
    text = _shown(_cpu_run(tmp_path), 200)
    assert "┃ target" in text and CONFIGURATION in text
