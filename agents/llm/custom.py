"""Custom optimizations from a text spec (WarpDrive's customization): the user says what to look
for and what to change; LLM agents do analysis, plan and transformation from ``custom.md``'s
prompts with that text filled in, and the same verification as every other proposal follows.

    CustomSpec (YAML or the run config's agents.custom) ─► custom_steps ─► Steps (all three LLM)
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from agents.llm.steps import Kit, LLMAnalyst, LLMPlanner, LLMTransformer
from agents.workflow.steps import Steps
from cluster.config.agents import CustomSpec

PROMPT = "custom"


def prompt_values(spec: CustomSpec) -> dict[str, str]:
    """The ``{{placeholders}}`` of custom.md."""
    search = json.dumps(spec.search) if spec.search else "none suggested"
    return {"name": spec.name, "look_for": spec.look_for.strip(), "change": spec.change.strip(),
            "examples": spec.examples.strip() or "(none given)", "search": search}


def custom_steps(kit: Kit, spec: CustomSpec) -> Steps:
    values = prompt_values(spec)
    kit.prompts.check(PROMPT, values)
    args = (kit, spec.name, spec.level, PROMPT, values)
    return Steps(LLMAnalyst(*args), LLMPlanner(*args), LLMTransformer(*args))


def load_custom(path: str | Path) -> CustomSpec:
    """A custom optimization from its own YAML file (the fields of ``CustomSpec``)."""
    return CustomSpec.model_validate(yaml.safe_load(Path(path).read_text()))
