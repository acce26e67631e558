"""The run's results: one Parquet row per evaluated candidate, under ``<run_dir>/results/``.

The dataset is a folder of part files, ``part-<NNNNNN>-<8 hex>.parquet``, all with the same
schema (built per run from its targets by ``results_schema``), so that each of these reads the
whole run, though each takes the first part's schema for every part::

    pandas.read_parquet(run_dir / "results")
    pyarrow.dataset.dataset(run_dir / "results", format="parquet")
    duckdb: SELECT * FROM read_parquet('<run_dir>/results/*.parquet')

(the rows of studies that a resume with ``--accept-changes`` superseded included: their
``generation`` is below their target's in meta.json; ``read_results`` leaves them out).

A flush writes a part whole or not at all (``cluster.store.parts``: a temporary file renamed into
place), and when the schema widens (an agent's variant brings params of its own, a resume adds
targets) the writer rewrites the earlier parts to it, first part first, so that every part keeps
one schema. A flush that cannot start a thread (a machine out of processes: pyarrow's "Failed to
launch worker thread") waits and tries again, keeping its rows. A part damaged afterwards
(truncated, zeroed, empty) is named by the readers in one line, and ``cluster.store.check.check_run``
(``warpfleet check RUN``) moves it to ``<run>/quarantine/``, after which a resume runs the points
whose rows it held again.

=====================  ====================  ======================================================
column                 type                  meaning
=====================  ====================  ======================================================
schema_version         int32                 ``SCHEMA_VERSION`` of the writer
run_id                 string                the run this row belongs to
phase                  string                baseline, search or final (``Phase``)
target                 string                target name
study                  string                ``<target>@<device_type>``: one Optuna study (``#N`` after
                                             it from its target's generation 2 on)
generation             int64, null           the target's study generation: 1, then one more for each
                                             resume that accepted a change of the target
                                             (``--accept-changes``); null in rows of schema 1: 1
device_type            string                ``<gpu name> (<arch>)``; workers of one type share a study
arch                   string                what it was built for: ``sm_90``, ``host``
toolchain              string                nvcc, cc, ...
trial_number           int64, null           Optuna trial; null for baseline/final/agent rows
candidate_key          string                hash of sources, toolchain, arch, flags, defines
source_hash            string                hash of the target's source bundle
binary_hash            string                hash of the built binary ("" when the build failed)
flags                  string                the flag argv, shell-quoted, for humans
defines                string                the ``-DNAME=value`` argv, shell-quoted
f_<flag>               string, null          chosen option per flag of the run's spaces ("" = unset;
                                             null when the flag is not in this target's space)
p_<param>              int64/float64/string  value per param of the run's targets (int64 if every
                                             value in every target is an int, float64 if all are
                                             numbers, else string); null when not this target's
status                 string                ``Status``: ok, compile_error, verify_failed, ...
error_tail             string                the end of the failing step's output ("" when ok)
compile_s              float64               build wall time
queue_s                float64, null         time waiting for a measuring worker
run_s                  float64, null         time running the program (all repetitions)
verify_s               float64, null         time checking outputs
registers              int64, null           max registers per thread over the kernels
spill_stores           int64, null           spill store bytes, summed over the kernels
spill_loads            int64, null           spill load bytes, summed over the kernels
shared_bytes           int64, null           max static shared memory over the kernels
stack_bytes            int64, null           max stack frame over the kernels
kernels_json           string                per-kernel ``KernelResources`` as a JSON list
samples                list<double>, null    every sample of the metric
n_samples              int64                 number of samples (0 when none)
median                 float64, null         median of the samples
min                    float64, null         smallest sample
iqr                    float64, null         interquartile range of the samples
rel_noise              float64, null         iqr / median
speedup                float64, null         over the baseline's median, >1 is better whatever the
                                             goal; null unless status is ok. A final row's is over
                                             the baseline's final median (its re-measurement), as
                                             show and export give a winner's; an evaluate row's
                                             over that evaluation's baseline; others over the
                                             baseline row's
unit                   string                the metric's unit (ms, GFLOP/s, ...)
goal                   string                minimize or maximize: which way is better
objective              string                what the search optimized: time, energy, edp, time_energy
noisy                  bool, null            rel_noise above measure.max_noise (the bound never met)
raced                  bool, null            stopped sampling early, clearly slower than the study's
                                             best (measure.race); null when not measured
energy_j               float64, null         NVML energy per timed sample (over the harness's timed
                                             region when marked, else the whole run / samples)
power_w                float64, null         mean board power over that region
sm_clock_mhz           float64, null         median SM clock (read, never set)
mem_clock_mhz          float64, null         median memory clock
temperature_c          float64, null         max GPU temperature
throttle_reasons       string, null          NVML clock event reasons seen, comma-separated
gpu_name               string, null          measuring device's name; null when never measured
gpu_uuid               string, null          its UUID
compute_capability     string, null          e.g. ``9.0``
accelerator_type       string, null          Ray accelerator type, e.g. ``H100``
driver_version         string, null          NVIDIA driver version
cuda_version           string, null          CUDA version
node_id                string, null          Ray node id
hostname               string, null          host of the measuring worker
worker_id              string, null          measuring actor
started_at             timestamp[us, UTC]    when the measurement started; null when not measured
finished_at            timestamp[us, UTC]    when it finished
=====================  ====================  ======================================================
"""

