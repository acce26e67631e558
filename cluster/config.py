"""The typed config: a run config (YAML) that names target files (YAML next to their sources).

Parsing happens here and only here; every later stage receives ``RunPlan``/``Target`` values.
Any problem raises ``ConfigError`` with one line naming the file and the field.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agents.llm.config import CustomSpec, LLMSpec, StepChoice, check_choices
from cluster.errors import ConfigError
from cluster.placeholders import names_in
from cluster.sandbox import Limits
from cluster.types import Scalar, SourceBundle
from search_spaces import FlagSpace, compile_constraint, load_space


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_regex(value: str | None) -> str | None:
    if value is None:
        return value
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression ({exc})") from None
    if pattern.groups != 1:
        raise ValueError("needs exactly one capture group, the number")
    return value


class MetricSpec(_Model):
    """Where the metric comes from: ``regex`` over stdout (every match is a sample), or else the
    line protocol ``@warpfleet <name>=<value>`` (one sample per line)."""

    regex: str | None = None
    name: str = Field("time_ms", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    unit: str = "ms"
    goal: Literal["minimize", "maximize"] = "minimize"

    _regex = field_validator("regex")(_check_regex)


class OutputSpec(_Model):
    path: str
    format: Literal["binary", "text"] | None = None  # default: text for .txt/.csv/.dat, else binary
    dtype: str = "float32"

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in {"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                         "uint8", "uint16", "uint32", "uint64"}:
            raise ValueError(f"unknown dtype {value!r}")
        return value

    @property
    def is_text(self) -> bool:
        if self.format:
            return self.format == "text"
        return Path(self.path).suffix in {".txt", ".csv", ".dat"}


class VerifySpec(_Model):
    outputs: list[OutputSpec] = []
    rtol: float = Field(1e-5, ge=0)
    atol: float = Field(1e-8, ge=0)
    stdout_regex: str | None = None  # numbers in stdout compared like an output file
    test: list[str] | None = None  # a user test command, run in the candidate's directory
    # The run command under compute-sanitizer (agents' variants, on a GPU): default `run`. A smaller
    # problem keeps racecheck, which is slow, within its timeout.
    sanitize_run: list[str] | None = None

    _regex = field_validator("stdout_regex")(_check_regex)

    @field_validator("outputs", mode="before")
    @classmethod
    def _paths_as_specs(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value


class Timeouts(_Model):
    build: float = Field(120, gt=0, le=86400)
    run: float = Field(60, gt=0, le=86400)


class LimitsSpec(_Model):
    """What a candidate may take (``cluster.sandbox.Limits``). The address-space limit is off by
    default because CUDA programs reserve far more virtual memory than they use."""

    memory_mb: int | None = Field(None, ge=32, le=16 * 1024 * 1024)  # address space of each run
    file_mb: int = Field(1024, ge=1, le=1024 * 1024)  # any one file written, stdout and stderr included
    disk_mb: int = Field(4096, ge=1, le=16 * 1024 * 1024)  # everything in the scratch directory

    def for_build(self) -> Limits:
        return Limits(file_mb=self.file_mb, disk_mb=self.disk_mb)  # compilers need their address space

    def for_run(self) -> Limits:
        return Limits(memory_mb=self.memory_mb, file_mb=self.file_mb, disk_mb=self.disk_mb)


class TargetSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    toolchain: str = "nvcc"
    space: str | None = None  # a named space in search_spaces/, or a path; default: the toolchain's
    sources: list[str] = Field(min_length=1)
    files: list[str] = []  # other files the run needs (inputs), shipped with the sources
    build: list[str] | None = Field(None, min_length=1)
    run: list[str] = Field(min_length=1)
    metric: MetricSpec = MetricSpec()
    verify: VerifySpec = VerifySpec()
    timeouts: Timeouts = Timeouts()
    limits: LimitsSpec = LimitsSpec()
    params: dict[str, list[Scalar]] = {}
    defaults: dict[str, Scalar] = {}  # the baseline's params; default: each param's first value
    constraints: list[str] = []

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        for name, values in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not a valid macro name")
            if not values:
                raise ValueError(f"{name} has no values")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"{name} lists a value twice")
        return value


# Placeholders every command may use; params are usable by name as well.
BUILD_PLACEHOLDERS = {"flags", "defines", "arch", "binary", "sources", "workdir", "harness_include"}
RUN_PLACEHOLDERS = {"binary", "workdir", "arch", "seed"}


@dataclass(frozen=True)
class Target:
    """A loaded, validated target: its spec, its files by value, and its flags space."""

    spec: TargetSpec
    file: str
    bundle: SourceBundle
    space: FlagSpace

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def baseline_params(self) -> dict[str, Scalar]:
        return {name: self.spec.defaults.get(name, values[0]) for name, values in self.spec.params.items()}

    def satisfies(self, params: dict[str, Scalar]) -> bool:
        return all(compile_constraint(expr, self.spec.params)(params) for expr in self.spec.constraints)

    def space_size(self) -> int:
        """The number of distinct valid (flags, params) points, counting constraints."""
        flags = math.prod(len(choices) for choices in self.space.flags.values())
        names = list(self.spec.params)
        points = itertools.product(*self.spec.params.values())
        valid = sum(1 for values in points if self.satisfies(dict(zip(names, values, strict=True))))
        return flags * valid


class SearchSpec(_Model):
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    # time: the target's metric; energy: NVML joules per sample; edp: their product;
    # time_energy: both, a Pareto front found with NSGA-II. Energy needs GPU workers (NVML).
    objective: Literal["time", "energy", "edp", "time_energy"] = "time"
    seed: int = 0
    trials: int | None = Field(40, gt=0, le=10_000_000)  # evaluated candidates per study
    time_budget_s: float | None = Field(None, gt=0)
    storage: str | None = None  # an RDB URL; default: a journal file in the run directory


class ClusterSpec(_Model):
    address: str | None = None
    cpu_workers: int = Field(1, ge=1, le=4096)  # CPU measuring actors when there is no GPU
    compile_workers: int | None = Field(None, ge=1, le=100_000)  # default: the cluster's CPUs
    inflight_per_worker: int = Field(2, ge=1, le=64)
    max_attempts: int = Field(3, ge=1, le=100)  # a candidate that kills its worker this often is quarantined
    # Ray accelerator types to sweep (H100, A100-80G); null: every GPU. A type not in the cluster is skipped.
    gpu_types: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]] | None = Field(None, min_length=1)


class MeasureSpec(_Model):
    runs: int = Field(1, ge=1, le=1000)  # program runs per candidate in the search
    final_top_k: int = Field(3, ge=0, le=100)  # candidates re-measured for the selection
    final_runs: int = Field(5, ge=1, le=1000)
    max_noise: float = Field(0.05, gt=0, le=10)  # rows whose IQR/median stays above are marked noisy


class ProfileSpec(_Model):
    """The Nsight Compute stage, for GPU targets: which candidates, which metrics."""

    candidates: Literal["none", "best", "all"] = "best"  # best: the baseline and each study's winner
    metrics: list[str] | None = None  # default: cluster.profile.DEFAULT_METRICS
    timeout_s: float = Field(600, gt=0, le=86400)


class AgentsSpec(_Model):
    """The optimization workflow before the search (issue 4): which experts run, how variants are
    verified. Verified variants join the search as a dimension beside the compiler options."""

    enabled: bool = False
    experts: list[Literal["registers", "unroll", "padding", "streamify", "launch_bounds", "restrict", "vectorize"]] = [
        "registers", "unroll", "padding", "streamify", "launch_bounds", "restrict", "vectorize"]
    sanitizer: list[Literal["memcheck", "racecheck", "initcheck", "synccheck"]] = ["memcheck", "racecheck"]
    sanitizer_timeout_s: float = Field(300, gt=0, le=86400)
    retries: int = Field(1, ge=0, le=10)  # more tries with the failure as feedback, for agents that take it
    profile_baseline: bool = True  # ncu on the baseline first, so that analysts see its metrics
    guardrails: bool = True  # the cheat checks on every variant that passed (agents.llm's threat model)
    # LLM agents (issue 5): an endpoint, expert or llm per step of each optimization, custom ones
    llm: LLMSpec | None = None
    steps: dict[str, StepChoice] = {}
    custom: list[CustomSpec] = []
    replay: bool = False  # answer the LLM steps from the exchanges stored in the run directory
    iterate: bool = True  # profile-guided rounds (llm.rounds) for plans whose transformer is an LLM

    @model_validator(mode="after")
    def _choices(self) -> AgentsSpec:
        check_choices(self.llm, self.steps, self.custom, [*self.experts, *(c.name for c in self.custom)])
        return self


class RunConfig(_Model):
    name: str = Field("sweep", pattern=r"^[A-Za-z0-9_.-]+$")
    output_dir: str = "runs"
    targets: list[str] = Field(min_length=1)
    search: SearchSpec = SearchSpec()
    cluster: ClusterSpec = ClusterSpec()
    measure: MeasureSpec = MeasureSpec()
    profile: ProfileSpec = ProfileSpec()
    agents: AgentsSpec = AgentsSpec()
    flush_interval_s: float = Field(2.0, gt=0, le=3600)


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    file: str
    targets: tuple[Target, ...]


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "", f"cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise ConfigError(path, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", "must be a mapping of fields")
    return data


def _validate(model: type[_Model], data: dict[str, Any], path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field"
        raise ConfigError(path, _field_path(err["loc"]), message) from None


def load_target(path: str | Path) -> Target:
    """Load and check a target file, reading its sources and files into a bundle."""
    from cluster.toolchains import get_toolchain

    path = Path(path)
    spec: TargetSpec = _validate(TargetSpec, _read_yaml(path), path)
    try:
        toolchain = get_toolchain(spec.toolchain)
    except KeyError as exc:
        raise ConfigError(path, "toolchain", str(exc.args[0])) from None
    try:
        space = load_space(spec.space or toolchain.name, base=path.parent)
    except (KeyError, ValueError) as exc:
        raise ConfigError(path, "space", str(exc.args[0])) from None
    files = []
    for field, names in (("sources", spec.sources), ("files", spec.files)):
        for i, name in enumerate(names):
            file = path.parent / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ConfigError(path, f"{field}[{i}]", "must be a path inside the target's folder")
            if not file.is_file():
                raise ConfigError(path, f"{field}[{i}]", f"file not found: {file}")
            files.append((name, file.read_bytes()))
    _check_commands(spec, path, toolchain.default_build)
    for name, value in spec.defaults.items():
        if name not in spec.params:
            raise ConfigError(path, f"defaults.{name}", "is not a param")
        if value not in spec.params[name]:
            raise ConfigError(path, f"defaults.{name}", f"{value!r} is not one of the param's values")
    for i, expr in enumerate(spec.constraints):
        try:
            compile_constraint(expr, spec.params)
        except ValueError as exc:
            raise ConfigError(path, f"constraints[{i}]", str(exc)) from None
    target = Target(spec, str(path), SourceBundle(tuple(files)), space)
    if spec.constraints and not target.satisfies(target.baseline_params):
        raise ConfigError(path, "defaults", "the baseline's params violate the constraints")
    return target


def _check_commands(spec: TargetSpec, path: Path, default_build: tuple[str, ...]) -> None:
    params = set(spec.params)
    checks = [("build", spec.build or list(default_build), BUILD_PLACEHOLDERS),
              ("run", spec.run, RUN_PLACEHOLDERS)]
    if spec.verify.test:
        checks.append(("verify.test", spec.verify.test, RUN_PLACEHOLDERS))
    if spec.verify.sanitize_run:
        checks.append(("verify.sanitize_run", spec.verify.sanitize_run, RUN_PLACEHOLDERS))
    for field, template, allowed in checks:
        for i, arg in enumerate(template):
            unknown = names_in([arg]) - allowed - params
            if unknown:
                known = ", ".join(sorted(allowed | params))
                raise ConfigError(path, f"{field}[{i}]",
                                  f"unknown placeholder {{{sorted(unknown)[0]}}} (known: {known})")


def load_run(path: str | Path) -> RunPlan:
    """Load a run config and every target it names (paths relative to the config file)."""
    path = Path(path)
    config: RunConfig = _validate(RunConfig, _read_yaml(path), path)
    targets = []
    for i, name in enumerate(config.targets):
        target_path = path.parent / name
        if not target_path.is_file():
            raise ConfigError(path, f"targets[{i}]", f"file not found: {target_path}")
        targets.append(load_target(target_path))
    from cluster.toolchains import get_toolchain

    objective = config.search.objective
    for target in targets:
        if objective != "time" and get_toolchain(target.spec.toolchain).device_kind != "gpu":
            raise ConfigError(path, "search.objective",
                              f"{objective} needs GPU workers (NVML energy); target {target.name} runs on a CPU")
    seen: dict[str, int] = {}
    for i, target in enumerate(targets):
        if target.name in seen:
            raise ConfigError(path, f"targets[{i}]", f"a second target named {target.name!r}")
        seen[target.name] = i
    return RunPlan(config, str(path), tuple(targets))
