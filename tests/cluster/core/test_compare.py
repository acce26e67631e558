"""The output comparison rule (np.isclose's, in float64, chunk by chunk)."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.core.compare import compare


def test_compare_reports_differences_nan_and_size():
    want = np.arange(10, dtype=np.float32)
    assert compare("o", want.copy(), want, 1e-5, 1e-8) is None
    bad = want.copy()
    bad[3] += 1
    assert "1 of 10 values differ" in compare("o", bad, want, 1e-5, 1e-8)
    bad[3] = np.nan
    assert "NaN or Inf" in compare("o", bad, want, 1e-5, 1e-8)
    assert "9 values, the baseline has 10" in compare("o", want[:9], want, 1e-5, 1e-8)


@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_compare_is_isclose_in_float64_chunk_by_chunk(monkeypatch, chunk):
    """The chunked comparison decides as np.isclose on float64 copies does, across chunk boundaries,
    dtypes, scales, tolerance edges and non-finite baseline values (none of which a finite value
    matches), and counts the same differing values."""
    from cluster.core import compare as measure

    monkeypatch.setattr(measure, "_CHUNK", chunk)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        dtype = rng.choice([np.float32, np.float64, np.int32])
        want = (rng.standard_normal(n) * rng.choice([1e-6, 1.0, 1e6])).astype(dtype)
        got = want.copy()
        idx = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        if dtype is np.int32:
            got[idx] += rng.integers(0, 2, size=len(idx)).astype(dtype)
        else:
            got[idx] = (got[idx] * (1 + rng.choice([1e-9, 1e-5, 1e-3], size=len(idx)))
                        + rng.choice([0.0, 1e-8, 1e-4], size=len(idx))).astype(dtype)
            if rng.random() < 0.2:
                want[rng.integers(0, n)] = rng.choice([np.inf, -np.inf, np.nan])
        expected = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-8)
        said = compare("o", got, want, 1e-5, 1e-8)
        if expected.all():
            assert said is None, (said, got, want)
        else:
            assert said is not None and said.startswith(f"o: {int((~expected).sum())} of {n} values differ"), said
