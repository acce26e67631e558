"""The edit scope of an LLM agent: a working copy of the target's declared sources that changes
only through ``agents.patch.apply`` (which refuses files that are not declared sources and edits
that touch read-only regions), under a limit on the size of the whole diff.

    Workspace.apply(edits) ─► agents.patch.apply on the working copy ─► the diff against the
        original within max_diff_lines? read-only regions byte-identical? ─► kept, or Refused

``check_files`` applies the same rules to a finished proposal's files, whoever made them: the
verification step can run it on every proposal.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from agents.patch import Edit, MarkerError, Patched, Refused, Rule, _diff, apply, readonly_regions


class Workspace:
    """The files an agent edits: ``original`` (path -> text, the declared sources) and the current
    working copy. Line numbers of each edit call refer to the working copy as it is."""

    def __init__(self, original: Mapping[str, str], max_diff_lines: int) -> None:
        self.original = dict(original)
        self.current = dict(original)
        self.max_diff_lines = max_diff_lines

    def apply(self, edits: Sequence[Edit]) -> Patched | Refused:
        patched = apply(self.current, edits, self.original.keys())
        if isinstance(patched, Refused):
            return patched
        new = {**self.current, **dict(patched.files)}
        refused = check_files(self.original, new, self.max_diff_lines)
        if refused is not None:
            return refused
        self.current = new
        return patched

    def reset(self) -> None:
        self.current = dict(self.original)

    def changed(self) -> tuple[tuple[str, str], ...]:
        """The files that differ from the original, in the original's order."""
        return tuple((path, text) for path, text in self.current.items() if text != self.original[path])

    def diff(self) -> tuple[str, int]:
        """The unified diff against the original and its lines added plus removed."""
        return diff_of(self.original, self.current)


def diff_of(original: Mapping[str, str], current: Mapping[str, str]) -> tuple[str, int]:
    diffs, lines = [], 0
    for path, text in current.items():
        if text != original.get(path, ""):
            diff, count = _diff(path, original.get(path, ""), text)
            diffs.append(diff)
            lines += count
    return "".join(diffs), lines


def check_files(original: Mapping[str, str], files: Mapping[str, str], max_diff_lines: int | None) -> Refused | None:
    """Whether replacing ``original`` (the declared sources) by ``files`` keeps the rules: only
    declared sources, every read-only region and its markers byte-identical, and a diff within
    ``max_diff_lines``. None when it does."""
    declared = {posixpath.normpath(path): path for path in original}
    for path, text in files.items():
        source = declared.get(posixpath.normpath(path))
        if source is None:
            return Refused(Rule.NOT_EDITABLE, "not a declared source of the target", path)
        try:
            before = _readonly_text(original[source])
        except MarkerError as exc:
            return Refused(Rule.MARKERS, exc.message, path, exc.line)
        try:
            after = _readonly_text(text)
        except MarkerError as exc:
            return Refused(Rule.READONLY_MARKER, f"the new file's markers are broken: {exc.message}", path, exc.line)
        if before != after:
            changed = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
                           min(len(before), len(after)))
            return Refused(Rule.READONLY, f"read-only region {changed + 1} differs from the original's", path)
    _, lines = diff_of(original, {declared[posixpath.normpath(p)]: t for p, t in files.items()})
    if max_diff_lines is not None and lines > max_diff_lines:
        return Refused(Rule.LIMIT, f"{lines} changed lines, more than the limit of {max_diff_lines}")
    return None


def _readonly_text(text: str) -> list[str]:
    lines = text.split("\n")
    return ["\n".join(lines[begin - 1:end]) for begin, end in readonly_regions(text)]
