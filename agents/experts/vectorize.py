"""The vectorizing expert: a kernel loop whose every global access is `p[B + v]` (one offset B,
the loop variable v) loads and stores 16 bytes at a time (`float4`, `int4`, `uint4`, `double2`)
where the pointers are aligned, and falls back to the loop as written for the rest.

    for (T v = S; v < E; ++v)        one thread walks a row: 4 (or 2) of its iterations at a time
    for (T v = tid; v < E; v += all) a grid-stride loop: each thread takes groups of 4 elements
        ─► the body run per lane on local copies (wf_p[wf_j]), loaded before, stored after
        ─► under a run-time test of every pointer's alignment; a scalar tail and fallback

Loading a chunk before the lanes and storing it after reorders nothing another iteration sees
when each iteration touches only its own element of each array (the one offset), every access
runs on every iteration (none under a condition: a vector load may not read what the loop would
not) and stores are plain statements of the body (every lane writes its element). A grid-stride
body must not carry values from one element to the next (another thread takes them). A loop that
every thread of a warp walks alike (no threadIdx in its offset or start, directly or through a
local) only loads broadcasts, one sector a request at any width: left alone. Anything else is
left alone, with the reason. Evidence: global sectors per request, when profiled.
"""

from __future__ import annotations

import re

from agents import _ts
from agents._base import AnalysisContext, Proposal
from agents._ts import Node
from agents.experts._expert import Change, Expert, derived_names, kernel_node, line_edits, mentions, source_models
from agents.experts.vectorize_rewrite import Candidate, rewrite
from agents.hostflow import assigned, may_exit
from agents.patch import Patched, apply, readonly_regions, source_files
from agents.source_model import Kernel
from agents.workflow.steps import Finding, Level, Plan

VECTORS = {"float": "float4", "int": "int4", "unsigned int": "uint4", "unsigned": "uint4", "double": "double2"}
_CONDITIONAL = {"if_statement", "for_statement", "while_statement", "do_statement", "conditional_expression",
                "switch_statement", "for_range_loop"}
_GLOBAL_METRICS = {op: (f"l1tex__t_sectors_pipe_lsu_mem_global_op_{op}.sum",
                        f"l1tex__t_requests_pipe_lsu_mem_global_op_{op}.sum") for op in ("ld", "st")}


class VectorizeExpert(Expert):
    """One proposal per vectorizable kernel loop."""

    name = "vectorize"
    level = Level.KERNEL

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        evidence = sector_evidence(context.metrics)
        findings = []
        texts = source_files(context.target)
        for path, model in source_models(context).items():
            readonly = readonly_regions(texts[path])
            for kernel in model.kernels:
                fn = kernel_node(model, kernel)
                for loop in (n for n in _ts.walk(fn.child_by_field_name("body") or fn) if n.type == "for_statement"):
                    line = loop.start_point[0] + 1
                    where = f"{path}:{line} in {kernel.name}"
                    verdict = candidate(kernel, loop)
                    if isinstance(verdict, str):
                        findings.append(Finding(self.name, self.level, where, False, evidence, verdict))
                    elif any(a <= line <= b for a, b in readonly):
                        findings.append(Finding(self.name, self.level, where, False, evidence, "in a read-only region"))
                    elif _no_global_traffic(context.metrics):
                        findings.append(Finding(self.name, self.level, where, False, evidence,
                                                "the profile shows no global loads or stores"))
                    else:
                        findings.append(Finding(self.name, self.level, where, True, evidence, _why(verdict),
                                                (path, kernel, line), kernel=kernel.name))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        path, kernel, line = finding.detail
        return Plan(finding, (f"rewrite the loop at {path}:{line} in {kernel.name}: vector loads and stores under "
                              "an alignment test, the loop as written for the tail and the unaligned case",),
                    detail=finding.detail)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        path, kernel, line = plan.detail
        model = source_models(context)[path]
        files = source_files(context.target)
        fn = kernel_node(model, model.kernel(kernel.name))
        loop = next(n for n in _ts.walk(fn) if n.type == "for_statement" and n.start_point[0] + 1 == line)
        found = candidate(model.kernel(kernel.name), loop)
        if isinstance(found, str):
            return []
        source = files[path].encode("utf-8", "surrogateescape")
        change = Change(loop.start_byte, loop.end_byte, rewrite(found, source))
        patched = apply(files, line_edits(path, source, [change]), context.target.spec.sources)
        if not isinstance(patched, Patched):
            return []
        return [Proposal(self.name, f"{path}:{line} in {kernel.name}: {plan.finding.reason}\n{patched.diff}",
                         patched.files)]


