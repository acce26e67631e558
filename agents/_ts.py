"""Helpers for agents.cuda_source: the tree-sitter parser, a small preprocessor pass and a
constant evaluator over syntax nodes.

tree-sitter parses CUDA's own syntax (``__global__``, ``__launch_bounds__``, ``<<<...>>>``) well,
but not the preprocessor: a directive between a loop header and its unbraced body, as in
``for (...)\\n#pragma unroll\\nfor (...)``, loses the body. So the parser never sees a directive:
``preprocess`` evaluates ``#if``/``#ifdef`` itself, collects ``#define``s and ``#pragma``s, and
blanks directives, comments and inactive regions with spaces. Blanking keeps every byte offset
and line number, so node positions index the caller's text unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache

import tree_sitter_cuda
from tree_sitter import Language, Node, Parser

# What the grammar does not know, blanked: `__align__(16)`, and the `__device__` of an extended
# lambda, `[=] __device__ (int i) {...}`.
_UNKNOWN_ATTRIBUTES = re.compile(rb"\b__align__\s*\((?:[^()]|\([^()]*\))*\)|(?<=\])(?:\s*__(?:host|device)__\b)+")
# `unsigned(x)` and kin: a functional cast the C-based grammar reads as a declarator. The keyword
# becomes an identifier of the same length, so the cast reads as a call.
_KEYWORD_CAST = re.compile(rb"\b(?:unsigned|signed|long|short)(?=\()")
_PREDEFINED = {"__CUDACC__": "1", "__NVCC__": "1", "__cplusplus": "201703L"}
# What may start a comment, a literal or a line: `preprocess` steps over the text between at once.
_NEXT_TOKEN_START = re.compile(rb"[\n/\"']")


@cache
def parser() -> Parser:
    """The CUDA parser (one per process; parsers are cheap but the language load is not)."""
    return Parser(Language(tree_sitter_cuda.language()))


@dataclass(frozen=True)
class Preprocessed:
    """The text the parser sees, and what the directives said."""

    clean: bytes  # comments, directives and inactive regions blanked: for reporting expressions
    masked: bytes  # `clean` with the constructs the grammar misreads replaced: what the parser sees
    macros: dict[str, str]  # object-like macros in force at the end of the file
    pragmas: dict[int, str] = field(default_factory=dict)  # 1-based line -> text after `#pragma`


def preprocess(source: bytes, defines: Mapping[str, str] | None = None) -> Preprocessed:
    """Blank comments, directives and inactive `#if` regions; collect macros and pragmas.

    `defines` act as -D options: they win over the file's own `#define`s (the `#ifndef X /
    #define X default` idiom then keeps the -D value).
    """
    out = bytearray(source)
    macros = dict(_PREDEFINED) | dict(defines or {})
    forced = set(defines or {})
    pragmas: dict[int, str] = {}
    stack: list[tuple[bool, bool]] = []  # per open #if: (this branch active, some branch taken)
    i, n, line_start, line, live = 0, len(source), True, 1, True

    def active() -> bool:
        return all(entry[0] for entry in stack)

    def blank(start: int, end: int) -> None:
        for k in range(start, end):
            if out[k] not in b"\r\n":
                out[k] = 0x20

    while i < n:
        c = source[i]
        if c == 0x0A:
            line, line_start, i = line + 1, True, i + 1
            continue
        if c in b" \t\r\f\v":
            i += 1
            continue
        if line_start and c == 0x23:  # '#': a directive, to the end of its logical line
            end, text = _directive_end(source, i)
            _directive(text.decode("utf-8", "replace"), line, stack, macros, forced, pragmas, active)
            live = active()
            blank(i, end)
            line += source.count(b"\n", i, end)
            i = end
            continue
        line_start = False
        if source.startswith(b"//", i) or source.startswith(b"/*", i):
            end = _comment_end(source, i)
            blank(i, end)
            line += source.count(b"\n", i, end)
            i = end
        elif not live:  # skipped text: only comments and directives count, up to the line's end
            line_end = source.find(b"\n", i) % (n + 1)  # n when there is no newline
            end = min([k for k in (source.find(b"//", i, line_end), source.find(b"/*", i, line_end)) if k >= 0],
                      default=line_end)
            blank(i, end)
            i = end
        elif c in b"\"'" and not (c == 0x27 and i > 0 and chr(source[i - 1]).isalnum()):
            end = _literal_end(source, i)
            line += source.count(b"\n", i, end)
            i = end
        else:
            following = _NEXT_TOKEN_START.search(source, i + 1)
            i = following.start() if following is not None else n
    clean = bytes(out)
    masked = _KEYWORD_CAST.sub(lambda m: b"_" * len(m.group()), clean)
    masked = _UNKNOWN_ATTRIBUTES.sub(lambda m: b" " * len(m.group()), masked)
    return Preprocessed(clean, masked, {k: v for k, v in macros.items() if k not in _PREDEFINED}, pragmas)


def _comment_end(source: bytes, i: int) -> int:
    if source.startswith(b"/*", i):
        end = source.find(b"*/", i + 2)
        return len(source) if end < 0 else end + 2
    end = i
    while True:  # a // comment ending in a backslash continues on the next line
        end = source.find(b"\n", end)
        if end < 0:
            return len(source)
        if source[end - 1 : end] != b"\\" and source[end - 2 : end] != b"\\\r":
            return end
        end += 1


def _literal_end(source: bytes, i: int) -> int:
    """The end of the string or character literal at i (raw strings included)."""
    quote = source[i]
    if quote == 0x22 and i > 0 and source[i - 1 : i] == b"R":
        close = source.find(b"(", i)
        delimiter = b")" + source[i + 1 : close] + b'"'
        end = source.find(delimiter, close)
        return len(source) if close < 0 or end < 0 else end + len(delimiter)
    j = i + 1
    while j < len(source) and source[j] not in (quote, 0x0A):
        j += 2 if source[j] == 0x5C else 1
    return min(j + 1, len(source))


def _directive_end(source: bytes, i: int) -> tuple[int, bytes]:
    """The end of the directive at i and its text, continuations joined, comments dropped."""
    parts, j, n = [], i, len(source)
    while j < n:
        if source.startswith(b"/*", j) or source.startswith(b"//", j):
            end = _comment_end(source, j)
            if source[j + 1] == 0x2F:  # // ends the directive too
                return end, b"".join(parts)
            parts.append(b" ")
            j = end
        elif source.startswith(b"\\\n", j) or source.startswith(b"\\\r\n", j):
            j = source.index(b"\n", j) + 1
            parts.append(b" ")
        elif source[j] == 0x0A:
            break
        else:
            parts.append(source[j : j + 1])
            j += 1
    return j, b"".join(parts)


def _directive(text: str, line: int, stack: list[tuple[bool, bool]], macros: dict[str, str], forced: set[str],
               pragmas: dict[int, str], active: Callable[[], bool]) -> None:
    m = re.match(r"#\s*(\w*)\s*(.*)", text.strip(), re.S)
    word, rest = (m.group(1), m.group(2).strip()) if m else ("", "")
    if word in ("if", "ifdef", "ifndef"):
        if word == "if":
            taken = condition_value(rest, macros)
        else:
            taken = (rest.split() or [""])[0] in macros
            taken = taken if word == "ifdef" else not taken
        stack.append((taken, taken))
    elif word in ("elif", "else") and stack:
        done = stack[-1][1]
        taken = not done and (word == "else" or condition_value(rest, macros))
        stack[-1] = (taken, done or taken)
    elif word == "endif" and stack:
        stack.pop()
    elif not active():
        return
    elif word == "define":
        m = re.match(r"(\w+)(\()?\s*(.*)", rest, re.S)
        if m and not m.group(2) and m.group(1) not in forced:
            macros[m.group(1)] = squash(m.group(3))
    elif word == "undef":
        macros.pop(rest.strip(), None)
    elif word == "pragma":
        pragmas[line] = rest


def condition_value(text: str, macros: Mapping[str, str]) -> bool:
    """An `#if` condition: undefined names are 0, as in C; one it cannot evaluate counts as true
    (keeping a region is safer than losing it)."""
    for pattern in (r"\bdefined\s*\(\s*(\w+)\s*\)", r"\bdefined\s+(\w+)"):
        text = re.sub(pattern, lambda m: "1" if m.group(1) in macros else "0", text)
    value = ConstEnv(macros, undefined_is_zero=True).eval_text(text)
    return True if value is None else value != 0


# ---------------------------------------------------------------------------------------------
# Constant evaluation

_INT = re.compile(r"([-+]?)\s*(0[xX][0-9a-fA-F']+|0[bB][01']+|\d[\d']*)[uUlL]*$")  # the grammar keeps a sign
_BINARY = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: None if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1),
    "%": lambda a, b: None if b == 0 else a - b * (abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)),
    "<<": lambda a, b: a << b if 0 <= b < 64 else None, ">>": lambda a, b: a >> b if 0 <= b < 64 else None,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
    "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b),
    ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
    "&&": lambda a, b: int(bool(a) and bool(b)), "||": lambda a, b: int(bool(a) or bool(b)),
}
_UNARY = {"-": lambda a: -a, "+": lambda a: a, "~": lambda a: ~a, "!": lambda a: int(not a)}
_INTEGRAL_CASTS = {"int", "unsigned", "long", "short", "char", "size_t", "int64_t", "uint64_t", "int32_t",
                   "uint32_t", "unsigned int", "long long", "unsigned long", "unsigned long long", "ptrdiff_t"}


def int_literal(text: str) -> int | None:
    m = _INT.match(text.strip())
    if not m:
        return None
    digits = m.group(2).replace("'", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        digits = "0o" + digits[1:]
    try:
        return int(digits, 0) * (-1 if m.group(1) == "-" else 1)
    except ValueError:
        return None


class ConstEnv:
    """Integer values of names: object-like macros and constant declarations, evaluated lazily."""

    def __init__(self, macros: Mapping[str, str], undefined_is_zero: bool = False) -> None:
        self.macros = macros
        self.undefined_is_zero = undefined_is_zero
        self.declared: dict[str, Node] = {}  # constexpr/const name -> its initializer
        self.hidden: set[str] = set()  # names that are not constants here (loop variables, params)
        self.types: dict[str, str] = {}  # a template's type parameter -> the type bound to it
        self._values: dict[str, int | None] = {}
        self._bound: set[str] = set()  # names given a value by `bind`, kept by child scopes
        self._busy: set[str] = set()
        self._depth = 0

    def child(self) -> ConstEnv:
        """A scope inside this one: it sees this scope's names, and its own shadow them."""
        env = ConstEnv(self.macros, self.undefined_is_zero)
        env.declared = dict(self.declared)
        env.hidden = set(self.hidden)
        env.types = dict(self.types)
        env._values = {name: value for name, value in self._values.items() if name in self._bound}
        env._bound = set(self._bound)
        return env

    def bind(self, name: str, value: int) -> None:
        """`name` is `value` here: a template's value parameter bound by a launch."""
        self.hidden.discard(name)
        self._values[name] = value
        self._bound.add(name)

    def declare(self, name: str, initializer: Node) -> None:
        self.declared[name] = initializer
        self.hidden.discard(name)
        self._values.pop(name, None)

    def value(self, name: str) -> int | None:
        if name in self.hidden:
            return None
        if name in self._values:
            return self._values[name]
        if name in self._busy:  # a cycle, e.g. `#define X X`
            return None
        self._busy.add(name)
        try:
            if name in self.declared:
                result = self.eval(self.declared[name])
            elif name in self.macros:
                result = self.eval_text(self.macros[name])
            else:
                result = 0 if self.undefined_is_zero else None
        finally:
            self._busy.discard(name)
        self._values[name] = result
        return result

    def eval_text(self, text: str) -> int | None:
        node = expression_node(text)
        return None if node is None else self.eval(node)

    def eval(self, node: Node | None) -> int | None:
        """The value of an integral constant expression; None when it has none (or nests deeper
        than any sensible constant: a generated expression must not exhaust Python's stack)."""
        self._depth += 1
        try:
            return None if self._depth > 100 else self._eval(node)
        finally:
            self._depth -= 1

    def _eval(self, node: Node | None) -> int | None:
        if node is None or node.has_error:
            return None
        kind = node.type
        if kind == "number_literal":
            return int_literal(text(node))
        if kind == "identifier":
            return self.value(text(node))
        if kind == "qualified_identifier":  # `Cfg::kTile`, with a type parameter `Cfg` bound to a type
            scope, _, member = text(node).partition("::")
            return self.value(f"{self.types.get(scope.strip(), scope.strip())}::{member.strip()}")
        if kind in ("true", "false"):
            return int(kind == "true")
        if kind == "parenthesized_expression":
            return self.eval(node.named_children[0] if node.named_children else None)
        if kind == "unary_expression":
            a = self.eval(node.child_by_field_name("argument"))
            op = node.child_by_field_name("operator")
            return None if a is None or op is None else _UNARY.get(op.type, lambda _: None)(a)
        if kind == "binary_expression":
            a, b = self.eval(node.child_by_field_name("left")), self.eval(node.child_by_field_name("right"))
            op = node.child_by_field_name("operator")
            fn = _BINARY.get(op.type) if op is not None else None
            return None if a is None or b is None or fn is None else fn(a, b)
        if kind == "conditional_expression":
            test = self.eval(node.child_by_field_name("condition"))
            branch = "consequence" if test else "alternative"
            return None if test is None else self.eval(node.child_by_field_name(branch))
        if kind == "cast_expression":
            cast_type = node.child_by_field_name("type")
            if cast_type is not None and " ".join(text(cast_type).split()) in _INTEGRAL_CASTS:
                return self.eval(node.child_by_field_name("value"))
            return None
        if kind == "call_expression":  # int(x), size_t(x), static_cast<int>(x)
            fn, args = node.child_by_field_name("function"), node.child_by_field_name("arguments")
            name = text(fn) if fn is not None else ""
            cast = name in _INTEGRAL_CASTS or set(name) == {"_"} or callee_name(node) == "static_cast"  # "___": see
            if cast and args is not None and len(args.named_children) == 1:  # _KEYWORD_CAST
                return self.eval(args.named_children[0])
        return None


