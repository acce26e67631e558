"""A scripted OpenAI-compatible chat-completions server on the loopback interface: the test double
of an LLM endpoint, shipped with the package (as httpx ships ``MockTransport``) for the tests and
for dry runs of a config without a model.

It speaks the real protocol (``POST /v1/chat/completions`` with tools and tool calls, ``GET
/v1/models``, JSON error bodies, ``Retry-After``), so the real ``openai`` client drives it. Replies
come from scripted ``Conversation``s: a request belongs to the first conversation whose ``match``
(a substring, or several) occurs in its first user message, and gets the turn numbered by the
assistant messages it already holds. The answer depends only on the request, so concurrent
conversations stay deterministic;
``Attempts`` scripts what happens to retries of one turn (a 429, then the reply).

    with FakeOpenAIServer([Conversation("unroll", [Reply(tool_calls=[call("read_source", path="k.cu")]),
                                                   Reply("done")])]) as server:
        spec = LLMSpec(base_url=server.base_url, model="fake", api_key_env=None)

A rehearsal from the shell: ``python -m agents.llm.testing script.json --port 8000`` serves the
conversations of a JSON file (``[{"match": "...", "turns": [{"content": "...", "tool_calls":
[{"name": "...", "arguments": {...}}]}]}]``); ``scripts/llm_rehearsal.py`` runs a whole workflow
against it. Not re-exported by ``agents.llm``: import it from here.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Attempts", "Conversation", "Fail", "FakeOpenAIServer", "Recorded", "Reply", "Stall", "ToolCall", "call"]


@dataclass(frozen=True)
class ToolCall:
    """A tool call in a scripted reply; ``arguments`` as a string is sent as is (malformed JSON too)."""

    name: str
    arguments: str | dict[str, Any]

    def wire(self, call_id: str) -> dict[str, Any]:
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": args}}


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(name, arguments)


@dataclass(frozen=True)
class Reply:
    """An assistant message: text, tool calls, or both."""

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    delay_s: float = 0.0  # think this long first (for concurrency and latency)


@dataclass(frozen=True)
class Fail:
    """An HTTP error answer (429 rate limit, 5xx), with a ``Retry-After`` in seconds when given."""

    status: int = 429
    retry_after: float | None = None
    message: str = "scripted failure"


@dataclass(frozen=True)
class Stall:
    """No answer for ``seconds`` (the client's timeout fires first), then a 504."""

    seconds: float


Outcome = Reply | Fail | Stall


@dataclass(frozen=True)
class Attempts:
    """What successive attempts at one turn get; attempts past the last get the last."""

    outcomes: Sequence[Outcome]

    def __init__(self, *outcomes: Outcome) -> None:
        object.__setattr__(self, "outcomes", tuple(outcomes))


@dataclass(frozen=True)
class Conversation:
    match: str | Sequence[str]  # substring(s) of the first user message, all of them; "" matches every request
    turns: Sequence[Outcome | Attempts]

    def matches(self, first_user: str) -> bool:
        wanted = [self.match] if isinstance(self.match, str) else self.match
        return all(part in first_user for part in wanted)


@dataclass(frozen=True)
class Recorded:
    """A request as the server saw it (headers included: this double checks what clients send)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    conversation: int | None  # the index of the conversation it matched
    turn: int
    status: int


@dataclass
class FakeOpenAIServer:
    """Serves ``conversations`` on 127.0.0.1 (an ephemeral port unless ``port``) until ``stop``."""

    conversations: Sequence[Conversation]
    model: str = "fake-model"
    port: int = 0
    requests: list[Recorded] = field(default_factory=list)
    _attempts: dict[tuple[int, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _ids: itertools.count = field(default_factory=itertools.count)
    _httpd: ThreadingHTTPServer | None = None
    in_flight: int = 0  # chat completions being answered now
    max_in_flight: int = 0

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeOpenAIServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-openai", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # stalled answers end now
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def completions(self, conversation: int | None = None) -> list[Recorded]:
        """The chat-completion requests received, of one conversation or all."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")
                and (conversation is None or r.conversation == conversation)]

    # --- answering -------------------------------------------------------------------------

    def outcome(self, body: dict[str, Any]) -> tuple[int | None, int, Outcome | str]:
        """Which conversation and turn a request is, and what it gets (a string: a 400 error)."""
        messages = body.get("messages") or []
        first_user = next((_text(m) for m in messages if m.get("role") == "user"), "")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        for index, conversation in enumerate(self.conversations):
            if conversation.matches(first_user):
                if turn >= len(conversation.turns):
                    return index, turn, f"the script of conversation {index} ({conversation.match!r}) has " \
                                        f"{len(conversation.turns)} turns; this request is turn {turn}"
                scripted = conversation.turns[turn]
                if not isinstance(scripted, Attempts):  # the same outcome for every attempt
                    return index, turn, scripted
                with self._lock:
                    attempt = self._attempts.get((index, turn), 0)
                    self._attempts[(index, turn)] = attempt + 1
                return index, turn, scripted.outcomes[min(attempt, len(scripted.outcomes) - 1)]
        return None, turn, "no scripted conversation matches the first user message"

    def completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        number = next(self._ids)
        calls = [c.wire(f"call_{number}_{i}") for i, c in enumerate(reply.tool_calls)]
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = calls
        produced = (reply.content or "") + "".join(c["function"]["arguments"] for c in calls)
        prompt = math.ceil(len(json.dumps(body.get("messages", []))) / 4)
        completion = math.ceil(len(produced) / 4) + 1
        return {"id": f"chatcmpl-fake-{number}", "object": "chat.completion", "created": 0,
                "model": body.get("model", self.model),
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop",
                             "logprobs": None}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def handle(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that timed out and hung up
            super().handle()

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up waiting (its timeout): nobody to answer

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        kind = "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid_request_error"
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, headers)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": self.fake.model, "object": "model", "created": 0,
                                                         "owned_by": "warpfleet-fake"}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "the body is not JSON")
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self.fake.requests.append(Recorded(self.path, headers, body, None, 0, 404))
            self._error(404, f"no route {self.path}")
            return
        with self.fake._lock:
            self.fake.in_flight += 1
            self.fake.max_in_flight = max(self.fake.max_in_flight, self.fake.in_flight)
        try:
            self._complete(body, headers)
        except Exception as exc:  # a bad script is the test's error: say so instead of hanging up
            self._error(500, f"fake server: {type(exc).__name__}: {exc}")
        finally:
            with self.fake._lock:
                self.fake.in_flight -= 1

    def _complete(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        index, turn, outcome = self.fake.outcome(body)
        status = 200 if isinstance(outcome, Reply) else 400 if isinstance(outcome, str) else \
            504 if isinstance(outcome, Stall) else outcome.status
        self.fake.requests.append(Recorded(self.path, headers, body, index, turn, status))
        if isinstance(outcome, str):
            self._error(400, outcome)
        elif isinstance(outcome, Stall):
            self.fake._stopping.wait(outcome.seconds)
            self._error(504, "stalled")
        elif isinstance(outcome, Fail):
            extra = {} if outcome.retry_after is None else {"Retry-After": f"{outcome.retry_after:g}"}
            self._error(outcome.status, outcome.message, extra)
        else:
            if outcome.delay_s:
                self.fake._stopping.wait(outcome.delay_s)
            self._send(200, self.fake.completion(body, outcome))


def load_script(path: str | Path) -> list[Conversation]:
    """Conversations from a JSON file (the format in this module's docstring)."""
    conversations = []
    for entry in json.loads(Path(path).read_text()):
        turns = [Reply(t.get("content"), tuple(ToolCall(c["name"], c.get("arguments", {}))
                                                for c in t.get("tool_calls", [])))
                 for t in entry["turns"]]
        conversations.append(Conversation(entry.get("match", ""), turns))
    return conversations


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A scripted OpenAI-compatible server on 127.0.0.1, for dry runs.")
    parser.add_argument("script", help="a JSON file of conversations")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(load_script(args.script), port=args.port).start()
    print(f"serving {server.base_url} (Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