from __future__ import annotations

import contextlib
import errno
import json
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from cluster.config import Target
from cluster.core.encodings import speedup
from cluster.core.errors import ConfigError
from cluster.core.types import BuildArtifact, Candidate, Measurement, Phase, Scalar, Status
from cluster.store.parts import fsync_dir, part_files, remove_temporary, unify_parts, widened_schema, write_atomically
from cluster.store.rundir import RunDir, read_generations

SCHEMA_VERSION = 2  # 2: the generation column
RESULTS_DIR = RunDir.RESULTS

_LEADING: tuple[tuple[str, pa.DataType], ...] = (
    ("schema_version", pa.int32()), ("run_id", pa.string()), ("phase", pa.string()),
    ("target", pa.string()), ("study", pa.string()), ("generation", pa.int64()), ("device_type", pa.string()),
    ("arch", pa.string()), ("toolchain", pa.string()), ("trial_number", pa.int64()),
    ("candidate_key", pa.string()), ("source_hash", pa.string()), ("binary_hash", pa.string()),
    ("flags", pa.string()), ("defines", pa.string()),
)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_SAMPLES = pa.list_(pa.field("element", pa.float64()))  # the item name Parquet reads back
_TRAILING: tuple[tuple[str, pa.DataType], ...] = (
    ("status", pa.string()), ("error_tail", pa.string()), ("compile_s", pa.float64()),
    ("queue_s", pa.float64()), ("run_s", pa.float64()), ("verify_s", pa.float64()),
    ("registers", pa.int64()), ("spill_stores", pa.int64()), ("spill_loads", pa.int64()),
    ("shared_bytes", pa.int64()), ("stack_bytes", pa.int64()), ("kernels_json", pa.string()),
    ("samples", _SAMPLES), ("n_samples", pa.int64()), ("median", pa.float64()),
    ("min", pa.float64()), ("iqr", pa.float64()), ("rel_noise", pa.float64()),
    ("speedup", pa.float64()), ("unit", pa.string()), ("goal", pa.string()), ("objective", pa.string()),
    ("noisy", pa.bool_()), ("raced", pa.bool_()),
    ("energy_j", pa.float64()), ("power_w", pa.float64()), ("sm_clock_mhz", pa.float64()),
    ("mem_clock_mhz", pa.float64()), ("temperature_c", pa.float64()), ("throttle_reasons", pa.string()),
    ("gpu_name", pa.string()),
    ("gpu_uuid", pa.string()), ("compute_capability", pa.string()), ("accelerator_type", pa.string()),
    ("driver_version", pa.string()), ("cuda_version", pa.string()), ("node_id", pa.string()),
    ("hostname", pa.string()), ("worker_id", pa.string()), ("started_at", _TIMESTAMP),
    ("finished_at", _TIMESTAMP),
)