@cache
def expression_node(expression: str) -> Node | None:
    """`expression` parsed on its own (a macro body, an `#if` condition)."""
    wrapped = f"int __wf_value = ({expression});".encode()
    tree = parser().parse(wrapped)
    for node in walk(tree.root_node):
        if node.type == "init_declarator":
            value = node.child_by_field_name("value")
            return value if value is not None and not value.has_error else None
    return None


# ---------------------------------------------------------------------------------------------
# Node helpers


def text(node: Node) -> str:
    return node.text.decode("utf-8", "replace") if node.text is not None else ""


def walk(node: Node, skip: frozenset[str] = frozenset()) -> Iterator[Node]:
    """Every node under `node` in source order, `node` included; subtrees of `skip` types not entered."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current.type not in skip or current is node:
            stack.extend(reversed(current.children))


def errors_under(node: Node) -> Iterator[Node]:
    """The ERROR and MISSING nodes under `node` that no other one contains, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current.is_error or current.is_missing:
            yield current
        elif current.has_error:
            stack.extend(reversed(current.children))


def error_extent(node: Node) -> int:
    """How much text syntax errors cover (a missing token counts one)."""
    return sum(max(1, e.end_byte - e.start_byte) for e in errors_under(node))


def ancestors(node: Node) -> Iterator[Node]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def unwrap(node: Node | None) -> Node | None:
    """The expression inside parentheses and casts: `(float4*)p`, `reinterpret_cast<T*>(p)`."""
    while node is not None:
        if node.type == "parenthesized_expression" and node.named_children:
            node = node.named_children[0]
        elif node.type == "cast_expression":
            node = node.child_by_field_name("value")
        elif node.type == "call_expression" and callee_name(node).endswith("_cast"):
            args = node.child_by_field_name("arguments")
            node = args.named_children[0] if args is not None and args.named_children else None
        else:
            return node
    return None


