"""A study's finals (cluster.engine.finals) under a time budget: a finalist given up because its
checks could not finish in time is taken back when they pass while its final still fits, and the
study waits for them only so long. The flow and the gate are test doubles; the time plan is real."""

from __future__ import annotations

import time
from types import SimpleNamespace

from cluster.engine.finals import Finals
from cluster.engine.plan.budget import SAFETY, TimePlan
from cluster.engine.verification.checks import Trust
from tests.conftest import logged_lines

RUN_S, OVERHEAD_S, RUNS = 1.0, 0.5, 5
FINAL_S = OVERHEAD_S + RUNS * RUN_S  # one finalist's final


class Gate:
    def __init__(self, trust: Trust) -> None:
        self.trust_is = trust

    def trust(self, candidate, ask: bool = True) -> Trust:
        return self.trust_is


def finals_with_one_given_up(trust: Trust, time_left_s: float) -> tuple[Finals, list[str]]:
    plan = TimePlan(1000.0, started_at=time.monotonic() - (1000.0 - time_left_s), finals=(3, RUNS))
    candidate = SimpleNamespace(key="k")
    flow = SimpleNamespace(name="s@H100", device_type="H100", ctx=SimpleNamespace(plan=plan, config=SimpleNamespace(
                               measure=SimpleNamespace(final_top_k=3, final_runs=RUNS))),
                           state=SimpleNamespace(candidates={"k": candidate}), run_estimate=RUN_S,
                           job_overhead=OVERHEAD_S, awaited=set())
    finals = Finals(flow, Gate(trust))  # type: ignore[arg-type]
    finals.reference_ready, finals.gave_up = True, ["k"]
    submitted: list[str] = []
    finals._submit = lambda c, extend=False: submitted.append(c.key)  # type: ignore[method-assign]
    return finals, submitted


def test_a_given_up_finalist_whose_checks_pass_in_time_has_its_final():
    lines = logged_lines()
    finals, submitted = finals_with_one_given_up(Trust.PASSED, time_left_s=100.0)
    finals.step()
    assert submitted == ["k"] and finals.gave_up == []
    assert any("its checks passed after all" in line and "back in the finals" in line for line in lines)


def test_the_study_waits_for_its_given_up_finalists_checks_while_a_final_fits():
    finals, submitted = finals_with_one_given_up(Trust.PENDING, time_left_s=SAFETY * FINAL_S + 20)
    assert finals.step() is False and submitted == []  # not done: its checks may still pass


def test_the_study_ends_when_no_final_fits_any_more():
    finals, submitted = finals_with_one_given_up(Trust.PENDING, time_left_s=SAFETY * FINAL_S - 1)
    assert finals.step() is True and submitted == []
    finals.gate.trust_is = Trust.PASSED  # too late now: no final for it
    finals.step()
    assert submitted == []


def test_a_given_up_finalist_whose_checks_failed_is_dropped():
    finals, submitted = finals_with_one_given_up(Trust.FAILED, time_left_s=100.0)
    assert finals.step() is True and submitted == [] and finals.gave_up == []


def test_the_baseline_s_final_that_made_the_finals_references_is_not_run_again(monkeypatch, tmp_path):
    """Seen on an H200 (2026-11-29): on a seeded target the baseline's final, which makes the finals'
    references, was submitted again once its outputs were in: two baseline finals a study."""
    from cluster.core.types import Measurement, RunOutputs, Status
    from cluster.engine import finals as module
    from cluster.measure.measure import Reference

    finals, submitted = finals_with_one_given_up(Trust.PASSED, time_left_s=100.0)
    baseline = SimpleNamespace(key="base")
    finals.flow.state.baseline_candidate = lambda: baseline
    finals.flow.ctx.run_dir = tmp_path
    finals.reference = Reference((RunOutputs(),))
    monkeypatch.setattr(module, "save_reference", lambda *args: None)
    monkeypatch.setattr(module.ray, "put", lambda value: value)
    done = Measurement("base", Status.OK, None, outputs=(RunOutputs(),) * RUNS)
    finals.measured("base", done, extended=True)
    assert "base" not in submitted and finals.reference_ready
    finals.referenced(done)  # from a reference job (references/ lost): the baseline's final runs then
    assert submitted.count("base") == 1