def _why(found: Candidate) -> str:
    form = "one thread's consecutive iterations" if found.stride is None else "a grid-stride loop's elements"
    where = f"`{found.offset} + {found.variable}`" if found.offset else f"`{found.variable}`"
    return (f"every access of {', '.join(dict.fromkeys(p for _, p, _ in found.accesses))} is at {where}: "
            f"{found.width} of {form} at a time as {found.vector}, where aligned")


def sector_evidence(metrics: dict[str, float]) -> tuple[str, ...]:
    out = []
    for op, (sectors, requests) in _GLOBAL_METRICS.items():
        if metrics.get(requests):
            out.append(f"{metrics.get(sectors, 0) / metrics[requests]:.1f} sectors per global "
                       f"{'load' if op == 'ld' else 'store'} request ({metrics[requests]:,.0f} requests)")
    return tuple(out) or ("no profile: decided from the source alone",)


def _no_global_traffic(metrics: dict[str, float]) -> bool:
    counted = [metrics[r] for _, r in _GLOBAL_METRICS.values() if r in metrics]
    return bool(counted) and not any(counted)


def candidate(kernel: Kernel, loop: Node) -> Candidate | str:
    """The loop as a `Candidate`, or why it is not one."""
    header = _header(loop)
    if isinstance(header, str):
        return header
    variable, type_, start, end, stride = header
    body = loop.child_by_field_name("body")
    if body is None or may_exit(body):
        return "the body may leave the loop early (break, continue, return)"
    if variable in assigned(body):
        return f"the body changes {variable}"
    accesses = _accesses(kernel, body, variable)
    if isinstance(accesses, str):
        return accesses
    offsets = {offset for _, _, offset, _ in accesses}
    if len(offsets) != 1:
        return f"accesses at different offsets ({', '.join(sorted(repr(o) for o in offsets))})"
    offset = offsets.pop()
    if re.search(rf"\b(?:{'|'.join(map(re.escape, assigned(body) or {'$^'}))})\b", offset):
        return f"the offset `{offset}` changes in the loop"
    elements = {kernel.param(p).type.replace("__restrict__", "").replace("const", "").replace("*", "").strip()
                for _, p, _, _ in accesses}
    element = " ".join(elements.pop().split()) if len(elements) == 1 else None
    if element not in VECTORS:
        return f"element types {sorted(elements)} have no 16-byte vector type here" if element is None else \
            f"element type {element!r} has no 16-byte vector type here"
    if stride is not None:
        if offset:
            return f"a grid-stride loop accessing `{offset} + {variable}`: only `p[{variable}]` is regrouped"
        carried = assigned(body) - _declared(body)
        if carried:
            return f"the body carries {', '.join(sorted(carried))} from one element to the next"
        if re.search(r"\b(?:threadIdx|blockIdx)\b", end):
            return f"the bound `{end}` differs between threads"
    if stride is None and not _thread_dependent((offset, start), _function_text(loop)):
        seen = list(dict.fromkeys(_ts.text(a) for a, _, _, _ in accesses))
        listed = ", ".join(seen[:3]) + (", ..." if len(seen) > 3 else "")
        return (f"every access ({listed}) is the same for all threads of a warp: a broadcast, one "
                "sector a request at any width, which vector loads would not make fewer")
    return Candidate(loop, variable, type_, start, end, stride, offset, element, VECTORS[element],
                     tuple((n, p, store) for n, p, _, store in accesses))


_THREAD = re.compile(r"\bthreadIdx\b")


def _thread_dependent(expressions: tuple[str, ...], function: str) -> bool:
    """Whether any of ``expressions`` depends on the thread: mentions threadIdx, or a local assigned
    (transitively) from an expression that does. A loop whose offset and start do not is walked by
    every thread of a warp alike."""
    def varies(text: str, names: set[str]) -> bool:
        return bool(_THREAD.search(text)) or mentions(text, names)

    names = derived_names(function, varies)
    return any(varies(e, names) for e in expressions)


def _function_text(node: Node) -> str:
    while node.parent is not None and node.type != "function_definition":
        node = node.parent
    return _ts.text(node)


