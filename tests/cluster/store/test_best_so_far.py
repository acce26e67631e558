"""A run stopped (or ended by its time budget) before a study's finals shows that study's best so
far, marked not re-measured, wherever a user looks: show, export (with --unconfirmed only), report,
compare. Never 1.00x while a faster verified candidate was measured (issue 25, item 5)."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_target
from cluster.core.types import Phase
from cluster.store.results import read_results
from cluster.store.select import NOT_REMEASURED, Verified, best_so_far, load_verified, select_best
from tests.cluster.outputs.fake_runs import Row, gpu, write_run
from tests.conftest import REPO

H100 = gpu("NVIDIA H100 80GB HBM3", "9.0")


def stopped_run(tmp_path):
    """A saxpy study stopped in its search: the baseline at 1.0 ms, a search candidate at 0.5 ms."""
    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    return write_run(tmp_path, "stopped", target, H100, [
        Row({"BLOCK": 256, "ITEMS": 1}, (1.0, 1.01, 0.99), phase=Phase.BASELINE),
        Row({"BLOCK": 512, "ITEMS": 1}, (0.9, 0.91, 0.92)),
        Row({"BLOCK": 128, "ITEMS": 4}, (0.5, 0.5, 0.51)),
    ])


def test_show_and_export_give_the_best_so_far_of_a_stopped_run(tmp_path):
    run = stopped_run(tmp_path)
    [best] = select_best(read_results(run), load_verified(run))
    assert not best.remeasured and best.reason == NOT_REMEASURED and best.speedup > 1.9
    assert best.params == {"BLOCK": 128, "ITEMS": 4}
    assert select_best(read_results(run))[0].speedup == 1.0  # the selection's own rule: finals only

    shown = CliRunner().invoke(main, ["show", str(run)])
    assert shown.exit_code == 0, shown.output
    assert "2.00x" in shown.output and "not re-measured" in shown.output
    assert "(not re-measured): the best measured so far" in " ".join(shown.output.split())
    assert "not re-measured: not re-measured" not in " ".join(shown.output.split())  # the footnote said it twice

    refused = CliRunner().invoke(main, ["export", str(run), "--format", "json"])
    assert refused.exit_code == 2 and "--unconfirmed" in refused.output and len(refused.output.splitlines()) == 1
    exported = CliRunner().invoke(main, ["export", str(run), "--format", "json", "--unconfirmed"])
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.output)[0]["params"] == {"BLOCK": 128, "ITEMS": 4}

    report = CliRunner().invoke(main, ["report", str(run), "--output", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    assert "(not re-measured): the best measured so far" in (tmp_path / "report" / "report.md").read_text()


def rows_of(source: str, ratio: float, key: str) -> dict:
    return {"target": "t", "device_type": "gpu (sm_90)", "arch": "sm_90", "toolchain": "nvcc", "candidate_key": key,
            "phase": "search", "status": "ok", "median": 1.0 / ratio, "iqr": 0.0, "goal": "minimize", "unit": "ms",
            "source_hash": source, "samples": [1.0 / ratio]}


def test_a_variant_counts_once_its_checks_passed_and_a_10x_candidate_once_reviewed():
    baseline = {**rows_of("own", 1.0, "base"), "phase": "baseline"}
    rows = pd.DataFrame([baseline, rows_of("own", 1.5, "flags"), rows_of("v", 3.0, "variant"),
                         rows_of("own", 20.0, "suspect")])
    assert best_so_far(rows, Verified()).candidate_key == "flags"  # the variant unchecked, the 20x unreviewed
    assert best_so_far(rows, Verified({"v": "passed"})).candidate_key == "variant"
    assert best_so_far(rows, Verified({"v": "failed"}, {"suspect": "passed"})).candidate_key == "suspect"
    finished = pd.concat([rows, pd.DataFrame([{**rows_of("own", 1.5, "flags"), "phase": "final"}])])
    assert best_so_far(finished, Verified({"v": "passed"})) is None  # finals ran: the selection decides
