"""Stacking (agents.workflow.stack): the accepted changes of several optimizations merged into one
variant, a three-way merge per file; a change that edits the lines another edits is left out with
its reason. On the suite's regpressure, the constant table and the unroll pragma stack, and the
stack passes the verifier's static checks and builds (sm_90, here)."""

from __future__ import annotations

import pytest

from agents._base import AnalysisContext, Proposal
from agents.patch import source_files
from agents.workflow import Level, Steps, run_workflow
from agents.workflow.stack import Part, merge3, stack, stack_plan
from cluster.config import load_target
from cluster.core.registry import EXPERTS
from cluster.core.types import Candidate, Phase
from cluster.engine.verification.verify import LocalVerifier
from cluster.platform.devices import cpu_device
from tests.configs._builds import SUITE_BUILDS, build_once, compile_once
from tests.conftest import REPO, needs

BASE = "".join(f"line {i}\n" for i in range(1, 9))


def edit(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = new
    return "".join(lines)


def test_merge3_keeps_both_edits_of_separate_lines_and_refuses_the_same_line_or_an_insertion_beside_an_edit():
    ours, theirs = edit(BASE, 2, "two\n"), edit(BASE, 6, "six\n")
    assert merge3(BASE, ours, theirs) == edit(edit(BASE, 2, "two\n"), 6, "six\n")
    assert merge3(BASE, ours, edit(BASE, 2, "deux\n")) is None  # the same line, changed otherwise
    # The next line (git calls it a conflict): on an H200, configs/own's dct_tiles lost its padding
    # (the shared array's line) from its stack to restrict's edit of the kernel's signature above it.
    assert merge3(BASE, ours, edit(BASE, 3, "three\n")) == edit(edit(BASE, 2, "two\n"), 3, "three\n")
    assert merge3(BASE, edit(BASE, 3, "three\n"), ours) == edit(edit(BASE, 2, "two\n"), 3, "three\n")
    assert merge3(BASE, ours, ours) == ours  # the same change twice is one change
    inserted = BASE.replace("line 5\n", "#pragma unroll\nline 5\n")
    assert merge3(BASE, ours, inserted) == inserted.replace("line 2\n", "two\n")
    declared = BASE.replace("line 5\n", "#define N 4\nline 5\n")  # two insertions before one line: both, ours first
    assert merge3(BASE, inserted, declared) == BASE.replace("line 5\n", "#pragma unroll\n#define N 4\nline 5\n")
    assert merge3(BASE, inserted, edit(declared, 4, "four\n")) is None  # an insertion beside an edit: a conflict


def test_stack_merges_in_level_order_and_says_what_it_left_out():
    def part(name: str, level: Level, text: str, **params) -> Part:
        return Part(name, level, Proposal(name, "", (("k.cu", text),), {k: tuple(v) for k, v in params.items()}))

    parts = [part("unroll k.cu:6", Level.COMPILER_HINT, edit(BASE, 6, "#pragma unroll N\n"), N=[2, 4]),
             part("constant k.cu:2", Level.KERNEL, edit(BASE, 2, "table\n")),
             part("padding k.cu:2", Level.KERNEL, edit(BASE, 2, "padded\n")),
             part("unroll k.cu:8", Level.COMPILER_HINT, edit(BASE, 8, "#pragma unroll N\n"), N=[8])]
    result = stack({"k.cu": BASE}, parts)
    assert result is not None and result.parts == ("constant k.cu:2", "unroll k.cu:6")  # kernel edits first
    assert dict(result.proposal.files)["k.cu"] == edit(edit(BASE, 2, "table\n"), 6, "#pragma unroll N\n")
    assert result.proposal.search_params == {"N": (2, 4)}
    assert result.left_out == ("padding k.cu:2: it edits lines of k.cu that an earlier change edits",
                               "unroll k.cu:8: its search params ['N'] differ from an earlier change's")
    plan = stack_plan(result, "k")
    assert plan.finding.applies and plan.finding.optimization == "stack" and "left out: padding" in plan.finding.reason
    assert stack({"k.cu": BASE}, parts[:1]) is None  # one change is no stack
    assert stack({"k.cu": BASE}, parts[1:3]) is None  # two that clash: one left, no stack


@pytest.mark.nvcc
@needs("nvcc")
@SUITE_BUILDS  # the baseline's build is shared with the other modules that build it
def test_regpressures_constant_table_and_unroll_stack_verify_and_build():
    target = load_target(REPO / "configs" / "targets" / "regpressure" / "target.yaml")
    baseline = Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash,
                         tuple(target.space.baseline.items()), tuple(target.baseline_params.items()), Phase.BASELINE)
    built = compile_once(target, baseline)
    assert built.result.ok, built.result.tail()
    context = AnalysisContext(target, "sm_90", kernels=built.target_kernels)
    # The variants' builds are those of the workflow's test (tests/cluster/engine/test_workflow_suite.py).
    verifier = LocalVerifier(baseline, cpu_device("test"), run=False, build=build_once)
    outcomes = run_workflow(context, [Steps.of(EXPERTS.load(n)()) for n in ("constant", "unroll")], verifier)
    parts = [Part(f"{o.finding.optimization} {o.finding.location}", o.finding.level, o.proposal)
             for o in outcomes if o.accepted and o.proposal is not None and o.proposal.files]
    assert {p.name.split()[0] for p in parts} == {"constant", "unroll"}
    result = stack(source_files(target), parts)
    assert result is not None and result.parts[0].startswith("constant ") and len(result.parts) >= 2
    text = dict(result.proposal.files)["regpressure.cu"]
    assert "__constant__ float wf_const_series_sum_coef[81];" in text and "#pragma unroll kWfUnrollN" in text
    verification = verifier.verify(context, stack_plan(result, target.name), result.proposal)
    checks = {v.check: v.status.value for v in verification.verdicts}
    assert verification.passed and checks["build"] == "passed" and checks["depgraph"] == "passed", checks
