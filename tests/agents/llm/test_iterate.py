"""Profile-guided iteration: proposals of a round in parallel through the real client, measured
by an injected function, the best carried into the next round with feedback from the metric
deltas, the 10x rule, and the round and token budgets."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.llm import Services, Trial, build_steps, feedback_text, trial_record
from agents.llm.iterate import iterate
from agents.llm.testing import Conversation, Reply, call
from agents.workflow.steps import Finding, Level, Plan, Verdict, VerdictStatus
from tests.agents.llm.conftest import spec_for

PLAN = Plan(Finding("unroll", Level.KERNEL, "work.c:27", True), ("mark the compute function",))
SPEED = {"A": 1.2, "B": 1.5, "C": 1.8, "D": 1.1}
METRICS = {"A": {"registers": 40.0}, "B": {"registers": 56.0, "spill_stores": 0.0}, "C": {"registers": 60.0},
           "D": {"registers": 30.0}}


def marking(name: str, delay_s: float = 0.0) -> list[Reply]:
    edit = {"op": "insert_at_anchor", "path": "work.c", "anchor": "static void compute", "after": False,
            "text": f"/* variant {name} */"}
    return [Reply(tool_calls=[call("read_source", path="work.c", start_line=20, end_line=26)], delay_s=delay_s),
            Reply(tool_calls=[call("edit", edits=[edit])]),
            Reply(tool_calls=[call("finish", description=name)])]


def rounds_script(delay_s: float = 0.0) -> list[Conversation]:
    feedback = "Feedback on the previous proposals"
    return [Conversation((feedback, "proposal 1 of 2"), marking("C")),
            Conversation((feedback, "proposal 2 of 2"), marking("D")),
            Conversation("proposal 1 of 2", marking("A", delay_s)),
            Conversation("proposal 2 of 2", marking("B", delay_s))]


class FakeMeasure:
    """Stands in for the driver's pipeline: a speedup and metrics per description."""

    def __init__(self, speed: dict[str, float] | None = None) -> None:
        self.speed = speed or SPEED
        self.rounds: list[list[Proposal]] = []
        self.lock = threading.Lock()

    def __call__(self, context: AnalysisContext, proposals: Sequence[Proposal]) -> list[Trial]:
        with self.lock:
            self.rounds.append(list(proposals))
        return [Trial(p, "ok", 21.0 / self.speed[p.description], self.speed[p.description],
                      METRICS.get(p.description, {})) for p in proposals]


def transformer(server, tmp_path: Path, **spec):  # type: ignore[no-untyped-def]
    [steps] = build_steps(spec_for(server, **spec), {"unroll": {"analyst": "llm", "planner": "llm",
                                                                 "transformer": "llm"}},
                          run_dir=tmp_path, services=Services())
    return steps.transformer


def test_rounds_carry_the_best_forward_with_feedback(serve, context: AnalysisContext, tmp_path: Path) -> None:
    server = serve(rounds_script(delay_s=0.3))
    measure = FakeMeasure()
    result = iterate(context, PLAN, transformer(server, tmp_path), measure, rounds=2, proposals_per_round=2,
                     concurrency=2, baseline_metrics={"registers": 32.0})
    assert result.stopped == "rounds" and len(result.rounds) == 2
    assert [[p.description for p in r] for r in measure.rounds] == [["A", "B"], ["C", "D"]]
    assert server.max_in_flight == 2  # the round's two conversations ran at once
    assert result.best is not None and result.best.proposal.description == "C"
    [(_, best)] = result.best.proposal.files
    assert "/* variant B */\n/* variant C */\nstatic void compute" in best  # built on round 1's best
    feedback = result.rounds[1].feedback or ""
    assert "- 'A': 1.20x the baseline (median 17.5); registers 32 -> 40 (+8)" in feedback
    assert "- 'B': 1.50x the baseline (median 14); registers 32 -> 56 (+24)" in feedback
    assert feedback.endswith("Best so far: 'B' at 1.50x; the next proposals start from it.")
    second = [r for r in server.completions() if "proposal 1 of 2" in r.body["messages"][1]["content"]
              and "Feedback" in r.body["messages"][1]["content"]]
    assert "/* variant B */" in second[1].body["messages"][-1]["content"]  # read_source saw the best variant
    assert result.usage.calls == 12 and result.usage.tokens_in > 0
    record = trial_record(result.best)
    assert record["status"] == "ok" and record["llm_calls"] == 3 and record["review"] is False


