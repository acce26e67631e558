"""The jobs a study makes: what each measurement carries to its worker."""

from __future__ import annotations

from cluster.config import load_target
from cluster.core.types import DeviceInfo
from cluster.engine.scheduling.jobs import JobKind
from cluster.engine.study.state import StudyState
from cluster.engine.study.study_jobs import StudyJobs
from tests.conftest import write_target


def test_a_measurement_carries_the_plans_bound_on_its_runs_beside_the_baseline(tmp_path):
    target = load_target(write_target(tmp_path))
    state = StudyState(target, None, DeviceInfo("gpu", "fake gpu", "sm_90"), [0], None, "sm_90", "time")
    jobs = StudyJobs(state, scheduler=None, threadsafe=False)
    build = jobs.build()
    assert jobs.job(JobKind.SEARCH, build).args["judge_s"] is None  # no plan: no bound
    bounds = iter([15.0, 7.5, 3.0])
    jobs.judge_bound = lambda: next(bounds)  # the plan's bound, read as each job is made
    assert jobs.job(JobKind.SEARCH, build).args == {"judge_s": 15.0}
    verify = jobs.job(JobKind.VERIFY, build, args={"poison": True})
    assert verify.args == {"judge_s": 7.5, "poison": True}  # the caller's own arguments kept
    assert jobs.job(JobKind.FINAL, build, args={"judge_s": 1.0}).args["judge_s"] == 1.0  # a caller's own wins
    assert "judge_s" not in jobs.job(JobKind.SANITIZE, build, args={"tools": ()}).args