def finals_with_pending_variants(candidates, trust: dict[str, Trust], top_k: int = 1):
    """Finals with ``top_k`` places over ``candidates`` (best first): sources in ``trust`` are
    variants whose checks stand there; the others need none."""
    plan = TimePlan(1000.0, started_at=time.monotonic() - 900.0, finals=(top_k, RUNS))

    class Checks:
        def trust(self, source_hash):
            return trust.get(source_hash, Trust.NOT_RUN)

        def pending(self):
            return [h for h, t in trust.items() if t is Trust.PENDING]

    class Gated(Gate):
        check_slots = 1

        def trust(self, candidate, ask: bool = True) -> Trust:
            return trust.get(candidate.source_hash, Trust.PASSED)

        def could_win(self, candidate) -> bool:
            return True

        def promote(self) -> None:
            return None

    flow = SimpleNamespace(name="s@H100", device_type="H100", checks=Checks(), awaited=set(),
                           ctx=SimpleNamespace(plan=plan, config=SimpleNamespace(
                               measure=SimpleNamespace(final_top_k=top_k, final_runs=RUNS))),
                           state=SimpleNamespace(candidates={c.key: c for c in candidates},
                                                 variants={h: object() for h in trust}),
                           run_estimate=RUN_S, job_overhead=OVERHEAD_S)
    finals = Finals(flow, Gated(Trust.PASSED))  # type: ignore[arg-type]
    finals.reference_ready, finals.pool = True, list(candidates)
    submitted = finals.finalists  # as the real ``_submit`` records them
    finals._submit = lambda c, extend=False: submitted.append(c.key)  # type: ignore[method-assign]
    return finals, submitted


def test_a_variant_waiting_for_its_checks_takes_no_place_of_the_candidates_that_need_none():
    """With one finalist's place (a budget made the finals smaller), a variant whose checks are
    pending waits beside it: the best candidate of the target's own sources has its final at once,
    and the variant has one too once its checks pass (on an H200 three studies whose one place was
    held by a variant's pending checks ended at 1.00x)."""
    variant, own, other = (SimpleNamespace(key=k, source_hash=h) for k, h in
                           (("v", "variant"), ("own", "src"), ("other", "src")))
    trust = {"variant": Trust.PENDING}
    finals, submitted = finals_with_pending_variants([variant, own, other], trust)
    assert finals.step() is False
    assert submitted == ["own"] and finals.holding == {"v"}
    trust["variant"] = Trust.PASSED
    finals.step()
    assert submitted == ["own", "v"] and not finals.holding


def test_no_more_candidates_wait_for_checks_than_there_are_places():
    """Seen on CI (a fake GPU, 40 s): 300 search candidates of one variant were all held for its
    checks, the log said so 300 times, and each would have had a final once the checks passed. As
    many wait as there are places; the others stay in the pool."""
    many = [SimpleNamespace(key=f"v{i}", source_hash="variant") for i in range(50)]
    own = SimpleNamespace(key="own", source_hash="src")
    trust = {"variant": Trust.PENDING}
    finals, submitted = finals_with_pending_variants([*many, own], trust, top_k=2)
    finals.step()
    assert submitted == ["own"] and finals.holding == {"v0", "v1"}
    assert [c.key for c in finals.pool] == [f"v{i}" for i in range(2, 50)]
    trust["variant"] = Trust.PASSED
    finals.step()
    assert submitted == ["own", "v0", "v1"] and not finals.holding
    assert finals.step() is True  # the finals are full: the rest of the pool waits for nothing


