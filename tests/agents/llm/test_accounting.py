"""Usage arithmetic and the flat record every proposal gets, LLM-made or not."""

from __future__ import annotations

import pyarrow as pa

from agents._base import Proposal
from agents.llm import LLMProposal, TokenBudget, Usage, usage_record
from agents.llm.accounting import USAGE_COLUMNS


def test_usage_adds_up_and_cost_stays_unknown_without_prices() -> None:
    a, b = Usage(10, 5, 0.5, None, 1), Usage(20, 7, 1.0, 0.25, 1)
    assert a + b == Usage(30, 12, 1.5, 0.25, 2)
    assert (a + a).cost is None and Usage.total([a, b, a]).tokens == 57


def test_every_proposal_has_the_same_columns() -> None:
    llm = LLMProposal("llm:unroll", "d", (), usage=Usage(10, 5, 0.5, 0.01, 2), exchanges=("ab", "cd"), model="m")
    expert = Proposal("unroll", "d", ())
    records = [usage_record(llm), usage_record(expert)]
    assert [list(r) for r in records] == [list(USAGE_COLUMNS)] * 2
    assert records[0]["llm_exchanges"] == "ab,cd" and records[0]["llm_cost"] == 0.01
    assert records[1] == {"llm_model": "", "llm_tokens_in": 0, "llm_tokens_out": 0, "llm_latency_s": 0.0,
                          "llm_cost": None, "llm_calls": 0, "llm_exchanges": ""}
    table = pa.Table.from_pylist(records)  # Parquet-ready: one type per column
    assert table.schema.field("llm_cost").type == pa.float64()


def test_the_budget_is_spent_when_reached() -> None:
    budget = TokenBudget(30)
    budget.charge(Usage(20, 9))
    assert not budget.exhausted
    budget.charge(Usage(1, 0))
    assert budget.exhausted and TokenBudget(None).exhausted is False
