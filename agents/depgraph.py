"""The dependence graph of one host function's CUDA work, and a check that a transformed
program (Streamify's: launches moved onto streams) still orders every dependent pair.

`extract` turns a function's host operations, as `agents.hostflow.unfold` runs them (helpers
followed, counted loops unfolded), into nodes in program order: kernel launches, memcpy/memset
(data nodes, with the regions they read and write) and the synchronisation points
(device/stream/event synchronize, event record, stream wait event). Its edges are the RAW, WAR
and WAW hazards between data nodes touching overlapping regions. `ordering` is what the stream
semantics guarantee runs in order; `check` holds a transformed graph's ordering against the
original's edges.

Both sides are conservative in the direction that keeps `check` safe: edges over-approximate
(any pointer a kernel may write counts as written, an unknown kernel reads and writes all its
arguments, a pointer the analysis lost is every buffer) and ordering under-approximates (a
stream the file does not create is taken as non-blocking; a synchronisation that may not run
orders nothing). Assumptions, kept simple on purpose:
- the legacy default stream (no `--default-stream per-thread`);
- streams and events are identified by their expression text once names are bound (`s[1]` and
  `s[2]` differ);
- a region is a whole buffer, except `base + C * E` (or `&base[C * E]`) handed to a kernel that
  also gets E (or copied with a size of E elements): slot C of E elements, which the kernel stays
  within; and the elements of an array of device pointers (`outs[2]`) are distinct buffers.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from agents import _ts
from agents.hostflow import Site, Step, unfold
from agents.regions import ANY, SINGLE, base_buffer, overlap, pretty, region, regions, strip_parentheses
from agents.source_model import DEFAULT_STREAMS, HostOp, HostOpKind, SourceModel, read_params, written_params

__all__ = ["ANY", "CheckResult", "Dependency", "Hazard", "KernelGraph", "Node", "Violation", "base_buffer", "check",
           "extract", "graph_of", "ordering", "overlap", "pretty", "region", "streams_ordered"]

_DATA = {HostOpKind.LAUNCH, HostOpKind.MEMCPY, HostOpKind.MEMSET}
# Operations enqueued on a stream: ordered with earlier work by the stream rules.
_STREAM_OPS = _DATA | {HostOpKind.EVENT_RECORD, HostOpKind.STREAM_WAIT_EVENT}
_SYNCS = {HostOpKind.DEVICE_SYNC, HostOpKind.STREAM_SYNC, HostOpKind.EVENT_SYNC}
_NODE_KINDS = _STREAM_OPS | _SYNCS
# Synchronous copies that return only once the data is on the host: later host work waits.
_BLOCKING_COPIES = {"cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyFromSymbol"}


class Hazard(StrEnum):
    RAW = "RAW"  # the later node reads what the earlier wrote
    WAR = "WAR"  # the later node writes what the earlier read
    WAW = "WAW"  # both write


@dataclass(frozen=True)
class Node:
    """One CUDA operation of the function. `label` is the kernel for a launch, else
    `memcpy(dst, src)`/`memset(dst)` or the API name; `occurrence` counts earlier nodes of the
    same label, so (label, occurrence) names a node across a transformation."""

    index: int
    kind: HostOpKind
    label: str
    occurrence: int
    line: int
    stream: str | None  # as written; None: not given (the default stream)
    reads: frozenset[str]
    writes: frozenset[str]
    event: str | None = None  # the event recorded, waited on or synchronised on
    blocks_host: bool = False  # the host waits for it before issuing anything after it
    conditional: bool = False  # it may not run (agents.hostflow)
    # The conditions it runs under: a node orders later ones only if they run only when it does
    # (its guards are a subset of theirs).
    guards: frozenset[int] = field(default=frozenset(), compare=False)
    trail: tuple[Site, ...] = field(default=(), compare=False)  # the statements around it
    call: int = field(default=-1, compare=False)  # byte offset of the function's call that led to it

    @property
    def key(self) -> tuple[str, int]:
        return self.label, self.occurrence

    @property
    def is_data(self) -> bool:
        return self.kind in _DATA


@dataclass(frozen=True)
class Dependency:
    """`target` must run after `source` (node indices, source < target) because of `buffer`, a
    region both touch."""

    source: int
    target: int
    hazard: Hazard
    buffer: str


@dataclass(frozen=True)
class KernelGraph:
    function: str
    nodes: tuple[Node, ...]  # program order; node.index is its position
    edges: tuple[Dependency, ...]
    blocking_streams: frozenset[str]  # streams created without cudaStreamNonBlocking


@dataclass(frozen=True)
class Violation:
    """A reason the transformed program is not equivalent; `dependency` is the original's edge
    it breaks, None for a launch dropped or added."""

    reason: str
    dependency: Dependency | None = None


@dataclass(frozen=True)
class CheckResult:
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


# -- extraction ----------------------------------------------------------------------------------

def extract(model: SourceModel, function: str) -> KernelGraph:
    """The CUDA operations of host function `function` in the order they run, and their hazards."""
    return graph_of(model, function, unfold(model, function))


def graph_of(model: SourceModel, function: str, steps: list[Step]) -> KernelGraph:
    seen: Counter[str] = Counter()
    nodes = []
    for step in steps:
        op = step.op
        if op.kind not in _NODE_KINDS:
            continue
        reads, writes = _effects(model, op)
        label = _label(op)
        nodes.append(Node(len(nodes), op.kind, label, seen[label], op.line, op.stream, frozenset(reads),
                          frozenset(writes), _event(op), _blocks_host(op), step.conditional, step.guards, step.trail,
                          step.call))
        seen[label] += 1
    return KernelGraph(function, tuple(nodes), tuple(_hazards(nodes)), _blocking_streams(model))


def _effects(model: SourceModel, op: HostOp) -> tuple[set[str], set[str]]:
    if op.kind == HostOpKind.LAUNCH and op.launch is not None:
        try:
            kernel = model.kernel(op.launch.kernel)
        except KeyError:  # not defined in this file: it may touch anything it is given
            every = {b for a in op.launch.args if (b := region(a, ()))}
            return every, every
        bound = op.launch.bound_args(kernel)
        extents = [bound[p.name] for p in kernel.params if not p.is_pointer and p.name in bound]
        written, read = written_params(kernel), read_params(kernel)
        pointers = {p.name: regions(bound.get(p.name), [SINGLE] if p.name in kernel.single_element else extents,
                                    model) for p in kernel.params if p.is_pointer}
        return ({b for p, bs in pointers.items() if p in read for b in bs},
                {b for p, bs in pointers.items() if p in written for b in bs})
    extents = _copied_elements(op)
    dst, src = region(op.dst, extents, model), region(op.src, extents, model)
    return ({src} if src else set()), ({dst} if dst and op.kind in _DATA else set())


def _copied_elements(op: HostOp) -> list[str]:
    """`n` of a copy or set of `n * sizeof(float)` bytes (the size argument), for slot regions."""
    position = 2 if op.kind in (HostOpKind.MEMCPY, HostOpKind.MEMSET) and not op.api.endswith(("2D", "Symbol",
                                                                                             "SymbolAsync")) else None
    size = op.args[position] if position is not None and position < len(op.args) else ""
    m = re.fullmatch(r"(.+?)\s*\*\s*sizeof\s*\(.*\)|sizeof\s*\(.*?\)\s*\*\s*(.+)", size.strip())
    return [strip_parentheses(next(g for g in m.groups() if g))] if m else []


def _label(op: HostOp) -> str:
    if op.kind == HostOpKind.LAUNCH:
        return op.launch.kernel if op.launch is not None else op.api
    if op.kind == HostOpKind.MEMCPY:  # cudaMemcpy and cudaMemcpyAsync of the same buffers match
        return f"memcpy({base_buffer(op.dst)}, {base_buffer(op.src)})"
    if op.kind == HostOpKind.MEMSET:
        return f"memset({base_buffer(op.dst)})"
    return op.api


def _event(op: HostOp) -> str | None:
    position = {HostOpKind.EVENT_RECORD: 0, HostOpKind.EVENT_SYNC: 0, HostOpKind.STREAM_WAIT_EVENT: 1}.get(op.kind)
    return op.args[position].strip() if position is not None and position < len(op.args) else None


def _blocks_host(op: HostOp) -> bool:
    return op.kind in _SYNCS or (op.api in _BLOCKING_COPIES and op.direction == "cudaMemcpyDeviceToHost")


def _blocking_streams(model: SourceModel) -> frozenset[str]:
    """Streams the file creates blocking (plain cudaStreamCreate, or flags without NonBlocking),
    and the stream parameter of a launch lambda the harness runs on the legacy default stream
    (`wf::bench(opt, [&](cudaStream_t s) {...})`: bench hands it its stream argument, 0 by
    default); a stream also created non-blocking anywhere counts as non-blocking."""
    blocking, nonblocking = set(_harness_default_streams(model)), set()
    for op in model.host_ops:
        if op.kind == HostOpKind.STREAM_CREATE and op.args and (name := base_buffer(op.args[0])):
            flags = op.args[1] if op.api != "cudaStreamCreate" and len(op.args) > 1 else ""
            (nonblocking if "cudaStreamNonBlocking" in flags else blocking).add(name)
    return frozenset(blocking - nonblocking)


HARNESS_BENCH = "wf::bench"  # the timing harness's loop (HARNESS_API.md): bench(opt, launch, stream = 0)


def _harness_default_streams(model: SourceModel) -> set[str]:
    """The first parameter's name of each lambda handed to `wf::bench` with no stream, or with a
    default stream: the legacy default stream under another name."""
    names = set()
    for call in _ts.walk(model.root) if model.root is not None else ():
        if call.type != "call_expression" or _ts.text(call.child_by_field_name("function")).replace(" ", "") \
                != HARNESS_BENCH:
            continue
        args = _ts.arguments(call)
        if len(args) > 2 and _ts.text(args[2]).strip() not in DEFAULT_STREAMS:
            continue
        params = _ts.parameters(args[1]) if len(args) > 1 and args[1].type == "lambda_expression" else []
        if params and (name := _ts.declared_name(params[0].child_by_field_name("declarator"))):
            names.add(name)
    return names


def _hazards(nodes: list[Node]) -> list[Dependency]:
    edges = []
    for later in nodes:
        for earlier in nodes[: later.index]:
            for hazard, mine, theirs in ((Hazard.RAW, earlier.writes, later.reads),
                                         (Hazard.WAR, earlier.reads, later.writes),
                                         (Hazard.WAW, earlier.writes, later.writes)):
                shared = sorted(b for b in theirs if any(overlap(a, b) for a in mine))
                if shared:
                    edges.append(Dependency(earlier.index, later.index, hazard, shared[0]))
    return edges


# -- ordering ------------------------------------------------------------------------------------


def _stream_key(stream: str | None) -> str:
    return "0" if stream is None or stream.strip() in DEFAULT_STREAMS else stream.strip()


def streams_ordered(earlier: str | None, later: str | None, blocking: frozenset[str]) -> bool:
    """Whether work on stream `later` waits for earlier work on stream `earlier`: the same
    stream, or the legacy default stream and a blocking stream (either way round)."""
    a, b = _stream_key(earlier), _stream_key(later)
    if a == b:
        return True

    def is_blocking(stream: str) -> bool:
        return stream == "cudaStreamPerThread" or base_buffer(stream) in blocking

    return (a == "0" and is_blocking(b)) or (b == "0" and is_blocking(a))


def _direct_predecessors(graph: KernelGraph, node: Node) -> set[int]:
    """The earlier nodes that `node` waits for by one rule, before the transitive closure."""
    earlier = graph.nodes[: node.index]
    # The host issued `node` after they finished (when they ran, which they did if `node` runs).
    preds = {a.index for a in earlier if a.blocks_host and _runs_with(a, node)}
    if node.kind == HostOpKind.DEVICE_SYNC:
        return {a.index for a in earlier}
    if node.kind == HostOpKind.STREAM_SYNC:  # its own stream only: the conservative reading
        return preds | {a.index for a in earlier if a.kind in _STREAM_OPS
                        and _stream_key(a.stream) == _stream_key(node.stream)}
    if node.kind in (HostOpKind.EVENT_SYNC, HostOpKind.STREAM_WAIT_EVENT):
        record = next((a for a in reversed(earlier) if a.kind == HostOpKind.EVENT_RECORD and a.event == node.event),
                      None)  # waiting on an event waits for its latest record
        if record is not None and _runs_with(record, node):  # else an earlier record may be the latest
            preds.add(record.index)
    if node.kind in _STREAM_OPS:
        preds |= {a.index for a in earlier if a.kind in _STREAM_OPS
                  and streams_ordered(a.stream, node.stream, graph.blocking_streams)}
    return preds


def ordering(graph: KernelGraph) -> set[tuple[int, int]]:
    """The pairs (a, b) of node indices that the program's stream semantics run in order (a
    finishes before b starts): same stream, the default stream with a blocking stream, an event
    recorded after a and waited on before b, a synchronize covering a issued before b, a host-
    blocking copy; closed transitively."""
    before: list[set[int]] = []
    for node in graph.nodes:  # every rule points forward in program order: one pass closes it
        direct = _direct_predecessors(graph, node)
        # Only through a node that surely ran when `node` runs: what it waited for is then done.
        before.append(direct.union(*(before[a] for a in direct if _runs_with(graph.nodes[a], node))))
    return {(a, b) for b, preds in enumerate(before) for a in preds}


def _runs_with(a: Node, b: Node) -> bool:
    """Whether `a` surely runs when `b` does: every condition of a's is one of b's."""
    return a.guards <= b.guards


# -- checking ------------------------------------------------------------------------------------


def check(original: KernelGraph, transformed: KernelGraph) -> CheckResult:
    """Whether `transformed` does the original's data operations (matched by label and
    occurrence) and orders every pair the original's dependencies need ordered. A dependency the
    original itself leaves unordered as far as the analysis sees (a launch on a stream passed in,
    which the analysis cannot resolve) is not the transformation's to keep."""
    order, kept_by_original = ordering(transformed), ordering(original)
    staged, violations = _staging_copies(original, transformed, order, kept_by_original)
    violations += _membership(original, transformed, staged)
    matched = {n.key: n for n in transformed.nodes if n.is_data}
    for dep in original.edges:
        if (dep.source, dep.target) not in kept_by_original:
            continue
        source, target = original.nodes[dep.source], original.nodes[dep.target]
        if source.key not in matched or target.key not in matched:
            continue  # reported as dropped
        a, b = matched[source.key], matched[target.key]
        if (a.index, b.index) not in order:
            violations.append(Violation(_unordered(dep, a, b), dep))
    return CheckResult(tuple(violations))


