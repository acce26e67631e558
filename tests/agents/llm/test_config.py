"""The agents' configuration: the endpoint spec, the per-step choice of expert or LLM, custom
optimizations, build_steps mixing both, and the prompts loaded from agents/prompts (package data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from agents.experts import PaddingExpert, RegisterExpert, StreamifyExpert, UnrollExpert
from agents.llm import (
    AgentsConfig,
    CustomSpec,
    LLMAnalyst,
    LLMPlanner,
    LLMSpec,
    LLMTransformer,
    Prices,
    Prompts,
    build_steps,
    load_custom,
    steps_from_config,
)
from agents.llm.custom import prompt_values
from agents.llm.prompts import DEFAULT_PROMPTS
from agents.workflow.steps import Level
from cluster.core.registry import EXPERTS
from tests.conftest import REPO

SPEC = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": None}


def test_spec_defaults_and_limits() -> None:
    spec = LLMSpec(model="gpt-x")
    assert spec.base_url == "https://api.openai.com/v1" and spec.api_key_env == "OPENAI_API_KEY"
    assert spec.prompts is None and Prompts().root == DEFAULT_PROMPTS == REPO / "agents" / "prompts"
    with pytest.raises(ValidationError, match="name of an environment variable"):
        LLMSpec(model="m", api_key_env="sk-abc123")  # a key pasted where its variable's name goes
    with pytest.raises(ValidationError):
        LLMSpec(model="m", api_key="sk-abc123")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        LLMSpec(model="m", concurrency=0)
    assert Prices(input_per_mtok=3, output_per_mtok=15).cost(1_000_000, 100_000) == pytest.approx(4.5)


def test_step_choices_keep_experts_before_llms() -> None:
    config = AgentsConfig.model_validate({"llm": SPEC, "steps": {"unroll": {"transformer": "llm"}}})
    assert list(config.choices()) == ["registers", "unroll", "padding", "streamify", "launch_bounds", "restrict",
                                      "vectorize", "constant", "shared_stage"]
    assert config.choices()["unroll"].transformer == "llm" and config.choices()["padding"].analyst == "expert"
    with pytest.raises(ValidationError, match="planner cannot be an expert after an llm analyst"):
        AgentsConfig.model_validate({"llm": SPEC, "steps": {"unroll": {"analyst": "llm"}}})
    with pytest.raises(ValidationError, match=r"steps\.tiling: unknown optimization"):
        AgentsConfig.model_validate({"llm": SPEC, "steps": {"tiling": {}}})
    with pytest.raises(ValidationError, match="llm: an endpoint is needed"):
        AgentsConfig.model_validate({"steps": {"unroll": {"transformer": "llm"}}})
    assert AgentsConfig().choices()["registers"].analyst == "expert"  # no endpoint needed for experts only


def test_custom_optimizations_join_the_choices(tmp_path: Path) -> None:
    fusion = {"name": "fusion", "look_for": "two kernels back to back, the second reading what the first wrote",
              "change": "fuse them into one kernel", "search": {"FUSE_BLOCK": [128, 256]}}
    config = AgentsConfig.model_validate({"llm": SPEC, "custom": [fusion], "only": ["unroll", "fusion"]})
    assert list(config.choices()) == ["unroll", "fusion"] and config.choices()["fusion"].analyst == "llm"
    with pytest.raises(ValidationError, match="has the name of an expert"):
        AgentsConfig.model_validate({"llm": SPEC, "custom": [{**fusion, "name": "unroll"}]})
    with pytest.raises(ValidationError, match="a custom optimization has no expert"):
        AgentsConfig.model_validate({"llm": SPEC, "custom": [fusion], "steps": {"fusion": {}}})
    path = tmp_path / "fusion.yaml"
    path.write_text(yaml.safe_dump(fusion))
    assert load_custom(path) == CustomSpec.model_validate(fusion)


def test_build_steps_mixes_experts_and_llm_agents_per_step() -> None:
    spec = LLMSpec.model_validate(SPEC)
    steps = build_steps(spec, {"registers": {}, "unroll": {"transformer": "llm"},
                               "padding": {"planner": "llm", "transformer": "llm"},
                               "streamify": {"analyst": "llm", "planner": "llm", "transformer": "llm"}})
    kinds = [(type(s.analyst), type(s.planner), type(s.transformer)) for s in steps]
    assert kinds == [(RegisterExpert, RegisterExpert, RegisterExpert), (UnrollExpert, UnrollExpert, LLMTransformer),
                     (PaddingExpert, LLMPlanner, LLMTransformer), (LLMAnalyst, LLMPlanner, LLMTransformer)]
    assert steps[1].analyst is steps[1].planner  # one expert per optimization
    assert steps[3].analyst.level is StreamifyExpert.level and steps[3].transformer.takes_feedback
    assert steps[2].planner.kit is steps[3].transformer.kit  # one kit, one budget, one store
    assert build_steps(None, {"unroll": {}})[0].transformer.__class__ is UnrollExpert
    with pytest.raises(ValueError, match="need an LLM endpoint"):
        build_steps(None, {"unroll": {"transformer": "llm"}})
    with pytest.raises(ValueError, match="unknown optimization 'tiling'"):
        build_steps(spec, {"tiling": {}})


def test_custom_steps_fill_the_prompt_with_the_users_text() -> None:
    config = AgentsConfig.model_validate({"llm": SPEC, "custom": [
        {"name": "fusion", "look_for": "LOOK-FOR-TEXT", "change": "CHANGE-TEXT", "level": "application"}]})
    [steps] = steps_from_config(config.model_copy(update={"only": ["fusion"]}))
    assert isinstance(steps.transformer, LLMTransformer) and steps.analyst.level is Level.APPLICATION
    prompt = Prompts(DEFAULT_PROMPTS).system("custom", "transform", prompt_values(config.custom[0]))
    assert "What to look for: LOOK-FOR-TEXT" in prompt and "What to change: CHANGE-TEXT" in prompt
    assert "{{" not in prompt and "(none given)" in prompt


@pytest.mark.parametrize("optimization", list(EXPERTS))
def test_every_expert_optimization_has_a_prompt_per_step_with_examples(optimization: str) -> None:
    prompts = Prompts(DEFAULT_PROMPTS)
    prompts.check(optimization)
    transform = prompts.system(optimization, "transform")
    assert transform.startswith("You are one step of warpfleet's optimization workflow")
    assert "Examples:" in transform and "warpfleet: readonly begin" in transform
    assert "## " not in transform  # headings are structure, not prompt text


def test_a_missing_prompt_fails_before_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "_base.md").write_text("base\n")
    (tmp_path / "unroll.md").write_text("intro\n## analyse\nx\n")
    with pytest.raises(KeyError, match="has no '## plan' section"):
        build_steps(LLMSpec.model_validate({**SPEC, "prompts_dir": str(tmp_path)}), {"unroll": {"analyst": "llm",
                    "planner": "llm", "transformer": "llm"}})
    with pytest.raises(FileNotFoundError, match="no prompt file"):
        build_steps(LLMSpec.model_validate({**SPEC, "prompts_dir": str(tmp_path)}), {"padding": {"transformer": "llm"}})
