"""The typed configuration of the LLM agents: the endpoint, the budgets, and who does each step.

    agents:                                  # AgentsConfig, the section a run config embeds
      llm: {base_url: ..., model: ...}       # LLMSpec: any OpenAI-compatible endpoint
      steps: {unroll: {transformer: llm}}    # per optimization, expert or llm per step
      custom: [{name: fusion, look_for: ..., change: ...}]

The API key is never part of the config: ``api_key_env`` names the environment variable that
holds it, and ``LLMSpec.api_key`` is the one place that reads it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.config import env
from cluster.core.registry import EXPERTS

NO_KEY = "not-needed"  # what the client sends to a local server that takes no key


class Level(StrEnum):
    """The four levels WarpDrive works at."""

    COMPILER_OPTION = "compiler option"
    COMPILER_HINT = "compiler hint"
    KERNEL = "kernel"
    APPLICATION = "application"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # as cluster.config.target._Model


class Prices(_Model):
    """What the endpoint charges, in your currency per million tokens."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_mtok + tokens_out * self.output_per_mtok) / 1e6


class LLMSpec(_Model):
    """One OpenAI-compatible chat-completions endpoint and how the agents use it."""

    base_url: str = "https://api.openai.com/v1"
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"  # None: a local server that takes no key
    temperature: float | None = Field(0.2, ge=0, le=2)  # None: not sent (reasoning models refuse it)
    max_tokens: int = Field(4096, ge=1, le=1_000_000)  # per completion
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    timeout_s: float = Field(120, gt=0, le=3600)  # per request
    retries: int = Field(4, ge=0, le=20)  # on 429, 5xx, timeouts and lost connections
    backoff_s: float = Field(1.0, ge=0, le=600)  # the first wait; doubles per retry, or the server's Retry-After
    max_backoff_s: float = Field(30.0, ge=0, le=3600)
    concurrency: int = Field(4, ge=1, le=1024)  # requests in flight at once, from this process
    prices: Prices | None = None
    prompts_dir: str | None = None  # default: the ones warpfleet ships (agents/prompts/)
    max_steps: int = Field(24, ge=1, le=1000)  # model calls per ReAct conversation
    token_budget: int | None = Field(None, ge=1)  # tokens in + out for the whole run
    rounds: int = Field(3, ge=1, le=1000)  # profile-guided rounds per plan
    proposals_per_round: int = Field(2, ge=1, le=64)
    max_diff_lines: int = Field(200, ge=1, le=100_000)  # lines added plus removed per proposal

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError("must be the name of an environment variable, not the key itself")
        return value

    def api_key(self) -> str:
        """The key from the environment (the only place it is read); raises KeyError naming the
        variable when it is unset."""
        if self.api_key_env is None:
            return NO_KEY
        key = env.api_key(self.api_key_env)
        if not key:
            raise KeyError(f"environment variable {self.api_key_env} is not set (it holds the API key)")
        return key

    @property
    def prompts(self) -> Path | None:
        """The prompts' folder; None: the package's own (``agents.llm.prompts.DEFAULT_PROMPTS``)."""
        return Path(self.prompts_dir) if self.prompts_dir else None


Implementation = Literal["expert", "llm"]


class StepChoice(_Model):
    """Who does steps 1-3 of one optimization. An expert step reads the data of the expert step
    before it, so once a step is ``llm`` the later ones must be too."""

    analyst: Implementation = "expert"
    planner: Implementation = "expert"
    transformer: Implementation = "expert"

    @model_validator(mode="after")
    def _experts_follow_experts(self) -> StepChoice:
        order = [("analyst", self.analyst), ("planner", self.planner), ("transformer", self.transformer)]
        for (before, first), (after, second) in itertools.pairwise(order):
            if first == "llm" and second == "expert":
                raise ValueError(f"{after} cannot be an expert after an llm {before} (experts read their own "
                                 f"analysis); make it llm too")
        return self


