"""The tools an LLM agent calls: the workflow's own (source, analysis, patch tools, build, verify,
profile, occupancy), as OpenAI function schemas with a dispatcher that never raises.

    model's tool call (name, JSON text) ─► Toolbox.call ─► validated arguments (pydantic)
        ─► the tool ─► text for the model;  bad JSON, bad arguments, a failing tool ─► "error: ..."

Guards live in the tools, not in the prompts: ``edit`` goes through ``agents.llm.guard.Workspace``
(declared sources only, read-only regions, diff size), and a tool whose service is missing says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.llm.guard import Workspace
from agents.patch import (
    Delete,
    Edit,
    InsertAfter,
    InsertAtAnchor,
    InsertBefore,
    MarkerError,
    Refused,
    Replace,
    ReplaceText,
    readonly_regions,
)
from agents.workflow.steps import Plan, Verification

MAX_READ_LINES = 400
Scalar = int | float | str


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Services:
    """What the tools run on: build, verify and profile a working copy (None: not offered)."""

    build: Callable[[AnalysisContext, Mapping[str, str]], str] | None = None
    verify: Callable[[AnalysisContext, Plan, Proposal], Verification] | None = None
    profile: Callable[[AnalysisContext, Mapping[str, str]], str] | None = None


@dataclass
class Session:
    """One conversation's state: what the agent looks at and the files it changes."""

    context: AnalysisContext
    workspace: Workspace
    services: Services = field(default_factory=Services)
    plan: Plan | None = None
    agent: str = "llm"
    final: Any = None  # what a final tool returned: the conversation's result
    finished: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args: type[Args]
    run: Callable[[Session, Any], str]
    final: bool = False  # a successful call ends the conversation

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": inline_schema(self.args)}}


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with ``$defs`` inlined and titles dropped: the plainest form, which
    every server's tool-call grammar accepts."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: resolve(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


@dataclass
class Toolbox:
    tools: Sequence[Tool]
    by_name: dict[str, Tool] = field(init=False)

    def __post_init__(self) -> None:
        self.by_name = {tool.name: tool for tool in self.tools}

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools]

    def call(self, session: Session, name: str, arguments: str) -> str:
        """Run one tool call; every problem is a message for the model, never an exception."""
        tool = self.by_name.get(name)
        if tool is None:
            return f"error: there is no tool named {name!r}; the tools are {', '.join(self.by_name)}"
        try:
            raw = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return f"error: the arguments of {name} are not valid JSON ({exc}); send one JSON object"
        if not isinstance(raw, dict):
            return f"error: the arguments of {name} must be a JSON object, not {type(raw).__name__}"
        try:
            args = tool.args.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            return f"error: bad arguments for {name}: {problems}"
        try:
            return tool.run(session, args)
        except Exception as exc:  # a tool's failure is the model's information, not our crash
            return f"error: {name} failed: {type(exc).__name__}: {exc}"


# --- reading ---------------------------------------------------------------------------------

class NoArgs(Args):
    pass


class ReadArgs(Args):
    path: str
    start_line: int = Field(1, ge=1)
    end_line: int | None = Field(None, ge=1)


class PathArgs(Args):
    path: str


def _regions(text: str) -> list[tuple[int, int]]:
    try:
        return readonly_regions(text)
    except MarkerError:
        return []


def list_files(session: Session, _: NoArgs) -> str:
    lines = []
    for path, text in session.workspace.current.items():
        regions = ", ".join(f"{a}-{b}" for a, b in _regions(text)) or "none"
        lines.append(f"{path}: {len(text.splitlines())} lines; read-only lines: {regions}")
    return "editable sources (only these may change):\n" + "\n".join(lines)


def read_source(session: Session, args: ReadArgs) -> str:
    text = session.workspace.current.get(args.path)
    if text is None:
        return f"error: {args.path} is not a source of this target; sources: {', '.join(session.workspace.current)}"
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it starts none
    wanted = min(args.end_line or len(lines), len(lines))
    end = min(wanted, args.start_line + MAX_READ_LINES - 1)
    readonly = {n for a, b in _regions(text) for n in range(a, b + 1)}
    out = [f"{n:5d}{'*' if n in readonly else ' '}| {lines[n - 1]}" for n in range(args.start_line, end + 1)]
    more = f"\n(lines {end + 1}-{wanted} not shown: read on from {end + 1})" if end < wanted else ""
    return f"{args.path} (lines marked * are read-only)\n" + "\n".join(out) + more


