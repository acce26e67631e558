"""The shared-memory padding expert: a 2D ``__shared__`` tile whose rows span a multiple of the 32
banks, read column-wise by a warp, puts every lane of the warp in one bank; one more element per
row staggers the rows across the banks (the classic transpose fix).

Bank model (every architecture since Maxwell, sm_90 included): 32 banks, 4 bytes wide; a warp's
request is served in wavefronts of 128 bytes, so 32 lanes of 4-byte elements or 16 lanes of
8-byte elements at once. With row length n elements and the lane in the first index, the lanes of
one wavefront (L = 128 / element bytes of them) hit gcd(n, L) times the same bank (pair): the rows
conflict exactly when n * element bytes is a multiple of 128, and padding n to n + 1 makes the
degree gcd(n + 1, L) = 1. Element types of other sizes, and arrays of more or fewer than two
dimensions, are left alone.

"Column-wise" is a textual heuristic, kept simple on purpose: an access's first index mentions
``threadIdx.x``, or a local of the kernel assigned from an expression that does (``tx``, ``lane``,
transitively), and neither divides nor shifts it right (``threadIdx.x / 32`` is the same row for a
whole warp). It does not prove that consecutive lanes get consecutive rows; the profiler's
bank-conflict count, when the context has it, vetoes a proposal where there are none.

Padding changes no index: row-major ``a[r][c]`` addresses the same logical element, only the
row stride grows. Only the declaration's last dimension is edited, through ``agents.patch``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from agents._base import AnalysisContext, Proposal
from agents.cuda_source import analyze
from agents.experts._expert import Expert, defines, derived_names, instance_label, mentions, source_models
from agents.patch import Patched, Replace, apply, readonly_regions, source_files
from agents.source_model import SharedAccess, SharedArray, SourceModel
from agents.workflow.steps import Finding, Level, Plan

__all__ = ["BANK_CONFLICTS_METRIC", "ELEMENT_BYTES", "PaddingExpert", "PaddingFinding", "find_padding"]

BANK_CONFLICTS_METRIC = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
WAVEFRONT_BYTES = 128  # 32 banks x 4 bytes

ELEMENT_BYTES: dict[str, int] = {
    **dict.fromkeys(["float", "int", "unsigned", "unsigned int", "int32_t", "uint32_t", "signed int"], 4),
    **dict.fromkeys(["double", "long long", "long long int", "unsigned long long", "unsigned long long int",
                     "int64_t", "uint64_t"], 8),
}

_THREAD_X = re.compile(r"\bthreadIdx\s*\.\s*x\b")
_COLLAPSES = re.compile(r"/|>>")  # the lanes of a warp share the quotient: one row, not a column
_ADDITIVE_SAFE = re.compile(r"[\w\s.()+\-*/%]*")  # `X + 1` still means (X) + 1


@dataclass(frozen=True)
class PaddingFinding:
    """One shared array the expert looked at, and what it concluded."""

    path: str
    array: SharedArray
    pad: bool  # propose padding its last dimension by one element
    reason: str  # why (not): the bank analysis, or what ruled it out
    access: SharedAccess | None = None  # the column-wise access that conflicts
    instance: str = ""  # the template kernel's instance the verdict is for (`mm<BLOCK_SIZE=32>`), if one

    @property
    def label(self) -> str:
        return f"{self.path}:{self.array.line} {self.array.name}[{']['.join(self.array.dims)}]"


def _lane_names(kernel_text: str) -> set[str]:
    """Locals assigned (transitively) from a lane-varying expression of threadIdx.x."""
    return derived_names(kernel_text, _varies_by_lane)


def _varies_by_lane(expression: str, names: set[str]) -> bool:
    if _COLLAPSES.search(expression):
        return False
    return bool(_THREAD_X.search(expression)) or mentions(expression, names)


def _analyse(array: SharedArray, path: str, lanes: dict[str, set[str]], readonly: list[tuple[int, int]],
             metric: float | None) -> PaddingFinding:
    def finding(pad: bool, reason: str, access: SharedAccess | None = None) -> PaddingFinding:
        return PaddingFinding(path, array, pad, reason, access)

    if array.is_dynamic:
        return finding(False, "dynamic (extern __shared__): sized at launch, its layout is the kernel's indexing")
    if len(array.dims) != 2:
        return finding(False, f"{len(array.dims)} dimensions: only 2D tiles are padded")
    size = ELEMENT_BYTES.get(array.element_type.removeprefix("const ").strip())
    if size is None:
        return finding(False, f"element type {array.element_type!r}: neither 4 nor 8 bytes known")
    if any(begin <= line <= end for begin, end in readonly for line in range(array.span.start_line,
                                                                              array.span.end_line + 1)):
        return finding(False, "declared in a read-only region")
    row = array.dim_values[-1]
    if row is None:
        return finding(False, f"row length {array.dims[-1]!r} does not resolve to a constant")
    lanes_per_wavefront = WAVEFRONT_BYTES // size
    if row % lanes_per_wavefront:
        return finding(False, f"row of {row} x {size} B = {row * size} B is not a multiple of {WAVEFRONT_BYTES} B: "
                              f"rows already start in different banks")
    column = next((a for a in array.accesses if a.indices
                   and _varies_by_lane(a.indices[0], lanes.get(a.kernel, set()))), None)
    if column is None:
        return finding(False, "no column-wise access (no first index varying with threadIdx.x)")
    if metric is not None and metric <= 0:
        return finding(False, f"{BANK_CONFLICTS_METRIC} = {metric:g}: the profile shows no conflicts")
    ways = math.gcd(row, lanes_per_wavefront)
    measured = f"; measured {BANK_CONFLICTS_METRIC} = {metric:g}" if metric is not None else ""
    return finding(True, (
        f"{size}-byte elements, row of {row} = {row * size} B, a multiple of {WAVEFRONT_BYTES} B (32 banks x 4 B): "
        f"the column-wise access at line {column.line} ({array.name}[{']['.join(column.indices)}]) puts the "
        f"{lanes_per_wavefront} lanes of a wavefront in one bank{' pair' if size == 8 else ''} ({ways}-way conflict); "
        f"padded to {row + 1} the rows start {row + 1} elements apart: conflict-free "
        f"(+{array.dim_values[0] or 0} x {size} B of shared memory){measured}"), column)


def _pad_edit(text: str, path: str, array: SharedArray) -> Replace | None:
    """The declaration's lines with the last dimension of `array` grown by one element."""
    declaration = text[array.span.start:array.span.end]
    match = re.search(rf"\b{re.escape(array.name)}\s*((?:\[[^\[\]]*\]\s*)+)", declaration)
    if match is None:
        return None
    last = list(re.finditer(r"\[([^\[\]]*)\]", match.group(1)))[-1]
    inner = last.group(1).strip()
    grown = f"{inner} + 1" if _ADDITIVE_SAFE.fullmatch(inner) else f"({inner}) + 1"
    at = array.span.start + match.start(1) + last.start()
    patched = text[:at] + f"[{grown}]" + text[at + len(last.group(0)):]
    lines = text.split("\n")
    first, end = array.span.start_line - 1, array.span.end_line
    new_lines = patched.split("\n")[first:end]
    return Replace(path, array.span.start_line, array.span.end_line, "\n".join(new_lines)) \
        if new_lines != lines[first:end] else None


