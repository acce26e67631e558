"""Profile-guided iteration: rounds of proposals for one plan, each round told how the last one's
candidates did, the best verified variant carried into the next round.

    round r: base = the best variant so far (the target at first)
        ─► N conversations in parallel (propose_one, bounded by the concurrency limit)
        ─► measure(context, proposals) (injected: the driver's Ray pipeline, or a local one)
        ─► >10x faster? re-verified on fresh seeds (injected), flagged for review, or rejected
        ─► best verified survives ─► feedback_text(metric deltas) ─► round r + 1
    stops at the round budget, the token budget, or a round without proposals.

The measure function is the only tie to the cluster: it gets the proposals of a round at once, so
that it can fan them out over the GPU actors, and returns one ``Trial`` per proposal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from agents._base import AnalysisContext, Proposal
from agents.llm.accounting import LLMProposal, TokenBudget, Usage, usage_record
from agents.patch import Variant, variant_bundle
from agents.workflow.engine import proposal_key
from agents.workflow.steps import Plan, Verdict
from cluster.core.encodings import SUSPECT_SPEEDUP, suspect_speedup

MAX_METRICS_IN_FEEDBACK = 6


@dataclass(frozen=True)
class Trial:
    """A proposal as the sweep saw it: ``status`` "ok" when it verified and was measured."""

    proposal: Proposal
    status: str
    median: float | None = None
    speedup: float | None = None  # over the baseline, > 1 is better
    metrics: Mapping[str, float] = field(default_factory=dict)  # ptxas and profiler numbers
    error: str = ""
    flags: tuple[str, ...] = ()  # for the report: "review: ..." when a human should look

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def review(self) -> bool:
        return any(flag.startswith("review") for flag in self.flags)


Measure = Callable[[AnalysisContext, Sequence[Proposal]], Sequence[Trial]]
Reverify = Callable[[AnalysisContext, Proposal], Verdict]  # the proposal again, on fresh seeds


class Proposer(Protocol):
    def propose_one(self, context: AnalysisContext, plan: Plan, feedback: str | None = None, *,
                    round_index: int = 0, index: int = 0, count: int = 1) -> LLMProposal | None: ...


@dataclass(frozen=True)
class Round:
    index: int
    feedback: str | None  # what this round's proposals were told
    trials: tuple[Trial, ...]
    errors: tuple[str, ...] = ()  # conversations that ended without a proposal


@dataclass(frozen=True)
class IterationResult:
    best: Trial | None
    rounds: tuple[Round, ...]
    usage: Usage
    stopped: str  # rounds, token budget, no proposals


def feedback_text(trials: Sequence[Trial], reference: Mapping[str, float], best: Trial | None) -> str:
    """The last round in a few lines for the next: each candidate's speedup and metric deltas
    against ``reference`` (the best variant's metrics, or the baseline's), or why it failed."""
    lines = []
    for trial in trials:
        name = trial.proposal.description[:80]
        if not trial.ok:
            lines.append(f"- {name!r}: rejected ({trial.status}): {trial.error[:300]}")
            continue
        deltas = []
        for metric, value in sorted(trial.metrics.items()):
            before = reference.get(metric)
            if before is not None and abs(value - before) > 0.01 * max(abs(before), 1e-12):
                deltas.append(f"{metric} {before:g} -> {value:g} ({value - before:+g})")
        speed = f"{trial.speedup:.2f}x the baseline" if trial.speedup is not None else "no speedup measured"
        median = f" (median {trial.median:g})" if trial.median is not None else ""
        text = f"- {name!r}: {speed}{median}"
        if deltas:
            text += "; " + "; ".join(deltas[:MAX_METRICS_IN_FEEDBACK])
        lines.append(text)
    if best is not None and best.speedup is not None:
        lines.append(f"Best so far: {best.proposal.description[:80]!r} at {best.speedup:.2f}x; the next proposals "
                     f"start from it.")
    return "\n".join(lines)


def _rebase(proposal: LLMProposal, base: Mapping[str, str], order: Sequence[str]) -> LLMProposal:
    """A proposal made on the best variant as a proposal on the target: the variant's files with
    this proposal's changes on top."""
    files = {**base, **dict(proposal.files)}
    return dataclasses.replace(proposal, files=tuple((p, files[p]) for p in order if p in files))


