"""The sweep's time budget (``--time-budget``, ``search.time_budget_s``): the wall clock of the whole
sweep, from the command's start. The plan works back from it:

    deadline ─ reserve(device type) ─► the search of every study of that type closes
             ─► finals (the baseline's missing references, the best few and the baseline on fresh
                seeds) and the checks they wait for, at the front of the queues ─► deadline
    deadline + grace ─► the loop stops, whatever is left (a run stopped there keeps every row and
                        shows each study's best so far, "not re-measured")

The reserve of a device type is what its studies still need after their search, in worker-seconds
(``StudyFlow.work_left``: each from its own baseline's time a run), shared by the type's workers,
with ``SAFETY`` to spare: their finals (the finalists' checks run beside the search, in their lane,
and are not kept for). It is estimated again on every turn of the loop, so that it follows the times
actually measured; a closed search reopens only as below. While some of a type's studies have no
time of their own yet (their baselines are still queued: planned with the type's slowest run,
``typical_run``), a guess never closes the search: it closes on them only if the studies already
measured no longer fit by themselves, or once every study has its own time.

What the reserve holds is the finals, nothing else: the checks run beside the search, so a variant
costs the search its share of the check lane, never a closed search (on an H200 ten programs' search
closed 58 s into 300 s, 304 s kept for checks of variants most of which never became finals). A
finalist's checks (``Gate.checks_left``) count only where the finals wait for them. A check is
costed at what the device type's checks took in this run (their median,
``checked``), and one check or profile job may take at most ``check_bound``: 5% of the budget, less
as the deadline nears. A closed search reopens where the finals left time unused (``reopen``): the
studies whose finals are in wait for it (``may_reopen``), and go back to their search once the time
left holds the reserve again with room to search.

The finals fit the budget: once every study of a type has its own time, finals that would take more
than ``FINALS_SHARE`` of the time left are made smaller, one step at a time down ``sizes``: fewer
runs each (down to ``MIN_FINAL_RUNS``), then fewer finalists (down to one, beside the baseline), so
that the search keeps the rest (on an H100, eight public programs of 3-4 s a run had their search
closed at once by finals of four candidates times five runs).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(f"warpfleet.{__name__}")

SAFETY = 1.5  # the reserve is this many times the estimate: finals queue behind running jobs, estimates are rough
DEFAULT_RUN_S = 1.0  # a run's time where no study of the device type has been measured yet
MARGIN_S = 3.0  # and this much more: the last job's results, the last flush
GRACE_FRACTION, GRACE_MAX_S = 0.02, 15.0  # past the deadline, the loop waits at most this for the finals
FINALS_SHARE = 0.5  # of the time left, at most, for the finals (and their checks) when the plan first sees them all
MIN_FINAL_RUNS = 3  # runs of a final, at the least, where the budget shrinks the finals
CHECK_BOUND_SHARE = 0.05  # of the budget, at most, for one check or profile job
CHECK_LEFT_SHARE = 0.25  # and of the time left: a check's bound shrinks as the deadline nears
MIN_CHECK_S = 1.0  # a bound below this checks nothing
REOPEN_SHARE = 0.1  # a closed search reopens only with this share of the budget to search, beyond its reserve


def sizes(top_k: int, runs: int) -> list[tuple[int, int]]:
    """The finals' sizes, (finalists, runs each), from the configured one down to the smallest."""
    steps = [(top_k, r) for r in range(runs, min(runs, MIN_FINAL_RUNS) - 1, -1)]
    return steps + [(k, steps[-1][1]) for k in range(top_k - 1, 0, -1)]


class Planned(Protocol):
    """What the plan reads of a study's flow."""

    device_type: str
    done: bool

    def work_left(self) -> tuple[float, float]:
        """Worker-seconds the study still needs once its search is closed: its finals, and the
        expensive checks they wait for (which also run while the search does, at their lane's share)."""
        ...

    def in_search(self) -> bool: ...

    def searched(self) -> bool:
        """Whether it measured a search candidate."""
        ...

    def parked(self) -> bool:
        """Whether its finals are in and it waits for its device type's search to reopen."""
        ...


def bounded(timeout: float, bound: float | None) -> float:
    """A check's or profile's timeout within the time plan's bound on one job (where it has one)."""
    return timeout if bound is None else min(timeout, bound)


def grace_s(budget_s: float) -> float:
    return min(GRACE_MAX_S, max(1.0, GRACE_FRACTION * budget_s))


