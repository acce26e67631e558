"""Verification's expensive tier: compute-sanitizer and the cheat checks, for a variant that
measured faster than the best of the target's own sources beyond its noise, and the fresh-seed
review of a candidate more than 10x the baseline.

    admitted variant (cheap tier: guards, dependence graph, contracts, build, one run, its time)
        ─► joins the search ─► measures faster than the own sources' best, among the best few
        ─► ``DeepChecks.request`` ─► the timing code it changed (read, no run) and compute-sanitizer
           (the baseline's own run of each tool only where a variant's is not clean), as jobs of
           the check lane ─► passed or failed, recorded in ``variants/``
        ─► its finals: the cheat checks that need runs are the finals' own runs (outputs poisoned,
           fresh directories, the clocks; without ``{seed}`` a later run far faster than the first
           is a cache); a variant whose final fails there fails them (``failed_in_finals``)

A variant that could not win (``Gate.could_win``) never pays for them; one that could be a final,
a winner or an export must have passed them (``StudyFlow`` asks for them, promoted, before its
finals). The cheat checks were a job of a dozen runs a variant (13-23 s on an H200); a candidate
that knew their variable behaved only under them, and cheated in its finals.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from agents.cuda_source import analyze
from agents.patch import source_files
from cluster.config import Target
from cluster.core.types import Verdict, VerdictStatus
from cluster.engine.scheduling.jobs import JobResult
from cluster.engine.verification.verify import SANITIZER_FACTOR, SANITIZER_FLOOR_S, sanitizer_verdicts
from cluster.measure.guardrails import check_timing_code
from cluster.measure.sanitize import SanitizerResult
from cluster.store.variants import AcceptedVariant

if TYPE_CHECKING:
    from cluster.engine.study.study_jobs import StudyJobs


log = logging.getLogger(f"warpfleet.{__name__}")


class Trust(StrEnum):
    """Where a variant or candidate stands with the expensive tier."""

    NOT_RUN = ""  # never asked for (it could not win so far)
    PENDING = "pending"
    PASSED = "passed"
    FAILED = "failed"


UNMEASURED_FACTOR = 100.0  # a tool's budget, in the program's runs, until the baseline's own time under it is known
EXPENSIVE = frozenset({"memcheck", "racecheck", "initcheck", "synccheck", "sanitizer", "cheat_checks",
                       "poisoned_outputs", "cached_results", "untimed_work", "timing_code", "finals"})


def expensive_state(verification: Any) -> str:
    """What a verification says of the expensive tier: "" (it did not run), "passed" or "failed"."""
    ran = [v for v in (verification.verdicts if verification is not None else ()) if v.check in EXPENSIVE]
    if not ran:
        return ""
    return Trust.FAILED.value if any(v.failed for v in ran) else Trust.PASSED.value


@dataclass
class _Checked:
    variant: AcceptedVariant
    record: dict[str, Any]
    trust: Trust = Trust.NOT_RUN
    kernels: tuple[str, ...] = ()  # the kernels it changed: compute-sanitizer checks those
    verdicts: list[Verdict] = field(default_factory=list)
    outstanding: int = 0
    started: float = 0.0
    value: float = 0.0  # what it may gain its study (``Gate.gain``): its jobs' place in the check lane
    # The admission that waits for these verdicts (the agents' thread: feedback for a retry); while
    # one waits, its outcome's record carries them, and no record of the checks' own is written.
    tickets: list[Future[tuple[Verdict, ...]]] = field(default_factory=list)
    deferred: tuple[str, ...] = ()  # tools to run again, with the baseline's budget, once it contends again


def changed_files(original: Target, variant: Target) -> dict[str, str]:
    """The sources a variant changed, as text: what the cheat checks read."""
    before, after = source_files(original), source_files(variant)
    return {path: text for path, text in after.items() if before.get(path) != text}


def changed_kernels(original: Target, variant: Target) -> tuple[str, ...]:
    """The kernels whose definitions a variant changed, by name; () where it changed anything else
    (host code, a header, a kernel added or removed, a file the parser cannot read): then compute-
    sanitizer checks every kernel."""
    before = source_files(original)
    names: set[str] = set()
    for path, text in changed_files(original, variant).items():
        old = before.get(path)
        if old is None or not path.endswith((".cu", ".cuh")):
            return ()
        old_kernels, new_kernels = _kernel_texts(old, path), _kernel_texts(text, path)
        if old_kernels is None or new_kernels is None or old_kernels.keys() != new_kernels.keys():
            return ()
        if _outside_kernels(old, path) != _outside_kernels(text, path):
            return ()
        names |= {name for name, body in new_kernels.items() if old_kernels[name] != body}
    return tuple(sorted(names))


def _kernel_texts(text: str, path: str) -> dict[str, str] | None:
    model = analyze(text, path)
    if model.errors:
        return None
    texts: dict[str, str] = {}
    for kernel in model.kernels:
        texts[kernel.name] = texts.get(kernel.name, "") + text[kernel.span.start:kernel.span.end]
    return texts


def _outside_kernels(text: str, path: str) -> str:
    kept, at = [], 0
    for kernel in sorted(analyze(text, path).kernels, key=lambda k: k.span.start):
        kept.append(text[at:kernel.span.start])
        at = kernel.span.end
    return "".join(kept) + text[at:]


class DeepChecks:
    """The expensive tier of one study's variants, driven from the driver's thread: ``request``
    submits the checks, their futures finish in the flow's ``on_result``."""

    def __init__(self, jobs: StudyJobs, tools: tuple[str, ...], cap_s: float, guardrails: bool,
                 write: Callable[[dict[str, Any]], None],
                 record_of: Callable[[str], dict[str, Any] | None] = lambda source_hash: None,
                 on_failed: Callable[[str], None] = lambda source_hash: None) -> None:
        self.jobs, self.tools, self.cap_s, self.guardrails = jobs, tools, cap_s, guardrails
        self.write, self.record_of, self.on_failed = write, record_of, on_failed
        self.variants: dict[str, _Checked] = {}
        self._baseline: dict[str, SanitizerResult] | None = None
        self._baseline_asked = False
        self._waiting_for_baseline: list[tuple[_Checked, tuple[SanitizerResult, ...], dict[str, float]]] = []
        self.run_s = 1.0  # the program's time a run (the flow's estimate): the sanitizer's budget before the baseline's
        self.bound: Callable[[], float | None] = lambda: None  # the most one check job may take (the time plan's)
        self.launches: int | None = None  # kernel launches compute-sanitizer checks a run (agents.sanitizer_launches)
        # Whether a variant still has a candidate the finals would take that could win (``Gate.contends``).
        self.contends: Callable[[str], bool] = lambda source_hash: True

    @property
    def configured(self) -> bool:
        return bool(self.tools) or self.guardrails

    def add(self, variant: AcceptedVariant, record: dict[str, Any] | None, trust: Trust = Trust.NOT_RUN) -> None:
        """An admitted variant (``trust``: what an earlier invocation's checks found)."""
        if variant.source_hash not in self.variants:
            self.variants[variant.source_hash] = _Checked(variant, dict(record or {}), trust)
        if trust is Trust.FAILED:
            self.on_failed(variant.source_hash)

    def trust(self, source_hash: str) -> Trust:
        checked = self.variants.get(source_hash)
        return Trust.PASSED if checked is None else checked.trust

    def pending(self) -> list[str]:
        return [h for h, c in self.variants.items() if c.trust is Trust.PENDING]

    def request(self, source_hash: str, why: str, ticket: Future[tuple[Verdict, ...]] | None = None,
                value: float = 0.0) -> Trust:
        """The expensive checks of an admitted variant, once; its trust now. ``ticket`` gets their
        verdicts once they are in (at once, where they ran before); ``value``: what it may gain the
        study, the checks' place in their lane (the most valuable first)."""
        checked = self.variants.get(source_hash)
        if checked is None:
            _resolve(ticket, ())
            return self.trust(source_hash)
        if ticket is not None:
            checked.tickets.append(ticket)
        if checked.trust is not Trust.NOT_RUN:
            if checked.trust is not Trust.PENDING:
                self._answer(checked)
            return checked.trust
        if checked.deferred:  # the rest of its checks, put off while it could not be a final
            tools, checked.deferred = checked.deferred, ()
            checked.trust, checked.started, checked.value = Trust.PENDING, time.monotonic(), value
            log.info(f"{self.jobs.state.name}: {checked.variant.label}: {why}: {', '.join(tools)} again")
            self._sanitize(checked, tools)
            return checked.trust
        if not self.configured:
            checked.trust = Trust.PASSED
            self._answer(checked)
            return checked.trust
        checked.trust, checked.started, checked.value = Trust.PENDING, time.monotonic(), value
        if self.guardrails:  # the cheat checks that need no run; those that do are the finals' own runs
            start = time.monotonic()
            verdict = check_timing_code(self.jobs.state.target, changed_files(self.jobs.state.target,
                                                                             checked.variant.target))
            checked.verdicts.append(dataclasses.replace(verdict, seconds=time.monotonic() - start))
        if self.tools and not any(v.failed for v in checked.verdicts):
            log.info(f"{self.jobs.state.name}: {checked.variant.label}: {why}: compute-sanitizer before it can be "
                     f"a final")
            checked.kernels = changed_kernels(self.jobs.state.target, checked.variant.target)
            self._sanitize(checked, self.tools)
        self._settle(checked)
        return checked.trust

    def failed_in_finals(self, source_hash: str, why: str) -> None:
        """A variant's final failed where a cheat fails: its outputs with the outputs poisoned, its
        clock, a cache kept across runs (``measure_candidate``'s ``poison`` and ``cache_check``). The
        cheat checks' runs are the finals' runs: it leaves the search as a failed check would have
        made it, recorded with the verdict ``finals``."""
        checked = self.variants.get(source_hash)
        if checked is None or checked.trust is Trust.FAILED:
            return
        failed = Verdict("finals", VerdictStatus.FAILED, why[:300])
        checked.verdicts.append(failed)
        checked.trust = Trust.FAILED
        log.info(f"{self.jobs.state.name}: {checked.variant.label}: its final failed: {why[:200]}")
        self.write(self._record(checked, [failed]))
        self._answer(checked)
        self.on_failed(source_hash)

    # -- the jobs --------------------------------------------------------------------------------
    def _expect(self, checked: _Checked, future: Future[JobResult],
                done: Callable[[_Checked, JobResult], None]) -> None:
        checked.outstanding += 1

        def finished(f: Future[JobResult]) -> None:
            checked.outstanding -= 1
            done(checked, f.result())
            self._settle(checked)

        future.add_done_callback(finished)

    # compute-sanitizer: the variant first, within budgets from the baseline's own runs where they
    # are known, else from the program's run time (``run_s``, set by the flow). The baseline runs
    # under the tools only where a variant's run did not come back clean: its errors are not held
    # against the variant, and its time sizes the budget a timed-out variant is given again. A
    # study whose variants are clean never pays for the baseline's run.
    def _cap(self, tools: tuple[str, ...]) -> float:
        """A tool's longest run: ``cap_s``, and its share of the time plan's bound on one job."""
        bound = self.bound()
        return self.cap_s if bound is None else min(self.cap_s, bound / max(1, len(tools)))

    def _budgets(self, tools: tuple[str, ...]) -> dict[str, float]:
        cap = self._cap(tools)
        if self._baseline is not None:
            return {tool: min(cap, max(SANITIZER_FLOOR_S, SANITIZER_FACTOR * r.seconds))
                    for tool, r in self._baseline.items() if tool in tools}
        return {tool: min(cap, max(SANITIZER_FLOOR_S, UNMEASURED_FACTOR * self.run_s)) for tool in tools}

    def _sanitize(self, checked: _Checked, tools: tuple[str, ...]) -> None:
        budgets = self._budgets(tools)
        future = self.jobs.sanitize(checked.variant.target, tools, self._cap(tools), budgets,
                                    label=f"{', '.join(tools)} on {checked.variant.label}", value=checked.value,
                                    kernels=checked.kernels, launches=self.launches)
        self._expect(checked, future, lambda c, done: self._sanitized(c, done, budgets))

    def _sanitized(self, checked: _Checked, done: JobResult, budgets: dict[str, float]) -> None:
        if done.failure is not None or done.value is None:
            checked.verdicts.append(Verdict("sanitizer", VerdictStatus.SKIPPED,
                                            f"not run: {done.error or done.artifact.error_tail}"[:300]))
            return
        results: tuple[SanitizerResult, ...] = done.value
        if all(r.outcome == "clean" for r in results) or self._baseline is not None:
            self._judge(checked, results, budgets)
            return
        checked.outstanding += 1  # its verdicts wait for the baseline's runs under the tools
        self._waiting_for_baseline.append((checked, results, budgets))
        if not self._baseline_asked:
            self._baseline_asked = True
            future = self.jobs.sanitize(None, self.tools, self._cap(self.tools), None, value=checked.value,
                                        label="the baseline, against a variant's sanitizer findings",
                                        kernels=checked.kernels, launches=self.launches)
            future.add_done_callback(self._baseline_sanitized)

    def _baseline_sanitized(self, future: Future[JobResult]) -> None:
        done = future.result()
        results = done.value if done.failure is None and done.value else ()
        self._baseline = {r.tool: r for r in results}
        waiting, self._waiting_for_baseline = self._waiting_for_baseline, []
        for checked, found, budgets in waiting:
            checked.outstanding -= 1
            self._judge(checked, found, budgets)
            self._settle(checked)

    def _judge(self, checked: _Checked, results: tuple[SanitizerResult, ...], budgets: dict[str, float]) -> None:
        """The verdicts of a variant's sanitizer runs; a tool that ran out of a budget smaller than the
        baseline's own time asks for runs within the right one."""
        baseline = self._baseline or {}
        # Not where the baseline ran out too: the tool cannot judge this target, however long the
        # variant is given (a fake GPU's checks of five minutes were run again four times as the
        # time plan's bound grew, and the variant's checks were still out when its sweep ended).
        again = tuple(r.tool for r in results if r.outcome == "timeout" and r.tool in baseline
                      and baseline[r.tool].outcome != "timeout"
                      and budgets.get(r.tool, self.cap_s) < self._budgets((r.tool,)).get(r.tool, 0.0))
        checked.verdicts += sanitizer_verdicts(tuple(r for r in results if r.tool not in again), baseline)
        if again and not self.contends(checked.variant.source_hash):
            # Put off until it could be a final again: on an H200 a racecheck run again with the
            # baseline's budget took 13.7 s for a 1.03x variant that the flags had passed at 1.51x.
            checked.deferred = again
        elif again:
            self._sanitize(checked, again)

    def _settle(self, checked: _Checked) -> None:
        if checked.outstanding or checked.trust is not Trust.PENDING:
            return
        if checked.deferred and not any(v.failed for v in checked.verdicts):
            checked.trust = Trust.NOT_RUN  # never a final so: the finals ask for the rest (``request``)
            log.info(f"{self.jobs.state.name}: {checked.variant.label}: {', '.join(checked.deferred)} put off: "
                     f"none of its candidates could be a final now")
            put_off = Verdict("sanitizer", VerdictStatus.SKIPPED, f"{', '.join(checked.deferred)} put off: none of "
                                                                  f"its candidates could be a final")
            if not checked.tickets:  # its record: not run (no ``checks``), its verdicts so far and why
                self.write(self._record(checked, [], (put_off,)))
            for ticket in checked.tickets:
                _resolve(ticket, (*checked.verdicts, put_off))
            checked.tickets.clear()
            return
        checked.deferred = ()
        failed = [v for v in checked.verdicts if v.failed]
        checked.trust = Trust.FAILED if failed else Trust.PASSED
        seconds = time.monotonic() - checked.started
        log.info(f"{self.jobs.state.name}: {checked.variant.label}: expensive checks {checked.trust.value} in "
                 f"{seconds:.0f} s" + (": " + "; ".join(f"{v.check}: {v.detail}" for v in failed)[:300]
                                        if failed else ""))
        if not checked.tickets:
            self.write(self._record(checked, failed))
        self._answer(checked)
        if failed:
            self.on_failed(checked.variant.source_hash)

    def _answer(self, checked: _Checked) -> None:
        for ticket in checked.tickets:
            _resolve(ticket, tuple(checked.verdicts))
        checked.tickets.clear()

    def close(self) -> None:
        """The sweep ended: whoever waits for checks that will not finish hears so."""
        for checked in self.variants.values():
            if checked.trust is Trust.PENDING:
                checked.verdicts.append(Verdict("sanitizer", VerdictStatus.SKIPPED, "not run: the sweep ended first"))
            self._answer(checked)

    def _record(self, checked: _Checked, failed: list[Verdict], more: tuple[Verdict, ...] = ()) -> dict[str, Any]:
        """The variant's record with its verdicts (and ``more``, not kept as its own)."""
        record = dict(self.record_of(checked.variant.source_hash) or checked.record or {
            "target": self.jobs.state.target.name, "study": self.jobs.state.name,
            "source_hash": checked.variant.source_hash, "optimization": checked.variant.label.split(" ")[0],
            "location": checked.variant.label.partition(" ")[2], "attempt": 0})
        earlier = json.loads(record.get("verdicts") or "[]")
        record.update({
            "stage": "rejected" if failed else "accepted", "checks": checked.trust.value,
            "verdicts": json.dumps(earlier + [asdict(v) for v in (*checked.verdicts, *more)], sort_keys=True),
            "reason": "; ".join(f"{v.check}: {v.detail}" for v in failed) if failed else record.get("reason", ""),
            "created_at": time.time(),
        })
        return record


def _resolve(ticket: Future[tuple[Verdict, ...]] | None, verdicts: tuple[Verdict, ...]) -> None:
    if ticket is not None and not ticket.done():
        ticket.set_result(verdicts)
