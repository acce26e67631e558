"""The experts (cluster.core.registry.EXPERTS) and the verifier's static checks and real builds on
the benchmark suite (sm_90, compiled here; nothing runs): what the acceptance run on the GPU
starts from."""

from __future__ import annotations

import functools

import pytest

from agents._base import AnalysisContext
from agents.workflow import Steps, run_workflow
from cluster.config import load_target
from cluster.core.registry import EXPERTS
from cluster.core.types import Candidate, Phase
from cluster.engine.verification.verify import LocalVerifier
from cluster.platform.devices import cpu_device
from tests.configs._builds import SUITE_BUILDS, build_once, compile_once
from tests.conftest import REPO, needs

# One pytest-xdist worker runs the module: suite_workflow's cache is a process's, so that a target's
# workflow (its variants' builds) split over two workers was run twice; the baselines' builds are
# shared with the modules that build them too (SUITE_BUILDS).
pytestmark = [pytest.mark.nvcc, needs("nvcc"), SUITE_BUILDS]
ARCH = "sm_90"


def setup(name: str) -> tuple[AnalysisContext, LocalVerifier]:
    target = load_target(REPO / "configs" / "targets" / name / "target.yaml")
    baseline = Candidate(target.name, "nvcc", "H100", ARCH, target.bundle.hash, tuple(target.space.baseline.items()),
                         tuple(target.baseline_params.items()), Phase.BASELINE)
    built = compile_once(target, baseline)  # the baseline's build, shared with tests/configs
    assert built.result.ok, built.result.tail()
    verifier = LocalVerifier(baseline, cpu_device("test"), run=False, build=build_once)  # variants shared too
    return AnalysisContext(target, ARCH, kernels=built.target_kernels), verifier


@functools.cache
def suite_workflow(name: str) -> tuple[AnalysisContext, LocalVerifier, list]:
    """The experts' workflow on a suite target, run once for the tests that read it (regpressure: two)."""
    context, verifier = setup(name)
    steps = [Steps.of(EXPERTS.load(name)()) for name in EXPERTS]
    return context, verifier, run_workflow(context, steps, verifier, parallel=PARALLEL)


def workflow(name: str):
    return suite_workflow(name)[2]


PARALLEL = 2  # experts at once (the agent stage runs them all at once): their variants' builds on both cores


def by_stage(outcomes, optimization):
    return sorted({o.stage for o in outcomes if o.finding.optimization == optimization})


def test_transpose_gets_a_padded_tile_that_builds():
    outcomes = workflow("transpose")
    [padding] = [o for o in outcomes if o.finding.optimization == "padding" and o.proposal]
    checks = {v.check: v.status.value for v in padding.verification.verdicts}
    assert checks == {"guards": "passed", "depgraph": "passed", "contracts": "passed", "build": "passed",
                      "outputs": "skipped"}
    assert "[TILE + 1]" in dict(padding.proposal.files)["transpose.cu"] or "+ 1]" in padding.proposal.description


def test_regpressure_gets_register_caps_at_occupancy_steps():
    outcomes = workflow("regpressure")
    [registers] = [o for o in outcomes if o.finding.optimization == "registers" and o.accepted]
    assert 64 in registers.proposal.search_params["maxrregcount"]
    assert any("limited by registers" in e for e in registers.finding.evidence)


def test_multikernel_streamify_rewrites_the_loop_and_leaves_the_helper():
    outcomes = workflow("multikernel")
    streamify = {o.finding.location: o for o in outcomes if o.finding.optimization == "streamify"}
    assert streamify["multikernel.cu:enqueue_task"].stage == "not_applicable"
    loop = streamify["multikernel.cu:main (line 188)"]
    assert loop.accepted, loop.reason  # guards, dependence graph and an sm_90 build; no GPU to run it here
    assert all(o.stage != "error" for o in outcomes), [o.reason for o in outcomes if o.stage == "error"]


@pytest.mark.parametrize("name", ["unroll", "matmul", "conv2d"])
def test_every_accepted_variant_of_the_tunable_kernels_builds(name):
    outcomes = workflow(name)
    assert all(o.stage != "error" for o in outcomes), [o.reason for o in outcomes if o.stage == "error"]
    for o in outcomes:
        if o.proposal is not None and o.proposal.files:
            assert o.accepted, o.reason


def test_the_agent_stage_stacks_the_accepted_source_changes_and_verifies_the_stack(tmp_path):
    """AgentStage._stack on regpressure: its accepted source changes (the constant table, unroll,
    launch bounds, ...) as one variant, verified (guards, dependence graph, contracts, build) and
    recorded as a `stack` outcome that joins the search like the others."""
    from cluster.config import AgentsSpec, ProfileSpec
    from cluster.engine.agent_stage import AgentStage

    context, verifier, outcomes = suite_workflow("regpressure")
    stage = AgentStage(tmp_path, "run", AgentsSpec(enabled=True), ProfileSpec(), 1)
    [stacked] = stage._stack(context, outcomes, verifier)
    assert stacked.finding.optimization == "stack" and stacked.accepted, stacked.reason
    assert {"constant", "unroll"} <= {part.split()[0] for part in stacked.finding.evidence}
    checks = {v.check: v.status.value for v in stacked.verification.verdicts}
    assert checks["build"] == "passed" and checks["depgraph"] == "passed"
    assert "WF_UNROLL_N" in stacked.proposal.search_params
