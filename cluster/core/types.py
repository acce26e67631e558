"""The values that cross every stage boundary of a sweep.

    Target ─► Candidate ─► compile ─► BuildArtifact ─► measure ─► Measurement ─► ResultRow
    an agent's Proposal ─► checks ─► Verdict ─► Verification ─► an accepted variant (or not)

Everything here is frozen and picklable: Ray ships these between the driver, the compile
tasks and the measuring actors. Failures travel as a ``Status`` inside the value, never as an
exception that would end a sweep.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import secrets
import shlex
import statistics
from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """How far a candidate got. Everything but ``OK`` is a failure recorded in its row."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    METRIC_MISSING = "metric_missing"
    METRIC_INVALID = "metric_invalid"  # samples that cannot be measurements: a time of 0 or below
    VERIFY_FAILED = "verify_failed"
    TEST_FAILED = "test_failed"
    WORKER_LOST = "worker_lost"
    QUARANTINED = "quarantined"  # took down its measuring worker every time it ran
    TOO_MANY_FILES = "too_many_files"  # its scratch directory held more than limits.files files (an inode bomb)
    CLOCK_MISMATCH = "clock_mismatch"  # warpfleet's own clock does not bear out the time it claims (measure.clock)


class Phase(StrEnum):
    BASELINE = "baseline"
    SEARCH = "search"
    FINAL = "final"  # re-measured with more repetitions for the selection
    VERIFY = "verify"  # an agent's variant checked against the baseline before it joins the search
    EVALUATE = "evaluate"  # a configuration tuned elsewhere, measured by ``warpfleet evaluate``


Scalar = int | float | str


def _digest(payload: object, length: int = 16) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class SourceBundle:
    """The files a target's build and run need, carried by value so that any node can build."""

    files: tuple[tuple[str, bytes], ...]  # (path relative to the target's folder, content)

    @functools.cached_property
    def hash(self) -> str:
        """Computed once a bundle: the driver's loop asks for its studies' baseline candidates, and
        so for this hash, many times an iteration (a test's 45 s sweep spent 22 s of its driver's
        CPU here)."""
        h = hashlib.sha256()
        for path, content in sorted(self.files):
            h.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class DeviceInfo:
    """What a measuring worker runs on. ``device_type`` groups workers into studies."""

    kind: str  # "gpu" or "cpu"
    name: str
    arch: str  # sm_90 for a compute capability 9.0 GPU; "host" for CPU workers
    uuid: str = ""
    compute_capability: str = ""
    accelerator_type: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    node_id: str = ""
    hostname: str = ""
    worker_id: str = ""

    @property
    def device_type(self) -> str:
        return f"{self.name} ({self.arch})"


def study_name(target: str, device_type: str, generation: int = 1) -> str:
    """A study's name (its Optuna study's, its rows' ``study``): ``target@device type``, with ``#N``
    after it from the second generation on (a resume with --accept-changes: the target changed)."""
    return f"{target}@{device_type}" + (f"#{generation}" if generation > 1 else "")


def study_of(name: str) -> tuple[str, int]:
    """The target and generation that ``study_name`` wrote into ``name`` (a device type ends in ``)``,
    and a target name holds no ``@``, so neither can be taken for the other)."""
    head, hash_sign, tail = name.rpartition("#")
    if hash_sign and "@" in head and tail.isdigit():
        return head.split("@", 1)[0], int(tail)
    return name.split("@", 1)[0], 1


