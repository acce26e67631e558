"""The sweep's agent stage, beside each study's search (issue 4's workflow on a cluster; issue 25).

    baseline (ptxas report, outputs) ─► AnalysisContext ─► run_workflow(experts, QueueVerifier)
        │   (analysts that read the profile: after Nsight Compute on the baseline, GPU)
        ─► each outcome to variants/ as it comes (with provenance)
        ─► each variant the cheap checks admit joins the running search: a value of the "variant"
           dimension of the variants' own stream (``StudyState``: its Optuna study widened), its
           params, enqueued points; the own sources' stream is the search as it is without agents

A study whose workflow finished in an earlier invocation gets its admitted variants back from the
run directory (resume); the agents are not asked again. One that had not finished gets back what it
had admitted, and the agents run again (a proposal admitted before is not run again).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents._base import AnalysisContext, Proposal
from agents.llm.accounting import usage_record
from agents.patch import Variant, source_files, unified_diff
from agents.workflow import Outcome, Plan, Steps, Verifier, run_workflow
from agents.workflow.stack import OPTIMIZATION as STACK
from agents.workflow.stack import Part, stack, stack_plan
from cluster.compile.build import compile_candidate
from cluster.config import AgentsSpec, ProfileSpec, Target
from cluster.config.target import variant_bundle, variant_target
from cluster.core.encodings import optuna_point, speedup
from cluster.core.registry import EXPERTS
from cluster.core.types import Candidate, Status, Verdict
from cluster.engine.plan.budget import bounded
from cluster.engine.study.state import StudyState, storage_retry
from cluster.engine.verification.checks import Trust, expensive_state
from cluster.engine.verification.verify import QueueVerifier, SearchClosed
from cluster.measure.profile import DEFAULT_METRICS, PROFILE_SCHEMA, Profile, profile_records
from cluster.store.results import ResultWriter, read_table
from cluster.store.rundir import RunDir
from cluster.store.variants import (
    VARIANT_SCHEMA,
    AcceptedVariant,
    check_states,
    load_admitted,
    mark_done,
    save_accepted,
)

if TYPE_CHECKING:
    from cluster.engine.study.study_jobs import StudyJobs


log = logging.getLogger(f"warpfleet.{__name__}")

MAX_ENQUEUED = 64  # points per variant entered ahead of the sampler; the rest is the sampler's
ENQUEUED_SHARE = 0.5  # of the variants' stream's trials, its plans' points
VARIANTS_EXPECTED = 4  # a study's admitted variants, as the share is split before they are known
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
    """The workflow of every study, beside its search: ``propose`` runs in a thread of its own per
    study (its checks are jobs on the sweep's queue, so one study's slow verification never holds
    another's search) and hands each variant that the cheap checks admit to ``admit`` at once;
    ``join_variant`` puts it into the study's running search, on the driver's thread."""

    def __init__(self, run_dir: Path, run_id: str, spec: AgentsSpec, profile: ProfileSpec, runs: int,
                 steps: Callable[[Verifier], list[Steps]] | None = None,
                 trials: int | None = None, append: Callable[[str, Any, dict[str, Any]], None] | None = None) -> None:
        self.run_dir, self.run_id, self.spec, self.profile_spec = run_dir, run_id, spec, profile
        self.runs = runs
        self.steps = steps or self._configured_steps
        self.trials = trials  # the search's budget per study; None: unbounded
        self.kit = None  # the LLM agents' shared client, store and budget, made on first use
        self.steps_used: list[Steps] = []
        self._lock = threading.Lock()  # studies' threads share the kit and the tables
        self._append = append
        self._profiled: set[str] = set()  # studies whose baseline the analysts profiled
        self.records: dict[tuple[str, str], dict[str, Any]] = {}  # (study, source hash) -> its latest outcome record
        self.bound: Callable[[], float | None] = lambda: None  # the most one check or profile may take (time plan)

    def append(self, subdir: str, schema: Any, record: dict[str, Any]) -> None:
        if self._append is not None:
            self._append(subdir, schema, record)
            return
        with self._lock, ResultWriter(self.run_dir, schema, subdir=subdir) as writer:
            writer.append_record(record)

    def restore(self, study: StudyState) -> tuple[bool, list[tuple[AcceptedVariant, Trust, dict[str, Any]]]]:
        """The variants an earlier invocation admitted, joined again (no points enqueued: its study
        has them), with what their checks found; and whether its workflow finished."""
        done, variants = load_admitted(self.run_dir, study.name, study.target)
        states = check_states(read_table(self.run_dir, RunDir.VARIANTS, VARIANT_SCHEMA), study.name) if variants else {}
        restored = []
        for variant in sorted(variants, key=lambda v: not v.files_changed):
            self._join(study, variant, enqueue=False)
            trust, record = states.get(variant.source_hash, ("", {}))
            if record:
                self.records[(study.name, variant.source_hash)] = record
            restored.append((variant, Trust(trust), record))
        return done, restored

    def profiled_baseline(self, study: str) -> bool:
        """Whether the analysts profiled this study's baseline (its profile stage need not again)."""
        return study in self._profiled

    def propose(self, study: StudyState, jobs: StudyJobs, kernels: tuple,
                admit: Callable[[AcceptedVariant], Future[tuple[Verdict, ...]]] | None = None) -> None:
        """Steps 1-5 of the workflow for one study, in the calling (agents') thread: every outcome
        to the ``variants`` table as it comes, each variant the cheap checks admit to ``admit`` at
        once (its future: the expensive checks' verdicts, where it measured faster than the baseline).
        Analysts that read the baseline's profile wait for Nsight Compute; the others start at once."""
        admit = admit or _admit_nothing

        def admitted(variant: Target, plan: Plan, proposal: Proposal) -> Future[tuple[Verdict, ...]]:
            label = f"{plan.finding.optimization} {plan.finding.location}"
            return admit(AcceptedVariant(variant, label, dict(proposal.search_params), True))

        verifier = QueueVerifier(jobs, self.runs, known=frozenset(study.variants), admit=admitted)
        with self._lock:
            steps = self.steps(verifier)
            self.steps_used = steps
        gpu = study.device.kind == "gpu"
        profiling = gpu and self.spec.profile_baseline and self.profile_spec.candidates != "none"
        context = AnalysisContext(study.target, study.arch, study.baseline_median, kernels)
        later = [s for s in steps if profiling and s.analyst.uses_profile and _needs_profile(s, context)]
        now = [s for s in steps if s not in later]
        log.info(f"{study.name}: analysis, plans and transformations by "
                 f"{', '.join(s.analyst.name for s in steps)}; each proposal admitted by the cheap checks "
                 f"joins the search at once" + (f" ({', '.join(s.analyst.name for s in later)} after Nsight "
                                                f"Compute on the baseline)" if later else ""))
        accepted: list[Outcome] = []

        def on_outcome(outcome: Outcome) -> None:
            record = outcome_record(self.run_id, study.name, study.target, outcome)
            record["checks"] = expensive_state(outcome.verification)
            self.append(RunDir.VARIANTS, VARIANT_SCHEMA, record)
            with self._lock:
                if record["source_hash"]:
                    self.records[(study.name, record["source_hash"])] = record
            if SearchClosed.__name__ not in outcome.error:  # one line says so, from the flow
                log.info(f"{study.name}: {outcome.finding.optimization} {outcome.finding.location}: {outcome.stage}"
                         + (f" ({outcome.reason[:160]})" if outcome.reason and not outcome.accepted else ""))
            if outcome.accepted and outcome.proposal is not None:
                accepted.append(outcome)
                proposal = outcome.proposal
                admit(AcceptedVariant(variant_target(study.target, proposal),
                                      f"{outcome.finding.optimization} {outcome.finding.location}",
                                      dict(proposal.search_params), bool(proposal.files), record))

        def workflow(ctx: AnalysisContext, group: list[Steps]) -> list[Outcome]:
            return run_workflow(ctx, group, verifier, self.spec.retries, parallel=len(group),
                                findings_at_once=FINDINGS_AT_ONCE, on_outcome=on_outcome) if group else []

        def profiled() -> tuple[AnalysisContext, dict[str, float], list[Outcome]]:
            metrics, launched = self._baseline_metrics(study, jobs)
            ctx = dataclasses.replace(context, metrics=metrics, launched=launched)
            return ctx, metrics, workflow(ctx, later)

        with ThreadPoolExecutor(1, thread_name_prefix="agents-profiled") as pool:
            waiting = pool.submit(profiled) if later else None
            outcomes = workflow(context, now)
            metrics: dict[str, float] = {}
            if waiting is not None:
                context, metrics, more = waiting.result()
                outcomes += more
        rounds = QueueVerifier(jobs, self.runs)  # the rounds' trials: the cheap tier; their best is admitted
        for outcome in self._iterate(context, outcomes, rounds, study, metrics, steps):
            on_outcome(outcome)
        if self.spec.stack:
            for outcome in self._stack(context, accepted, verifier):
                on_outcome(outcome)
        mark_done(self.run_dir, study.name)

    def record_of(self, study: str, source_hash: str) -> dict[str, Any] | None:
        """The last outcome record of a variant: what a later check's record extends."""
        with self._lock:
            return self.records.get((study, source_hash))

    def join_variant(self, study: StudyState, variant: AcceptedVariant, best_flags: dict[str, str] | None) -> None:
        """An admitted variant into the study's running search (the driver's thread): its sources a
        value of the variant dimension (or its ``-maxrregcount`` values options of the flag), the
        search's study widened, and its plan's points entered ahead of the sampler, also with the
        best flags found so far."""
        if variant.files_changed and variant.source_hash in study.variants:
            return  # admitted by an earlier invocation, or proposed twice
        save_accepted(self.run_dir, study.name, variant)
        limit = MAX_ENQUEUED if self.trials is None else max(2, int(self.trials * ENQUEUED_SHARE) // VARIANTS_EXPECTED)
        self._join(study, variant, enqueue=True, limit=limit, best_flags=best_flags)

    def _configured_steps(self, verifier: Verifier) -> list[Steps]:
        """The config's choice per step: experts alone, or with LLM agents sharing one kit."""
        spec = self.spec
        if spec.llm is None and not spec.steps and not spec.custom:
            return [Steps.of(EXPERTS.load(name)()) for name in spec.experts]
        from agents.llm import Services, build_steps, make_kit
        from cluster.config.agents import choices_of

        if self.kit is None and spec.llm is not None:
            self.kit = make_kit(spec.llm, self.run_dir, replay=spec.replay)
        kit = self.kit
        if kit is not None:
            kit = dataclasses.replace(kit, services=Services(build=build_report, verify=verifier.verify))
        only = [*spec.experts, *(c.name for c in spec.custom)]
        return build_steps(spec.llm, choices_of(spec.steps, spec.custom, only=only), custom=spec.custom, kit=kit)

    def _stack(self, context: AnalysisContext, outcomes: list[Outcome], verifier: Verifier) -> list[Outcome]:
        """The accepted source changes merged into one variant, admitted as the others were."""
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
            log.info(f"{study.name}: {outcome.finding.optimization}: {len(result.rounds)} profile-guided rounds, "
                     f"stopped by {result.stopped}; best {best.speedup:.2f}x" if best and best.speedup else
                     f"{study.name}: {outcome.finding.optimization}: profile-guided rounds found nothing better")
        return extra

    def _baseline_metrics(self, study: StudyState, jobs: StudyJobs) -> tuple[dict[str, float], frozenset[str]]:
        """Nsight Compute on the baseline for the analysts, as a job ahead of the search: its
        metrics, and the kernels it saw launched."""
        if (study.device.kind != "gpu" or not self.spec.profile_baseline
                or self.profile_spec.candidates == "none"):
            return {}, frozenset()
        log.info(f"{study.name}: Nsight Compute on the baseline, for the analysts that read it")
        metrics = tuple(self.profile_spec.metrics or DEFAULT_METRICS)
        done = jobs.profile(None, metrics, bounded(self.profile_spec.timeout_s, self.bound()),
                            self.profile_spec.launches, label="the baseline, for the analysts").result()
        if done.dropped:
            log.info(f"{study.name}: the search closed before Nsight Compute ran on the baseline; analysing without")
            return {}, frozenset()
        profile: Profile = done.value if isinstance(done.value, Profile) else Profile(
            study.baseline_candidate().key, done.failure or Status.CRASHED, error_tail=done.error)
        for record in profile_records(self.run_id, study.target.name, study.device.device_type, profile):
            self.append(RunDir.PROFILES, PROFILE_SCHEMA, record)
        self._profiled.add(study.name)
        if profile.status is not Status.OK:
            log.info(f"{study.name}: baseline profile failed ({profile.status.value}); analysing without metrics")
            return {}, frozenset()
        return context_metrics(profile), profile.launched()

    def _join(self, study: StudyState, variant: AcceptedVariant, enqueue: bool, limit: int = MAX_ENQUEUED,
              best_flags: dict[str, str] | None = None) -> None:
        if variant.files_changed:
            study.add_variant(variant.target)
            if enqueue:
                study.widen()
                self._enqueue_variant(study, variant.target, limit, best_flags)
        elif "maxrregcount" in variant.search:
            _add_register_options(study, variant.search["maxrregcount"], enqueue, limit)

    def _enqueue_variant(self, study: StudyState, target: Target, limit: int,
                         best_flags: dict[str, str] | None = None) -> None:
        """The variant at its default params with the best flags so far (what the variant and the
        flags found may make together: the likeliest winner, first), then at points of its own
        params (the plan's search) with the baseline's flags, into the variants' stream."""
        names = list(target.spec.params)
        points = [dict(zip(names, values, strict=True)) for values in itertools.product(*target.spec.params.values())]
        points = _spread([p for p in points if target.satisfies(p)], limit)
        flag_sets = [(study.target.space.baseline, point) for point in points]
        if best_flags is not None:
            flag_sets.insert(0, (best_flags, target.baseline_params))
        stream = study.stream_of(True)
        assert stream is not None
        for flags, point in flag_sets:
            params = optuna_point(flags, point, target.spec.params, target.bundle.hash)
            storage_retry(lambda params=params: stream.enqueue_trial(params, skip_if_exists=True))


def _needs_profile(step: Steps, context: AnalysisContext) -> bool:
    try:
        return step.analyst.needs_profile(context)
    except Exception:  # an analyst that cannot tell: it waits for the profile, as it always did
        return True


def _admit_nothing(variant: AcceptedVariant) -> Future[tuple[Verdict, ...]]:
    done: Future[tuple[Verdict, ...]] = Future()
    done.set_result(())
    return done


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
    study.widen()
    for v in _spread(list(values), limit):
        flags = {**space.baseline, "maxrregcount": f"-maxrregcount={v}"}
        params = optuna_point(flags, study.target.baseline_params, study.target.spec.params)
        storage_retry(lambda params=params: study.study.enqueue_trial(params, skip_if_exists=True))


# -- what the workflow's outcomes and tools are in a sweep --------------------------------------

def outcome_record(run_id: str, study: str, target: Target, outcome: Outcome) -> dict[str, object]:
    proposal = outcome.proposal
    source_hash = ""
    if proposal is not None and proposal.files:
        try:
            source_hash = variant_target(target, proposal).bundle.hash
        except ValueError:
            source_hash = ""  # a file outside the target's sources: the guards rejected it
    diff = _diff(target, proposal.files) if proposal is not None and proposal.files else ""
    return {
        "run_id": run_id, "target": target.name, "study": study, "source_hash": source_hash,
        "optimization": outcome.finding.optimization, "level": outcome.finding.level.value,
        "location": outcome.finding.location, "stage": outcome.stage,
        "analyst": outcome.analyst, "planner": outcome.planner, "transformer": outcome.transformer,
        "attempt": outcome.attempt, "evidence": "\n".join(outcome.finding.evidence), "reason": outcome.reason,
        "plan": outcome.plan.to_json() if outcome.plan else "",
        "description": proposal.description if proposal else "", "diff": diff,
        "search": json.dumps({k: list(v) for k, v in (proposal.search_params if proposal else {}).items()}),
        "verdicts": outcome.verification.to_json() if outcome.verification else "", "created_at": time.time(),
        **usage_record(proposal if proposal is not None else Proposal("", "", ())), "checks": "",
    }


def _diff(target: Target, files: tuple[tuple[str, str], ...]) -> str:
    original = source_files(target)
    return "".join(unified_diff(path, original.get(path, ""), text) for path, text in files)


_TOOL_TEMP = re.compile(r"\S*/(?:build|run)-[0-9a-f]{16}-[^/\s]+/")


def build_report(context: AnalysisContext, files: Mapping[str, str]) -> str:
    """The LLM agents' build tool (``agents.llm.tools.Services.build``): compile the working copy
    here (the target's build command and timeout) and say how it went: the ptxas report on success,
    the compiler's tail on failure."""

    target = context.target
    changed = tuple((p, t) for p, t in files.items() if t != dict(target.bundle.files)[p].decode("utf-8", "replace"))
    variant = dataclasses.replace(target, bundle=variant_bundle(target, Variant(changed, "", "", target.bundle.hash)))
    candidate = Candidate(target.name, target.spec.toolchain, "local", context.arch, variant.bundle.hash, (),
                          tuple(target.baseline_params.items()))
    artifact = compile_candidate(variant, candidate)
    if artifact.status is not Status.OK:
        return f"build failed ({artifact.status}):\n{_TOOL_TEMP.sub('', artifact.error_tail)[-3000:]}"
    kernels = "\n".join(f"{k.kernel}: {k.registers} registers, {k.spill_stores} B spill stores, "
                        f"{k.shared_bytes} B shared" for k in artifact.kernels)
    return "build ok" + (f"\n{kernels}" if kernels else "")