def callee_name(call: Node) -> str:
    """The called name without namespace or template arguments: `ns::k<T>` -> `k`."""
    fn = call.child_by_field_name("function")
    while fn is not None and fn.type in ("template_function", "qualified_identifier", "parenthesized_expression"):
        if fn.type == "parenthesized_expression":
            fn = fn.named_children[0] if fn.named_children else None
        else:
            fn = fn.child_by_field_name("name")
    if fn is not None and fn.type == "field_expression":
        fn = fn.child_by_field_name("field")
    return text(fn) if fn is not None and fn.type in ("identifier", "field_identifier") else ""


def parameters(fn: Node) -> list[Node]:
    """The parameter declarations of a function definition or a lambda."""
    declarator = fn.child_by_field_name("declarator")
    plist = next((n for n in walk(declarator) if n.type == "parameter_list"), None) if declarator else None
    return [p for p in (plist.named_children if plist else ()) if p.type.endswith("parameter_declaration")]


def arguments(call: Node) -> list[Node]:
    args = call.child_by_field_name("arguments")
    return [a for a in args.named_children if a.type != "comment"] if args is not None else []


def split_top(text: str) -> list[str]:
    """`a, f(b, c), d` -> ["a", "f(b, c)", "d"]."""
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


def squash(source: str) -> str:
    """Whitespace runs collapsed: multi-line expressions read as one line."""
    return " ".join(source.split())


