"""The optimize report's figures: per-optimization speedups (alone and with flags) from rows with
nullable params, and the explanation from Nsight Compute deltas."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cluster.outputs.optimize_report import explain, metric_summary, optimization_results


def rows() -> pd.DataFrame:
    base = {"study": "s", "target": "t", "status": "ok", "source_hash": "base", "p_TILE": pd.NA, "f_opt": ""}
    data = [
        {**base, "phase": "baseline", "candidate_key": "b", "f_maxrregcount": "", "speedup": 1.0},
        {**base, "phase": "search", "candidate_key": "r64", "f_maxrregcount": "-maxrregcount=64", "speedup": 1.7},
        {**base, "phase": "search", "candidate_key": "r64o", "f_maxrregcount": "-maxrregcount=64", "f_opt": "-O3",
         "speedup": 1.9},
        {**base, "phase": "search", "candidate_key": "r128", "f_maxrregcount": "-maxrregcount=128", "speedup": 1.2},
        {**base, "phase": "verify", "candidate_key": "v", "source_hash": "pad", "f_maxrregcount": "",
         "speedup": 1.5, "p_TILE": 32},
        {**base, "phase": "search", "candidate_key": "v2", "source_hash": "pad", "f_maxrregcount": "",
         "f_opt": "-O3", "speedup": 1.6, "p_TILE": 16},
        {**base, "phase": "search", "candidate_key": "bad", "source_hash": "pad", "status": "verify_failed",
         "f_maxrregcount": "", "speedup": None},
    ]
    frame = pd.DataFrame(data)
    frame["p_TILE"] = frame["p_TILE"].astype("Int64")
    return frame


def variants() -> pd.DataFrame:
    common = {"study": "s", "target": "t", "evidence": "ev", "diff": ""}
    return pd.DataFrame([
        {**common, "optimization": "registers", "level": "compiler option", "stage": "accepted", "source_hash": "",
         "search": json.dumps({"maxrregcount": [64]})},
        {**common, "optimization": "padding", "level": "kernel", "stage": "accepted", "source_hash": "pad",
         "search": "{}"},
        {**common, "optimization": "padding", "level": "kernel", "stage": "rejected", "source_hash": "pad2",
         "search": "{}"},
    ])


def test_each_optimization_alone_and_with_flags():
    results = {r.optimization: r for r in optimization_results(rows(), variants())}
    registers, padding = results["registers"], results["padding"]
    assert (registers.alone, registers.best, registers.best_key) == (1.7, 1.9, "r64o")  # 128 was not proposed
    assert (padding.alone, padding.best, padding.accepted, padding.rejected) == (1.5, 1.6, 1, 1)


def test_explain_names_the_deltas_that_matter():
    before = {"bank_conflicts": 65.6e6, "duration_ms": 0.335, "occupancy_pct": 47.0, "registers": 30}
    after = {"bank_conflicts": 0.0, "duration_ms": 0.192, "occupancy_pct": 48.0, "registers": 30}
    assert explain(before, after) == "bank conflicts 65.6M -> 0; kernel time 0.335 ms -> 0.192 ms"
    assert explain({}, after) == ""


def test_metric_summary_sums_counters_over_launches():
    profiles = pd.DataFrame([
        {"candidate_key": "k", "status": "ok", "metric": "gpu__time_duration.sum", "value": 1e5},
        {"candidate_key": "k", "status": "ok", "metric": "gpu__time_duration.sum", "value": 2e5},
        {"candidate_key": "k", "status": "ok", "metric": "sm__warps_active.avg.pct_of_peak_sustained_active",
         "value": 40.0},
        {"candidate_key": "other", "status": "ok", "metric": "gpu__time_duration.sum", "value": 9e9},
    ])
    summary = metric_summary(profiles, "k")
    assert summary["duration_ms"] == pytest.approx(0.3) and summary["occupancy_pct"] == 40.0
    assert metric_summary(profiles, "missing") == {}


def test_a_run_in_which_no_study_ran_gets_a_report_that_says_so(tmp_path):
    """Seen: optimize on a machine without a GPU raised KeyError: 'target' writing its report (an
    empty list picked no columns of the empty variants table)."""
    from cluster.outputs.optimize_report import write_report

    (tmp_path / "meta.json").write_text(json.dumps({"run_id": tmp_path.name}))
    assert write_report(tmp_path).read_text() == (f"# warpfleet optimize: {tmp_path.name}\n\n"
                                                  "No study ran: nothing was measured.\n\n")
