"""LLM implementations of the workflow's steps (agents.workflow.steps), tool-calling agents that
use the experts' own tools:

    LLMAnalyst.analyse     read-only tools ─► report_findings ─► [Finding]
    LLMPlanner.plan        read-only tools ─► submit_plan | no_plan ─► Plan | None
    LLMTransformer         read + edit/build/verify/profile tools ─► finish | give_up ─► [LLMProposal]
    LLMReviewer.verify     another Verifier first; then read-only tools ─► submit_verdict ─► one more Verdict

Structured answers are the final tools' arguments, validated by pydantic; a malformed one goes
back to the model as an error. A conversation that ends without an answer (endpoint down, step
limit, budget) raises ``LLMStepError``, which the workflow records as that step's failure.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from agents._base import AnalysisContext, Proposal
from agents.llm.accounting import LLMProposal, TokenBudget, Usage
from agents.llm.client import ChatClient
from agents.llm.guard import Workspace, check_files
from agents.llm.prompts import Prompts
from agents.llm.react import ReactResult, react
from agents.llm.tools import EDIT_TOOLS, READ_TOOLS, Args, Scalar, Services, Session, Toolbox, final_tool
from agents.patch import source_files
from agents.workflow.steps import (
    Analyst,
    Finding,
    Level,
    Plan,
    Planner,
    Transformer,
    Verdict,
    VerdictStatus,
    Verification,
    Verifier,
)
from cluster.config.agents import LLMSpec

_MACRO = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class LLMStepError(RuntimeError):
    """A conversation ended without an answer: the endpoint, the step limit or the budget."""


@dataclass(frozen=True)
class Kit:
    """What every LLM step of a run shares: the endpoint, the prompts and the tools' services."""

    spec: LLMSpec
    chat: ChatClient
    prompts: Prompts
    services: Services = field(default_factory=Services)
    budget: TokenBudget = field(default_factory=lambda: TokenBudget(None))  # the run's, shared


@dataclass(frozen=True)
class Spent:
    """What a finding's or plan's conversation cost (their ``detail``)."""

    usage: Usage
    exchanges: tuple[str, ...]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _situation(context: AnalysisContext) -> str:
    target = context.target
    baseline = "not measured" if context.baseline_median is None else \
        f"{context.baseline_median:g} {target.spec.metric.unit}"
    return (f"Target {target.name} ({target.spec.toolchain}, {context.arch}); sources: "
            f"{', '.join(target.spec.sources)}; baseline median {baseline}; {len(context.kernels)} kernels in the "
            f"ptxas report; {len(context.metrics)} profiler metrics.")


class _LLMStep:
    step: str
    concurrent = False  # one conversation (and budget) at a time: its findings are taken in turn
    computes_here = False  # it waits on the endpoint: never behind the experts' computing (COMPUTING)

    def __init__(self, kit: Kit, optimization: str, level: Level = Level.KERNEL, prompt: str | None = None,
                 values: Mapping[str, str] | None = None) -> None:
        self.kit, self.optimization, self.level = kit, optimization, level
        self.prompt, self.values = prompt or optimization, dict(values or {})
        self.name = f"llm:{optimization}"

    def _run(self, session: Session, tools: Toolbox, user: str, label: str, final: str) -> ReactResult:
        system = self.kit.prompts.system(self.prompt, self.step, self.values)
        result = react(self.kit.chat, session, tools, system, user, label=label, max_steps=self.kit.spec.max_steps,
                       final_from_text=final)
        if not result.finished:
            raise LLMStepError(f"{self.name} {self.step}: {result.error}")
        return result

    def _session(self, context: AnalysisContext, plan: Plan | None = None) -> Session:
        return Session(context, Workspace(source_files(context.target), self.kit.spec.max_diff_lines),
                       self.kit.services, plan, self.name)


# --- step 1 ------------------------------------------------------------------------------------

class FindingArgs(Args):
    location: str = Field(min_length=1)
    applies: bool
    evidence: list[str] = Field(default_factory=list)
    reason: str = ""


class FindingsArgs(Args):
    findings: list[FindingArgs]


def _store(session: Session, value: Any) -> str | None:
    session.final = value
    return None


class LLMAnalyst(_LLMStep, Analyst):
    step = "analyse"
    uses_profile = True  # its prompt carries the baseline's metrics

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        tools = Toolbox([*READ_TOOLS, final_tool("report_findings", "Report the findings (the answer).",
                                                 FindingsArgs, _store)])
        label = f"analyse/{self.optimization}/{context.target.name}/{context.target.bundle.hash}"
        result = self._run(self._session(context), tools, _situation(context) + " Analyse it.", label,
                           "report_findings")
        spent = Spent(result.usage, result.exchanges)
        return [Finding(self.optimization, self.level, f.location, f.applies, tuple(f.evidence), f.reason, spent)
                for f in result.final.findings]


# --- step 2 ------------------------------------------------------------------------------------