def name_node(node: Node | None) -> Node | None:
    """The declared identifier inside a declarator (`* __restrict__ in` -> `in`)."""
    while node is not None and node.type not in ("identifier", "field_identifier", "type_identifier"):
        inner = node.child_by_field_name("declarator") or node.child_by_field_name("name")
        node = inner or next((c for c in node.named_children if c.type.endswith(("identifier", "declarator"))), None)
    return node


def declared_name(node: Node | None) -> str:
    """The name a declarator or a callee expression names: `ns::k<T>` -> `k`, `(*p)[4]` -> `p`."""
    if node is not None and node.type == "function_declarator":
        node = node.child_by_field_name("declarator")
    while node is not None and node.type in ("qualified_identifier", "template_function"):
        node = node.child_by_field_name("name")
    name = name_node(node)
    return text(name) if name is not None else ""


def subscript_chain(node: Node) -> list[Node | None]:
    """`a[i][j]` -> [a, a[i], a[i][j]]: the base, then each subscript from the inside out."""
    chain: list[Node | None] = []
    current: Node | None = node
    while current is not None and current.type == "subscript_expression":
        chain.insert(0, current)
        current = current.child_by_field_name("argument")
    return [current, *chain]


def continues_subscript(node: Node) -> bool:
    """Whether `node` is the `a[i]` inside a longer `a[i][j]`."""
    parent = node.parent
    return parent is not None and parent.type == "subscript_expression" and parent.child_by_field_name(
        "argument") == node


