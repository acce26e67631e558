"""The edit scope: a working copy that changes only through agents.patch, under a limit on the
whole diff, and the same rules applied to a finished proposal's files."""

from __future__ import annotations

from agents.llm.guard import Workspace, check_files, diff_of
from agents.patch import InsertAfter, Refused, Replace, Rule

SOURCE = """int f(int x) {
  return x + 1;
}
// warpfleet: readonly begin
int timed(void) { return 7; }
// warpfleet: readonly end
"""


def test_edits_accumulate_and_line_numbers_follow_the_working_copy() -> None:
    work = Workspace({"k.c": SOURCE}, max_diff_lines=10)
    assert not isinstance(work.apply([InsertAfter("k.c", 1, "  x *= 2;")]), Refused)
    assert not isinstance(work.apply([Replace("k.c", 3, 3, "  return x + 2;")]), Refused)  # line 3 of the new file
    assert work.current["k.c"].splitlines()[:3] == ["int f(int x) {", "  x *= 2;", "  return x + 2;"]
    diff, lines = work.diff()
    assert lines == 3 and "+  x *= 2;" in diff and "-  return x + 1;" in diff
    work.reset()
    assert work.changed() == ()


def test_readonly_regions_and_undeclared_files_are_refused_by_agents_patch() -> None:
    work = Workspace({"k.c": SOURCE}, max_diff_lines=10)
    refused = work.apply([Replace("k.c", 5, 5, "int timed(void) { return 0; }")])
    assert isinstance(refused, Refused) and refused.rule is Rule.READONLY and refused.line == 5
    other = work.apply([InsertAfter("other.c", 0, "x")])
    assert isinstance(other, Refused) and other.rule is Rule.NOT_EDITABLE
    assert work.current == {"k.c": SOURCE}


def test_the_limit_is_on_the_whole_diff_not_each_call() -> None:
    work = Workspace({"k.c": SOURCE}, max_diff_lines=3)
    assert not isinstance(work.apply([InsertAfter("k.c", 1, "  x += 1;\n  x += 2;")]), Refused)
    refused = work.apply([InsertAfter("k.c", 1, "  x += 3;\n  x += 4;")])
    assert isinstance(refused, Refused) and refused.rule is Rule.LIMIT and "4 changed lines" in refused.reason
    assert work.current["k.c"].count("x +=") == 2  # the refused call changed nothing


def test_check_files_on_a_finished_proposal() -> None:
    original = {"k.c": SOURCE}
    assert check_files(original, {"k.c": SOURCE.replace("x + 1", "x + 2")}, 10) is None
    tampered = check_files(original, {"k.c": SOURCE.replace("return 7", "return 0")}, 10)
    assert tampered is not None and tampered.rule is Rule.READONLY
    unmarked = check_files(original, {"k.c": SOURCE.replace("// warpfleet: readonly end\n", "")}, 10)
    assert unmarked is not None and unmarked.rule is Rule.READONLY_MARKER
    assert check_files(original, {"new.c": "int g;"}, 10).rule is Rule.NOT_EDITABLE  # type: ignore[union-attr]
    assert check_files(original, {"k.c": SOURCE + "int a;\nint b;\n"}, 1).rule is Rule.LIMIT  # type: ignore[union-attr]


def test_diff_of_counts_added_and_removed_lines() -> None:
    diff, lines = diff_of({"k.c": SOURCE}, {"k.c": SOURCE.replace("x + 1", "x + 2")})
    assert lines == 2 and diff.startswith("--- a/k.c\n+++ b/k.c\n")
