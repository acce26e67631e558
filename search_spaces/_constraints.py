"""Constraint expressions over a target's params, such as ``BLOCK * UNROLL <= 4096``.

Parsed with ``ast`` and evaluated from a small whitelist: no names but the params, no calls
but min/max/abs, no attribute access. Nothing a config says is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


def compile_constraint(expr: str, params: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over param values; raises ValueError for bad syntax or unknown names."""
    value = _compile(expr, tuple(sorted(params)))
    return lambda values: bool(value(values))


def compile_expression(expr: str, names: Mapping[str, Any] | tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    """The value of an expression over ``names`` (a kernel's launch geometry: ``TILE // WPT``), from
    the same whitelist as constraints; raises ValueError for bad syntax or unknown names."""
    return _compile(expr, tuple(sorted(names)))


@lru_cache(maxsize=1024)
def _compile(expr: str, names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a valid expression: {exc.msg}") from None
    _check(tree.body, set(names))
    return lambda values: _eval(tree.body, values)


def _check(node: ast.AST, names: set[str]) -> None:
    match node:
        case ast.Constant(value=int() | float() | str() | bool()):
            return
        case ast.Name(id=name):
            if name not in names:
                raise ValueError(f"unknown name {name!r} (params: {', '.join(sorted(names)) or 'none'})")
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
        case ast.Call(func=ast.Name(id=fn), args=args, keywords=[]) if fn in _FUNCTIONS:
            for arg in args:
                _check(arg, names)
        case _:
            raise ValueError(f"not allowed in a constraint: {ast.unparse(node)!r}")


def _eval(node: ast.AST, values: Mapping[str, Any]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return values[name]
        case ast.BinOp(left=left, op=op, right=right):
            return _BINARY[type(op)](_eval(left, values), _eval(right, values))
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
