"""The shared-staging expert: a `__constant__` table that a kernel reads at indices that change at run
time (a loop's variable over a run-time count, the thread's index), in a kernel whose warps stall on
constant-cache misses, is copied into shared memory at the kernel's start and read from there.

The constant cache is small (the immediate constant cache, a few KB an SM) and serves one address a
request: resident warps that walk a table at different indices evict each other's lines, and each
miss stalls the warp (Nsight Compute's `imc_miss` stall reason). Shared memory serves a warp's one
address as a broadcast, and distinct addresses in one pass where the banks differ, with no miss.
The constant expert moves tables the other way (global to `__constant__`) where the indices are
compile-time and uniform: there the constant bank feeds FMAs as operands and nothing misses.

    the profile's stall reasons: imc_miss the largest, at least IMC_STALL_MIN cycles an issued
        instruction ─► per kernel, the file's own `__constant__` arrays it reads at an index that is
        no compile-time constant (loops of a constant trip count that nvcc unrolls make constants)
        ─► the tables' bytes within STAGE_MAX_BYTES, the kernel's static shared memory (ptxas) plus
           them within 48 KB ─► first in the body: `__shared__ T wf_stage_<name>[...]` (the table's
           shape), a block-wide copy, `__syncthreads()`; the body's uses of the table renamed

The copy and its barrier come before anything else in the body, where every thread of the block
reaches them; device code cannot write a `__constant__` table, so the copy holds what every read
would have seen. A device function the kernel calls keeps reading the table itself. Left alone,
with the reason: no profile, another stall reason on top, no table read at a run-time index, a
table whose size or element type is unknown, too large, or a local of the same name in the kernel.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from agents import _ts, cuda_source
from agents._base import AnalysisContext, Proposal
from agents._ts import ConstEnv, Node
from agents.experts._expert import Change, Expert, kernel_node, line_edits, patched_proposal, source_models
from agents.experts.constant import SIZES, kernel_env
from agents.experts.registers import names_kernel
from agents.patch import Patched, Refused, apply, source_files
from agents.source_model import Kernel, Loop, SourceModel
from agents.workflow.steps import Finding, Level, Plan

STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"  # ncu's stall reasons
IMC = f"{STALL_PREFIX}imc_miss{STALL_SUFFIX}"
IMC_STALL_MIN = 1.0  # cycles a warp waits on constant-cache misses per instruction issued, at least
STAGE_MAX_BYTES = 16 * 1024  # of tables staged into one kernel's shared memory
STATIC_SHARED_MAX = 48 * 1024  # a block's static shared memory
UNROLLED_MAX = 16  # a loop with a constant trip count up to this, nvcc unrolls whole: its variable is a constant
PREFIX = "wf_stage_"


@dataclass(frozen=True)
class Table:
    """A file-scope `__constant__` array: its name, element type, declarator (`c_taps[kMaxTaps]`),
    number of dimensions and bytes."""

    name: str
    element: str
    declarator: str
    dimensions: int
    bytes: int | None

    @property
    def staged(self) -> str:
        return PREFIX + self.name


@dataclass(frozen=True)
class Stage:
    """What an applicable finding stages: the tables of one kernel, and where the copy goes."""

    path: str
    kernel: Kernel
    tables: tuple[Table, ...]
    indent: str  # of the body's statements


class SharedStageExpert(Expert):
    """One proposal per kernel: every table it reads at a run-time index, staged at once."""

    name = "shared_stage"
    level = Level.KERNEL
    uses_profile = True  # the profile's constant-cache stalls decide

    def needs_profile(self, context: AnalysisContext) -> bool:
        """Only where a kernel reads a ``__constant__`` table at run-time indices: the profile's stalls decide."""
        for path, model in source_models(context).items():
            tables = constant_tables(model)
            if tables and any(not isinstance(stageable(model, path, kernel, tables, context), str)
                              for kernel in model.kernels):
                return True
        return False

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        files = source_files(context.target)
        why_not, stall = stall_evidence(context.metrics)
        findings = []
        for path, model in source_models(context).items():
            tables = constant_tables(model)
            for kernel in model.kernels:
                where = f"{path}:{kernel.span.start_line} {kernel.name}"
                verdict = stageable(model, path, kernel, tables, context)
                if isinstance(verdict, str):
                    findings.append(Finding(self.name, self.level, where, False, stall, verdict))
                    continue
                stage, reads = verdict
                evidence = (*stall, *reads)
                if why_not is not None:
                    findings.append(Finding(self.name, self.level, where, False, evidence, why_not))
                    continue
                patched = _patch(files, model, stage, context.target.spec.sources)
                if isinstance(patched, Refused):
                    findings.append(Finding(self.name, self.level, where, False, evidence,
                                            f"the patch is refused: {patched.reason}"))
                    continue
                names = ", ".join(t.name for t in stage.tables)
                reason = (f"{names}: read at run-time indices ({reads[0]}) while warps stall on constant-cache "
                          f"misses; {sum(t.bytes or 0 for t in stage.tables)} B staged into shared memory")
                findings.append(Finding(self.name, self.level, where, True, evidence, reason, (stage, patched),
                                        kernel=kernel.name))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        stage, patched = finding.detail
        changes = [f"declare `__shared__ {t.element} {t.staged}` shaped as `{t.declarator}` first in "
                   f"{stage.kernel.name}, copy {t.name} into it block-wide, `__syncthreads()`, read it for {t.name}"
                   for t in stage.tables]
        return Plan(finding, tuple(changes), detail=patched)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        return [patched_proposal(self.name, plan)]


