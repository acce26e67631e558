"""The workflow loop: analysis ─► plan ─► transform ─► verify ─► accept, or revert and retry.

Pure orchestration: what runs the checks is the ``Verifier`` passed in. A step that raises is a
failed outcome with the exception's message, never the end of the workflow. A proposal that
fails verification is reverted: it is recorded, and only accepted proposals leave this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from agents._base import AnalysisContext, Proposal
from agents.workflow.steps import Finding, Level, Plan, Steps, Verification, Verifier

# The rule-based experts' analyses, plans and transformations, and the static checks of their
# proposals, are Python computing (tree-sitter walks, source models): one thread at a time in a
# process. Threads give them no parallelism (the GIL), and many at once starve the rest of the
# process: a sweep's driver loop shares it, and on an H100 the public suite's only GPU stood idle
# for 43 s while eight studies' agents (fifty threads) walked their parse trees. Waits (a
# verification's jobs, an LLM's endpoint) are outside it.
COMPUTING = threading.RLock()


def computing(agent: object) -> AbstractContextManager[object]:
    """``COMPUTING`` for an agent whose work is computing here; nothing for one that waits on a
    service (``computes_here`` False: an LLM's steps)."""
    return COMPUTING if getattr(agent, "computes_here", True) else nullcontext()


@dataclass(frozen=True)
class Outcome:
    """What became of one finding (and, past step 2, of one proposal for it)."""

    finding: Finding
    analyst: str
    plan: Plan | None = None
    planner: str = ""
    proposal: Proposal | None = None
    transformer: str = ""
    verification: Verification | None = None
    attempt: int = 0  # 0 for the first proposal of a plan, 1.. for retries with feedback
    error: str = ""  # why the workflow stopped before a verified proposal, when it did

    @property
    def accepted(self) -> bool:
        return self.proposal is not None and self.verification is not None and self.verification.passed

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        if self.verification is not None and not self.verification.passed:
            return self.verification.reason
        return self.finding.reason

    @property
    def stage(self) -> str:
        """How far it got: not_applicable, not_planned, no_proposal, rejected, accepted, or error."""
        if self.accepted:
            return "accepted"
        if self.verification is not None:
            return "rejected"
        if self.error:
            return "error"
        if not self.finding.applies:
            return "not_applicable"
        return "not_planned" if self.plan is None else "no_proposal"


def proposal_key(proposal: Proposal) -> str:
    h = hashlib.sha256()
    for path, text in sorted(proposal.files):
        h.update(path.encode() + b"\0" + text.encode() + b"\0")
    h.update(repr(sorted(proposal.search_params.items())).encode())
    return h.hexdigest()[:16]


def _failure(step: str, exc: BaseException) -> str:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return f"{step} raised {last}"


def run_workflow(context: AnalysisContext, steps: Sequence[Steps], verifier: Verifier,
                 retries: int = 1, parallel: int = 1, findings_at_once: int = 1,
                 on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every finding of every analyst, with the fate of each proposal made for it.

    A transformer that ``takes_feedback`` gets up to ``retries`` more tries per plan, each with
    the last verification failure; identical proposals are verified once. ``parallel``: how many
    analysts' workflows run at once (threads), so that their verifications overlap;
    ``findings_at_once``: how many findings of one analyst are pursued at once (threads), where its
    planner and transformer are ``concurrent`` (the experts; an LLM's findings go in turn). A
    program with many loops gets many findings, each verified by a build, a run, the sanitizer and
    the cheat checks: in turn, they took minutes a study. The outcomes keep the order of ``steps``
    and of each analyst's findings. ``on_outcome`` hears of each outcome as soon as its finding is
    done (from the thread that pursued it), so that an accepted variant can be searched at once.
    """
    verified = _Once()
    tell = on_outcome or (lambda outcome: None)

    def told(outcomes: list[Outcome]) -> list[Outcome]:
        for outcome in outcomes:
            tell(outcome)
        return outcomes

    def one(step: Steps) -> list[Outcome]:
        try:
            with computing(step.analyst):
                findings = step.analyst.analyse(context)
        except Exception as exc:  # an agent's failure is a value
            level = getattr(step.analyst, "level", Level.KERNEL)
            missing = Finding(step.analyst.name, level, "", False, reason="analysis failed")
            return told([Outcome(missing, step.analyst.name, error=_failure("analyse", exc))])

        findings = not_launched(context, findings)

        def pursue(finding: Finding) -> list[Outcome]:
            return told(_pursue(context, step, finding, verifier, retries, verified))

        threads = min(findings_at_once, sum(f.applies for f in findings))
        if threads > 1 and step.planner.concurrent and step.transformer.concurrent:
            with ThreadPoolExecutor(threads) as pool:
                return [o for outcomes in pool.map(pursue, findings) for o in outcomes]
        return [o for finding in findings for o in pursue(finding)]

    if parallel > 1 and len(steps) > 1:
        with ThreadPoolExecutor(min(parallel, len(steps))) as pool:
            return [o for outcomes in pool.map(one, steps) for o in outcomes]
    return [o for step in steps for o in one(step)]


def not_launched(context: AnalysisContext, findings: list[Finding]) -> list[Finding]:
    """Findings about a kernel that the baseline's profile never saw launched, made not applicable:
    a change there cannot change what the program measures (a sample's other variants, kernels
    selected at run time). Only where the profile names some of these findings' kernels: a profile
    that names none (another naming, or no launch profiled) decides nothing."""
    named = {f.kernel for f in findings if f.applies and f.kernel}
    if not context.launched or not named & context.launched:
        return findings
    return [dataclasses.replace(f, applies=False, detail=None,
                                reason=f"{f.kernel} is never launched in the baseline's profile "
                                       f"(launched: {', '.join(sorted(context.launched))})")
            if f.applies and f.kernel and f.kernel not in context.launched else f for f in findings]


class _Once:
    """Each proposal verified once, however many threads propose it: the others wait for it. A
    verification that raised is not kept: a later proposal of the same change tries again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Verification]] = {}

    def get(self, key: str, verify: Callable[[], Verification]) -> Verification:
        with self._lock:
            future = self._futures.get(key)
            mine = future is None
            if future is None:
                future = self._futures[key] = Future()
        if mine:
            try:
                future.set_result(verify())
            except Exception as exc:
                with self._lock:
                    del self._futures[key]
                future.set_exception(exc)
        return future.result()


def _pursue(context: AnalysisContext, step: Steps, finding: Finding, verifier: Verifier, retries: int,
            verified: _Once) -> list[Outcome]:
    base = Outcome(finding, step.analyst.name)
    if not finding.applies:
        return [base]
    try:
        with computing(step.planner):
            plan = step.planner.plan(context, finding)
    except Exception as exc:
        return [Outcome(finding, step.analyst.name, planner=step.planner.name, error=_failure("plan", exc))]
    if plan is None:
        return [Outcome(finding, step.analyst.name, planner=step.planner.name)]
    names = {"analyst": step.analyst.name, "planner": step.planner.name, "transformer": step.transformer.name}
    results: list[Outcome] = []
    feedback: str | None = None
    tries = 1 + (retries if step.transformer.takes_feedback else 0)
    for attempt in range(tries):
        try:
            with computing(step.transformer):
                proposals = step.transformer.transform(context, plan, feedback)
        except Exception as exc:
            results.append(Outcome(finding, plan=plan, attempt=attempt, error=_failure("transform", exc), **names))
            feedback = results[-1].error
            continue
        if not proposals:
            if attempt == 0:
                results.append(Outcome(finding, plan=plan, **names))
            break
        failures = []
        for proposal in proposals:
            try:
                verification = verified.get(proposal_key(proposal),
                                            lambda p=proposal: verifier.verify(context, plan, p))
            except Exception as exc:
                results.append(Outcome(finding, plan=plan, proposal=proposal, attempt=attempt,
                                       error=_failure("verify", exc), **names))
                continue
            outcome = Outcome(finding, plan=plan, proposal=proposal, verification=verification, attempt=attempt,
                              **names)
            results.append(outcome)
            if not outcome.accepted:
                failures.append(outcome.reason)
        if not failures:
            break
        feedback = "; ".join(failures)
    return results
