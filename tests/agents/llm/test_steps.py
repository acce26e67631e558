"""The LLM steps in the workflow, driven through the real openai client by the scripted server,
on a C target that is built and run for real: a successful transformation, an edit into a
read-only region refused and retried, malformed tool arguments and answers, a timeout, a
cheating variant rejected, and the review on top of a verifier."""

from __future__ import annotations

import json
from pathlib import Path

from agents._base import AnalysisContext
from agents.llm import LLMProposal, Services, build_steps, usage_record
from agents.llm.steps import LLMReviewer
from agents.llm.testing import Attempts, Conversation, Fail, Reply, Stall, ToolCall, call
from agents.patch import readonly_regions
from agents.workflow import run_workflow
from agents.workflow.steps import Finding, Level, Plan
from cluster.engine.agent_stage import build_report as local_build
from tests.agents.llm.conftest import (
    ANALYSIS,
    HONEST_COMPUTE,
    PLANNING,
    SECRET,
    SKIPPING_COMPUTE,
    LocalVerifier,
    edit_compute,
    spec_for,
    stored_text,
    transforming,
)

ALL_LLM = {"unroll": {"analyst": "llm", "planner": "llm", "transformer": "llm"}}


def steps_for(server, tmp_path: Path, verifier: LocalVerifier | None = None, **spec):  # type: ignore[no-untyped-def]
    services = Services(build=local_build, verify=verifier.verify if verifier else None)
    return build_steps(spec_for(server, **spec), ALL_LLM, run_dir=tmp_path, services=services)


def tool_results(request) -> list[str]:  # type: ignore[no-untyped-def]
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


def test_a_successful_transformation(serve, context: AnalysisContext, tmp_path: Path) -> None:
    planning = Conversation("Plan the change", [Attempts(Fail(429, retry_after=0), *PLANNING.turns)])
    server = serve([ANALYSIS, planning, transforming()])
    verifier = LocalVerifier()
    outcomes = run_workflow(context, steps_for(server, tmp_path, verifier), verifier)
    assert [o.stage for o in outcomes] == ["accepted", "not_applicable"]
    accepted = outcomes[0]
    assert accepted.analyst == accepted.planner == accepted.transformer == "llm:unroll"
    assert accepted.finding.evidence == ("sinf is called K times per input",)
    assert accepted.plan.changes == ("in compute(), tabulate sinf of each input once",)
    proposal = accepted.proposal
    assert isinstance(proposal, LLMProposal) and proposal.description == "tabulate sinf once per input"
    [(path, text)] = proposal.files
    assert path == "work.c" and "static float s[N + K];" in text and "+    static float s[N + K];" in proposal.diff
    assert proposal.usage.calls == 3 and len(proposal.exchanges) == 3 and proposal.model == "fake-model"
    record = usage_record(proposal)
    assert record["llm_calls"] == 3 and record["llm_tokens_in"] > 0 and record["llm_cost"] is None
    assert record["llm_exchanges"] == ",".join(proposal.exchanges)
    finish = server.completions()[-1]
    assert tool_results(finish)[-1] == "build ok"  # the build tool ran cc on the working copy
    assert [r.status for r in server.completions(1)] == [429, 200]
    assert len(verifier.calls) == 1
    assert {line["hash"] for line in exchange_index(tmp_path)} >= set(proposal.exchanges)
    assert SECRET not in stored_text(tmp_path)


def exchange_index(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "llm" / "index.jsonl").read_text().splitlines()]


def test_an_edit_into_a_readonly_region_is_refused_and_retried(serve, context: AnalysisContext,
                                                               tmp_path: Path) -> None:
    into_timing = {"op": "replace", "path": "work.c", "start_line": 36, "end_line": 36,
                   "text": "    return 0.0;  /* time stands still */"}
    server = serve([ANALYSIS, PLANNING, Conversation("Carry out this plan", [
        Reply(tool_calls=[call("edit", edits=[into_timing])]),
        Reply(tool_calls=[call("edit", edits=[edit_compute(HONEST_COMPUTE)])]),
        Reply(tool_calls=[call("finish", description="tabulate sinf")])])])
    verifier = LocalVerifier()
    outcomes = run_workflow(context, steps_for(server, tmp_path), verifier)
    assert outcomes[0].stage == "accepted"
    second = server.completions(2)[1]
    [refusal] = tool_results(second)
    assert refusal.startswith("refused, nothing changed: work.c:36: edit 0: touches the read-only region")
    assert refusal.endswith("[readonly]")
    [(_, text)] = outcomes[0].proposal.files
    original = dict(context.target.bundle.files)["work.c"].decode()
    assert [original.splitlines()[a - 1:b] for a, b in readonly_regions(original)] == \
        [text.splitlines()[a - 1:b] for a, b in readonly_regions(text)]


