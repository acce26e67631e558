"""The streamify expert: independent kernel launches of a host function spread over non-blocking
streams, with an event for every dependency that crosses streams, forked from and joined back to
the stream they were on. Every proposal is verified before it is made: the patched source is
re-analysed and `agents.depgraph.check` must find every dependency of the function still ordered.

    host function ─► agents.hostflow.unfold (helpers followed, counted loops unfolded)
        ─► agents.depgraph (hazards between regions: whole buffers, slots `base + C * n`)
        ─► streamify_regions: regions of tasks (launch statements, helper calls taking the stream,
           iterations of counted loops; a loop of unknown count on its own as a pool), or why not
        ─► plan_streams (greedy: a chain stays on its producer's stream; events across streams)
        ─► streamify_rewrite (setup, fork, tasks, join) ─► agents.patch.apply
        ─► re-analyse ─► depgraph.check ─► Proposal (only when ok)

Applies to launches on the legacy default stream or on one explicit stream, separated by host
code that does not hand device memory to code the analysis cannot see; everything else is a
finding that does not apply, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.depgraph import CheckResult, KernelGraph, check, extract
from agents.experts._expert import Expert, defines, line_edits
from agents.experts._streams import POOL_STREAMS, Plan, Region, plan_streams
from agents.experts.streamify_regions import analyse as analyse_regions
from agents.experts.streamify_regions import pool_problem, task_edges
from agents.experts.streamify_rewrite import Rewrite
from agents.patch import Refused, apply, source_files
from agents.source_model import HostOpKind, SourceModel
from agents.workflow import steps as wf

Sabotage = Callable[[Plan], Plan]  # for tests: a deliberately wrong plan the check must reject


@dataclass(frozen=True)
class Finding:
    """What the expert concluded for one region of a host function (or the function, when it has
    none): a verified proposal, or why not."""

    path: str
    function: str
    reason: str  # why not applicable, or the proposal's summary
    proposal: Proposal | None = None
    plan: Plan | None = None
    check: CheckResult | None = field(default=None, compare=False)
    line: int = 0  # the region's first line

    @property
    def applicable(self) -> bool:
        return self.proposal is not None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.function}" + (f" (line {self.line})" if self.line else "")


class StreamifyExpert(Expert):
    """One verified proposal per region; `explain` says why the rest got none."""

    name = "streamify"
    level = wf.Level.APPLICATION

    def analyse(self, context: AnalysisContext) -> list[wf.Finding]:
        out = []
        for f in self.findings(context):
            evidence = () if f.plan is None else (
                f"{len(f.plan.streams)} tasks, {f.plan.stream_count} streams, {len(f.plan.events)} events",)
            out.append(wf.Finding(self.name, self.level, f.where, f.applicable, evidence, f.reason, f))
        return out

    def plan(self, context: AnalysisContext, finding: wf.Finding) -> wf.Plan | None:
        f: Finding = finding.detail
        if f.plan is None or f.proposal is None:
            return None
        changes = (f"launch on {f.plan.stream_count} non-blocking streams forked from and joined to the origin "
                   f"stream, with {sum(len(w) for w in f.plan.waits.values())} cross-stream events",)
        return wf.Plan(finding, changes, detail=f)

    def transform(self, context: AnalysisContext, plan: wf.Plan, feedback: str | None = None) -> list[Proposal]:
        f: Finding = plan.detail
        return [f.proposal] if f.proposal is not None else []

    def explain(self, context: AnalysisContext) -> list[str]:
        return [f"{f.where}: {f.reason}" for f in self.findings(context) if not f.applicable]

    def findings(self, context: AnalysisContext) -> list[Finding]:
        files = source_files(context.target)
        found = []
        for path, text in files.items():
            model = analyze(text, path, defines=defines(context))
            for function in host_functions(model):
                found += streamify(files, list(context.target.spec.sources), path, model, function, self.name,
                                   defines=defines(context))
        return found


def host_functions(model: SourceModel) -> list[str]:
    """Functions with a launch, or calling a function of the file that does CUDA work."""
    return list(dict.fromkeys(op.function for op in model.host_ops
                              if op.function and op.kind in (HostOpKind.LAUNCH, HostOpKind.CALL)))


def streamify(files: dict[str, str], editable: list[str], path: str, model: SourceModel, function: str,
              agent: str = StreamifyExpert.name, *, defines: dict[str, str] | None = None,
              sabotage: Sabotage | None = None) -> list[Finding]:
    """A finding for each region of `function` in `files[path]`, or one saying why it has none."""
    text = files[path]
    if "wf_st0" in text or "wf_fork0" in text:
        return [Finding(path, function, "already streamified (wf_st0/wf_fork0 in use)")]
    analysis = analyse_regions(model, function, text)
    found = [_one(files, editable, path, model, analysis.graph, region, agent, defines or {}, sabotage)
             for region in analysis.regions]
    if not found:
        return [Finding(path, function, _no_region(model, function, analysis.reasons))]
    return found


def _no_region(model: SourceModel, function: str, reasons: tuple[str, ...]) -> str:
    """Why `function` has no region: the reasons other than "fewer than two tasks" first (those
    name what is in the way); a helper's callers are named, for they are streamified instead."""
    telling = [r for r in reasons if not r.startswith("fewer than two tasks")] or list(reasons[:1])
    reason = "; ".join(telling[:3]) + (f"; and {len(telling) - 3} more" if len(telling) > 3 else "") or "no launches"
    callers = [f"{op.function} line {op.line}{' (in a loop)' if op.loops else ''}" for op in model.host_ops
               if op.kind is HostOpKind.CALL and op.api == function]
    return f"a helper called from {', '.join(callers)}: {reason}" if callers else reason


