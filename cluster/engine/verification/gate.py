"""What may be a final: the expensive tier as a study's flow sees it (issue 25).

    a measurement in ─► ``consider``: among the best few, and faster than the baseline beyond the
        noise? ─► a variant's expensive checks (``DeepChecks``), a 10x candidate's fresh-seed review
    the finals ─► ``trust``: passed, pending (asked for now where it never ran, and ``promote``d),
        or failed

A candidate of the target's own sources has no expensive checks; one far faster than the baseline
has its review; a candidate of a retired variant (one that failed its checks) never passes.
"""

from __future__ import annotations

from concurrent.futures import Future

from cluster.core.encodings import beats, speedup, suspect_speedup
from cluster.core.types import Candidate, Measurement, Phase, Stats, Status, Verdict, VerdictStatus
from cluster.engine.scheduling.jobs import Job, JobKind, JobResult
from cluster.engine.verification.checks import Trust
from cluster.engine.verification.view import StudyView
from cluster.store.rundir import RunDir
from cluster.store.tables import REVIEW_SCHEMA

CHECK_KINDS = frozenset({JobKind.SANITIZE, JobKind.REVIEW})
CHECK_RUNS = 4  # a check job, in runs of its program: a sanitizer's tools (the cheat checks' runs are the finals')
CHECK_OVERHEAD_S = 5.0  # and the tools' own start
# A fresh-seed review's least time, in the baseline's runs: one seed's run of the baseline and of the
# candidate (no slower, being over 10x faster), half as much again for the host and the compare.
REVIEW_SEED_RUNS = 3.0
# The own sources' search candidates measured before a budgeted search buys a variant's checks: before
# them the bar is about the baseline, which most variants beat.
OWN_BAR_POINTS = 3