def test_malformed_tool_arguments_and_answers_go_back_to_the_model(serve, context: AnalysisContext,
                                                                   tmp_path: Path) -> None:
    server = serve([
        ANALYSIS,
        Conversation("Plan the change", [
            Reply('```json\n{"changes": []}\n```'),  # a plan in text, and an invalid one
            Reply('{"changes": ["tabulate sinf"], "search": {"K": [1280]}}')]),
        Conversation("Carry out this plan", [
            Reply(tool_calls=[ToolCall("edit", '{"edits": [{"op": "replace", "path": "work.c", "start_line": 24,')]),
            Reply(tool_calls=[call("edit", edits=[{**edit_compute(HONEST_COMPUTE), "start_line": "twenty-four"}])]),
            Reply(tool_calls=[call("no_such_tool")]),
            Reply("I have made the change."),  # text, not a tool call
            Reply(tool_calls=[call("edit", edits=[edit_compute(HONEST_COMPUTE)]), call("finish", description="ok")]),
        ])])
    outcomes = run_workflow(context, steps_for(server, tmp_path), LocalVerifier())
    assert outcomes[0].stage == "accepted"
    assert outcomes[0].plan.search == (("K", (1280,)),)
    plan_retry = server.completions(1)[1].body["messages"][-1]
    assert plan_retry["role"] == "user" and "changes: List should have at least 1 item" in plan_retry["content"]
    calls = server.completions(2)
    assert "are not valid JSON" in tool_results(calls[1])[-1]
    assert tool_results(calls[2])[-1].startswith("error: bad arguments for edit: edits.0.start_line: Input should be "
                                                 "a valid integer")
    assert tool_results(calls[3])[-1].startswith("error: there is no tool named 'no_such_tool'")
    assert calls[4].body["messages"][-1] == {"role": "user", "content": "Use the tools; when you are done, call "
                                                                          "finish or give_up."}


def test_a_timeout_is_a_failed_attempt_and_the_retry_gets_it_as_feedback(serve, context: AnalysisContext,
                                                                         tmp_path: Path) -> None:
    honest = transforming()
    server = serve([ANALYSIS, PLANNING, Conversation("Carry out this plan",
                                                     [Attempts(Stall(5.0), honest.turns[0]), *honest.turns[1:]])])
    outcomes = run_workflow(context, steps_for(server, tmp_path, timeout_s=1.0, retries=0), LocalVerifier())
    assert [o.stage for o in outcomes] == ["error", "accepted", "not_applicable"]
    assert outcomes[0].error.startswith("transform raised agents.llm.steps.LLMStepError: llm:unroll transform: ")
    assert "request timed out" in outcomes[0].error
    retry = server.completions(2)[1].body["messages"][1]["content"]
    assert "Feedback on the previous proposals:\ntransform raised agents.llm.steps.LLMStepError" in retry


def test_a_cheating_variant_is_rejected_and_the_retry_hears_why(serve, context: AnalysisContext,
                                                               tmp_path: Path) -> None:
    server = serve([ANALYSIS, PLANNING, transforming(HONEST_COMPUTE, match="poisoned_outputs"),
                    transforming(SKIPPING_COMPUTE)])
    verifier = LocalVerifier(cheats=True)
    outcomes = run_workflow(context, steps_for(server, tmp_path), verifier)
    assert [o.stage for o in outcomes] == ["rejected", "accepted", "not_applicable"]
    rejected = outcomes[0]
    assert "if (done) return;" in rejected.proposal.files[0][1]
    assert rejected.reason.startswith("poisoned_outputs: with its output buffers poisoned: out.bin:")
    checks = {v.check: v.status.value for v in rejected.verification.verdicts}
    assert checks == {"guards": "passed", "depgraph": "skipped", "contracts": "skipped", "build": "passed",
                      "outputs": "passed",
                      "tests": "skipped", "timing_code": "passed", "poisoned_outputs": "failed",
                      "cached_results": "passed", "untimed_work": "passed"}  # the sweep alone would have taken it
    assert outcomes[1].attempt == 1 and "static float s[N + K];" in outcomes[1].proposal.files[0][1]


def test_the_step_limit_ends_a_conversation(serve, context: AnalysisContext, tmp_path: Path) -> None:
    looping = Conversation("Carry out this plan", [Reply(tool_calls=[call("list_files")])] * 3)
    server = serve([ANALYSIS, PLANNING, looping])
    outcomes = run_workflow(context, steps_for(server, tmp_path, max_steps=3), LocalVerifier(), retries=0)
    assert outcomes[0].stage == "error"
    assert outcomes[0].error.endswith("step limit of 3 model calls reached without a final answer")
    assert len(server.completions(2)) == 3


def test_the_review_can_fail_a_verified_variant_never_pass_a_failed_one(serve, context: AnalysisContext,
                                                                        tmp_path: Path) -> None:
    server = serve([Conversation("Proposal: tabulate", [
        Reply(tool_calls=[call("submit_verdict", status="failed", detail="s[] is static: not reentrant")])])])
    [steps] = steps_for(server, tmp_path)
    kit = steps.transformer.kit
    plan = Plan(Finding("unroll", Level.KERNEL, "work.c:27", True), ("tabulate",))
    good = LLMProposal("llm:unroll", "tabulate sinf", (("work.c", _with(context, HONEST_COMPUTE)),))
    wrong = _with(context, HONEST_COMPUTE.replace("(k + 1)", "(k + 2)"))
    bad = LLMProposal("llm:unroll", "broken", (("work.c", wrong),))
    reviewer = LLMReviewer(kit, LocalVerifier())
    reviewed = reviewer.verify(context, plan, good)
    assert not reviewed.passed and reviewed.reason == "llm_review: s[] is static: not reentrant"
    assert "+    static float s[N + K];" in server.completions()[0].body["messages"][1]["content"]
    failed = reviewer.verify(context, plan, bad)
    assert not failed.passed and "llm_review" not in failed.reason and len(server.completions()) == 1


def _with(context: AnalysisContext, compute: str) -> str:
    lines = dict(context.target.bundle.files)["work.c"].decode().split("\n")
    return "\n".join(lines[:23] + compute.split("\n") + lines[30:])