def is_store(node: Node) -> bool:
    """Whether the memory `node` designates is written: `a[i] = v`, `++a[i]`, `*(float4*)&a[i] = v`."""
    current = node
    while (parent := current.parent) is not None:
        if parent.type == "assignment_expression":
            return parent.child_by_field_name("left") == current
        if parent.type == "update_expression":
            return True
        call = parent.parent if parent.type == "argument_list" else parent
        is_cast = call is not None and call.type == "call_expression" and callee_name(call).endswith("_cast")
        if not is_cast and parent.type not in ("parenthesized_expression", "cast_expression", "pointer_expression"):
            return False
        current = parent
    return False


_NOT_POINTERS = ("subscript_expression", "field_expression", "call_expression", "sizeof_expression")


def pointer_names(node: Node | None) -> list[Node]:
    """The identifiers whose pointer value an expression carries: `out + k`, `&out[i]`, casts of
    them; not `out[i]` or `*out` (values pointed at) nor a call's result."""
    found, stack = [], [node]
    while stack:
        current = unwrap(stack.pop())
        if current is None or current.type in _NOT_POINTERS:
            continue
        if current.type == "identifier":
            found.append(current)
        elif current.type == "pointer_expression":
            operator, argument = current.child_by_field_name("operator"), current.child_by_field_name("argument")
            base = subscript_chain(unwrap(argument))[0] if argument is not None else None  # &out[i] -> out
            if base is not None and base.type == "field_expression":  # &p->f -> p; &s.f: a local's address
                base = base.child_by_field_name("argument") if _arrow(base) else None
            if operator is not None and operator.type == "&":
                stack.append(base)
        else:
            stack.extend(reversed(current.named_children))
    return found


