"""Expansion of ``{name}`` placeholders inside argument lists.

Commands are argument lists, never shell strings. A placeholder that is a whole argument and
names a list splices it (``"{flags}"`` becomes zero or more arguments); inside a longer
argument it is substituted as text (``"-arch={arch}"``). ``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ESCAPED = re.compile(r"\{\{|\}\}")

Value = str | int | float | Sequence[str]


def names_in(template: Sequence[str]) -> set[str]:
    """Every placeholder name used in an argument-list template."""
    return {m.group(1) for arg in template for m in _PLACEHOLDER.finditer(_ESCAPED.sub("", arg))}


def expand(template: Sequence[str], values: Mapping[str, Value]) -> list[str]:
    """Expand a template; raises KeyError naming the first unknown placeholder."""
    out: list[str] = []
    for arg in template:
        whole = _PLACEHOLDER.fullmatch(arg)
        if whole:
            value = values[whole.group(1)]
            if isinstance(value, list | tuple):
                out.extend(str(v) for v in value)
            else:
                out.append(str(value))
            continue
        out.append(_substitute(arg, values))
    return out


def _substitute(arg: str, values: Mapping[str, Value]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        value = values[match.group(1)]
        return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    return re.sub(r"\{\{|\}\}|" + _PLACEHOLDER.pattern, one, arg)
