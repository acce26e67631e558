"""The vectorizing expert's code: a `Candidate` loop (what agents.experts.vectorize found) rewritten.

    one element at a time                       grid-stride
    {                                           {
      T wf_v = S;                                 if (aligned(p) && ...) {
      if (aligned(p + B + wf_v) && ...)              for (T wf_g = S; wf_g < E / W; wf_g += STRIDE) { chunk }
        for (; wf_v + W - 1 < E; wf_v += W)          for (T v = E / W * W + S; v < E; v += STRIDE) body
          { chunk }                               } else {
      for (T v = wf_v; v < E; ++v) body              for (T v = S; v < E; v += STRIDE) body
    }                                             }
                                                }
    chunk: a vector load of each array read, the body once per lane (`T v = ...; body` with each
    p[B + v] read as wf_p[wf_j]) in an unrolled loop, a vector store of each array written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents._ts import Node

_LANES = ("x", "y", "z", "w")


@dataclass(frozen=True)
class Candidate:
    """A loop the expert can vectorize, and what the rewrite needs of it."""

    loop: Node
    variable: str
    type: str  # of the loop variable
    start: str
    end: str
    stride: str | None  # None: one element at a time; else the grid-stride loop's step
    offset: str  # B of every access `p[B + v]`, "" for none
    element: str
    vector: str
    accesses: tuple[tuple[Node, str, bool], ...]  # (subscript, pointer, is a store)

    @property
    def width(self) -> int:
        return 2 if self.vector.endswith("2") else 4

    @property
    def readers(self) -> list[str]:
        stores = {id(n) for n, _, store in self.accesses if store and _compound(n)}
        return list(dict.fromkeys(p for n, p, store in self.accesses if not store or id(n) in stores))

    @property
    def writers(self) -> list[str]:
        return list(dict.fromkeys(p for _, p, store in self.accesses if store))


def _compound(access: Node) -> bool:
    """`p[i] += x` (and `++p[i]`) read what they write."""
    parent = access.parent
    operator = parent.child_by_field_name("operator") if parent is not None else None
    return parent is not None and (parent.type == "update_expression" or (
        parent.type == "assignment_expression" and operator is not None and operator.type != "="))


def rewrite(found: Candidate, source: bytes) -> str:
    """The text that replaces the candidate's loop statement (which starts its line)."""
    body = found.loop.child_by_field_name("body")
    line_start = source.rfind(b"\n", 0, found.loop.start_byte) + 1
    indent = _text(source, line_start, found.loop.start_byte)
    indent = indent[: len(indent) - len(indent.lstrip())]
    original = _text(source, body.start_byte, body.end_byte)
    lanes = _lanes(found, source)
    lines = (_contiguous if found.stride is None else _grid_stride)(found, original, lanes)
    return "\n".join(line if i == 0 or not line else indent + line for i, line in enumerate("\n".join(lines)
                                                                                             .split("\n")))


def _nested(original: str, depth: str) -> str:
    """A body as written, its lines after the first moved `depth` further in."""
    first, *rest = original.split("\n")
    return "\n".join([first, *(depth + line if line.strip() else line for line in rest)])


def _text(source: bytes, start: int, end: int) -> str:
    return source[start:end].decode("utf-8", "surrogateescape")


def _lanes(found: Candidate, source: bytes) -> str:
    """The body with each `p[B + v]` read as the lane's copy `wf_p[wf_j]`."""
    body = found.loop.child_by_field_name("body")
    out, at = [], body.start_byte
    for node, pointer, _ in sorted(found.accesses, key=lambda a: a[0].start_byte):
        out += [_text(source, at, node.start_byte), f"wf_{pointer}[wf_j]"]
        at = node.end_byte
    out.append(_text(source, at, body.end_byte))
    text = "".join(out)
    return text[1:-1].strip("\n").rstrip() if body.type == "compound_statement" else text


def _aligned(pointers: list[str], at: str) -> str:
    return " && ".join(f"reinterpret_cast<unsigned long long>({p}{at}) % 16 == 0" for p in pointers)


def _chunk(found: Candidate, lanes: str, element: str, first: str, indent: str) -> list[str]:
    """Loads, the lanes, stores, for the chunk whose first element is `p[element]` (lane 0's v
    is `first`)."""
    width, vector = found.width, found.vector
    lines = []
    for p in found.readers:
        lines += [f"const {vector} wf_{p}{width} = *reinterpret_cast<const {vector}*>(&{p}[{element}]);",
                  f"{found.element} wf_{p}[{width}] = {{{', '.join(f'wf_{p}{width}.{c}' for c in _LANES[:width])}}};"]
    lines += [f"{found.element} wf_{p}[{width}];" for p in found.writers if p not in found.readers]
    declared = [f"    {found.type} {found.variable} = {first} + wf_j;"] if re.search(
        rf"\b{re.escape(found.variable)}\b", lanes) else []
    lines += ["#pragma unroll", f"for (int wf_j = 0; wf_j < {width}; ++wf_j) {{", *declared,
              *_indented(lanes, "    "), "}"]
    lines += [f"*reinterpret_cast<{vector}*>(&{p}[{element}]) = make_{vector}("
              f"{', '.join(f'wf_{p}[{k}]' for k in range(width))});" for p in found.writers]
    return [indent + line if not line.startswith("#") else line for line in lines]


def _indented(text: str, indent: str) -> list[str]:
    lines = text.split("\n")
    common = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return [indent + line[common:] if line.strip() else "" for line in lines]


def _contiguous(found: Candidate, original: str, lanes: str) -> list[str]:
    v, width, pointers = found.variable, found.width, list(dict.fromkeys(p for _, p, _ in found.accesses))
    base = f"{found.offset} + " if found.offset else ""
    at = f" + ({found.offset}) + wf_v" if found.offset else " + wf_v"
    lines = [f"{{  // warpfleet vectorize: {width} iterations of {v} at a time as {found.vector} where aligned",
             f"    {found.type} wf_v = {found.start};",
             f"    if ({_aligned(pointers, at)}) {{",
             f"        for (; wf_v + {width - 1} < ({found.end}); wf_v += {width}) {{",
             *_chunk(found, lanes, f"{base}wf_v", "wf_v", " " * 12),
             "        }", "    }",
             f"    for ({found.type} {v} = wf_v; {v} < {found.end}; ++{v}) {_nested(original, '  ')}", "}"]
    return lines


def _grid_stride(found: Candidate, original: str, lanes: str) -> list[str]:
    v, width, pointers = found.variable, found.width, list(dict.fromkeys(p for _, p, _ in found.accesses))
    end, stride = f"({found.end})", found.stride
    lines = [f"{{  // warpfleet vectorize: groups of {width} elements as {found.vector} where aligned",
             f"    if ({_aligned(pointers, '')}) {{",
             f"        for ({found.type} wf_g = {found.start}; wf_g < {end} / {width}; wf_g += {stride}) {{",
             *_chunk(found, lanes, f"wf_g * {width}", f"wf_g * {width}", " " * 12),
             "        }",
             f"        for ({found.type} {v} = {end} / {width} * {width} + ({found.start}); {v} < {end}; "
             f"{v} += {stride}) {_nested(original, '      ')}",
             "    } else {",
             f"        for ({found.type} {v} = {found.start}; {v} < {found.end}; {v} += {stride}) "
             f"{_nested(original, '      ')}",
             "    }", "}"]
    return lines
