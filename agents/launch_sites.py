"""Every kernel launch of a file as it runs: reached from the file's entry functions (those no
other function of the file calls) through agents.hostflow, so that a helper's launch has its
caller's arguments, and with the kernel instance it launches. What the kernel-level experts read
to know a kernel's block sizes and which of its arguments may share memory.

A block given as a local variable that holds one value (`dim3 block(BX, BY);`, declared before the
launch and never changed in its scope) is read as that value, `dim3(BX, BY)`; one that is changed
(`block.x = n`) stays its name, with where it changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from agents import _ts
from agents._ts import Node, split_top
from agents.hostflow import ANY_PREFIX, substitute, unfold
from agents.regions import SINGLE, overlap, pretty, region
from agents.source_model import HostOpKind, Kernel, Launch, SourceModel, written_params

MAX_LOCAL_DEPTH = 4  # a local initialised from locals (`dim3 block(tx, ty)`) is followed this deep


@dataclass(frozen=True)
class LaunchSite:
    launch: Launch  # arguments, grid and block with the names bound where it runs (a block variable too)
    function: str  # the entry function it was reached from
    unknown: frozenset[str]  # that function's parameters: buffers the file does not say the origin of
    conditional: bool
    block_variable: str | None = None  # the local the block is given as: `launch.block` is its value, or its
    changed: str | None = None  # name when it holds none, for this reason: "`block.x` is written on line 30"

    def regions(self, kernel: Kernel) -> dict[str, str]:
        """Each pointer parameter of `kernel` -> the region its argument designates."""
        bound = self.launch.bound_args(kernel)
        extents = [bound[p.name] for p in kernel.params if not p.is_pointer and p.name in bound]
        return {p.name: r for p in kernel.params if p.is_pointer and (r := region(
            bound.get(p.name), [SINGLE] if p.name in kernel.single_element else extents))}

    def threads(self, model: SourceModel) -> int | None:
        """Threads per block, when the launch's block is a constant (`256`, `dim3(16, 16)`, a local
        `dim3 block(BX, BY)` of macros)."""
        env = _ts.ConstEnv({**model.macros, **{k: str(v) for k, v in model.constants.items()}})
        text = self.launch.block.strip()
        inner = re.fullmatch(r"dim3\s*\((.*)\)", text)
        product = 1
        for part in split_top(inner.group(1)) if inner else [text]:
            value = env.eval_text(part) if part else None
            if value is None or value <= 0:
                return None
            product *= value
        return product

    def may_alias(self, a: str, b: str) -> bool:
        """Whether two regions of this launch may share memory: they overlap, or both come from
        the entry function's parameters (its caller may hand it one buffer twice)."""
        base_a, base_b = a.split("[", 1)[0], b.split("[", 1)[0]
        return overlap(a, b) or (base_a in self.unknown and base_b in self.unknown)


def entry_functions(model: SourceModel) -> list[str]:
    """Functions doing CUDA work that no other function of the file calls (all of them, when
    they call each other in a circle)."""
    working = list(dict.fromkeys(op.function for op in model.host_ops
                                 if op.function and op.kind in (HostOpKind.LAUNCH, HostOpKind.CALL)))
    called = {op.api for op in model.host_ops if op.kind is HostOpKind.CALL and op.function != op.api}
    return [f for f in working if f not in called] or working


def launch_sites(model: SourceModel) -> list[LaunchSite]:
    sites = []
    blocks: dict[tuple[int, str], tuple[str, str | None, str | None]] = {}  # a launch unfolded often: read once
    for function in entry_functions(model):
        unknown = frozenset(_parameters(model, function))
        for step in unfold(model, function):
            if (launch := step.op.launch) is not None:
                key = (step.op.at, launch.block)
                if key not in blocks:
                    blocks[key] = _block(model, launch, step.op.at)
                block, variable, changed = blocks[key]
                sites.append(LaunchSite(replace(launch, block=block), function, unknown, step.conditional, variable,
                                        changed))
    return sites


def _parameters(model: SourceModel, function: str) -> list[str]:
    fn = next((n for n in _ts.walk(model.root) if n.type == "function_definition"
               and _ts.declared_name(n.child_by_field_name("declarator")) == function), None)
    return _parameter_names(fn) if fn is not None else []


