"""``launch`` and ``launch-json``: how to launch each tuned kernel (kernel targets).

The tuned params and flags say how to build a kernel; a kernel target's winner also says how it is
launched. ``launch`` is a C header per configuration: the block and dynamic shared memory as
values, the grid as a macro of the problem size with the tuned divisors in it (Kernel Tuner's
``ceil(problem_size / product(grid_div))``; a target that gives ``grid`` expressions gets their
value, with the expression beside it), and the flags and defines as comments. ``launch-json`` is
the same as records: the kernel's name (template arguments substituted), grid, block, shared
memory, the problem size, the params, the flags and every define the build used.

The launch is resolved from the run's targets (its config file, as ``meta.json`` names it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from cluster.config import Target
from cluster.config.kernel import AXES, KT_BLOCK_NAMES, KernelSpec, evaluate
from cluster.core.errors import ConfigError
from cluster.core.types import BestConfig
from cluster.outputs.exports._base import ExportError, ExportRequest
from cluster.store.rundir import RunDir


def _targets(request: ExportRequest) -> dict[str, Target]:
    from cluster.config import load_run

    try:
        meta = json.loads((request.run_dir / RunDir.META).read_text())
        return {t.name: t for t in load_run(meta["config_file"]).targets}
    except (OSError, ValueError, KeyError, ConfigError) as exc:
        raise ExportError(f"the run's targets cannot be loaded ({exc}): a launch needs the kernel targets") from None


def _kernel_configs(request: ExportRequest) -> list[tuple[BestConfig, KernelSpec]]:
    targets = _targets(request)
    found = []
    for config in sorted(request.best, key=lambda c: (c.target, c.arch, c.device_type)):
        target = targets.get(config.target)
        if target is not None and target.spec.kernel is not None:
            found.append((config, target.spec.kernel))
    if not found:
        raise ExportError("no kernel target among the selected configurations (launch is for kind: kernel)")
    return found


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _grid_formulas(kernel: KernelSpec, params: dict[str, Any]) -> list[tuple[str, int | None]]:
    """Per axis: (the divisor of the problem size, with the tuned values; or the grid expression, as
    given) and the divisor's value (None for a grid expression)."""
    if kernel.grid is not None:
        return [(str(e), None) for e in kernel.grid]
    names = [*(kernel.block_size_names or KT_BLOCK_NAMES), *KT_BLOCK_NAMES][:3]
    plan_names = {**kernel.sizes, **params}
    out = []
    for axis, _ in enumerate(kernel.problem_size or []):
        divisors = (kernel.grid_div_x, kernel.grid_div_y, kernel.grid_div_z)[axis]
        if divisors is None:
            divisors = [names[axis]] if names[axis] in params else []
        out.append((" * ".join(str(d) for d in divisors) or "1",
                    math.prod(int(evaluate(d, plan_names)) for d in divisors)))
    return out


def _record(config: BestConfig, kernel: KernelSpec) -> dict[str, Any]:
    params = {name: _plain(value) for name, value in config.params.items()}
    plan = kernel.plan(params)
    problem = [int(evaluate(e, {**kernel.sizes, **params})) for e in kernel.problem_size or []]
    formulas = _grid_formulas(kernel, params)
    return {
        "target": config.target, "device_type": config.device_type, "arch": config.arch,
        "kernel": plan.kernel, "grid": list(plan.grid), "block": list(plan.block), "shared_mem": plan.shared_mem,
        "problem_size": problem or None,
        "grid_formula": [f"ceil(problem_size[{i}] / ({text}))" if div is not None else text
                         for i, (text, div) in enumerate(formulas)],
        "grid_divisor": [div for _, div in formulas],
        "params": params, "flags": dict(config.flags), "flag_argv": config.flag_argv,
        "defines": [*config.defines, *plan.defines], "median": _plain(config.median), "unit": config.unit,
        "speedup": _plain(config.speedup), "candidate_key": config.candidate_key,
    }


def launch_json(request: ExportRequest) -> str:
    return json.dumps([_record(c, k) for c, k in _kernel_configs(request)], indent=2) + "\n"


def _macro(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def _header_block(record: dict[str, Any]) -> list[str]:
    prefix = f"WF_{_macro(record['target'])}_{_macro(record['arch'])}"
    lines = [f"// {record['target']} on {record['device_type']} ({record['arch']}): {record['kernel']}, "
             f"{record['median']:.6g} {record['unit']} ({record['speedup']:.3g}x the baseline)",
             f"// build: {' '.join([*record['flag_argv'], *record['defines']]) or '(no flags, no defines)'}"]
    for axis, value in zip(AXES, record["block"], strict=True):
        lines.append(f"#define {prefix}_BLOCK_{axis.upper()} {value}")
    for i, axis in enumerate(AXES):
        divisor = record["grid_divisor"][i] if i < len(record["grid_divisor"]) else None
        if divisor is not None:  # ceil(problem / divisor), the divisor's tuned value
            lines.append(f"#define {prefix}_GRID_{axis.upper()}(problem) (((problem) + {divisor} - 1) / {divisor})"
                         f"  // {record['grid_formula'][i]}; here {record['grid'][i]}")
        else:
            formula = record["grid_formula"][i] if i < len(record["grid_formula"]) else "1"
            lines.append(f"#define {prefix}_GRID_{axis.upper()} {record['grid'][i]}  // {formula}")
    lines.append(f"#define {prefix}_SHARED_MEM {record['shared_mem']}")
    return lines


def launch(request: ExportRequest) -> str:
    records = [_record(c, k) for c, k in _kernel_configs(request)]
    return _header(records)


def _header(records: Sequence[dict[str, Any]]) -> str:
    out = ["// Generated by `warpfleet export --format launch`: each tuned kernel's launch.",
           "// kernel<<<dim3(GRID_X(nx), GRID_Y(ny), GRID_Z(nz)), dim3(BLOCK_X, BLOCK_Y, BLOCK_Z), SHARED_MEM>>>(...)",
           "#pragma once", ""]
    for record in records:
        out += [*_header_block(record), ""]
    return "\n".join(out)
