"""The scripted server as users run it for dry runs: conversations from a JSON file, the models
list, and a 404 for routes it does not serve."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from agents.llm import ChatRequest, OpenAIChat
from agents.llm.testing import FakeOpenAIServer, load_script
from tests.agents.llm.conftest import spec_for


def test_a_json_script_serves_tool_calls_to_the_real_client(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"match": "unroll", "turns": [
        {"tool_calls": [{"name": "read_source", "arguments": {"path": "k.cu"}}]}, {"content": "done"}]}]))
    with FakeOpenAIServer(load_script(script)) as server:
        chat = OpenAIChat(spec_for(server, api_key_env=None))
        first = chat.complete(ChatRequest(({"role": "user", "content": "unroll it"},)))
        assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("read_source", {"path": "k.cu"})]
        second = chat.complete(ChatRequest(({"role": "user", "content": "unroll it"}, first.message(),
                                            {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                                             "content": "..."})))
        assert second.content == "done" and second.finish_reason == "stop"
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["fake-model"]
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="fake-model", input="x")
