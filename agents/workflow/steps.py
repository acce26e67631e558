"""The six steps of the optimization workflow as typed contracts (after NVIDIA's WarpDrive).

    AnalysisContext ─► Analyst.analyse ─► Finding ─► Planner.plan ─► Plan
                   ─► Transformer.transform(plan, feedback) ─► Proposal (files + search params)
                   ─► Verifier.verify ─► Verification (verdicts) ─► accepted Variant | Rejected
                   ─► the sweep measures accepted variants ─► report (speedup, metric deltas)

Each step is a small abstract base, so that a rule-based expert and an LLM agent are
interchangeable per step: ``Steps`` names the implementation of each. Rule-based experts
implement the first three (``agents.experts``); verification is ``cluster.engine.verification.verify``'s, whatever
proposed the variant, so that no agent can vouch for its own output.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from agents._base import AnalysisContext
from cluster.config.agents import Level
from cluster.core.types import Proposal, Verdict, VerdictStatus, Verification

# The verdict types are the sweep's as much as the workflow's (cluster.core.types): named here too.
__all__ = ["Analyst", "Finding", "Plan", "Planner", "Steps", "Transformer", "Verdict", "VerdictStatus",
           "Verification", "Verifier"]


@dataclass(frozen=True)
class Finding:
    """Step 1's verdict on one place of the program: does ``optimization`` apply there, and why."""

    optimization: str  # registers, unroll, padding, streamify, or a custom name
    level: Level
    location: str  # file:line and the kernel or function, for humans
    applies: bool
    evidence: tuple[str, ...] = ()  # the facts that decided it: metrics, ptxas, source
    reason: str = ""  # one line: why it applies or why not
    detail: object = field(default=None, compare=False, repr=False)  # the analyst's own data, for its planner
    kernel: str = ""  # the __global__ function an applicable finding is about, where it is about one


@dataclass(frozen=True)
class Plan:
    """Step 2: what to change and where, and which parameters the sweep should search."""

    finding: Finding
    changes: tuple[str, ...]  # each a sentence: "insert `#pragma unroll kWfUnrollN` above line 41"
    search: tuple[tuple[str, tuple[int | float | str, ...]], ...] = ()  # param -> values
    detail: object = field(default=None, compare=False, repr=False)

    @property
    def optimization(self) -> str:
        return self.finding.optimization

    def to_json(self) -> str:
        return json.dumps({"optimization": self.optimization, "level": self.finding.level.value,
                           "location": self.finding.location, "evidence": list(self.finding.evidence),
                           "reason": self.finding.reason, "changes": list(self.changes),
                           "search": {k: list(v) for k, v in self.search}}, sort_keys=True)


class Analyst(ABC):
    """Step 1, performance analysis: which optimizations apply where, with the evidence."""

    name: str
    computes_here: bool = True  # its work is Python computing in this process (an LLM's: waiting on a service)
    # Whether its findings depend on the baseline's profile (``AnalysisContext.metrics``): such an
    # analyst waits for Nsight Compute; the others (ptxas, the source) start at once.
    uses_profile: bool = False

    def needs_profile(self, context: AnalysisContext) -> bool:
        """Whether, for this target, its findings wait for the profile (``context`` has none yet): an
        analyst that reads the profile but finds nothing in the source it could decide on says no,
        and the sweep spares the GPU an Nsight Compute run."""
        return self.uses_profile

    @abstractmethod
    def analyse(self, context: AnalysisContext) -> list[Finding]:
        """Findings for every place looked at, those that do not apply included (with the reason)."""


class Planner(ABC):
    """Step 2, optimization analysis: a plan for one applicable finding."""

    name: str
    concurrent: bool = True  # findings may be planned in threads at once (an LLM's conversation: no)
    computes_here: bool = True  # see Analyst

    @abstractmethod
    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        """None when, on a closer look, there is nothing to do."""


class Transformer(ABC):
    """Step 3, code transformation through ``agents.patch`` (read-only regions are its guard)."""

    name: str
    takes_feedback: bool = False  # whether a retry with the verification failure can differ
    concurrent: bool = True  # findings may be transformed in threads at once (an LLM's conversation: no)
    computes_here: bool = True  # see Analyst

    @abstractmethod
    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        """Proposals carrying the plan out: changed files and/or parameters to search. ``feedback``
        is the last verification failure of this plan, on a retry."""


class Verifier(ABC):
    """Step 4: checks a proposal independently of whoever made it."""

    @abstractmethod
    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification: ...


@dataclass(frozen=True)
class Steps:
    """Who does steps 1-3 for one optimization. An expert usually does all three."""

    analyst: Analyst
    planner: Planner
    transformer: Transformer

    @classmethod
    def of(cls, agent: Analyst) -> Steps:
        """All three from one agent that implements them (a rule-based expert)."""
        if not (isinstance(agent, Planner) and isinstance(agent, Transformer)):
            raise TypeError(f"{type(agent).__name__} does not implement Planner and Transformer")
        return cls(agent, agent, agent)
