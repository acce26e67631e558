"""Streamify's loop form on a program of its own (tests/agents/fixtures/filters: four small filters
in a loop, then a combine kernel): the proposal builds for sm_90 here, and on a GPU it writes
the same output as the original, faster."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agents._base import AnalysisContext
from agents.experts import StreamifyExpert
from cluster.compile.build import HARNESS_INCLUDE
from cluster.config import load_target
from tests.conftest import gpu_present, needs

FILTERS = Path(__file__).resolve().parent / "fixtures" / "filters"


def streamified() -> str:
    target = load_target(FILTERS / "target.yaml")
    [proposal] = StreamifyExpert().propose(AnalysisContext(target, "sm_90"))
    assert "5 tasks on 4 non-blocking streams forked from `stream`" in proposal.description
    return dict(proposal.files)["filters.cu"]


def build(folder: Path, name: str, source: str, arch: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.cu").write_text(source)
    command = ["nvcc", f"-arch={arch}", f"-I{HARNESS_INCLUDE}", "-o", str(folder / name), str(folder / f"{name}.cu")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder / name


@pytest.mark.nvcc
@needs("nvcc")
def test_the_streamified_filters_build_for_sm_90(tmp_path: Path) -> None:
    build(tmp_path, "streamified", streamified(), "sm_90")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")
def test_on_a_gpu_the_streams_give_the_same_output_faster(tmp_path: Path) -> None:
    medians = {}
    for name, source in (("baseline", (FILTERS / "filters.cu").read_text()), ("streamified", streamified())):
        binary = build(tmp_path / name, name, source, "native")
        run = subprocess.run([str(binary), "--seed", "3", "--n", "131072"], cwd=binary.parent, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        medians[name] = float(re.search(r"median_ms=([0-9.eE+-]+)", run.stdout).group(1))
    assert (tmp_path / "baseline" / "out.bin").read_bytes() == (tmp_path / "streamified" / "out.bin").read_bytes()
    print(f"filters: baseline {medians['baseline']:.4f} ms, streamified {medians['streamified']:.4f} ms")
    assert medians["streamified"] < medians["baseline"] / 1.3, medians  # four 8-block filters at once
