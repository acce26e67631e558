"""Streamify for launches made through a helper called in a counted loop, the shape

    for (int t = 0; t < kTasks; ++t) enqueue_task(t, dx, dy, n, stream);

where the helper takes the stream as a parameter. Each iteration is instantiated: the helper's
parameters bound to the call's arguments (the loop variable to its value), its pointer locals
followed, its `if` conditions evaluated with the file's constants (both branches kept where a
condition is not constant), and each launched kernel's pointer arguments turned into regions:
`base + C * n` is slot C of `base` (n elements from C * n), anything else the whole buffer.

The assumption, stated in every finding: a kernel handed `base + C * n` touches only elements
[C * n, (C + 1) * n) of `base` (it is handed the extent n too). Dependencies between iterations
come from overlapping regions; `plan_streams` assigns streams; the loop becomes a fork from the
caller's stream onto non-blocking streams (created once, `static`), the helper called with
`wf_ls[wf_lstream[t]]`, events for the dependencies that cross streams, and a join back. The
transformed text's schedule is read back and every dependency checked before anything is proposed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents import _ts
from agents.cuda_source import HostOpKind, SourceModel, read_params, written_params
from agents.depgraph import Dependency, Hazard, KernelGraph, Node, base_buffer
from agents.experts.streamify import Plan, _check_macro, plan_streams

MAX_ITERATIONS = 64
_LOOP = re.compile(r"^(?P<indent>\s*)for\s*\(\s*int\s+(?P<var>\w+)\s*=\s*(?P<start>[^;]+);\s*(?P=var)\s*<\s*"
                   r"(?P<bound>[^;]+);\s*(?:\+\+\s*(?P=var)|(?P=var)\s*\+\+)\s*\)\s*\{?\s*(?P<call>(?P<helper>\w+)"
                   r"\s*\((?P<args>[^;]*)\)\s*;)\s*\}?\s*$")


@dataclass(frozen=True)
class LoopCall:
    line: int  # 1-based; the loop is this one line
    indent: str
    var: str
    values: tuple[int, ...]
    helper: str
    args: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Iteration:
    value: int
    kernels: tuple[str, ...]
    reads: frozenset[str]  # regions: "dy[6]" (slot 6 of dy) or "dy" (all of it)
    writes: frozenset[str]


def _split_args(text: str) -> tuple[str, ...]:
    out, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(char, 0)
        current += char
    return (*out, current.strip()) if current.strip() else tuple(out)


def _constants(model: SourceModel) -> _ts.ConstEnv:
    """The file's macros and integral constants, for evaluating loop bounds and conditions."""
    return _ts.ConstEnv({**model.macros, **{name: str(value) for name, value in model.constants.items()}})


def find_loops(model: SourceModel, text: str, function: str) -> list[LoopCall]:
    """Counted one-line loops in `function` that call a helper of this file with launches in it."""
    env = _constants(model)
    helpers = {op.function for op in model.host_ops if op.kind == HostOpKind.LAUNCH and op.function}
    lines = text.split("\n")
    found = []
    for op in model.ops_in(function):
        if op.kind != HostOpKind.CALL or op.api not in helpers or not op.loops:
            continue
        m = _LOOP.match(lines[op.line - 1])
        if m is None or m.group("helper") != op.api:
            continue
        start, bound = env.eval_text(m.group("start")), env.eval_text(m.group("bound"))
        if start is None or bound is None or not 0 < bound - start <= MAX_ITERATIONS:
            continue
        found.append(LoopCall(op.line, m.group("indent"), m.group("var"), tuple(range(start, bound)), op.api,
                              _split_args(m.group("args")), lines[op.line - 1]))
    return found


def _substitute(expr: str, names: dict[str, str]) -> str:
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: f"({names[m.group(0)]})" if m.group(0) in names else m.group(0),
                  expr)


def _region(expr: str, extent: str | None, env: _ts.ConstEnv) -> str | None:
    """`dy + (size_t)6 * n` -> "dy[6]" when n is the extent; a bare or unknown offset -> "dy"."""
    base = base_buffer(expr)
    if base is None:
        return None
    if extent is not None:
        rest = re.sub(rf"^\s*\(*\s*{re.escape(base)}\s*\)*\s*\+", "", expr, count=1)
        if rest != expr:
            slot = env.eval_text(re.sub(rf"\b{re.escape(extent)}\b", "1", rest))
            double = env.eval_text(re.sub(rf"\b{re.escape(extent)}\b", "2", rest))
            if slot is not None and double == 2 * slot:
                return f"{base}[{slot}]"
    return base