@dataclass(frozen=True)
class ResultRow:
    """One evaluated candidate, as written. Fields are the columns, except ``flag_options`` and
    ``params``, which become the ``f_<flag>`` and ``p_<param>`` columns."""

    run_id: str
    phase: str
    target: str
    study: str
    generation: int
    device_type: str
    arch: str
    toolchain: str
    trial_number: int | None
    candidate_key: str
    source_hash: str
    binary_hash: str
    flags: str
    defines: str
    flag_options: tuple[tuple[str, str], ...]
    params: tuple[tuple[str, Scalar], ...]
    status: str
    error_tail: str
    compile_s: float
    queue_s: float | None
    run_s: float | None
    verify_s: float | None
    registers: int | None
    spill_stores: int | None
    spill_loads: int | None
    shared_bytes: int | None
    stack_bytes: int | None
    kernels_json: str
    samples: tuple[float, ...] | None
    n_samples: int
    median: float | None
    min: float | None
    iqr: float | None
    rel_noise: float | None
    speedup: float | None
    unit: str
    goal: str
    objective: str
    noisy: bool | None
    raced: bool | None
    energy_j: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None
    throttle_reasons: str | None
    gpu_name: str | None
    gpu_uuid: str | None
    compute_capability: str | None
    accelerator_type: str | None
    driver_version: str | None
    cuda_version: str | None
    node_id: str | None
    hostname: str | None
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None



def _timestamp(epoch_s: float) -> datetime | None:
    return datetime.fromtimestamp(epoch_s, tz=UTC) if epoch_s else None


def make_row(run_id: str, candidate: Candidate, artifact: BuildArtifact, measurement: Measurement | None,
             baseline_median: float | None, goal: str, *, unit: str = "", max_noise: float | None = None,
             objective: str = "time") -> ResultRow:
    """The row for one candidate. ``measurement`` is None when the build failed; the status then
    comes from the artifact. Speedup is only given for an ``ok`` row with a known baseline."""
    if measurement is None or artifact.status is not Status.OK:
        status, error_tail = artifact.status, artifact.error_tail
    else:
        status, error_tail = measurement.status, measurement.error_tail or artifact.error_tail
    stats = measurement.stats if measurement else None
    median = stats.median if stats else None
    ratio = speedup(median, baseline_median, goal) if status is Status.OK else None
    kernels = artifact.kernels
    device = measurement.device if measurement else None
    tele = measurement.telemetry if measurement else None
    return ResultRow(
        run_id=run_id, phase=Phase(candidate.phase).value, target=candidate.target, study=candidate.study,
        generation=candidate.generation, device_type=candidate.device_type, arch=candidate.arch,
        toolchain=candidate.toolchain,
        trial_number=candidate.trial_number, candidate_key=candidate.key,
        source_hash=candidate.source_hash, binary_hash=artifact.binary_hash,
        flags=shlex.join(candidate.flag_argv), defines=shlex.join(candidate.defines),
        flag_options=candidate.flags, params=candidate.params,
        status=status.value, error_tail=error_tail, compile_s=artifact.compile_s,
        queue_s=measurement.queue_s if measurement else None,
        run_s=measurement.run_s if measurement else None,
        verify_s=measurement.verify_s if measurement else None,
        registers=max(k.registers for k in kernels) if kernels else None,
        spill_stores=sum(k.spill_stores for k in kernels) if kernels else None,
        spill_loads=sum(k.spill_loads for k in kernels) if kernels else None,
        shared_bytes=max(k.shared_bytes for k in kernels) if kernels else None,
        stack_bytes=max(k.stack_bytes for k in kernels) if kernels else None,
        kernels_json=json.dumps([asdict(k) for k in kernels], sort_keys=True),
        samples=tuple(measurement.samples) if measurement else None,
        n_samples=len(measurement.samples) if measurement else 0,
        median=median, min=stats.minimum if stats else None, iqr=stats.iqr if stats else None,
        rel_noise=stats.rel_noise if stats else None, speedup=ratio, unit=unit, goal=goal, objective=objective,
        noisy=stats.rel_noise > max_noise if stats and max_noise is not None else None,
        raced=measurement.raced if measurement else None,
        energy_j=tele.energy_j if tele else None, power_w=tele.power_w if tele else None,
        sm_clock_mhz=tele.sm_clock_mhz if tele else None, mem_clock_mhz=tele.mem_clock_mhz if tele else None,
        temperature_c=tele.temperature_c if tele else None,
        throttle_reasons=tele.throttle_reasons if tele else None,
        gpu_name=device.name if device else None, gpu_uuid=device.uuid if device else None,
        compute_capability=device.compute_capability if device else None,
        accelerator_type=device.accelerator_type if device else None,
        driver_version=device.driver_version if device else None,
        cuda_version=device.cuda_version if device else None,
        node_id=device.node_id if device else None, hostname=device.hostname if device else None,
        worker_id=device.worker_id if device else None,
        started_at=_timestamp(measurement.started_at) if measurement else None,
        finished_at=_timestamp(measurement.finished_at) if measurement else None,
    )


