"""Constraint expressions over a target's params, such as ``BLOCK * UNROLL <= 4096``.

The grammar is a small subset of Python expressions, parsed with ``ast`` and evaluated by walking
the tree; nothing a config says is ever passed to ``eval``:

- literals: integers, floats, strings, ``True``/``False``; names: the target's params only;
- arithmetic ``+ - * / // % **``, unary ``- + not``, ``and``/``or``, comparisons (chained too:
  ``32 <= BLOCK < 1024``), and the calls ``min``, ``max``, ``abs``; nothing else (no attributes,
  subscripts, other calls, comprehensions, lambdas, conditional expressions).

Every evaluation is bounded, so that a constraint can neither hang nor exhaust memory: an
expression is at most ``MAX_LENGTH`` characters and ``MAX_NODES`` nodes, an integer at most
``MAX_INT_BITS`` bits (``9 ** 9 ** 9`` is refused, not computed), a string at most ``MAX_STRING``
characters, and ``%`` is arithmetic only (never string formatting). A constant part that breaks a
bound is a ValueError when the constraint is compiled (``warpfleet validate``). At run time, a point
where the expression cannot be evaluated, a division by zero included, does not satisfy the
constraint: ``TILE / (TILE - 32) > 1`` rejects ``TILE = 32``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

MAX_LENGTH = 1000
MAX_NODES = 200
MAX_INT_BITS = 4096
MAX_STRING = 10_000

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


class ConstraintError(ValueError):
    """An expression outside the grammar, or a value past a bound."""


Predicate = Callable[[Mapping[str, Any]], bool]


def compile_constraint(expr: str, params: Mapping[str, Any]) -> Predicate:
    """A predicate over param values; raises ValueError (ConstraintError) for bad syntax, unknown
    names, anything outside the grammar, or a constant past a bound. The predicate is False where
    the expression cannot be evaluated (a division by zero, a value past a bound)."""
    return _compile(expr, tuple(sorted(params)))


def compile_expression(expr: str, names: Mapping[str, Any] | tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    """The value of an expression over ``names`` (a kernel's launch geometry: ``TILE // WPT``), from
    the same grammar and bounds as constraints; raises ValueError (ConstraintError) for bad syntax,
    unknown names, or a value it cannot have (a division by zero) when evaluated."""
    value = _compile_value(expr, tuple(sorted(names)))

    def evaluate(values: Mapping[str, Any]) -> Any:
        try:
            return value(values)
        except (ZeroDivisionError, TypeError, OverflowError) as exc:
            raise ConstraintError(f"{expr}: {exc}") from None

    return evaluate


def evaluate_constraint(expr: str, params: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """The constraint at ``values``, raising ValueError (with the reason) where the predicate would
    quietly say False: for checking a target's baseline when it is loaded."""
    _compile(expr, tuple(sorted(params)))
    try:
        return bool(_eval(ast.parse(expr, mode="eval").body, values))
    except ZeroDivisionError:
        raise ConstraintError("division by zero") from None
    except (TypeError, OverflowError, ValueError) as exc:
        raise ConstraintError(str(exc)) from None


@lru_cache(maxsize=1024)
def _compile_value(expr: str, names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    if len(expr) > MAX_LENGTH:
        raise ConstraintError(f"longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ConstraintError(f"not a valid expression: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise ConstraintError("nested too deeply") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ConstraintError(f"more than {MAX_NODES} terms")
    _check(tree.body, set(names))
    _fold_constants(tree.body)
    body = tree.body
    return lambda values: _eval(body, values)


@lru_cache(maxsize=1024)
def _compile(expr: str, names: tuple[str, ...]) -> Predicate:
    value = _compile_value(expr, names)

    def predicate(values: Mapping[str, Any]) -> bool:
        try:
            return bool(value(values))
        except (ZeroDivisionError, TypeError, OverflowError, ValueError):
            return False  # a point where the expression has no value does not satisfy it

    return predicate


def _check(node: ast.AST, names: set[str]) -> None:
    match node:
        case ast.Constant(value=int() | float() | str() | bool()):
            return
        case ast.Name(id=name):
            if name not in names:
                raise ConstraintError(f"unknown name {name!r} (params: {', '.join(sorted(names)) or 'none'})")
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            _check(left, names), _check(right, names)
        case ast.UnaryOp(op=ast.Not() | ast.USub() | ast.UAdd(), operand=operand):
            _check(operand, names)
        case ast.BoolOp(values=values):
            for value in values:
                _check(value, names)
        case ast.Compare(left=left, ops=ops, comparators=rest) if all(type(o) in _COMPARE for o in ops):
            for part in (left, *rest):
                _check(part, names)
        case ast.Call(func=ast.Name(id=fn), args=args, keywords=[]) if fn in _FUNCTIONS and args:
            for arg in args:
                _check(arg, names)
        case _:
            raise ConstraintError(f"not allowed in a constraint: {ast.unparse(node)!r}")


def _fold_constants(node: ast.AST) -> None:
    """Evaluate every part without a param once, so that a constant past a bound (``9 ** 9 ** 9``)
    or a constant division by zero is an error when the config is checked, not a quiet False."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            return _fold_children(node)
    try:
        _eval(node, {})
    except ZeroDivisionError:
        raise ConstraintError(f"division by zero: {ast.unparse(node)!r}") from None
    except (TypeError, OverflowError, ValueError) as exc:
        raise ConstraintError(f"{ast.unparse(node)!r}: {exc}") from None
    return None


def _fold_children(node: ast.AST) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            _fold_constants(child)


def _bits(value: Any) -> int:
    return abs(value).bit_length() if isinstance(value, int) else 0


def _binary(op: ast.operator, left: Any, right: Any) -> Any:
    """``left op right`` where its result stays within the bounds, else ConstraintError, decided
    before anything large is computed."""
    kind = type(op)
    if isinstance(left, str) or isinstance(right, str):
        if kind is ast.Mult and isinstance(left, str) != isinstance(right, str):
            text, count = (left, right) if isinstance(left, str) else (right, left)
            if isinstance(count, int) and len(text) * max(count, 0) > MAX_STRING:
                raise ConstraintError(f"a string longer than {MAX_STRING} characters")
        elif kind is not ast.Add:
            raise TypeError(f"{type(op).__name__} is not defined on strings in a constraint")
    elif kind is ast.Pow and isinstance(left, int | float) and isinstance(right, int | float):
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and _bits(left) * right > MAX_INT_BITS:
            raise ConstraintError(f"a power past {MAX_INT_BITS} bits")  # floats overflow by themselves
    elif kind is ast.Mult and _bits(left) + _bits(right) > MAX_INT_BITS:
        raise ConstraintError(f"a product past {MAX_INT_BITS} bits")
    result = _BINARY[kind](left, right)
    if isinstance(result, str) and len(result) > MAX_STRING:
        raise ConstraintError(f"a string longer than {MAX_STRING} characters")
    return result


def _eval(node: ast.AST, values: Mapping[str, Any]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return values[name]
        case ast.BinOp(left=left, op=op, right=right):
            return _binary(op, _eval(left, values), _eval(right, values))
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _eval(operand, values)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_eval(operand, values)
        case ast.UnaryOp(operand=operand):
            return +_eval(operand, values)
        case ast.BoolOp(op=ast.And(), values=parts):
            return all(_eval(p, values) for p in parts)
        case ast.BoolOp(values=parts):
            return any(_eval(p, values) for p in parts)
        case ast.Compare(left=left, ops=ops, comparators=rest):
            current = _eval(left, values)
            for op, right in zip(ops, rest, strict=True):
                nxt = _eval(right, values)
                if not _COMPARE[type(op)](current, nxt):
                    return False
                current = nxt
            return True
        case ast.Call(func=ast.Name(id=fn), args=args):
            return _FUNCTIONS[fn](*(_eval(a, values) for a in args))
    raise AssertionError(f"unchecked node {ast.dump(node)}")
