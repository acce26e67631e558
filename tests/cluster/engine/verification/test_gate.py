"""The gate's worth of a candidate (cluster.engine.verification.gate): what trusting it may gain its study, the
place of its expensive checks in their lane. The flow is a test double."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster.engine.verification.gate import Gate


def gate_of(goal: str, baseline: float, measured: dict[str, tuple[float, str]]) -> Gate:
    """A study whose candidates (key: (median, source)) were measured; "own" is the target's sources."""
    better = (lambda k: measured[k][0]) if goal == "minimize" else (lambda k: -measured[k][0])
    own = [k for k in sorted(measured, key=better) if measured[k][1] == "own"]
    state = SimpleNamespace(
        goal=goal, baseline_median=baseline, variants={"variant-a": object(), "variant-b": object()},
        results={k: SimpleNamespace(median=m) for k, (m, _) in measured.items()},
        own_best=own[0] if own else None,  # as StudyState keeps it
        ranked=lambda: [SimpleNamespace(key=k, source_hash=measured[k][1]) for k in sorted(measured, key=better)])
    return Gate(SimpleNamespace(state=state), {})  # type: ignore[arg-type]


def test_a_candidates_gain_is_over_the_best_of_the_targets_own_sources():
    """A variant at 5 ms where the flags already reached 8 ms gains 1.6x, not the 2x over the
    baseline's 10 ms; a second variant does not raise the bar (its own checks are pending too)."""
    gate = gate_of("minimize", 10.0, {"base": (10.0, "own"), "flags": (8.0, "own"),
                                      "a": (5.0, "variant-a"), "b": (4.0, "variant-b")})
    assert gate.gain(5.0) == pytest.approx(1.6) and gate.gain(4.0) == pytest.approx(2.0)
    assert gate.gain(9.0) < 1.0  # slower than the best it would replace: least valuable
    only_baseline = gate_of("minimize", 10.0, {"base": (10.0, "own"), "a": (5.0, "variant-a")})
    assert only_baseline.gain(5.0) == pytest.approx(2.0)
    rate = gate_of("maximize", 100.0, {"base": (100.0, "own"), "flags": (150.0, "own"), "a": (300.0, "variant-a")})
    assert rate.gain(300.0) == pytest.approx(2.0)
    assert gate.gain(None) == 0.0


def test_a_variant_could_win_only_beyond_the_noise_of_the_own_sources_best():
    """A variant's expensive checks are spent only where it beats the best of the target's own
    sources beyond their noise: faster than the baseline is not enough where the flags are faster
    still (on an H200 checks of such variants took a quarter of a 300 s sweep's GPU time)."""
    from cluster.core.types import Stats

    gate = gate_of("minimize", 10.0, {"base": (10.0, "own"), "flags": (8.0, "own"),
                                      "a": (9.0, "variant-a"), "b": (5.0, "variant-b")})
    stats = {k: Stats(m, m, 0.1, 5) for k, (m, _) in
             {"base": (10.0, 0), "flags": (8.0, 0), "a": (9.0, 0), "b": (5.0, 0)}.items()}
    gate.flow.stats = stats
    gate.flow.state.baseline_candidate = lambda: SimpleNamespace(key="base")
    assert gate.own_best() is stats["flags"]
    a, b = (SimpleNamespace(key=k, source_hash=f"variant-{k}") for k in "ab")
    assert not gate.could_win(a)  # faster than the baseline, not than the flags' best
    assert gate.could_win(b)
    assert not gate.could_win(b, Stats(7.95, 7.95, 0.5, 5))  # within the noise of the flags' 8 ms