def _param_type(values: list[Any]) -> pa.DataType:
    # bool is an int to Python but "True" to a -D define: treat it as a string.
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return pa.float64()
    return pa.string()


def results_schema(targets: Sequence[Target]) -> pa.Schema:
    """The one schema of a run's part files: fixed columns plus ``f_<flag>`` for every flag of
    the targets' spaces and ``p_<param>`` for every param (in order of first appearance)."""
    flag_names: dict[str, None] = {}
    param_values: dict[str, list[Any]] = {}
    for target in targets:
        flag_names.update(dict.fromkeys(target.space.flags))
        for name, values in target.spec.params.items():
            param_values.setdefault(name, []).extend(values)
    columns = [
        *_LEADING,
        *((f"f_{name}", pa.string()) for name in flag_names),
        *((f"p_{name}", _param_type(values)) for name, values in param_values.items()),
        *_TRAILING,
    ]
    return pa.schema(columns, metadata={"warpfleet.schema_version": str(SCHEMA_VERSION)})


def _convert(value: Scalar, kind: pa.DataType, column: str) -> Scalar:
    if pa.types.is_string(kind):
        return str(value)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if pa.types.is_int64(kind) and numeric and float(value).is_integer():
        return int(value)
    if pa.types.is_float64(kind) and numeric:
        return float(value)
    raise ValueError(f"column {column} holds {kind}, not {value!r}")


def _record(row: ResultRow, schema: pa.Schema) -> dict[str, Any]:
    """The row as a dict of the schema's columns, param values converted to the column's type."""
    record: dict[str, Any] = {f.name: getattr(row, f.name) for f in fields(row)
                              if f.name not in ("flag_options", "params")}
    record["schema_version"] = SCHEMA_VERSION
    for name, option in row.flag_options:
        record[f"f_{name}"] = option
    for name, value in row.params:
        column = f"p_{name}"
        if column in schema.names:
            record[column] = _convert(value, schema.field(column).type, column)
        else:
            record[column] = value
    unknown = set(record) - set(schema.names)
    if unknown:
        raise ValueError(f"row of {row.target} has columns the run's schema lacks: {sorted(unknown)}")
    return record


FLUSH_RETRY_S = 60.0  # how long a flush waits for the machine to let it start a thread


def _out_of_threads(exc: BaseException) -> bool:
    """A thread (or process) could not be started: EAGAIN, or pyarrow's and Python's words for it."""
    if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
        return True
    text = str(exc).lower()
    return isinstance(exc, pa.ArrowException | RuntimeError | OSError | MemoryError) and (
        "thread" in text or "resource temporarily unavailable" in text)


def _fewer_threads() -> None:
    """From now on pyarrow runs its work on as few threads as it can: each one is a process slot."""
    with contextlib.suppress(Exception):
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)


