"""A host function's CUDA operations in the order they run: helpers of the file followed (their
parameters bound to the call's arguments), counted loops unfolded (the loop variable bound to
each value), `if`s with a constant condition decided, pointer locals and constant arrays read.

    SourceModel (its tree) + function ─► unfold ─► [Step]: a HostOp with its arguments
        substituted, the statements (and loop iterations) of the function around it, and the
        conditions it runs under (guards): an undecided `if`, a loop whose count is not a
        constant, a path after a `return` or `break`. A step surely runs when another does if its
        guards are a subset of the other's, so an early return guards everything after it alike.

A loop with a constant count is unfolded exactly while the loops around it and it repeat their
body at most MAX_UNFOLD times. Any other loop is unfolded REPRESENTATIVE times under one guard
(it may run fewer times): a `for` with a constant start and step gets its values from there,
others a token per iteration (`wf_iter_3_1`) that no expression evaluates, so that what depends
on the iteration stays apart. Names are substituted textually, once: a parameter or local by the
text it was bound to, which reads the caller's names. A variable assigned from something the
analysis cannot follow becomes an ANY_PREFIX token: the dependence graph takes it for every buffer.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from agents import _ts
from agents._ts import Node
from agents.source_model import HostOp, HostOpKind, SourceModel

MAX_UNFOLD = 64
REPRESENTATIVE = 8
MAX_DEPTH = 6
ANY_PREFIX = "__wf_any"  # a value the analysis lost: a pointer that may be any buffer
_LOOPS = ("for_statement", "for_range_loop", "while_statement", "do_statement")
_EXITS = ("return_statement", "break_statement", "continue_statement", "goto_statement", "throw_statement")
_NAME = re.compile(r"(?<![\w.])(?<!->)(?<!::)\b([A-Za-z_]\w*)\b")
# Calls that make what `&name` points to a new buffer, stream or event of its own: `name` keeps
# naming it. Any other call taking `&name` may set it to anything.
_ALLOCATIONS = {"cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaMallocPitch", "cudaMallocHost",
                "cudaHostAlloc", "cudaMalloc3D", "cudaMallocFromPoolAsync", "cudaStreamCreate",
                "cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority", "cudaEventCreate",
                "cudaEventCreateWithFlags"}
_INTEGRAL = re.compile(r"(?:(?:unsigned|signed|const|constexpr|static|long|short|int|size_t|ptrdiff_t|u?int\d+_t|"
                       r"char|bool|auto)\s*)+")
_SUBSCRIPT = re.compile(r"\b([A-Za-z_]\w*)\s*\[([^\[\]]*)\]")


@dataclass(frozen=True)
class Site:
    """A statement of the unfolded function (its tree node's id), and which iteration of it when
    it is an unfolded loop."""

    node: int
    iteration: int | None = None
    exact: bool = True  # False: one of a loop's representative iterations (its count is not a constant)


@dataclass(frozen=True)
class Step:
    op: HostOp  # arguments, stream and buffers with the names bound where it runs
    trail: tuple[Site, ...]  # the function's own statements around it, outermost first
    guards: frozenset[int]  # the undecided conditions it runs under: a step runs whenever another
    # runs when its guards are a subset of the other's (an early return guards all that follows)
    call: int  # byte offset of the call in the function that led to it (its own, or a helper's call)

    @property
    def conditional(self) -> bool:
        """It may not run."""
        return bool(self.guards)


@dataclass
class _Frame:
    names: dict[str, str]
    trail: tuple[Site, ...] = ()
    guards: frozenset[int] = frozenset()
    depth: int = 0
    top: bool = True  # in the unfolded function's own statements (not a helper's)
    call: int = -1
    lambdas: dict[str, Node] = field(default_factory=dict)
    times: int = 1  # how many times the enclosing unfolded loops repeat this code

    def inner(self, **changes: object) -> _Frame:
        return replace(self, names=dict(self.names), lambdas=dict(self.lambdas), **changes)


def unfold(model: SourceModel, function: str) -> list[Step]:
    """The CUDA operations of `function` (and of the helpers it calls) in the order they run."""
    return _Unfolder(model).run(function)


def substitute(expression: str, names: dict[str, str]) -> str:
    """`expression` with each bound name replaced (once) by its text, parenthesised."""
    def one(m: re.Match[str]) -> str:
        value = names.get(m.group(1))
        if value is None:
            return m.group(0)
        return value if re.fullmatch(r"[\w.]+|\w+\[[^\[\]]*\]", value) else f"({value})"
    return _NAME.sub(one, expression)


class _Unfolder:
    def __init__(self, model: SourceModel) -> None:
        self.model = model
        self.ops = {op.at: op for op in model.host_ops}
        self.functions = {_ts.declared_name(n.child_by_field_name("declarator")): n for n in _ts.walk(model.root)
                          if n.type == "function_definition"} if model.root is not None else {}
        self.constants = {**model.macros, **{name: str(value) for name, value in model.constants.items()}}
        self.arrays: dict[str, list[str]] = {}  # arrays declared with an initializer list: their elements
        self.tokens = itertools.count()
        self.steps: list[Step] = []

    def run(self, function: str) -> list[Step]:
        fn = self.functions.get(function)
        if fn is not None:
            self.statement(fn.child_by_field_name("body"), _Frame({}))
        return self.steps

    # -- text --------------------------------------------------------------------------------
    def text(self, node: Node | None) -> str:
        return _ts.squash(self.model.clean[node.start_byte:node.end_byte].decode("utf-8", "replace")) if node else ""

    def env(self, frame: _Frame) -> _ts.ConstEnv:
        return _ts.ConstEnv({**self.constants, **frame.names})

    def resolve(self, expression: str | None, frame: _Frame) -> str | None:
        """Names substituted, subscripts with constant indices evaluated, constant arrays read."""
        if expression is None:
            return None
        env = self.env(frame)
        out = substitute(expression, frame.names)

        def index(m: re.Match[str]) -> str:
            value = env.eval_text(m.group(2)) if m.group(2).strip() else None
            elements = self.arrays.get(m.group(1))
            if value is not None and elements is not None and 0 <= value < len(elements):
                return f"({elements[value]})"
            return f"{m.group(1)}\x01{m.group(2).strip() if value is None else value}\x02"

        for _ in range(8):
            changed = _SUBSCRIPT.sub(index, out)
            if changed == out:
                break
            out = changed
        return _ts.squash(out.replace("\x01", "[").replace("\x02", "]"))

    def token(self, name: str) -> str:
        return f"{ANY_PREFIX}_{name}_{next(self.tokens)}"

    def guard(self) -> int:
        """A new condition the analysis cannot decide."""
        return next(self.tokens)

    # -- statements --------------------------------------------------------------------------
    def block(self, statements: list[Node], frame: _Frame) -> None:
        for node in statements:
            self.statement(node, frame)
            if may_exit(node):  # what follows a `return`/`break` inside it may not run
                frame.guards = frame.guards | {self.guard()}

    def statement(self, node: Node | None, frame: _Frame) -> None:
        if node is None or node.type == "comment":
            return
        if frame.top and node.parent is not None and node.parent.type == "compound_statement":
            frame = replace(frame, trail=(*frame.trail, Site(node.id)))  # the same names: it binds them
        kind = node.type
        if kind == "compound_statement":
            inner = frame.inner()
            self.block([c for c in node.named_children if c.type != "comment"], inner)
            self.merge(node, frame, inner)
        elif kind == "declaration":
            self.declaration(node, frame)
        elif kind == "if_statement":
            self.branches(node, frame)
        elif kind in _LOOPS:
            self.loop(node, frame)
        elif kind in ("switch_statement", "try_statement", "labeled_statement", "case_statement"):
            self.opaque(node, frame)
        else:
            self.expression(node, frame)

    def opaque(self, node: Node, frame: _Frame) -> None:
        """Statements walked once, everything in them conditional."""
        inner = frame.inner(guards=frame.guards | {self.guard()})
        for child in node.named_children:
            self.statement(child, inner) if child.type.endswith("statement") else self.expression(child, inner)
        self.forget(node, frame)

    def branches(self, node: Node, frame: _Frame) -> None:
        condition = node.child_by_field_name("condition")
        self.expression(condition, frame)
        value = self.env(frame).eval_text(self.resolve(self.text(condition).strip("() "), frame) or "")
        consequence, alternative = node.child_by_field_name("consequence"), node.child_by_field_name("alternative")
        if alternative is not None and alternative.type == "else_clause":
            alternative = next((c for c in alternative.named_children if c.type != "comment"), None)
        if value is not None:
            inner = frame.inner()
            self.statement(consequence if value else alternative, inner)
            self.merge(node, frame, inner)
        else:
            for branch in (consequence, alternative):
                self.statement(branch, frame.inner(guards=frame.guards | {self.guard()}))
            self.forget(node, frame)

    def loop(self, node: Node, frame: _Frame) -> None:
        counted = _ts.counted_loop(node, self.env(frame), MAX_UNFOLD)
        init = node.child_by_field_name("initializer")
        if init is not None:
            self.expression(init, frame)
        # Exactly, while the loops around it and it repeat the body at most MAX_UNFOLD times.
        exact = counted.values is not None and frame.times * len(counted.values) <= MAX_UNFOLD
        taken = max(1, min(REPRESENTATIVE, MAX_UNFOLD // frame.times))
        ran = frozenset({self.guard()})  # that the loop ran this often: one condition for all its iterations
        if exact:
            values, guards = [str(v) for v in counted.values or ()], frame.guards
        elif counted.start is not None and counted.step is not None:
            values, guards = [str(counted.start + i * counted.step) for i in range(taken)], frame.guards | ran
        else:
            count = 1 if node.type == "do_statement" else min(2, taken)
            loop_id = next(self.tokens)
            values = [f"wf_iter_{loop_id}_{i}" for i in range(count)]
            guards = frame.guards | (ran if node.type != "do_statement" else frozenset())
        variable = counted.variable or _ts.declared_name(node.child_by_field_name("declarator")) or None
        exits = may_exit(node.child_by_field_name("body"), inside_loop=True)
        trail = frame.trail[:-1] if frame.trail and frame.trail[-1].node == node.id else frame.trail
        # One frame for every iteration: what one assigns, the next reads.
        inner = frame.inner(times=frame.times * max(1, len(values)))
        left = frozenset({self.guard()})  # that no earlier iteration left the loop
        for i, value in enumerate(values):
            inner.guards = guards | (left if exits and i > 0 else frozenset())
            if variable:
                inner.names[variable] = value
            if frame.top:
                inner.trail = (*trail, Site(node.id, i, exact))
            self.statement(node.child_by_field_name("body"), inner)
        self.forget(node, frame)

    def merge(self, node: Node, frame: _Frame, inner: _Frame) -> None:
        """What a block that surely ran assigned to names from outside it."""
        declared = {_ts.declared_name(d) for n in _walk_code(node) if n.type == "declaration"
                    for d in n.children_by_field_name("declarator")}
        for name in assigned(node) - declared:
            if name in inner.names:
                frame.names[name] = inner.names[name]

    def forget(self, node: Node, frame: _Frame) -> None:
        """Names assigned inside `node` (which may have run any number of times) hold an unknown
        value after it; an allocation keeps its name."""
        allocated = _allocated(node)
        for name in assigned(node):
            frame.names[name] = name if name in allocated else self.token(name)

    def declaration(self, node: Node, frame: _Frame) -> None:
        scalar = _INTEGRAL.fullmatch(self.text(node.child_by_field_name("type")) + " ") is not None
        for declarator in node.children_by_field_name("declarator"):
            name = _ts.declared_name(declarator)
            value = declarator.child_by_field_name("value") if declarator.type == "init_declarator" else None
            if value is None or not name:
                continue
            if value.type == "lambda_expression":
                frame.lambdas[name] = value
                continue
            self.expression(value, frame)
            pointer = any(n.type == "pointer_declarator" for n in _ts.walk(declarator))
            if value.type == "initializer_list":
                self.arrays[name] = [self.resolve(self.text(v), frame) or "" for v in value.named_children]
            elif (pointer or scalar) and _follows_pointers(value):
                frame.names[name] = self.resolve(self.text(value), frame) or self.token(name)
            elif pointer or scalar:
                frame.names[name] = self.token(name)

    # -- expressions -------------------------------------------------------------------------
    def expression(self, node: Node | None, frame: _Frame) -> None:
        """Calls in `node` in source order; assignments rebinding names."""
        if node is None:
            return
        if node.type == "call_expression":
            self.call(node, frame)
            return
        if node.type == "lambda_expression":  # handed to a call that runs it: its body runs here
            self.statement(node.child_by_field_name("body"), frame.inner())
            return
        if node.type == "update_expression":
            target = node.child_by_field_name("argument")
            if target is not None and target.type == "identifier":
                frame.names[_ts.text(target)] = self.token(_ts.text(target))
            return
        if node.type == "assignment_expression":
            self.expression(node.child_by_field_name("right"), frame)
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is not None and left.type == "identifier":
                operator = node.child_by_field_name("operator")
                plain = operator is not None and operator.type == "=" and _follows_pointers(right)
                frame.names[_ts.text(left)] = (self.resolve(self.text(right), frame) if plain else None) \
                    or self.token(_ts.text(left))
            return
        for child in node.named_children:
            self.expression(child, frame)

    def call(self, node: Node, frame: _Frame) -> None:
        for arg in _ts.arguments(node):
            self.expression(arg, frame)
        op = self.ops.get(node.start_byte)
        name = _ts.callee_name(node)
        for given in _ts.arguments(node):  # `cudaMalloc(&p, ...)`: p names a buffer of its own
            arg = _ts.unwrap(given)  # also `(void **)&p`, `reinterpret_cast<void **>(&p)`
            pointee = arg.child_by_field_name("argument") if arg is not None and arg.type == "pointer_expression" \
                else None
            if pointee is not None and pointee.type == "identifier" and self.text(arg).startswith("&"):
                frame.names[_ts.text(pointee)] = _ts.text(pointee) if name in _ALLOCATIONS \
                    else self.token(_ts.text(pointee))
        here = frame if frame.call >= 0 else frame.inner(call=node.start_byte)
        if op is not None and op.kind is not HostOpKind.CALL:
            self.steps.append(Step(self.bound(op, frame), frame.trail, frame.guards, here.call))
        elif op is not None and frame.depth < MAX_DEPTH:
            self.inline(self.functions.get(op.api), node, here)
        elif name in frame.lambdas and frame.depth < MAX_DEPTH:
            self.inline(frame.lambdas[name], node, here, captured=frame.names)
        elif name == "swap" and len(args := _ts.arguments(node)) == 2:
            a, b = (self.text(x) for x in args)
            frame.names[a], frame.names[b] = frame.names.get(b, b), frame.names.get(a, a)

    def inline(self, callee: Node | None, call: Node, frame: _Frame, captured: dict[str, str] | None = None) -> None:
        if callee is None:
            return
        params = [_ts.declared_name(p.child_by_field_name("declarator")) for p in _ts.parameters(callee)]
        args = [self.resolve(self.text(a), frame) or "" for a in _ts.arguments(call)]
        names = {**(captured or {}), **{p: a for p, a in zip(params, args, strict=False) if p}}
        inner = _Frame(names, frame.trail, frame.guards, frame.depth + 1, False, frame.call, times=frame.times)
        self.statement(callee.child_by_field_name("body"), inner)

    def bound(self, op: HostOp, frame: _Frame) -> HostOp:
        """`op` with its arguments read where it runs."""
        def resolve(value: str | None) -> str | None:
            return self.resolve(value, frame)

        launch = op.launch
        if launch is not None:
            launch = replace(launch, args=tuple(resolve(a) or "" for a in launch.args), stream=resolve(launch.stream),
                             grid=resolve(launch.grid) or "", block=resolve(launch.block) or "")
        return replace(op, args=tuple(resolve(a) or "" for a in op.args), stream=resolve(op.stream),
                       dst=resolve(op.dst), src=resolve(op.src), launch=launch)


def may_exit(node: Node | None, inside_loop: bool = False) -> bool:
    """Whether control may leave `node` before its end: a `return`, `goto` or `throw`, or a
    `break`/`continue` not consumed by a loop (or `switch`, for `break`) inside it."""
    if node is None:
        return False
    stack = [(node, inside_loop, inside_loop)]  # (node, a `break` is consumed, a `continue` is)
    while stack:
        current, breaks, continues = stack.pop()
        if current.type in ("return_statement", "goto_statement", "throw_statement") \
                or (current.type == "break_statement" and not breaks) \
                or (current.type == "continue_statement" and not continues):
            return True
        if current.type == "lambda_expression":
            continue
        looped = current.type in _LOOPS  # `node` itself too: its own `break` ends only it
        switched = current.type == "switch_statement"
        stack += [(c, breaks or looped or switched, continues or looped) for c in current.children]
    return False


def _walk_code(node: Node) -> Iterator[Node]:
    """The nodes of `node`, not entering lambdas (their `return` is their own)."""
    return _ts.walk(node, skip=frozenset({"lambda_expression"}))


def assigned(node: Node) -> set[str]:
    """Names assigned, updated or having their address handed to a call in `node`."""
    out = set()
    for n in _walk_code(node):
        target = n.child_by_field_name("left") if n.type == "assignment_expression" else \
            n.child_by_field_name("argument") if n.type == "update_expression" else \
            n.child_by_field_name("argument") if n.type == "pointer_expression" and n.parent is not None \
            and n.parent.type == "argument_list" and _ts.text(n).startswith("&") else None
        if target is not None and target.type == "identifier":
            out.add(_ts.text(target))
    return out


def _allocated(node: Node) -> set[str]:
    """Names whose address an allocation call in `node` takes (`cudaMalloc(&p, ...)`, through a
    cast too: `cudaMalloc((void **)&p, ...)`, `reinterpret_cast<void **>(&p)`)."""
    return {_ts.text(a.child_by_field_name("argument")) for n in _walk_code(node)
            if n.type == "call_expression" and _ts.callee_name(n) in _ALLOCATIONS
            for a in map(_ts.unwrap, _ts.arguments(n)[:1]) if a is not None and a.type == "pointer_expression"
            and a.child_by_field_name("argument") is not None}


def _follows_pointers(value: Node | None) -> bool:
    """Whether a value is an expression of names and constants the analysis can follow (`d_y + k
    * n`, `&buf[4]`, a cast of one), not a call's result, which may be anything."""
    return value is not None and not any(n.type == "call_expression" and not _ts.callee_name(n).endswith("_cast")
                                         for n in _ts.walk(value))
