"""The rule by which an output matches the baseline's: ``np.isclose``'s, in float64, a chunk at a time.

The measuring worker applies it to the files a run wrote (``cluster.measure.measure``), and the
kernel runner's host to the buffers a launch left (``cluster.runners.kernel``): one rule, wherever
the check runs.
"""

from __future__ import annotations

import numpy as np

_CHUNK = 1 << 20  # values compared at a time in float64: no full-size float64 copies of a large output


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None if ``got`` matches ``want`` within tolerance (``np.isclose``'s rule, in float64), else a
    one-line reason. Bitwise-equal outputs (most candidates of a deterministic kernel) are settled by
    one pass in their own dtype, the rest in float64 a chunk at a time: a 64 MB float32 output takes
    about 10 ms when equal and 50 ms when only close, against 130-370 ms for ``np.isclose`` on whole
    float64 copies."""
    if got.shape != want.shape:
        return f"{name}: {got.size} values, the baseline has {want.size}"
    got, want = got.reshape(-1), want.reshape(-1)
    finite = np.isfinite(got)
    if not finite.all():
        bad = ~finite
        return f"{name}: {int(bad.sum())} values are NaN or Inf (first at index {int(np.argmax(bad))})"
    if np.array_equal(got, want):
        return None
    differ, want_finite = 0, bool(np.isfinite(want).all())
    for start in range(0, got.size, _CHUNK):
        close = _close(got[start:start + _CHUNK], want[start:start + _CHUNK], rtol, atol, want_finite)
        if not close.all():
            differ += int(close.size - np.count_nonzero(close))
    if not differ:
        return None
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = int(np.argmax(np.where(np.isnan(err), np.inf, err)))
    return (f"{name}: {differ} of {got.size} values differ "
            f"(max abs error {err[worst]:.3g} at index {worst}: {float(got[worst]):.6g} vs {float(want[worst]):.6g})")


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, want_finite: bool) -> np.ndarray:
    """``np.isclose(got, want, rtol, atol)`` in float64 for a finite ``got``: a non-finite baseline
    value matches none."""
    w = want.astype(np.float64)
    diff = got.astype(np.float64)
    diff -= w
    np.abs(diff, out=diff)
    np.abs(w, out=w)
    w *= rtol
    w += atol
    with np.errstate(invalid="ignore"):
        close = diff <= w
    if not want_finite:
        close &= np.isfinite(want)
    return close
