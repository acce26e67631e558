"""What the rule-based experts know of a CUDA source file, as values: its kernels (parameters,
loops, shared arrays and their accesses, the pointers each writes through), its launches, and the
order of the host's CUDA operations. ``agents.cuda_source.analyze`` makes a ``SourceModel``; the
experts, the dependence-graph builder and the patch tools read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from agents._ts import Node

DEFAULT_STREAMS = frozenset({"0", "nullptr", "NULL", "cudaStreamLegacy"})  # the legacy default stream


@dataclass(frozen=True)
class Span:
    """Where a construct is: 1-based lines, inclusive; start/end index the analysed str."""

    start_line: int
    end_line: int
    start: int
    end: int


@dataclass(frozen=True)
class ParseIssue:
    line: int
    message: str


@dataclass(frozen=True)
class Param:
    """A kernel parameter; `type` is its declaration without the name: `const float* __restrict__`."""

    name: str
    type: str
    is_pointer: bool
    is_const_pointee: bool
    is_restrict: bool


@dataclass(frozen=True)
class TemplateParam:
    name: str
    kind: str  # "type" or "value"
    type: str | None  # the value parameter's type
    default: str | None


@dataclass(frozen=True)
class LaunchBounds:
    max_threads: str
    min_blocks: str | None
    max_threads_value: int | None


@dataclass(frozen=True)
class UnrollPragma:
    """`#pragma unroll [argument]`: argument None for a bare pragma; value when it is constant."""

    line: int
    argument: str | None
    value: int | None


@dataclass(frozen=True)
class Loop:
    kind: str  # "for", "while" or "do"
    span: Span
    header: str  # `for (int k = 0; k < kTile; ++k)`
    variable: str | None
    trip_count: int | None  # when start, bound and step are compile-time constants
    trip_param: str | None  # else the template parameter the count depends on, if any
    unroll: UnrollPragma | None
    depth: int  # 0 for a loop directly in the kernel body


@dataclass(frozen=True)
class SharedAccess:
    """`tile[threadIdx.x][i]` has indices ("threadIdx.x", "i"), outermost first."""

    line: int
    indices: tuple[str, ...]
    is_write: bool
    kernel: str


@dataclass(frozen=True)
class SharedArray:
    name: str
    element_type: str
    dims: tuple[str, ...]  # as written; "" for the unsized dimension of `extern __shared__ T s[]`
    dim_values: tuple[int | None, ...]
    is_dynamic: bool  # extern __shared__: sized at launch
    span: Span
    kernel: str | None  # None for a file-scope declaration
    accesses: tuple[SharedAccess, ...]

    @property
    def line(self) -> int:
        return self.span.start_line


@dataclass(frozen=True)
class Kernel:
    name: str
    template_params: tuple[TemplateParam, ...]
    params: tuple[Param, ...]
    launch_bounds: LaunchBounds | None
    span: Span  # the definition, template header included
    body: Span
    loops: tuple[Loop, ...]
    shared: tuple[SharedArray, ...]
    writes: frozenset[str]  # pointer params stored through (aliases followed), atomics included
    may_write: frozenset[str]  # non-const pointer params handed to a call whose effect is unknown
    reads: frozenset[str]
    # An instance's template arguments: value parameters' integers, type parameters' type names.
    template_values: tuple[tuple[str, int | str], ...] = ()
    # Pointer params used only as `*p` or `p[0]` (no alias, no offset, no call): the kernel touches
    # one element, so `d + k` handed to it is the k-th element alone (an eigenvalue, a counter).
    single_element: frozenset[str] = frozenset()

    def param(self, name: str) -> Param:
        """The parameter named `name` (KeyError when there is none)."""
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(name)


@dataclass(frozen=True)
class Launch:
    kernel: str  # template arguments and namespace stripped
    template_args: str | None
    grid: str
    block: str
    shared_mem: str | None
    stream: str | None  # None: not given, the default stream
    args: tuple[str, ...]
    line: int
    function: str | None  # the enclosing function (lambdas belong to the function around them)
    loops: tuple[int | None, ...]  # trip counts of the loops around it in its function, outermost first
    # Each template argument: an integer (evaluated where the launch is), a type's name, or None.
    template_values: tuple[int | str | None, ...] = ()

    @property
    def on_default_stream(self) -> bool:
        return self.stream is None or self.stream in DEFAULT_STREAMS

    def bound_args(self, kernel: Kernel) -> dict[str, str]:
        """The argument expression passed to each of `kernel`'s parameters."""
        return {p.name: a for p, a in zip(kernel.params, self.args, strict=False)}


class HostOpKind(StrEnum):
    LAUNCH = "launch"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    DEVICE_SYNC = "device_sync"
    STREAM_SYNC = "stream_sync"
    EVENT_SYNC = "event_sync"
    STREAM_CREATE = "stream_create"
    EVENT_RECORD = "event_record"
    STREAM_WAIT_EVENT = "stream_wait_event"
    CALL = "call"  # a call to a function of this file that itself does host operations


@dataclass(frozen=True)
class HostOp:
    """One CUDA operation of a host function, in source order."""

    kind: HostOpKind
    api: str  # the call: "cudaMemcpyAsync", or the kernel's name for a <<<>>> launch
    line: int
    function: str | None
    args: tuple[str, ...]
    loops: tuple[int | None, ...]  # as Launch.loops
    stream: str | None = None
    dst: str | None = None
    src: str | None = None
    direction: str | None = None  # cudaMemcpyHostToDevice, ...
    launch: Launch | None = None
    at: int = -1  # the call's byte offset in the parsed text: its node in `SourceModel.root`


@dataclass(frozen=True)
class SourceModel:
    """Everything `analyze` found in one file. `errors` lists what the parser could not read; the
    rest is what it could."""

    path: str
    kernels: tuple[Kernel, ...]
    shared: tuple[SharedArray, ...]  # every __shared__ array, the kernels' and file-scope ones
    launches: tuple[Launch, ...]
    host_ops: tuple[HostOp, ...]  # source order
    errors: tuple[ParseIssue, ...]
    # Every kernel as launched: a template kernel once per distinct set of template arguments its
    # launches give (defaults filled in), its constants, loops and shared arrays resolved with
    # them; a kernel that is no template, or is never launched, as it is in `kernels`.
    instances: tuple[Kernel, ...] = ()
    macros: Mapping[str, str] = field(default_factory=dict, hash=False)
    constants: Mapping[str, int] = field(default_factory=dict, hash=False)  # file-scope, evaluated
    # The syntax tree and the text it indexes (comments and directives blanked), for the readers
    # that walk statements (agents.hostflow).
    root: Node | None = field(default=None, compare=False, hash=False, repr=False)
    clean: bytes = field(default=b"", compare=False, hash=False, repr=False)

    def kernel(self, name: str) -> Kernel:
        """The kernel named `name` (KeyError when there is none)."""
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise KeyError(name)

    def ops_in(self, function: str) -> tuple[HostOp, ...]:
        return tuple(op for op in self.host_ops if op.function == function)


def written_params(kernel: Kernel) -> set[str]:
    """The pointer parameters the kernel may write through: stores and atomics, and non-const
    pointers handed to calls the analysis cannot see into."""
    return set(kernel.writes | kernel.may_write)


def read_params(kernel: Kernel) -> set[str]:
    return set(kernel.reads)
