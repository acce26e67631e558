"""Where Streamify applies: the regions of a host function, found on its unfolded operations
(agents.hostflow) and its dependence graph, or why there are none.

Each block of the function (its body, nested blocks, lambda bodies) is read statement by
statement: a statement holding kernel launches on one stream (directly, or through a helper of
the file that takes that stream as a `cudaStream_t` parameter) is a task, or one task per
iteration when it is a loop with a constant trip count; a statement with no CUDA work is host
code and may sit between tasks, unless it hands a device buffer or a stream to code the analysis
does not see (a library, a function of another file); anything else (a copy, a synchronize,
another stream) ends the run of tasks. A loop whose trip count is not a constant, with a
constant start and step and iterations that do not depend on each other, is a region of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents import _ts
from agents._ts import Node
from agents.depgraph import ANY, KernelGraph, graph_of
from agents.experts._streams import DEFAULT_STREAMS, POOL_STREAMS, Region, Task, stream_parameter
from agents.hostflow import Step, may_exit, unfold
from agents.source_model import HostOpKind, SourceModel

# Calls into code the analysis does not see that work on the GPU (their own streams, buffers).
_LIBRARIES = re.compile(r"^(?:cuda|cu[A-Z]|cublas|cufft|cusparse|cusolver|curand|cudnn|nccl|nvshmem|thrust|cub)")


@dataclass(frozen=True)
class Analysis:
    """A function's regions, its graph (of the original), and why each other block has none."""

    function: str
    graph: KernelGraph
    regions: tuple[Region, ...]
    reasons: tuple[str, ...]  # for blocks with launches that gave no region


@dataclass(frozen=True)
class _Statement:
    node: Node
    steps: tuple[Step, ...]
    problem: str | None  # why it ends a run of tasks; None for a task or host code
    origin: str | None = None

    @property
    def alone(self) -> bool:
        """A loop of unknown trip count: a region of its own (its iterations on a pool)."""
        return self.node.type == "for_statement" and any(not site.exact for step in self.steps
                                                         for site in step.trail if site.node == self.node.id)


def analyse(model: SourceModel, function: str, text: str) -> Analysis:
    steps = unfold(model, function)
    graph = graph_of(model, function, steps)
    fn = next((n for n in _ts.walk(model.root) if n.type == "function_definition"
               and _ts.declared_name(n.child_by_field_name("declarator")) == function), None)
    regions: list[Region] = []
    reasons: list[str] = []
    seen = _Seen(_device_names(graph), frozenset(op.at for op in model.host_ops),
                 frozenset(_ts.declared_name(n.child_by_field_name("declarator")) for n in _ts.walk(model.root)
                           if n.type == "function_definition"))
    for block in _blocks(fn):
        statements = [_classify(model, s, steps, seen) for s in block.named_children if s.type != "comment"]
        if not any(s.steps for s in statements):
            continue
        found, why = _regions(model, function, statements, graph)
        regions += found
        reasons += why
    return Analysis(function, graph, tuple(regions), tuple(dict.fromkeys(reasons)))


def _blocks(fn: Node | None) -> list[Node]:
    return [n for n in _ts.walk(fn) if n.type == "compound_statement"] if fn is not None else []


def _device_names(graph: KernelGraph) -> set[str]:
    names = {r.split("[", 1)[0] for n in graph.nodes for r in n.reads | n.writes if r != ANY}
    return names | {n.stream.split("[", 1)[0] for n in graph.nodes if n.stream}


def _inside(node: Node, at: int) -> bool:
    return node.start_byte <= at < node.end_byte


def _classify(model: SourceModel, node: Node, steps: list[Step], seen: _Seen) -> _Statement:
    mine = tuple(s for s in steps if any(site.node == node.id for site in s.trail))
    where = f"line {node.start_point[0] + 1}"
    if may_exit(node):
        return _Statement(node, mine, f"a return, break or continue ({where}) that would skip the join")
    if not mine:
        hidden = _unseen_gpu_work(node, seen)
        return _Statement(node, (), f"{hidden} ({where}) may work on the GPU unseen" if hidden else None)
    for step in mine:
        op = step.op
        if op.kind is not HostOpKind.LAUNCH:
            return _Statement(node, mine, f"{op.api} (line {op.line})")
        if op.launch is None or op.api == "cudaLaunchKernel":
            return _Statement(node, mine, f"{op.api} (line {op.line}) is not a <<<>>> launch")
    for at in dict.fromkeys(s.call for s in mine if s.call != s.op.at):  # through a helper
        call = next(n for n in _ts.walk(node) if n.type == "call_expression" and n.start_byte == at)
        if stream_parameter(model.root, _ts.callee_name(call)) is None:
            return _Statement(node, mine, f"{_ts.callee_name(call)} (line {call.start_point[0] + 1}) launches "
                                          "without taking a cudaStream_t to launch on")
    origins = {_stream_key(s.op.stream) for s in mine}
    if len(origins) > 1:
        return _Statement(node, mine, f"launches on several streams ({', '.join(sorted(map(str, origins)))}, {where})")
    if (hidden := _unseen_gpu_work(node, seen)) is not None:
        return _Statement(node, mine, f"{hidden} ({where}) may work on the GPU unseen")
    return _Statement(node, mine, None, origins.pop())


def _stream_key(stream: str | None) -> str | None:
    return None if stream is None or stream.strip() in DEFAULT_STREAMS else stream.strip()