@dataclass(frozen=True)
class Candidate:
    """One configuration of one target for one device type.

    ``key`` identifies what gets built and run (sources, flags, defines, arch); the same key is
    never evaluated twice in a sweep, whatever phase or trial asked for it.
    """

    target: str
    toolchain: str
    device_type: str
    arch: str
    source_hash: str
    flags: tuple[tuple[str, str], ...]  # (flag name in the space, chosen option string)
    params: tuple[tuple[str, Scalar], ...]  # (param name, value), passed as -D defines
    phase: Phase = Phase.SEARCH
    trial_number: int | None = None
    runner: str = "process"  # how it is built and run (cluster.runners): process, persistent, kernel
    generation: int = 1  # of its study: a resume that accepted a changed target starts the next one

    # Cached (the instance is frozen, its fields never change): the driver asks for them per job.
    @functools.cached_property
    def flag_argv(self) -> list[str]:
        return [arg for _, option in self.flags for arg in shlex.split(option)]

    @functools.cached_property
    def defines(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in self.params]

    @functools.cached_property
    def key(self) -> str:
        built = [self.source_hash, self.toolchain, self.arch, self.flag_argv, self.defines]
        # A process build keeps the key it always had (a resumed run finds its rows); another
        # runner builds another binary from the same configuration.
        key = built if self.runner == "process" else [*built, self.runner]
        # A new study generation (its target's spec changed, maybe not its sources) never meets the
        # old one's rows, references, reviews or profiles, which are all found by key.
        return _digest(key if self.generation == 1 else [*key, f"generation {self.generation}"])

    @property
    def study(self) -> str:
        return study_name(self.target, self.device_type, self.generation)

    def with_phase(self, phase: Phase, trial_number: int | None = None) -> Candidate:
        return dataclasses.replace(self, phase=phase, trial_number=trial_number)


@dataclass(frozen=True)
class KernelResources:
    """One kernel's line of the ptxas resource report."""

    kernel: str
    arch: str
    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0  # bytes
    shared_bytes: int = 0
    stack_bytes: int = 0
    constant_bytes: int = 0


@dataclass(frozen=True)
class BuildArtifact:
    candidate_key: str
    status: Status
    binary: bytes | None = None
    compile_s: float = 0.0
    error_tail: str = ""
    kernels: tuple[KernelResources, ...] = ()
    binary_hash: str = ""  # identical binaries are measured once

    @staticmethod
    def hash_binary(binary: bytes) -> str:
        return hashlib.sha256(binary).hexdigest()[:16]


@dataclass(frozen=True)
class Stats:
    median: float
    minimum: float
    iqr: float
    n: int

    @property
    def rel_noise(self) -> float:
        """Interquartile range over the median: the spread that a difference must beat."""
        return self.iqr / self.median if self.median else float("inf")

    @classmethod
    def of(cls, samples: tuple[float, ...] | list[float]) -> Stats | None:
        if not samples:
            return None
        values = sorted(samples)
        if len(values) >= 4:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            iqr = q3 - q1
        else:
            iqr = values[-1] - values[0]
        return cls(statistics.median(values), values[0], iqr, len(values))


@dataclass(frozen=True)
class Telemetry:
    """What NVML saw while a candidate ran (GPU workers only). Clocks are read, never set."""

    energy_j: float | None  # per timed sample over the timed region when the harness marks it,
    #                         else over the whole run divided by its samples
    power_w: float | None  # mean board power over the region
    sm_clock_mhz: float | None  # median
    mem_clock_mhz: float | None
    temperature_c: float | None  # max
    throttle_reasons: str = ""  # names of every clock event reason seen, comma-separated
    readings: int = 0


@dataclass(frozen=True)
class RunOutputs:
    """One run's output files and stdout numbers: a baseline's, kept as the reference. ``token``
    names these outputs where they are kept elsewhere (the kernel runner's host keeps a reference it
    was given once, by its token): new for every object made, never compared."""

    files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    stdout_values: tuple[float, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_hex(8), compare=False)


@dataclass(frozen=True)
class Clock:
    """A candidate's runs by its own word and by warpfleet's clock, medians over its runs: the
    seconds its samples add up to in a run, and the seconds a run took (``cluster.measure.clock``);
    and how far its runs' times spread: twice their median absolute deviation (one slow first run,
    a persistent host's imports, does not count)."""

    claimed_s: float
    wall_s: float
    wall_spread_s: float = 0.0
    # The device's busy time a run (the union of its kernels', copies' and memsets' intervals, by
    # CUPTI: ``cluster.runners.device_clock``) and its spread, as the wall's; None without a record.
    device_s: float | None = None
    device_spread_s: float = 0.0
    # The kernels' busy time alone (the union of their intervals) and its spread: copies of a
    # program's inputs vary by milliseconds run to run, more than a kernel's real saving.
    kernel_s: float | None = None
    kernel_spread_s: float = 0.0
    # From the first kernel's start to the last one's end, and its spread: the kernels' timeline
    # with the GPU's idle gaps between launches, which a program bound by its launches saves.
    span_s: float | None = None
    span_spread_s: float = 0.0
    # Samples a run printed and the device's records of a run (kernels, copies, memsets), medians:
    # a harness that samples for a fixed time takes more samples when faster (``clock.per_sample``).
    samples: float | None = None
    records: float | None = None


