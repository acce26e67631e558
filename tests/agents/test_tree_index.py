"""agents._tree_index: what one indexed pass answers is what a walk of the tree finds."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import _ts
from agents._tree_index import find_all

TARGETS = Path(__file__).resolve().parents[2] / "configs" / "targets"
SOURCE = (TARGETS / "stencil" / "stencil.cu").read_bytes()
BROKEN = SOURCE[: len(SOURCE) // 2] + b"\n{ <<< ( /*" + SOURCE[len(SOURCE) // 2 :]  # error nodes too


@pytest.mark.parametrize("source", [SOURCE, BROKEN], ids=["whole", "broken"])
@pytest.mark.parametrize("skip", [frozenset(), frozenset({"function_definition"}),
                                  frozenset({"compound_statement", "call_expression"})],
                         ids=lambda skip: "+".join(sorted(skip)) or "none")  # a set's order differs by process
def test_find_all_is_a_filtered_walk_from_every_node(source: bytes, skip: frozenset[str]) -> None:
    root = _ts.parser().parse(_ts.preprocess(source).masked).root_node
    types = frozenset({"declaration", "identifier", "call_expression", "function_definition", "ERROR"})
    for node in _ts.walk(root):
        assert find_all(node, types, skip) == [n for n in _ts.walk(node, skip) if n.type in types]


def test_an_index_answers_for_its_own_tree() -> None:
    first = _ts.parser().parse(b"int a = 1;").root_node
    second = _ts.parser().parse(b"int b = 2; int c = 3;").root_node
    declarations = frozenset({"declaration"})
    assert [_ts.text(n) for n in find_all(first, declarations)] == ["int a = 1;"]
    assert [_ts.text(n) for n in find_all(second, declarations)] == ["int b = 2;", "int c = 3;"]
