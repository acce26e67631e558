"""Patch tools for the code-transformation step: agents describe source edits as values, and
``apply`` checks them against the target's rules and returns the new files with their diff.

    edits ─► apply(files, edits, editable) ─► Patched (new files, diff) ─► Variant ─► variant_bundle
                                          └─► Refused (file:line: what [rule])

Every edit's line numbers refer to the original file, whatever the other edits of the call do;
a call's edits are applied all or none; ``apply`` never mutates its input, so reverting a variant
is keeping the original mapping. Lines from ``// warpfleet: readonly begin`` to
``// warpfleet: readonly end`` (or the ``/* ... */`` forms), markers included, hold a target's
timing and verification code: no edit may touch them or their markers.
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import json
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath

from cluster.config import Target
from cluster.config.target import variant_bundle, variant_target  # a target's variants: the config's

__all__ = [
    "Delete", "Edit", "InsertAfter", "InsertAtAnchor", "InsertBefore", "MarkerError", "Patched", "Refused",
    "Replace", "ReplaceText", "Rule", "Variant", "apply", "readonly_regions", "source_files", "unified_diff",
    "variant_bundle", "variant_target",
]


# Edits. Inserted and replacing text is whole lines: a final newline is added where missing.

@dataclass(frozen=True)
class InsertBefore:
    """Insert ``text`` before line ``line`` (1-based); the last line + 1 appends."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class InsertAfter:
    """Insert ``text`` after line ``line`` (1-based); line 0 inserts at the top."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class InsertAtAnchor:
    """Insert ``text`` after the last line (``after``) or before the first line of a match of
    ``anchor``, an exact substring: its ``occurrence``-th match, or with ``None`` its only one."""

    path: str
    anchor: str
    text: str
    after: bool = True
    occurrence: int | None = 1


@dataclass(frozen=True)
class Replace:
    """Replace lines ``start_line`` to ``end_line`` (1-based, inclusive) with ``text``."""

    path: str
    start_line: int
    end_line: int
    text: str


@dataclass(frozen=True)
class ReplaceText:
    """Replace every occurrence of ``old`` with ``new``; ``old`` must occur exactly ``count`` times
    (non-overlapping, as ``str.count`` counts). The lines it touches count as the edit's lines."""

    path: str
    old: str
    new: str
    count: int = 1


@dataclass(frozen=True)
class Delete:
    """Delete lines ``start_line`` to ``end_line`` (1-based, inclusive)."""

    path: str
    start_line: int
    end_line: int


Edit = InsertBefore | InsertAfter | InsertAtAnchor | Replace | ReplaceText | Delete


class Rule(StrEnum):
    """Why an edit was refused."""

    PATH = "path"  # empty, absolute or with a `..` part
    NOT_EDITABLE = "not_editable"  # not a declared source, or not among the files given
    LINE_RANGE = "line_range"
    ANCHOR = "anchor"  # not found, ambiguous, or no such occurrence
    TEXT_COUNT = "text_count"  # ReplaceText's old text occurs another number of times
    OVERLAP = "overlap"  # two edits touch a common original line
    READONLY = "readonly"
    READONLY_MARKER = "readonly_marker"  # would remove, alter or add a readonly marker
    MARKERS = "markers"  # the source's own markers are unbalanced, nested or malformed
    LIMIT = "limit"  # more changed lines than max_changed_lines
    NO_CHANGE = "no_change"


@dataclass(frozen=True)
class Refused:
    """An edit call that changed nothing, and why: ``reason`` is one line naming file, line and rule."""

    rule: Rule
    message: str
    path: str | None = None
    line: int | None = None
    edit: int | None = None  # the index of the offending edit in the call

    @property
    def reason(self) -> str:
        where = ":".join(str(part) for part in (self.path, self.line) if part is not None)
        which = f"edit {self.edit}: " if self.edit is not None else ""
        return f"{where + ': ' if where else ''}{which}{self.message} [{self.rule}]"

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Patched:
    """The result of an edit call: the changed files only (paths as in the input), their unified
    diff (``a/path``, ``b/path``: applies with ``patch -p1``), and lines added plus removed."""

    files: tuple[tuple[str, str], ...]
    diff: str
    changed_lines: int


