"""scripts/bench_sim.py's figures of a study's structure, from the rows' timestamps."""

from __future__ import annotations

import sys

import pandas as pd
import pytest

from tests.conftest import REPO


def rows(spans: list[tuple[str, float, float]]) -> pd.DataFrame:
    stamp = pd.Timestamp("2026-11-26T12:00:00Z")
    return pd.DataFrame({"phase": [p for p, _, _ in spans],
                         "started_at": [stamp + pd.Timedelta(seconds=a) for _, a, _ in spans],
                         "finished_at": [stamp + pd.Timedelta(seconds=b) for _, _, b in spans]})


def test_structure_separates_the_baseline_and_finals_from_the_steady_search():
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_sim

    # Two workers: the baseline holds 0-2 s, then back-to-back 1 s candidates on both from 3 s to 23 s
    # (20 each), then the finals 23-24 s. In the middle of the search both workers are always busy.
    spans = [("baseline", 0.0, 2.0)]
    spans += [("search", 3.0 + i, 4.0 + i) for i in range(20) for _ in range(2)]
    spans += [("final", 23.0, 24.0)]
    figures = bench_sim.structure(rows(spans), workers=2)
    assert figures["baseline_s"] == 2.0 and figures["first_search_s"] == 3.0 and figures["finals_s"] == 1.0
    assert figures["busy_mid_search"] == pytest.approx(1.0, abs=0.01)
    assert figures["rate_mid_search_per_s"] == pytest.approx(2.0, rel=0.1)
    # One worker idle half the time: half as busy, whatever the baseline and finals.
    half = [("baseline", 0.0, 2.0)] + [("search", 3.0 + 2 * i, 4.0 + 2 * i) for i in range(20)] + [("final", 43, 44)]
    assert bench_sim.structure(rows(half), workers=1)["busy_mid_search"] == pytest.approx(0.5, abs=0.06)