def instance_arrays(model: SourceModel) -> list[tuple[SharedArray, str]]:
    """Every shared array with the instance it is sized for: a template kernel's arrays once per
    instance (`mm<BLOCK_SIZE=32>`), file-scope and other kernels' arrays once ("")."""
    arrays = [(a, "") for a in model.shared if a.kernel is None]
    for kernel in model.instances:
        label = instance_label(kernel) if kernel.template_values else ""
        arrays += [(a, label) for a in kernel.shared]
    return arrays


def find_padding(context: AnalysisContext) -> list[PaddingFinding]:
    """Every shared array of the target's sources, with the padding verdict on each; an array
    of a template kernel is padded when one instance of it conflicts (the verdict names it)."""
    metric = context.metrics.get(BANK_CONFLICTS_METRIC)
    texts = source_files(context.target)
    verdicts: dict[tuple[str, int, str], list[PaddingFinding]] = {}
    for path, model in source_models(context).items():
        text = texts[path]
        lanes = {k.name: _lane_names(text[k.body.start:k.body.end]) for k in model.kernels}
        readonly = readonly_regions(text)
        for array, instance in instance_arrays(model):
            found = _analyse(array, path, lanes, readonly, metric)
            if instance:
                found = replace(found, reason=f"{instance}: {found.reason}", instance=instance)
            verdicts.setdefault((path, array.span.start, array.name), []).append(found)
    return [_one(found) for found in verdicts.values()]


