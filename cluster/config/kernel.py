"""A kernel target's spec (``kind: kernel``): one ``__global__`` function, its launch and its
arguments, measured in-process by the kernel runner (cluster/runners/kernel.py) instead of a
program of its own.

The vocabulary follows Kernel Tuner's ``tune_kernel``, so that a tuning script ports line for line:
``problem_size``, ``grid_div_x/y/z`` and ``block_size_names`` (or plain ``grid`` and ``block``
expressions), the target's ``params`` as ``tune_params`` and its ``constraints`` as
``restrictions``. Every expression sees the params and the named ``sizes``.

``KernelSpec.plan(params)`` resolves all of it for one configuration into a ``LaunchPlan``: the
kernel's name (template arguments substituted), grid, block, dynamic shared memory, the extra
defines and every argument's dtype, shape and initialisation. The plan travels inside the built
binary (cluster/compile/kernel.py), so a binary says how it is launched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from search_spaces import compile_expression

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64")
Dtype = Literal["float16", "float32", "float64", "int8", "int16", "int32", "int64",
                "uint8", "uint16", "uint32", "uint64"]
Expr = int | str  # a number, or an expression over the params and sizes
AXES = "xyz"
KT_BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")  # Kernel Tuner's defaults
KT_DEFAULT_BLOCK = (256, 1, 1)  # Kernel Tuner's block when a block_size_names param is not tuned
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelArgument(_Model):
    """One kernel argument (or ``__constant__`` symbol): a scalar with a ``value``, or an array
    with a ``shape`` (or a ``file``) filled by ``uniform`` (seeded: fresh values on every run, as
    ``wf::fill_uniform``), ``constant`` (default 0) or a ``.npy`` ``file`` among the target's files."""

    name: str = Field(pattern=_IDENT)
    dtype: Dtype = "float32"
    value: Expr | float | None = None  # a scalar argument
    shape: list[Expr] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None  # [lo, hi)
    constant: float | None = None
    file: str | None = None
    output: bool = False  # written to <name>.bin after the run and compared with the baseline's
    rtol: float | None = Field(None, ge=0)  # default: the target's verify.rtol
    atol: float | None = Field(None, ge=0)
    compare: Literal["values", "sum"] = "values"  # sum: the float64 total only (partial sums)

    @model_validator(mode="after")
    def _one_kind(self) -> KernelArgument:
        fills = [name for name in ("uniform", "constant", "file") if getattr(self, name) is not None]
        if self.value is not None:
            if self.shape is not None or fills:
                raise ValueError(f"{self.name}: a scalar has a value only (no shape, uniform, constant or file)")
            if self.output:
                raise ValueError(f"{self.name}: a scalar cannot be an output")
            return self
        if len(fills) > 1:
            raise ValueError(f"{self.name}: give one of uniform, constant and file")
        if self.shape is None and self.file is None:
            raise ValueError(f"{self.name}: give a value (a scalar), or a shape or a file (an array)")
        if self.uniform is not None:
            lo, hi = self.uniform
            if not self.dtype.startswith("float"):
                raise ValueError(f"{self.name}: uniform fills float arrays only, not {self.dtype}")
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"{self.name}: uniform needs finite lo < hi")
        if self.file is not None and not self.file.endswith(".npy"):
            raise ValueError(f"{self.name}: file must be a .npy file")
        if (self.rtol is not None or self.atol is not None or self.compare != "values") and not self.output:
            raise ValueError(f"{self.name}: rtol, atol and compare are for outputs")
        return self

    @property
    def is_scalar(self) -> bool:
        return self.value is not None

    @property
    def output_file(self) -> str:
        return f"{self.name}.bin"


class BenchOptions(_Model):
    """The timing loop's stopping rule, as the harness's ``wf::Options`` (HARNESS_API.md)."""

    min_samples: int = Field(10, ge=1)
    min_time_s: float = Field(0.5, ge=0)
    max_noise: float = Field(0.005, ge=0)
    max_samples: int = Field(1000, ge=1)
    max_time_s: float = Field(10.0, ge=0)
    warmup: int = Field(1, ge=0)
    flush_l2: bool = True