def stall_evidence(metrics: Mapping[str, float]) -> tuple[str | None, tuple[str, ...]]:
    """(None, evidence) when the warps stall on constant-cache misses most, else (why not, evidence)."""
    stalls = {metric[len(STALL_PREFIX):-len(STALL_SUFFIX)]: value for metric, value in metrics.items()
              if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX)}
    if "imc_miss" not in stalls:
        return f"no profile: whether the constant cache misses is unmeasured ({IMC})", ()
    top = max(stalls, key=lambda r: stalls[r])
    others = sorted((r for r in stalls if r != "imc_miss"), key=lambda r: -stalls[r])
    line = (f"{IMC} = {stalls['imc_miss']:.2f} cycles per issued instruction"
            + (f" (largest other: {others[0]} {stalls[others[0]]:.2f})" if others else ""))
    if top != "imc_miss" or stalls["imc_miss"] < IMC_STALL_MIN:
        return (f"the constant cache does not hold it back: imc_miss {stalls['imc_miss']:.2f} cycles per issued "
                f"instruction, the largest stall is {top} ({stalls[top]:.2f})"), (line,)
    return None, (line,)


def constant_tables(model: SourceModel) -> dict[str, Table]:
    """The file's own `__constant__` arrays (not `extern`), by name."""
    env = cuda_source.file_env(model.root, model.macros)
    out: dict[str, Table] = {}
    for node in _ts.walk(model.root, skip=frozenset({"function_definition"})) if model.root else ():
        qualifiers = {_ts.text(c) for c in node.children if c.type in ("type_qualifier", "storage_class_specifier")}
        if node.type != "declaration" or "__constant__" not in qualifiers or "extern" in qualifiers:
            continue
        element = _ts.squash(_ts.text(node.child_by_field_name("type") or node))
        for declarator in node.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator") if declarator.type == "init_declarator" else declarator
            name = _ts.name_node(inner)
            dims = [p for p in _ts.walk(inner) if p.type == "array_declarator"]
            if name is None or not dims:
                continue
            sizes = [env.eval(d.child_by_field_name("size")) if d.child_by_field_name("size") else None for d in dims]
            count = 1
            for size in sizes:
                count = count * size if size and count else 0
            size = SIZES.get(element)
            out[_ts.text(name)] = Table(_ts.text(name), element, _ts.squash(_ts.text(inner)), len(dims),
                                        count * size if size and count else None)
    return out


