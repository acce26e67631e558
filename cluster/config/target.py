"""A target's typed spec: a program (or kernel) plus a YAML file next to its sources.

``Target`` is the loaded, validated value that every later stage receives; ``cluster.config.load``
reads and checks the YAML.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from cluster.core.limits import Limits
from cluster.core.types import Scalar, SourceBundle
from search_spaces import FlagSpace, compile_constraint


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
    """What a candidate may take (``cluster.runners.sandbox.Limits``). The address-space limit is off by
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
    # Folders beside the target's (relative to it) that its sources and files may be symbolic links
    # into: a suite's shared headers. Nothing else outside the target's folder is read.
    shared: list[str] = []
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
