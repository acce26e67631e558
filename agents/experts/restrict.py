"""The read-only-pointer expert: a kernel's pointer parameter that the kernel never writes, and
that no launch hands memory the kernel writes through another parameter, becomes
`const T* __restrict__`. The compiler may then keep its loads in registers across stores and
route them through the read-only data path (LDG.CONSTANT).

    kernel effects (agents.cuda_source: written, read, handed to calls) ─► read-only candidates
        ─► every launch of the kernel (agents.launch_sites): its argument vs. each written one
        ─► what would not compile with a const pointee (a non-const alias or cast of it)
        ─► the parameter declarations rewritten through agents.patch

Evidence from the profile, when there is one: global load sectors per request, the L1/tex hit
rate and the load throughput; a profile with no global loads says there is nothing to gain. A
kernel launched nowhere in the file, declared twice, or whose pointers may alias is left alone,
with the reason.
"""

from __future__ import annotations

from agents import _ts
from agents._base import AnalysisContext, Proposal
from agents._ts import Node
from agents.experts._expert import Change, Expert, kernel_node, line_edits, source_models
from agents.launch_sites import LaunchSite, launch_sites, written_alias
from agents.patch import Patched, apply, source_files
from agents.source_model import Kernel, SourceModel, read_params, written_params
from agents.workflow.steps import Finding, Level, Plan

LOAD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
LOAD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
L1_HIT_RATE = "l1tex__t_sector_hit_rate.pct"
LOAD_THROUGHPUT = "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second"


class RestrictExpert(Expert):
    """One proposal per kernel: all its provably read-only, unaliased pointers at once."""

    name = "restrict"
    level = Level.KERNEL

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        evidence = profile_evidence(context.metrics)
        findings = []
        for path, model in source_models(context).items():
            sites = launch_sites(model)
            for kernel in model.kernels:
                where = f"{path}:{kernel.span.start_line} {kernel.name}"
                verdict = read_only(model, kernel, sites)
                if isinstance(verdict, str):
                    findings.append(Finding(self.name, self.level, where, False, evidence, verdict))
                elif context.metrics.get(LOAD_REQUESTS) == 0:
                    findings.append(Finding(self.name, self.level, where, False, evidence,
                                            f"{LOAD_REQUESTS} = 0: the profile shows no global loads to speed up"))
                else:
                    eligible, notes = verdict
                    reason = (f"{', '.join(eligible)} of {kernel.name}: never written, and no launch hands them memory "
                              f"the kernel writes: const __restrict__" + (f" ({'; '.join(notes)})" if notes else ""))
                    findings.append(Finding(self.name, self.level, where, True, evidence, reason,
                                            (path, kernel, tuple(eligible)), kernel=kernel.name))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        _, kernel, eligible = finding.detail
        return Plan(finding, (f"declare {', '.join(eligible)} of {kernel.name} (line {kernel.span.start_line}) "
                              "as const T* __restrict__",), detail=finding.detail)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        path, kernel, eligible = plan.detail
        files = source_files(context.target)
        source = files[path].encode("utf-8", "surrogateescape")
        model = source_models(context)[path]
        changes = [change for node in _ts.parameters(kernel_node(model, kernel))
                   if (param := _ts.declared_name(node.child_by_field_name("declarator"))) in eligible
                   for change in _restricted(node, kernel.param(param).is_const_pointee,
                                             kernel.param(param).is_restrict)]
        patched = apply(files, line_edits(path, source, changes), context.target.spec.sources)
        if not isinstance(patched, Patched):
            return []
        return [Proposal(self.name, f"{plan.finding.reason}\n{patched.diff}", patched.files)]


def profile_evidence(metrics: dict[str, float]) -> tuple[str, ...]:
    if LOAD_REQUESTS not in metrics:
        return ("no profile: decided from the source alone",)
    out = []
    if metrics.get(LOAD_REQUESTS):
        out.append(f"{metrics.get(LOAD_SECTORS, 0) / metrics[LOAD_REQUESTS]:.1f} sectors per global load request")
    if L1_HIT_RATE in metrics:
        out.append(f"L1/tex hit rate {metrics[L1_HIT_RATE]:.1f}% ({L1_HIT_RATE})")
    if LOAD_THROUGHPUT in metrics:
        out.append(f"global load throughput {metrics[LOAD_THROUGHPUT] / 1e9:.1f} GB/s")
    return tuple(out)


