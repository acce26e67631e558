"""The constant-memory expert: a pointer parameter that a kernel only reads, at indices that are the
same for every thread of a warp and bounded by compile-time constants (a coefficient, filter or
lookup table), moves to a `__constant__` table. The constant cache serves a warp's one address in
one broadcast, ptxas feeds FMAs straight from the constant bank, and a kernel that cached the table
in a register array no longer spends those registers (a register-limited kernel's occupancy rises).

    kernel effects (never written, read) ─► every use of P is a read P[index] ─► no index depends on
        the thread (vectorize's rule) ─► every index over the counted loops around it: extent N,
        within the 64 KB constant bank together with the file's own __constant__ data
        ─► every launch (agents.launch_sites): P's argument, its one stream, a statement of its own
        ─► `__constant__ T wf_const_<kernel>_<P>[N];` before the kernel, P[ read as the table[,
           and `cudaMemcpyToSymbolAsync(table, ARG, N * sizeof(T), 0, cudaMemcpyDeviceToDevice,
           STREAM);` before each launch: the signature and the launches stay as they are

The copy runs on the launch's stream just before it, so it takes what the kernel would have read.
The assumption stated: the buffer holds the N elements that the kernel's loops index (when some
thread runs them). An index under a condition on a loop's variable, a loop that may end early, an
extent that follows a swept param, launches on several streams (one table for all), from another
file, through cudaLaunchKernel or not a statement of their own are left alone, with the reason.
Evidence: the kernel's ptxas registers; the global load metrics restrict reads, when profiled.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from agents import _ts, cuda_source
from agents._base import AnalysisContext, Proposal
from agents._ts import ConstEnv, Node
from agents.experts._expert import (
    Change,
    Expert,
    derived_names,
    kernel_node,
    line_edits,
    mentions,
    patched_proposal,
    source_models,
)
from agents.experts.registers import names_kernel
from agents.experts.restrict import profile_evidence
from agents.hostflow import assigned, may_exit
from agents.launch_sites import LaunchSite, call_at, launch_sites, written_alias
from agents.patch import Edit, InsertBefore, Patched, Refused, apply, source_files
from agents.regions import pretty
from agents.source_model import DEFAULT_STREAMS, HostOpKind, Kernel, Param, SourceModel, read_params, written_params
from agents.workflow.steps import Finding, Level, Plan

BANK_BYTES = 64 * 1024  # the __constant__ data of one module
SYMBOL = "wf_const_{}_{}"
MAX_INDEX_VALUES = 1 << 16  # a loop nest indexing more elements than this would not fit the bank anyway
SIZES = {"float": 4, "double": 8, "int": 4, "unsigned": 4, "unsigned int": 4, "short": 2, "unsigned short": 2,
         "char": 1, "signed char": 1, "unsigned char": 1, "bool": 1, "long": 8, "unsigned long": 8, "long long": 8,
         "unsigned long long": 8, "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4,
         "uint32_t": 4, "int64_t": 8, "uint64_t": 8, "half": 2, "__half": 2, "__nv_bfloat16": 2, "float2": 8,
         "float3": 12, "float4": 16, "double2": 16, "int2": 8, "int4": 16, "uint2": 8, "uint4": 16}
_THREAD = re.compile(r"\bthreadIdx\b")
_CONDITIONS = {"if_statement", "conditional_expression", "switch_statement", "while_statement", "do_statement"}


@dataclass(frozen=True)
class Table:
    """A parameter read as a table: its element type, and how many elements the kernel indexes."""

    param: str
    element: str
    extent: int
    symbol: str
    size: int  # of an element, in bytes

    @property
    def bytes(self) -> int:
        return self.extent * self.size


@dataclass(frozen=True)
class Copy:
    """A launch to copy the tables before: its line, the line's indentation, each table's argument
    (in the tables' order) and the launch's stream."""

    line: int
    indent: str
    args: tuple[str, ...]
    stream: str
    function_line: int  # where the function around the launch begins: the tables are declared above it


@dataclass(frozen=True)
class Move:
    """What an applicable finding moves: the tables of one kernel, the launches to copy them before,
    and the line the declarations go before."""

    path: str
    kernel: Kernel
    tables: tuple[Table, ...]
    copies: tuple[Copy, ...]
    declare_at: int


class ConstantExpert(Expert):
    """One proposal per kernel: all its warp-uniform, read-only tables at once."""

    name = "constant"
    level = Level.KERNEL

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        files = source_files(context.target)
        params = set(context.target.spec.params)
        findings = []
        for path, model in source_models(context).items():
            sites = launch_sites(model)
            for kernel in model.kernels:
                where = f"{path}:{kernel.span.start_line} {kernel.name}"
                evidence = (*_ptxas_evidence(context, kernel), *profile_evidence(context.metrics))
                verdict = movable(model, path, kernel, sites, files, params)
                if isinstance(verdict, str):
                    findings.append(Finding(self.name, self.level, where, False, evidence, verdict))
                    continue
                move, notes = verdict
                patched = _patch(files, model, move, context.target.spec.sources)
                if isinstance(patched, Refused):
                    findings.append(Finding(self.name, self.level, where, False, evidence,
                                            f"the patch is refused: {patched.reason}"))
                else:
                    findings.append(Finding(self.name, self.level, where, True, evidence, _why(move, notes),
                                            (move, patched), kernel=kernel.name))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        move, patched = finding.detail
        changes = [f"declare `__constant__ {t.element} {t.symbol}[{t.extent}];` before line {move.declare_at} and "
                   f"read {t.param}[...] of {move.kernel.name} from it" for t in move.tables]
        changes += [f"copy {', '.join(f'`{pretty(a)}`' for a in c.args)} to the table(s) before the launch at line "
                    f"{c.line}, on stream `{c.stream}`" for c in move.copies]
        return Plan(finding, tuple(changes), detail=patched)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        return [patched_proposal(self.name, plan)]


def _ptxas_evidence(context: AnalysisContext, kernel: Kernel) -> tuple[str, ...]:
    reports = [k for k in context.kernels if names_kernel(k.kernel, kernel.name)]
    if not reports:
        return ("no ptxas report of it",)
    return (f"ptxas: {max(r.registers for r in reports)} registers, "
            f"{max(r.spill_stores for r in reports)} B spill stores",)


def _why(move: Move, notes: list[str]) -> str:
    tables = ", ".join(f"{t.param} ({t.extent} x {t.element}, {t.bytes} B)" for t in move.tables)
    launches = f"each of its {len(move.copies)} launches" if len(move.copies) > 1 else "its launch"
    return (f"{tables} of {move.kernel.name}: never written, read at indices the same for every thread of a warp: "
            f"to __constant__, copied before {launches}" + (f" ({'; '.join(notes)})" if notes else ""))


# -- the analysis -------------------------------------------------------------------------------

def movable(model: SourceModel, path: str, kernel: Kernel, sites: list[LaunchSite], files: Mapping[str, str],
            params: set[str]) -> tuple[Move, list[str]] | str:
    """What moves to __constant__ (with notes on the pointers left out), or why nothing does."""
    pointers = [p for p in kernel.params if p.is_pointer]
    if not pointers:
        return "no pointer parameter"
    fn = kernel_node(model, kernel)
    written, read = written_params(kernel), read_params(kernel)
    tables: list[Table] = []
    notes: list[str] = []
    for param in pointers:
        found = "written by the kernel" if param.name in written else "never read" if param.name not in read \
            else table(model, kernel, fn, param, params)
        (notes.append(f"{param.name}: {found}") if isinstance(found, str) else tables.append(found))
    if not tables:
        return "; ".join(notes)
    notes = []  # an applicable finding names only the tables it leaves out for the launches' sake
    if any(a.type == "namespace_definition" for a in _ts.ancestors(fn)):
        return "defined in a namespace: the host could not name its table as written"
    copies = _copies(model, path, kernel, tables, files)
    if isinstance(copies, str):
        return copies
    order = [t.param for t in tables]  # the copies' arguments, before some tables are left out
    mine = [s for s in sites if s.launch.kernel == kernel.name]
    if not mine:
        return "launched from no entry function of this file: whether its arguments alias is unknown"
    streams = {s.launch.stream if s.launch.stream not in DEFAULT_STREAMS else None for s in mine}
    if len(streams) > 1 or any("[" in (s or "") for s in streams):
        shown = ", ".join(sorted(f"`{pretty(s)}`" if s else "the default stream" for s in streams))
        return f"launched on {shown}: one table for all, overwritten while another launch may read it"
    for t in list(tables):
        if (why := _aliased(kernel, t.param, mine)) is not None:
            tables.remove(t)
            notes.append(f"{t.param}: {why}")
    used = _constant_bytes(model)
    fits = []
    for t in tables:
        total = (used or 0) + sum(f.bytes for f in fits) + t.bytes
        if total > BANK_BYTES:
            notes.append(f"{t.param}: {t.bytes} B with the file's {total - t.bytes} B of __constant__ data exceed "
                         f"the {BANK_BYTES // 1024} KB constant bank")
        else:
            fits.append(t)
    if used is None:
        notes.append("the file's own __constant__ data has a size the analysis cannot tell")
    if not fits:
        return "; ".join(notes)
    copies = [Copy(c.line, c.indent, tuple(c.args[order.index(t.param)] for t in fits), c.stream, c.function_line)
              for c in copies]
    declare_at = min(kernel.span.start_line, *(c.function_line for c in copies))
    return Move(path, kernel, tuple(fits), tuple(copies), declare_at), notes


def table(model: SourceModel, kernel: Kernel, fn: Node, param: Param, params: Collection[str]) -> Table | str:
    """`param` as a table the kernel indexes, or why it is not one."""
    name = param.name
    body = fn.child_by_field_name("body") or fn
    accesses = []
    for node in _uses(body, name):
        line, parent = node.start_point[0] + 1, node.parent
        if parent is not None and parent.type.endswith("declarator"):
            return f"a local of {kernel.name} is named {name} too (line {line})"
        if parent is not None and parent.type == "subscript_expression" \
                and parent.child_by_field_name("argument") == node and not _ts.continues_subscript(parent):
            up = parent.parent
            if up is not None and up.type == "pointer_expression" and _ts.text(up).startswith("&"):
                return f"its address is taken: `{_ts.squash(_ts.text(up))}` (line {line})"
            accesses.append(parent)
        elif parent is not None and parent.type == "argument_list" and parent.parent is not None:
            return f"handed to {_ts.callee_name(parent.parent)} (line {line}), which would read the table"
        else:
            shown = _ts.squash(_ts.text(parent)) if parent is not None else name
            return f"used as `{shown}` (line {line}), not only read as {name}[...]"
    function = _ts.text(fn)
    varies_names = derived_names(function, _varies)
    for access in accesses:
        if _varies(_ts.text(_index(access)), varies_names):
            return (f"`{_ts.squash(_ts.text(access))}` (line {access.start_point[0] + 1}) depends on the thread: a "
                    "warp reads different elements, which the constant cache serves one at a time")
    instances = [k for k in model.instances if k.name == kernel.name and k.template_values] or [kernel]
    highest = -1
    for instance in instances:
        macros = _Recorded(model.macros)
        env = kernel_env(model, fn, instance, macros)
        for access in accesses:
            span = index_range(access, body, env)
            if isinstance(span, str):
                return span
            if span[0] < 0:
                return f"`{_ts.squash(_ts.text(access))}` (line {access.start_point[0] + 1}) may index below 0"
            highest = max(highest, span[1])
        if followed := sorted(macros.used & set(params)):
            return (f"its extent follows the param{'s' if len(followed) > 1 else ''} {', '.join(followed)}: a table "
                    "sized at the baseline would not hold another value's")
    element = _element(model, kernel, param)
    if isinstance(element, str):
        return element
    return Table(name, element[0], highest + 1, SYMBOL.format(kernel.name, name), element[1])


def _uses(body: Node, name: str) -> Iterator[Node]:
    return (n for n in _ts.walk(body) if n.type == "identifier" and _ts.text(n) == name)


def _index(access: Node) -> Node | None:
    indices = access.child_by_field_name("indices")
    named = [c for c in indices.named_children if c.type != "comment"] if indices is not None else []
    return named[0] if len(named) == 1 else indices


def _varies(text: str, names: set[str]) -> bool:
    return bool(_THREAD.search(text)) or mentions(text, names)


def _element(model: SourceModel, kernel: Kernel, param: Param) -> tuple[str, int] | str:
    """The pointee type without qualifiers (`const float* __restrict__` -> `float`) and its size
    (through the file's macros and typedefs), or why it has no table type."""
    declared = re.sub(r"\[[^\]]*\]", "*", param.type)
    if declared.count("*") != 1:
        return f"points to pointers (`{param.type}`)"
    words = [w for w in declared.replace("*", " ").split()
             if w not in ("const", "volatile", "__restrict__", "__restrict", "restrict")]
    element = resolved = " ".join(words)
    if element in {t.name for t in kernel.template_params}:
        return f"its element type {element} is a template parameter: one table at file scope holds one type"
    aliases = {**model.macros, **_typedefs(model)}
    for _ in range(8):
        if resolved in SIZES or resolved not in aliases:
            break
        resolved = _ts.squash(aliases[resolved])
    if resolved not in SIZES:
        return f"its element type {element} has a size the analysis does not know"
    return element, SIZES[resolved]


def _typedefs(model: SourceModel) -> dict[str, str]:
    """`typedef float real;` -> {"real": "float"}: the file's typedefs of one name."""
    out = {}
    for node in _ts.walk(model.root, skip=frozenset({"function_definition"})) if model.root else ():
        declarator = node.child_by_field_name("declarator") if node.type == "type_definition" else None
        kind = node.child_by_field_name("type")
        if declarator is not None and declarator.type == "type_identifier" and kind is not None:
            out[_ts.text(declarator)] = _ts.text(kind)
    return out


def index_range(access: Node, body: Node, env: ConstEnv) -> tuple[int, int] | str:
    """The lowest and highest index `access` reads over the counted loops around it, or why there
    are none: "extent not a compile-time constant: ..."."""
    shown = f"`{_ts.squash(_ts.text(access))}` (line {access.start_point[0] + 1})"
    index = _index(access)
    names = _names(index, env)
    loops: list[Node] = []
    guards: list[Node] = []
    for ancestor in _ts.ancestors(access):
        if ancestor == body:
            break
        if ancestor.type == "for_statement" and _loop_variable(ancestor) in names:
            loops.insert(0, ancestor)
            names |= set().union(*(_names(ancestor.child_by_field_name(f), env)
                                   for f in ("initializer", "condition", "update")))
            continue
        if ancestor.type in _CONDITIONS or ancestor.type == "for_statement" or (
                ancestor.type == "binary_expression" and _operator(ancestor) in ("&&", "||")):
            guards.append(ancestor)
    variables = [_loop_variable(loop) for loop in loops]
    for loop, variable in zip(loops, variables, strict=True):
        line = loop.start_point[0] + 1
        if variable in assigned(loop.child_by_field_name("body") or loop):
            return f"extent not a compile-time constant: the loop at line {line} changes {variable} in its body"
        if may_exit(loop.child_by_field_name("body")):
            return f"the loop at line {line} may end early (break, continue, return): which indices it reads is unknown"
    for guard in guards:
        test = _ts.text(guard.child_by_field_name("condition") or guard)
        if mentions(test, set(variables)):
            return f"{shown} is read under a condition on its loop's variable (line {guard.start_point[0] + 1})"
    values = _values(index, loops, env, [MAX_INDEX_VALUES])
    if values is None:
        return f"extent not a compile-time constant: {shown}"
    return values


def _values(index: Node | None, loops: list[Node], env: ConstEnv, budget: list[int]) -> tuple[int, int] | None:
    """The lowest and highest value of `index` over every iteration of `loops` (outermost first)."""
    if not loops:
        budget[0] -= 1
        value = env.eval(index) if budget[0] >= 0 else None
        return None if value is None else (value, value)
    counted = _ts.counted_loop(loops[0], env, MAX_INDEX_VALUES)
    if counted.values is None or counted.variable is None:
        return None
    spans = []
    for value in counted.values:
        inner = env.child()
        inner.bind(counted.variable, value)
        if (found := _values(index, loops[1:], inner, budget)) is None:
            return None
        spans.append(found)
    return (min(low for low, _ in spans), max(high for _, high in spans)) if spans else None


def _loop_variable(loop: Node) -> str:
    """The variable a `for` loop's initializer sets (read without evaluating anything: the
    evaluations record what the extent follows)."""
    init = loop.child_by_field_name("initializer")
    if init is not None and init.type == "declaration":
        return _ts.declared_name(init.child_by_field_name("declarator"))
    if init is not None and init.type == "assignment_expression":
        return _ts.text(init.child_by_field_name("left") or init)
    return ""


def _operator(node: Node) -> str:
    operator = node.child_by_field_name("operator")
    return operator.type if operator is not None else ""


def _names(node: Node | None, env: ConstEnv) -> set[str]:
    """The identifiers of `node`, and those of the constants' initializers they name (transitively)."""
    names: set[str] = set()
    todo = [node] if node is not None else []
    while todo:
        for n in _ts.walk(todo.pop()):
            if n.type == "identifier" and (name := _ts.text(n)) not in names:
                names.add(name)
                if name in env.declared:
                    todo.append(env.declared[name])
    return names


class _Recorded(dict[str, str]):
    """The file's macros, recording those an evaluation reads: what an extent follows."""

    def __init__(self, macros: Mapping[str, str]) -> None:
        super().__init__(macros)
        self.used: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.used.add(name)
        return super().__getitem__(name)


def file_env(model: SourceModel, macros: Mapping[str, str]) -> ConstEnv:
    """The constants of the file's scope, its macros read through `macros`."""
    return cuda_source.file_env(model.root, macros)


def kernel_env(model: SourceModel, fn: Node, kernel: Kernel, macros: Mapping[str, str]) -> ConstEnv:
    """The constants a kernel's body sees: the file's (through `macros`), the body's own, its
    template arguments; its parameters and other locals are no constants."""
    hidden = {p.name for p in kernel.params} | {t.name for t in kernel.template_params}
    env = cuda_source.scope_env(file_env(model, macros), fn.child_by_field_name("body") or fn, hidden)
    for name, value in kernel.template_values:
        if isinstance(value, int):
            env.bind(name, value)
        else:
            env.types[name] = value
    return env


def _constant_bytes(model: SourceModel) -> int | None:
    """The bytes of the file's own `__constant__` arrays and scalars; None when one's size is unknown."""
    env = file_env(model, model.macros)
    total = 0
    for node in _ts.walk(model.root, skip=frozenset({"function_definition"})) if model.root else ():
        qualifiers = {_ts.text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if node.type != "declaration" or "__constant__" not in qualifiers or "extern" in qualifiers:
            continue
        size = SIZES.get(_ts.squash(_ts.text(node.child_by_field_name("type") or node)))
        for declarator in node.children_by_field_name("declarator"):
            count = 1
            for part in _ts.walk(declarator):
                if part.type == "array_declarator":
                    count *= env.eval(part.child_by_field_name("size")) or 0
            if size is None or count <= 0:
                return None
            total += size * count
    return total


# -- the launches -------------------------------------------------------------------------------

def _copies(model: SourceModel, path: str, kernel: Kernel, tables: list[Table],
            files: Mapping[str, str]) -> list[Copy] | str:
    """A copy before every launch of the kernel (each table's argument, in `tables`' order), or why
    not every launch can have one."""
    elsewhere = [other for other, text in files.items()
                 if other != path and re.search(rf"\b{re.escape(kernel.name)}\b", text)]
    if elsewhere:
        return f"named in {elsewhere[0]} too: a launch there could not copy a table declared here"
    ops = [op for op in model.host_ops
           if op.kind is HostOpKind.LAUNCH and op.launch is not None and op.launch.kernel == kernel.name]
    if not ops:
        return "launched nowhere in this file: no launch to copy the table before"
    taken = next((t.symbol for t in tables if re.search(rf"\b{t.symbol}\b", files[path])), None)
    if taken is not None:
        return f"the file names {taken} already"
    source = files[path].encode("utf-8", "surrogateescape")
    copies = []
    for op in ops:
        call = call_at(model, op.at)
        if call is None or op.launch is None or not any(c.type == "kernel_call_syntax" for c in call.children):
            return f"launched through {op.api} (line {op.line}): its arguments are not the kernel's parameters"
        statement = call.parent
        if statement is None or statement.type != "expression_statement" or statement.parent is None \
                or statement.parent.type != "compound_statement":
            return f"the launch at line {op.line} is not a statement of its own in a block"
        before = source[source.rfind(b"\n", 0, statement.start_byte) + 1:statement.start_byte]
        if before.strip():
            return f"the launch at line {op.line} shares its line with other code"
        bound = op.launch.bound_args(kernel)
        args = []
        for t in tables:
            arg = bound.get(t.param)
            if arg is None:
                return f"the launch at line {op.line} passes no argument for {t.param}"
            if re.search(r"\+\+|--|(?<![=!<>+\-*/%&|^])=(?!=)", arg):
                return f"{t.param}'s argument `{arg}` (line {op.line}) has a side effect that a copy would repeat"
            args.append(arg)
        function = [a for a in _ts.ancestors(call) if a.type == "function_definition"]
        outer = function[-1] if function else call
        if outer.parent is not None and outer.parent.type == "template_declaration":
            outer = outer.parent
        copies.append(Copy(statement.start_point[0] + 1, before.decode("utf-8", "surrogateescape"), tuple(args),
                           op.launch.stream or "0", outer.start_point[0] + 1))
    return copies


def _aliased(kernel: Kernel, name: str, sites: list[LaunchSite]) -> str | None:
    """A launch whose argument for `name` may share memory with one the kernel writes: a table copied
    before the launch would miss those writes."""
    found = written_alias(kernel, name, sites)
    return f"{found[0]}, which the kernel writes (line {found[1]})" if found else None


def _patch(files: Mapping[str, str], model: SourceModel, move: Move, editable: Collection[str]) -> Patched | Refused:
    path = move.path
    fn = kernel_node(model, move.kernel)
    body = fn.child_by_field_name("body") or fn
    changes = [Change(n.start_byte, n.end_byte, t.symbol) for t in move.tables for n in _uses(body, t.param)]
    declarations = "".join(f"__constant__ {t.element} {t.symbol}[{t.extent}];\n" for t in move.tables)
    edits: list[Edit] = [InsertBefore(path, move.declare_at, declarations)]
    for c in move.copies:
        edits.append(InsertBefore(path, c.line, "".join(
            f"{c.indent}cudaMemcpyToSymbolAsync({t.symbol}, {arg}, {t.extent} * sizeof({t.element}), 0, "
            f"cudaMemcpyDeviceToDevice, {c.stream});\n" for t, arg in zip(move.tables, c.args, strict=True))))
    source = files[path].encode("utf-8", "surrogateescape")
    return apply(files, [*edits, *line_edits(path, source, changes)], editable)
