"""The tools the LLM agents call: schemas every server accepts, and a dispatcher that answers bad
JSON, bad arguments, unknown tools, refused edits and failing tools with a message, never a crash."""

from __future__ import annotations

import json

from agents._base import AnalysisContext
from agents.llm.guard import Workspace
from agents.llm.steps import FinishArgs, _accept_finish
from agents.llm.tools import EDIT_TOOLS, READ_TOOLS, Services, Session, Toolbox, final_tool
from agents.patch import source_files
from agents.workflow.steps import Finding, Level, Plan, Verdict, VerdictStatus, Verification
from cluster.core.types import KernelResources
from cluster.engine.agent_stage import build_report as local_build
from tests.agents.llm.conftest import HONEST_COMPUTE, edit_compute

BOX = Toolbox([*READ_TOOLS, *EDIT_TOOLS, final_tool("finish", "done", FinishArgs, _accept_finish)])


def session(context: AnalysisContext, services: Services | None = None, limit: int = 200) -> Session:
    plan = Plan(Finding("x", Level.KERNEL, "work.c", True), ("change",))
    return Session(context, Workspace(source_files(context.target), limit), services or Services(), plan)


def test_schemas_are_plain_json_schema_without_refs_or_titles() -> None:
    schemas = BOX.schemas()
    assert [s["function"]["name"] for s in schemas][:3] == ["list_files", "read_source", "analyze_source"]
    text = json.dumps(schemas)
    assert "$ref" not in text and "$defs" not in text and '"title"' not in text
    edit = next(s for s in schemas if s["function"]["name"] == "edit")["function"]["parameters"]
    item = edit["properties"]["edits"]["items"]
    assert item["properties"]["op"]["enum"][0] == "insert_before" and set(item["required"]) == {"op", "path"}


def test_bad_calls_get_messages(context: AnalysisContext) -> None:
    s = session(context)
    assert BOX.call(s, "read_source", '{"path": "work.c"').startswith("error: the arguments of read_source are not "
                                                                     "valid JSON")
    assert BOX.call(s, "read_source", "[1, 2]") == "error: the arguments of read_source must be a JSON object, not list"
    assert BOX.call(s, "rm_rf", "{}").startswith("error: there is no tool named 'rm_rf'; the tools are list_files")
    bad = BOX.call(s, "read_source", '{"path": "work.c", "start_line": "first"}')
    assert bad.startswith("error: bad arguments for read_source: start_line: Input should be a valid integer")
    extra = BOX.call(s, "list_files", '{"verbose": true}')
    assert "verbose: Extra inputs are not permitted" in extra
    missing = BOX.call(s, "edit", json.dumps({"edits": [{"op": "replace", "path": "work.c", "start_line": 3}]}))
    assert missing == "error: replace needs start_line, end_line, text; missing end_line, text"
    assert BOX.call(s, "read_source", '{"path": "../etc/passwd"}').startswith("error: ../etc/passwd is not a source")
    assert BOX.call(s, "occupancy", '{"block_size": 256, "registers": 32, "arch": "sm_1"}').startswith(
        "error: occupancy failed: KeyError")
    assert s.workspace.changed() == ()


def test_read_source_numbers_lines_and_marks_readonly_ones(context: AnalysisContext) -> None:
    text = BOX.call(session(context), "read_source", '{"path": "work.c", "start_line": 30, "end_line": 33}')
    assert text.splitlines()[1:] == ["   30 | }", "   31 | ", "   32*| // warpfleet: readonly begin",
                                     "   33*| static double now_ms(void) {"]
    assert "read-only lines: 32-" in BOX.call(session(context), "list_files", "{}")


def test_edits_go_through_the_guard(context: AnalysisContext) -> None:
    s = session(context)
    refused = BOX.call(s, "edit", json.dumps({"edits": [{"op": "replace", "path": "work.c", "start_line": 36,
                                                          "end_line": 36, "text": "    return 0;"}]}))
    assert refused.startswith("refused, nothing changed: work.c:36: edit 0: touches the read-only region")
    applied = BOX.call(s, "edit", json.dumps({"edits": [edit_compute(HONEST_COMPUTE)]}))
    assert applied.startswith("applied: ") and "+    static float s[N + K];" in applied
    assert "changed lines" in BOX.call(s, "show_diff", "{}")
    assert BOX.call(s, "reset", "{}") and s.workspace.changed() == ()


def test_the_diff_limit_is_the_tools(context: AnalysisContext) -> None:
    s = session(context, limit=3)
    answer = BOX.call(s, "edit", json.dumps({"edits": [edit_compute(HONEST_COMPUTE)]}))
    assert answer.startswith("refused, nothing changed: ")
    assert "4 changed lines, more than the limit of 3 [limit]" in answer


def test_finish_needs_a_change_and_keeps_the_rules(context: AnalysisContext) -> None:
    s = session(context)
    assert BOX.call(s, "finish", '{"description": "x"}').startswith("error: nothing to propose")
    assert BOX.call(s, "finish", '{"description": "x", "search": {"2BAD": [1]}}').startswith("error: bad arguments")
    assert not s.finished
    assert BOX.call(s, "finish", '{"description": "a search only", "search": {"TILE": [16, 32]}}') == "received"
    assert s.finished and s.final.search == {"TILE": [16, 32]}


def test_build_verify_profile_use_their_services(context: AnalysisContext) -> None:
    s = session(context)
    assert "not available" in BOX.call(s, "build", "{}") and "not available" in BOX.call(s, "profile", "{}")
    seen = []

    def verify(ctx, plan, proposal):  # type: ignore[no-untyped-def]
        seen.append(proposal.files)
        return Verification((Verdict("outputs", VerdictStatus.FAILED, "out.bin: 3 values differ"),))

    s = session(context, Services(build=local_build, verify=verify))
    assert BOX.call(s, "verify", "{}") == "nothing to verify: no changes yet"
    BOX.call(s, "edit", json.dumps({"edits": [edit_compute(HONEST_COMPUTE)]}))
    assert BOX.call(s, "build", "{}") == "build ok"
    assert BOX.call(s, "verify", "{}") == "FAILED\noutputs: failed: out.bin: 3 values differ"
    assert seen and dict(seen[0])["work.c"].count("static float s[N + K];") == 1
    BOX.call(s, "edit", json.dumps({"edits": [{"op": "replace_text", "path": "work.c", "old": "s[j] = sinf",
                                               "new": "s[j] = no_such_function"}]}))
    broken = BOX.call(s, "build", "{}")
    assert broken.startswith("build failed (compile_error)") and "no_such_function" in broken
    assert "/build-" not in broken  # scratch paths are not the model's business (and would spoil replays)


def test_occupancy_and_resources(context: AnalysisContext) -> None:
    import dataclasses

    answer = BOX.call(session(context), "occupancy", '{"block_size": 256, "registers": 94, "arch": "sm_90"}')
    assert answer.startswith("theoretical occupancy 25% (2 blocks, 16 of 64 warps per SM), limited by registers")
    assert "<= 64 registers: 50%" in answer
    rich = dataclasses.replace(context, kernels=(KernelResources("k", "sm_90", registers=40, spill_stores=8),),
                               metrics={"sm__warps_active.avg.pct_of_peak_sustained_active": 31.5})
    text = BOX.call(session(rich), "kernel_resources", "{}")
    assert "k: 40 registers, 8 B spill stores" in text and "sm__warps_active" in text
    assert "baseline median 21.0 ms" in text

