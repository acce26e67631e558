"""The base of rule-based experts: one agent doing steps 1-3 of the workflow for one optimization.

``propose`` (the ``Agent`` contract) is the three steps in a row, for callers that want proposals
without the workflow's bookkeeping.
"""

from __future__ import annotations

from agents._base import Agent, AnalysisContext, Proposal
from agents.workflow.steps import Analyst, Level, Planner, Transformer


class Expert(Agent, Analyst, Planner, Transformer):
    name: str
    level: Level

    def propose(self, context: AnalysisContext) -> list[Proposal]:
        proposals: list[Proposal] = []
        for finding in self.analyse(context):
            if finding.applies and (plan := self.plan(context, finding)) is not None:
                proposals += self.transform(context, plan)
        return proposals