def test_every_finalists_final_is_watched_for_a_cache_and_a_variants_is_poisoned():
    """The finals' runs are the cheat checks: a finalist of the target's own sources (flags and
    params: a param may switch the user's code to a cache kept in the host) is watched for a cache as
    a variant is; only a variant's outputs are poisoned (a target that sums into its outputs would
    fail its own), and the baseline's final, which makes the references, is watched for neither."""
    from cluster.engine.scheduling.jobs import JobKind

    def candidate(key: str, source: str):
        return SimpleNamespace(key=key, source_hash=source, with_phase=lambda phase: key)

    base, own, variant = candidate("base", "own"), candidate("flags", "own"), candidate("v1", "variant")
    jobs: list[dict] = []
    flow = SimpleNamespace(
        state=SimpleNamespace(source_of=lambda c: (c.source_hash,), baseline_candidate=lambda: base,
                              variants={"variant": object()}, reference="reference"),
        jobs=SimpleNamespace(build=lambda source, key: key,
                             job=lambda kind, build, **fields: {"kind": kind, "build": build, **fields}),
        submit=jobs.append, stats={"flags": SimpleNamespace(median=2.5)},
        ctx=SimpleNamespace(plan=None, config=SimpleNamespace(
            measure=SimpleNamespace(final_top_k=2, final_runs=RUNS), agents=SimpleNamespace(guardrails=True))))
    finals = Finals(flow, Gate(Trust.PASSED))  # type: ignore[arg-type]
    for c in (base, own, variant):
        finals._submit(c, extend=c is base)
    args = {job["build"]: job["args"] for job in jobs}
    assert {job["kind"] for job in jobs} == {JobKind.FINAL}
    assert args["base"] == {"poison": False, "cache_check": False, "earlier": None}
    # Its search's median, a first run of its own: a load that slowed its final's first run is no cache.
    assert args["flags"] == {"poison": False, "cache_check": True, "earlier": 2.5}
    assert args["v1"] == {"poison": True, "cache_check": True, "earlier": None}


def test_a_noisy_final_of_a_finalist_is_run_once_more_where_it_fits():
    """cs_sortingNetworks on an H200: two of its finalist's three final runs 28% slow on the host
    (IQR/median 0.248 against measure.max_noise 0.05), and its 11% win lost to the baseline. Its final
    runs once more, once; a quiet final, the baseline's, or one that no longer fits, does not."""
    from cluster.core.types import Stats, Status

    def measurement(samples: list[float]):
        return SimpleNamespace(status=Status.OK, stats=Stats.of(samples))

    noisy, quiet = measurement([0.49, 0.48, 0.50, 0.38, 0.38, 0.38, 0.52, 0.37]), measurement([0.382] * 8)
    finals, submitted = finals_with_one_given_up(Trust.PASSED, time_left_s=100.0)
    finals.flow.ctx.config.measure.max_noise = 0.05
    finals.flow.state.goal = "minimize"
    finals.flow.stats = {"k": Stats.of([0.374] * 8)}  # its search's
    finals.measured("k", measurement([0.30, 0.36, 0.40, 0.37, 0.38, 0.36, 0.44, 0.37]), extended=False)
    assert submitted == []  # noisy, but it bears its search out
    finals.flow.state.candidates.update(base=SimpleNamespace(key="base"))
    finals.baseline_key = "base"
    lines = logged_lines()
    finals.measured("k", quiet, extended=False)
    assert submitted == []
    finals.measured("base", noisy, extended=False)
    assert submitted == []
    finals.measured("k", noisy, extended=False)
    assert submitted == ["k"] and any("its final was noisy" in line for line in lines)
    finals.measured("k", noisy, extended=False)
    assert submitted == ["k"]  # once
    late, late_submitted = finals_with_one_given_up(Trust.PASSED, time_left_s=SAFETY * FINAL_S - 1)
    late.flow.ctx.config.measure.max_noise = 0.05
    late.flow.state.goal, late.flow.stats = "minimize", {"k": Stats.of([0.374] * 8)}
    late.measured("k", noisy, extended=False)
    assert late_submitted == []
