"""The sweep's time budget (``--time-budget``, ``search.time_budget_s``): the wall clock of the whole
sweep, from the command's start. The plan works back from it:

    deadline ─ reserve(device type) ─► the search of every study of that type closes
             ─► finals (the baseline's missing references, the best few and the baseline on fresh
                seeds) and the checks they wait for, at the front of the queues ─► deadline
    deadline + grace ─► the loop stops, whatever is left (a run stopped there keeps every row and
                        shows each study's best so far, "not re-measured")

The reserve of a device type is what its studies still need after their search, in worker-seconds
(``StudyFlow.work_left``: each from its own baseline's time a run), shared by the type's workers,
with ``SAFETY`` to spare: their finals, and the expensive checks the finals wait for less what the
check lane does beside the rest of the search (its share of the time left). It is estimated again
on every turn of the loop, so that it follows the times actually measured; once a type's search
closes it stays closed. While some of a type's studies have no time of their own yet (their
baselines are still queued: planned with the type's slowest run, ``typical_run``), a guess never
closes the search: it closes on them only if the studies already measured no longer fit by
themselves, or once every study has its own time.

The finals fit the budget: once every study of a type has its own time, finals that would take more
than ``FINALS_SHARE`` of the time left are made smaller, one step at a time down ``sizes``: fewer
runs each (down to ``MIN_FINAL_RUNS``), then fewer finalists (down to one, beside the baseline), so
that the search keeps the rest (on an H100, eight public programs of 3-4 s a run had their search
closed at once by finals of four candidates times five runs).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

from cluster.engine.scheduling.jobs import CHECK_SHARE

log = logging.getLogger(f"warpfleet.{__name__}")

SAFETY = 1.5  # the reserve is this many times the estimate: finals queue behind running jobs, estimates are rough
DEFAULT_RUN_S = 1.0  # a run's time where no study of the device type has been measured yet
MARGIN_S = 3.0  # and this much more: the last job's results, the last flush
GRACE_FRACTION, GRACE_MAX_S = 0.02, 15.0  # past the deadline, the loop waits at most this for the finals
FINALS_SHARE = 0.5  # of the time left, at most, for the finals (and their checks) when the plan first sees them all
MIN_FINAL_RUNS = 3  # runs of a final, at the least, where the budget shrinks the finals


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

    def time_left(self, now: float | None = None) -> float:
        return self.deadline - (time.monotonic() if now is None else now)

    def expired(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.hard_stop

    def search_open(self, device_type: str) -> bool:
        return device_type not in self.closed

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
        checks: dict[str, float] = defaultdict(float)
        known: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))  # the studies with a time of their own
        guessed: set[str] = set()  # device types with a study planned on a guess
        for flow in flows:
            if not flow.done:
                f, c = flow.work_left()
                finals[flow.device_type] += f
                checks[flow.device_type] += c
                if getattr(flow, "run_estimate", None) is None:
                    guessed.add(flow.device_type)
                else:
                    kf, kc = known[flow.device_type]
                    known[flow.device_type] = (kf + f, kc + c)
        for device_type in finals:
            n = max(1, workers(device_type))
            after = SAFETY * finals[device_type] / n
            self.reserve[device_type] = self._reserve(finals[device_type], checks[device_type], n, now)
            if device_type in self.closed:
                continue
            mine = [f for f in flows if f.device_type == device_type]
            searching = any(f.in_search() for f in mine)
            if device_type in guessed and now + self._reserve(*known[device_type], n, now) < self.deadline:
                continue  # the baselines still queued will say what they need: no closing on a guess
            if searching and after > FINALS_SHARE * self.time_left(now):
                finals[device_type] *= self._fit_finals(device_type, after, now)
                after = SAFETY * finals[device_type] / n
                self.reserve[device_type] = self._reserve(finals[device_type], checks[device_type], n, now)
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

    def _reserve(self, finals: float, checks: float, workers: int, now: float) -> float:
        after = SAFETY * finals / workers
        # the checks run beside the search too, at their lane's share of the workers' time
        overlap = CHECK_SHARE * max(0.0, self.time_left(now) - after - MARGIN_S)
        return after + max(0.0, SAFETY * checks / workers - overlap) + MARGIN_S

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started_at
