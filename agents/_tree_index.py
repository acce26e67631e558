"""The nodes of a parse tree by type, from one pass over the tree.

An analysis asks many questions of one tree (the functions, the calls, the declarations under
each body, the loops of each kernel); walking the tree again for each cost most of its time. A
pre-order list makes every subtree a contiguous run, so "the nodes of these types under this
node" is a range lookup in per-type position lists. The index is built once per tree and kept
for the few trees most recently asked about.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from functools import lru_cache

from tree_sitter import Node


def find_all(node: Node, types: frozenset[str], skip: frozenset[str] = frozenset()) -> list[Node]:
    """The nodes of `types` that `walk(node, skip)` yields, in the same (source) order: `node`
    included, the insides of `skip`-typed nodes below it not entered."""
    root = node
    while (parent := root.parent) is not None:
        root = parent
    return _index(root).find_all(node, types, skip)


@lru_cache(maxsize=8)  # holding the root keeps its tree alive, so node ids stay unique meanwhile
def _index(root: Node) -> _TreeIndex:
    return _TreeIndex(root)


class _TreeIndex:
    """One tree's nodes in pre-order, with each subtree's extent and each type's positions."""

    def __init__(self, root: Node) -> None:
        self.nodes: list[Node] = []
        self.position: dict[int, int] = {}  # node id -> its place in `nodes`
        self.by_type: dict[str, list[int]] = defaultdict(list)  # ascending positions
        stack = [root]
        while stack:
            current = stack.pop()
            self.position[current.id] = len(self.nodes)
            self.by_type[current.type].append(len(self.nodes))
            self.nodes.append(current)
            stack.extend(reversed(current.children))
        # descendant_count counts the node itself: a subtree is nodes[start : start + count]
        self.end = [i + n.descendant_count for i, n in enumerate(self.nodes)]

    def find_all(self, node: Node, types: frozenset[str], skip: frozenset[str]) -> list[Node]:
        start = self.position[node.id]
        end = self.end[start]
        found = sorted(p for kind in types for p in self._between(kind, start, end))
        if skip:
            hidden = self._hidden(start, end, skip)
            found = [p for p in found if not _inside(p, hidden)]
        return [self.nodes[p] for p in found]

    def _between(self, kind: str, start: int, end: int) -> list[int]:
        positions = self.by_type.get(kind, [])
        return positions[bisect_left(positions, start) : bisect_left(positions, end)]

    def _hidden(self, start: int, end: int, skip: frozenset[str]) -> list[tuple[int, int]]:
        """The insides of the outermost `skip`-typed nodes strictly below `start`, in order."""
        hidden: list[tuple[int, int]] = []
        for p in sorted(p for kind in skip for p in self._between(kind, start + 1, end)):
            if not hidden or p >= hidden[-1][1]:
                hidden.append((p + 1, self.end[p]))
        return hidden


def _inside(position: int, hidden: list[tuple[int, int]]) -> bool:
    i = bisect_left(hidden, (position + 1,)) - 1  # the last run starting at or before `position`
    return i >= 0 and hidden[i][0] <= position < hidden[i][1]