def _one(files: dict[str, str], editable: list[str], path: str, model: SourceModel, graph: KernelGraph,
         region: Region, agent: str, defines: dict[str, str], sabotage: Sabotage | None) -> Finding:
    line = region.statements[0].start_point[0] + 1

    def finding(reason: str, **more: object) -> Finding:
        return Finding(path, region.function, reason, line=line, **more)  # type: ignore[arg-type]

    if region.pool:
        problem = pool_problem(region, graph)
        if problem:
            return finding(problem)
        plan = Plan({t: t % POOL_STREAMS for t in range(len(region.tasks))})
    else:
        plan = plan_streams(len(region.tasks), task_edges(region, graph))
    if plan.stream_count < 2:
        return finding(f"no two tasks are independent: nothing to overlap ({_tasks(region)})", plan=plan)
    written = sabotage(plan) if sabotage is not None else plan
    calls = {t: tuple({graph.nodes[n].call for n in task.nodes}) for t, task in enumerate(region.tasks)}
    source = files[path].encode("utf-8", "surrogateescape")
    changes = Rewrite(source, model.root, region, written, calls).changes()
    patched = apply(files, line_edits(path, source, changes), editable)
    if isinstance(patched, Refused):
        return finding(f"the patch was refused: {patched.reason}", plan=plan)
    result = check(graph, extract(analyze(dict(patched.files)[path], path, defines=defines), region.function))
    if not result.ok:
        why = "; ".join(v.reason for v in result.violations)
        return finding(f"depgraph.check rejected the transformation: {why}", plan=plan, check=result)
    summary = describe(region, plan, graph, result)
    proposal = Proposal(agent, f"streamify {region.function} in {path} from line {line}: {summary}\n{patched.diff}",
                        patched.files)
    return finding(summary, proposal=proposal, plan=plan, check=result)


def _tasks(region: Region) -> str:
    return "; ".join(t.label for t in region.tasks[:4]) + ("; ..." if len(region.tasks) > 4 else "")


def describe(region: Region, plan: Plan, graph: KernelGraph, result: CheckResult) -> str:
    origin = "the default stream" if region.origin is None else f"`{region.origin}`"
    if region.pool:
        return (f"the iterations of the loop at line {region.statements[0].start_point[0] + 1} (no constant trip "
                f"count, independent) on a pool of {POOL_STREAMS} non-blocking streams forked from {origin}; "
                f"depgraph.check: ok, {len(graph.edges)} dependencies kept")
    assignment = ", ".join(f"{region.tasks[t].label}->wf_st0[{s}]" for t, s in plan.streams.items())
    syncs = "; ".join(f"{region.tasks[c].label} waits for {region.tasks[p].label}"
                      for c, ps in plan.waits.items() for p in ps) or "none"
    status = "ok" if result.ok else f"{len(result.violations)} violations"
    return (f"{len(region.tasks)} tasks on {plan.stream_count} non-blocking streams forked from {origin} "
            f"({assignment}); events: {syncs}; depgraph.check: {status}, {len(graph.edges)} dependencies kept")


__all__ = ["Finding", "StreamifyExpert", "describe", "host_functions", "streamify"]