def _overlap(a: str, b: str) -> bool:
    return a == b or a.split("[")[0] == b or b.split("[")[0] == a


def instantiate(model: SourceModel, root: _ts.Node, loop: LoopCall) -> list[Iteration] | str:
    """Each iteration's kernels and regions, or why the helper cannot be instantiated."""
    helper = next((n for n in _ts.walk(root) if n.type == "function_definition"
                   and _ts.declared_name(n.child_by_field_name("declarator")) == loop.helper), None)
    if helper is None:
        return f"{loop.helper} is not defined in this file"
    declarator = helper.child_by_field_name("declarator")
    params_node = next((n for n in _ts.walk(declarator) if n.type == "parameter_list"), None)
    params = [_ts.declared_name(p.child_by_field_name("declarator")) for p in params_node.named_children] \
        if params_node is not None else []
    if len(params) != len(loop.args):
        return f"{loop.helper} takes {len(params)} arguments, the call gives {len(loop.args)}"
    launches = {op.line: op for op in model.ops_in(loop.helper) if op.kind == HostOpKind.LAUNCH}
    if not launches:
        return f"{loop.helper} launches nothing"
    iterations = []
    for value in loop.values:
        names = {p: (str(value) if a.strip() == loop.var else a) for p, a in zip(params, loop.args, strict=True)}
        env = _constants(model)
        found: list = []
        problem = _walk(helper.child_by_field_name("body"), names, env, launches, found)
        if problem:
            return problem
        reads: set[str] = set()
        writes: set[str] = set()
        for op, bound_names in found:
            try:
                kernel = model.kernel(op.launch.kernel)
            except KeyError:
                return f"{op.launch.kernel} is not defined in this file"
            bound = op.launch.bound_args(kernel)
            ints = [p.name for p in kernel.params if not p.is_pointer]
            extent_param = next((p for p in ints if p in {"n", "count", "size", "len"}), None)
            extent = _substitute(bound[extent_param], bound_names).strip("() ") if extent_param in bound else None
            for p in kernel.params:
                if not p.is_pointer or p.name not in bound:
                    continue
                region = _region(_substitute(bound[p.name], bound_names), extent, env)
                if region is None:
                    return f"iteration {value}: cannot tell what {op.launch.kernel}'s {p.name} points to"
                if p.name in read_params(kernel):
                    reads.add(region)
                if p.name in written_params(kernel):
                    writes.add(region)
        iterations.append(Iteration(value, tuple(op.launch.kernel for op, _ in found), frozenset(reads),
                                    frozenset(writes)))
    return iterations


def stream_parameter(root: _ts.Node, helper: str) -> int | None:
    """The position of the helper's `cudaStream_t` parameter."""
    node = next((n for n in _ts.walk(root) if n.type == "function_definition"
                 and _ts.declared_name(n.child_by_field_name("declarator")) == helper), None)
    params = next((n for n in _ts.walk(node.child_by_field_name("declarator")) if n.type == "parameter_list"),
                  None) if node is not None else None
    for i, p in enumerate(params.named_children if params is not None else []):
        kind = p.child_by_field_name("type")
        if kind is not None and _ts.text(kind).strip() == "cudaStream_t":
            return i
    return None


def _walk(node, names: dict[str, str], env, launches: dict, found: list) -> str | None:
    """Follow one instantiation through the helper's body: pointer locals, constant conditions."""
    if node is None:
        return None
    line = node.start_point[0] + 1
    if node.type == "if_statement":
        condition = node.child_by_field_name("condition")
        value = env.eval_text(_substitute(_ts.text(condition).strip("() ") if condition else "", names))
        branches = [node.child_by_field_name("consequence"), node.child_by_field_name("alternative")]
        chosen = branches if value is None else [branches[0] if value else branches[1]]
        for branch in chosen:
            if (problem := _walk(branch, names, env, launches, found)) is not None:
                return problem
        return None
    if node.type == "declaration":
        for declarator in node.children_by_field_name("declarator"):
            value = declarator.child_by_field_name("value")
            name = _ts.declared_name(declarator)
            if value is not None and name:
                names[name] = _substitute(_ts.text(value), names)
        return None
    if node.type in ("for_statement", "while_statement", "do_statement"):
        if any(line <= ln <= node.end_point[0] + 1 for ln in launches):
            return f"{node.type.split('_')[0]} loop around a launch inside the helper"
        return None
    if node.type == "expression_statement" and line in launches:
        found.append((launches[line], dict(names)))
        return None
    for child in node.named_children:
        if (problem := _walk(child, names, env, launches, found)) is not None:
            return problem
    return None