def _check_macros(value: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
    for name, values in value.items():
        if not _MACRO.fullmatch(name) or not values:
            raise ValueError(f"{name!r} must be a macro name with at least one value")
    return value


class PlanArgs(Args):
    changes: list[str] = Field(min_length=1)
    search: dict[str, list[Scalar]] = Field(default_factory=dict)

    _macros = field_validator("search")(_check_macros)


class ReasonArgs(Args):
    reason: str = Field(min_length=1)


class LLMPlanner(_LLMStep, Planner):
    step = "plan"

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        tools = Toolbox([*READ_TOOLS,
                         final_tool("submit_plan", "Submit the plan (the answer).", PlanArgs, _store),
                         final_tool("no_plan", "Nothing to do here, and why.", ReasonArgs, _store)])
        about = {"optimization": finding.optimization, "level": finding.level.value, "location": finding.location,
                 "evidence": list(finding.evidence), "reason": finding.reason}
        label = f"plan/{self.optimization}/{context.target.name}/{_digest(json.dumps(about, sort_keys=True))}"
        user = f"{_situation(context)} Plan the change for this finding:\n{json.dumps(about, indent=1)}"
        result = self._run(self._session(context), tools, user, label, "submit_plan")
        if isinstance(result.final, ReasonArgs):
            return None
        return Plan(finding, tuple(result.final.changes), tuple((k, tuple(v)) for k, v in result.final.search.items()),
                    Spent(result.usage, result.exchanges))


# --- step 3 ------------------------------------------------------------------------------------

class FinishArgs(Args):
    description: str = Field(min_length=1)
    search: dict[str, list[Scalar]] = Field(default_factory=dict)

    _macros = field_validator("search")(_check_macros)


def _accept_finish(session: Session, value: FinishArgs) -> str | None:
    if not session.workspace.changed() and not value.search:
        return "nothing to propose: the working copy is unchanged and no search is given (or call give_up)"
    refused = check_files(session.workspace.original, dict(session.workspace.changed()),
                          session.workspace.max_diff_lines)
    if refused is not None:
        return f"the working copy breaks a rule: {refused.reason}"
    session.final = value
    return None


class LLMTransformer(_LLMStep, Transformer):
    """Carries a plan out with the patch tools. ``transform`` makes one proposal per call; a retry
    of the workflow gets the verification failure as feedback."""

    step = "transform"
    takes_feedback = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        key = _digest(context.target.name, plan.to_json())
        with self._lock:
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
        proposal = self.propose_one(context, plan, feedback, round_index=attempt)
        return [proposal] if proposal is not None else []

    def propose_one(self, context: AnalysisContext, plan: Plan, feedback: str | None = None, *,
                    round_index: int = 0, index: int = 0, count: int = 1) -> LLMProposal | None:
        """One conversation: a proposal, or None when the model gives up. ``round_index``,
        ``index`` and ``count`` name it (profile-guided rounds make several per round)."""
        session = self._session(context, plan)
        tools = Toolbox([*READ_TOOLS, *EDIT_TOOLS,
                         final_tool("finish", "Propose the working copy (the answer).", FinishArgs, _accept_finish),
                         final_tool("give_up", "The plan cannot be carried out here, and why.", ReasonArgs,
                                    _store)])
        label = (f"transform/{self.optimization}/{context.target.name}/{_digest(plan.to_json())}/"
                 f"r{round_index}/p{index}of{count}")
        user = f"{_situation(context)} Carry out this plan:\n{plan.to_json()}"
        if count > 1:
            user += f"\nThis is proposal {index + 1} of {count} in this round: make it differ from the others."
        if feedback:
            user += f"\nFeedback on the previous proposals:\n{feedback}"
        result = self._run(session, tools, user, label, "finish")
        if isinstance(result.final, ReasonArgs):
            return None
        diff, _ = session.workspace.diff()
        return LLMProposal(self.name, result.final.description, session.workspace.changed(),
                           {k: tuple(v) for k, v in result.final.search.items()}, usage=result.usage,
                           exchanges=result.exchanges, model=self.kit.spec.model, diff=diff)


# --- step 4 (a review on top of an independent verifier) ------------------------------------------

class VerdictArgs(Args):
    status: Literal["passed", "failed"]
    detail: str = ""


class _Review(_LLMStep):
    step = "review"


class LLMReviewer(Verifier):
    """Runs ``base`` (the real verification) and, only when it passes, asks the model to review the
    diff: its verdict can fail a variant, never pass one that ``base`` failed. A review that cannot
    be had is a skipped verdict, not a failure."""

    def __init__(self, kit: Kit, base: Verifier, prompt: str | None = None,
                 values: Mapping[str, str] | None = None) -> None:
        self.kit, self.base, self.prompt, self.values = kit, base, prompt, dict(values or {})

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        verification = self.base.verify(context, plan, proposal)
        if not verification.passed:
            return verification
        return Verification((*verification.verdicts, self.review(context, plan, proposal)))

    def review(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verdict:
        from agents.llm.guard import diff_of

        step = _Review(self.kit, plan.optimization, prompt=self.prompt, values=self.values)
        diff, _ = diff_of(source_files(context.target), dict(proposal.files))
        tools = Toolbox([*READ_TOOLS, final_tool("submit_verdict", "The review's verdict (the answer).", VerdictArgs,
                                                 _store)])
        user = (f"{_situation(context)} Plan:\n{plan.to_json()}\nProposal: {proposal.description}\n"
                f"Search params: {proposal.search_params}\nDiff:\n{diff or '(no source change)'}")
        label = f"review/{plan.optimization}/{context.target.name}/{_digest(diff, repr(proposal.search_params))}"
        try:
            result = step._run(step._session(context, plan), tools, user, label, "submit_verdict")
        except LLMStepError as exc:
            return Verdict("llm_review", VerdictStatus.SKIPPED, str(exc))
        status = VerdictStatus.PASSED if result.final.status == "passed" else VerdictStatus.FAILED
        return Verdict("llm_review", status, result.final.detail)