def read_only(model: SourceModel, kernel: Kernel, sites: list[LaunchSite]) -> tuple[list[str], list[str]] | str:
    """The parameters to make `const __restrict__` (with notes on those left out), or why none."""
    pointers = [p for p in kernel.params if p.is_pointer and not (p.is_const_pointee and p.is_restrict)]
    if not pointers:
        return "no pointer parameter that is not const __restrict__ already"
    written, read = written_params(kernel), read_params(kernel)
    candidates = [p.name for p in pointers if p.name not in written and p.name in read]
    if not candidates:
        names = [p.name for p in pointers]
        return (f"{', '.join(names)}, not const __restrict__ yet, {'is' if len(names) == 1 else 'are'} written "
                "(or never read)")
    again = _declarations(model, kernel)
    if again:
        return f"declared again at line {again[0]}: the declarations would disagree"
    mine = [s for s in sites if s.launch.kernel == kernel.name]
    if not mine:
        return "launched nowhere in this file: whether its arguments alias is unknown"
    node = kernel_node(model, kernel)
    eligible, notes = [], []
    for name in candidates:
        why = _aliased(kernel, name, mine) or _not_const(node, name)
        (notes.append(f"{name}: {why}") if why else eligible.append(name))
    return (eligible, notes) if eligible else "; ".join(notes)


def _aliased(kernel: Kernel, name: str, sites: list[LaunchSite]) -> str | None:
    found = written_alias(kernel, name, sites)
    return f"{found[0]} (line {found[1]})" if found else None


def _not_const(kernel: Node, name: str) -> str | None:
    """A use of parameter `name` that a const pointee would not compile: a non-const pointer
    local initialised from it, or a cast of it to a non-const pointer."""
    for node in _ts.walk(kernel.child_by_field_name("body") or kernel):
        if node.type == "declaration" and not any(_ts.text(c) == "const" for c in node.children):
            for declarator in node.children_by_field_name("declarator"):
                value = declarator.child_by_field_name("value")
                pointer = any(n.type == "pointer_declarator" for n in _ts.walk(declarator))
                if pointer and value is not None and name in {_ts.text(p) for p in _ts.pointer_names(value)}:
                    return f"line {node.start_point[0] + 1} keeps it in a non-const pointer"
        target = _cast_type(node)
        if target is not None and "*" in target and "const" not in target \
                and name in {_ts.text(p) for p in _ts.pointer_names(node)}:
            return f"line {node.start_point[0] + 1} casts it to a non-const pointer"
    return None


def _cast_type(node: Node) -> str | None:
    """The type a cast converts to: `(float4*)p`, `reinterpret_cast<float4*>(p)`; None for others."""
    if node.type == "cast_expression":
        return _ts.text(node.child_by_field_name("type") or node)
    function = node.child_by_field_name("function") if node.type == "call_expression" else None
    if function is not None and function.type == "template_function" and _ts.callee_name(node).endswith("_cast"):
        return _ts.text(function.child_by_field_name("arguments") or function)
    return None


def _declarations(model: SourceModel, kernel: Kernel) -> list[int]:
    """Lines of other declarations (prototypes) of the kernel in the file."""
    return [n.start_point[0] + 1 for n in _ts.walk(model.root) if n.type == "declaration"
            and any(d.type == "function_declarator" and _ts.declared_name(d) == kernel.name
                    for d in _ts.walk(n) if d.type == "function_declarator")]


def _restricted(param: Node, const: bool, restrict: bool) -> list[Change]:
    """`float* x` -> `const float* __restrict__ x`: `const` before the type, `__restrict__`
    before the name."""
    changes = [] if const else [Change(param.start_byte, param.start_byte, "const ")]
    name = _ts.name_node(param.child_by_field_name("declarator"))
    if not restrict and name is not None:
        changes.append(Change(name.start_byte, name.start_byte, "__restrict__ "))
    return changes