@dataclass(frozen=True)
class DeviceRecord:
    """What the GPU did in one run, by warpfleet's device clock (``cluster.runners.device_clock``):
    the seconds it was busy (the union of the intervals, so that work overlapped on streams counts
    once), the records it saw, and whether the record is whole (a process that left without its
    exit handlers, ``_exit``, leaves one begun and never ended)."""

    busy_s: float
    records: int
    complete: bool = True
    kernel_s: float | None = None  # the kernels' intervals alone, their union
    span_s: float | None = None  # from the first kernel's start to the last one's end (None: no kernel)


@dataclass(frozen=True)
class Measurement:
    """What a measuring worker saw: samples of the target's metric, and whether it verified."""

    candidate_key: str
    status: Status
    device: DeviceInfo
    samples: tuple[float, ...] = ()
    run_s: float = 0.0
    verify_s: float = 0.0
    queue_s: float = 0.0
    error_tail: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    # Only the baseline returns its outputs (one per seed): what every other candidate must match.
    outputs: tuple[RunOutputs, ...] = field(default=(), repr=False)
    telemetry: Telemetry | None = None
    raced: bool = False  # a run stopped sampling early: clearly slower than the study's best (measure.race)
    clock: Clock | None = None  # its claimed and its wall time per run, where its metric is a time it printed

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.samples)


@dataclass(frozen=True)
class BestConfig:
    """The configuration selected for one target on one device type: what export writes."""

    target: str
    device_type: str
    arch: str
    toolchain: str
    candidate_key: str
    flags: dict[str, str]  # flag name -> chosen option ("" = unset)
    params: dict[str, Scalar]
    median: float
    baseline_median: float
    speedup: float
    unit: str
    iqr: float = 0.0
    reason: str = ""  # why it won ("fastest", or why a simpler one was kept over the fastest)
    source_hash: str = ""  # the sources it builds (an agent's variant or the target's own); evaluate checks them
    baseline_source_hash: str = ""
    noisy: bool = False  # its re-measurements' IQR/median stayed above measure.max_noise: its lead may be noise
    # False: the best measured so far of a study that had no finals (a run stopped or ended by its
    # budget first): its search-phase measurement, never re-run on fresh seeds (export: --unconfirmed)
    remeasured: bool = True
    fastest: str = ""  # the fastest configuration's key where it was not selected (``reason`` says why)

    @property
    def is_variant(self) -> bool:
        """Built from an agent's variant of the sources: an export must carry its patch."""
        return bool(self.source_hash and self.baseline_source_hash) and self.source_hash != self.baseline_source_hash

    @property
    def flag_argv(self) -> list[str]:
        return [arg for option in self.flags.values() for arg in shlex.split(option)]

    @property
    def defines(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in self.params.items()]


@dataclass(frozen=True)
class Proposal:
    """A source variant: replaced files (paths as in the target), and why."""

    agent: str
    description: str
    files: tuple[tuple[str, str], ...]
    search_params: dict[str, tuple[int | float | str, ...]] = field(default_factory=dict)


class VerdictStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # does not apply here (no GPU for the sanitizer, no launch for the graph)


@dataclass(frozen=True)
class Verdict:
    """One check of step 4: build, outputs, tests, memcheck, racecheck, depgraph, guards."""

    check: str
    status: VerdictStatus
    detail: str = ""
    seconds: float = 0.0  # the check's own time, where it ran something (a build, a run, a tool); else 0

    @property
    def failed(self) -> bool:
        return self.status is VerdictStatus.FAILED


@dataclass(frozen=True)
class Verification:
    verdicts: tuple[Verdict, ...]

    @property
    def passed(self) -> bool:
        return not any(v.failed for v in self.verdicts)

    @property
    def reason(self) -> str:
        """The failures in one line, for the record and as feedback to the transformer."""
        return "; ".join(f"{v.check}: {v.detail}" for v in self.verdicts if v.failed)

    def to_json(self) -> str:
        return json.dumps([asdict(v) for v in self.verdicts], sort_keys=True)