def dependencies(iterations: list[Iteration]) -> KernelGraph:
    """Iterations as the nodes of a dependence graph (program order), hazards from their regions."""
    nodes = tuple(Node(i, HostOpKind.LAUNCH, f"iteration {it.value}", 0, 0, None, it.reads, it.writes)
                  for i, it in enumerate(iterations))
    edges = []
    for j, later in enumerate(iterations):
        for i, earlier in enumerate(iterations[:j]):
            for hazard, mine, theirs in ((Hazard.RAW, earlier.writes, later.reads),
                                         (Hazard.WAR, earlier.reads, later.writes),
                                         (Hazard.WAW, earlier.writes, later.writes)):
                shared = sorted(a for a in mine for b in theirs if _overlap(a, b))
                if shared:
                    edges.append(Dependency(i, j, hazard, shared[0]))
                    break
    return KernelGraph("loop", nodes, tuple(edges), frozenset())


def rewrite(loop: LoopCall, plan: Plan, stream_arg: int, text: str) -> str:
    """The loop as a fork onto `plan`'s streams, events across streams, and a join."""
    macro = _check_macro(text)

    def call(expr: str) -> str:
        return f"{macro}({expr});" if macro else f"{expr};"

    first = loop.values[0]
    streams = sorted(set(plan.streams.values()))
    k, e = len(streams), max(1, len(plan.events))
    caller_stream = loop.args[stream_arg]
    order = [plan.streams[i] for i in range(len(loop.values))]
    args = list(loop.args)
    args[stream_arg] = f"wf_ls[wf_lstream[{loop.var} - ({first})]]"
    i1, i2 = loop.indent + "    ", loop.indent + "        "
    body = [f"{loop.indent}{{  // warpfleet streamify: the iterations of this loop on {k} non-blocking streams",
            f"{i1}static cudaStream_t wf_ls[{k}];",
            f"{i1}static cudaEvent_t wf_lfork, wf_ljoin[{k}], wf_lev[{e}];",
            f"{i1}static bool wf_lready = false;",
            f"{i1}if (!wf_lready) {{",
            f"{i2}for (int s = 0; s < {k}; ++s) " + call("cudaStreamCreateWithFlags(&wf_ls[s], cudaStreamNonBlocking)"),
            f"{i2}for (int s = 0; s < {k}; ++s) " + call("cudaEventCreateWithFlags(&wf_ljoin[s], "
                                                         "cudaEventDisableTiming)"),
            f"{i2}for (int s = 0; s < {e}; ++s) " + call("cudaEventCreateWithFlags(&wf_lev[s], "
                                                         "cudaEventDisableTiming)"),
            f"{i2}{call('cudaEventCreateWithFlags(&wf_lfork, cudaEventDisableTiming)')}",
            f"{i2}wf_lready = true;",
            f"{i1}}}",
            f"{i1}static const int wf_lstream[{len(order)}] = {{{', '.join(map(str, order))}}};",
            f"{i1}{call(f'cudaEventRecord(wf_lfork, {caller_stream})')}",
            f"{i1}for (int s = 0; s < {k}; ++s) {call('cudaStreamWaitEvent(wf_ls[s], wf_lfork, 0)')}",
            f"{i1}for (int {loop.var} = {first}; {loop.var} < {first + len(order)}; ++{loop.var}) {{"]
    for consumer, producers in sorted(plan.waits.items()):
        for p in producers:
            body.append(f"{i2}if ({loop.var} == {loop.values[consumer]}) "
                        + call(f"cudaStreamWaitEvent(wf_ls[{order[consumer]}], wf_lev[{plan.events[p]}], 0)"))
    body.append(f"{i2}{loop.helper}({', '.join(args)});")
    for producer, event in sorted(plan.events.items()):
        body.append(f"{i2}if ({loop.var} == {loop.values[producer]}) "
                    + call(f"cudaEventRecord(wf_lev[{event}], wf_ls[{order[producer]}])"))
    body += [f"{i1}}}",
             f"{i1}for (int s = 0; s < {k}; ++s) {{",
             f"{i2}{call('cudaEventRecord(wf_ljoin[s], wf_ls[s])')}",
             f"{i2}{call(f'cudaStreamWaitEvent({caller_stream}, wf_ljoin[s], 0)')}",
             f"{i1}}}",
             f"{loop.indent}}}"]
    return "\n".join(body)


