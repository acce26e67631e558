"""The register expert: when registers cap a kernel's occupancy, propose the ``-maxrregcount``
values at which theoretical occupancy rises, for the sweep to measure (capping trades spills for
warps; only a measurement says which wins).

    ptxas report (registers, shared) + launch block size ─► occupancy now ─► register_steps ─► Proposal
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping

from agents._base import Agent, AnalysisContext, Proposal
from agents.cuda_source import SourceModel, analyze
from agents.patch import source_files
from cluster.occupancy import DeviceLimits, Occupancy, limits_for, occupancy_of_kernel, register_steps
from cluster.types import KernelResources

DEFAULT_BLOCK_SIZE = 256
# ptxas does not go below this many registers per thread on sm_80/sm_90, whatever -maxrregcount asks.
MIN_REGISTERS = 24


class RegisterExpert(Agent):
    """Proposes ``search_params={"maxrregcount": (...)}`` for register-limited kernels; no file changes."""

    name = "registers"

    def __init__(self, limits: DeviceLimits | None = None, min_registers: int = MIN_REGISTERS) -> None:
        self.limits = limits  # None: the limits of the context's arch
        self.min_registers = min_registers

    def propose(self, context: AnalysisContext) -> list[Proposal]:
        try:
            limits = self.limits or limits_for(context.arch)
        except KeyError:
            return []
        models = [analyze(text, path) for path, text in source_files(context.target).items()]
        values: set[int] = set()
        evidence: list[str] = []
        for kernel in context.kernels:
            if kernel.registers <= 0:
                continue
            block = block_size(kernel.kernel, models, context.metrics)
            now = occupancy_of_kernel(limits, kernel, block)
            if now.limiting_factor != "registers":
                continue
            steps = [step for step in register_steps(limits, block, kernel.shared_bytes)
                     if step.occupancy.active_blocks_per_sm > now.active_blocks_per_sm
                     and self.min_registers <= step.registers < kernel.registers]
            if steps:
                values.update(step.registers for step in steps)
                evidence.append(_evidence(kernel, block, now, [(s.registers, s.occupancy) for s in steps]))
        if not values:
            return []
        return [Proposal(self.name, "; ".join(evidence), (), {"maxrregcount": tuple(sorted(values, reverse=True))})]


def _evidence(kernel: KernelResources, block: int, now: Occupancy, steps: list[tuple[int, Occupancy]]) -> str:
    levels = ", ".join(f"{registers} -> {occ.percent:.0f}% ({occ.active_warps_per_sm} warps)"
                       for registers, occ in steps)
    limits = ", ".join(f"{name} {blocks}" for name, blocks in now.block_limits.items())
    return (f"{kernel.kernel}: {kernel.registers} registers per thread, {block} threads per block: occupancy "
            f"{now.percent:.0f}% ({now.active_warps_per_sm} of {now.max_warps_per_sm} warps), limiting factor "
            f"registers (blocks per SM allowed by {limits}); -maxrregcount {levels}")


def block_size(kernel: str, models: list[SourceModel], metrics: Mapping[str, float]) -> int:
    """Threads per block of ``kernel``'s first launch whose block expression evaluates with the
    file's constants; else ``metrics["block_size"]``; else the default."""
    for model in models:
        for launch in model.launches:
            if _names_kernel(kernel, launch.kernel):
                value = evaluate(launch.block, model.constants)
                if value is not None and value > 0:
                    return value
    return int(metrics.get("block_size", DEFAULT_BLOCK_SIZE))


def _names_kernel(reported: str, name: str) -> bool:
    """Whether ptxas's (mangled, or extern "C") name ``reported`` is the kernel ``name``."""
    return reported == name or re.search(rf"(?:^_Z|\d){len(name)}{re.escape(name)}(?:I|E|[A-Za-z]|$)",
                                         reported) is not None


_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}


def evaluate(expression: str, constants: Mapping[str, int]) -> int | None:
    """An integer block expression (``kBlock``, ``16 * 16``, ``dim3(32, 8)``) with names from
    ``constants``; None when it is not one."""
    try:
        return _eval(ast.parse(expression.strip(), mode="eval").body, constants)
    except (SyntaxError, ZeroDivisionError, ValueError):
        return None


def _eval(node: ast.expr, constants: Mapping[str, int]) -> int | None:
    match node:
        case ast.Constant(value=int() as value):
            return value
        case ast.Name(id=name):
            return constants.get(name)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in _BINARY:
            a, b = _eval(left, constants), _eval(right, constants)
            return None if a is None or b is None else _BINARY[type(op)](a, b)
        case ast.Call(func=ast.Name(id="dim3"), args=args) if 1 <= len(args) <= 3:
            product = 1
            for arg in args:
                value = _eval(arg, constants)
                if value is None:
                    return None
                product *= value
            return product
    return None