def stored_through(target: Node | None) -> list[Node]:
    """The pointer identifiers an assignment's left side writes through: `out[i]`, `*p`, `p->f`."""
    node = unwrap(target)
    if node is None:
        return []
    if node.type == "subscript_expression":
        return pointer_names(subscript_chain(node)[0])
    if node.type == "pointer_expression":
        operator = node.child_by_field_name("operator")
        is_deref = operator is not None and operator.type == "*"
        return pointer_names(node.child_by_field_name("argument")) if is_deref else []
    if node.type == "field_expression":
        argument = node.child_by_field_name("argument")
        return pointer_names(argument) if _arrow(node) else stored_through(argument)
    return []


def _arrow(field_expression: Node) -> bool:
    return any(c.type == "->" for c in field_expression.children)


_COMPARISONS = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}


def trip_count(loop: Node, env: ConstEnv, template_names: set[str]) -> tuple[str | None, int | None, str | None]:
    """A loop's variable, its trip count when constant, else the template parameter it depends on."""
    if loop.type == "for_range_loop":
        return declared_name(loop.child_by_field_name("declarator")) or None, None, None
    if loop.type != "for_statement":
        return None, None, None
    variable, start, compare, bound, step_op, step = _header(loop)
    local = env.child()
    local.hidden.add(variable or "")
    values = [local.eval(n) for n in (start, bound, step)]
    count = None
    if None not in values and step_op is not None and compare is not None:
        count = _count(values[0], compare, values[1], step_op, values[2])
    depends = None
    if count is None:
        names = [text(n) for part in (start, bound, step) if part is not None for n in walk(part)]
        depends = next((name for name in names if name in template_names), None)
    return variable, count, depends


@dataclass(frozen=True)
class CountedLoop:
    """A `for` loop's variable and, where `env` gives them, its start, step and every value."""

    variable: str | None
    start: int | None
    step: int | None  # the additive step (negative counting down); None for other updates
    values: tuple[int, ...] | None  # in order, when the loop ends after at most `limit` iterations


