"""The Nsight Compute stage: profile a built candidate with ``ncu --csv --clock-control none``
and keep every kernel's metrics in the run's ``profiles/`` table, joined to the results by
candidate key.

The program runs with ``WARPFLEET_PROFILE=1`` so that the timing harness launches once; the
harness's L2-flush kernel (``wf_l2_flush``) is left out of the table. ``LaunchFilter`` bounds what
ncu replays (by default the first launch of each launch configuration), so that a program with
hundreds of launches is profiled in seconds, not timed out.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import pyarrow as pa

from cluster.compile.build import FLUSH_KERNEL
from cluster.config import Target
from cluster.core.types import Candidate, Status
from cluster.platform import node_platform
from cluster.runners._base import Invocation, ProcessRunner, Runner

# Bank conflicts, occupancy, registers, local-memory (spill) traffic, throughput, duration, and
# the warp stall reasons (per issued instruction) from which the top few are reported.
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "mio_throttle", "lg_throttle", "barrier", "membar",
                 "math_pipe_throttle", "wait", "not_selected", "no_instruction", "branch_resolving",
                 "dispatch_stall", "drain", "tex_throttle", "imc_miss", "sleeping", "misc")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
GLOBAL_ACCESS_METRICS = tuple(f"l1tex__t_{what}_pipe_lsu_mem_global_op_{op}.sum"
                              for op in ("ld", "st") for what in ("sectors", "requests"))
DEFAULT_METRICS = (
    "gpu__time_duration.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__block_size",
    "launch__shared_mem_per_block_static",
    "launch__shared_mem_per_block_dynamic",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    # Global memory: sectors and requests (sectors per request: 4 is a warp's coalesced 4-byte
    # access, 16 its float4 access, 32 one sector per lane), L1/tex hit rate, load throughput.
    *GLOBAL_ACCESS_METRICS,
    "l1tex__t_sector_hit_rate.pct",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second",
    *(f"{STALL_PREFIX}{reason}_per_issue_active.ratio" for reason in STALL_REASONS),
)
BANK_CONFLICT_METRICS = tuple(f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum" for op in ("ld", "st"))
LOCAL_MEMORY_METRICS = tuple(f"l1tex__t_bytes_pipe_lsu_mem_local_op_{op}.sum" for op in ("ld", "st"))

PROFILE_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("target", pa.string()), ("device_type", pa.string()),
    ("candidate_key", pa.string()), ("status", pa.string()), ("error_tail", pa.string()),
    ("launch", pa.int64()), ("kernel", pa.string()), ("metric", pa.string()), ("unit", pa.string()),
    ("value", pa.float64()),
])


@dataclass(frozen=True)
class MetricValue:
    launch: int  # ncu's launch ID within the process
    kernel: str
    metric: str
    unit: str
    value: float | None


@dataclass(frozen=True)
class Profile:
    candidate_key: str
    status: Status  # OK, or CRASHED/TIMEOUT when ncu itself failed
    values: tuple[MetricValue, ...] = ()
    error_tail: str = ""

    def metric(self, name: str) -> list[float]:
        return [v.value for v in self.values if v.metric == name and v.value is not None]

    def launched(self) -> frozenset[str]:
        """The kernels it saw launched, as the source names them (``kernel_name``)."""
        return frozenset(filter(None, (kernel_name(v.kernel) for v in self.values)))


def kernel_name(profiled: str) -> str:
    """A profiler's kernel name as the source names it: ``void ns::mm<32>(float *, int)`` -> ``mm``."""
    head = profiled.split("(", 1)[0].split("<", 1)[0].strip()
    return head.split()[-1].split("::")[-1] if head else ""


@dataclass(frozen=True)
class LaunchFilter:
    """Which kernel launches ncu profiles: ``count`` launches of each launch configuration (a
    kernel with its grid, block and shared memory: ncu's ``--filter-mode per-launch-config``)
    after skipping ``skip`` of each; ``per_config=False`` counts all launches together. ``count``
    None profiles every launch."""

    count: int | None = 1
    skip: int = 0
    per_config: bool = True

    def options(self) -> list[str]:
        if self.count is None and not self.skip:
            return []
        mode = ["--filter-mode", "per-launch-config"] if self.per_config else []
        count = ["--launch-count", str(self.count)] if self.count is not None else []
        return [*mode, "--launch-skip", str(self.skip), *count]


