"""The memory a host-side argument designates, for the dependence graph (agents.depgraph).

A region is a whole buffer (`d_y`), a slot of one (`d_y[3*n:4*n]`: `d_y + 3 * n` handed to a
kernel that also gets n, which it is assumed to stay within), an element of an array of device
pointers (`outs[2]`, a buffer of its own; `outs[?]` for an index that is not constant), or ANY
(a pointer the analysis lost: every buffer). The reading is textual on purpose, after
agents.hostflow has bound the names.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from agents import _ts
from agents.hostflow import ANY_PREFIX
from agents.source_model import DEFAULT_STREAMS, SourceModel

_CAST_CALL = re.compile(r"^(?:\w+_cast\s*<[^()]*>|\w+::raw_pointer_cast)\s*\(")
_C_CAST = re.compile(r"^\(\s*(?:const\s+|volatile\s+|struct\s+)*[\w:<>,\s]+?[\s*&]*\)\s*(?=[\w(&*])")
_BASE = re.compile(r"[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*")


def base_buffer(expr: str | None) -> str | None:
    """The buffer an argument points into: casts, outer parentheses and `&` stripped, then the
    leading name (with `.`/`->` members) kept, which drops `[i]`, `+ offset` and `.data()`.
    `(float*)&d_y[4] + off` -> `d_y`. None for literals and nullptr. Deliberately textual: an
    argument such as `n + d_y` yields `n`; the hazards stay conservative only for the usual forms."""
    text = (expr or "").strip()
    while True:
        before = text
        if text.startswith("(") and _closing(text) == len(text) - 1:
            text = text[1:-1].strip()
        if (m := _CAST_CALL.match(text)) and (end := _closing(text[m.end() - 1 :])) > 0:
            text = text[m.end() : m.end() - 1 + end].strip()  # the cast's operand; an offset after it goes
        text = _C_CAST.sub("", text, count=1).lstrip("&").strip()
        if text == before:
            break
    if text.startswith("(") and (end := _closing(text)) > 0:  # `(d_y) + 4`
        return base_buffer(text[1:end])
    m = _BASE.match(text)
    if m is None or m.group(0) in DEFAULT_STREAMS | {"true", "false"}:
        return None
    return re.sub(r"\.data$", "", m.group(0))


def _closing(text: str) -> int:
    """The index of the parenthesis closing text[0]'s, or -1."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return i
    return -1


# -- regions ---------------------------------------------------------------------------------

ANY = "*"  # a region the analysis cannot name: it may be any buffer
SINGLE = "1"  # the extent of a pointer its kernel uses only as `*p` or `p[0]` (Kernel.single_element)
_ELEMENT = re.compile(r"^([A-Za-z_]\w*)\s*\[\s*([^\[\]]+?)\s*\]$")
_SLOT = re.compile(r"^(?P<base>.+)\[(?P<slot>-?\d+)\*(?P<extent>.+):-?\d+\*(?P=extent)\]$")


def region(expr: str | None, extents: Collection[str] = (), model: SourceModel | None = None) -> str | None:
    """The memory an argument designates: `d_y` (all of it), `d_y[3*n:4*n]` (slot 3 of n
    elements: `d_y + 3 * n` with n among `extents`), `outs[2]` (an element of an array of
    pointers, a buffer of its own), ANY (a pointer the analysis lost), None (no pointer)."""
    arms = branches(expr or "")
    if len(arms) > 1:  # `c ? a : b`: one of them, which the analysis cannot tell (`regions` keeps both)
        found = {region(arm, extents, model) for arm in arms} - {None}
        return found.pop() if len(found) == 1 else (ANY if found else None)
    base = base_buffer(expr)
    if base is None:
        return None
    if base.startswith(ANY_PREFIX):
        return ANY
    text = strip_parentheses((expr or "").strip())
    element = _ELEMENT.match(text)
    if element and element.group(1) == base:
        index = _constants(model).eval_text(element.group(2))
        return f"{base}[{'?' if index is None else index}]"
    offset = _offset(text, base)
    for extent in extents if offset else ():
        slot = _slot(offset, extent.strip(), model)
        if slot is not None:
            return f"{base}[{slot}*{extent.strip()}:{slot + 1}*{extent.strip()}]"
    return base