class CustomSpec(_Model):
    """A custom optimization from a text spec (WarpDrive's customization): what to look for and
    what to change; the LLM agents do the rest under the same verification."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    look_for: str = Field(min_length=1)
    change: str = Field(min_length=1)
    level: Level = Field(Level.KERNEL, strict=False)  # a YAML string names the enum member
    examples: str = ""  # few-shot examples in the user's words
    search: dict[str, list[int | float | str]] = {}  # params the sweep should search, -D macros

    @field_validator("search")
    @classmethod
    def _macros(cls, value: dict[str, list[int | float | str]]) -> dict[str, list[int | float | str]]:
        for name, values in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or not values:
                raise ValueError(f"{name!r}: a macro name with at least one value")
        return value


def check_choices(llm: LLMSpec | None, steps: Mapping[str, StepChoice], custom: Sequence[CustomSpec],
                  only: Sequence[str] | None = None) -> None:
    """The rules between an endpoint, the per-step choices and the custom optimizations (raises
    ValueError naming the field): for ``AgentsConfig``, and for a run config that embeds the same
    fields in its own section."""
    customs = {c.name for c in custom}
    if len(customs) != len(custom):
        raise ValueError("two custom optimizations share a name")
    for name in customs & set(EXPERTS):
        raise ValueError(f"custom optimization {name!r} has the name of an expert's")
    for name, choice in steps.items():
        if name not in customs and name not in EXPERTS:
            known = ", ".join([*EXPERTS, *sorted(customs)])
            raise ValueError(f"steps.{name}: unknown optimization (known: {known})")
        if name in customs and choice.analyst != "llm":
            raise ValueError(f"steps.{name}: a custom optimization has no expert; its steps are all llm")
    for name in only or ():
        if name not in customs and name not in EXPERTS:
            raise ValueError(f"only: unknown optimization {name!r}")
    uses_llm = bool(customs) or any("llm" in (c.analyst, c.planner, c.transformer) for c in steps.values())
    if uses_llm and llm is None:
        raise ValueError("llm: an endpoint is needed for the steps chosen as llm")


def choices_of(steps: Mapping[str, StepChoice], custom: Sequence[CustomSpec],
               only: Sequence[str] | None = None) -> dict[str, StepChoice]:
    """Every optimization with its choice: the experts' (all-expert unless chosen), then the
    customs' (all llm); only those in ``only`` when it is given. What ``build_steps`` takes."""
    out = {name: steps.get(name, StepChoice()) for name in EXPERTS}
    for spec in custom:
        out[spec.name] = StepChoice(analyst="llm", planner="llm", transformer="llm")
    return {name: choice for name, choice in out.items() if only is None or name in only}


class AgentsConfig(_Model):
    """The LLM agents' part of a run config's ``agents:`` section."""

    llm: LLMSpec | None = None
    steps: dict[str, StepChoice] = {}  # optimization -> choice; the experts' default is all-expert
    custom: list[CustomSpec] = []
    only: list[str] | None = None  # the optimizations to run; default: every expert's and every custom one

    @model_validator(mode="after")
    def _consistent(self) -> AgentsConfig:
        check_choices(self.llm, self.steps, self.custom, self.only)
        return self

    def choices(self) -> dict[str, StepChoice]:
        return choices_of(self.steps, self.custom, self.only)


class AgentsSpec(_Model):
    """The optimization workflow before the search (issue 4): which experts run, how variants are
    verified. Verified variants join the search as a dimension beside the compiler options."""

    enabled: bool = False
    experts: list[str] = list(EXPERTS)  # names in cluster.core.registry.EXPERTS
    sanitizer: list[Literal["memcheck", "racecheck", "initcheck", "synccheck"]] = ["memcheck", "racecheck"]
    sanitizer_timeout_s: float = Field(300, gt=0, le=86400)
    # compute-sanitizer checks at most this many kernel launches a run, of the kernels a variant
    # changed (all kernels where it changed host code): a bound by construction, not by a timeout.
    # null: every launch.
    sanitizer_launches: int | None = Field(16, ge=1)
    retries: int = Field(1, ge=0, le=10)  # more tries with the failure as feedback, for agents that take it
    profile_baseline: bool = True  # ncu on the baseline first, so that analysts see its metrics
    guardrails: bool = True  # cheat checks: a variant's timing code read, every finalist's runs watched for a cache
    # LLM agents (issue 5): an endpoint, expert or llm per step of each optimization, custom ones
    llm: LLMSpec | None = None
    steps: dict[str, StepChoice] = {}
    custom: list[CustomSpec] = []
    replay: bool = False  # answer the LLM steps from the exchanges stored in the run directory
    iterate: bool = True  # profile-guided rounds (llm.rounds) for plans whose transformer is an LLM
    # The accepted source changes of a study also merged into one variant (agents.workflow.stack),
    # verified like the others and measured beside each change alone.
    stack: bool = True

    @field_validator("experts")
    @classmethod
    def _registered(cls, value: list[str]) -> list[str]:
        return [EXPERTS.check(name) for name in value]

    @model_validator(mode="after")
    def _choices(self) -> AgentsSpec:
        check_choices(self.llm, self.steps, self.custom, [*self.experts, *(c.name for c in self.custom)])
        return self
