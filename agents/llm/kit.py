"""Assembling the LLM agents of a run: the kit they share, and the workflow's ``Steps`` per
optimization with an expert or an LLM agent at each step, as the config chooses.

    AgentsConfig | (LLMSpec, choice) ─► make_kit (client or replay, store, budget, prompts, services)
                                     ─► build_steps ─► [Steps] ─► agents.workflow.run_workflow
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from agents.experts._expert import Expert
from agents.llm.accounting import TokenBudget
from agents.llm.client import OpenAIChat
from agents.llm.custom import custom_steps
from agents.llm.prompts import Prompts
from agents.llm.replay import ReplayChat
from agents.llm.steps import Kit, LLMAnalyst, LLMPlanner, LLMTransformer
from agents.llm.store import ExchangeStore
from agents.llm.tools import Services
from agents.workflow.steps import Steps
from cluster.config.agents import AgentsConfig, CustomSpec, LLMSpec, StepChoice
from cluster.core.registry import EXPERTS


def make_kit(spec: LLMSpec, run_dir: str | Path | None = None, *, replay: bool = False,
             services: Services | None = None, budget: TokenBudget | None = None) -> Kit:
    """The endpoint (or, with ``replay``, the exchanges stored under ``run_dir``) with the run's
    token budget, prompts and tool services (default: builds on this machine, no verify/profile)."""
    store = ExchangeStore.of_run(run_dir) if run_dir is not None else None
    budget = budget or TokenBudget(spec.token_budget)
    if replay:
        if store is None:
            raise ValueError("a replay needs the run directory whose exchanges it replays")
        chat = ReplayChat(spec, store, budget)
    else:
        chat = OpenAIChat(spec, store, budget)
    return Kit(spec, chat, Prompts(spec.prompts), services or Services(), budget)


def build_steps(spec: LLMSpec | None, choice: Mapping[str, Mapping[str, str] | StepChoice], *,
                custom: Sequence[CustomSpec] = (), kit: Kit | None = None, run_dir: str | Path | None = None,
                replay: bool = False, services: Services | None = None) -> list[Steps]:
    """The workflow's steps for each optimization of ``choice`` (in its order), e.g.
    ``{"unroll": {"analyst": "expert", "planner": "expert", "transformer": "llm"}, "fusion": {...}}``:
    an expert or an LLM agent at each step (missing steps: expert). Optimizations are the experts'
    (``cluster.core.registry.EXPERTS``) and the ``custom`` ones, which are LLM at every step.

    The LLM agents share ``kit``, or one made from ``spec`` (``make_kit``: ``run_dir`` stores the
    exchanges, ``replay`` answers from them). Raises ValueError for an unknown optimization, an
    expert after an LLM step, or LLM steps without ``spec``; FileNotFoundError/KeyError for a
    missing prompt file or section.
    """
    customs = {c.name: c for c in custom}
    choices = {name: c if isinstance(c, StepChoice) else StepChoice.model_validate(dict(c))
               for name, c in choice.items()}
    needs_llm = any(name in customs or "llm" in (c.analyst, c.planner, c.transformer) for name, c in choices.items())
    if needs_llm and kit is None:
        if spec is None:
            raise ValueError("steps chosen as llm need an LLM endpoint (spec)")
        kit = make_kit(spec, run_dir, replay=replay, services=services)
    out = []
    for name, chosen in choices.items():
        if name in customs:
            out.append(custom_steps(kit, customs[name]))  # type: ignore[arg-type]
            continue
        if name not in EXPERTS:
            raise ValueError(f"unknown optimization {name!r} (known: {', '.join([*EXPERTS, *customs])})")
        expert: Expert = EXPERTS.load(name)()
        if kit is not None and "llm" in (chosen.analyst, chosen.planner, chosen.transformer):
            kit.prompts.check(name)
        args = (kit, name, expert.level)
        out.append(Steps(expert if chosen.analyst == "expert" else LLMAnalyst(*args),  # type: ignore[arg-type]
                         expert if chosen.planner == "expert" else LLMPlanner(*args),  # type: ignore[arg-type]
                         expert if chosen.transformer == "expert" else LLMTransformer(*args)))  # type: ignore[arg-type]
    return out


def steps_from_config(config: AgentsConfig, **kwargs: object) -> list[Steps]:
    """``build_steps`` for a run config's ``agents:`` section (keyword arguments as build_steps')."""
    return build_steps(config.llm, config.choices(), custom=config.custom, **kwargs)  # type: ignore[arg-type]
