"""A study's finals: the best few candidates and the baseline again, on seeds the search did not
use (1..final_runs), what the selection trusts.

    the baseline's final (on seeds it had not run, its outputs become the reference there)
        ─► the best candidates in order, up to ``final_top_k``: one that needs no checks at once;
           a variant once its expensive checks passed, a 10x candidate once its fresh-seed review
           did (asked for now where they never ran, and promoted to the front of the check lane),
           waiting beside the others, not in their place; one that failed is left out

With a time budget, a candidate whose checks cannot finish in time is left out (its rows stay: it
is shown as the best so far where nothing re-measured beats it); its checks go on, and where they
pass while its final still fits the time left, it is taken back: the study waits for them so long.
"""

from __future__ import annotations

import logging

import ray

from cluster.core.placeholders import names_in
from cluster.core.types import Candidate, Measurement, Phase, Status
from cluster.engine.scheduling.jobs import JobKind
from cluster.engine.study.state import save_reference
from cluster.engine.verification.checks import Trust
from cluster.engine.verification.gate import Gate
from cluster.engine.verification.view import StudyView
from cluster.measure.measure import Reference

log = logging.getLogger(f"warpfleet.{__name__}")


class Finals:
    def __init__(self, flow: StudyView, gate: Gate) -> None:
        self.flow, self.gate = flow, gate
        self.entered = False
        self.reference: Reference | None = None  # the baseline's outputs by seed, as the flow made or loaded them
        self.reference_ready = False
        self.pool: list[Candidate] = []  # the rest of the ranking, best first
        self.finalists: list[str] = []  # keys whose finals were submitted (or ran before a resume)
        self.outstanding: set[str] = set()
        self.holding: set[str] = set()  # waiting for their checks
        self.gave_up: list[str] = []
        self.again: set[str] = set()  # finalists whose noisy final was run once more
        self.baseline_key = ""  # once the baseline's final is submitted

    @property
    def wanted(self) -> int:
        """Finalists besides the baseline: ``measure.final_top_k``, or fewer where the time budget
        made the finals smaller (``TimePlan.finals_size``)."""
        return self._size()[0]

    @property
    def runs(self) -> int:
        """Runs of each final, on seeds 1..runs: ``measure.final_runs``, or fewer (as ``wanted``)."""
        return self._size()[1]

    def _size(self) -> tuple[int, int]:
        measure, plan = self.flow.ctx.config.measure, self.flow.ctx.plan
        if plan is not None:  # made from the same settings (driver), smaller where the budget asks
            return plan.finals_size(self.flow.device_type)
        return max(1, measure.final_top_k), measure.final_runs

    # -- entering ------------------------------------------------------------------------------
    def enter(self) -> None:
        flow, state = self.flow, self.flow.state
        self.entered = True
        before = {r["candidate_key"] for r in flow.rows if r["phase"] == Phase.FINAL.value}
        baseline = state.baseline_candidate().key
        ranked = [c for c in state.ranked() if c.key != baseline]
        # Finals measured before (a search reopened, or a resume) count only while they are still
        # among the best: a better candidate found since has its final too.
        top = {c.key for c in ranked[:self.wanted]}
        self.finalists = [k for k in before if k != baseline and k in top]
        self.pool = [c for c in ranked if c.key not in before]
        missing = self._missing_seeds()
        if missing and baseline not in before:
            self._submit(state.baseline_candidate(), extend=True)  # its outputs: the finals' references
            return
        if missing:  # its final ran before a resume whose references/ were lost
            have = self.runs + 1 - missing
            flow.submit(flow.jobs.job(JobKind.REFERENCE, flow.jobs.build(), runs=missing, first_seed=have,
                                       label=f"the baseline's outputs on seeds {have}..{have + missing - 1}"))
            return
        self._ready(baseline not in before)

    def _missing_seeds(self) -> int:
        """Seeds 1..final_runs whose baseline outputs the reference lacks (a seeded run only)."""
        spec = self.flow.state.target.spec
        if "seed" not in names_in(spec.run) or self.reference is None:
            return 0
        return max(0, self.runs + 1 - len(self.reference.runs))

    def referenced(self, measurement: Measurement, first_seed: int | None = None, final: bool = False) -> None:
        """The baseline's outputs on the missing seeds are in (from ``first_seed`` on; default: the
        seed after the reference's last): the reference extended, then the finals; ``final``: they
        came from the baseline's own final, which is not run again."""
        assert self.reference is not None
        keep = len(self.reference.runs) if first_seed is None else first_seed
        # The clock stays: the finals' claims are judged against it (a reference without one judged none).
        self.reference = Reference((*self.reference.runs[:keep], *measurement.outputs), self.reference.clock)
        save_reference(self.flow.ctx.run_dir, self.flow.state.baseline_candidate().key, self.reference)
        self.flow.state.reference = ray.put(self.reference)
        self._ready(not final)

    def reference_failed(self, why: str) -> None:
        log.info(f"{self.flow.name}: the baseline failed on the finals' seeds ({why}): no finals")
        self.pool.clear()
        self.reference_ready = True

    def _ready(self, baseline_final: bool) -> None:
        self.reference_ready = True
        if baseline_final:
            self._submit(self.flow.state.baseline_candidate())

    # -- the finalists -------------------------------------------------------------------------
    def step(self) -> bool:
        """Submit what can go; True when the finals are complete."""
        if not self.reference_ready or self.baseline_key in self.outstanding:
            return False  # the finalists' rows give their speedups over the baseline's final: it goes first
        self._settle_holds()
        self._fill()
        self._take_back()
        return not self.outstanding and not self.holding and not self.flow.awaited and not (
            self.gave_up and self._late_fits())

    def _fill(self) -> None:
        """Finalists up to ``wanted``, best first. A variant whose checks are not in waits for them
        (``holding``) beside the finalists and takes no place of theirs, so the best candidates that
        need no checks have their finals whatever the variants' checks do: the finals with the
        agents on re-measure at least what they would without (on an H200, three studies whose one
        place was held by a variant's pending checks ended at 1.00x). At most ``wanted`` wait: the
        rest stay in the pool for a place (a fake GPU's sweep had held 300 candidates of one
        variant, each to have a final once its checks passed)."""
        rest: list[Candidate] = []
        for at, candidate in enumerate(self.pool):
            if len(self.finalists) >= self.wanted:
                rest.extend(self.pool[at:])
                break
            unchecked = (candidate.source_hash in self.flow.state.variants
                         and self.flow.checks.trust(candidate.source_hash) is Trust.NOT_RUN)
            if unchecked and not self.gate.could_win(candidate):
                continue  # a variant no better than the own sources' best: not worth its expensive checks
            if unchecked and len(self.flow.checks.pending()) >= self.gate.check_slots:
                continue  # with a time budget, one variant's checks at a time: the best one's
            if len(self.holding) + len(self.gave_up) >= self.wanted and self._needs_checks(candidate):
                rest.append(candidate)  # waits for a place among those waiting
                continue
            trust = self.gate.trust(candidate)
            if trust is Trust.PASSED:
                self._submit(candidate)
            elif trust is not Trust.FAILED:
                self.holding.add(candidate.key)
                self.gate.promote()
        self.pool = rest

    def _needs_checks(self, candidate: Candidate) -> bool:
        """Whether the gate would hold it: its trust is neither passed nor failed (asking nothing)."""
        return self.gate.trust(candidate, ask=False) not in (Trust.PASSED, Trust.FAILED)

    def _settle_holds(self) -> None:
        flow = self.flow
        plan = flow.ctx.plan
        for key in sorted(self.holding):
            candidate = flow.state.candidates[key]
            trust = self.gate.trust(candidate, ask=False)
            if trust is Trust.PASSED:
                self.holding.discard(key)
                self._submit(candidate)
            elif trust is Trust.FAILED:
                self.holding.discard(key)
            elif plan is not None and not plan.may_wait(flow.device_type, sum(flow.work_left())):
                self.holding.discard(key)
                self.gave_up.append(key)
                log.info(f"{flow.name}: {key}: its checks did not finish within the time budget; "
                             f"left out of the finals (shown as not re-measured where it is the best)")

    def _take_back(self) -> None:
        """The finalists given up for their checks: one whose checks failed is dropped; one whose
        checks passed has its final after all, while it fits the time left (on the suite's unroll,
        an H100 left a verified 11.7x variant out for checks that passed 105 s later, and the sweep
        ended 190 s early with a 2.0x winner)."""
        flow = self.flow
        for key in list(self.gave_up):
            trust = self.gate.trust(flow.state.candidates[key], ask=False)
            if trust is Trust.FAILED:
                self.gave_up.remove(key)
            elif trust is Trust.PASSED and self._late_fits():
                self.gave_up.remove(key)
                log.info(f"{flow.name}: {key}: its checks passed after all, and its final fits the time left: "
                         f"back in the finals")
                self._submit(flow.state.candidates[key])

    def _late_fits(self) -> bool:
        """Whether one more final (a finalist's, its runs and a job's overhead) ends by the deadline."""
        plan = self.flow.ctx.plan
        if plan is None:
            return True
        run = self.flow.run_estimate
        run = plan.typical_run(self.flow.device_type) if run is None else run
        return plan.may_wait(self.flow.device_type, self.flow.job_overhead + self.runs * run)

    def _submit(self, candidate: Candidate, extend: bool = False) -> None:
        """Its final; ``extend``: the baseline's, with no reference (its outputs become the finals')."""
        flow = self.flow
        source = flow.state.source_of(candidate)[0]
        build = flow.jobs.build(source, candidate.with_phase(Phase.FINAL))
        baseline = candidate.key == flow.state.baseline_candidate().key
        if baseline:
            self.baseline_key = candidate.key
        elif candidate.key not in self.finalists:
            self.finalists.append(candidate.key)
        self.outstanding.add(candidate.key)
        # A finalist's runs are watched for a cache, and an agent's variant's have their outputs
        # poisoned: the cheat checks, in runs it has anyway. The target's own sources' outputs are not
        # poisoned: a target whose registered outputs are not all written on every launch (partial
        # sums) would fail its own. The baseline's final makes the references: it is what is trusted.
        variant = candidate.source_hash in flow.state.variants
        earlier = flow.stats.get(candidate.key)  # its search's or admission's: a first run in a stage of its own
        flow.submit(flow.jobs.job(JobKind.FINAL, build, runs=self.runs, first_seed=1,
                                   reference=None if extend else flow.state.reference,
                                   label="the baseline" if baseline else "",
                                   args={"poison": variant,
                                         "cache_check": not baseline and flow.ctx.config.agents.guardrails,
                                         "earlier": earlier.median if earlier is not None else None}))

    def measured(self, key: str, measurement: Measurement | None, extended: bool) -> None:
        """A final is in; the baseline's that made the finals' references: the others can go."""
        self.outstanding.discard(key)
        if not extended:
            self._again_if_noisy(key, measurement)
            return
        if measurement is None or measurement.status is not Status.OK or not measurement.outputs:
            why = measurement.status.value if measurement is not None else "not run"
            self.reference_failed(why)
            return
        self.referenced(measurement, first_seed=1, final=True)

    def _again_if_noisy(self, key: str, measurement: Measurement | None) -> None:
        """A finalist's final whose runs were noisy (IQR/median over ``measure.max_noise``) and worse
        than its earlier measurement by more than that is run once more where it fits the time left,
        and the selection takes the quiet re-measurement over the noisy one (``cluster.store.select``):
        on an H200 two of a launch-bound program's three final runs came 28% slow (cs_sortingNetworks,
        IQR/median 0.248; 0.463 ms against its search's 0.374), and its 11% win lost to the baseline.
        A noisy final that bears its candidate out is kept (a program noisy by itself would pay for a
        second final for nothing), and the baseline's is not run again: it made the finals' references."""
        stats = measurement.stats if measurement is not None and measurement.status is Status.OK else None
        noise = self.flow.ctx.config.measure.max_noise
        if (key == self.baseline_key or key in self.again or stats is None or stats.rel_noise <= noise
                or not self._worse_than_before(key, stats.median, noise) or not self._late_fits()):
            return
        self.again.add(key)
        log.info(f"{self.flow.name}: {key}: its final was noisy (IQR/median {stats.rel_noise:.3f}): run once more")
        self._submit(self.flow.state.candidates[key])

    def _worse_than_before(self, key: str, median: float, noise: float) -> bool:
        before = self.flow.stats.get(key)
        if before is None:
            return False
        if self.flow.state.goal == "maximize":
            return median < before.median * (1.0 - noise)
        return median > before.median * (1.0 + noise)

    # -- the time plan -------------------------------------------------------------------------
    def work_left(self, run_s: float, overhead_s: float = 0.0) -> float:
        """Worker-seconds its finals still take: ``run_s`` a run, ``overhead_s`` a job besides its runs."""
        if not self.entered:
            baseline = self.flow.state.baseline_candidate().key
            measured = sum(1 for c in self.flow.state.ranked() if c.key != baseline)
            finals = min(self.wanted, max(1, measured)) + 1
        else:
            room = max(0, self.wanted - len(self.finalists)) if self.pool else 0
            finals = len(self.outstanding) + len(self.holding) + room
        return finals * (overhead_s + self.runs * run_s)
