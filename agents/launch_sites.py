"""Every kernel launch of a file as it runs: reached from the file's entry functions (those no
other function of the file calls) through agents.hostflow, so that a helper's launch has its
caller's arguments, and with the kernel instance it launches. What the kernel-level experts read
to know a kernel's block sizes and which of its arguments may share memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents import _ts
from agents._ts import split_top
from agents.hostflow import unfold
from agents.regions import overlap, region
from agents.source_model import HostOpKind, Kernel, Launch, SourceModel


@dataclass(frozen=True)
class LaunchSite:
    launch: Launch  # arguments, grid and block with the names bound where it runs
    function: str  # the entry function it was reached from
    unknown: frozenset[str]  # that function's parameters: buffers the file does not say the origin of
    conditional: bool

    def regions(self, kernel: Kernel) -> dict[str, str]:
        """Each pointer parameter of `kernel` -> the region its argument designates."""
        bound = self.launch.bound_args(kernel)
        extents = [bound[p.name] for p in kernel.params if not p.is_pointer and p.name in bound]
        return {p.name: r for p in kernel.params if p.is_pointer and (r := region(bound.get(p.name), extents))}

    def threads(self, model: SourceModel) -> int | None:
        """Threads per block, when the launch's block is a constant (`256`, `dim3(16, 16)`)."""
        env = _ts.ConstEnv({**model.macros, **{k: str(v) for k, v in model.constants.items()}})
        text = self.launch.block.strip()
        inner = re.fullmatch(r"dim3\s*\((.*)\)", text)
        product = 1
        for part in split_top(inner.group(1)) if inner else [text]:
            value = env.eval_text(part) if part else None
            if value is None or value <= 0:
                return None
            product *= value
        return product

    def may_alias(self, a: str, b: str) -> bool:
        """Whether two regions of this launch may share memory: they overlap, or both come from
        the entry function's parameters (its caller may hand it one buffer twice)."""
        base_a, base_b = a.split("[", 1)[0], b.split("[", 1)[0]
        return overlap(a, b) or (base_a in self.unknown and base_b in self.unknown)


def entry_functions(model: SourceModel) -> list[str]:
    """Functions doing CUDA work that no other function of the file calls (all of them, when
    they call each other in a circle)."""
    working = list(dict.fromkeys(op.function for op in model.host_ops
                                 if op.function and op.kind in (HostOpKind.LAUNCH, HostOpKind.CALL)))
    called = {op.api for op in model.host_ops if op.kind is HostOpKind.CALL and op.function != op.api}
    return [f for f in working if f not in called] or working


def launch_sites(model: SourceModel) -> list[LaunchSite]:
    sites = []
    for function in entry_functions(model):
        unknown = frozenset(_parameters(model, function))
        sites += [LaunchSite(step.op.launch, function, unknown, step.conditional) for step in unfold(model, function)
                  if step.op.launch is not None]
    return sites


def _parameters(model: SourceModel, function: str) -> list[str]:
    fn = next((n for n in _ts.walk(model.root) if n.type == "function_definition"
               and _ts.declared_name(n.child_by_field_name("declarator")) == function), None)
    plist = next((n for n in _ts.walk(fn.child_by_field_name("declarator")) if n.type == "parameter_list"),
                 None) if fn is not None else None
    return [_ts.declared_name(p.child_by_field_name("declarator")) for p in (plist.named_children if plist else ())
            if p.type.endswith("parameter_declaration")]


def instance_of(model: SourceModel, launch: Launch) -> Kernel | None:
    """The instance of the launched kernel that the launch's template arguments select."""
    instances = [k for k in model.instances if k.name == launch.kernel]
    for kernel in instances:
        bound = dict(kernel.template_values)
        given = zip(kernel.template_params, launch.template_values, strict=False)
        if all(value is None or bound.get(param.name) == value for param, value in given):
            return kernel
    return instances[0] if instances else None
