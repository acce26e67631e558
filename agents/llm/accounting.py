"""What the LLM agents spent: tokens in and out, latency and cost, per exchange, per proposal and
for the run, and the budget that stops them.

    Completion.usage ─► Usage (+) ─► LLMProposal.usage ─► usage_record() ─► a Parquet row's columns
                                 └─► TokenBudget.charge ─► exhausted: the agents stop
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from agents._base import Proposal


@dataclass(frozen=True)
class Usage:
    """Tokens, seconds waiting for the endpoint, and cost (None when no prices are configured)."""

    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    cost: float | None = None
    calls: int = 0  # completions answered (retries of one request count once)

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost is None and other.cost is None else (self.cost or 0.0) + (other.cost or 0.0)
        return Usage(self.tokens_in + other.tokens_in, self.tokens_out + other.tokens_out,
                     self.latency_s + other.latency_s, cost, self.calls + other.calls)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @staticmethod
    def total(usages: Iterable[Usage]) -> Usage:
        out = Usage()
        for usage in usages:
            out = out + usage
        return out


@dataclass(frozen=True)
class LLMProposal(Proposal):
    """A proposal made by an LLM agent: the contract's fields, plus what it cost and the stored
    exchanges (content hashes under ``<run_dir>/llm/``) that led to it."""

    usage: Usage = Usage()
    exchanges: tuple[str, ...] = ()
    model: str = ""
    diff: str = ""  # against the files it was made from
    notes: tuple[str, ...] = field(default=(), compare=False)  # guardrail flags, for the report


USAGE_COLUMNS = ("llm_model", "llm_tokens_in", "llm_tokens_out", "llm_latency_s", "llm_cost", "llm_calls",
                 "llm_exchanges")


def usage_record(proposal: Proposal) -> dict[str, object]:
    """The flat columns of a proposal's LLM accounting, for the results' provenance table; a
    proposal that no LLM made gets zeros and nulls, so every row has the same schema.

    llm_model (str), llm_tokens_in, llm_tokens_out, llm_calls (int), llm_latency_s (float),
    llm_cost (float or None), llm_exchanges (str: the exchange hashes, comma-separated).
    """
    usage = proposal.usage if isinstance(proposal, LLMProposal) else Usage()
    return {
        "llm_model": proposal.model if isinstance(proposal, LLMProposal) else "",
        "llm_tokens_in": usage.tokens_in,
        "llm_tokens_out": usage.tokens_out,
        "llm_latency_s": usage.latency_s,
        "llm_cost": usage.cost,
        "llm_calls": usage.calls,
        "llm_exchanges": ",".join(proposal.exchanges) if isinstance(proposal, LLMProposal) else "",
    }


class BudgetExhausted(RuntimeError):
    """The run's token budget is spent: no more requests."""


class TokenBudget:
    """Tokens in + out that the whole run may spend, shared by every agent (thread-safe). A request
    starts only while some budget is left; the one that crosses the limit is the last."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._spent = Usage()
        self._lock = threading.Lock()

    def charge(self, usage: Usage) -> None:
        with self._lock:
            self._spent = self._spent + usage

    @property
    def spent(self) -> Usage:
        with self._lock:
            return self._spent

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.spent.tokens >= self.limit

    def check(self) -> None:
        if self.exhausted:
            raise BudgetExhausted(f"token budget of {self.limit} spent ({self.spent.tokens} tokens)")