class ResultWriter:
    """Appends rows to ``<run_dir>/results/`` as atomically written part files.

    One writer per run directory. Part numbers continue after any parts already there, so a
    resumed run appends; temporary files left by an interrupted flush are removed on start.
    """

    def __init__(self, run_dir: Path, schema: pa.Schema, flush_interval_s: float = 2.0,
                 subdir: str = RESULTS_DIR) -> None:
        self.results_dir = Path(run_dir) / subdir
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.flush_interval_s = flush_interval_s
        remove_temporary(self.results_dir)
        self.schema = unify_parts(self.results_dir, schema)
        parts = part_files(self.results_dir)
        self._next_part = max((int(p.name[5:11]) for p in parts), default=-1) + 1
        self.written = 0  # rows appended through this writer
        self._pending: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._closed = False

    @property
    def pending(self) -> int:
        """Rows appended but not yet written."""
        return len(self._pending)

    def append(self, row: ResultRow) -> dict[str, Any]:
        """Queue a row; returns it as the record written (its columns). Raises ValueError at once
        if it does not fit the run's schema."""
        if self._closed:
            raise ValueError("append to a closed ResultWriter")
        record = _record(row, self.schema)
        self._pending.append(record)
        self.written += 1
        return record

    def append_record(self, record: dict[str, Any]) -> None:
        """Queue a plain record of this writer's schema (tables other than the results)."""
        if self._closed:
            raise ValueError("append to a closed ResultWriter")
        self._pending.append(record)

    def widen(self, schema: pa.Schema) -> None:
        """Write what is pending, then take ``schema`` (a superset: agents' variants add params)
        and rewrite the parts written so far to it (``unify_parts``): readers that take the first
        part's schema for all of them (pandas, pyarrow.dataset, DuckDB) see every column."""
        self.flush()
        self.schema = unify_parts(self.results_dir, schema)

    def maybe_flush(self) -> Path | None:
        """Flush if rows are pending and ``flush_interval_s`` has passed since the last flush."""
        if self._pending and time.monotonic() - self._last_flush >= self.flush_interval_s:
            return self.flush()
        return None

    def flush(self) -> Path | None:
        """Write the pending rows as a new part file; returns its path (None if nothing pending).

        A failure to start a thread is waited out (``FLUSH_RETRY_S``, doubling waits, pyarrow
        told to use one thread from then on). If the write still fails, the rows stay pending and
        the error propagates; no partial part file is left where readers look.
        """
        if not self._pending:
            return None
        wait = 0.05
        deadline = time.monotonic() + FLUSH_RETRY_S
        while True:
            try:
                final = self._write_part()
                break
            except Exception as exc:
                if not _out_of_threads(exc) or time.monotonic() + wait > deadline:
                    raise
                _fewer_threads()
                time.sleep(wait)
                wait = min(2 * wait, 2.0)
        fsync_dir(self.results_dir)
        self._next_part += 1
        self._pending.clear()
        self._last_flush = time.monotonic()
        return final

    def _write_part(self) -> Path:
        table = pa.Table.from_pylist(self._pending, schema=self.schema)
        final = self.results_dir / f"part-{self._next_part:06d}-{secrets.token_hex(4)}.parquet"
        write_atomically(table, final)
        return final

    def close(self) -> None:
        """Flush what is pending; later appends raise."""
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Rows already appended are valid results, so they are written even if the run failed.
        self.close()


def _base_schema() -> pa.Schema:
    return pa.schema([*_LEADING, *_TRAILING])


# The columns that every part of a table has, each a string: a Parquet file without one of them (a
# part of another table, another program's file copied in) is no part of it. Read with the others it
# would be rows of nulls that every reader drops, unseen; readers and `warpfleet check` name it.
IDENTITY_COLUMNS: dict[str, tuple[str, ...]] = {
    RunDir.RESULTS: ("run_id", "phase", "target", "study", "candidate_key", "status"),
    RunDir.PROFILES: ("run_id", "target", "candidate_key", "metric"),
    RunDir.VARIANTS: ("run_id", "target", "study", "source_hash", "optimization", "stage"),
    RunDir.REVIEWS: ("run_id", "study", "candidate_key", "status"),
}


