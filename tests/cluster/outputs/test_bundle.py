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


def test_an_output_file_needs_its_folder_a_bundle_makes_its_own_and_what_cannot_be_written_is_one_line(tmp_path):
    """Seen: `export --output newdir/x.flags` and `compare --output` made the folders without a word
    (a typo sends a result somewhere new: refused, as cp does), and a bundle to a place that cannot
    be written ended in a traceback."""
    run = _one_run_on_three_gpus(tmp_path)
    runner = CliRunner()
    for args in (["export", str(run), "--device", "sm_80", "--output"], ["compare", str(run), "--no-compile",
                                                                          "--output"]):
        refused = runner.invoke(main, [*args, str(tmp_path / "newdir" / "x")])
        assert refused.exit_code == 2 and refused.output.splitlines() == [
            f"error: {tmp_path / 'newdir' / 'x'}: --output: no folder {tmp_path / 'newdir'} to write it in "
            "(make it first)"], refused.output
    assert not (tmp_path / "newdir").exists()
    made = tmp_path / "x.flags"
    result = runner.invoke(main, ["export", str(run), "--device", "sm_80", "--output", str(made)])
    assert result.exit_code == 0 and made.read_text() == "-maxrregcount=32 -DBLOCK=64 -DITEMS=8\n"
    bundle = tmp_path / "new" / "bundle"  # a folder of outputs: made, with the folders above it
    assert runner.invoke(main, ["export", str(run), "--format", "bundle", "--output", str(bundle)]).exit_code == 0
    assert (bundle / "warpfleet.json").is_file()
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = blocker / "sub" / "x"
    result = runner.invoke(main, ["export", str(run), "--format", "bundle", "--output", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"error: {out}: --output: cannot be written") and "Not a directory" in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before and blocker.read_text() == "mine"