def _parameter_names(fn: Node) -> list[str]:
    return [_ts.declared_name(p.child_by_field_name("declarator")) for p in _ts.parameters(fn)]


def instance_of(model: SourceModel, launch: Launch) -> Kernel | None:
    """The instance of the launched kernel that the launch's template arguments select."""
    instances = [k for k in model.instances if k.name == launch.kernel]
    for kernel in instances:
        bound = dict(kernel.template_values)
        given = zip(kernel.template_params, launch.template_values, strict=False)
        if all(value is None or bound.get(param.name) == value for param, value in given):
            return kernel
    return instances[0] if instances else None


# -- a block given as a local variable ----------------------------------------------------------
@dataclass(frozen=True)
class _Changed:
    why: str  # "`block.x` is written on line 30"


def _block(model: SourceModel, launch: Launch, at: int) -> tuple[str, str | None, str | None]:
    """The block of `launch` (its call at byte `at`) as the analysis reads it, the local variable
    it is given as, and why that variable holds no one value."""
    bound = launch.block
    call = call_at(model, at)
    given = _block_argument(call) if call is not None else None
    if call is None or given is None or given.type != "identifier":
        return bound, None, None
    name = _ts.text(given)
    if bound != name and not bound.startswith(ANY_PREFIX):
        return bound, None, None  # the host flow followed it: an integer local, a helper's parameter
    value = _local_value(model, call, name, 0)
    if value is None:
        return name, None, None  # no local with a value: a parameter, a global, `dim3 b;`
    return (value, name, None) if isinstance(value, str) else (name, name, value.why)


def call_at(model: SourceModel, at: int) -> Node | None:
    """The call expression starting at byte `at` (a host operation's `at`), if any."""
    if model.root is None or at < 0:
        return None
    leaf = model.root.descendant_for_byte_range(at, at)
    return next((n for n in (leaf, *_ts.ancestors(leaf)) if n is not None and n.type == "call_expression"
                 and n.start_byte == at), None) if leaf is not None else None


def _block_argument(call: Node) -> Node | None:
    """`k<<<grid, block>>>(...)`'s or `cudaLaunchKernel(k, grid, block, ...)`'s block."""
    chevrons = next((c for c in call.children if c.type == "kernel_call_syntax"), None)
    config = [c for c in chevrons.named_children if c.type != "comment"] if chevrons is not None \
        else _ts.arguments(call)[1:]
    return _ts.unwrap(config[1]) if len(config) > 1 else None


def _local_value(model: SourceModel, at: Node, name: str, depth: int) -> str | _Changed | None:
    """The one value the local variable `name` seen at `at` holds, as an expression of what is
    not a local (`dim3(BX, BY)`); where it is changed; None when it is no local of the function
    (a parameter, a global) or its declaration gives it no value."""
    found = _declaration(at, name)
    if found is None:
        return None
    declarator, scope = found
    if (change := _change(model, scope, declarator, name)) is not None:
        return change
    value = _initializer(declarator)
    if value is None or depth >= MAX_LOCAL_DEPTH:
        return value
    names: dict[str, str] = {}
    for used in dict.fromkeys(_ts.text(n) for n in _ts.walk(declarator) if n.type in ("identifier", "type_identifier")
                              and n.parent is not None and n.parent.type != "qualified_identifier"):
        if used == name or used in model.macros or used in model.constants:
            continue
        inner = _local_value(model, declarator, used, depth + 1)
        if isinstance(inner, _Changed):
            return inner
        if inner is not None:
            names[used] = inner
    return substitute(value, names)


def _declaration(at: Node, name: str) -> tuple[Node, Node] | None:
    """The declarator of the local `name` that `at` sees, and the block it lives in: the nearest
    enclosing block declaring it before `at`; None when the function's own (or a lambda's)
    parameter, or nothing inside the function, declares it."""
    child = at
    for scope in _ts.ancestors(at):
        if scope.type == "function_definition" or (scope.type == "lambda_expression"
                                                    and name in _parameter_names(scope)):
            return None
        if scope.type == "for_range_loop" and _ts.declared_name(scope.child_by_field_name("declarator")) == name:
            return None
        declarators = [d for s in scope.named_children if s.end_byte <= child.start_byte and s.type == "declaration"
                       for d in s.children_by_field_name("declarator") if _ts.declared_name(d) == name]
        if declarators:
            return declarators[-1], scope
        child = scope
    return None


