"""scripts/bench_portability.py: it stops early and loudly on bad input, and on the CPU (a C
config, --allow-cpu) sweeps, evaluates another machine's winners here, compares and reports."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.cluster.outputs.portability_runs import stencil_config
from tests.conftest import REPO, gpu_present

_SPEC = importlib.util.spec_from_file_location("bench_portability", REPO / "scripts" / "bench_portability.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_a_run_that_is_not_one_stops_it_before_any_sweep(tmp_path):
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--allow-cpu", "--other", str(tmp_path / "nope")]) == 1
    log = (out / "bench.log").read_text()
    assert "FAILED: " in log and "not a warpfleet run directory" in log
    assert json.loads((out / "summary.json").read_text())["failed"]
    assert not (out / "runs").exists()


@pytest.mark.skipif(gpu_present(), reason="a GPU is here: the check passes")
def test_no_gpu_stops_it(tmp_path):
    assert bench.main(["--out", str(tmp_path)]) == 1
    assert "FAILED: " in (tmp_path / "bench.log").read_text()
    assert not (tmp_path / "runs").exists()


def test_on_the_cpu_it_sweeps_evaluates_the_other_machines_winners_compares_and_reports(
        tmp_path, portability_cpu_runs):
    other = portability_cpu_runs["a"]  # the stencil swept "on another machine"
    config = stencil_config(tmp_path, "b")
    out = tmp_path / "out"
    assert bench.main(["--out", str(out), "--allow-cpu", "--config", str(config), "--trials", "2",
                       "--final-runs", "1", "--other", str(other)]) == 0, (out / "bench.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["steps"]) == {"sweep_s", "evaluate_s", "compare_report_s"} and "failed" not in summary
    [matrix] = json.loads((out / "matrix.json").read_text())
    assert portability_cpu_runs["other"] in matrix["devices"]
    cells = {(c["config_id"], c["device"]): c for c in matrix["cells"]}
    tuned_elsewhere = next(c for c in matrix["configs"] if portability_cpu_runs["other"] in c["tuned_on"])
    here = next(d for d in matrix["devices"] if d != portability_cpu_runs["other"])
    assert cells[(tuned_elsewhere["config_id"], here)]["how"] == "same run"  # evaluated here
    assert "### stencil_c" in (out / "matrix.md").read_text()
    assert (out / "report" / "report.html").is_file() and (out / "report" / "speedup.png").is_file()
    assert len(list((out / "runs").iterdir())) == 2  # the sweep and the evaluation