def _header(loop: Node) -> tuple[str, str, str, str, str | None] | str:
    init, cond, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    first = init.child_by_field_name("declarator") if init is not None and init.type == "declaration" else None
    if first is None or first.type != "init_declarator" or len(init.children_by_field_name("declarator")) != 1:
        return "the loop does not declare one variable"
    variable, start = _ts.declared_name(first), _ts.squash(_ts.text(first.child_by_field_name("value")))
    type_ = _ts.squash(_ts.text(init.child_by_field_name("type")))
    operator = cond.child_by_field_name("operator") if cond is not None and cond.type == "binary_expression" else None
    if operator is None or operator.type != "<" or _ts.text(cond.child_by_field_name("left")) != variable:
        return f"the condition is not `{variable} < bound`"
    end = _ts.squash(_ts.text(cond.child_by_field_name("right")))
    step = _ts.squash(_ts.text(update)) if update is not None else ""
    if step in (f"++{variable}", f"{variable}++", f"{variable} += 1"):
        return variable, type_, start, end, None
    by = re.fullmatch(rf"{re.escape(variable)} \+= (.+)", step)
    grid = by is not None and {"gridDim.x", "blockDim.x"} <= set(re.findall(r"\w+\.x", by.group(1)))
    if grid and {"threadIdx.x", "blockIdx.x", "blockDim.x"} <= set(re.findall(r"\w+\.x", start)):
        return variable, type_, start, end, by.group(1)
    return f"the loop steps by `{step}`: neither one element at a time nor a grid-stride loop"


def _accesses(kernel: Kernel, body: Node, variable: str) -> list[tuple[Node, str, str, bool]] | str:
    """(subscript, pointer, offset, is a store) of every access through a pointer parameter."""
    pointers = {p.name for p in kernel.params if p.is_pointer}
    out = []
    for node in _ts.walk(body):
        if node.type != "identifier" or _ts.text(node) not in pointers:
            continue
        access = node.parent
        if access is None or access.type != "subscript_expression" or access.child_by_field_name("argument") != node \
                or _ts.continues_subscript(access):
            return f"{_ts.text(node)} is used other than as {_ts.text(node)}[...] (line {node.start_point[0] + 1})"
        index = _ts.squash(_ts.text(access.child_by_field_name("indices")))[1:-1].strip()
        offset = _offset(index, variable)
        if offset is None:
            return f"{_ts.text(access)} (line {access.start_point[0] + 1}) is not at an offset plus {variable}"
        if _conditional(access, body):
            return f"{_ts.text(access)} (line {access.start_point[0] + 1}) is under a condition: a vector access " \
                   "would touch what the loop may not"
        store = _ts.is_store(access)
        if store and not _plain_statement(access, body):
            return f"the store to {_ts.text(access)} (line {access.start_point[0] + 1}) is not a statement of its own"
        out.append((access, _ts.text(node), offset, store))
    return out or "no access through a pointer parameter"


def _offset(index: str, variable: str) -> str | None:
    if index == variable:
        return ""
    for pattern in (rf"(.+?)\s*\+\s*{re.escape(variable)}", rf"{re.escape(variable)}\s*\+\s*(.+)"):
        m = re.fullmatch(pattern, index)
        if m and not re.search(rf"\b{re.escape(variable)}\b", m.group(1)):
            return m.group(1).strip()
    return None


def _conditional(node: Node, body: Node) -> bool:
    for ancestor in _ts.ancestors(node):
        operator = ancestor.child_by_field_name("operator") if ancestor.type == "binary_expression" else None
        if ancestor.type in _CONDITIONAL or (operator is not None and operator.type in ("&&", "||")):
            return True
        if ancestor == body:
            return False
    return False


def _plain_statement(access: Node, body: Node) -> bool:
    """An assignment that is a statement of the loop body itself."""
    assignment = next((a for a in _ts.ancestors(access) if a.type in ("assignment_expression", "update_expression")),
                      None)
    statement = assignment.parent if assignment is not None else None
    return statement is not None and statement.type == "expression_statement" and (
        statement == body or statement.parent == body)


def _declared(node: Node) -> set[str]:
    return {_ts.declared_name(d) for n in _ts.walk(node) if n.type == "declaration"
            for d in n.children_by_field_name("declarator")}
