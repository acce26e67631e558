"""The time plan (cluster.engine.plan.budget): the search of a device type closes when what its studies
still need after it (finals, and the checks the finals wait for less what the check lane does beside
the rest of the search) no longer fits in the time left; the loop stops at the budget plus a grace."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from cluster.engine.plan.budget import (
    CHECK_BOUND_SHARE,
    FINALS_SHARE,
    MARGIN_S,
    MIN_CHECK_S,
    REOPEN_SHARE,
    SAFETY,
    TimePlan,
    grace_s,
    sizes,
)
from tests.conftest import logged_lines


@dataclass
class Study:
    device_type: str = "H100"
    finals: float = 10.0
    checks: float = 0.0
    searching: bool = True
    measured: bool = True
    done: bool = False
    run_estimate: float | None = 1.0
    waiting: bool = False  # its finals are in, and it waits for the search to reopen

    def parked(self) -> bool:
        return self.waiting

    def work_left(self) -> tuple[float, float]:
        return self.finals, self.checks

    def in_search(self) -> bool:
        return self.searching

    def searched(self) -> bool:
        return self.measured


def plan_with(left_s: float, budget: float = 600.0, finals: tuple[int, int] = (1, 3)) -> tuple[TimePlan, list[str]]:
    """``finals``: the configured finals' size; by default the smallest, which the plan cannot shrink."""
    lines = logged_lines()
    plan = TimePlan(budget, time.monotonic() - (budget - left_s), finals)
    return plan, lines


def test_the_search_closes_when_the_finals_no_longer_fit_and_stays_closed():
    studies = [Study(finals=40.0) for _ in range(8)]  # 320 worker-seconds of finals on one worker
    plan, lines = plan_with(left_s=600.0)
    plan.update(studies, lambda device_type: 1)
    assert plan.search_open("H100") and plan.reserve["H100"] == SAFETY * 320 + MARGIN_S
    plan, lines = plan_with(left_s=SAFETY * 320)
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100") and "the search stops" in lines[0]
    for study in studies:  # a closed search stays closed while its studies' finals run
        study.finals = 0.0
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100")


def test_more_workers_share_the_finals_and_the_checks_that_run_beside_the_search_are_not_kept_for():
    """On an H200 (2026-11-29) a reserve that held the finalists' checks closed eight programs' search
    61 s into 300 s: 276 s kept, 75 s of checks run in all. The checks run beside the search."""
    studies = [Study(finals=40.0, checks=60.0) for _ in range(8)]
    plan, _ = plan_with(left_s=600.0)
    plan.update(studies, lambda device_type: 2)
    assert plan.reserve["H100"] == SAFETY * 320 / 2 + MARGIN_S and plan.search_open("H100")


def test_a_budget_that_cannot_hold_the_finals_says_so_and_the_loop_stops_at_the_grace():
    studies = [Study(finals=100.0, measured=False) for _ in range(8)]
    plan, lines = plan_with(left_s=500.0)
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100")
    assert "cannot hold the baselines and finals of 8 studies" in lines[0] and "give a larger --time-budget" in lines[0]
    assert not plan.expired(plan.deadline) and plan.expired(plan.deadline + grace_s(600.0))
    assert grace_s(600.0) == 12.0 and grace_s(30.0) == 1.0 and grace_s(10_000.0) == 15.0


def test_a_study_not_yet_measured_is_planned_with_the_slowest_run_of_its_device_type():
    plan, _ = plan_with(left_s=600.0)
    plan.update([Study(run_estimate=0.5), Study(run_estimate=2.0), Study(run_estimate=None)], lambda d: 1)
    assert plan.typical_run("H100") == 2.0 and plan.typical_run("A100") == 1.0


def test_a_guess_for_studies_whose_baselines_are_queued_never_closes_the_search():
    """Seen on an H100 (2026-11-27): the first two baselines of seven measured, the other five planned
    with the slowest run (a first run that paid the worker's start-up): 473 s of finals guessed, no
    search at all, and the sweep ended at 260 s of its 600. A guess waits for the studies' own times."""
    measured = [Study(finals=20.0) for _ in range(2)]
    queued = [Study(finals=100.0, run_estimate=None) for _ in range(5)]
    plan, lines = plan_with(left_s=550.0)
    plan.update([*measured, *queued], lambda device_type: 1)
    assert plan.search_open("H100") and lines == []  # 2 x 20 fits: the 5 x 100 is a guess
    for study in queued:  # their baselines are in: their own times, which fit
        study.run_estimate, study.finals = 0.5, 10.0
    plan.update([*measured, *queued], lambda device_type: 1)
    assert plan.search_open("H100")
    for study in queued:  # ... or do not: then it closes
        study.finals = 100.0
    plan.update([*measured, *queued], lambda device_type: 1)
    assert not plan.search_open("H100") and "the search stops" in lines[0]


def test_studies_already_measured_that_do_not_fit_close_the_search_whatever_the_guesses():
    measured = [Study(finals=200.0) for _ in range(2)]  # 600 s of reserve by themselves
    plan, lines = plan_with(left_s=550.0)
    plan.update([*measured, Study(finals=1.0, run_estimate=None)], lambda device_type: 1)
    assert not plan.search_open("H100") and "the search stops" in lines[0]


