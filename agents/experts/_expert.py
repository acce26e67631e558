"""The base of rule-based experts: one agent doing steps 1-3 of the workflow for one optimization.

``propose`` (the ``Agent`` contract) is the three steps in a row, for callers that want proposals
without the workflow's bookkeeping.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass

from agents import _ts
from agents._base import Agent, AnalysisContext, Proposal
from agents._ts import Node
from agents.cuda_source import analyze
from agents.patch import Edit, Patched, Replace, source_files
from agents.source_model import Kernel, SourceModel
from agents.workflow.steps import Analyst, Level, Plan, Planner, Transformer


def source_models(context: AnalysisContext) -> dict[str, SourceModel]:
    """Each source of the target analysed as the baseline builds it: its params as -D defines,
    so that constants, template arguments and the loops and tiles they size resolve."""
    return {path: analyze(text, path, defines=defines(context)) for path, text in source_files(context.target).items()}


def defines(context: AnalysisContext) -> dict[str, str]:
    return {name: str(value) for name, value in context.target.baseline_params.items()}


def kernel_node(model: SourceModel, kernel: Kernel) -> Node:
    """The definition of `kernel` in `model`'s syntax tree."""
    return next(n for n in _ts.walk(model.root) if n.type == "function_definition"
                and _ts.declared_name(n.child_by_field_name("declarator")) == kernel.name
                and n.start_point[0] + 1 >= kernel.span.start_line)


def instance_label(kernel: Kernel) -> str:
    """`mm<BLOCK_SIZE=32>` for a template kernel's instance, else the kernel's name."""
    if not kernel.template_values:
        return kernel.name
    return f"{kernel.name}<{', '.join(f'{name}={value}' for name, value in kernel.template_values)}>"


def patched_proposal(agent: str, plan: Plan) -> Proposal:
    """The proposal of a plan whose detail is the patch its analysis made already (the analysis
    patches to learn whether the patch tools accept it): the finding's reason and the diff."""
    patched: Patched = plan.detail
    return Proposal(agent, f"{plan.finding.reason}\n{patched.diff}", patched.files)


class Expert(Agent, Analyst, Planner, Transformer):
    name: str
    level: Level

    def propose(self, context: AnalysisContext) -> list[Proposal]:
        proposals: list[Proposal] = []
        for finding in self.analyse(context):
            if finding.applies and (plan := self.plan(context, finding)) is not None:
                proposals += self.transform(context, plan)
        return proposals


@dataclass(frozen=True)
class Change:
    """Replace bytes [start, end) of the source with `text`."""

    start: int
    end: int
    text: str


def line_edits(path: str, source: bytes, changes: list[Change]) -> list[Edit]:
    """Byte replacements as `Replace`s of whole lines (changes on common lines merged)."""
    starts = [0] + [i + 1 for i, b in enumerate(source) if b == 0x0A]

    def line_of(offset: int) -> int:  # 1-based
        return bisect.bisect_right(starts, offset)

    groups: list[list[Change]] = []
    for change in sorted(changes, key=lambda c: c.start):
        if groups and line_of(change.start) <= line_of(max(groups[-1][-1].end - 1, groups[-1][-1].start)):
            groups[-1].append(change)
        else:
            groups.append([change])
    edits: list[Edit] = []
    for group in groups:
        first, last = line_of(group[0].start), line_of(max(group[-1].end - 1, group[-1].start))
        begin = starts[first - 1]
        end = starts[last] - 1 if last < len(starts) else len(source)
        out, at = [], begin
        for change in group:
            out += [source[at:change.start].decode("utf-8", "surrogateescape"), change.text]
            at = change.end
        out.append(source[at:end].decode("utf-8", "surrogateescape"))
        edits.append(Replace(path, first, last, "".join(out)))
    return edits


_ASSIGN = re.compile(r"\b([A-Za-z_]\w*)\s*(?<![=!<>+\-*/%&|^])=(?!=)\s*([^;,{}]+)")


def derived_names(function_text: str, varies: Callable[[str, set[str]], bool]) -> set[str]:
    """The locals of ``function_text`` assigned (transitively) from an expression that ``varies``
    (given the names found so far): those that vary by lane (padding), or by thread (vectorize)."""
    assignments = _ASSIGN.findall(function_text)
    names: set[str] = set()
    while more := {name for name, value in assignments if name not in names and varies(value, names)}:
        names |= more
    return names


def mentions(expression: str, names: set[str]) -> bool:
    """Whether ``expression`` uses one of ``names`` as a variable (not as a member: ``.x``, ``->x``)."""
    return any(re.search(rf"(?<![\w.])(?<!->){re.escape(name)}\b", expression) for name in names)
