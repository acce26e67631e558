"""``warpfleet kt-import SCRIPT.py``: a Kernel Tuner tuning script turned into a kernel target.

The script is run (it is the user's own, like a config) with a stand-in ``kernel_tuner`` package
whose ``tune_kernel`` records its arguments and stops the script at its first call. Those arguments
map onto a kernel target field by field:

    kernel_name, kernel_source   kernel.name (templates kept), sources (a source string is written to a file)
    problem_size, grid_div_x/y/z kernel.problem_size, kernel.grid_div_x/y/z
    block_size_names             kernel.block_size_names
    arguments, cmem_args         kernel.arguments, kernel.constants (named after the kernel's parameters)
    smem_args                    kernel.shared_mem
    tune_params, restrictions    params, constraints (restrictions must be expressions, not functions)
    answer, atol                 the outputs (answer's non-None entries), verify.atol
    compiler_options, defines    kernel.compiler_options

An array whose elements are all equal becomes a ``constant``; other float arrays become seeded
``uniform`` inputs over the script's range (fresh values on every run, warpfleet's way), or with
``inputs="npy"`` the script's very values in ``.npy`` files beside the target; integer arrays are
always kept as ``.npy`` files. Without an ``answer``, the arrays that start as all zeros are the
outputs. What cannot be carried over (a ``verify`` function, a callable anywhere) is a one-line
``KtImportError``; what is left out of the target (an ``objective`` other than time, ``metrics``,
``strategy``, ``observers``, ``iterations``, ...) is said, a note each (``not_carried_over``), on
the command line and at the top of the target file. A script that raises is a one-line error too.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import inspect
import itertools
import math
import os
import re
import runpy
import shutil
import sys
import traceback
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from search_spaces import compile_constraint


class KtImportError(ValueError):
    """Why a script cannot be converted (one line)."""


def _tune_kernel(kernel_name, kernel_source, problem_size, arguments, tune_params, grid_div_x=None,
                 grid_div_y=None, grid_div_z=None, restrictions=None, answer=None, atol=1e-6, verify=None,
                 verbose=False, lang=None, device=0, platform=0, smem_args=None, cmem_args=None, texmem_args=None,
                 compiler=None, compiler_options=None, defines=None, log=None, iterations=7, block_size_names=None,
                 quiet=False, strategy=None, strategy_options=None, cache=None, metrics=None, simulation_mode=None,
                 parallel=None, observers=None, objective=None, objective_higher_is_better=None, objectives=None,
                 seed=None) -> None:
    """Kernel Tuner 1.x's ``tune_kernel`` signature, to bind a recorded call's arguments by name."""


class _Called(Exception):
    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__("tune_kernel called")
        self.arguments = arguments


def _record(*args: Any, **kwargs: Any) -> None:
    bound = inspect.signature(_tune_kernel).bind(*args, **kwargs)
    bound.apply_defaults()
    raise _Called(dict(bound.arguments))


class _Stub(types.ModuleType):
    """Any ``kernel_tuner`` module: ``tune_kernel`` records, everything else does nothing."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _record if name == "tune_kernel" else (lambda *a, **k: None)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "kernel_tuner" or fullname.startswith("kernel_tuner."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def _stand_in(folder: Path) -> Iterator[None]:
    saved = {n: m for n, m in sys.modules.items() if n == "kernel_tuner" or n.startswith("kernel_tuner.")}
    for name in saved:
        del sys.modules[name]
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    cwd, argv = os.getcwd(), sys.argv
    try:
        os.chdir(folder)
        yield
    finally:
        os.chdir(cwd)
        sys.argv = argv
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n == "kernel_tuner" or n.startswith("kernel_tuner.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def capture(script: Path) -> dict[str, Any]:
    """The arguments of the script's first ``tune_kernel`` call, by name."""
    script = script.resolve()
    with _stand_in(script.parent):
        sys.argv = [str(script)]
        try:
            runpy.run_path(str(script), run_name="__main__")
        except _Called as called:
            return called.arguments
        except SystemExit:
            pass
        except Exception as exc:  # the script's own error, where in the script it happened
            lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(script)]
            where = f" at line {lines[-1]}" if lines else ""
            raise KtImportError(f"{script.name} raised {type(exc).__name__}{where}: {_first_line(exc)}") from None
    raise KtImportError(f"{script.name} never called tune_kernel (is it called under `if __name__ == '__main__'`?)")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


