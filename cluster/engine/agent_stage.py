"""The sweep's agent stage, between the baselines and the search (issue 4's workflow on a cluster).

    baseline (ptxas report, outputs) ─► ncu profile of the baseline (GPU) ─► AnalysisContext
        ─► run_workflow(experts, RayVerifier) ─► variants/ table (every outcome, with provenance)
        ─► accepted variants join the study: a "variant" dimension, their params, enqueued points

A study whose workflow finished in an earlier invocation gets its accepted variants back from the
run directory (resume); the agents are not asked again.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agents._base import AnalysisContext
from agents.patch import source_files, variant_target
from agents.workflow import Outcome, Steps, Verifier, run_workflow
from agents.workflow.stack import OPTIMIZATION as STACK
from agents.workflow.stack import Part, stack, stack_plan
from cluster.config import AgentsSpec, ProfileSpec, Target
from cluster.core.encodings import optuna_point, speedup
from cluster.core.registry import EXPERTS
from cluster.core.types import Status
from cluster.engine.studies import StudyState, storage_retry
from cluster.engine.verify import QueueVerifier
from cluster.runners.profile import DEFAULT_METRICS, PROFILE_SCHEMA, Profile, profile_records
from cluster.store.results import ResultWriter
from cluster.store.rundir import RunDir
from cluster.store.variants import (
    VARIANT_SCHEMA,
    AcceptedVariant,
    load_accepted,
    mark_done,
    outcome_record,
    save_accepted,
)

if TYPE_CHECKING:
    from cluster.engine.flow import StudyJobs

MAX_ENQUEUED = 64  # points per variant entered ahead of the sampler; the rest is the sampler's
ENQUEUED_SHARE = 0.5  # of the trial budget, at most, spent on agents' points ahead of the sampler
FINDINGS_AT_ONCE = 8  # an expert's findings verified at once (their jobs spread over the cluster)



def context_metrics(profile: Profile) -> dict[str, float]:
    """Per metric, summed over launches for counters (``.sum``), else the largest value."""
    out: dict[str, float] = {}
    for v in profile.values:
        if v.value is None:
            continue
        if v.metric.endswith(".sum"):
            out[v.metric] = out.get(v.metric, 0.0) + v.value
        else:
            out[v.metric] = max(out.get(v.metric, v.value), v.value)
    if "launch__block_size" in out:
        out["block_size"] = out["launch__block_size"]
    return out


class AgentStage:
    """The workflow of every study: ``propose`` runs in a thread of its own per study (its checks
    are jobs on the sweep's queue, so one study's slow verification never holds another's search);
    ``join`` puts the accepted variants into the study, on the driver's thread."""

    def __init__(self, run_dir: Path, run_id: str, spec: AgentsSpec, profile: ProfileSpec, runs: int,
                 log: Callable[[str], None], steps: Callable[[Verifier], list[Steps]] | None = None,
                 trials: int | None = None) -> None:
        self.run_dir, self.run_id, self.spec, self.profile_spec = run_dir, run_id, spec, profile
        self.runs, self.log = runs, log
        self.steps = steps or self._configured_steps
        self.trials = trials  # the search's budget per study; None: unbounded
        self.kit = None  # the LLM agents' shared client, store and budget, made on first use
        self.steps_used: list[Steps] = []
        self._lock = threading.Lock()  # studies' threads share the kit and the tables

    def restore(self, study: StudyState) -> bool:
        """Accepted variants of an earlier invocation; True when the study's workflow is done."""
        variants = load_accepted(self.run_dir, study.name, study.target)
        if variants is None:
            return False
        for variant in sorted(variants, key=lambda v: not v.files_changed):
            self._join(study, variant, enqueue=False)
        return True

    def propose(self, study: StudyState, jobs: StudyJobs, kernels: tuple) -> list[AcceptedVariant]:
        """Steps 1-5 of the workflow for one study, in the calling (agents') thread: every outcome
        to the ``variants`` table, the accepted variants returned for ``join``."""
        gpu = study.device.kind == "gpu"
        if gpu and self.spec.sanitizer and not study.target.spec.verify.sanitize_run:
            self.log(f"{study.name}: no verify.sanitize_run: compute-sanitizer runs the full problem "
                     f"(give the target a smaller one, README: Bounded verification)")
        verifier = QueueVerifier(jobs, self.runs, tuple(self.spec.sanitizer) if gpu else (),
                                 self.spec.sanitizer_timeout_s, guardrails=self.spec.guardrails)
        metrics, launched = self._baseline_metrics(study, jobs)
        context = AnalysisContext(study.target, study.arch, study.baseline_median, kernels, metrics, launched)
        with self._lock:
            steps = self.steps(verifier)
            self.steps_used = steps
        self.log(f"{study.name}: analysis, plans and transformations by "
                 f"{', '.join(s.analyst.name for s in steps)}; each proposal verified before it joins")
        outcomes = run_workflow(context, steps, verifier, self.spec.retries, parallel=len(steps),
                                findings_at_once=FINDINGS_AT_ONCE)
        outcomes += self._iterate(context, outcomes, verifier, study, metrics, steps)
        if self.spec.stack:
            outcomes += self._stack(context, outcomes, verifier)
        with self._lock, ResultWriter(self.run_dir, VARIANT_SCHEMA, subdir=RunDir.VARIANTS) as writer:
            for outcome in outcomes:
                writer.append_record(outcome_record(self.run_id, study.name, study.target, outcome))
        accepted = []
        for outcome in outcomes:
            self.log(f"{study.name}: {outcome.finding.optimization} {outcome.finding.location}: {outcome.stage}"
                     + (f" ({outcome.reason[:160]})" if outcome.reason and not outcome.accepted else ""))
            if outcome.accepted and outcome.proposal is not None:
                proposal = outcome.proposal
                accepted.append(AcceptedVariant(variant_target(study.target, proposal),
                                                f"{outcome.finding.optimization} {outcome.finding.location}",
                                                dict(proposal.search_params), bool(proposal.files)))
        accepted.sort(key=lambda v: not v.files_changed)  # the variant dimension first, then flag values
        return accepted

    def join(self, study: StudyState, accepted: list[AcceptedVariant]) -> None:
        """The accepted variants into the study's search (the driver's thread)."""
        # Each accepted plan gets its points tried first, but together at most half the budget:
        # the sampler still needs trials to combine variants with flags.
        limit = MAX_ENQUEUED
        if self.trials is not None:
            limit = max(1, int(self.trials * ENQUEUED_SHARE) // max(1, len(accepted)))
        for variant in accepted:
            save_accepted(self.run_dir, study.name, variant)
            self._join(study, variant, enqueue=True, limit=limit)
        mark_done(self.run_dir, study.name)

    def _configured_steps(self, verifier: Verifier) -> list[Steps]:
        """The config's choice per step: experts alone, or with LLM agents sharing one kit."""
        spec = self.spec
        if spec.llm is None and not spec.steps and not spec.custom:
            return [Steps.of(EXPERTS.load(name)()) for name in spec.experts]
        from agents.llm import Services, build_steps, make_kit
        from cluster.config.agents import choices_of
        from cluster.runners.build import build_report

        if self.kit is None and spec.llm is not None:
            self.kit = make_kit(spec.llm, self.run_dir, replay=spec.replay)
        kit = self.kit
        if kit is not None:
            kit = dataclasses.replace(kit, services=Services(build=build_report, verify=verifier.verify))
        only = [*spec.experts, *(c.name for c in spec.custom)]
        return build_steps(spec.llm, choices_of(spec.steps, spec.custom, only=only), custom=spec.custom, kit=kit)

    def _stack(self, context: AnalysisContext, outcomes: list[Outcome], verifier: Verifier) -> list[Outcome]:
        """The accepted source changes merged into one variant, verified as the others were."""
        parts = [Part(f"{o.finding.optimization} {o.finding.location}", o.finding.level, o.proposal)
                 for o in outcomes if o.accepted and o.proposal is not None and o.proposal.files]
        merged = stack(source_files(context.target), parts)
        if merged is None:
            return []
        plan = stack_plan(merged, context.target.name)
        try:
            verification = verifier.verify(context, plan, merged.proposal)
        except Exception as exc:  # a verifier that raised: a failed stack, never the stage's end
            return [Outcome(plan.finding, STACK, plan, STACK, merged.proposal, STACK, error=f"verification: {exc}")]
        return [Outcome(plan.finding, STACK, plan, STACK, merged.proposal, STACK, verification)]

    def _iterate(self, context: AnalysisContext, outcomes: list[Outcome], verifier: QueueVerifier,
                 study: StudyState, metrics: dict[str, float], steps: list[Steps]) -> list[Outcome]:
        """Profile-guided rounds for each accepted plan whose transformer is an LLM: the rounds'
        best verified proposal joins the search too."""
        if not (self.spec.iterate and self.spec.llm is not None and self.kit is not None):
            return []
        from agents.llm.iterate import Trial, iterate
        from agents.workflow.engine import proposal_key

        llm = self.spec.llm
        verifications = {}

        def measure(ctx: AnalysisContext, proposals) -> list[Trial]:
            trials = []
            for proposal in proposals:
                verification = verifications[proposal_key(proposal)] = verifier.verify(ctx, plan, proposal)
                measured = verifier.measured.get(proposal_key(proposal))
                stats = measured.stats if measured else None
                if not verification.passed or stats is None or not study.baseline_median:
                    trials.append(Trial(proposal, "rejected", error=verification.reason))
                    continue
                trials.append(Trial(proposal, "ok", stats.median, speedup(stats.median, study.baseline_median,
                                                                          study.goal)))
            return trials

        extra: list[Outcome] = []
        for outcome in [o for o in outcomes if o.accepted and o.plan is not None]:
            transformer = next((s.transformer for s in steps if s.transformer.name == outcome.transformer
                                and hasattr(s.transformer, "propose_one")), None)
            if transformer is None:
                continue
            plan = outcome.plan
            result = iterate(context, plan, transformer, measure, rounds=llm.rounds,
                             proposals_per_round=llm.proposals_per_round, concurrency=llm.concurrency,
                             budget=self.kit.budget, baseline_metrics=metrics)
            best = result.best
            if best is not None and proposal_key(best.proposal) != proposal_key(outcome.proposal):
                extra.append(dataclasses.replace(outcome, proposal=best.proposal,
                                                 verification=verifications[proposal_key(best.proposal)],
                                                 attempt=outcome.attempt + len(result.rounds)))
            self.log(f"{study.name}: {outcome.finding.optimization}: {len(result.rounds)} profile-guided rounds, "
                     f"stopped by {result.stopped}; best {best.speedup:.2f}x" if best and best.speedup else
                     f"{study.name}: {outcome.finding.optimization}: profile-guided rounds found nothing better")
        return extra

    def _baseline_metrics(self, study: StudyState, jobs: StudyJobs) -> tuple[dict[str, float], frozenset[str]]:
        """Nsight Compute on the baseline for the analysts, as a job ahead of the search: its
        metrics, and the kernels it saw launched."""
        if (study.device.kind != "gpu" or not self.spec.profile_baseline
                or self.profile_spec.candidates == "none"):
            return {}, frozenset()
        self.log(f"{study.name}: Nsight Compute on the baseline, for the analysts")
        metrics = tuple(self.profile_spec.metrics or DEFAULT_METRICS)
        done = jobs.profile(None, metrics, self.profile_spec.timeout_s, self.profile_spec.launches,
                            priority=1).result()
        profile: Profile = done.value if isinstance(done.value, Profile) else Profile(
            study.baseline_candidate().key, done.failure or Status.CRASHED, error_tail=done.error)
        with self._lock, ResultWriter(self.run_dir, PROFILE_SCHEMA, subdir=RunDir.PROFILES) as writer:
            for record in profile_records(self.run_id, study, profile):
                writer.append_record(record)
        if profile.status is not Status.OK:
            self.log(f"{study.name}: baseline profile failed ({profile.status.value}); analysing without metrics")
            return {}, frozenset()
        return context_metrics(profile), profile.launched()

    def _join(self, study: StudyState, variant: AcceptedVariant, enqueue: bool, limit: int = MAX_ENQUEUED) -> None:
        if variant.files_changed:
            study.add_variant(variant.target)
            if enqueue:
                self._enqueue_variant(study, variant.target, limit)
        elif "maxrregcount" in variant.search:
            _add_register_options(study, variant.search["maxrregcount"], enqueue, limit)

    def _enqueue_variant(self, study: StudyState, target: Target, limit: int) -> None:
        """The variant at every point of its own params (the plan's search), with baseline flags."""
        names = list(target.spec.params)
        points = [dict(zip(names, values, strict=True)) for values in itertools.product(*target.spec.params.values())]
        points = _spread([p for p in points if target.satisfies(p)], limit)
        for point in points:
            params = optuna_point(study.target.space.baseline, point, target.spec.params, target.bundle.hash)
            storage_retry(lambda params=params: study.study.enqueue_trial(params, skip_if_exists=True))


def _spread(points: list, limit: int) -> list:
    """``limit`` of ``points``, evenly spaced (first and last included when there is room)."""
    if len(points) <= limit:
        return points
    if limit == 1:
        return points[:1]
    return [points[round(i * (len(points) - 1) / (limit - 1))] for i in range(limit)]


def _add_register_options(study: StudyState, values: tuple, enqueue: bool, limit: int = MAX_ENQUEUED) -> None:
    """``-maxrregcount=N`` options into the study's own flag space (before the search asks: a
    categorical's choices are fixed once a trial used them), and one enqueued trial per value."""
    space = study.target.space
    if "maxrregcount" not in space.flags:
        return
    options = list(space.flags["maxrregcount"])
    options += [f"-maxrregcount={v}" for v in values if f"-maxrregcount={v}" not in options]
    flags = {**space.flags, "maxrregcount": tuple(options)}
    study.target = dataclasses.replace(study.target, space=dataclasses.replace(space, flags=flags))
    study.space_size = study.target.space_size() + sum(v.space_size() for v in study.variants.values())
    if not enqueue:
        return
    for v in _spread(list(values), limit):
        flags = {**space.baseline, "maxrregcount": f"-maxrregcount={v}"}
        params = optuna_point(flags, study.target.baseline_params, study.target.spec.params,
                              "" if study.variants else None)
        storage_retry(lambda params=params: study.study.enqueue_trial(params, skip_if_exists=True))
