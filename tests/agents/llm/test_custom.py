"""A custom optimization from a text spec, end to end: the user's words reach the model's system
prompt at every step, and its proposal goes through the same verification, guardrails included."""

from __future__ import annotations

from pathlib import Path

from agents._base import AnalysisContext
from agents.llm import AgentsConfig, Services, steps_from_config
from agents.workflow import run_workflow
from cluster.engine.agent_stage import build_report as local_build
from tests.agents.llm.conftest import ANALYSIS, PLANNING, SKIPPING_COMPUTE, LocalVerifier, spec_for, transforming

HOIST = {"name": "hoist-transcendentals",
         "look_for": "a transcendental function evaluated again and again on the same inputs inside a loop nest",
         "change": "evaluate it once per distinct input into a table before the loop nest, and read the table",
         "examples": "sinf(in[(i + k) % n]) inside loops over i and k: tabulate sinf(in[j]) once per j."}


def test_a_custom_optimization_runs_every_step_from_the_users_text(serve, context: AnalysisContext,
                                                                   tmp_path: Path) -> None:
    server = serve([ANALYSIS, PLANNING, transforming(match="poisoned_outputs"), transforming(SKIPPING_COMPUTE)])
    config = AgentsConfig.model_validate({"llm": spec_for(server).model_dump(), "custom": [HOIST],
                                          "only": ["hoist-transcendentals"]})
    [steps] = steps_from_config(config, run_dir=tmp_path, services=Services(build=local_build))
    outcomes = run_workflow(context, [steps], LocalVerifier(cheats=True))
    assert [o.stage for o in outcomes] == ["rejected", "accepted", "not_applicable"]
    assert outcomes[0].finding.optimization == "hoist-transcendentals"
    assert outcomes[0].reason.startswith("poisoned_outputs:")  # the same guardrails as any proposal
    assert outcomes[1].proposal.agent == "llm:hoist-transcendentals"
    systems = {r.body["messages"][0]["content"] for r in server.completions()}
    assert len(systems) == 3  # analyse, plan, transform
    for system in systems:
        assert f"What to look for: {HOIST['look_for']}" in system
        assert f"What to change: {HOIST['change']}" in system
        assert HOIST["examples"] in system