class KernelSpec(_Model):
    """What a kernel target launches; ``cluster.config.load`` checks its expressions against the
    target's params (``check_kernel``)."""

    name: str  # the __global__ function; a template: "matmul<TILE, float>" (params become their values)
    sizes: dict[str, int] = {}  # named integers every expression may use (n: 16777216)
    problem_size: list[Expr] | None = Field(None, min_length=1, max_length=3)
    grid_div_x: list[Expr] | None = None  # Kernel Tuner's: grid = ceil(problem_size / product(grid_div))
    grid_div_y: list[Expr] | None = None
    grid_div_z: list[Expr] | None = None
    grid: list[Expr] | None = Field(None, min_length=1, max_length=3)  # or the grid itself
    block_size_names: list[str] | None = Field(None, min_length=1, max_length=3)
    block: list[Expr] | None = Field(None, min_length=1, max_length=3)  # or the block itself
    shared_mem: Expr = 0  # dynamic shared memory per block, bytes
    arguments: list[KernelArgument] = Field(min_length=1)
    constants: list[KernelArgument] = []  # __constant__ symbols set before each run (cmem_args)
    compiler: Literal["auto", "nvrtc", "nvcc"] = "auto"  # auto: NVRTC where its library loads
    compiler_options: list[str] = []  # added to every candidate's (-std=c++17, -I...)
    # -Dblock_size_x=... and -Dgrid_size_x=... for each axis that is no param (Kernel Tuner's names)
    define_geometry: bool = True
    bench: BenchOptions = BenchOptions()

    @field_validator("name")
    @classmethod
    def _kernel_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_:]*(<.+>)?", value.strip()):
            raise ValueError(f"{value!r} is not a kernel name (name or name<template arguments>)")
        return value.strip()

    @field_validator("sizes")
    @classmethod
    def _size_names(cls, value: dict[str, int]) -> dict[str, int]:
        for name in value:
            if not re.fullmatch(_IDENT, name):
                raise ValueError(f"{name!r} is not a valid name")
        return value

    @model_validator(mode="after")
    def _geometry(self) -> KernelSpec:
        if (self.grid is None) == (self.problem_size is None):
            raise ValueError("give either problem_size (with grid_div_x/y/z) or grid")
        if self.grid is not None and any(d is not None for d in (self.grid_div_x, self.grid_div_y, self.grid_div_z)):
            raise ValueError("grid_div_x/y/z divide problem_size; with grid, give none")
        if self.block is not None and self.block_size_names is not None:
            raise ValueError("give either block or block_size_names")
        names = [a.name for a in (*self.arguments, *self.constants)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"argument {twice[0]!r} is named twice")
        for symbol in self.constants:
            if symbol.output:
                raise ValueError(f"constants: {symbol.name} cannot be an output")
        if not any(a.output for a in self.arguments):
            raise ValueError("no argument is an output (output: true): nothing to verify")
        return self

    @property
    def outputs(self) -> list[KernelArgument]:
        return [a for a in self.arguments if a.output]

    def expressions(self) -> list[tuple[str, Expr]]:
        """Every expression by the field it is in (``arguments[2].shape[0]``), to check them."""
        found: list[tuple[str, Expr]] = [("shared_mem", self.shared_mem)]
        for field in ("problem_size", "grid", "block", "grid_div_x", "grid_div_y", "grid_div_z"):
            found += [(f"{field}[{i}]", e) for i, e in enumerate(getattr(self, field) or [])]
        for group in ("arguments", "constants"):
            for i, arg in enumerate(getattr(self, group)):
                if isinstance(arg.value, int | str):
                    found.append((f"{group}[{i}].value", arg.value))
                found += [(f"{group}[{i}].shape[{j}]", e) for j, e in enumerate(arg.shape or [])]
        return found

    def plan(self, params: Mapping[str, Any]) -> LaunchPlan:
        """The launch of one configuration."""
        names = {**self.sizes, **params}
        block = self._block(params, names)
        grid = self._grid(params, names, block)
        defines: list[str] = []
        if self.define_geometry:
            for axis, b, g in zip(AXES, block, grid, strict=True):
                defines += [f"-D{n}={v}" for n, v in ((f"block_size_{axis}", b), (f"grid_size_{axis}", g))
                            if n not in params]
        return LaunchPlan(
            kernel=template_name(self.name, params), grid=grid, block=block,
            shared_mem=int(evaluate(self.shared_mem, names)), defines=tuple(defines),
            arguments=tuple(_resolve(a, names) for a in self.arguments),
            constants=tuple(_resolve(a, names) for a in self.constants))

    def _block(self, params: Mapping[str, Any], names: Mapping[str, Any]) -> tuple[int, int, int]:
        if self.block is not None:
            dims = [int(evaluate(e, names)) for e in self.block]
        else:
            kt_names = self.block_size_names or list(KT_BLOCK_NAMES)
            dims = [int(params.get(n, KT_DEFAULT_BLOCK[i])) for i, n in enumerate(kt_names)]
        return _three(dims)

    def _grid(self, params: Mapping[str, Any], names: Mapping[str, Any], block: tuple[int, int, int]
              ) -> tuple[int, int, int]:
        if self.grid is not None:
            return _three([int(evaluate(e, names)) for e in self.grid])
        kt_names = [*(self.block_size_names or KT_BLOCK_NAMES), *KT_BLOCK_NAMES][:3]
        dims = []
        for axis, extent in enumerate(self.problem_size or []):
            divisors = (self.grid_div_x, self.grid_div_y, self.grid_div_z)[axis]
            if divisors is None:  # Kernel Tuner's default: the axis's block size, if it is a param
                divisors = [kt_names[axis]] if kt_names[axis] in params else []
            divisor = math.prod(int(evaluate(d, names)) for d in divisors)
            dims.append(math.ceil(int(evaluate(extent, names)) / divisor))
        return _three(dims)