def schema_problem(schema: pa.Schema, table: str) -> str:
    """Why a file of ``schema`` is no part of ``table`` ("" when it can be): a column every part of
    the table has is missing, or is not text."""
    for name in IDENTITY_COLUMNS.get(table, ()):
        if name not in schema.names:
            return f"another table's schema: no column {name}"
        kind = schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return f"another table's schema: column {name} is {kind}, not string"
    return ""


def _dataset(run_dir: Path, subdir: str = RESULTS_DIR) -> ds.Dataset | None:
    parts = part_files(Path(run_dir) / subdir)
    if not parts:
        return None
    schemas = []
    for part in parts:
        try:
            schemas.append(pq.read_schema(part))
        except (OSError, pa.ArrowException) as exc:
            raise bad_part(part, _first_line(exc)) from None
        if problem := schema_problem(schemas[-1], subdir):
            raise bad_part(part, problem)
    # Parts of several schemas: a run written before parts were unified, or a rewrite cut short.
    schema = widened_schema(schemas[0], schemas[1:])
    return ds.dataset([str(p) for p in parts], schema=schema, format="parquet")


def bad_part(part: Path, problem: str) -> ConfigError:
    """The one line that names a damaged part (or a file of another schema) and what to do about it."""
    return ConfigError(part, "", f"not a readable Parquet part ({problem}); `warpfleet check "
                       f"{part.parent.parent}` moves it aside, and a resume runs its rows again")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


def _to_table(dataset: ds.Dataset, **scan: Any) -> pa.Table:
    """The dataset's rows; a part whose footer reads but whose data does not is named, one line."""
    try:
        return dataset.to_table(**scan)
    except (OSError, pa.ArrowException):
        for part in dataset.files:
            problem = part_problem(Path(part))
            if problem:
                raise bad_part(Path(part), problem) from None
        raise


def read_results(run_dir: Path, schema: pa.Schema | None = None, superseded: bool = False) -> pd.DataFrame:
    """Every row of the run, part by part, but those of superseded studies (a target's generations
    before its current one, meta.json ``generations``) unless ``superseded``. With no parts, an
    empty frame with the columns of ``schema`` (default: the fixed columns, without
    ``f_``/``p_``). A damaged part is a ConfigError naming it."""
    dataset = _dataset(run_dir)
    table = (schema or _base_schema()).empty_table() if dataset is None else _to_table(dataset)
    # Nullable integers: an int param that another target lacks must stay 16, not become 16.0.
    rows = table.to_pandas(types_mapper=_NULLABLE.get)
    return rows if superseded else current_rows(rows, read_generations(run_dir))


def current_rows(rows: pd.DataFrame, generations: Mapping[str, int]) -> pd.DataFrame:
    """The rows of each target's current study generation (``generations``: above 1 only)."""
    if not generations or rows.empty:
        return rows
    # Rows of schema 1 (no column) and their nulls beside later parts: the first generation.
    generation = rows["generation"].fillna(1).astype(int) if "generation" in rows else pd.Series(1, index=rows.index)
    wanted = rows["target"].map(lambda target: generations.get(str(target), 1))
    return rows[generation == wanted]


_NULLABLE = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}


def read_table(run_dir: Path, subdir: str, schema: pa.Schema) -> pd.DataFrame:
    """Another table of the run (``profiles``), read like the results."""
    dataset = _dataset(run_dir, subdir)
    table = schema.empty_table() if dataset is None else _to_table(dataset)
    return table.to_pandas(types_mapper=_NULLABLE.get)


def part_problem(part: Path) -> str:
    """Why ``part`` cannot be read whole as a part of its table, the folder it is in ("" when it
    can): its footer, every page, and a schema of that table (``schema_problem``)."""
    try:
        table = pq.read_table(part, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        return _first_line(exc)
    return schema_problem(table.schema, part.parent.name)


def read_keys(run_dir: Path) -> set[str]:
    """Candidate keys already evaluated in the search or baseline phase: what a resume skips."""
    dataset = _dataset(run_dir)
    if dataset is None:
        return set()
    phases = pa.array([Phase.SEARCH.value, Phase.BASELINE.value])
    table = _to_table(dataset, columns=["candidate_key"], filter=pc.field("phase").isin(phases))
    return set(table.column("candidate_key").to_pylist())
