"""Chat completions from any OpenAI-compatible endpoint, through the ``openai`` client.

    ChatRequest ─► ChatClient.complete ─► Completion (message, tool calls, Usage, exchange hash)
                   ├─ OpenAIChat: the endpoint; retries 408/409/429/5xx/timeouts with backoff,
                   │  at most ``concurrency`` requests in flight, each exchange stored
                   └─ ReplayChat (agents.llm.replay): the stored exchanges, no endpoint

A client that cannot get an answer raises ``EndpointError``; the ReAct loop turns it into a value.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from agents.llm.accounting import TokenBudget, Usage
from agents.llm.store import ExchangeStore
from cluster.config.agents import LLMSpec

Message = dict[str, Any]


class EndpointError(RuntimeError):
    """No usable answer: retries exhausted, a refused request, or nothing stored to replay."""


@dataclass(frozen=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (it may be malformed)


@dataclass(frozen=True)
class ChatRequest:
    """One request of a conversation. ``label`` names the conversation stably (agent, step,
    target, plan, attempt) so that a replay can find its answers when a tool's output drifted."""

    messages: Sequence[Message]
    tools: Sequence[dict[str, Any]] = ()
    label: str = ""

    @property
    def turn(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    def body(self, spec: LLMSpec) -> dict[str, Any]:
        """The chat-completions request body; no credentials ever go in it."""
        body: dict[str, Any] = {"model": spec.model, "messages": list(self.messages),
                                spec.max_tokens_field: spec.max_tokens}
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        if self.tools:
            body["tools"] = list(self.tools)
            body["tool_choice"] = "auto"
        return body


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCallRequest, ...]
    finish_reason: str
    usage: Usage
    exchange: str = ""  # the stored exchange's hash
    replayed: bool = False
    drifted: bool = field(default=False)  # replayed by label and turn: the request was not byte-identical

    def message(self) -> Message:
        """The assistant message to append to the conversation."""
        out: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in self.tool_calls]
        return out

    @classmethod
    def from_response(cls, response: dict[str, Any], latency_s: float, spec: LLMSpec, exchange: str = "",
                      replayed: bool = False, drifted: bool = False) -> Completion:
        choices = response.get("choices") or []
        if not choices:
            raise EndpointError("the response has no choices")
        choice = choices[0]
        message = choice.get("message") or {}
        calls = tuple(ToolCallRequest(str(c.get("id") or f"call_{i}"), str((c.get("function") or {}).get("name", "")),
                                      _arguments((c.get("function") or {}).get("arguments")))
                      for i, c in enumerate(message.get("tool_calls") or []))
        counted = response.get("usage") or {}
        tokens_in, tokens_out = int(counted.get("prompt_tokens") or 0), int(counted.get("completion_tokens") or 0)
        cost = spec.prices.cost(tokens_in, tokens_out) if spec.prices else None
        usage = Usage(tokens_in, tokens_out, latency_s, cost, 1)
        return cls(message.get("content"), calls, str(choice.get("finish_reason") or ""), usage, exchange,
                   replayed, drifted)


def _arguments(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)  # some servers send an object


class ChatClient(ABC):
    """One method, as an httpx transport: answer a request or raise ``EndpointError``."""

    spec: LLMSpec

    @abstractmethod
    def complete(self, request: ChatRequest) -> Completion: ...


_RETRYABLE_STATUS = {408, 409, 429}


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        return True
    return isinstance(exc, openai.APIStatusError) and (exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: use our own backoff


def _describe(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class OpenAIChat(ChatClient):
    """The endpoint of ``spec`` through the ``openai`` client (its own retries off: ours record
    every attempt and follow ``spec``'s backoff)."""

    def __init__(self, spec: LLMSpec, store: ExchangeStore | None = None, budget: TokenBudget | None = None,
                 sleep: Any = time.sleep) -> None:
        self.spec, self.store, self.budget, self._sleep = spec, store, budget, sleep
        self._client = openai.OpenAI(base_url=spec.base_url, api_key=spec.api_key(), timeout=spec.timeout_s,
                                     max_retries=0)
        self._slots = threading.BoundedSemaphore(spec.concurrency)

    def complete(self, request: ChatRequest) -> Completion:
        if self.budget is not None:
            self.budget.check()
        body = request.body(self.spec)
        started = time.perf_counter()
        failures: list[str] = []
        for attempt in range(self.spec.retries + 1):
            try:
                with self._slots:
                    response = self._client.chat.completions.create(**body).to_dict()
            except openai.OpenAIError as exc:
                failures.append(_describe(exc))
                if not _retryable(exc) or attempt == self.spec.retries:
                    break
                wait = _retry_after(exc)
                if wait is None:
                    wait = self.spec.backoff_s * 2 ** attempt
                self._sleep(min(max(wait, 0.0), self.spec.max_backoff_s))
                continue
            latency = time.perf_counter() - started
            exchange = ""
            if self.store is not None:
                exchange = self.store.put(body, response, label=request.label, turn=request.turn, latency_s=latency,
                                          attempts=attempt + 1)
            completion = Completion.from_response(response, latency, self.spec, exchange)
            if self.budget is not None:
                self.budget.charge(completion.usage)
            return completion
        raise EndpointError(f"{self.spec.base_url}: {'; '.join(failures)} (after {len(failures)} attempts)")