def read_back(block: str, loop: LoopCall) -> tuple[list[int], dict[int, set[int]], dict[int, set[int]]]:
    """From a rewritten loop's text: each iteration's stream, the events each records and waits on."""
    table = re.search(r"wf_lstream\[\d+\] = \{([^}]*)\}", block)
    streams = [int(x) for x in table.group(1).split(",")] if table else []
    index = {v: i for i, v in enumerate(loop.values)}
    records: dict[int, set[int]] = {}
    waits: dict[int, set[int]] = {}
    for m in re.finditer(rf"if \({loop.var} == (-?\d+)\) .*?cudaEventRecord\(wf_lev\[(\d+)\]", block):
        records.setdefault(index[int(m.group(1))], set()).add(int(m.group(2)))
    for m in re.finditer(rf"if \({loop.var} == (-?\d+)\) .*?cudaStreamWaitEvent\(wf_ls\[\d+\], wf_lev\[(\d+)\]", block):
        waits.setdefault(index[int(m.group(1))], set()).add(int(m.group(2)))
    return streams, records, waits


def check(graph: KernelGraph, block: str, loop: LoopCall) -> list[str]:
    """Every dependency of the original loop still ordered by what the rewritten text says."""
    streams, records, waits = read_back(block, loop)
    if len(streams) != len(graph.nodes):
        return [f"the stream table has {len(streams)} entries for {len(graph.nodes)} iterations"]
    problems = []
    for dep in graph.edges:
        same = streams[dep.source] == streams[dep.target]
        evented = bool(records.get(dep.source, set()) & waits.get(dep.target, set()))
        if not (same or evented):
            problems.append(f"iteration {loop.values[dep.target]} {dep.hazard.value} on {dep.buffer} after "
                            f"iteration {loop.values[dep.source]}: different streams and no event")
    if "wf_ljoin" not in block or "wf_lfork" not in block:
        problems.append("no fork from or join to the caller's stream")
    return problems


def streamify_loops(files: dict[str, str], editable: list[str], path: str, model: SourceModel, function: str,
                    agent: str) -> list:
    """A finding for each counted loop of `function` that calls a launching helper."""
    from agents.experts.streamify import Finding
    from agents.patch import Refused, Replace, apply

    text = files[path]
    loops = find_loops(model, text, function)
    if not loops:
        return []
    pre = _ts.preprocess(text.encode("utf-8", "surrogateescape"))
    root = _ts.parser().parse(pre.masked).root_node
    out = []
    for loop in loops:
        where = f"{function} (loop at line {loop.line})"
        stream_arg = stream_parameter(root, loop.helper)
        if stream_arg is None:
            out.append(Finding(path, where, f"{loop.helper} takes no cudaStream_t to put its launches on"))
            continue
        iterations = instantiate(model, root, loop)
        if isinstance(iterations, str):
            out.append(Finding(path, where, iterations))
            continue
        graph = dependencies(iterations)
        plan = plan_streams(graph)
        if plan.stream_count < 2:
            out.append(Finding(path, where, "no two iterations are independent: nothing to overlap", plan=plan))
            continue
        block = rewrite(loop, plan, stream_arg, text)
        patched = apply(files, [Replace(path, loop.line, loop.line, block)], editable)
        if isinstance(patched, Refused):
            out.append(Finding(path, where, f"the patch was refused: {patched.reason}", plan=plan))
            continue
        new_lines = dict(patched.files)[path].split("\n")
        problems = check(graph, "\n".join(new_lines[loop.line - 1: loop.line - 1 + block.count("\n") + 1]), loop)
        if problems:
            out.append(Finding(path, where, f"the rewritten loop fails its check: {'; '.join(problems)}", plan=plan))
            continue
        deps = "; ".join(f"iteration {loop.values[d.target]} {d.hazard.value} {d.buffer} of iteration "
                         f"{loop.values[d.source]}" for d in graph.edges) or "none"
        summary = (f"{len(iterations)} iterations of {loop.helper} on {plan.stream_count} non-blocking streams, "
                   f"{len(plan.events)} events; dependencies: {deps}; assumed: a kernel handed `base + C * n` "
                   f"touches only elements [C * n, (C + 1) * n) of base")
        from agents._base import Proposal

        out.append(Finding(path, where, summary, Proposal(agent, f"streamify the loop at {path}:{loop.line}: "
                                                                 f"{summary}", patched.files), plan))
    return out


__all__ = ["Iteration", "LoopCall", "check", "dependencies", "find_loops", "instantiate", "plan_streams", "rewrite",
           "stream_parameter", "streamify_loops"]