class MarkerError(ValueError):
    """A source's readonly markers are unbalanced, nested or malformed (an error of the source)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


class _Refusal(Exception):
    """Carries a ``Refused`` out of the checks; ``apply`` returns it as a value."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.reason)
        self.refused = refused


_MENTION = re.compile(r"warpfleet:\s*readonly\s+(?:begin|end)\b")
_MARKER = re.compile(r"\s*(?://\s*warpfleet:\s*readonly\s+(begin|end)\b.*"
                     r"|/\*\s*warpfleet:\s*readonly\s+(begin|end)\s*\*/\s*)")


def _split(text: str) -> list[str]:
    """Lines with their newlines, split at "\\n" only (``str.splitlines`` splits at form feeds too,
    which would disagree with editors' and ``patch``'s line numbers)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def readonly_regions(text: str) -> list[tuple[int, int]]:
    """The read-only regions of a source as (begin marker line, end marker line), 1-based and
    inclusive. A line that mentions a marker must be one, on its own line (so that a typo cannot
    leave code unprotected); unbalanced, nested or malformed markers raise ``MarkerError``."""
    regions: list[tuple[int, int]] = []
    begin: int | None = None
    for number, line in enumerate(_split(text), 1):
        if not _MENTION.search(line):
            continue
        match = _MARKER.fullmatch(line.rstrip("\r\n"))
        if match is None:
            raise MarkerError(number, "a readonly marker must stand alone on its line")
        if (match.group(1) or match.group(2)) == "begin":
            if begin is not None:
                raise MarkerError(number, f"readonly begin inside the region begun at line {begin}")
            begin = number
        elif begin is None:
            raise MarkerError(number, "readonly end without a begin")
        else:
            regions.append((begin, number))
            begin = None
    if begin is not None:
        raise MarkerError(begin, "readonly begin without an end")
    return regions


@dataclass(frozen=True)
class _Hunk:
    """Original lines [start, end) (0-based) replaced by ``lines``; an insertion has start == end."""

    start: int
    end: int
    lines: tuple[str, ...]
    edit: int


class _Source:
    def __init__(self, path: str, text: str) -> None:
        self.path, self.text, self.lines = path, text, _split(text)
        self.starts = [0]  # the offset of each line
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line))

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1

    def where(self, spans: list[tuple[int, int]]) -> str:
        """How often and where (the first lines) a text occurs, for a refusal."""
        lines = ", ".join(str(self.line_of(start) + 1) for start, _ in spans[:5])
        return f"{len(spans)} times" + (f" (lines {lines}{', ...' if len(spans) > 5 else ''})" if spans else "")

    def first_line(self, spans: list[tuple[int, int]]) -> int | None:
        return self.line_of(spans[0][0]) + 1 if spans else None

    def refuse(self, rule: Rule, message: str, line: int | None, edit: int) -> _Refusal:
        return _Refusal(Refused(rule, message, self.path, line, edit))


def _text_lines(text: str) -> tuple[str, ...]:
    return tuple(_split(text if not text or text.endswith("\n") else text + "\n"))


def _occurrences(text: str, sub: str) -> list[tuple[int, int]]:
    spans, at = [], text.find(sub)
    while at >= 0:
        spans.append((at, at + len(sub)))
        at = text.find(sub, at + len(sub))
    return spans


def _to_hunks(edit: Edit, index: int, src: _Source) -> list[_Hunk]:
    """The edit as hunks of the original file; a line, anchor or count that does not fit refuses."""
    n = len(src.lines)
    match edit:
        case InsertBefore() | InsertAfter():
            gap = edit.line - 1 if isinstance(edit, InsertBefore) else edit.line
            if not 0 <= gap <= n:
                raise src.refuse(Rule.LINE_RANGE, f"line {edit.line} is outside the file ({n} lines)", None, index)
            return [_Hunk(gap, gap, _text_lines(edit.text), index)]
        case Replace() | Delete():
            first, last = edit.start_line, edit.end_line
            if not 1 <= first <= last <= n:
                raise src.refuse(Rule.LINE_RANGE, f"lines {first}-{last} are not a range of the file's {n} lines",
                                 None, index)
            return [_Hunk(first - 1, last, _text_lines(edit.text) if isinstance(edit, Replace) else (), index)]
        case InsertAtAnchor():
            spans = _occurrences(src.text, edit.anchor) if edit.anchor else []
            wanted = 1 if edit.occurrence is None else edit.occurrence
            if (edit.occurrence is None and len(spans) > 1) or not 1 <= wanted <= len(spans):
                needs = "must occur once" if edit.occurrence is None else f"has no occurrence {wanted}"
                raise src.refuse(Rule.ANCHOR, f"anchor {edit.anchor!r} occurs {src.where(spans)}, {needs}",
                                 src.first_line(spans), index)
            start, end = spans[wanted - 1]
            gap = src.line_of(end - 1) + 1 if edit.after else src.line_of(start)
            return [_Hunk(gap, gap, _text_lines(edit.text), index)]
        case ReplaceText():
            spans = _occurrences(src.text, edit.old) if edit.old else []
            if len(spans) != edit.count or edit.count < 1:
                raise src.refuse(Rule.TEXT_COUNT, f"{edit.old!r} occurs {src.where(spans)}, expected exactly "
                                 f"{edit.count}", src.first_line(spans), index)
            return _text_hunks(src, spans, edit.new, index)
    raise TypeError(f"not an edit: {edit!r}")


def _text_hunks(src: _Source, spans: list[tuple[int, int]], new: str, index: int) -> list[_Hunk]:
    """One hunk per run of lines that the occurrences touch (occurrences sharing a line merge)."""
    groups: list[list[tuple[int, int]]] = []
    for span in spans:
        if groups and src.line_of(span[0]) <= src.line_of(groups[-1][-1][1] - 1):
            groups[-1].append(span)
        else:
            groups.append([span])
    hunks = []
    for group in groups:
        first, last = src.line_of(group[0][0]), src.line_of(group[-1][1] - 1)
        at, pieces = src.starts[first], []
        for start, end in group:
            pieces += [src.text[at:start], new]
            at = end
        pieces.append(src.text[at:src.starts[last] + len(src.lines[last])])
        hunks.append(_Hunk(first, last + 1, tuple(_split("".join(pieces))), index))
    return hunks


def _check(src: _Source, hunks: list[_Hunk]) -> list[_Hunk]:
    """Refuses hunks that touch a read-only region or its markers, or overlap; returns them in
    the order they apply (an insertion at a replaced range's first line goes before it)."""
    try:
        regions = readonly_regions(src.text)
    except MarkerError as exc:
        raise _Refusal(Refused(Rule.MARKERS, exc.message, src.path, exc.line)) from None
    for hunk in hunks:
        if any(_MENTION.search(line) for line in hunk.lines):
            raise src.refuse(Rule.READONLY_MARKER, "would add a readonly marker", hunk.start + 1, hunk.edit)
        for begin, end in regions:  # 1-based lines of the markers: 0-based [begin - 1, end)
            if hunk.start == hunk.end and begin - 1 < hunk.start < end:
                raise src.refuse(Rule.READONLY, f"inserts inside the read-only region at lines {begin}-{end}",
                                 hunk.start + 1, hunk.edit)
            if hunk.start < end and begin - 1 < hunk.end:
                touched = [m for m in (begin, end) if hunk.start < m <= hunk.end]
                if touched:
                    raise src.refuse(Rule.READONLY_MARKER, f"would remove or alter the readonly marker at line "
                                     f"{touched[0]}", touched[0], hunk.edit)
                raise src.refuse(Rule.READONLY, f"touches the read-only region at lines {begin}-{end}",
                                 max(hunk.start + 1, begin), hunk.edit)
    ordered = sorted(hunks, key=lambda h: (h.start, h.start != h.end, h.edit))
    reach, holder = 0, -1  # the end of the lines replaced so far (sorted: the last hunk's), and its edit
    for hunk in ordered:
        if hunk.start < reach:
            raise src.refuse(Rule.OVERLAP, f"overlaps edit {holder}", hunk.start + 1, hunk.edit)
        reach, holder = hunk.end, hunk.edit
    return ordered


def _assemble(src: _Source, ordered: list[_Hunk]) -> str:
    out: list[str] = []
    at = 0
    for hunk in ordered:
        out += src.lines[at:hunk.start]
        out += hunk.lines
        at = hunk.end
    out += src.lines[at:]
    # A last line without a newline that is no longer last gets one.
    return "".join(line if line.endswith("\n") or i == len(out) - 1 else line + "\n" for i, line in enumerate(out))


def unified_diff(path: str, old: str, new: str) -> str:
    """``old`` -> ``new`` of ``path`` as a ``git apply``-able unified diff (a/ and b/ prefixes)."""
    return _diff(path, old, new)[0]


def _diff(path: str, old: str, new: str) -> tuple[str, int]:
    """The unified diff and the number of lines added plus removed."""
    a, b = _split(old), _split(new)
    lines = []
    for line in difflib.unified_diff(a, b, f"a/{path}", f"b/{path}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    opcodes = difflib.SequenceMatcher(None, a, b).get_opcodes()  # what unified_diff groups
    return "".join(lines), sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in opcodes if tag != "equal")


def _source_key(edit: Edit, index: int, files: Mapping[str, str], editable: set[str]) -> str:
    path = edit.path
    if not path or PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
        raise _Refusal(Refused(Rule.PATH, f"{path!r} is not a relative path inside the target", path, None, index))
    norm = posixpath.normpath(path)
    if norm not in editable:
        raise _Refusal(Refused(Rule.NOT_EDITABLE, "not a declared source of the target", norm, None, index))
    keys = [key for key in files if posixpath.normpath(key) == norm]
    if not keys:
        raise _Refusal(Refused(Rule.NOT_EDITABLE, "not among the files given", norm, None, index))
    return keys[0]


def apply(files: Mapping[str, str], edits: Sequence[Edit], editable: Collection[str],
          max_changed_lines: int | None = None) -> Patched | Refused:
    """Apply ``edits`` to ``files`` (path -> text) all together, or refuse them all.

    ``editable`` is the target's declared sources; each edit's lines refer to the original file.
    Returns the changed files with their diff, or a ``Refused`` naming the file, line and rule.
    """
    try:
        return _apply(files, edits, {posixpath.normpath(path) for path in editable}, max_changed_lines)
    except _Refusal as refusal:
        return refusal.refused


def _apply(files: Mapping[str, str], edits: Sequence[Edit], editable: set[str],
           max_changed_lines: int | None) -> Patched:
    sources: dict[str, _Source] = {}
    hunks: dict[str, list[_Hunk]] = {}
    for index, edit in enumerate(edits):
        key = _source_key(edit, index, files, editable)
        src = sources.setdefault(key, _Source(key, files[key]))
        hunks.setdefault(key, []).extend(_to_hunks(edit, index, src))
    changed, diffs, count = [], [], 0
    for key in files:  # in the caller's order
        if key in hunks:
            new = _assemble(sources[key], _check(sources[key], hunks[key]))
            if new != files[key]:
                diff, lines = _diff(key, files[key], new)
                changed.append((key, new))
                diffs.append(diff)
                count += lines
    if not changed:
        raise _Refusal(Refused(Rule.NO_CHANGE, "the edits change nothing"))
    if max_changed_lines is not None and count > max_changed_lines:
        names = ", ".join(key for key, _ in changed)
        raise _Refusal(Refused(Rule.LIMIT, f"{names}: {count} changed lines, more than the limit of "
                               f"{max_changed_lines}"))
    return Patched(tuple(changed), "".join(diffs), count)


@dataclass(frozen=True)
class Variant:
    """A kept source variant: the files it replaces, its diff against its parent, why it was made,
    and its parent's hash (the target's ``bundle.hash``, or another variant's ``hash``)."""

    files: tuple[tuple[str, str], ...]
    diff: str
    description: str
    parent: str

    @classmethod
    def of(cls, patched: Patched, description: str, parent: str) -> Variant:
        return cls(patched.files, patched.diff, description, parent)

    @property
    def hash(self) -> str:
        """A hash of the content (parent and files), the same in every process: variants that
        reach the same files from the same parent share it, whatever their description."""
        payload = json.dumps([self.parent, sorted(self.files)], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def source_files(target: Target) -> dict[str, str]:
    """The target's declared sources as text: the ``files`` that ``apply`` edits."""
    contents = dict(target.bundle.files)
    return {path: contents[path].decode("utf-8", "surrogateescape") for path in target.spec.sources}
