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

from agents._base import AnalysisContext, Proposal
from agents.experts._expert import Expert, source_models
from agents.source_model import SourceModel
from agents.workflow.steps import Finding, Level, Plan
from cluster.core.occupancy import DeviceLimits, Occupancy, limits_for, occupancy_of_kernel, register_steps
from cluster.core.types import KernelResources

DEFAULT_BLOCK_SIZE = 256
# ptxas does not go below this many registers per thread on sm_80/sm_90, whatever -maxrregcount asks.
MIN_REGISTERS = 24
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"


class RegisterExpert(Expert):
    """Proposes ``search_params={"maxrregcount": (...)}`` for register-limited kernels; no file changes."""

    name = "registers"
    level = Level.COMPILER_OPTION

    def __init__(self, limits: DeviceLimits | None = None, min_registers: int = MIN_REGISTERS) -> None:
        self.limits = limits  # None: the limits of the context's arch
        self.min_registers = min_registers

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        try:
            limits = self.limits or limits_for(context.arch)
        except KeyError:
            why = f"no occupancy model for {context.arch}"
            return [Finding(self.name, self.level, context.arch, False, reason=why)]
        models = list(source_models(context).values())
        findings = []
        achieved = context.metrics.get(ACHIEVED_OCCUPANCY)
        for kernel in context.kernels:
            if kernel.registers <= 0:
                continue
            block = block_size(kernel.kernel, models, context.metrics)
            now = occupancy_of_kernel(limits, kernel, block)
            evidence = [f"ptxas: {kernel.registers} registers, {kernel.spill_stores} B spill stores, "
                        f"{kernel.shared_bytes} B shared; {block} threads per block",
                        f"theoretical occupancy {now.percent:.0f}%, limited by {now.limiting_factor}"]
            if achieved is not None:
                evidence.append(f"achieved occupancy {achieved:.1f}% ({ACHIEVED_OCCUPANCY})")
            if now.limiting_factor != "registers":
                findings.append(Finding(self.name, self.level, kernel.kernel, False, tuple(evidence),
                                        f"occupancy is limited by {now.limiting_factor}, not registers"))
                continue
            steps = [step for step in register_steps(limits, block, kernel.shared_bytes)
                     if step.occupancy.active_blocks_per_sm > now.active_blocks_per_sm
                     and self.min_registers <= step.registers < kernel.registers]
            if not steps:
                findings.append(Finding(self.name, self.level, kernel.kernel, False, tuple(evidence),
                                        f"no register cap >= {self.min_registers} raises occupancy"))
                continue
            values = tuple(sorted({step.registers for step in steps}, reverse=True))
            reason = _evidence(kernel, block, now, [(s.registers, s.occupancy) for s in steps])
            findings.append(Finding(self.name, self.level, kernel.kernel, True, tuple(evidence), reason, values))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        values = tuple(finding.detail or ())
        if not values:
            return None
        return Plan(finding, (f"search -maxrregcount over {', '.join(map(str, values))} for {finding.location}",),
                    (("maxrregcount", values),))

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        return [Proposal(self.name, plan.finding.reason, (), dict(plan.search))]


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
            if names_kernel(kernel, launch.kernel):
                value = evaluate(launch.block, model.constants)
                if value is not None and value > 0:
                    return value
    return int(metrics.get("block_size", DEFAULT_BLOCK_SIZE))


def names_kernel(reported: str, name: str) -> bool:
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
