"""What Streamify's modules share: tasks, regions, the stream plan, and the text helpers the
rewrite and the analysis both use. Nothing here imports the other Streamify modules.

A *task* is what goes on one stream: a statement of a host function holding kernel launches
(direct, or through a helper that takes the stream), or one iteration of a loop with a constant
trip count. A *region* is a run of tasks in one block, on one origin stream, with host code that
does not touch device memory between them; it is forked from its origin stream onto
non-blocking streams and joined back. A loop without a constant trip count is a region of its
own, its iterations on a pool of streams.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from agents import _ts
from agents._ts import Node
from agents.source_model import DEFAULT_STREAMS

MAX_STREAMS = 8
POOL_STREAMS = 4
_CHECK_MACRO = re.compile(r"\b([A-Z0-9_]*CHECK[A-Z0-9_]*)\s*\(\s*cuda\w+\s*\(")


@dataclass(frozen=True)
class Task:
    statement: Node  # a statement of the region's block
    iteration: int | None  # the iteration of a counted loop statement, else None
    nodes: tuple[int, ...]  # its dependence-graph nodes
    label: str  # for humans: `filter (line 12)`, `iteration f = 2 of the loop at line 11`


@dataclass(frozen=True)
class Region:
    function: str
    statements: tuple[Node, ...]  # the task statements in order (host code between them stays)
    origin: str | None  # the stream the launches were on; None: the legacy default stream
    tasks: tuple[Task, ...]
    pool: bool = False  # a loop without a constant count: its iterations on a pool of streams
    # Each counted loop statement's (node id, variable, start, step), for the stream index.
    loops: tuple[tuple[int, str, int, int], ...] = ()

    def loop(self, statement: Node) -> tuple[str, int, int]:
        return next((v, a, s) for node, v, a, s in self.loops if node == statement.id)

    @property
    def origin_text(self) -> str:
        return "0" if self.origin is None or self.origin in DEFAULT_STREAMS else self.origin


@dataclass(frozen=True)
class Plan:
    """A stream for each task (index -> stream number), and the dependencies that cross streams:
    producer task -> its event number, consumer task -> producers."""

    streams: dict[int, int]
    events: dict[int, int] = field(default_factory=dict)
    waits: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def stream_count(self) -> int:
        return len(set(self.streams.values()))


def plan_streams(count: int, edges: set[tuple[int, int]], max_streams: int = MAX_STREAMS) -> Plan:
    """Greedy, in task order: a task continues the stream of a predecessor whose stream it would
    extend (that stream's last task is the predecessor), else a new stream (at most
    `max_streams`, then the least loaded one). Every edge that crosses streams gets an event.
    An edge into an earlier task (a loop-carried dependence of a region in a loop's body) joins two
    executions of the region, which the join at its end already orders: it is left out."""
    preds: dict[int, list[int]] = {i: sorted(a for a, b in edges if b == i and a < b) for i in range(count)}
    streams: dict[int, int] = {}
    last: dict[int, int] = {}
    for task in range(count):
        choice = next((streams[p] for p in reversed(preds[task]) if last[streams[p]] == p), None)
        if choice is None:
            if len(last) < max_streams:
                choice = len(last)
            else:
                load = Counter(streams.values())
                choice = min(range(max_streams), key=lambda s: (load[s], s))
        streams[task] = choice
        last[choice] = task
    events: dict[int, int] = {}
    waits: dict[int, tuple[int, ...]] = {}
    for task in range(count):
        crossing = tuple(p for p in preds[task] if streams[p] != streams[task])
        if crossing:
            waits[task] = crossing
            for p in crossing:
                events.setdefault(p, len(events))
    return Plan(streams, dict(sorted(events.items())), waits)


def check_macro(text: str) -> str | None:
    """The file's own CUDA error-check macro (`CUDA_CHECK(cudaMalloc(...))`), if it has one."""
    found = Counter(m.group(1) for m in _CHECK_MACRO.finditer(text))
    return found.most_common(1)[0][0] if found else None


def stream_parameter(root: Node, helper: str) -> int | None:
    """The position of `helper`'s `cudaStream_t` parameter."""
    fn = next((n for n in _ts.walk(root) if n.type == "function_definition"
               and _ts.declared_name(n.child_by_field_name("declarator")) == helper), None)
    params = _ts.parameters(fn) if fn is not None else []
    return next((i for i, p in enumerate(params) if "cudaStream_t" in _ts.text(p.child_by_field_name("type") or p)),
                None)