def stageable(model: SourceModel, path: str, kernel: Kernel, tables: Mapping[str, Table],
              context: AnalysisContext) -> tuple[Stage, tuple[str, ...]] | str:
    """The stage for `kernel` with the reads that motivate it, or why there is none."""
    if not tables:
        return "the file declares no __constant__ array"
    fn = kernel_node(model, kernel)
    body = fn.child_by_field_name("body")
    if body is None:
        return "the kernel has no body"
    locals_ = {_ts.text(n) for n in _ts.walk(body) if n.type == "identifier"
               and n.parent is not None and n.parent.type in ("init_declarator", "declaration", "array_declarator")
               and n.parent.child_by_field_name("declarator") == n}
    env = kernel_env(model, fn, kernel, model.macros)
    read = [name for name in tables if any(True for _ in _uses(body, name))]
    if not read:
        return "reads no __constant__ array"
    shadowed = sorted(set(read) & locals_)
    if shadowed:
        return f"a local of the kernel is named {shadowed[0]}, as a __constant__ array"
    variables = locals_ | {p.name for p in kernel.params}
    varying: dict[str, str] = {}
    for name in read:
        for use in _uses(body, name):
            why = _varying(use, body, kernel, env, variables)
            if why is not None:
                varying.setdefault(name, why)
    if not varying:
        return (f"{', '.join(read)} read at compile-time indices only: the constant bank serves them as operands, "
                "with no miss")
    staged = [tables[name] for name in varying]
    unknown = next((t for t in staged if t.bytes is None), None)
    if unknown is not None:
        return f"{unknown.name}: its size or element type `{unknown.element}` is not known at compile time"
    total = sum(t.bytes or 0 for t in staged)
    shared = max((k.shared_bytes for k in context.kernels if names_kernel(k.kernel, kernel.name)), default=0)
    if total > STAGE_MAX_BYTES or shared + total > STATIC_SHARED_MAX:
        return (f"{', '.join(t.name for t in staged)}: {total} B, with the kernel's {shared} B of shared memory, "
                f"over the {STAGE_MAX_BYTES} B staged or {STATIC_SHARED_MAX} B static shared memory")
    lines = model.clean.split(b"\n")
    first = next((c for c in body.named_children), None)
    row = first.start_point[0] if first is not None and first.start_point[0] > body.start_point[0] else None
    line = lines[row if row is not None else fn.start_point[0]].decode("utf-8", "replace")
    indent = line[: len(line) - len(line.lstrip())] + ("" if row is not None else "  ")
    return Stage(path, kernel, tuple(staged), indent), tuple(varying.values())


def _uses(body: Node, name: str) -> Iterator[Node]:
    return (n for n in _ts.walk(body) if n.type == "identifier" and _ts.text(n) == name)


def _outer(use: Node) -> Node:
    """`c[i][j]` for the `c` in it: the subscripts the use is the array of."""
    node = use
    while node.parent is not None and node.parent.type == "subscript_expression" \
            and node.parent.child_by_field_name("argument") == node:
        node = node.parent
    return node


def _varying(use: Node, body: Node, kernel: Kernel, env: ConstEnv, variables: set[str]) -> str | None:
    """Why the read `use` is at a run-time index, or None when every index is a compile-time
    constant once nvcc unrolls the loops around it: constants (a header's macros included: any name
    that is no variable of the kernel), the variables of those loops, and `const` locals computed
    from them. A use not subscripted (the array handed on, offset) counts as run-time: its indices
    are not seen here."""
    outer = _outer(use)
    where = f"`{_ts.squash(_ts.text(outer))}` (line {use.start_point[0] + 1})"
    if outer == use:
        return f"{where} is used whole, in `{_ts.squash(_ts.text(use.parent or use))[:80]}`: its indices are not seen"
    known = _unrolled_variables(use, body, kernel, variables)
    known |= _derived_constants(body, env, known)
    node = use
    while node != outer:
        subscript = node.parent
        for name in _names(subscript.child_by_field_name("indices")):
            if name in variables | _THREAD_NAMES and name not in known and env.value(name) is None:
                return f"{where}: `{name}` varies at run time"
        node = subscript
    return None


def _names(node: Node | None) -> Iterator[str]:
    """The variables `node` reads (a member's field name is no variable)."""
    for n in _ts.walk(node) if node is not None else ():
        if n.type == "identifier" and not (n.parent is not None and n.parent.type == "field_expression"
                                           and n.parent.child_by_field_name("field") == n):
            yield _ts.text(n)


