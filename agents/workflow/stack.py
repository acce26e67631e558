"""Stacking: the verified changes of several optimizations as one variant, as a performance
engineer applies them one after the other.

    accepted proposals (each a change to the baseline's files) ─► a three-way merge per file, in
        order: kernel-level changes, then hints, then the application's ─► one Proposal whose
        search params are theirs together ─► verified like any other (step 4)

A change that does not merge cleanly with those before it (it edits the same line, or inserts
beside one another changes) is left out, with the reason. The sweep measures the stack beside each
change alone, so a stack that is slower than its best part is simply not selected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from agents._base import Proposal
from agents.workflow.steps import Finding, Level, Plan

OPTIMIZATION = "stack"
# Source edits first, those of the kernels' code before the hints that annotate it, the
# application's launch order last (a hint's pragma above a line that a kernel edit rewrites
# conflicts: the edit is kept).
_ORDER = {Level.KERNEL: 0, Level.COMPILER_HINT: 1, Level.APPLICATION: 2, Level.COMPILER_OPTION: 3}


@dataclass(frozen=True)
class Part:
    """One accepted change: what it was (``optimization location``), its level, its proposal."""

    name: str
    level: Level
    proposal: Proposal


@dataclass(frozen=True)
class Stack:
    proposal: Proposal
    parts: tuple[str, ...]  # the names of the changes in it
    left_out: tuple[str, ...]  # "name: why", for each change that did not merge


def merge3(base: str, ours: str, theirs: str) -> str | None:
    """``ours`` and ``theirs``, two edits of ``base``, in one text; None where they touch the same
    lines of ``base`` differently, or one inserts beside a line the other changes. Two insertions
    at the same place, and nothing else there, are both kept, ours first: declarations put before
    the same kernel (the verifier's build says whether they go together)."""
    lines = base.splitlines(keepends=True)

    def hunks(text: str) -> list[tuple[int, int, list[str]]]:
        other = text.splitlines(keepends=True)
        return [(i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2
                in SequenceMatcher(None, lines, other, autojunk=False).get_opcodes() if tag != "equal"]

    def touch(a: tuple[int, int, list[str]], b: tuple[int, int, list[str]]) -> bool:
        """Whether two hunks touch: they overlap, or one inserts beside the other. Two that replace
        lines next to each other do not (a kernel's signature and the shared array declared below it:
        the merged variant is built and verified as any other)."""
        replaced = a[0] < a[1] and b[0] < b[1]
        return a[0] < b[1] and b[0] < a[1] if replaced else a[0] <= b[1] and b[0] <= a[1]

    mine, yours = hunks(ours), hunks(theirs)
    kept = list(mine)
    for start, end, new in yours:
        clash = [h for h in mine if touch(h, (start, end, new))]
        if clash == [(start, end, new)]:
            continue  # the same change twice
        if len(clash) == 1 and clash[0][:2] == (start, start) and start == end:  # both insert here, nothing else
            kept[kept.index(clash[0])] = (start, end, clash[0][2] + new)
            continue
        if clash:
            return None
        kept.append((start, end, new))
    out, at = [], 0
    for start, end, new in sorted(kept, key=lambda h: (h[0], h[1])):
        out += lines[at:start] + new
        at = end
    return "".join(out + lines[at:])


def stack(base: Mapping[str, str], parts: Sequence[Part]) -> Stack | None:
    """The parts' changes to the files ``base`` (path -> text) merged in level order, or None where
    fewer than two changes merge. The search params are the parts' together."""
    ordered = sorted((p for p in parts if p.proposal.files), key=lambda p: _ORDER.get(p.level, 9))
    files: dict[str, str] = {}
    names, left_out = [], []
    params: dict[str, tuple[int | float | str, ...]] = {}
    for part in ordered:
        merged = dict(files)
        problem = ""
        for path, text in part.proposal.files:
            if path not in base:
                problem = f"{path} is a new file"
                break
            result = merge3(base[path], merged.get(path, base[path]), text)
            if result is None:
                problem = f"it edits lines of {path} that an earlier change edits"
                break
            merged[path] = result
        clash = set(part.proposal.search_params) & set(params)
        if not problem and any(params[p] != part.proposal.search_params[p] for p in clash):
            problem = f"its search params {sorted(clash)} differ from an earlier change's"
        if problem:
            left_out.append(f"{part.name}: {problem}")
            continue
        files = merged
        names.append(part.name)
        params.update(part.proposal.search_params)
    if len(names) < 2:
        return None
    description = f"stack of {len(names)} verified changes: {'; '.join(names)}"
    return Stack(Proposal(OPTIMIZATION, description, tuple(sorted(files.items())), params), tuple(names),
                 tuple(left_out))


def stack_plan(result: Stack, location: str) -> Plan:
    """The finding and plan that a stack is verified and recorded under."""
    reason = f"{len(result.parts)} accepted changes merge: {'; '.join(result.parts)}" + (
        f" (left out: {'; '.join(result.left_out)})" if result.left_out else "")
    finding = Finding(OPTIMIZATION, Level.KERNEL, location, True, tuple(result.parts), reason)
    return Plan(finding, tuple(f"apply {name}" for name in result.parts), tuple(result.proposal.search_params.items()))