class TimePlan:
    def __init__(self, budget_s: float, started_at: float | None = None, finals: tuple[int, int] = (3, 5)) -> None:
        """``finals``: the configured finals, (measure.final_top_k, measure.final_runs)."""
        self.budget_s = budget_s
        self.finals = finals
        self.size: dict[str, tuple[int, int]] = {}  # device type -> its finals' size, where made smaller
        self.started_at = time.monotonic() if started_at is None else started_at
        self.deadline = self.started_at + budget_s
        self.hard_stop = self.deadline + grace_s(budget_s)
        self.closed: dict[str, float] = {}  # device type -> when its search closed (monotonic)
        self.reserve: dict[str, float] = defaultdict(float)
        self.typical: dict[str, float] = {}  # device type -> a run's time, for a study not yet measured
        self.check_times: dict[str, list[float]] = defaultdict(list)  # device type -> its checks' worker-seconds
        self.reopened: dict[str, int] = defaultdict(int)  # device type -> how often its search reopened

    def time_left(self, now: float | None = None) -> float:
        return self.deadline - (time.monotonic() if now is None else now)

    def expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.hard_stop

    def search_open(self, device_type: str) -> bool:
        return device_type not in self.closed

    def check_bound(self, now: float | None = None, device_type: str | None = None) -> float:
        """The longest one check or profile job may take now: ``CHECK_BOUND_SHARE`` of the budget, and
        ``CHECK_LEFT_SHARE`` of the time left, so that no single check holds the GPU for a large part
        of the sweep, and one late in it cannot push the finals past the deadline. With the
        ``device_type`` whose worker runs it, while that type's search is open: no longer than the
        search has left before its reserve, so that a check started late in the search does not
        hold the worker the finals need (a fake GPU's sweep of 40 s kept 4 s for its finals, and a
        check of 2 s begun just before the search closed left a final running at the deadline). Not
        where the reserve is past already with the search open: a reserve guessed while baselines
        are queued closes nothing (``update``), and would leave a check a second."""
        now = time.monotonic() if now is None else now
        bound = min(CHECK_BOUND_SHARE * self.budget_s, CHECK_LEFT_SHARE * self.time_left(now))
        if device_type is not None and self.search_open(device_type) and device_type in self.reserve:
            until_closed = self.deadline - self.reserve[device_type] - now
            if until_closed > 0:
                bound = min(bound, until_closed)
        return max(MIN_CHECK_S, bound)

    def review_bound(self, need_s: float, now: float | None = None, device_type: str | None = None) -> float:
        """A fresh-seed review's bound: the check bound, or ``need_s`` (one fresh seed's runs of the
        baseline and the candidate) where that is more, within ``CHECK_LEFT_SHARE`` of the time left:
        a review bounded below one seed's runs compares nothing, and its candidate (over 10x, the
        study's winner if it holds) is not checked."""
        now = time.monotonic() if now is None else now
        return max(self.check_bound(now, device_type), min(need_s, CHECK_LEFT_SHARE * self.time_left(now)))

    def checked(self, device_type: str, seconds: float) -> None:
        """A check or profile job of the device type took ``seconds`` on its worker."""
        if seconds > 0:
            self.check_times[device_type].append(seconds)

    def check_estimate(self, device_type: str) -> float | None:
        """A check job's worker-seconds on the device type: the median of those this run timed, within
        the bound; None before the first."""
        times = self.check_times.get(device_type)
        return min(statistics.median(times), self.check_bound()) if times else None

    def may_reopen(self, device_type: str, own_final_s: float) -> bool:
        """Whether a study whose finals are in may still see its search reopen: the time left holds
        one more final of its own (``own_final_s``) and a share of the budget to search."""
        return device_type in self.closed and self.time_left() > SAFETY * own_final_s + self._reopen_room()

    def _reopen_room(self) -> float:
        return REOPEN_SHARE * self.budget_s + MARGIN_S

    def may_wait(self, device_type: str, needed_s: float) -> bool:
        """Whether finals may still wait ``needed_s`` more (for a check) and end by the deadline."""
        return self.time_left() > needed_s * SAFETY

    def finals_size(self, device_type: str) -> tuple[int, int]:
        """(finalists, runs each) for the finals of the device type's studies."""
        return self.size.get(device_type, self.finals)

    def _fit_finals(self, device_type: str, after: float, now: float) -> float:
        """Make the type's finals smaller, down ``sizes``, until their reserve (``after`` at the
        current size) is at most ``FINALS_SHARE`` of the time left; returns the factor by which the
        size chosen scales them (finalists and the baseline, times runs each)."""
        current = self.finals_size(device_type)
        ladder = sizes(*self.finals)

        def scale(size: tuple[int, int]) -> float:
            return (size[0] + 1) * size[1] / ((current[0] + 1) * current[1])

        fits = [s for s in ladder[ladder.index(current):] if after * scale(s) <= FINALS_SHARE * self.time_left(now)]
        chosen = fits[0] if fits else ladder[-1]
        if chosen != current:
            self.size[device_type] = chosen
            log.info(f"time budget: finals of {chosen[0]} candidate{'s' * (chosen[0] > 1)} and the baseline, "
                     f"{chosen[1]} runs each, on {device_type} (measure asks {self.finals[0]} and {self.finals[1]}): "
                     f"about {math.ceil(after * scale(chosen))} s of {self.time_left(now):.0f} s left")
        return scale(chosen)

    def typical_run(self, device_type: str) -> float:
        return self.typical.get(device_type, DEFAULT_RUN_S)

    def update(self, flows: Sequence[Planned], workers: Callable[[str], int]) -> None:
        """Estimate each device type's reserve; close the search of a type whose reserve no longer fits."""
        now = time.monotonic()
        runs: dict[str, list[float]] = defaultdict(list)
        for flow in flows:
            if getattr(flow, "run_estimate", None) is not None:
                runs[flow.device_type].append(flow.run_estimate)
        self.typical = {device_type: max(found) for device_type, found in runs.items()}
        finals: dict[str, float] = defaultdict(float)
        known: dict[str, float] = defaultdict(float)  # the finals of the studies with a time of their own
        guessed: set[str] = set()  # device types with a study planned on a guess
        for flow in flows:
            if not flow.done:
                f = flow.work_left()[0]  # the checks run beside the search: not kept for (``_reserve``)
                finals[flow.device_type] += f
                if getattr(flow, "run_estimate", None) is None:
                    guessed.add(flow.device_type)
                else:
                    known[flow.device_type] += f
        for device_type in finals:
            n = max(1, workers(device_type))
            after = SAFETY * finals[device_type] / n
            self.reserve[device_type] = self._reserve(finals[device_type], n)
            mine = [f for f in flows if f.device_type == device_type]
            if device_type in self.closed:
                self._reopen(device_type, mine, now)
                continue
            searching = any(f.in_search() for f in mine)
            if device_type in guessed and now + self._reserve(known[device_type], n) < self.deadline:
                continue  # the baselines still queued will say what they need: no closing on a guess
            if searching and after > FINALS_SHARE * self.time_left(now):
                finals[device_type] *= self._fit_finals(device_type, after, now)
                after = SAFETY * finals[device_type] / n
                self.reserve[device_type] = self._reserve(finals[device_type], n)
            if searching and now + self.reserve[device_type] >= self.deadline:
                self.closed[device_type] = now
                if not any(f.searched() for f in mine) and after + MARGIN_S >= self.time_left(now):
                    log.info(f"time budget: {self.budget_s:g} s cannot hold the baselines and finals of "
                             f"{len(mine)} studies on {workers(device_type)} {device_type} workers (about "
                             f"{math.ceil(finals[device_type] / n)} s of finals alone): no search; give a "
                             f"larger --time-budget")
                    continue
                log.info(f"time budget: {self.time_left(now):.0f} s left, {math.ceil(self.reserve[device_type])} s "
                         f"kept for the finals and their checks on {device_type}: the search stops")

    def _reopen(self, device_type: str, mine: Sequence[Planned], now: float) -> None:
        """Give the search back the reserve the finals left unused: once every study of the type that
        still has finals to run is done with them (the others wait, ``parked``), and the time left
        holds the reserve with room to search."""
        parked = [f for f in mine if not f.done and f.parked()]
        busy = [f for f in mine if not f.done and not f.parked()]
        if not parked or busy:
            return
        if self.time_left(now) > SAFETY * self.reserve[device_type] + self._reopen_room():
            del self.closed[device_type]
            self.reopened[device_type] += 1
            log.info(f"time budget: {self.time_left(now):.0f} s left, {math.ceil(self.reserve[device_type])} s "
                     f"needed after the finals on {device_type}: the search reopens")

    @staticmethod
    def _reserve(finals: float, workers: int) -> float:
        """What the search keeps for after it: the finals. The finalists' checks run beside the
        search, in their lane, and are not kept for: on an H200 (2026-11-29) keeping them closed eight
        programs' search 61 s into 300 s, with 276 s kept and 75 s of checks run in all; a finalist
        whose checks are not in when the finals start is left out, and taken back if they pass in time."""
        return SAFETY * finals / workers + MARGIN_S

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started_at
