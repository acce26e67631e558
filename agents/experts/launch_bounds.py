"""The launch-bounds expert: the per-kernel alternative to `-maxrregcount`. When registers cap a
kernel's occupancy, `__launch_bounds__(threads, minimum blocks)` tells ptxas to fit that many
blocks of that many threads on an SM, which caps this kernel's registers only (a -maxrregcount
caps every kernel of the file alike).

    ptxas report (registers, shared) + the launches' block size ─► occupancy now ─► register_steps
        ─► the resident warps per SM at each step ─► `__launch_bounds__(B, warps * 32 / B)`, the
           warps searched through WF_LB_WARPS_<kernel> (a -D param, as the sweep passes it)

The bound's first argument must hold every launch: the block size as a constant, the params' macros
it follows (`BLOCK`; `(BX) * (BY)` for `dim3(BX, BY)`, given in place or as a local `dim3 block(BX,
BY)` that nothing changes: agents.launch_sites), or the template parameter every instance is
launched with. The minimum blocks come from a number of warps, so that they stay right when a
searched param changes the block size. A kernel that declares launch bounds already, or whose
block size the analysis cannot tell, is left alone, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agents._base import AnalysisContext, Proposal
from agents._ts import split_top
from agents.experts._expert import Change, Expert, kernel_node, line_edits, source_models
from agents.experts.registers import ACHIEVED_OCCUPANCY, MIN_REGISTERS, names_kernel
from agents.launch_sites import LaunchSite, instance_of, launch_sites
from agents.patch import InsertBefore, Patched, apply, source_files
from agents.source_model import Kernel, SourceModel
from agents.workflow.steps import Finding, Level, Plan
from cluster.core.encodings import LAUNCH_BOUNDS_PARAM
from cluster.core.occupancy import DeviceLimits, limits_for, occupancy, register_steps


class LaunchBoundsExpert(Expert):
    """One proposal per register-limited kernel: its launch bounds, the resident warps searched."""

    name = "launch_bounds"
    level = Level.COMPILER_HINT

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        try:
            limits = limits_for(context.arch)
        except KeyError:
            why = f"no occupancy model for {context.arch}"
            return [Finding(self.name, self.level, context.arch, False, reason=why)]
        findings = []
        for path, model in source_models(context).items():
            sites = launch_sites(model)
            for kernel in model.kernels:
                findings.append(self.kernel(context, limits, path, model, kernel, sites))
        return findings

    def kernel(self, context: AnalysisContext, limits: DeviceLimits, path: str, model: SourceModel, kernel: Kernel,
               sites: list[LaunchSite]) -> Finding:
        where = f"{path}:{kernel.span.start_line} {kernel.name}"

        def not_applicable(reason: str, evidence: tuple[str, ...] = ()) -> Finding:
            return Finding(self.name, self.level, where, False, evidence, reason)

        if kernel.launch_bounds is not None:
            return not_applicable(f"declares __launch_bounds__({kernel.launch_bounds.max_threads}) already")
        reports = [k for k in context.kernels if names_kernel(k.kernel, kernel.name)]
        if not reports:
            return not_applicable("no ptxas report of it (the baseline's build gives one)")
        mine = [s for s in sites if s.launch.kernel == kernel.name]
        bound = max_threads(model, kernel, mine, set(context.target.spec.params))
        if isinstance(bound, str):
            return not_applicable(bound)
        text, threads = bound
        registers = max(r.registers for r in reports)
        shared = max(r.shared_bytes for r in reports)
        now = occupancy(limits, threads, registers, shared)
        evidence = [f"ptxas: {registers} registers, {shared} B shared; {threads} threads per block",
                    f"theoretical occupancy {now.percent:.0f}%, limited by {now.limiting_factor}"]
        if (achieved := context.metrics.get(ACHIEVED_OCCUPANCY)) is not None:
            evidence.append(f"achieved occupancy {achieved:.1f}% ({ACHIEVED_OCCUPANCY})")
        if now.limiting_factor != "registers":
            return not_applicable(f"occupancy is limited by {now.limiting_factor}, not registers", tuple(evidence))
        warps = sorted({step.occupancy.active_warps_per_sm for step in register_steps(limits, threads, shared)
                        if step.occupancy.active_blocks_per_sm > now.active_blocks_per_sm
                        and MIN_REGISTERS <= step.registers < registers})
        if not warps:
            return not_applicable(f"no register count >= {MIN_REGISTERS} raises occupancy", tuple(evidence))
        levels = ", ".join(f"{w} warps ({w * 32 // threads} blocks)" for w in warps)
        reason = (f"{kernel.name}: {registers} registers per thread hold occupancy at {now.percent:.0f}% "
                  f"({now.active_warps_per_sm} of {now.max_warps_per_sm} warps); __launch_bounds__({text}, ...) "
                  f"for {levels} caps this kernel's registers alone")
        return Finding(self.name, self.level, where, True, tuple(evidence), reason, (path, kernel, text, tuple(warps)),
                       kernel=kernel.name)

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        _, kernel, text, warps = finding.detail
        macro = LAUNCH_BOUNDS_PARAM.format(kernel=kernel.name)
        return Plan(finding, (f"declare {kernel.name} (line {kernel.span.start_line}) __launch_bounds__({text}, "
                              f"{macro} * 32 / ({text})), and {macro} with the first value above it",),
                    ((macro, warps),), finding.detail)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        path, kernel, text, warps = plan.detail
        files = source_files(context.target)
        source = files[path].encode("utf-8", "surrogateescape")
        model = source_models(context)[path]
        name = kernel_node(model, kernel).child_by_field_name("declarator")
        while name is not None and name.type != "identifier":
            name = name.child_by_field_name("declarator")
        if name is None:
            return []
        macro = LAUNCH_BOUNDS_PARAM.format(kernel=kernel.name)
        blocks = f"({macro} * 32 / ({text}) > 1 ? {macro} * 32 / ({text}) : 1)"
        prelude = f"#ifndef {macro}\n#define {macro} {warps[0]}\n#endif\n"
        edits = [InsertBefore(path, kernel.span.start_line, prelude),
                 *line_edits(path, source, [Change(name.start_byte, name.start_byte,
                                                   f"__launch_bounds__({text}, {blocks}) ")])]
        patched = apply(files, edits, context.target.spec.sources)
        if not isinstance(patched, Patched):
            return []
        return [Proposal(self.name, f"{plan.finding.reason}; {macro} searched over {warps}\n{patched.diff}",
                         patched.files, {macro: warps})]


def max_threads(model: SourceModel, kernel: Kernel, sites: list[LaunchSite],
                params: set[str]) -> tuple[str, int] | str:
    """The bound's first argument (as the kernel can write it) and the block size at the
    baseline, or why there is none."""
    if not sites:
        return "launched nowhere in this file: its block size is unknown"
    sizes = [(site, site.threads(model)) for site in sites]
    unknown = next((site for site, threads in sizes if threads is None), None)
    if unknown is not None:
        block, variable = unknown.launch.block, unknown.block_variable
        shown = f"`{variable}` = `{block}`" if variable and variable != block else f"`{block}`"
        return (f"the block size {shown} (line {unknown.launch.line}) is not a compile-time constant"
                + (f": {unknown.changed}" if unknown.changed else ""))
    values = {threads for _, threads in sizes}
    first = sizes[0][1] or 0
    texts = {site.launch.block.strip() for site in sites}
    names = {n for t in texts for n in re.findall(r"[A-Za-z_]\w*", t)} - {"dim3"}
    followed = params_followed(names, model.macros, params)
    if len(values) == 1 and not followed:
        return str(first), first
    if len(texts) == 1 and names and names <= set(model.macros):  # follows the params' macros
        text = texts.pop()
        inner = re.fullmatch(r"dim3\s*\((.*)\)", text)
        return (" * ".join(f"({part})" for part in split_top(inner.group(1))) if inner else text), first
    for param in (p.name for p in kernel.template_params if p.kind == "value"):
        if all(dict(k.template_values).get(param) == threads for site, threads in sizes
               if (k := instance_of(model, site.launch)) is not None):
            return param, first
    return f"launched with block sizes {sorted(values)}" + (f" that follow {', '.join(sorted(followed))}"
                                                             if followed else "")


def params_followed(names: set[str], macros: Mapping[str, str], params: set[str]) -> set[str]:
    """The params that `names` are or expand to through the file's macros (`BLOCK_SIZE` defined
    as `WG_SIZE`, a param, follows it): a bound written as a number would not."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += re.findall(r"[A-Za-z_]\w*", macros.get(name, ""))
    return seen & params
