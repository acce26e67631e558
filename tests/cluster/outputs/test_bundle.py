"""The per-architecture bundle: every export of a run's winners in one folder, through the CLI."""

from __future__ import annotations

import json
import shlex

import pandas as pd
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_target
from cluster.core.types import Phase
from cluster.store.results import read_results
from tests.cluster.outputs.fake_runs import Row, gpu, write_run
from tests.conftest import REPO

SAXPY = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
DEVICES = {"h100": gpu("NVIDIA H100 80GB HBM3", "9.0"), "h200": gpu("NVIDIA H200", "9.0"),
           "a100": gpu("NVIDIA A100-SXM4-80GB", "8.0")}
WINNERS = {"h100": ({"BLOCK": 128, "ITEMS": 4}, {"opt_level": "-Xptxas -O2"}),
           "h200": ({"BLOCK": 512, "ITEMS": 2}, {}),
           "a100": ({"BLOCK": 64, "ITEMS": 8}, {"maxrregcount": "-maxrregcount=32"})}


def _one_run_on_three_gpus(tmp_path):
    """One run directory holding a study per GPU (a multi-architecture sweep)."""
    for name, device in DEVICES.items():
        params, flags = WINNERS[name]
        run = write_run(tmp_path, "multi", SAXPY, device, [
            Row({"BLOCK": 256, "ITEMS": 1}, (2.0, 2.0, 2.0), phase=Phase.BASELINE),
            Row(params, (1.0, 1.0, 1.0), flags), Row(params, (1.0,) * 5, flags, phase=Phase.FINAL)])
    return run


def test_bundle_holds_every_format_per_arch(tmp_path):
    run = _one_run_on_three_gpus(tmp_path)
    assert set(read_results(run)["device_type"]) == {d.device_type for d in DEVICES.values()}
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    result = CliRunner().invoke(main, ["export", str(run), "--format", "bundle", "--output", str(out)])
    assert result.exit_code == 0, result.output
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert files == {
        "mine.txt", "warpfleet.json", "warpfleet.yaml", "warpfleet_tuned.h", "warpfleet.cmake",
        "flags/saxpy/sm_80.txt", "flags/saxpy/sm_90.txt", "flags/saxpy/sm_90-NVIDIA-H200-sm_90.txt",
        "t4/saxpy@NVIDIA-A100-SXM4-80GB-sm_80.json", "t4/saxpy@NVIDIA-H100-80GB-HBM3-sm_90.json",
        "t4/saxpy@NVIDIA-H200-sm_90.json",
    }
    assert (out / "mine.txt").read_text() == "kept"
    assert shlex.split((out / "flags/saxpy/sm_80.txt").read_text()) == ["-maxrregcount=32", "-DBLOCK=64", "-DITEMS=8"]
    assert shlex.split((out / "flags/saxpy/sm_90.txt").read_text()) == ["-Xptxas", "-O2", "-DBLOCK=128", "-DITEMS=4"]
    header = (out / "warpfleet_tuned.h").read_text()
    assert "__CUDA_ARCH__ == 800" in header and "__CUDA_ARCH__ == 900" in header
    assert "WARPFLEET_SAXPY_SM_80_FLAGS" in (out / "warpfleet.cmake").read_text()
    records = json.loads((out / "warpfleet.json").read_text())
    assert [r["arch"] for r in records] == ["sm_80", "sm_90", "sm_90"]
    assert {r["source_hash"] for r in records} == {SAXPY.bundle.hash}
    t4 = json.loads((out / "t4/saxpy@NVIDIA-H200-sm_90.json").read_text())
    assert t4["schema_version"] == "1.0.0" and len(t4["results"]) == 2


def test_bundle_needs_a_folder(tmp_path):
    run = _one_run_on_three_gpus(tmp_path)
    runner = CliRunner()
    missing = runner.invoke(main, ["export", str(run), "--format", "bundle"])
    assert missing.exit_code == 2 and "--output: a bundle needs a folder" in missing.output
    afile = tmp_path / "file"
    afile.write_text("mine")
    refused = runner.invoke(main, ["export", str(run), "--format", "bundle", "--output", str(afile)])
    assert refused.exit_code == 2 and "is not a folder" in refused.output and afile.read_text() == "mine"
    device = runner.invoke(main, ["export", str(run), "--device", "B200"])
    assert device.exit_code == 2 and "--device" in device.output
    only = runner.invoke(main, ["export", str(run), "--device", "sm_80"])
    assert only.exit_code == 0 and only.output == "-maxrregcount=32 -DBLOCK=64 -DITEMS=8\n"
    assert isinstance(read_results(run), pd.DataFrame)


def test_an_output_in_a_folder_not_yet_made_is_written_and_one_that_cannot_be_is_one_line(tmp_path):
    """Seen: `export --output newdir/x.flags`, `compare --output` and a bundle to a place that
    cannot be written ended in tracebacks, where `report` makes its folder or says why not."""
    run = _one_run_on_three_gpus(tmp_path)
    runner = CliRunner()
    made = tmp_path / "newdir" / "x.flags"
    result = runner.invoke(main, ["export", str(run), "--device", "sm_80", "--output", str(made)])
    assert result.exit_code == 0 and made.read_text() == "-maxrregcount=32 -DBLOCK=64 -DITEMS=8\n"
    compared = tmp_path / "cmp" / "matrix.md"
    assert runner.invoke(main, ["compare", str(run), "--no-compile", "--output", str(compared)]).exit_code == 0
    assert "saxpy" in compared.read_text()
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    for args in (["export", str(run), "--output"], ["export", str(run), "--format", "bundle", "--output"],
                 ["compare", str(run), "--no-compile", "--output"]):
        out = blocker / "sub" / "x"
        result = runner.invoke(main, [*args, str(out)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        [line] = result.output.splitlines()
        assert line.startswith(f"error: {out}: --output: cannot be written") and "Not a directory" in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before and blocker.read_text() == "mine"
