"""A target's typed spec: a program (or kernel) plus a YAML file next to its sources.

``Target`` is the loaded, validated value that every later stage receives; ``cluster.config.load``
reads and checks the YAML.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.config.kernel import KernelSpec
from cluster.core.limits import Limits
from cluster.core.registry import RUNNERS
from cluster.core.types import Proposal, Scalar, SourceBundle
from cluster.toolchains import get_toolchain
from search_spaces import FlagSpace, compile_constraint

# A name that becomes part of a file name (run directories, exports): no ".", "..", "/", no leading "-".
SAFE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$"
MAX_PARAMS = 64
MAX_PARAM_VALUES = 10_000  # per param; Optuna's categorical choices, and -D defines, one per value
# Headers are sources (agents may edit them) but never compiled on their own: left out of {sources}.
HEADER_SUFFIXES = frozenset({".h", ".hh", ".hpp", ".hxx", ".cuh", ".inc", ".inl"})
# Counting a space's valid points enumerates the params' product up to this many points or this long;
# past either, the count is the product itself, an upper bound (constraints not applied).
EXACT_COUNT_POINTS = 200_000
EXACT_COUNT_S = 2.0
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # an int param's values: the results' p_ column is int64


class _Model(BaseModel):
    # strict: `trials: true` is not 1, and `BLOCK: [true]` is not [1]; YAML gives each type as it is
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
    rtol: float | None = Field(None, ge=0)  # this output's tolerances; default: verify's
    atol: float | None = Field(None, ge=0)

    @field_validator("path")
    @classmethod
    def _in_scratch(cls, value: str) -> str:
        """An output is a file the run writes in its scratch directory: the worker reads nothing else."""
        parts = Path(value).parts
        if not parts or Path(value).is_absolute() or ".." in parts:
            raise ValueError(f"{value!r} is not a path inside the run's scratch directory (relative, without '..')")
        return value

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
    """What a candidate may take (``cluster.sandbox.sandbox.Limits``). The address-space limit is off by
    default because CUDA programs reserve far more virtual memory than they use."""

    memory_mb: int | None = Field(None, ge=32, le=16 * 1024 * 1024)  # address space of each run
    file_mb: int = Field(1024, ge=1, le=1024 * 1024)  # any one file written, stdout and stderr included
    disk_mb: int = Field(4096, ge=1, le=16 * 1024 * 1024)  # everything in the scratch directory
    files: int = Field(20_000, ge=16, le=100_000_000)  # files and folders in the scratch directory

    def for_build(self) -> Limits:
        return Limits(file_mb=self.file_mb, disk_mb=self.disk_mb, files=self.files)  # compilers need address space

    def for_run(self) -> Limits:
        return Limits(memory_mb=self.memory_mb, file_mb=self.file_mb, disk_mb=self.disk_mb, files=self.files)


KERNEL_RUNNER = "kernel"  # the runner of kind: kernel targets (cluster.core.registry.RUNNERS), theirs alone
KERNEL_RUN = ["{binary}", "--seed", "{seed}"]  # a kernel target's run: the kernel runner's, on the run's seed


class TargetSpec(_Model):
    name: str = Field(pattern=SAFE_NAME)
    toolchain: str = "nvcc"
    space: str | None = None  # a named space in search_spaces/, or a path; default: the toolchain's
    sources: list[str] = Field(min_length=1)
    files: list[str] = []  # other files the run needs (inputs), shipped with the sources
    # Folders beside the target's (relative to it) that its sources and files may be symbolic links
    # into: a suite's shared headers. Nothing else outside the target's folder is read.
    shared: list[str] = []
    build: list[str] | None = Field(None, min_length=1)
    run: list[str] = Field(None, min_length=1)  # required for a program; a kernel's is the kernel runner's
    metric: MetricSpec = MetricSpec()
    verify: VerifySpec = VerifySpec()
    timeouts: Timeouts = Timeouts()
    limits: LimitsSpec = LimitsSpec()
    params: dict[str, list[Scalar]] = Field({}, max_length=MAX_PARAMS)
    defaults: dict[str, Scalar] = {}  # the baseline's params; default: each param's first value
    # The baseline's flags by name, each one of the space's options (default: each flag's first option).
    baseline_flags: dict[str, str] = {}
    # How candidates run (cluster.core.registry.RUNNERS): a process each, or inside a persistent host
    # process per device (a shared-library build); auto: persistent for programs that use the harness.
    runner: str = "auto"
    constraints: list[str] = []
    # A program (the default), or one kernel measured in-process by the kernel runner (cluster/config/kernel.py).
    kind: Literal["program", "kernel"] = "program"
    kernel: KernelSpec | None = None

    @field_validator("params", mode="before")
    @classmethod
    def _not_too_many(cls, value: Any) -> Any:
        # before validation: a list of millions is refused before each item is looked at
        if isinstance(value, dict):
            for name, values in value.items():
                if isinstance(values, list) and len(values) > MAX_PARAM_VALUES:
                    raise ValueError(f"{name} has {len(values)} values (at most {MAX_PARAM_VALUES})")
                for v in values if isinstance(values, list) else ():
                    if isinstance(v, bool):  # YAML's true: a -D of 1 or True? Neither, silently
                        raise ValueError(f"{name}: {v!r} is not a number or a string (quote it to mean the text)")
                    if isinstance(v, float) and not math.isfinite(v):  # YAML's .inf and .nan
                        raise ValueError(f"{name}: {v!r} is not a finite number (quote it to mean the text)")
                    if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:  # the results' p_ column
                        raise ValueError(f"{name}: {v} does not fit in 64 bits (quote it to mean the text)")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, list[Scalar]]) -> dict[str, list[Scalar]]:
        for name, values in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not a valid macro name")
            if name in BUILD_PLACEHOLDERS | RUN_PLACEHOLDERS:  # {seed} in a command would be which?
                raise ValueError(f"{name} is the name of a placeholder ({{{name}}}): name the param otherwise")
            if not values:
                raise ValueError(f"{name} has no values")
            if len(set(map(repr, values))) != len(values):
                raise ValueError(f"{name} lists a value twice")
        return value

    @field_validator("runner")
    @classmethod
    def _registered_runner(cls, value: str) -> str:
        return value if value == "auto" else RUNNERS.check(value)

    @model_validator(mode="after")
    def _kind(self) -> TargetSpec:
        if self.kind == "program":
            if self.runner == KERNEL_RUNNER:
                raise ValueError("runner: the kernel runner is a kernel target's (kind: kernel)")
            if self.kernel is not None:
                raise ValueError("kernel: only a target of kind: kernel has one")
            if self.run is None:
                raise ValueError("run: a program target needs a run command")
            return self
        if self.kernel is None:
            raise ValueError("kernel: a target of kind: kernel needs its kernel section")
        # Derived fields of a frozen model, set once here (and accepted as they are, so that a spec
        # dumped and read again is the same): the kernel runner's process form takes a seed (fresh
        # inputs per run), and each output argument is compared as a file.
        outputs = [OutputSpec(path=a.output_file, dtype="float64" if a.compare == "sum" else a.dtype,
                              rtol=a.rtol, atol=a.atol) for a in self.kernel.outputs]
        if self.build is not None or self.run not in (None, KERNEL_RUN):
            field = "build" if self.build is not None else "run"
            raise ValueError(f"{field}: a kernel target has none (the kernel runner compiles and launches it)")
        if self.toolchain != "nvcc":
            raise ValueError(f"toolchain: a kernel target is CUDA (nvcc), not {self.toolchain}")
        if self.runner != "auto":
            raise ValueError("runner: a kernel target always runs on the kernel runner")
        if self.verify.outputs not in ([], outputs) or self.verify.sanitize_run or self.verify.stdout_regex:
            raise ValueError("verify: a kernel target's outputs are its arguments marked output: true "
                             "(only rtol, atol and test here)")
        object.__setattr__(self, "run", list(KERNEL_RUN))
        object.__setattr__(self, "verify", self.verify.model_copy(update={"outputs": outputs}))
        return self


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

    @property
    def runner(self) -> str:
        """The runner its candidates use: the spec's, or for ``auto`` the persistent runner where
        the toolchain can build a shared library, the build takes ``{flags}`` and ``{sources}``,
        and the program includes the timing harness (whose programs are written to be re-entered)."""
        if self.spec.kind == "kernel":
            return KERNEL_RUNNER  # one kernel, loaded as a cubin in the device's host process
        if self.spec.runner != "auto":
            return self.spec.runner
        uses_harness = any(b"warpfleet/harness.cuh" in content for _, content in self.bundle.files)
        return "persistent" if uses_harness and shared_build_problem(self.spec) is None else "process"

    @property
    def baseline_flags(self) -> dict[str, str]:
        """The baseline's option per flag: ``space`` lists it first (``load_target`` puts a target's
        ``baseline_flags`` there), so ``space.baseline`` says the same."""
        return self.space.baseline

    @property
    def compiled_sources(self) -> list[str]:
        """The sources that ``{sources}`` passes to the compiler: every source but the headers."""
        return [s for s in self.spec.sources if Path(s).suffix.lower() not in HEADER_SUFFIXES]

    def satisfies(self, params: dict[str, Scalar]) -> bool:
        return all(compile_constraint(expr, self.spec.params)(params) for expr in self.spec.constraints)

    def space_count(self) -> SpaceCount:
        """How many distinct valid (flags, params) points the space has. Exact (constraints applied)
        when the params' product has at most ``EXACT_COUNT_POINTS`` points and counting them takes
        under ``EXACT_COUNT_S``; else the product itself, an upper bound, found without enumerating."""
        flags = math.prod(len(choices) for choices in self.space.flags.values())
        product = math.prod(len(values) for values in self.spec.params.values())
        if not self.spec.constraints:
            return SpaceCount(flags * product, True)
        if product > EXACT_COUNT_POINTS:
            return SpaceCount(flags * product, False)
        names = list(self.spec.params)
        deadline = time.monotonic() + EXACT_COUNT_S
        valid = 0
        for i, values in enumerate(itertools.product(*self.spec.params.values())):
            valid += self.satisfies(dict(zip(names, values, strict=True)))
            if i % 1024 == 1023 and time.monotonic() > deadline:
                return SpaceCount(flags * product, False)
        return SpaceCount(flags * valid, True)

    def space_size(self) -> int:
        """The number of distinct valid (flags, params) points, or an upper bound of it for a space
        too large to count (``space_count``); never fewer than there are."""
        return self.space_count().points


class SpaceCount(NamedTuple):
    points: int
    exact: bool  # False: an upper bound, the constraints not applied


def shared_build_problem(spec: TargetSpec) -> str | None:
    """Why this target cannot be built as a shared library for the persistent runner, or None."""
    toolchain = get_toolchain(spec.toolchain)
    if not toolchain.shared_flags:
        return f"the {toolchain.name} toolchain cannot build a shared library"
    template = " ".join(spec.build or toolchain.default_build)
    missing = [name for name in ("{flags}", "{sources}") if name not in template]
    return f"the build command lacks {' and '.join(missing)}" if missing else None


# A target's variants: its files replaced (an agent's proposal, a patch), the rest kept.

class ChangedFiles(Protocol):
    """Replaced sources, paths as in the target: a ``Proposal``'s, a patch's (``agents.patch``)."""

    @property
    def files(self) -> tuple[tuple[str, str], ...]: ...


def variant_bundle(target: Target, patched: ChangedFiles) -> SourceBundle:
    """The target's bundle with the changed sources substituted, other files kept, order kept."""
    changed = dict(patched.files)
    unknown = sorted(set(changed) - set(target.spec.sources))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a declared source of target {target.name}")
    return SourceBundle(tuple((path, changed[path].encode("utf-8", "surrogateescape") if path in changed else content)
                              for path, content in target.bundle.files))


def variant_target(target: Target, proposal: Proposal) -> Target:
    """The target with the proposal's files, and its searched params added (first value: default)."""
    bundle = variant_bundle(target, proposal) if proposal.files else target.bundle
    params = dict(target.spec.params)
    defaults = dict(target.spec.defaults)
    for name, values in proposal.search_params.items():
        if name == "maxrregcount":
            continue  # a flag of the space, not a define
        params[name] = list(values)
        defaults.setdefault(name, values[0])
    spec = target.spec.model_copy(update={"params": params, "defaults": defaults})
    return dataclasses.replace(target, spec=spec, bundle=bundle)
