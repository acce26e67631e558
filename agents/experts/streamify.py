"""The streamify expert: a host function whose kernels all go to the default stream, some of them
independent, gets its launches spread over non-blocking streams, with an event for every
dependency that crosses streams. Every proposal is verified before it is made: the patched
source is re-analysed and `agents.depgraph.check` must find every dependency still ordered.

    launches on the default stream ─► plan (greedy: a chain stays on its producer's stream)
        ─► edits (streams/events created before the first launch, `<<<g, b, shm, wf_sK>>>`,
           cudaEventRecord after producers, cudaStreamWaitEvent before consumers,
           cudaDeviceSynchronize + destroys after the last launch)
        ─► agents.patch.apply ─► re-analyse ─► depgraph.check ─► Proposal (only when ok)

Kept deliberately narrow: the launches must sit in one block of the function, each starting its
own line, outside loops, with no other CUDA operation between the first and the last; the
function must not call helpers that do CUDA work, nor be such a helper, nor use streams already.
Anything else is reported as not applicable, with the reason, by `findings`/`explain`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import HostOp, HostOpKind, SourceModel, analyze
from agents.depgraph import CheckResult, KernelGraph, check, extract
from agents.experts._expert import Expert
from agents.patch import Edit, InsertAfter, InsertBefore, Refused, Replace, apply, source_files
from agents.workflow import steps as wf

MAX_STREAMS = 8
STREAM = "wf_s{}"
EVENT = "wf_e{}"
_STREAM_APIS = {HostOpKind.STREAM_CREATE, HostOpKind.EVENT_RECORD, HostOpKind.STREAM_WAIT_EVENT,
                HostOpKind.STREAM_SYNC, HostOpKind.EVENT_SYNC}
_DEFAULT_STREAMS = {"0", "nullptr", "NULL", "cudaStreamLegacy"}
_CHECK_MACRO = re.compile(r"\b([A-Z_][A-Z0-9_]*CHECK[A-Z0-9_]*)\s*\(\s*cuda\w+\s*\(")


@dataclass(frozen=True)
class Plan:
    """A stream for each launch node (graph node index -> stream number), and the cross-stream
    dependencies to synchronise: producer node -> its event number, consumer node -> producers."""

    streams: dict[int, int]
    events: dict[int, int]
    waits: dict[int, tuple[int, ...]]

    @property
    def stream_count(self) -> int:
        return len(set(self.streams.values()))


@dataclass(frozen=True)
class Finding:
    """What the expert concluded for one host function: a verified proposal, or why not."""

    path: str
    function: str
    reason: str  # why not applicable, or the proposal's summary
    proposal: Proposal | None = None
    plan: Plan | None = None
    check: CheckResult | None = field(default=None, compare=False)

    @property
    def applicable(self) -> bool:
        return self.proposal is not None


class StreamifyExpert(Expert):
    """One verified proposal per eligible host function; `explain` says why the others got none."""

    name = "streamify"
    level = wf.Level.APPLICATION

    def analyse(self, context: AnalysisContext) -> list[wf.Finding]:
        out = []
        for f in self.findings(context):
            evidence = ()
            if f.plan is not None:
                evidence = (f"{len(f.plan.streams)} launches, {f.plan.stream_count} independent chains",)
            out.append(wf.Finding(self.name, self.level, f"{f.path}:{f.function}", f.applicable, evidence, f.reason, f))
        return out

    def plan(self, context: AnalysisContext, finding: wf.Finding) -> wf.Plan | None:
        f: Finding = finding.detail
        if f.plan is None or f.proposal is None:
            return None
        changes = (f"launch on {f.plan.stream_count} non-blocking streams with "
                   f"{sum(len(w) for w in f.plan.waits.values())} cross-stream events, then synchronize",)
        return wf.Plan(finding, changes, detail=f)

    def transform(self, context: AnalysisContext, plan: wf.Plan, feedback: str | None = None) -> list[Proposal]:
        f: Finding = plan.detail
        return [f.proposal] if f.proposal is not None else []

    def explain(self, context: AnalysisContext) -> list[str]:
        return [f"{f.path}:{f.function}: {f.reason}" for f in self.findings(context) if not f.applicable]

    def findings(self, context: AnalysisContext) -> list[Finding]:
        from agents.experts.streamify_loop import streamify_loops

        files = source_files(context.target)
        editable = list(context.target.spec.sources)
        found = []
        for path, text in files.items():
            model = analyze(text, path)
            for function in _host_functions(model):
                finding = streamify_function(files, editable, path, model, function, self.name)
                if not finding.applicable and "helper functions" in finding.reason:
                    found += streamify_loops(files, editable, path, model, function, self.name) or [finding]
                else:
                    found.append(finding)
        return found


def _host_functions(model: SourceModel) -> list[str]:
    """Functions with a launch, or calling a function of the file that does CUDA work."""
    seen: list[str] = []
    for op in model.host_ops:
        if op.function and op.kind in (HostOpKind.LAUNCH, HostOpKind.CALL) and op.function not in seen:
            seen.append(op.function)
    return seen


def streamify_function(files: dict[str, str], editable: list[str], path: str, model: SourceModel, function: str,
                       agent: str = StreamifyExpert.name, *, drop_events: bool = False) -> Finding:
    """The finding for `function` of `files[path]`. `drop_events` leaves the event edits out
    (a deliberately broken transformation, to show that the check rejects it)."""
    text = files[path]
    reason = not_applicable(model, function, text)
    if reason:
        return Finding(path, function, reason)
    graph = extract(model, function)
    plan = plan_streams(graph)
    if plan.stream_count < 2:
        return Finding(path, function, "no two launches are independent: nothing to overlap", plan=plan)
    edit_list = edits(path, text, model, function, graph, plan)
    if drop_events:
        edit_list = [e for e in edit_list if not _is_event_edit(e)]
    patched = apply(files, edit_list, editable)
    if isinstance(patched, Refused):
        return Finding(path, function, f"the patch was refused: {patched.reason}", plan=plan)
    result = verify(graph, dict(patched.files)[path], path, function)
    if not result.ok:
        why = "; ".join(v.reason for v in result.violations)
        return Finding(path, function, f"depgraph.check rejected the transformation: {why}", plan=plan, check=result)
    summary = describe(graph, plan, result)
    proposal = Proposal(agent, f"streamify {function} in {path}: {summary}", patched.files)
    return Finding(path, function, summary, proposal, plan, result)


def not_applicable(model: SourceModel, function: str, text: str) -> str | None:
    """Why `function` cannot be streamified, or None."""
    ops = model.ops_in(function)
    callers = [op for op in model.host_ops if op.kind == HostOpKind.CALL and op.api == function]
    if callers:
        where = ", ".join(f"{op.function} line {op.line}{' (in a loop)' if op.loops else ''}" for op in callers)
        return f"a helper function called from {where}: its launches are not streamified in place"
    calls = [op for op in ops if op.kind == HostOpKind.CALL]
    if calls:
        where = ", ".join(f"{op.api} (line {op.line}{', in a loop' if op.loops else ''})" for op in calls)
        return f"its launches sit in helper functions, calls not followed: {where}"
    launches = [op for op in ops if op.kind == HostOpKind.LAUNCH]
    if len(launches) < 2:
        return "fewer than two launches"
    for op in launches:
        if op.loops:
            return f"the launch of {op.api} (line {op.line}) is inside a loop"
        if op.launch is None:
            return f"{op.api} (line {op.line}) is not a <<<>>> launch"
    used = [op for op in ops if op.kind in _STREAM_APIS
            or (op.stream is not None and op.stream.strip() not in _DEFAULT_STREAMS)]
    if used:
        return f"already uses streams ({used[0].api}, line {used[0].line})"
    first, last = launches[0].line, launches[-1].line
    between = [op for op in ops if first < op.line < last and op.kind != HostOpKind.LAUNCH]
    if between:
        return f"{between[0].api} (line {between[0].line}) sits between the launches"
    lines = text.split("\n")
    spans = []
    for op in launches:
        span = _statement(lines, op)
        if span is None:
            return f"the launch of {op.api} (line {op.line}) does not start its own statement line"
        spans.append(span)
    if not _one_block(lines, spans[0][0], spans[-1][2]):
        return "the launches are not all in one block"
    if re.search(r"\bwf_[se]\d+\b", text):
        return "already streamified (wf_s*/wf_e* names in use)"
    return None


def _statement(lines: list[str], op: HostOp) -> tuple[int, int, int] | None:
    """(first line, line of `>>>`, last line) of the launch statement, 1-based, or None when the
    launch does not start its line or follows an unbraced `if`/`else`."""
    start = op.line
    head = lines[start - 1]
    at = head.find("<<<")
    kernel = op.launch.kernel if op.launch else op.api
    if at < 0 or not re.fullmatch(rf"(?:\w+::)*{re.escape(kernel)}(?:\s*<.*>)?", head[:at].strip()):
        return None
    before = next((ln.strip() for ln in reversed(lines[: start - 1]) if ln.strip() and not ln.strip().startswith("//")),
                  "{")
    if not before.endswith((";", "{", "}")):
        return None
    close = None
    depth = 0
    for number in range(start, len(lines) + 1):
        line = lines[number - 1]
        if close is None and ">>>" in line:
            close = number
        if close is not None:
            scan = line[line.find(">>>") + 3:] if number == close else line
            for char in scan:
                depth += {"(": 1, ")": -1}.get(char, 0)
                if char == ";" and depth == 0:
                    return start, close, number
    return None


def _one_block(lines: list[str], first: int, last: int) -> bool:
    depth = 0
    for line in lines[first - 1: last]:
        for char in re.sub(r"//.*", "", line):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth < 0:
                return False
    return depth == 0


def plan_streams(graph: KernelGraph) -> Plan:
    """Greedy: a launch goes on the stream of a dependency predecessor whose stream it would
    continue (that stream's last launch is the predecessor), else a new stream (at most
    MAX_STREAMS, then the least loaded one). Cross-stream edges get an event."""
    launches = [n.index for n in graph.nodes if n.kind == HostOpKind.LAUNCH]
    preds: dict[int, list[int]] = {i: [] for i in launches}
    for dep in graph.edges:
        if dep.source in preds and dep.target in preds and dep.source not in preds[dep.target]:
            preds[dep.target].append(dep.source)
    streams: dict[int, int] = {}
    last: dict[int, int] = {}
    for node in launches:
        choice = next((streams[p] for p in reversed(preds[node]) if last[streams[p]] == p), None)
        if choice is None:
            if len(last) < MAX_STREAMS:
                choice = len(last)
            else:
                load = Counter(streams.values())
                choice = min(range(MAX_STREAMS), key=lambda s: (load[s], s))
        streams[node] = choice
        last[choice] = node
    events: dict[int, int] = {}
    waits: dict[int, tuple[int, ...]] = {}
    for node in launches:
        crossing = tuple(p for p in preds[node] if streams[p] != streams[node])
        if crossing:
            waits[node] = crossing
            for p in crossing:
                events.setdefault(p, len(events))
    return Plan(streams, dict(sorted(events.items())), waits)


def _check_macro(text: str) -> str | None:
    found = Counter(m.group(1) for m in _CHECK_MACRO.finditer(text))
    return found.most_common(1)[0][0] if found else None


def edits(path: str, text: str, model: SourceModel, function: str, graph: KernelGraph, plan: Plan) -> list[Edit]:
    """The patch edits that realise `plan` in `function` (see the module docstring)."""
    lines = text.split("\n")
    macro = _check_macro(text)

    def call(expr: str) -> str:
        return f"{macro}({expr});" if macro else f"{expr};"

    launches = [op for op in model.ops_in(function) if op.kind == HostOpKind.LAUNCH]
    nodes = [n for n in graph.nodes if n.kind == HostOpKind.LAUNCH]
    spans = [span for op in launches if (span := _statement(lines, op)) is not None]
    streams = sorted(set(plan.streams.values()))
    events = sorted(set(plan.events.values()))
    indent = _indent(lines[launches[0].line - 1])
    setup = [f"cudaStream_t {', '.join(STREAM.format(s) for s in streams)};"]
    setup += [call(f"cudaStreamCreateWithFlags(&{STREAM.format(s)}, cudaStreamNonBlocking)") for s in streams]
    if events:
        setup.append(f"cudaEvent_t {', '.join(EVENT.format(e) for e in events)};")
        setup += [call(f"cudaEventCreateWithFlags(&{EVENT.format(e)}, cudaEventDisableTiming)") for e in events]
    first_node = nodes[0].index
    if any(dep.source < first_node <= dep.target for dep in graph.edges):  # earlier default-stream work feeds a launch
        setup.insert(0, call("cudaDeviceSynchronize()"))
    out: list[Edit] = [InsertBefore(path, spans[0][0], _block(indent, setup))]
    for node, span in zip(nodes, spans, strict=True):
        start, close, end = span
        here = _indent(lines[start - 1])
        stream = STREAM.format(plan.streams[node.index])
        waits = [call(f"cudaStreamWaitEvent({stream}, {EVENT.format(plan.events[p])}, 0)")
                 for p in plan.waits.get(node.index, ())]
        if waits:
            out.append(InsertBefore(path, start, _block(here, waits)))
        chevron = "\n".join(lines[start - 1: close])
        out.append(Replace(path, start, close, _with_stream(chevron, stream)))
        if node.index in plan.events:
            out.append(InsertAfter(path, end, _block(here, [
                call(f"cudaEventRecord({EVENT.format(plan.events[node.index])}, {stream})")])))
    teardown = [call("cudaDeviceSynchronize()")]
    teardown += [call(f"cudaStreamDestroy({STREAM.format(s)})") for s in streams]
    teardown += [call(f"cudaEventDestroy({EVENT.format(e)})") for e in events]
    last_end = spans[-1][2]
    if last_end < len(lines) and re.fullmatch(r"\s*\w*CHECK_LAUNCH\w*\s*\(\s*\)\s*;\s*", lines[last_end]):
        last_end += 1  # keep a launch check with its launch
    out.append(InsertAfter(path, last_end, _block(indent, teardown)))
    return out


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _block(indent: str, statements: list[str]) -> str:
    return "".join(f"{indent}{s}\n" for s in statements)


def _with_stream(chevron: str, stream: str) -> str:
    """`<<<g, b>>>` -> `<<<g, b, 0, stream>>>`; `<<<g, b, shm>>>` keeps shm."""
    open_, close = chevron.index("<<<"), chevron.index(">>>")
    config = _split_top(chevron[open_ + 3: close])
    shared = config[2] if len(config) > 2 else "0"
    return f"{chevron[: open_ + 3]}{config[0]}, {config[1]}, {shared}, {stream}{chevron[close:]}"


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1, "[": 1, "]": -1, "{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _is_event_edit(edit: Edit) -> bool:
    text = getattr(edit, "text", "")
    return isinstance(edit, InsertBefore | InsertAfter) and ("cudaEventRecord" in text
                                                             or "cudaStreamWaitEvent" in text)


def verify(original: KernelGraph, patched_text: str, path: str, function: str) -> CheckResult:
    """Re-analyse the patched source and hold its graph of `function` against the original's."""
    return check(original, extract(analyze(patched_text, path), function))


def describe(graph: KernelGraph, plan: Plan, result: CheckResult) -> str:
    nodes = graph.nodes
    assignment = ", ".join(f"{nodes[i].label}->{STREAM.format(s)}" for i, s in plan.streams.items())
    syncs = "; ".join(f"{EVENT.format(plan.events[p])} after {nodes[p].label}, waited by {nodes[c].label}"
                      for c, ps in plan.waits.items() for p in ps) or "none"
    status = "ok" if result.ok else f"{len(result.violations)} violations"
    return (f"{len(plan.streams)} launches on {plan.stream_count} non-blocking streams ({assignment}); "
            f"events: {syncs}; depgraph.check: {status}, {len(graph.edges)} dependencies kept")


__all__ = ["MAX_STREAMS", "Finding", "Plan", "StreamifyExpert", "describe", "edits", "not_applicable", "plan_streams",
           "streamify_function", "verify"]