def _context_of(context: AnalysisContext, files: Mapping[str, str]) -> AnalysisContext:
    if not files:
        return context
    target = context.target
    bundle = variant_bundle(target, Variant(tuple(files.items()), "", "iteration base", target.bundle.hash))
    return dataclasses.replace(context, target=dataclasses.replace(target, bundle=bundle))


def _guard(context: AnalysisContext, trial: Trial, reverify: Reverify | None, threshold: float) -> Trial:
    if not trial.ok or not suspect_speedup(trial.speedup, threshold):
        return trial
    if reverify is None:
        return dataclasses.replace(trial, flags=(*trial.flags, f"review: {trial.speedup:.1f}x, not re-verified"))
    verdict = reverify(context, trial.proposal)
    if verdict.failed:
        return dataclasses.replace(trial, status="rejected", error=f"fresh-seed re-verification: {verdict.detail}",
                                   flags=(*trial.flags, f"review: {trial.speedup:.1f}x, failed re-verification"))
    return dataclasses.replace(trial, flags=(*trial.flags, f"review: {trial.speedup:.1f}x, re-verified on fresh "
                                             f"inputs"))


def _eligible(trial: Trial) -> bool:
    return trial.ok and trial.speedup is not None and "not re-verified" not in " ".join(trial.flags)


def iterate(context: AnalysisContext, plan: Plan, proposer: Proposer, measure: Measure, *, rounds: int,
            proposals_per_round: int, concurrency: int, budget: TokenBudget | None = None,
            reverify: Reverify | None = None, baseline_metrics: Mapping[str, float] | None = None,
            threshold: float = SUSPECT_SPEEDUP) -> IterationResult:
    """Up to ``rounds`` rounds of ``proposals_per_round`` proposals for ``plan``; the best verified
    trial over all rounds. A candidate above ``threshold`` x is kept only if ``reverify`` passes it."""
    order = list(context.target.spec.sources)
    best: Trial | None = None
    best_files: dict[str, str] = {}
    feedback: str | None = None
    seen: dict[str, Trial] = {}
    done: list[Round] = []
    usage = Usage()
    stopped = "rounds"
    for index in range(rounds):
        if budget is not None and budget.exhausted:
            stopped = "token budget"
            break
        base = _context_of(context, best_files)
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, proposals_per_round))) as pool:
            futures = [pool.submit(proposer.propose_one, base, plan, feedback, round_index=index, index=i,
                                   count=proposals_per_round) for i in range(proposals_per_round)]
            proposals, errors = [], []
            for future in futures:
                try:
                    made = future.result()
                except Exception as exc:  # a conversation's failure is this round's information
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                if made is not None:
                    proposals.append(_rebase(made, best_files, order))
        usage = usage + Usage.total(p.usage for p in proposals)
        fresh = {proposal_key(p): p for p in proposals if proposal_key(p) not in seen}
        measured = list(measure(context, list(fresh.values()))) if fresh else []
        trials = [_guard(context, t, reverify, threshold) for t in measured]
        seen.update({proposal_key(t.proposal): t for t in trials})
        trials += [seen[proposal_key(p)] for p in proposals if proposal_key(p) not in fresh]
        done.append(Round(index, feedback, tuple(trials), tuple(errors)))
        reference = dict(best.metrics) if best is not None else dict(baseline_metrics or {})  # this round's base
        for trial in trials:
            if _eligible(trial) and (best is None or trial.speedup > best.speedup):  # type: ignore[operator]
                best, best_files = trial, dict(trial.proposal.files)
        if not proposals:
            stopped = "no proposals"
            break
        feedback = feedback_text(trials, reference, best)
    return IterationResult(best, tuple(done), usage, stopped)


def trial_record(trial: Trial) -> dict[str, object]:
    """A trial's flat columns for the results: its LLM accounting and the guardrails' verdict."""
    return {**usage_record(trial.proposal), "proposal_key": proposal_key(trial.proposal), "status": trial.status,
            "speedup": trial.speedup, "review": trial.review, "flags": "; ".join(trial.flags)}