def analyze_source(session: Session, args: PathArgs) -> str:
    text = session.workspace.current.get(args.path)
    if text is None:
        return f"error: {args.path} is not a source of this target"
    model = analyze(text, args.path)
    out = [f"{args.path}: {len(model.kernels)} kernels, {len(model.launches)} launches"]
    for k in model.kernels:
        out.append(f"kernel {k.name} (lines {k.span.start_line}-{k.span.end_line}); params: "
                   + ", ".join(f"{p.type} {p.name}" for p in k.params)
                   + f"; writes {sorted(k.writes)}; reads {sorted(k.reads)}")
        for loop in k.loops:
            unroll = "no pragma" if loop.unroll is None else f"#pragma unroll {loop.unroll.argument or ''}".rstrip()
            trips = loop.trip_count if loop.trip_count is not None else "run-time"
            out.append(f"  loop line {loop.span.start_line} depth {loop.depth}: `{loop.header}` trips {trips}, "
                       f"{unroll}")
        for array in k.shared:
            out.append(f"  __shared__ {array.element_type} {array.name}{''.join(f'[{d}]' for d in array.dims)} "
                       f"line {array.line}, {len(array.accesses)} accesses")
    for launch in model.launches:
        out.append(f"launch line {launch.line} in {launch.function}: {launch.kernel}<<<{launch.grid}, {launch.block}"
                   f"{', ' + (launch.shared_mem or '0') + ', ' + launch.stream if launch.stream else ''}>>>")
    if model.constants:
        out.append("constants: " + ", ".join(f"{k}={v}" for k, v in sorted(model.constants.items())[:40]))
    if model.errors:
        out.append(f"parse issues at lines {[e.line for e in model.errors[:10]]}")
    return "\n".join(out)


def kernel_resources(session: Session, _: NoArgs) -> str:
    context = session.context
    out = [f"target {context.target.name}, arch {context.arch}, baseline median "
           f"{context.baseline_median if context.baseline_median is not None else 'not measured'} "
           f"{context.target.spec.metric.unit}"]
    for k in context.kernels:
        out.append(f"{k.kernel}: {k.registers} registers, {k.spill_stores} B spill stores, {k.spill_loads} B spill "
                   f"loads, {k.shared_bytes} B shared, {k.stack_bytes} B stack")
    if not context.kernels:
        out.append("no ptxas report (build to get one)")
    for name, value in sorted(context.metrics.items()):
        out.append(f"metric {name} = {value:g}")
    return "\n".join(out)


class OccupancyArgs(Args):
    block_size: int = Field(ge=1, le=1024)
    registers: int = Field(ge=0, le=255)
    shared_bytes: int = Field(0, ge=0)
    arch: str | None = None  # default: the target's


def occupancy_tool(session: Session, args: OccupancyArgs) -> str:
    from cluster.core.occupancy import limits_for, occupancy, register_steps

    limits = limits_for(args.arch or session.context.arch)
    now = occupancy(limits, args.block_size, args.registers, args.shared_bytes)
    steps = register_steps(limits, args.block_size, args.shared_bytes)
    levels = ", ".join(f"<= {s.registers} registers: {s.occupancy.percent:.0f}%" for s in steps)
    return (f"theoretical occupancy {now.percent:.0f}% ({now.active_blocks_per_sm} blocks, "
            f"{now.active_warps_per_sm} of {now.max_warps_per_sm} warps per SM), limited by {now.limiting_factor}; "
            f"blocks allowed by {now.block_limits}; -maxrregcount levels: {levels}")


# --- editing ---------------------------------------------------------------------------------

class EditArgs(Args):
    """One edit; which fields count depends on ``op``. Lines are 1-based, of the file as it is now."""

    op: Literal["insert_before", "insert_after", "insert_at_anchor", "replace", "replace_text", "delete"]
    path: str
    line: int | None = None  # insert_before, insert_after
    start_line: int | None = None  # replace, delete
    end_line: int | None = None
    text: str | None = None  # the inserted or replacing lines
    anchor: str | None = None  # insert_at_anchor: an exact substring of the file
    after: bool = True
    old: str | None = None  # replace_text
    new: str | None = None
    count: int = 1

    def to_edit(self) -> Edit:
        need = {"insert_before": ("line", "text"), "insert_after": ("line", "text"),
                "insert_at_anchor": ("anchor", "text"), "replace": ("start_line", "end_line", "text"),
                "replace_text": ("old", "new"), "delete": ("start_line", "end_line")}[self.op]
        missing = [name for name in need if getattr(self, name) is None]
        if missing:
            raise ValueError(f"{self.op} needs {', '.join(need)}; missing {', '.join(missing)}")
        match self.op:
            case "insert_before":
                return InsertBefore(self.path, self.line, self.text)  # type: ignore[arg-type]
            case "insert_after":
                return InsertAfter(self.path, self.line, self.text)  # type: ignore[arg-type]
            case "insert_at_anchor":
                return InsertAtAnchor(self.path, self.anchor, self.text, self.after)  # type: ignore[arg-type]
            case "replace":
                return Replace(self.path, self.start_line, self.end_line, self.text)  # type: ignore[arg-type]
            case "replace_text":
                return ReplaceText(self.path, self.old, self.new, self.count)  # type: ignore[arg-type]
        return Delete(self.path, self.start_line, self.end_line)  # type: ignore[arg-type]


