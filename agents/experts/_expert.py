"""The base of rule-based experts: one agent doing steps 1-3 of the workflow for one optimization.

``propose`` (the ``Agent`` contract) is the three steps in a row, for callers that want proposals
without the workflow's bookkeeping.
"""

from __future__ import annotations

from agents._base import Agent, AnalysisContext, Proposal
from agents.cuda_source import Kernel, SourceModel, analyze
from agents.patch import source_files
from agents.workflow.steps import Analyst, Level, Planner, Transformer


def source_models(context: AnalysisContext) -> dict[str, SourceModel]:
    """Each source of the target analysed as the baseline builds it: its params as -D defines,
    so that constants, template arguments and the loops and tiles they size resolve."""
    return {path: analyze(text, path, defines=defines(context)) for path, text in source_files(context.target).items()}


def defines(context: AnalysisContext) -> dict[str, str]:
    return {name: str(value) for name, value in context.target.baseline_params.items()}


def instance_label(kernel: Kernel) -> str:
    """`mm<BLOCK_SIZE=32>` for a template kernel's instance, else the kernel's name."""
    if not kernel.template_values:
        return kernel.name
    return f"{kernel.name}<{', '.join(f'{name}={value}' for name, value in kernel.template_values)}>"


class Expert(Agent, Analyst, Planner, Transformer):
    name: str
    level: Level

    def propose(self, context: AnalysisContext) -> list[Proposal]:
        proposals: list[Proposal] = []
        for finding in self.analyse(context):
            if finding.applies and (plan := self.plan(context, finding)) is not None:
                proposals += self.transform(context, plan)
        return proposals