def _membership(original: KernelGraph, transformed: KernelGraph,
                staged: frozenset[tuple[str, int]] = frozenset()) -> list[Violation]:
    ours = {n.key: n for n in original.nodes if n.is_data}
    theirs = {n.key: n for n in transformed.nodes if n.is_data}
    dropped = [Violation(f"{_name(n)} (line {n.line}) is in the original but not in the transformed program")
               for key, n in ours.items() if key not in theirs]
    added = [Violation(f"{_name(n)} (line {n.line}) is in the transformed program but not in the original")
             for key, n in theirs.items() if key not in ours and key not in staged]
    return dropped + added


def _staging_copies(original: KernelGraph, transformed: KernelGraph, order: set[tuple[int, int]],
                    kept_by_original: set[tuple[int, int]]) -> tuple[frozenset[tuple[str, int]], list[Violation]]:
    """Copies the transformation added into memory the original never touches (a new
    `__constant__` table staged from a buffer before the launch that reads it): they change none
    of the original's buffers, so they may be added, provided each sees what the launch it stages
    for (the next one on its stream) would have read: it runs after every write of its source
    issued before that launch, and before every write issued after it, where the original orders
    that write with the launch (as `check` keeps only what the original orders). That the launch
    reads the new memory is the transformation's to keep (the analysis does not see a kernel's
    reads of a file-scope symbol)."""
    before_in_original = {n.key: n.index for n in original.nodes}
    ours = {n.key for n in original.nodes if n.is_data}
    # The buffers the original names. A pointer it lost (ANY) may be any of them, never memory that
    # only the transformed program declares.
    named = {r.split("[", 1)[0] for n in original.nodes for r in n.reads | n.writes if r != ANY}
    staged, violations = set(), []
    for node in transformed.nodes:
        if node.kind is not HostOpKind.MEMCPY or node.key in ours or not node.writes:
            continue
        if any(w == ANY or w.split("[", 1)[0] in named for w in node.writes):
            continue  # it writes the original's memory: an added operation like any other
        staged.add(node.key)
        launch = next((n for n in transformed.nodes[node.index + 1:] if n.kind is HostOpKind.LAUNCH
                       and _stream_key(n.stream) == _stream_key(node.stream)), None)
        if launch is None:
            violations.append(Violation(f"{_name(node)} (line {node.line}) stages memory that no later launch on "
                                        f"its stream reads"))
            continue
        for other in transformed.nodes:
            if other.index == node.index or not other.is_data:
                continue
            if not any(overlap(w, r) for w in other.writes for r in node.reads):
                continue
            earlier = other.index < launch.index
            pair = (other.index, node.index) if earlier else (node.index, other.index)
            w, k = before_in_original.get(other.key), before_in_original.get(launch.key)
            if w is not None and k is not None and ((w, k) if earlier else (k, w)) not in kept_by_original:
                continue  # the original leaves the launch unordered with this write: not the copy's to keep
            if pair not in order:
                verb = "after" if other.index < launch.index else "before"
                violations.append(Violation(
                    f"{_name(node)} (line {node.line}) reads {', '.join(sorted(map(pretty, node.reads)))}, "
                    f"which {_name(other)} (line {other.line}) writes, but may not run {verb} it"))
    return frozenset(staged), violations


def _name(node: Node) -> str:
    return node.label if node.occurrence == 0 else f"{node.label} #{node.occurrence + 1}"


def _unordered(dep: Dependency, a: Node, b: Node) -> str:
    """`combine_kernel (line 40) reads y written by poly_kernel (line 31) but may run before it:
    different streams (s_poly, s_combine), no event`."""
    verb = {Hazard.RAW: "reads {} written by", Hazard.WAR: "writes {} read by",
            Hazard.WAW: "writes {} also written by"}[dep.hazard].format(pretty(dep.buffer))
    if b.index < a.index:
        why = "it is now issued first"
    elif _stream_key(a.stream) == "0" or _stream_key(b.stream) == "0":
        other = b.stream if _stream_key(a.stream) == "0" else a.stream
        why = f"{other} is not synchronised with the default stream, no event or synchronize between them"
    else:
        why = f"different streams ({a.stream}, {b.stream}), no event or synchronize between them"
    return f"{_name(b)} (line {b.line}) {verb} {_name(a)} (line {a.line}) but may run before it: {why}"