class EditsArgs(Args):
    edits: list[EditArgs] = Field(min_length=1)


def edit_tool(session: Session, args: EditsArgs) -> str:
    try:
        edits = [e.to_edit() for e in args.edits]
    except ValueError as exc:
        return f"error: {exc}"
    result = session.workspace.apply(edits)
    if isinstance(result, Refused):
        return f"refused, nothing changed: {result.reason}"
    _, total = session.workspace.diff()
    return (f"applied: {result.changed_lines} lines changed by this call; the whole diff is {total} lines "
            f"(limit {session.workspace.max_diff_lines})\n{result.diff}")


def show_diff(session: Session, _: NoArgs) -> str:
    diff, lines = session.workspace.diff()
    return f"{lines} changed lines\n{diff}" if diff else "no changes yet"


def reset(session: Session, _: NoArgs) -> str:
    session.workspace.reset()
    return "the working copy is the original again"


def build_tool(session: Session, _: NoArgs) -> str:
    if session.services.build is None:
        return "build is not available in this run; finish when the edit is done, the verification step builds it"
    return session.services.build(session.context, dict(session.workspace.current))


def verify_tool(session: Session, _: NoArgs) -> str:
    if session.services.verify is None or session.plan is None:
        return "verify is not available here; the verification step runs after you finish"
    if not session.workspace.changed():
        return "nothing to verify: no changes yet"
    proposal = Proposal(session.agent, "work in progress", session.workspace.changed())
    verification = session.services.verify(session.context, session.plan, proposal)
    verdicts = "\n".join(f"{v.check}: {v.status}{': ' + v.detail if v.detail else ''}" for v in verification.verdicts)
    return f"{'passed' if verification.passed else 'FAILED'}\n{verdicts}"


def profile_tool(session: Session, _: NoArgs) -> str:
    if session.services.profile is None:
        return "profile is not available in this run; the sweep measures your proposal after you finish"
    return session.services.profile(session.context, dict(session.workspace.current))


READ_TOOLS = (
    Tool("list_files", "The target's editable sources, their sizes and read-only line ranges.", NoArgs, list_files),
    Tool("read_source", "Numbered lines of a source (read-only lines marked *), at most 400 per call.",
         ReadArgs, read_source),
    Tool("analyze_source", "Kernels, loops, shared arrays, launches and constants of a CUDA source.",
         PathArgs, analyze_source),
    Tool("kernel_resources", "The baseline's ptxas report (registers, spills, shared memory) and profiler "
         "metrics.", NoArgs, kernel_resources),
    Tool("occupancy", "Theoretical occupancy of a launch and the -maxrregcount values where it changes.",
         OccupancyArgs, occupancy_tool),
)

EDIT_TOOLS = (
    Tool("edit", "Apply edits to the working copy, all or none. Ops: insert_before/insert_after (line, text), "
         "insert_at_anchor (anchor, text, after), replace (start_line, end_line, text), replace_text (old, new, "
         "count), delete (start_line, end_line). Edits inside read-only regions are refused.", EditsArgs, edit_tool),
    Tool("show_diff", "The diff of the working copy against the original.", NoArgs, show_diff),
    Tool("reset", "Throw away every change of the working copy.", NoArgs, reset),
    Tool("build", "Compile the working copy; compiler errors or the ptxas report.", NoArgs, build_tool),
    Tool("verify", "Build, run and check the working copy against the baseline's outputs.", NoArgs, verify_tool),
    Tool("profile", "Measure the working copy: time and profiler metrics against the baseline.", NoArgs,
         profile_tool),
)


def final_tool(name: str, description: str, args: type[Args], accept: Callable[[Session, Any], str | None]) -> Tool:
    """A tool whose successful call ends the conversation: ``accept`` returns an error message
    for the model, or None having stored the result in ``session.final``."""

    def run(session: Session, value: Any) -> str:
        problem = accept(session, value)
        if problem:
            return f"error: {problem}"
        session.finished = True
        return "received"

    return Tool(name, description, args, run, final=True)