class Gate:
    def __init__(self, flow: StudyView, reviewed: dict[str, Trust]) -> None:
        self.flow = flow
        self.review_trust = dict(reviewed)  # candidate key -> its fresh-seed review (an earlier invocation's too)
        self.reviews: list[str] = []  # one word per review, for the summary line
        self.check_s: float | None = None  # this study's expensive checks, worker-seconds a job (a running mean)
        self.deferred = False  # a variant's checks put off until the own sources' bar stands (``bar_stands``)

    # -- which, and when ---------------------------------------------------------------------------
    @property
    def check_slots(self) -> int:
        """Variants whose expensive checks may run at once: with a time budget one (a study has one
        winner; another's checks come when that one's are in, or its finals ask), else the best few."""
        ctx = self.flow.ctx
        return 1 if ctx.plan is not None else max(1, ctx.config.measure.final_top_k)

    def contenders(self) -> set[str]:
        """The candidates the finals would take now: the best few, a failed variant's left out."""
        state = self.flow.state
        wanted = max(1, self.flow.ctx.config.measure.final_top_k)
        baseline = state.baseline_candidate().key  # once: a candidate's key is not cheap, the ranking long
        best = [c.key for c in state.ranked() if c.source_hash not in state.retired and c.key != baseline]
        return set(best[:wanted])

    def own_best(self) -> Stats | None:
        """The statistics of the best candidate of the target's own sources (the baseline is one):
        what a sweep without the agents would have, and what a variant's checks must be worth
        beating."""
        state, stats = self.flow.state, self.flow.stats
        found = stats.get(state.own_best) if state.own_best else None
        return found or stats.get(state.baseline_candidate().key)

    def could_win(self, candidate: Candidate, stats: Stats | None = None) -> bool:
        """Whether its measurement (``stats``, else its own) is better than the best of the target's
        own sources beyond their noise: a variant that is not could never be the winner, and its
        expensive checks would buy nothing."""
        mine = stats if stats is not None else self.flow.stats.get(candidate.key)
        own = self.own_best()
        return mine is not None and own is not None and beats(mine.median, mine.iqr, own.median, own.iqr,
                                                                self.flow.state.goal)

    def bar_stands(self) -> bool:
        """Whether the best of the own sources is a bar to buy a variant's checks against during a
        budgeted search: once their first few candidates are measured (``OWN_BAR_POINTS``), or where
        none are to come. The checks of a variant that the own sources overtake a few candidates
        later are the study's search time lost: on an H200 at 300 s, softmax_rows' variant at 1.31x
        was checked (two compute-sanitizer jobs, 18.6 s of the program's 40 s of GPU time) when its
        own sources had measured two candidates; their third was 1.39x. A variant still a finalist
        when the search closes has its checks asked for by the finals; without a budget, at once."""
        flow = self.flow
        if flow.ctx.plan is None:
            return True
        state = flow.state
        own = state.target.bundle.hash
        measured = sum(1 for key in state.results if (c := state.candidates.get(key)) is not None
                       and c.source_hash == own and c.phase is Phase.SEARCH)
        return measured >= OWN_BAR_POINTS or not state.room(flow.ctx.config.search.trials)[0]

    def contends(self, source_hash: str) -> bool:
        """Whether a candidate of the variant is among those the finals would take now and could win:
        its checks are worth their time."""
        candidates = (self.flow.state.candidates[key] for key in self.contenders())
        return any(c.source_hash == source_hash and self.could_win(c) for c in candidates)

    def consider(self, candidate: Candidate | None, stats: Stats,
                 ticket: Future[tuple[Verdict, ...]] | None = None) -> None:
        """A measurement in: a variant faster than the best of the target's own sources beyond the
        noise (one that could win), and among the best few (those the finals would take now), gets
        its expensive checks (``ticket``: its admission waits for them) once that best is a bar
        (``bar_stands``; the own sources' measurement that makes it one brings the best variant's
        turn); such a candidate over 10x the baseline, its fresh-seed review."""
        flow, state = self.flow, self.flow.state
        base = flow.stats.get(state.baseline_candidate().key)
        if candidate is None or base is None:
            return
        if self.deferred and candidate.source_hash not in state.variants and self.bar_stands():
            self.deferred = False
            best = next((c for c in state.ranked() if c.source_hash in state.variants), None)
            if best is not None and (found := flow.stats.get(best.key)) is not None:
                self.consider(best, found)
        if candidate.key not in self.contenders():
            return
        if candidate.source_hash in state.variants and self.could_win(candidate, stats):
            if not self.bar_stands():
                self.deferred = True
            elif len(flow.checks.pending()) < self.check_slots:
                ratio = speedup(stats.median, base.median, state.goal) or 0.0
                flow.checks.request(candidate.source_hash, f"measured {ratio:.2f}x the baseline", ticket,
                                    value=self.gain(stats.median))
        if suspect_speedup(speedup(stats.median, base.median, state.goal)):
            self.review(candidate)

    def gain(self, median: float | None) -> float:
        """What trusting a candidate measured at ``median`` may gain its study: its speedup over the
        best measurement of the target's own sources (no expensive check holds those back; the
        baseline is one). Its checks' place in their lane (``Job.value``), the largest first: on an
        H100 with a 300 s budget, a 72 s compute-sanitizer run of a 1.01x variant, queued first,
        kept a verified 1.91x variant's checks and a 3.92x variant's final past the deadline."""
        state = self.flow.state
        own = state.results[state.own_best].median if state.own_best else state.baseline_median
        return speedup(median, own, state.goal) or 0.0

    def trust(self, candidate: Candidate, ask: bool = True) -> Trust:
        """Whether a candidate may be a final; ``ask``: start what has not run."""
        flow, state = self.flow, self.flow.state
        if candidate.source_hash in state.retired:
            return Trust.FAILED
        trusts = []
        result = state.results.get(candidate.key)
        if candidate.source_hash in state.variants:
            trust = flow.checks.trust(candidate.source_hash)
            if trust is Trust.NOT_RUN and ask:
                trust = flow.checks.request(candidate.source_hash, "a finalist",
                                            value=self.gain(result.median if result is not None else None))
            trusts.append(trust)
        if result is not None and suspect_speedup(speedup(result.median, state.baseline_median, state.goal)):
            trust = self.review_trust.get(candidate.key, Trust.NOT_RUN)
            if trust is Trust.NOT_RUN and ask:
                trust = self.review(candidate)
            trusts.append(trust)
        for worst in (Trust.FAILED, Trust.NOT_RUN, Trust.PENDING):
            if worst in trusts:
                return worst
        return Trust.PASSED

    def promote(self) -> None:
        """The study waits for its checks (its finals): they go first in their lane."""
        self.flow.ctx.scheduler.promote(self.flow.name, CHECK_KINDS)

    # -- the plan's estimates ----------------------------------------------------------------------
    def timed(self, job: Job) -> None:
        """A check's time on its worker, for the estimate of the checks still to come (the plan's
        learns it for the device type, across studies)."""
        if job.service_s > 0:
            self.check_s = job.service_s if self.check_s is None else 0.7 * self.check_s + 0.3 * job.service_s
            if self.flow.ctx.plan is not None:
                self.flow.ctx.plan.checked(self.flow.device_type, job.service_s)

    def checks_left(self, run: float) -> float:
        """Worker-seconds of the expensive checks the finals would wait for: those of the finalists
        (the candidates the finals would take now) not yet passed, a variant's compute-sanitizer one
        job (its cheat checks are its finals' runs), a review one; a variant that could not win none
        (the finals pass it by). A job at what the device type's checks took in this run, within the bound."""
        flow, state = self.flow, self.flow.state
        jobs = 0
        for key in self.contenders():
            candidate = state.candidates[key]
            trust = flow.checks.trust(candidate.source_hash) if candidate.source_hash in state.variants else None
            if trust is Trust.PENDING or (trust is Trust.NOT_RUN and self.could_win(candidate)):
                jobs += 1
            if self.review_trust.get(key) is Trust.PENDING:
                jobs += 1
        if not jobs:
            return 0.0
        plan = flow.ctx.plan
        per_job = plan.check_estimate(flow.device_type) if plan is not None else None
        if per_job is None:
            per_job = self.check_s if self.check_s is not None else CHECK_RUNS * run + CHECK_OVERHEAD_S
        bound = plan.check_bound() if plan is not None else flow.ctx.config.agents.sanitizer_timeout_s
        return min(bound, per_job) * jobs

    # -- the fresh-seed review ---------------------------------------------------------------------
    def review(self, candidate: Candidate) -> Trust:
        """A candidate far faster than its baseline, run again against it on fresh seeds, once."""
        if self.review_trust.get(candidate.key, Trust.NOT_RUN) is not Trust.NOT_RUN:
            return self.review_trust[candidate.key]
        self.review_trust[candidate.key] = Trust.PENDING
        result = self.flow.state.results.get(candidate.key)
        plan, run_s = self.flow.ctx.plan, self.flow.state.baseline_run_s or 0.0
        timeout = None if plan is None else plan.review_bound(REVIEW_SEED_RUNS * run_s,
                                                              device_type=self.flow.device_type)
        future = self.flow.jobs.review(candidate, label="over 10x the baseline, on fresh seeds",
                                       value=self.gain(result.median if result is not None else None),
                                       timeout=timeout)
        if self.flow.jobs.urgent:
            self.promote()
        future.add_done_callback(lambda f: self.reviewed(f.result()))
        return Trust.PENDING

    def reviewed(self, result: JobResult) -> None:
        flow, job, state = self.flow, result.job, self.flow.state
        if result.failure is not None:  # it took its worker down on fresh seeds, or every worker was lost
            why = f"{result.failure.value}: {result.error}"
            verdict = Verdict("fresh_seeds", VerdictStatus.FAILED, "the re-verification did not complete: "
                              + (why if len(why) <= 300 else f"{why[:80]} ... {why[-200:]}"))
        elif isinstance(result.value, Verdict):
            verdict = result.value
        else:  # its build failed
            verdict = Verdict("fresh_seeds", VerdictStatus.SKIPPED,
                              f"not run: {result.error or result.artifact.error_tail}"[:300])
        key = job.candidate.key
        ratio = speedup(state.results[key].median, state.baseline_median, state.goal) if key in state.results else None
        self.reviews.append(verdict.status.value)
        self.review_trust[key] = Trust.FAILED if verdict.failed else Trust.PASSED
        flow.ctx.append(RunDir.REVIEWS, REVIEW_SCHEMA, {
            "run_id": flow.ctx.run_id, "study": flow.name, "candidate_key": key, "speedup": ratio,
            "status": verdict.status.value, "detail": verdict.detail})
        if verdict.failed:
            failed = Measurement(key, Status.VERIFY_FAILED, state.device,
                                 error_tail=f"fresh-seed re-verification: {verdict.detail}")
            flow.record_row(job.target, job.candidate.with_phase(Phase.FINAL), result.artifact, failed)
