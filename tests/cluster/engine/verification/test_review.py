"""The >10x rule on ordinary sweep rows: a candidate far faster than its baseline is run again on
fresh seeds; one that fails is kept out of the selection, and every verdict is in reviews/."""

from __future__ import annotations

import pytest
import yaml

from cluster.config import load_run
from cluster.engine.driver import REVIEW_SCHEMA, Sweep
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_local")


def test_a_suspiciously_fast_candidate_that_fails_fresh_seeds_is_not_selected(tmp_path):
    config = {"name": "review", "output_dir": str(tmp_path),
              "targets": [str(REPO / "tests/fixtures/targets/suspect/target.yaml")],
              "search": {"sampler": "grid", "trials": 2},
              "measure": {"runs": 2, "final_top_k": 2, "final_runs": 2}}
    path = tmp_path / "review.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = load_run(path)
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)
    rows = read_results(run_dir.path)
    fast = rows[(rows["p_MODE"] == 1) & (rows["phase"] == "search") & (rows["status"] == "ok")]
    assert len(fast) >= 1 and fast["speedup"].max() > 10  # right on the sweep's seeds, and far faster
    reviews = read_table(run_dir.path, "reviews", REVIEW_SCHEMA)
    assert set(reviews["status"]) == {"failed"} and reviews["detail"].str.contains("seed 1000003").all()
    failed = rows[(rows["phase"] == "final") & (rows["status"] == "verify_failed")]
    assert set(failed["candidate_key"]) == set(reviews["candidate_key"])
    [best] = select_best(rows)
    assert best.params["MODE"] == 0  # the honest configuration, however much slower
