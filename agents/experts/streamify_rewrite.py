"""Streamify's code transformation: a region's plan written into the source.

    setup (once: non-blocking streams wf_st<r>[K], events; a table of streams per counted loop)
    fork  (an event recorded on the origin stream, waited on by every new stream)
    tasks (each launch's stream, or its helper's stream argument, replaced by the task's stream;
           an event wait before a task that depends on another stream, a record after its producer;
           inside a counted loop, guarded by the iteration: `if (f == 2) ...`)
    join  (an event recorded on every new stream, waited on by the origin stream)

Each task statement is replaced as a whole (its launches edited inside it), so that no two
edits overlap; `line_edits` turns the byte replacements into the patch tools' line edits.
"""

from __future__ import annotations

from agents import _ts
from agents._ts import Node, split_top
from agents.experts._expert import Change
from agents.experts._streams import POOL_STREAMS, Plan, Region, check_macro, stream_parameter


class Rewrite:
    """The changes that carry `plan` out on `region` (number `r` of the file, for names)."""

    def __init__(self, source: bytes, root: Node, region: Region, plan: Plan, calls: dict[int, tuple[int, ...]],
                 r: int = 0) -> None:
        self.source, self.root, self.region, self.plan, self.r = source, root, region, plan, r
        self.calls = calls  # task index -> byte offsets of the calls in it (launches, helper calls)
        self.macro = check_macro(source.decode("utf-8", "surrogateescape"))
        self.streams = sorted(set(plan.streams.values())) if not region.pool else list(range(POOL_STREAMS))
        self.loops = [s for s in region.statements if any(t.statement == s and t.iteration is not None
                                                          for t in region.tasks)]

    # -- text ------------------------------------------------------------------------------
    def call(self, expression: str) -> str:
        return f"{self.macro}({expression});" if self.macro else f"{expression};"

    def name(self, what: str) -> str:
        return f"wf_{what}{self.r}"

    def indent(self, node: Node) -> str:
        line_start = self.source.rfind(b"\n", 0, node.start_byte) + 1
        head = self.source[line_start:node.start_byte].decode("utf-8", "surrogateescape")
        return head[: len(head) - len(head.lstrip())]

    def text(self, start: int, end: int) -> str:
        return self.source[start:end].decode("utf-8", "surrogateescape")

    # -- the parts ----------------------------------------------------------------------------
    def changes(self) -> list[Change]:
        """One change per task statement; the first also gets the setup and fork, the last the join."""
        statements = list(self.region.statements)
        out = []
        for j, statement in enumerate(statements):
            indent = self.indent(statement)
            body = self.statement(statement)
            if j == 0:
                body = "\n".join(f"{indent}{line}" if k else line for k, line in enumerate(self.setup())) \
                       + f"\n{indent}{body}"
            if j == len(statements) - 1:
                body += "".join(f"\n{indent}{line}" for line in self.join())
            out.append(Change(statement.start_byte, statement.end_byte, body))
        return out

    def setup(self) -> list[str]:
        k, events = len(self.streams), len(self.plan.events)
        st, fork, join, dep, ready = (self.name(w) for w in ("st", "fork", "join", "dep", "ready"))
        declared = [f"{fork}", f"{join}[{k}]"] + ([f"{dep}[{events}]"] if events else [])
        lines = [f"static cudaStream_t {st}[{k}];  // warpfleet streamify: {self.summary()}",
                 f"static cudaEvent_t {', '.join(declared)};",
                 f"static bool {ready} = false;",
                 f"if (!{ready}) {{",
                 f"    for (int wf_i = 0; wf_i < {k}; ++wf_i) "
                 + self.call(f"cudaStreamCreateWithFlags(&{st}[wf_i], cudaStreamNonBlocking)"),
                 f"    for (int wf_i = 0; wf_i < {k}; ++wf_i) "
                 + self.call(f"cudaEventCreateWithFlags(&{join}[wf_i], cudaEventDisableTiming)")]
        if events:
            lines.append(f"    for (int wf_i = 0; wf_i < {events}; ++wf_i) "
                         + self.call(f"cudaEventCreateWithFlags(&{dep}[wf_i], cudaEventDisableTiming)"))
        lines += [f"    {self.call(f'cudaEventCreateWithFlags(&{fork}, cudaEventDisableTiming)')}",
                  f"    {ready} = true;", "}"]
        for j, loop in enumerate(self.loops):
            if not self.region.pool:
                table = [self.plan.streams[t] for t, task in enumerate(self.region.tasks) if task.statement == loop]
                lines.append(f"static const int {self.name('tab')}_{j}[{len(table)}] = "
                             f"{{{', '.join(map(str, table))}}};")
        lines += [self.call(f"cudaEventRecord({fork}, {self.region.origin_text})"),
                  f"for (int wf_i = 0; wf_i < {k}; ++wf_i) " + self.call(f"cudaStreamWaitEvent({st}[wf_i], {fork}, 0)")]
        return lines

    def join(self) -> list[str]:
        st, join = self.name("st"), self.name("join")
        return [f"for (int wf_i = 0; wf_i < {len(self.streams)}; ++wf_i) {{",
                f"    {self.call(f'cudaEventRecord({join}[wf_i], {st}[wf_i])')}",
                f"    {self.call(f'cudaStreamWaitEvent({self.region.origin_text}, {join}[wf_i], 0)')}", "}"]

    def summary(self) -> str:
        if self.region.pool:
            return f"the iterations on a pool of {POOL_STREAMS} non-blocking streams"
        return f"{len(self.region.tasks)} tasks on {len(self.streams)} non-blocking streams"

    def waits(self, task: int) -> list[str]:
        stream = f"{self.name('st')}[{self.plan.streams[task]}]"
        return [self.call(f"cudaStreamWaitEvent({stream}, {self.name('dep')}[{self.plan.events[p]}], 0)")
                for p in self.plan.waits.get(task, ())]

    def records(self, task: int) -> list[str]:
        if task not in self.plan.events:
            return []
        stream = f"{self.name('st')}[{self.plan.streams[task]}]"
        return [self.call(f"cudaEventRecord({self.name('dep')}[{self.plan.events[task]}], {stream})")]

    # -- a task statement ---------------------------------------------------------------------
    def statement(self, statement: Node) -> str:
        tasks = [t for t, task in enumerate(self.region.tasks) if task.statement == statement]
        if self.region.tasks[tasks[0]].iteration is None:
            [task] = tasks
            stream = f"{self.name('st')}[{self.plan.streams[task]}]"
            own = self.with_streams(statement.start_byte, statement.end_byte, self.offsets(tasks), stream)
            indent = self.indent(statement)
            return "".join(f"{w}\n{indent}" for w in self.waits(task)) + own + \
                "".join(f"\n{indent}{r}" for r in self.records(task))
        return self.loop(statement, tasks)

    def offsets(self, tasks: list[int]) -> set[int]:
        return {at for t in tasks for at in self.calls.get(t, ())}

    def loop(self, statement: Node, tasks: list[int]) -> str:
        variable, start, step = self.region.loop(statement)
        index = variable if (start, step) == (0, 1) else f"({variable} - ({start})) / ({step})"
        if self.region.pool:
            stream = f"{self.name('st')}[({index}) % {POOL_STREAMS}]"
        else:
            stream = f"{self.name('st')}[{self.name('tab')}_{self.loops.index(statement)}[{index}]]"
        body = statement.child_by_field_name("body")
        inner = self.with_streams(body.start_byte, body.end_byte, self.offsets(tasks), stream)
        if body.type == "compound_statement":
            inner = inner[1:-1].strip("\n").rstrip()
        else:
            inner = self.indent(statement) + "    " + inner
        indent = self.indent(statement) + "    "
        values = {t: start + (self.region.tasks[t].iteration or 0) * step for t in tasks}
        guarded_waits = [f"{indent}if ({variable} == {values[t]}) {w}" for t in tasks for w in self.waits(t)]
        guarded_records = [f"{indent}if ({variable} == {values[t]}) {r}" for t in tasks for r in self.records(t)]
        lines = ["{", *guarded_waits, inner, *guarded_records, self.indent(statement) + "}"]
        return self.text(statement.start_byte, body.start_byte) + "\n".join(lines)

    def with_streams(self, start: int, end: int, offsets: set[int], stream: str) -> str:
        """Bytes [start, end) with each launch at `offsets` on `stream`, and each helper call at
        `offsets` given `stream` for its `cudaStream_t` parameter."""
        changes = []
        for call in (n for n in _ts.walk(self.root) if n.type == "call_expression" and n.start_byte in offsets
                     and start <= n.start_byte < end):
            chevrons = next((c for c in call.children if c.type == "kernel_call_syntax"), None)
            if chevrons is not None:
                config = split_top(self.text(chevrons.start_byte + 3, chevrons.end_byte - 3))
                shared = config[2] if len(config) > 2 else "0"
                changes.append(Change(chevrons.start_byte, chevrons.end_byte,
                                      f"<<<{config[0]}, {config[1]}, {shared}, {stream}>>>"))
            else:
                position = stream_parameter(self.root, _ts.callee_name(call))
                argument = _ts.arguments(call)[position] if position is not None else None
                if argument is not None:
                    changes.append(Change(argument.start_byte, argument.end_byte, stream))
        out, at = [], start
        for change in sorted(changes, key=lambda c: c.start):
            out += [self.text(at, change.start), change.text]
            at = change.end
        return "".join(out) + self.text(at, end)
