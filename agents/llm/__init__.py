"""LLM agents for every step of the workflow, through any OpenAI-compatible endpoint.

    AgentsConfig ─► make_kit (OpenAIChat | ReplayChat, ExchangeStore, TokenBudget, Prompts, Services)
                 ─► build_steps ─► [Steps]: experts and LLMAnalyst/LLMPlanner/LLMTransformer per step
                 ─► agents.workflow.run_workflow, or iterate (profile-guided rounds)
    every exchange ─► <run_dir>/llm/ (content-addressed, replayable); every proposal ─► usage_record

The scripted endpoint for tests and rehearsals without a model is ``agents.llm.testing`` (not
re-exported here: it is a test double, not part of the agents' API).
"""
import importlib

# Public names, imported on first use: cluster.config reads cluster.config.agents, and the rest of
# this package reads cluster, so an eager import here would be a cycle.
_WHERE = {
    "AgentsConfig": "cluster.config.agents",
    "ChatClient": "agents.llm.client",
    "ChatRequest": "agents.llm.client",
    "Completion": "agents.llm.client",
    "CustomSpec": "cluster.config.agents",
    "EndpointError": "agents.llm.client",
    "ExchangeStore": "agents.llm.store",
    "IterationResult": "agents.llm.iterate",
    "Kit": "agents.llm.steps",
    "LLMAnalyst": "agents.llm.steps",
    "LLMPlanner": "agents.llm.steps",
    "LLMProposal": "agents.llm.accounting",
    "LLMReviewer": "agents.llm.steps",
    "LLMSpec": "cluster.config.agents",
    "LLMStepError": "agents.llm.steps",
    "LLMTransformer": "agents.llm.steps",
    "OpenAIChat": "agents.llm.client",
    "Prices": "cluster.config.agents",
    "Prompts": "agents.llm.prompts",
    "ReplayChat": "agents.llm.replay",
    "Round": "agents.llm.iterate",
    "Services": "agents.llm.tools",
    "StepChoice": "cluster.config.agents",
    "TokenBudget": "agents.llm.accounting",
    "Trial": "agents.llm.iterate",
    "Usage": "agents.llm.accounting",
    "Workspace": "agents.llm.guard",
    "build_steps": "agents.llm.kit",
    "check_files": "agents.llm.guard",
    "custom_steps": "agents.llm.custom",
    "feedback_text": "agents.llm.iterate",
    "load_custom": "agents.llm.custom",
    "make_kit": "agents.llm.kit",
    "steps_from_config": "agents.llm.kit",
    "trial_record": "agents.llm.iterate",
    "usage_record": "agents.llm.accounting",
}

__all__ = [
    "AgentsConfig", "ChatClient", "ChatRequest", "Completion", "CustomSpec", "EndpointError", "ExchangeStore",
    "IterationResult", "Kit", "LLMAnalyst", "LLMPlanner", "LLMProposal", "LLMReviewer", "LLMSpec", "LLMStepError",
    "LLMTransformer", "OpenAIChat", "Prices", "Prompts", "ReplayChat", "Round", "Services", "StepChoice",
    "TokenBudget", "Trial", "Usage", "Workspace", "build_steps", "check_files", "custom_steps", "feedback_text",
    "load_custom", "make_kit", "steps_from_config", "trial_record", "usage_record",
]


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