def regions(expr: str | None, extents: Collection[str] = (), model: SourceModel | None = None) -> set[str]:
    """Every region an argument may designate: each arm of a conditional (`it == 0 ? x0 : x`)."""
    return {r for arm in branches(expr or "") if (r := region(arm, extents, model))}


def branches(expr: str) -> list[str]:
    """The arms of a conditional expression (nested ones too), or [expr]."""
    text = strip_parentheses(expr.strip())
    depth, question = 0, -1
    for i, char in enumerate(text):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        if depth:
            continue
        if char == "?" and question < 0:
            question, nested = i, 0
        elif question >= 0 and char == "?":
            nested += 1
        elif question >= 0 and char == ":" and text[i - 1 : i + 2].count(":") == 1:
            if nested:
                nested -= 1
            else:
                return branches(text[question + 1 : i]) + branches(text[i + 1 :])
    return [text]


def strip_parentheses(text: str) -> str:
    while text.startswith("(") and _closing(text) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def _offset(text: str, base: str) -> str | None:
    """`rest` of `base + rest` or of `&base[rest]` (casts of the base allowed), else None."""
    head = re.escape(base)
    m = re.fullmatch(rf"(?:\([^()]*\)\s*)?\(*\s*{head}\s*\)*\s*\+\s*(.+)", text) or \
        re.fullmatch(rf"&\s*\(*\s*{head}\s*\)*\s*\[(.+)\]", text)
    return m.group(1) if m else None


def _slot(offset: str, extent: str, model: SourceModel | None) -> int | None:
    """C when `offset` is C * extent (linear in it), else None; for a kernel that touches a single
    element (extent SINGLE), the offset's constant value."""
    env = _constants(model)
    if extent == SINGLE:
        value = env.eval_text(offset)
        return value if isinstance(value, int) else None
    pattern = rf"(?<![\w.]){re.escape(extent)}(?!\w)" if re.fullmatch(r"[\w.]+", extent) else re.escape(extent)
    if not re.search(pattern, offset):
        return None
    one, two = (env.eval_text(re.sub(pattern, value, offset)) for value in ("1", "2"))
    return one if one is not None and two == 2 * one else None


def _constants(model: SourceModel | None) -> _ts.ConstEnv:
    if model is None:
        return _ts.ConstEnv({})
    return _ts.ConstEnv({**model.macros, **{name: str(value) for name, value in model.constants.items()}})


def overlap(a: str, b: str) -> bool:
    """Whether two regions may share memory."""
    if ANY in (a, b) or a == b:
        return True
    base_a, base_b = a.split("[", 1)[0], b.split("[", 1)[0]
    if base_a != base_b:
        return False
    if "[" not in a or "[" not in b:
        return True  # the whole buffer
    slot_a, slot_b = _SLOT.match(a), _SLOT.match(b)
    if slot_a and slot_b:
        return slot_a["extent"] != slot_b["extent"] or slot_a["slot"] == slot_b["slot"]
    element_a, element_b = _ELEMENT.match(a), _ELEMENT.match(b)
    if element_a and element_b and not (slot_a or slot_b):
        return "?" in (element_a.group(2), element_b.group(2)) or element_a.group(2) == element_b.group(2)
    return True


def pretty(text: str) -> str:
    """A region or expression for people: the analysis's tokens for values it lost (`__wf_any_n_1`)
    shown as the names they stand for (`n`)."""
    return re.sub(rf"{ANY_PREFIX}_(\w+?)_\d+", r"\1", text)
