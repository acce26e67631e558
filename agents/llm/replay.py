"""The client that answers from a run's stored exchanges (``agents.llm.store``), never from an
endpoint: a request is found by the hash of its body, else by its conversation's label and turn
(then counted as drifted).
"""

from __future__ import annotations

from agents.llm.accounting import TokenBudget
from agents.llm.client import ChatClient, ChatRequest, Completion, EndpointError
from agents.llm.store import ExchangeStore, request_hash
from cluster.config.agents import LLMSpec


class ReplayChat(ChatClient):
    """Answers from a store, never from an endpoint: a sweep replayed offline, for an audit or to
    rerun the verification and measurement of the same proposals."""

    def __init__(self, spec: LLMSpec, store: ExchangeStore, budget: TokenBudget | None = None) -> None:
        self.spec, self.store, self.budget = spec, store, budget
        self._labels = store.by_label()
        self.replayed = 0
        self.drifted = 0  # answered by label and turn: the request was not the stored one

    def complete(self, request: ChatRequest) -> Completion:
        if self.budget is not None:
            self.budget.check()
        body = request.body(self.spec)
        key = request_hash(body)
        record = self.store.get(key)
        drifted = False
        if record is None and (fallback := self._labels.get((request.label, request.turn))):
            record, drifted = self.store.get(fallback), True
        if record is None:
            raise EndpointError(f"replay: no stored exchange for request {key[:16]} "
                                f"(conversation {request.label!r}, turn {request.turn})")
        completion = Completion.from_response(record["response"], float(record.get("latency_s", 0.0)), self.spec,
                                              record["hash"], replayed=True, drifted=drifted)
        self.replayed += 1
        self.drifted += drifted
        if self.budget is not None:
            self.budget.charge(completion.usage)
        return completion