@dataclass(frozen=True)
class _Seen:
    """What the analysis sees of a file: its device buffers and streams, the calls it reads as
    CUDA operations, the functions it defines."""

    devices: set[str]
    calls: frozenset[int]
    defined: frozenset[str]


def _unseen_gpu_work(node: Node, seen: _Seen) -> str | None:
    """A call in `node` to a CUDA library, or to a function not of this file that is handed a
    device buffer or a stream."""
    for call in (n for n in _ts.walk(node) if n.type == "call_expression" and n.start_byte not in seen.calls):
        name = _ts.callee_name(call) or _ts.text(call.child_by_field_name("function") or call)
        qualified = _ts.text(call.child_by_field_name("function") or call)
        if _LIBRARIES.match(name) or _LIBRARIES.match(qualified):
            return f"{name}()"
        handed = {_ts.text(p) for a in _ts.arguments(call) for p in _ts.pointer_names(a)}
        if name not in seen.defined and handed & seen.devices:
            return f"{name}({', '.join(sorted(handed & seen.devices))})"
    return None


def _regions(model: SourceModel, function: str, statements: list[_Statement],
             graph: KernelGraph) -> tuple[list[Region], list[str]]:
    runs: list[list[_Statement]] = [[]]
    reasons: list[str] = []
    for statement in statements:
        if statement.problem is not None:
            if statement.steps or any(s.steps for s in runs[-1]):
                reasons.append(f"{statement.problem} breaks the run of launches")
            runs.append([])
        elif statement.alone:
            runs += [[statement], []]
        elif statement.steps and runs[-1] and statement.origin != next(
                (s.origin for s in runs[-1] if s.steps), statement.origin):
            reasons.append(f"launches on another stream from line {statement.node.start_point[0] + 1}")
            runs.append([statement])
        else:
            runs[-1].append(statement)
    regions = []
    for run in runs:
        tasks = [s for s in run if s.steps]
        if not tasks:
            continue
        region = _region(model, function, tasks, graph)
        if isinstance(region, str):
            reasons.append(region)
        else:
            regions.append(region)
    return regions, reasons


def _region(model: SourceModel, function: str, statements: list[_Statement], graph: KernelGraph) -> Region | str:
    tasks: list[Task] = []
    loops: list[tuple[int, str, int, int]] = []
    for statement in statements:
        info = _loop_info(model, statement.node)
        iterations = sorted({site.iteration for step in statement.steps for site in step.trail
                             if site.node == statement.node.id and site.iteration is not None})
        where = f"the loop at line {statement.node.start_point[0] + 1}"
        if info is not None and iterations:
            variable, start, step = info
            if start is None or step is None or step <= 0 or not variable:
                return f"{where} has no constant start and increment"
            loops.append((statement.node.id, variable, start, step))
            for i in iterations:
                nodes = _nodes(statement, graph, i)
                tasks.append(Task(statement.node, i, nodes, f"iteration {i} of the loop at line "
                                                             f"{statement.node.start_point[0] + 1}"))
        else:
            nodes = _nodes(statement, graph, None)
            label = ", ".join(dict.fromkeys(f"{graph.nodes[n].label} (line {graph.nodes[n].line})" for n in nodes))
            tasks.append(Task(statement.node, None, nodes, label))
    pool = bool(loops) and not all(site.exact for step in statements[0].steps for site in step.trail
                                   if site.node == statements[0].node.id)
    if len(tasks) < 2:
        return f"fewer than two tasks to overlap: {tasks[0].label}" if tasks else "no launches"
    return Region(function, tuple(s.node for s in statements), statements[0].origin, tuple(tasks), pool,
                  tuple(loops))


def _nodes(statement: _Statement, graph: KernelGraph, iteration: int | None) -> tuple[int, ...]:
    """The graph nodes of a statement (of one of its iterations), matched by trail."""
    out = []
    for node in graph.nodes:
        sites = [site for site in node.trail if site.node == statement.node.id]
        if sites and (iteration is None or sites[0].iteration == iteration):
            out.append(node.index)
    return tuple(out)


def _loop_info(model: SourceModel, node: Node) -> tuple[str | None, int | None, int | None] | None:
    """A `for` loop's variable, constant start and additive step (None where not constant)."""
    if node.type != "for_statement":
        return None
    env = _ts.ConstEnv({**model.macros, **{k: str(v) for k, v in model.constants.items()}})
    counted = _ts.counted_loop(node, env, 64)
    return (counted.variable, counted.start, counted.step) if counted.variable else None


def task_edges(region: Region, graph: KernelGraph) -> set[tuple[int, int]]:
    """(a, b) for tasks a < b of `region` with a dependency between their nodes."""
    owner = {n: t for t, task in enumerate(region.tasks) for n in task.nodes}
    return {(owner[d.source], owner[d.target]) for d in graph.edges
            if d.source in owner and d.target in owner and owner[d.source] != owner[d.target]}


def pool_problem(region: Region, graph: KernelGraph) -> str | None:
    """Why a pool's iterations cannot go on different streams, or None."""
    edges = task_edges(region, graph)
    if not edges:
        return None
    a, b = min(edges)
    dep = next(d for d in graph.edges if d.source in region.tasks[a].nodes and d.target in region.tasks[b].nodes)
    return (f"iterations of the loop at line {region.statements[0].start_point[0] + 1} depend on each other "
            f"({dep.hazard.value} on {dep.buffer}): a pool of {POOL_STREAMS} streams would reorder them")
