"""The ReAct loop itself: a final answer as a tool call or as JSON text, calls after the final one
ignored, and an endpoint failure or a spent budget ending the conversation as a value."""

from __future__ import annotations

from agents._base import AnalysisContext
from agents.llm import OpenAIChat, TokenBudget
from agents.llm.guard import Workspace
from agents.llm.react import react
from agents.llm.steps import FindingsArgs, _store
from agents.llm.testing import Conversation, Fail, Reply, call
from agents.llm.tools import READ_TOOLS, Session, Toolbox, final_tool
from agents.patch import source_files
from tests.agents.llm.conftest import spec_for

BOX = Toolbox([*READ_TOOLS, final_tool("report_findings", "the answer", FindingsArgs, _store)])
FINDING = {"location": "work.c:27", "applies": True, "reason": "why"}


def run(server, context: AnalysisContext, budget: TokenBudget | None = None, **spec):  # type: ignore[no-untyped-def]
    session = Session(context, Workspace(source_files(context.target), 100))
    chat = OpenAIChat(spec_for(server, **spec), budget=budget)
    return session, react(chat, session, BOX, "system", "user: analyse", label="t", max_steps=4,
                          final_from_text="report_findings")


def test_a_final_tool_call_ends_it_and_later_calls_are_ignored(serve, context: AnalysisContext) -> None:
    server = serve([Conversation("analyse", [Reply(tool_calls=[call("report_findings", findings=[FINDING]),
                                                               call("list_files")])])])
    session, result = run(server, context)
    assert session.finished
    assert result.finished and result.steps == 1 and result.error == ""
    assert result.final.findings[0].location == "work.c:27"
    assert result.messages[-1] == {"role": "tool", "tool_call_id": "call_0_1",
                                   "content": "ignored: the conversation already finished"}
    assert result.usage.calls == 1


def test_a_final_answer_in_text_is_accepted(serve, context: AnalysisContext) -> None:
    server = serve([Conversation("analyse", [Reply('Here it is:\n```json\n{"findings": [{"location": "x", '
                                                   '"applies": false}]}\n```')])])
    _, result = run(server, context)
    assert result.finished and result.final.findings[0].applies is False


def test_an_endpoint_failure_is_the_results_error(serve, context: AnalysisContext) -> None:
    server = serve([Conversation("analyse", [Reply(tool_calls=[call("list_files")]), Fail(500)])])
    _, result = run(server, context, retries=1)
    assert not result.finished and result.final is None and result.steps == 1
    assert "HTTP 500" in result.error and result.usage.calls == 1  # what it cost so far is kept
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "tool"]


def test_a_spent_budget_ends_the_conversation(serve, context: AnalysisContext) -> None:
    server = serve([Conversation("analyse", [Reply(tool_calls=[call("list_files")])] * 4)])
    _, result = run(server, context, budget=TokenBudget(1))
    assert not result.finished and result.error.startswith("token budget of 1 spent")
    assert len(server.completions()) == 1