# -- the conversion ----------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _expressions(value: Any, what: str) -> list[Any] | None:
    if value is None:
        return None
    if callable(value):
        raise KtImportError(f"{what} is a Python function: write it as a list of expressions")
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        if callable(item) or not isinstance(_plain(item), int | str):
            raise KtImportError(f"{what}: {item!r} is neither a number nor an expression")
    return [_plain(i) for i in items]


def kernel_parameters(source: str, kernel: str) -> list[str]:
    """The parameter names of ``kernel`` in ``source`` (``c, a, b, n``), or [] if it cannot be found."""
    found = re.search(rf"\b{re.escape(kernel.partition('<')[0])}\s*\(([^)]*)\)\s*\{{", source)
    if not found:
        return []
    names = []
    for part in found.group(1).split(","):
        ident = re.findall(r"[A-Za-z_]\w*", part.split("=")[0])
        if ident:
            names.append(ident[-1])
    return names


def _argument(name: str, value: Any, inputs: str, folder: Path, files: list[str]) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        if value.dtype.name not in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                    "uint8", "uint16", "uint32", "uint64"):
            raise KtImportError(f"argument {name}: dtype {value.dtype} is not supported")
        flat = value.reshape(-1)
        entry: dict[str, Any] = {"name": name, "dtype": value.dtype.name, "shape": list(value.shape)}
        if flat.size and bool(np.all(flat == flat[0])):
            entry["constant"] = _plain(flat[0])
        elif value.dtype.kind == "f" and inputs == "uniform" and np.isfinite(flat).all():
            # the script's range, widened to three decimals (hi is open)
            entry["uniform"] = [math.floor(float(flat.min()) * 1000) / 1000,
                                (math.floor(float(flat.max()) * 1000) + 1) / 1000]
        else:
            file = f"{name}.npy"
            np.save(folder / file, value, allow_pickle=False)
            files.append(file)
            entry = {"name": name, "dtype": value.dtype.name, "shape": list(value.shape), "file": file}
        return entry
    value = _plain(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KtImportError(f"argument {name}: {type(value).__name__} is neither a NumPy array nor a number")
    return {"name": name, "dtype": "int32" if isinstance(value, int) else "float32", "value": value}


def _sources(kernel_source: Any, kernel_name: str, script_dir: Path, folder: Path) -> list[str]:
    items = kernel_source if isinstance(kernel_source, list | tuple) else [kernel_source]
    out = []
    for i, item in enumerate(items):
        if callable(item):
            raise KtImportError("kernel_source is a code generator (a function): give its text or a file")
        text = str(item)
        path = (script_dir / text) if len(text) < 4096 and "\n" not in text else None
        if path is not None and path.is_file():
            if path.resolve() != (folder / path.name).resolve():
                shutil.copyfile(path, folder / path.name)
            out.append(path.name)
        elif i == 0:
            name = f"{re.sub(r'[^A-Za-z0-9_]', '_', kernel_name.partition('<')[0])}.cu"
            (folder / name).write_text(text if text.endswith("\n") else text + "\n")
            out.append(name)
        else:
            raise KtImportError(f"kernel_source[{i}]: file not found: {text}")
    return out


def convert(call: dict[str, Any], script: Path, folder: Path, name: str | None = None, inputs: str = "uniform",
            outputs: Sequence[str] = (), params_only: bool = False) -> dict[str, Any]:
    """A target spec (a dict, as the YAML holds it) from a recorded ``tune_kernel`` call; writes the
    kernel source and any ``.npy`` inputs into ``folder``."""
    lang = call.get("lang")
    if lang not in (None, "CUDA", "cupy", "CuPy", "nvcuda", "NVCUDA"):
        raise KtImportError(f"lang {lang!r}: only CUDA kernels become kernel targets")
    for field in ("verify", "texmem_args"):
        if call.get(field) is not None:
            raise KtImportError(f"{field} cannot be carried over (a custom check or texture memory); "
                                f"remove it, or use answer with atol")
    folder.mkdir(parents=True, exist_ok=True)
    kernel_name = str(call["kernel_name"])
    sources = _sources(call["kernel_source"], kernel_name, script.parent, folder)
    parameters = kernel_parameters((folder / sources[0]).read_text(errors="replace"), kernel_name)
    files: list[str] = []
    arguments = []
    for i, value in enumerate(call["arguments"]):
        arg_name = parameters[i] if i < len(parameters) else f"arg{i}"
        arguments.append(_argument(arg_name, value, inputs, folder, files))
    constants = [_argument(str(k), v, inputs, folder, files) for k, v in (call.get("cmem_args") or {}).items()]
    _mark_outputs(arguments, call.get("answer"), outputs)
    tune_params = call["tune_params"] or {}
    params = {str(k): [_plain(v) for v in values] for k, values in tune_params.items()}
    constraints = _constraints(call.get("restrictions"), params)
    kernel: dict[str, Any] = {"name": kernel_name}
    problem = call["problem_size"]
    kernel["problem_size"] = _expressions(problem, "problem_size")
    for axis in "xyz":
        divisors = _expressions(call.get(f"grid_div_{axis}"), f"grid_div_{axis}")
        if divisors is not None:
            kernel[f"grid_div_{axis}"] = divisors
    if call.get("block_size_names"):
        kernel["block_size_names"] = [str(n) for n in call["block_size_names"]]
    smem = call.get("smem_args")
    if smem:
        size = smem.get("size") if isinstance(smem, dict) else None
        if size is None or callable(size):
            raise KtImportError("smem_args: give {'size': bytes or an expression}")
        kernel["shared_mem"] = _plain(size)
    options = [str(o) for o in call.get("compiler_options") or []
               if not str(o).startswith(("-arch", "--gpu-architecture"))]  # warpfleet sets the arch
    for key, value in (call.get("defines") or {}).items():
        if callable(value):
            raise KtImportError(f"defines.{key} is a Python function")
        options.append(f"-D{key}={value}")
    if options:
        kernel["compiler_options"] = options
    kernel["arguments"] = arguments
    if constants:
        kernel["constants"] = constants
    spec: dict[str, Any] = {"name": name or re.sub(r"[^A-Za-z0-9_.-]", "_", kernel_name.partition("<")[0]),
                            "kind": "kernel", "toolchain": "nvcc"}
    if params_only:
        (folder / "space.yaml").write_text(yaml.safe_dump({"name": "params_only", "toolchain": "nvcc",
                                                          "flags": {"none": [""]}}))
        spec["space"] = "space.yaml"
    spec["sources"] = sources
    if files:
        spec["files"] = files
    spec["kernel"] = kernel
    spec["verify"] = {"rtol": 1.0e-5, "atol": float(call.get("atol") or 1e-6)}  # numpy.allclose, as Kernel Tuner
    spec["params"] = params
    if constraints:
        spec["constraints"] = constraints
        spec["defaults"] = _first_valid(params, constraints)
    return spec


def _first_valid(params: dict[str, list[Any]], constraints: list[str]) -> dict[str, Any]:
    """The baseline: the first configuration, in the order of the values, that the restrictions allow."""
    checks = [compile_constraint(expr, params) for expr in constraints]
    for values in itertools.product(*params.values()):
        config = dict(zip(params, values, strict=True))
        if all(check(config) for check in checks):
            return config
    raise KtImportError("no configuration satisfies the restrictions")


def _mark_outputs(arguments: list[dict[str, Any]], answer: Any, named: Sequence[str]) -> None:
    if named:
        unknown = sorted(set(named) - {a["name"] for a in arguments})
        if unknown:
            raise KtImportError(f"--outputs: no argument named {unknown[0]!r}")
        chosen = set(named)
    elif answer is not None:
        if len(answer) != len(arguments):
            raise KtImportError(f"answer has {len(answer)} entries for {len(arguments)} arguments")
        chosen = {a["name"] for a, want in zip(arguments, answer, strict=True) if want is not None}
    else:
        chosen = {a["name"] for a in arguments if a.get("constant") == 0 and "shape" in a}
    for arg in arguments:
        if arg["name"] in chosen:
            if "value" in arg:
                raise KtImportError(f"argument {arg['name']} is a scalar: it cannot be an output")
            arg["output"] = True
    if not chosen:
        raise KtImportError("no output: the script gives no answer and no array starts as zeros (use --outputs)")


def _constraints(restrictions: Any, params: dict[str, list[Any]]) -> list[str]:
    if restrictions is None:
        return []
    if callable(restrictions):
        raise KtImportError("restrictions is a Python function: write it as a list of expressions")
    out = []
    for i, expr in enumerate(restrictions):
        if callable(expr):
            raise KtImportError(f"restrictions[{i}] is a Python function: write it as an expression")
        try:
            compile_constraint(str(expr), params)
        except ValueError as exc:
            raise KtImportError(f"restrictions[{i}]: {exc}") from None
        out.append(str(expr))
    return out


# Arguments of tune_kernel that no field of a target holds, and why: each one the script gives (other
# than its default) is a note. The rest of the unmapped ones only steer Kernel Tuner's own output.
_LEFT_OUT = {
    "objective": "warpfleet minimizes the kernel's time (a throughput of fixed work, GB/s or GFLOP/s, "
                 "is highest where the time is least); search.objective also offers energy",
    "objectives": "warpfleet minimizes the kernel's time, or with search.objective time_energy both",
    "objective_higher_is_better": "warpfleet minimizes the kernel's time",
    "metrics": "derived metrics are not computed; each row holds the time (and NVML energy on GPUs)",
    "strategy": "the search is the run config's search.sampler (tpe, random or grid)",
    "strategy_options": "the search is the run config's search (sampler, trials, time_budget_s)",
    "observers": "warpfleet's own NVML telemetry observes GPU runs (measure.search_telemetry)",
    "iterations": "each configuration is sampled by the harness's stopping rule (kernel.bench), not a fixed count",
    "cache": "Kernel Tuner's cache file is not read; a run's results stay in its run directory",
    "simulation_mode": "every configuration is compiled and measured",
    "parallel": "a Ray cluster runs the sweep (cluster: in the run config)",
    "compiler": "kernel.compiler picks NVRTC or nvcc",
    "device": "the GPUs are Ray's (cluster.gpu_types)",
    "platform": "the GPUs are Ray's (cluster.gpu_types)",
    "seed": "the inputs are seeded per run by warpfleet",
}


def not_carried_over(call: dict[str, Any]) -> list[str]:
    """A note per argument of the recorded call that the target does not carry, with what holds instead."""
    defaults = {name: p.default for name, p in inspect.signature(_tune_kernel).parameters.items()}
    notes = []
    for name, why in _LEFT_OUT.items():
        value = call.get(name)
        if value is None or (isinstance(value, int | str) and value == defaults[name]):
            continue
        shown = repr(value) if isinstance(value, int | float | str) else type(value).__name__
        if isinstance(value, dict):
            shown = "{" + ", ".join(map(str, value)) + "}"
        notes.append(f"{name}={shown} is not carried over: {why}")
    return notes


def uniform_notes(call: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """A note per array made ``uniform`` whose values the script drew otherwise (``np.random.randn``:
    most of them near the middle of their range), since the target draws evenly over that range."""
    kernel = spec["kernel"]
    pairs = [*zip(call["arguments"], kernel["arguments"], strict=False),
             *zip((call.get("cmem_args") or {}).values(), kernel.get("constants", []), strict=False)]
    notes = []
    for value, entry in pairs:
        if "uniform" not in entry or value.size < 16:  # a handful of values says nothing of a distribution
            continue
        lo, hi = entry["uniform"]
        flat = value.reshape(-1).astype(float)
        middle = float(np.mean(np.abs(flat - (lo + hi) / 2) <= (hi - lo) / 4))
        if not 0.35 <= middle <= 0.65:
            notes.append(f"{entry['name']}: the script's values are not spread evenly over their range "
                         f"({100 * middle:.0f}% in its middle half, where uniform values have 50%): the target "
                         f"draws fresh uniform: [{lo}, {hi}] values each run; --inputs npy keeps the script's")
    return notes


@dataclass(frozen=True)
class Imported:
    spec: dict[str, Any]  # the target, as written
    notes: list[str]  # what the script asked for that the target does not carry


def kt_import(script: Path, output: Path, name: str | None = None, inputs: str = "uniform",
              outputs: Sequence[str] = (), params_only: bool = False) -> Imported:
    """Convert ``script`` and write the target to ``output`` (its sources and inputs beside it)."""
    call = capture(script)
    spec = convert(call, script.resolve(), output.parent, name, inputs, outputs, params_only)
    notes = not_carried_over(call) + uniform_notes(call, spec)
    header = f"# Converted from {script.name} by `warpfleet kt-import` (README.md: \"A kernel target\").\n"
    header += "".join(f"# {note}\n" for note in notes)
    output.write_text(header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=110))
    return Imported(spec, notes)
