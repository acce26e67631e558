"""The real openai client against the scripted server on 127.0.0.1: answers, tool calls, usage and
cost, retries on 429 and 5xx with backoff, timeouts, the concurrency limit, and the API key that
goes in the Authorization header and nowhere else."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents.llm import ChatRequest, EndpointError, ExchangeStore, OpenAIChat, Prices, TokenBudget
from agents.llm.accounting import BudgetExhausted
from agents.llm.testing import Attempts, Conversation, Fail, Reply, Stall, call
from tests.agents.llm.conftest import SECRET, spec_for, stored_text

HELLO = ChatRequest(({"role": "user", "content": "hello"},), label="t/hello")


def test_a_reply_with_tool_calls_usage_and_cost(serve, tmp_path: Path) -> None:
    server = serve([Conversation("hello", [Reply("thinking", [call("read_source", path="k.cu"),
                                                             call("show_diff")])])])
    spec = spec_for(server, prices=Prices(input_per_mtok=2.0, output_per_mtok=8.0))
    completion = OpenAIChat(spec, ExchangeStore(tmp_path)).complete(HELLO)
    assert completion.content == "thinking"
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("read_source", '{"path": "k.cu"}'),
                                                                      ("show_diff", "{}")]
    assert completion.usage.calls == 1 and completion.usage.tokens_in > 0 and completion.usage.tokens_out > 0
    assert completion.usage.cost == pytest.approx((completion.usage.tokens_in * 2 + completion.usage.tokens_out * 8)
                                                  / 1e6)
    assert completion.message()["tool_calls"][0]["function"]["name"] == "read_source"
    [seen] = server.completions()
    assert seen.body["model"] == "fake-model" and seen.body["max_tokens"] == 4096
    assert seen.body["temperature"] == 0.2 and "tools" not in seen.body


def test_the_key_goes_in_the_authorization_header_only(serve, tmp_path: Path) -> None:
    server = serve([Conversation("hello", [Reply("hi")])])
    OpenAIChat(spec_for(server), ExchangeStore(tmp_path)).complete(HELLO)
    [seen] = server.completions()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(seen.body) and SECRET not in repr(spec_for(server))
    assert list(tmp_path.rglob("*.json")) and SECRET not in stored_text(tmp_path)


def test_the_key_comes_from_the_environment_only(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve([Conversation("hello", [Reply("hi")])])
    monkeypatch.delenv("WF_TEST_LLM_API_KEY")
    with pytest.raises(KeyError, match="WF_TEST_LLM_API_KEY is not set"):
        OpenAIChat(spec_for(server))
    OpenAIChat(spec_for(server, api_key_env=None)).complete(HELLO)  # a local server without a key
    assert server.completions()[-1].headers["authorization"] == "Bearer not-needed"


def test_a_429_then_success(serve, tmp_path: Path) -> None:
    server = serve([Conversation("hello", [Attempts(Fail(429, retry_after=0.02), Reply("ok"))])])
    waits: list[float] = []
    chat = OpenAIChat(spec_for(server), ExchangeStore(tmp_path), sleep=waits.append)
    completion = chat.complete(HELLO)
    assert completion.content == "ok" and completion.usage.calls == 1
    assert [r.status for r in server.completions()] == [429, 200]
    assert waits == [pytest.approx(0.02)]  # the server's Retry-After, not our backoff
    [line] = ExchangeStore(tmp_path).index()
    assert ExchangeStore(tmp_path).get(line["hash"])["attempts"] == 2


def test_5xx_retries_back_off_exponentially_and_then_give_up(serve) -> None:
    server = serve([Conversation("hello", [Attempts(Fail(503))])])
    waits: list[float] = []
    chat = OpenAIChat(spec_for(server, retries=3, backoff_s=0.01, max_backoff_s=0.03), sleep=waits.append)
    with pytest.raises(EndpointError, match=r"HTTP 503.*after 4 attempts"):
        chat.complete(HELLO)
    assert waits == [0.01, 0.02, 0.03]  # doubling, capped
    assert len(server.completions()) == 4


def test_a_client_error_is_not_retried(serve) -> None:
    server = serve([Conversation("something else", [Reply("x")])])
    with pytest.raises(EndpointError, match=r"HTTP 400.*no scripted conversation"):
        OpenAIChat(spec_for(server)).complete(HELLO)
    assert len(server.completions()) == 1


# A stall outlasts any test (the server's stop ends it): a client that waited it out, not timing out,
# would hang the test instead of passing it.
STALL_S = 3600.0


def test_a_timeout_is_retried_then_answered(serve) -> None:
    server = serve([Conversation("hello", [Attempts(Stall(STALL_S), Reply("late but fine"))])])
    completion = OpenAIChat(spec_for(server, timeout_s=1.0, retries=1)).complete(HELLO)
    assert completion.content == "late but fine"
    assert len(server.completions()) == 2
    assert server.max_in_flight == 2  # the retry came while the first request still stalled: it timed out


def test_timeouts_past_the_retries_are_an_endpoint_error(serve) -> None:
    server = serve([Conversation("hello", [Attempts(Stall(STALL_S))])])
    with pytest.raises(EndpointError, match="request timed out; request timed out"):
        OpenAIChat(spec_for(server, timeout_s=0.5, retries=1)).complete(HELLO)
    assert server.max_in_flight == 2


def test_the_concurrency_limit_holds_requests_back(serve) -> None:
    server = serve([Conversation(f"q{i}", [Reply("a", delay_s=0.15)]) for i in range(6)])
    chat = OpenAIChat(spec_for(server, concurrency=2))
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: chat.complete(ChatRequest(({"role": "user", "content": f"q{i}"},))), range(6)))
    assert server.max_in_flight == 2


def test_the_token_budget_stops_requests(serve) -> None:
    server = serve([Conversation("hello", [Reply("a" * 400)])])
    budget = TokenBudget(50)
    chat = OpenAIChat(spec_for(server), budget=budget)
    chat.complete(HELLO)  # the request that crosses the budget is answered
    assert budget.exhausted
    with pytest.raises(BudgetExhausted):
        chat.complete(HELLO)
    assert len(server.completions()) == 1