def _initializer(declarator: Node) -> str | None:
    """The value a declaration gives its variable as an expression: `dim3 b(X, Y)`, `dim3 b{X, Y}`
    and `dim3 b = dim3(X, Y)` -> `dim3(X, Y)`; `int n = X` and `int n(X)` -> `X`."""
    if declarator.type == "function_declarator":  # `dim3 b(X, Y)` reads as a function's declaration
        value = declarator.child_by_field_name("parameters")
        if value is None or any(p.child_by_field_name("declarator") for p in value.named_children):
            return None  # a parameter with a name: a function's declaration indeed
    elif declarator.type == "init_declarator":
        value = declarator.child_by_field_name("value")
    else:
        return None
    if value is None:
        return None
    if value.type not in ("argument_list", "initializer_list", "parameter_list"):
        return _ts.squash(_ts.text(value))
    parts = [_ts.squash(_ts.text(c)) for c in value.named_children if c.type != "comment"]
    kind = declarator.parent.child_by_field_name("type") if declarator.parent is not None else None
    if kind is not None and _ts.text(kind).split("::")[-1] == "dim3":
        return f"dim3({', '.join(parts)})"
    return parts[0] if len(parts) == 1 else None


def _change(model: SourceModel, scope: Node, declarator: Node, name: str) -> _Changed | None:
    """The first place after its declaration where `name` may be given another value: a store to it
    or to one of its fields, its address taken, or it handed to a reference parameter. (A name
    shadowed in an inner block counts too: the analysis errs toward no value.)"""
    for node in _ts.walk(scope):
        if node.start_byte < declarator.end_byte or node.type != "identifier" or _ts.text(node) != name:
            continue
        target = node  # `block.x`, `sizes[0]`: the part of the variable that the statement reaches
        while (parent := target.parent) is not None and (parent.type == "parenthesized_expression" or (
                parent.type in ("field_expression", "subscript_expression")
                and parent.child_by_field_name("argument") == target)):
            target = parent
        written, line = _ts.squash(_ts.text(target)), node.start_point[0] + 1
        if _ts.is_store(target):
            return _Changed(f"`{written}` is written on line {line}")
        parent = target.parent
        if parent is not None and parent.type == "pointer_expression" and _ts.text(parent).startswith("&"):
            return _Changed(f"`&{written}` is taken on line {line}")
        if parent is not None and parent.type == "argument_list" and parent.parent is not None \
                and parent.parent.type == "call_expression" and _by_reference(model, parent.parent, target):
            callee = _ts.callee_name(parent.parent)
            return _Changed(f"`{written}` is handed to {callee}'s reference parameter on line {line}")
    return None


def _by_reference(model: SourceModel, call: Node, argument: Node) -> bool:
    """Whether `call` may change `argument`: a function of the file taking it by non-const
    reference, or `swap`. Any other call is taken to read it (a library's, a kernel launch's)."""
    callee = _ts.callee_name(call)
    if callee == "swap":
        return True
    index = next((i for i, a in enumerate(_ts.arguments(call)) if a == argument), None)
    fn = next((n for n in _ts.walk(model.root) if n.type == "function_definition"
               and _ts.declared_name(n.child_by_field_name("declarator")) == callee), None) if model.root else None
    params = _ts.parameters(fn) if fn is not None else []
    if index is None or index >= len(params):
        return False
    param = params[index]
    const = any(c.type == "type_qualifier" and _ts.text(c) == "const" for c in param.children)
    return not const and any(n.type == "reference_declarator" for n in _ts.walk(param))


def written_alias(kernel: Kernel, name: str, sites: list[LaunchSite]) -> tuple[str, int] | None:
    """Where a launch hands parameter `name` memory that may be shared with a parameter the kernel
    writes: "its argument `x` may share memory with y's `y`", and that launch's line; None when no
    launch does (the read-only experts' aliasing rule)."""
    written = written_params(kernel)
    for site in sites:
        regions = site.regions(kernel)
        for other in sorted(q for q in written if q in regions and q != name):
            if name in regions and site.may_alias(regions[name], regions[other]):
                args = site.launch.bound_args(kernel)
                return (f"its argument `{pretty(args[name])}` may share memory with {other}'s "
                        f"`{pretty(args[other])}`"), site.launch.line
    return None
