"""`warpfleet export --format launch` and `launch-json`: a kernel target winner's launch geometry."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cluster.core.types import BestConfig
from cluster.outputs.exports import ExportError, ExportRequest, render
from tests.cluster.kernel_targets import N, vadd_kernel, write_kernel_target
from tests.conftest import write_config, write_target


def _best(target="vadd", **params):
    return BestConfig(target, "NVIDIA H100 80GB HBM3 (sm_90)", "sm_90", "nvcc", "k1",
                      {"maxrregcount": "-maxrregcount=64", "fast_math": ""}, params, 0.0123, 0.0246, 2.0, "ms")


def _request(tmp_path, best, **kernel):
    target = write_kernel_target(tmp_path / "vadd", **({"kernel": vadd_kernel(**kernel)} if kernel else {}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"run_id": "r", "config_file": str(write_config(tmp_path, [
        str(target.relative_to(tmp_path)), str(write_target(tmp_path / "tiny").relative_to(tmp_path))]))}))
    return ExportRequest(best, pd.DataFrame(), run)


def test_launch_json_has_the_tuned_geometry(tmp_path):
    request = _request(tmp_path, [_best(block_size_x=512, ITEMS=4)])
    [record] = json.loads(render("launch-json", request))
    assert record["kernel"] == "vadd" and record["block"] == [512, 1, 1] and record["grid"] == [N // 2048, 1, 1]
    assert record["grid_formula"][0] == "ceil(problem_size[0] / (block_size_x * ITEMS))"
    assert record["grid_divisor"][0] == 2048 and record["problem_size"] == [N]
    assert record["flag_argv"] == ["-maxrregcount=64"] and record["params"] == {"block_size_x": 512, "ITEMS": 4}
    assert "-Dblock_size_x=512" in record["defines"] and f"-Dgrid_size_x={N // 2048}" in record["defines"]


def test_launch_header(tmp_path):
    request = _request(tmp_path, [_best(block_size_x=256, ITEMS=1), _best("tiny", N=1000)])
    text = render("launch", request)
    assert "#define WF_VADD_SM_90_BLOCK_X 256\n" in text and "#define WF_VADD_SM_90_SHARED_MEM 0\n" in text
    assert "#define WF_VADD_SM_90_GRID_X(problem) (((problem) + 256 - 1) / 256)" in text
    assert "-maxrregcount=64 -Dblock_size_x=256 -DITEMS=1" in text
    assert "TINY" not in text  # a program target has no launch


def test_launch_of_an_explicit_grid(tmp_path):
    request = _request(tmp_path, [_best(block_size_x=128, ITEMS=1)], problem_size=None, grid_div_x=None,
                       grid=["n // block_size_x", 2])
    text = render("launch", request)
    assert f"#define WF_VADD_SM_90_GRID_X {N // 128}  // n // block_size_x" in text
    assert "#define WF_VADD_SM_90_GRID_Y 2  // 2" in text


def test_launch_needs_a_kernel_target(tmp_path):
    with pytest.raises(ExportError, match="no kernel target"):
        render("launch", _request(tmp_path, [_best("tiny", N=1000)]))
    missing = ExportRequest([_best(block_size_x=128, ITEMS=1)], pd.DataFrame(), tmp_path)
    with pytest.raises(ExportError, match="the run's targets cannot be loaded"):
        render("launch-json", missing)
