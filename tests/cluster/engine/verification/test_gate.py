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


def _budgeted_study(plan: object | None):
    """A study under a time budget (``plan``) whose checks lane records what it is asked; its
    candidates are added by ``measure`` (key, median, source) as the flow's measurements come in."""
    from cluster.core.types import Phase, Stats
    from cluster.engine.verification.checks import Trust

    requested: list[str] = []
    candidates: dict = {}
    results: dict = {}
    stats: dict = {}
    state = SimpleNamespace(
        goal="minimize", baseline_median=10.0, variants={"variant-a": object()}, retired={}, candidates=candidates,
        results=results, own_best="base", target=SimpleNamespace(bundle=SimpleNamespace(hash="own")),
        room=lambda trials: (True, True), baseline_candidate=lambda: candidates["base"],
        ranked=lambda: sorted(candidates.values(), key=lambda c: results[c.key].median))
    checks = SimpleNamespace(pending=lambda: [], trust=lambda source: Trust.NOT_RUN,
                             request=lambda source, why, ticket=None, value=0.0: requested.append(source))
    ctx = SimpleNamespace(plan=plan, config=SimpleNamespace(measure=SimpleNamespace(final_top_k=3),
                                                            search=SimpleNamespace(trials=40)))
    gate = Gate(SimpleNamespace(state=state, stats=stats, checks=checks, ctx=ctx), {})  # type: ignore[arg-type]

    def measure(key: str, median: float, source: str = "own") -> None:
        phase = Phase.BASELINE if key == "base" else Phase.SEARCH
        candidates[key] = SimpleNamespace(key=key, source_hash=source, phase=phase)
        results[key] = SimpleNamespace(median=median)
        stats[key] = Stats(median, median, 0.05, 5)
        if source == "own" and median <= results[state.own_best].median:
            state.own_best = key
        gate.consider(candidates[key], stats[key])

    measure("base", 10.0)
    return gate, measure, requested


def test_a_budgeted_search_buys_a_variants_checks_once_the_own_sources_bar_stands():
    """On an H200 at 300 s softmax_rows' variant at 1.31x had two compute-sanitizer jobs (18.6 s of
    the program's 40 s of GPU time) when its own sources had measured two candidates; their third
    was 1.39x. Under a budget a variant's checks wait for the own sources' first three."""
    gate, measure, requested = _budgeted_study(plan=object())
    measure("own-1", 12.0)
    measure("a-1", 7.0, "variant-a")  # beats the baseline, the only bar so far
    assert requested == [] and gate.deferred
    measure("own-2", 11.0)
    assert requested == []
    measure("own-3", 9.0)  # the third: the bar stands, and the variant still beats it
    assert requested == ["variant-a"] and not gate.deferred

    gate, measure, requested = _budgeted_study(plan=object())
    for key, median in (("own-1", 12.0), ("a-1", 7.0), ("own-2", 11.0), ("own-3", 6.5)):
        measure(key, median, "variant-a" if key.startswith("a") else "own")
    assert requested == []  # overtaken: its checks would have bought nothing

    gate, measure, requested = _budgeted_study(plan=None)  # no budget: at once, as before
    measure("a-1", 7.0, "variant-a")
    assert requested == ["variant-a"]
