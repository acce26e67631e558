"""The unroll expert: a kernel loop without an unroll pragma (or with ``#pragma unroll 1``) gets
one, through agents.patch so that read-only regions stay untouched.

    loop with a constant trip count <= 64 ─► `#pragma unroll` (full unroll)
    any other loop                        ─► `#pragma unroll kWfUnrollN`, searched over WF_UNROLL_N

nvcc does not expand a -D macro inside ``#pragma unroll``, so the factor goes through a constexpr
that the macro initializes. That constexpr and the macro's default go just above the kernel, at
file scope: inserted next to the loop, a declaration would become the body of an unbraced outer
loop or ``if``.
"""

from __future__ import annotations

from dataclasses import replace

from agents._base import AnalysisContext, Proposal
from agents.experts._expert import Expert, source_models
from agents.patch import Edit, InsertBefore, MarkerError, Patched, Replace, apply, readonly_regions, source_files
from agents.source_model import Kernel, Loop, SourceModel
from agents.workflow.steps import Finding, Level, Plan
from cluster.core.encodings import UNROLL_PARAM

MACRO = UNROLL_PARAM
CONSTANT = "kWfUnrollN"
FACTORS = (1, 2, 4, 8, 16)
MAX_FULL_UNROLL = 64  # trip counts up to this are unrolled fully

# Declared once per translation unit however many kernels' loops a stack of variants unrolls: each
# change puts the prelude above its own kernel, so the first in the file comes before every use (on
# an H200, fastWalshTransform's stack of five unrolls in two kernels declared it twice: compile_error).
_DECLARED = f"{MACRO}_DECLARED"
_PRELUDE = (f"#ifndef {MACRO}\n#define {MACRO} 1\n#endif\n"
            f"#ifndef {_DECLARED}\n#define {_DECLARED}\nconstexpr int {CONSTANT} = {MACRO};\n#endif\n")


class UnrollExpert(Expert):
    """One proposal per eligible kernel loop: a full unroll for a small constant trip count, else a
    searched factor (``search_params={"WF_UNROLL_N": FACTORS}``)."""

    name = "unroll"
    level = Level.COMPILER_HINT

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        findings = []
        texts = source_files(context.target)
        for path, model in source_models(context).items():
            text = texts[path]
            try:
                regions = readonly_regions(text)
            except MarkerError as exc:
                why = f"malformed read-only markers: {exc}"
                findings.append(Finding(self.name, self.level, path, False, reason=why))
                continue
            for kernel in model.kernels:
                for loop in kernel.loops:
                    loop = _resolved(model, kernel, loop)
                    where = f"{path}:{loop.span.start_line} in {kernel.name}"
                    count = "run-time trip count" if loop.trip_count is None else f"trip count {loop.trip_count}"
                    pragma = "no unroll pragma" if loop.unroll is None else f"#pragma unroll {loop.unroll.argument}"
                    evidence = (f"`{loop.header}`: {count}, {pragma}",)
                    if _inside(loop, regions):
                        findings.append(Finding(self.name, self.level, where, False, evidence, "in a read-only region"))
                    elif not _eligible(loop, text):
                        findings.append(Finding(self.name, self.level, where, False, evidence,
                                                "already unrolled, or the loop does not start its line"))
                    else:
                        full = loop.trip_count is not None and 0 < loop.trip_count <= MAX_FULL_UNROLL
                        reason = f"{count} is a small constant: unroll fully" if full else f"{count}: search a factor"
                        findings.append(Finding(self.name, self.level, where, True, evidence, reason,
                                                (path, kernel, loop, full), kernel=kernel.name))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        path, kernel, loop, full = finding.detail
        if full:
            change = f"insert `#pragma unroll` above {path}:{loop.span.start_line}"
            return Plan(finding, (change,), detail=finding.detail)
        return Plan(finding, (f"define `constexpr int {CONSTANT} = {MACRO}` above kernel {kernel.name}",
                              f"insert `#pragma unroll {CONSTANT}` above {path}:{loop.span.start_line}"),
                    ((MACRO, FACTORS),), finding.detail)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        path, kernel, loop, full = plan.detail
        files = source_files(context.target)
        if not full and CONSTANT in files[path]:
            return []  # a variant already unrolled by the macro: one factor per file
        patched = apply(files, _edits(path, kernel, loop, files[path].split("\n"), full), context.target.spec.sources)
        return [_proposal(self.name, path, kernel, loop, full, patched)] if isinstance(patched, Patched) else []


def _resolved(model: SourceModel, kernel: Kernel, loop: Loop) -> Loop:
    """`loop` with the trip count its template kernel's instances agree on (`k < BLOCK` with
    every launch giving BLOCK = 8 has 8); as it is when they differ or do not resolve it."""
    if loop.trip_count is not None or loop.trip_param is None:
        return loop
    counts = {other.trip_count for instance in model.instances if instance.name == kernel.name
              for other in instance.loops if other.span == loop.span}
    return replace(loop, trip_count=counts.pop(), trip_param=None) if len(counts) == 1 and None not in counts else loop


def _eligible(loop: Loop, text: str) -> bool:
    """No pragma or `#pragma unroll 1`, and the loop starts its line (a pragma line goes above it)."""
    if loop.unroll is not None and loop.unroll.argument != "1":
        return False
    return not text[text.rfind("\n", 0, loop.span.start) + 1 : loop.span.start].strip()


def _inside(loop: Loop, regions: list[tuple[int, int]]) -> bool:
    return any(begin <= loop.span.end_line and loop.span.start_line <= end for begin, end in regions)


def _edits(path: str, kernel: Kernel, loop: Loop, lines: list[str], full: bool) -> list[Edit]:
    line = lines[loop.span.start_line - 1]
    indent = line[: len(line) - len(line.lstrip())]
    pragma = f"{indent}#pragma unroll" + ("" if full else f" {CONSTANT}")
    edits: list[Edit] = []
    if not full:
        edits.append(InsertBefore(path, kernel.span.start_line, _PRELUDE))
    if loop.unroll is not None:  # replace `#pragma unroll 1`
        edits.append(Replace(path, loop.unroll.line, loop.unroll.line, pragma))
    else:
        edits.append(InsertBefore(path, loop.span.start_line, pragma))
    return edits


def _proposal(agent: str, path: str, kernel: Kernel, loop: Loop, full: bool, patched: Patched) -> Proposal:
    where = f"{path}:{loop.span.start_line} in {kernel.name}: `{loop.header}`"
    if full:
        return Proposal(agent, f"{where}: trip count {loop.trip_count} is a small constant: unroll fully",
                        patched.files)
    count = "a run-time trip count" if loop.trip_count is None else f"trip count {loop.trip_count}"
    return Proposal(agent, f"{where}: {count}: unroll by {CONSTANT} = {MACRO}, searched over {FACTORS}",
                    patched.files, {MACRO: FACTORS})