def test_finals_that_would_take_more_than_their_share_are_made_smaller_runs_first():
    """Seen on an H100 (2026-11-27): eight public programs of 3-4 s a run, finals of three candidates
    and the baseline times five runs: 840 s of reserve in a 600 s budget, the search closed at once.
    The finals shrink until they take half the time left: fewer runs (not under 3), then fewer
    finalists (not under 1)."""
    assert sizes(3, 5) == [(3, 5), (3, 4), (3, 3), (2, 3), (1, 3)] and sizes(1, 2) == [(1, 2)]
    studies = [Study(finals=70.0) for _ in range(8)]  # 4 finals x 5 runs x 3.5 s each
    plan, lines = plan_with(left_s=550.0, finals=(3, 5))
    plan.update(studies, lambda device_type: 1)
    assert plan.finals_size("H100") == (1, 3) and plan.search_open("H100")  # 840 s x 6/20 = 252 s
    assert "finals of 1 candidate and the baseline, 3 runs each" in lines[0]
    assert plan.reserve["H100"] <= FINALS_SHARE * 550.0 + MARGIN_S
    small = [Study(finals=10.0) for _ in range(8)]  # 120 s: under half of 550, as configured
    plan, _ = plan_with(left_s=550.0, finals=(3, 5))
    plan.update(small, lambda device_type: 1)
    assert plan.finals_size("H100") == (3, 5) and plan.size == {}


def test_a_closed_search_reopens_once_every_study_is_done_with_its_finals_and_time_is_left():
    """The finals took less than their reserve: the time they left goes back to the search. Not while
    a study of the type still runs its finals, and not without room to search beyond the reserve."""
    studies = [Study(finals=40.0) for _ in range(4)]
    plan, lines = plan_with(left_s=SAFETY * 160)
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100")
    for study in studies[:3]:  # three are done with their finals; the fourth is not
        study.finals, study.waiting, study.searching = 2.0, True, False
    studies[3].searching = False
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100") and plan.may_reopen("H100", 2.0)
    studies[3].finals, studies[3].waiting = 2.0, True
    plan.update(studies, lambda device_type: 1)
    assert plan.search_open("H100") and plan.reopened["H100"] == 1 and "the search reopens" in lines[-1]


def test_no_reopening_without_room_to_search_beyond_the_reserve():
    studies = [Study(finals=2.0, searching=False, waiting=True) for _ in range(4)]
    room = REOPEN_SHARE * 600.0 + MARGIN_S
    plan, _ = plan_with(left_s=SAFETY * 8 + MARGIN_S + room - 1.0)
    plan.closed["H100"] = plan.started_at
    plan.update(studies, lambda device_type: 1)
    assert not plan.search_open("H100") and not plan.may_reopen("H100", 2.0 + room)


def test_one_checks_bound_is_a_share_of_the_budget_and_shrinks_with_the_time_left():
    plan, _ = plan_with(left_s=600.0, budget=600.0)
    assert plan.check_bound() == CHECK_BOUND_SHARE * 600.0
    plan, _ = plan_with(left_s=40.0, budget=600.0)
    assert plan.check_bound() < CHECK_BOUND_SHARE * 600.0 and plan.check_bound() <= 0.25 * 40.0 + 0.1
    plan, _ = plan_with(left_s=0.5, budget=600.0)
    assert plan.check_bound() == MIN_CHECK_S


def test_a_check_started_late_in_the_search_ends_when_the_search_would_close():
    """Seen on CI (a fake GPU, 40 s, 4 s kept for the finals): a 2 s check begun just before the
    search closed held the only worker, and a final was still running at the deadline. While its
    device type's search is open, a check may take no more than the search has left before the
    reserve; once the search has closed (a finalist's checks) the budget's bounds alone."""
    plan, _ = plan_with(left_s=300.0, budget=600.0)
    plan.reserve["H100"] = 280.0
    now = time.monotonic()
    assert plan.check_bound(now, "H100") == pytest.approx(20.0, abs=0.5)  # 300 s left, 280 s kept
    assert plan.check_bound(now, "A100") == CHECK_BOUND_SHARE * 600.0  # no reserve known for it
    plan.reserve["H100"] = 299.9
    assert plan.check_bound(now, "H100") == MIN_CHECK_S
    plan.reserve["H100"] = 400.0  # guessed while baselines are queued: it closes nothing, nor bounds a check
    assert plan.check_bound(now, "H100") == CHECK_BOUND_SHARE * 600.0
    plan.closed["H100"] = now
    assert plan.check_bound(now, "H100") == plan.check_bound(now) == CHECK_BOUND_SHARE * 600.0


def test_a_check_is_costed_at_what_the_device_types_checks_took_across_studies():
    plan, _ = plan_with(left_s=600.0, budget=600.0)
    assert plan.check_estimate("H100") is None
    for seconds in (4.0, 6.0, 500.0):  # a run-away one is held to the bound
        plan.checked("H100", seconds)
    assert plan.check_estimate("H100") == 6.0 and plan.check_estimate("A100") is None
    plan.checked("A100", 100.0)
    assert plan.check_estimate("A100") == plan.check_bound()


def test_a_review_gets_one_fresh_seeds_runs_within_a_share_of_the_time_left():
    # configs/suite at 240 s on an H200: a 3.5 s-a-run program's review of an 11.75x candidate was
    # bounded below one seed's runs of baseline and candidate, and compared nothing.
    plan, _ = plan_with(left_s=200.0, budget=240.0)
    now = time.monotonic()
    assert plan.review_bound(3.0, now) == plan.check_bound(now) == CHECK_BOUND_SHARE * 240.0  # it fits: the bound
    assert plan.review_bound(21.0, now) == pytest.approx(21.0)  # more than the bound: what one seed needs
    assert plan.review_bound(90.0, now) == pytest.approx(0.25 * 200.0, abs=0.5)  # never past a quarter of what is left