def _derived_constants(body: Node, env: ConstEnv, known: set[str]) -> set[str]:
    """`const` locals of the body whose initializers read only constants and `known` names (and
    each other): `const int ky = r - t;` in loops over r and t that are unrolled."""
    inits: dict[str, Node] = {}
    for decl in _ts.walk(body):
        if decl.type != "declaration" or not any(_ts.text(c) in ("const", "constexpr") for c in decl.children
                                                 if c.type == "type_qualifier"):
            continue
        for declarator in decl.children_by_field_name("declarator"):
            value = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
            inner = declarator.child_by_field_name("declarator") if value is not None else None
            if inner is not None and inner.type == "identifier":
                inits[_ts.text(inner)] = value
    found: set[str] = set()
    while more := {name for name, value in inits.items() if name not in found
                   and all(n in known or n in found or env.value(n) is not None for n in _names(value))}:
        found |= more
    return found


def _unrolled_variables(use: Node, body: Node, kernel: Kernel, variables: set[str]) -> set[str]:
    """The variables of the loops around `use` that nvcc unrolls whole: a constant trip count with a
    bare `#pragma unroll` (or a factor as large), or up to UNROLLED_MAX with no pragma saying less;
    and a bare `#pragma unroll` loop whose bounds read no variable (macros this file does not define
    included: a header's)."""
    loops = [a for a in _ts.ancestors(use) if a.type == "for_statement" and a.start_byte >= body.start_byte]
    lines = {a.start_point[0] + 1: a for a in loops}
    out = set()
    for loop in kernel.loops:
        node = lines.get(loop.span.start_line)
        if node is None or not loop.variable:
            continue
        header = [n for part in ("initializer", "condition", "update") for n in _names(node.child_by_field_name(part))]
        fixed = not ({n for n in header if n != loop.variable} & (variables | _THREAD_NAMES))
        if _unrolled(loop) or (fixed and loop.unroll is not None and loop.unroll.argument is None):
            out.add(loop.variable)
    return out


_THREAD_NAMES = {"threadIdx", "blockIdx", "blockDim", "gridDim"}


def _unrolled(loop: Loop) -> bool:
    if loop.trip_count is None:
        return False
    if loop.unroll is None:
        return loop.trip_count <= UNROLLED_MAX
    if loop.unroll.argument is None:
        return True
    return loop.unroll.value is not None and loop.unroll.value >= loop.trip_count


def _copy(table: Table, indent: str) -> str:
    threads = "blockDim.x * blockDim.y * blockDim.z"
    first = "(threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x"
    if table.dimensions == 1:
        store = f"{table.staged}[wf_i] = {table.name}[wf_i];"
    else:
        store = (f"reinterpret_cast<{table.element}*>({table.staged})[wf_i] = "
                 f"reinterpret_cast<const {table.element}*>({table.name})[wf_i];")
    declarator = re.sub(rf"\b{re.escape(table.name)}\b", table.staged, table.declarator, count=1)
    return (f"\n{indent}__shared__ {table.element} {declarator};"
            f"\n{indent}for (int wf_i = {first}; wf_i < int(sizeof({table.name}) / sizeof({table.element})); "
            f"wf_i += {threads})\n{indent}  {store}")


def _patch(files: Mapping[str, str], model: SourceModel, stage: Stage, editable: Collection[str]) -> Patched | Refused:
    fn = kernel_node(model, stage.kernel)
    body = fn.child_by_field_name("body") or fn
    names = ", ".join(t.name for t in stage.tables)
    # Right after the body's `{`, each line indented as the body's statements: first, whatever
    # shares the brace's line.
    text = (f"\n{stage.indent}// warpfleet shared_stage: {names} read at run-time indices, from shared memory"
            + "".join(_copy(t, stage.indent) for t in stage.tables) + f"\n{stage.indent}__syncthreads();")
    at = body.start_byte + 1
    changes = [Change(at, at, text), *(Change(n.start_byte, n.end_byte, t.staged) for t in stage.tables
                                       for n in _uses(body, t.name))]
    source = files[stage.path].encode("utf-8", "surrogateescape")
    return apply(files, line_edits(stage.path, source, changes), editable)
