"""The exchange store and its replay: a stored sweep replayed with the server stopped gives the
same proposals, a drifted request is answered by its conversation's label and turn, and nothing
stored holds the API key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents._base import AnalysisContext
from agents.llm import ChatRequest, EndpointError, ExchangeStore, OpenAIChat, ReplayChat, Services, build_steps
from agents.llm.iterate import iterate as iterate_rounds
from agents.llm.store import request_hash
from agents.llm.testing import Conversation, Reply
from agents.workflow import run_workflow
from tests.agents.llm.conftest import ANALYSIS, PLANNING, SECRET, LocalVerifier, spec_for, stored_text, transforming
from tests.agents.llm.test_iterate import PLAN, FakeMeasure, rounds_script

ALL_LLM = {"unroll": {"analyst": "llm", "planner": "llm", "transformer": "llm"}}


def test_exchanges_are_stored_once_per_request_by_its_hash(serve, tmp_path: Path) -> None:
    server = serve([Conversation("hello", [Reply("hi")])])
    store = ExchangeStore(tmp_path / "llm")
    chat = OpenAIChat(spec_for(server), store)
    request = ChatRequest(({"role": "user", "content": "hello"},), label="greet")
    first, again = chat.complete(request), chat.complete(request)
    assert first.exchange == again.exchange == request_hash(request.body(chat.spec))
    [stored] = list((tmp_path / "llm" / "exchanges").glob("*.json"))
    record = json.loads(stored.read_text())
    assert stored.stem == first.exchange and record["label"] == "greet" and record["turn"] == 0
    assert record["request"]["messages"] == [{"role": "user", "content": "hello"}]
    assert record["response"]["choices"][0]["message"]["content"] == "hi"
    assert len(store.index()) == 2  # the index keeps every exchange in order
    assert SECRET not in stored_text(tmp_path) and "authorization" not in stored_text(tmp_path).lower()


def test_replay_answers_from_the_store_and_misses_loudly(tmp_path: Path, serve) -> None:
    server = serve([Conversation("hello", [Reply("hi")])])
    spec = spec_for(server)
    store = ExchangeStore(tmp_path)
    OpenAIChat(spec, store).complete(ChatRequest(({"role": "user", "content": "hello"},), label="greet"))
    server.stop()
    replay = ReplayChat(spec, store)
    same = replay.complete(ChatRequest(({"role": "user", "content": "hello"},), label="greet"))
    assert same.content == "hi" and same.replayed and not same.drifted
    drifted = replay.complete(ChatRequest(({"role": "user", "content": "hello, measured 3.2 ms"},), label="greet"))
    assert drifted.content == "hi" and drifted.drifted and replay.drifted == 1
    with pytest.raises(EndpointError, match="replay: no stored exchange"):
        replay.complete(ChatRequest(({"role": "user", "content": "other"},), label="other"))


def test_a_stored_sweep_replays_with_the_server_stopped(serve, context: AnalysisContext, tmp_path: Path) -> None:
    server = serve([ANALYSIS, PLANNING, *rounds_script(), transforming()])
    spec = spec_for(server)
    live = build_steps(spec, ALL_LLM, run_dir=tmp_path, services=Services())
    outcomes = run_workflow(context, live, LocalVerifier())
    rounds = iterate_rounds(context, PLAN, live[0].transformer, FakeMeasure(), rounds=2, proposals_per_round=2,
                            concurrency=2)
    asked = len(server.requests)
    server.stop()
    with pytest.raises(EndpointError):  # the endpoint is really gone
        OpenAIChat(spec_for(server, retries=0, timeout_s=1)).complete(ChatRequest(({"role": "user", "content": "x"},)))

    replayed = build_steps(spec, ALL_LLM, run_dir=tmp_path, replay=True, services=Services())
    again = run_workflow(context, replayed, LocalVerifier())
    rerun = iterate_rounds(context, PLAN, replayed[0].transformer, FakeMeasure(), rounds=2, proposals_per_round=2,
                           concurrency=2)
    assert [(o.stage, o.proposal) for o in again] == [(o.stage, o.proposal) for o in outcomes]
    assert again[0].proposal.exchanges == outcomes[0].proposal.exchanges
    assert [[t.proposal for t in r.trials] for r in rerun.rounds] == [[t.proposal for t in r.trials]
                                                                     for r in rounds.rounds]
    assert rerun.best.proposal == rounds.best.proposal and rerun.usage.tokens == rounds.usage.tokens
    chat = replayed[0].transformer.kit.chat
    assert isinstance(chat, ReplayChat) and chat.replayed == 2 + 1 + 3 + 12 and chat.drifted == 0
    assert len(server.requests) == asked


def test_a_replay_survives_a_tool_whose_output_changed(serve, context: AnalysisContext, tmp_path: Path) -> None:
    from cluster.engine.agent_stage import build_report as local_build

    server = serve([ANALYSIS, PLANNING, transforming()])
    spec = spec_for(server)
    outcomes = run_workflow(context, build_steps(spec, ALL_LLM, run_dir=tmp_path,
                                                 services=Services(build=local_build)), LocalVerifier())
    server.stop()
    replayed = build_steps(spec, ALL_LLM, run_dir=tmp_path, replay=True, services=Services())  # build: unavailable
    again = run_workflow(context, replayed, LocalVerifier())
    assert again[0].proposal.files == outcomes[0].proposal.files
    assert replayed[0].transformer.kit.chat.drifted == 1  # the turn after `build` saw another tool result