def test_a_suspect_speedup_is_reverified_and_flagged_or_rejected(serve, context: AnalysisContext,
                                                                 tmp_path: Path) -> None:
    server = serve(rounds_script())
    measure = FakeMeasure({"A": 25.0, "B": 12.0})
    verdicts = {"A": Verdict("fresh_seeds", VerdictStatus.FAILED, "seed 1000003: out.bin: 4096 values differ"),
                "B": Verdict("fresh_seeds", VerdictStatus.PASSED)}
    result = iterate(context, PLAN, transformer(server, tmp_path), measure, rounds=1, proposals_per_round=2,
                     concurrency=2, reverify=lambda ctx, p: verdicts[p.description])
    a, b = result.rounds[0].trials
    assert a.status == "rejected" and a.error.startswith("fresh-seed re-verification: seed 1000003")
    assert a.flags == ("review: 25.0x, failed re-verification",)
    assert b.ok and b.review and b.flags == ("review: 12.0x, re-verified on fresh inputs",)
    assert result.best is b


def test_a_suspect_speedup_without_reverification_never_wins(serve, context: AnalysisContext, tmp_path: Path) -> None:
    server = serve(rounds_script())
    result = iterate(context, PLAN, transformer(server, tmp_path), FakeMeasure({"A": 1.1, "B": 40.0}), rounds=1,
                     proposals_per_round=2, concurrency=1)
    assert result.best is not None and result.best.proposal.description == "A"
    assert result.rounds[0].trials[1].flags == ("review: 40.0x, not re-verified",)


def test_the_token_budget_stops_the_rounds(serve, context: AnalysisContext, tmp_path: Path) -> None:
    one_round = iterate(context, PLAN, transformer(serve(rounds_script()), tmp_path / "a"), FakeMeasure(), rounds=1,
                        proposals_per_round=2, concurrency=2).usage.tokens  # the fake server counts the same each time
    agent = transformer(serve(rounds_script()), tmp_path / "b", token_budget=one_round)
    result = iterate(context, PLAN, agent, FakeMeasure(), rounds=5, proposals_per_round=2, concurrency=2,
                     budget=agent.kit.budget)
    assert result.stopped == "token budget" and len(result.rounds) == 1
    assert agent.kit.budget.spent.tokens == one_round


def test_a_round_without_proposals_ends_it(serve, context: AnalysisContext, tmp_path: Path) -> None:
    server = serve([Conversation("proposal", [Reply(tool_calls=[call("give_up", reason="nothing to mark")])])])
    result = iterate(context, PLAN, transformer(server, tmp_path), FakeMeasure(), rounds=3, proposals_per_round=2,
                     concurrency=2)
    assert result.stopped == "no proposals" and result.best is None and len(result.rounds) == 1


def test_conversation_failures_are_the_rounds_errors(serve, context: AnalysisContext, tmp_path: Path) -> None:
    server = serve([Conversation("proposal 1 of 2", marking("A"))])  # proposal 2 has no script: HTTP 400
    result = iterate(context, PLAN, transformer(server, tmp_path), FakeMeasure(), rounds=1, proposals_per_round=2,
                     concurrency=2)
    [error] = result.rounds[0].errors
    assert error.startswith("LLMStepError: llm:unroll transform: ") and "HTTP 400" in error
    assert [t.proposal.description for t in result.rounds[0].trials] == ["A"]


@pytest.mark.parametrize("status", ["verify_failed", "compile_error"])
def test_feedback_names_failures(status: str, context: AnalysisContext) -> None:
    trial = Trial(Proposal("llm", "tile 64", ()), status, error="out.bin: 12 of 4096 values differ")
    assert feedback_text([trial], {}, None) == f"- 'tile 64': rejected ({status}): out.bin: 12 of 4096 values differ"