def _one(instances: list[PaddingFinding]) -> PaddingFinding:
    """The first instance that pads, else the first with every instance's reason."""
    padding = next((f for f in instances if f.pad), None)
    if padding is not None:
        return padding
    return replace(instances[0], reason="; ".join(dict.fromkeys(f.reason for f in instances)))


class PaddingExpert(Expert):
    """Pads bank-conflicting 2D shared tiles by one element per row: one proposal per array."""

    name = "padding"
    level = Level.KERNEL
    uses_profile = True  # the profile's bank conflicts decide

    def needs_profile(self, context: AnalysisContext) -> bool:
        """Only where the source has a tile that would be padded: the profile confirms its conflicts."""
        return any(f.pad for f in find_padding(context))

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        metric = context.metrics.get(BANK_CONFLICTS_METRIC)
        findings = []
        for f in find_padding(context):
            evidence = [f"__shared__ {f.array.element_type} {f.array.name}" + "".join(f"[{d}]" for d in f.array.dims)]
            if f.access is not None:
                index = "".join(f"[{i}]" for i in f.access.indices)
                evidence.append(f"line {f.access.line}: `{f.array.name}{index}` indexed by lane in the first index")
            if metric is not None:
                evidence.append(f"{BANK_CONFLICTS_METRIC} = {metric:,.0f}")
            findings.append(Finding(self.name, self.level, f"{f.path}:{f.array.span.start_line} {f.label}", f.pad,
                                    tuple(evidence), f.reason, f))
        return findings

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan | None:
        f: PaddingFinding = finding.detail
        dims = f.array.dim_values
        padded = "".join(f"[{d}]" for d in (*dims[:-1], (dims[-1] or 0) + 1))
        return Plan(finding, (f"declare {f.array.name}{padded} in {f.path}:{f.array.span.start_line}; "
                              "indexing stays as it is",), detail=f)

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        finding: PaddingFinding = plan.detail
        files = source_files(context.target)
        dynamic = [f.label for f in find_padding(context) if f.array.is_dynamic]
        note = f" Dynamic shared arrays, not changed: {', '.join(dynamic)}." if dynamic else ""
        edit = _pad_edit(files[finding.path], finding.path, finding.array)
        result = apply(files, [edit], context.target.spec.sources) if edit is not None else None
        if not isinstance(result, Patched) or not _grew_by_one(result, finding, context):
            return []
        return [Proposal(agent=self.name, files=result.files,
                         description=f"pad {finding.label} by one element per row: {finding.reason}.{note}\n"
                                     f"{result.diff}")]


def _grew_by_one(patched: Patched, finding: PaddingFinding, context: AnalysisContext) -> bool:
    """The patched source's analysis agrees: same array, last dimension one element longer."""
    new_text = dict(patched.files)[finding.path]
    arrays = [a for a, instance in instance_arrays(analyze(new_text, finding.path, defines=defines(context)))
              if instance == finding.instance and a.name == finding.array.name
              and a.span.start_line == finding.array.span.start_line]
    old = finding.array.dim_values
    return len(arrays) == 1 and arrays[0].dim_values == (*old[:-1], (old[-1] or 0) + 1)