def _three(dims: list[int]) -> tuple[int, int, int]:
    x, y, z = [*dims, 1, 1, 1][:3]
    return x, y, z


def evaluate(expr: Expr | float, names: Mapping[str, Any]) -> Any:
    """A number as it is; an expression over ``names`` (params and sizes) evaluated."""
    if isinstance(expr, str):
        return compile_expression(expr, tuple(names))(names)
    return expr


def template_name(name: str, params: Mapping[str, Any]) -> str:
    """``matmul<TILE, float>`` with TILE=16 is ``matmul<16, float>``: params named in the template
    arguments become their values (Kernel Tuner does the same)."""
    head, bracket, rest = name.partition("<")
    if not bracket:
        return name
    for param in sorted(params, key=len, reverse=True):
        rest = re.sub(rf"\b{re.escape(param)}\b", str(params[param]), rest)
    return f"{head}<{rest}"


@dataclass(frozen=True)
class ResolvedArgument:
    """An argument of one configuration: everything the runner needs, in plain values."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None  # None: a scalar (or an array whose shape is its file's)
    value: float | int | None = None
    fill: Literal["uniform", "constant", "file", "scalar"] = "constant"
    lo: float = 0.0
    hi: float = 0.0
    constant: float = 0.0
    file: str | None = None
    output: bool = False
    compare: str = "values"

    @property
    def output_file(self) -> str:
        return f"{self.name}.bin"


def _resolve(arg: KernelArgument, names: Mapping[str, Any]) -> ResolvedArgument:
    if arg.is_scalar:
        assert arg.value is not None
        return ResolvedArgument(arg.name, arg.dtype, None, evaluate(arg.value, names), "scalar")
    shape = tuple(int(evaluate(e, names)) for e in arg.shape) if arg.shape is not None else None
    if arg.uniform is not None:
        return ResolvedArgument(arg.name, arg.dtype, shape, fill="uniform", lo=arg.uniform[0], hi=arg.uniform[1],
                                output=arg.output, compare=arg.compare)
    if arg.file is not None:
        return ResolvedArgument(arg.name, arg.dtype, shape, fill="file", file=arg.file, output=arg.output,
                                compare=arg.compare)
    return ResolvedArgument(arg.name, arg.dtype, shape, fill="constant", constant=arg.constant or 0.0,
                            output=arg.output, compare=arg.compare)


@dataclass(frozen=True)
class LaunchPlan:
    """One configuration's launch, as the kernel runner performs it."""

    kernel: str  # the name expression (template arguments substituted)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    defines: tuple[str, ...]  # added to the params' own -D defines
    arguments: tuple[ResolvedArgument, ...]
    constants: tuple[ResolvedArgument, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchPlan:
        def args(items: Any) -> tuple[ResolvedArgument, ...]:
            return tuple(ResolvedArgument(**{**a, "shape": tuple(a["shape"]) if a["shape"] is not None else None})
                         for a in items)

        return cls(data["kernel"], tuple(data["grid"]), tuple(data["block"]), int(data["shared_mem"]),
                   tuple(data["defines"]), args(data["arguments"]), args(data.get("constants", ())))


def check_kernel(spec: KernelSpec, params: Mapping[str, list[Any]], files: list[str]) -> tuple[str, str] | None:
    """The first problem with ``spec`` given the target's params and files, as (field, message):
    an expression with an unknown name or bad syntax, a ``.npy`` file that is not among the files,
    a param that is also a size, or a launch of the baseline that cannot be resolved."""
    clash = sorted(set(spec.sizes) & set(params))
    if clash:
        return f"kernel.sizes.{clash[0]}", "is also a param"
    known = (*spec.sizes, *params)
    for field, expr in spec.expressions():
        if isinstance(expr, str):
            try:
                compile_expression(expr, known)
            except ValueError as exc:
                return f"kernel.{field}", str(exc).replace("(params:", "(known:")
    for group in ("arguments", "constants"):
        for i, arg in enumerate(getattr(spec, group)):
            if arg.file is not None and arg.file not in files:
                return f"kernel.{group}[{i}].file", f"{arg.file} is not among the target's files"
    for name in spec.block_size_names or []:
        if name not in params:
            return "kernel.block_size_names", f"{name!r} is not a param"
    return None


def kernel_target_problem(spec: KernelSpec, params: Mapping[str, list[Any]], files: list[str],
                          baseline: Mapping[str, Any]) -> tuple[str, str] | None:
    """``check_kernel``, then the baseline's launch resolved and checked (``launch_problem``)."""
    if problem := check_kernel(spec, params, files):
        return problem
    try:
        plan = spec.plan(baseline)
    except (ValueError, ArithmeticError, TypeError) as exc:
        return "kernel", f"the baseline's launch cannot be resolved: {exc}"
    if problem_text := launch_problem(plan):
        return "kernel", f"the baseline's launch cannot run: {problem_text}"
    return None


def launch_problem(plan: LaunchPlan) -> str | None:
    """Why this launch cannot run, or None: a dimension below 1, a block over 1024 threads, an array
    with an extent below 1."""
    if min(*plan.grid, *plan.block) < 1:
        return f"grid {plan.grid} and block {plan.block} need every dimension >= 1"
    if math.prod(plan.block) > 1024:
        return f"block {plan.block} has {math.prod(plan.block)} threads, more than 1024"
    if plan.shared_mem < 0:
        return f"shared_mem is {plan.shared_mem} bytes"
    for arg in (*plan.arguments, *plan.constants):
        if arg.shape is not None and min(arg.shape) < 1:
            return f"argument {arg.name} has shape {arg.shape}"
    return None