DEFAULT_LAUNCHES = LaunchFilter()


def ncu_prefix(metrics: tuple[str, ...] | list[str], launches: LaunchFilter = DEFAULT_LAUNCHES) -> list[str]:
    """The platform's profiler in front of a run (``Platform.profiler_prefix``: ncu on NVIDIA's)."""
    return node_platform().profiler_prefix(metrics, launches.options())


def ncu_command(run_argv: list[str], metrics: tuple[str, ...] | list[str],
                launches: LaunchFilter = DEFAULT_LAUNCHES) -> list[str]:
    return [*ncu_prefix(metrics, launches), *run_argv]


def parse_ncu_csv(text: str) -> list[MetricValue]:
    """Rows of ``ncu --csv`` (details page) from mixed program and ncu output."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    table = [line for line in lines[start:] if line.startswith('"')]
    values = []
    for row in csv.DictReader(io.StringIO("\n".join(table))):
        kernel = row.get("Kernel Name", "")
        if FLUSH_KERNEL in kernel or not row.get("Metric Name"):
            continue
        raw = (row.get("Metric Value") or "").replace(",", "")
        try:
            value: float | None = float(raw)
        except ValueError:
            value = None  # "n/a" and the like
        values.append(MetricValue(int(row.get("ID") or 0), kernel, row["Metric Name"],
                                  row.get("Metric Unit", ""), value))
    return values


def profile_candidate(target: Target, candidate: Candidate, binary: bytes, metrics: tuple[str, ...],
                      timeout: float, runner: Runner | None = None,
                      launches: LaunchFilter = DEFAULT_LAUNCHES) -> Profile:
    """Run the candidate once under ncu in its own scratch directory, profiling ``launches``."""
    runner = runner or ProcessRunner()
    with runner.stage(target, dict(candidate.params), candidate.arch, binary, prefix="ncu-") as staged:
        result = staged.run(Invocation(wrapper=tuple(ncu_prefix(metrics, launches)), env={"WARPFLEET_PROFILE": "1"},
                                       timeout=timeout))
        if not result.ok:
            status = Status.TIMEOUT if result.timed_out else Status.CRASHED
            return Profile(candidate.key, status, error_tail=result.tail())
        parsed = parse_ncu_csv(result.stdout)
        if not parsed:
            return Profile(candidate.key, Status.METRIC_MISSING, error_tail="no ncu rows\n" + result.tail())
        return Profile(candidate.key, Status.OK, tuple(parsed))


def top_stalls(profile: Profile, n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` largest warp stall reasons, summed over kernels (cycles per issued instruction)."""
    totals: dict[str, float] = {}
    for v in profile.values:
        if v.metric.startswith(STALL_PREFIX) and v.value is not None:
            reason = v.metric.removeprefix(STALL_PREFIX).removesuffix("_per_issue_active.ratio")
            totals[reason] = totals.get(reason, 0.0) + v.value
    return sorted(totals.items(), key=lambda kv: -kv[1])[:n]


def profile_records(run_id: str, target: str, device_type: str, profile: Profile) -> list[dict[str, object]]:
    """Rows of the ``profiles`` table (a study's: its target, its device type); a failed profile is
    one row with its status."""
    base = {"run_id": run_id, "target": target, "device_type": device_type,
            "candidate_key": profile.candidate_key, "status": profile.status.value,
            "error_tail": profile.error_tail}
    if not profile.values:
        return [{**base, "launch": None, "kernel": None, "metric": None, "unit": None, "value": None}]
    return [{**base, "launch": v.launch, "kernel": v.kernel, "metric": v.metric, "unit": v.unit, "value": v.value}
            for v in profile.values]