def counted_loop(loop: Node, env: ConstEnv, limit: int) -> CountedLoop:
    if loop.type != "for_statement":
        return CountedLoop(None, None, None, None)
    variable, start_node, compare, bound_node, step_op, step_node = _header(loop)
    local = env.child()
    local.hidden.add(variable or "")
    start, bound, step = (local.eval(n) for n in (start_node, bound_node, step_node))
    additive = None if step is None or step_op not in ("+", "-") else (step if step_op == "+" else -step)
    values: list[int] | None = None
    if None not in (start, bound, step) and compare is not None and step_op in _BINARY:
        values, value = [], start
        while values is not None and _BINARY[compare](value, bound):
            following = _BINARY[step_op](value, step)
            if len(values) == limit or following is None or following == value:  # too many, or never ends
                values = None
                break
            values.append(value)
            value = following
    return CountedLoop(variable, start, additive, tuple(values) if values is not None else None)


def _header(loop: Node) -> tuple[str | None, Node | None, str | None, Node | None, str | None, Node | None]:
    """(variable, start, comparison, bound, step operator, step) of a `for` statement's header."""
    init, cond, update = (loop.child_by_field_name(f) for f in ("initializer", "condition", "update"))
    variable, start = None, None
    if init is not None and init.type == "declaration":
        first = init.child_by_field_name("declarator")
        variable = declared_name(first) or None
        start = first.child_by_field_name("value") if first is not None and first.type == "init_declarator" else None
    elif init is not None and init.type == "assignment_expression":
        variable, start = text(init.child_by_field_name("left") or init), init.child_by_field_name("right")
    step_op, step = _step(update)
    if variable is None and step_op is not None and update is not None:
        variable = text(update.child_by_field_name("argument") or update.child_by_field_name("left") or update)
    compare, bound = _bound(cond, variable)
    return variable, start, compare, bound, step_op, step


def _step(update: Node | None) -> tuple[str | None, Node | None]:
    if update is None:
        return None, None
    if update.type == "update_expression":
        operator = update.child_by_field_name("operator")
        one = expression_node("1")
        return ("+" if operator is not None and operator.type == "++" else "-"), one
    if update.type == "assignment_expression":
        operator, right = update.child_by_field_name("operator"), update.child_by_field_name("right")
        if operator is not None and operator.type != "=":
            return operator.type[:-1], right
        if right is not None and right.type == "binary_expression":  # i = i + 2
            op, left = right.child_by_field_name("operator"), right.child_by_field_name("left")
            if op is not None and left is not None and text(left) == text(update.child_by_field_name("left") or left):
                return op.type, right.child_by_field_name("right")
    return None, None


def _bound(cond: Node | None, variable: str | None) -> tuple[str | None, Node | None]:
    if cond is None or cond.type != "binary_expression" or variable is None:
        return None, None
    operator, left, right = (cond.child_by_field_name(f) for f in ("operator", "left", "right"))
    if operator is None or operator.type not in _COMPARISONS:
        return None, None
    if left is not None and text(left) == variable:
        return operator.type, right
    if right is not None and text(right) == variable:
        return _COMPARISONS[operator.type], left
    return None, None


def _count(start: int, compare: str, bound: int, op: str, step: int) -> int | None:
    holds = _BINARY[compare]
    if not holds(start, bound):
        return 0
    if op in "+-":
        delta = step if op == "+" else -step
        if compare == "!=":
            distance = bound - start
            return distance // delta if delta and distance % delta == 0 and distance // delta > 0 else None
        if (delta <= 0) if compare in ("<", "<=") else (delta >= 0):
            return None  # never ends, or only by overflow
        limit = bound + 1 if compare == "<=" else bound - 1 if compare == ">=" else bound
        return -((start - limit) // delta) if delta > 0 else -((limit - start) // -delta)
    value, count = start, 0
    while holds(value, bound) and count <= 64:  # geometric steps (*=, <<=, /=) end fast or never
        next_value = _BINARY[op](value, step) if op in _BINARY else None
        if next_value is None or next_value == value:
            return None
        value, count = next_value, count + 1
    return count if count <= 64 else None
