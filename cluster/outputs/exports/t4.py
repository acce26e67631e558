"""One study's results in Kernel Tuner's T4 format (the open autotuning results schema, 1.0.0).

T4 describes one kernel tuned on one device, so a document holds the rows of one study
(``target@device_type``). Each evaluated candidate is one result (its baseline, search or
evaluate row; the final re-measurements are of candidates already listed):

- ``configuration``: the params by name, and each compiler flag as ``flag:<name>`` (the names
  the Optuna studies use), with its option ("" = not given);
- ``objectives``: what the study optimized (``time``, ``energy``, ``edp``, or both of
  ``time_energy``);
- ``times`` in milliseconds, as Kernel Tuner writes them: ``compilation``, ``benchmark`` (running
  the program), ``validation`` (checking its outputs), ``framework`` (waiting for a measuring
  worker), ``search_algorithm`` (not recorded per candidate: 0) and ``runtimes`` (every sample of
  the metric, in its unit);
- ``invalidity``: ``correct``, ``compile``, ``runtime``, ``correctness`` or ``timeout`` from the
  row's ``Status``; ``correctness`` 1 for a candidate whose outputs matched the baseline's, else 0;
- ``measurements``: the metric's median as ``time`` (in the metric's unit), its minimum and IQR,
  the speedup, NVML energy and power, and the ptxas registers, spills and shared memory.

The T4 metadata (``hardware``, ``environment.device_query``) rides along under ``metadata``, with
warpfleet's own identification of the study under ``metadata.warpfleet``.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import pandas as pd

from cluster.core.encodings import FLAG_PREFIX, PARAM_PREFIX
from cluster.core.types import Phase, Status
from cluster.outputs.exports._base import ExportError, ExportRequest

T4_VERSION = "1.0.0"

INVALIDITY = {
    Status.OK: "correct",
    Status.COMPILE_ERROR: "compile",
    Status.COMPILE_TIMEOUT: "timeout",
    Status.CRASHED: "runtime",
    Status.TIMEOUT: "timeout",
    Status.METRIC_MISSING: "runtime",
    Status.METRIC_INVALID: "runtime",
    Status.VERIFY_FAILED: "correctness",
    Status.TEST_FAILED: "correctness",
    Status.WORKER_LOST: "runtime",
    Status.QUARANTINED: "runtime",
    Status.TOO_MANY_FILES: "runtime",
    Status.CLOCK_MISMATCH: "correctness",  # its metric lies: what it printed is not what it took
}
OBJECTIVES = {"time": ["time"], "energy": ["energy"], "edp": ["edp"], "time_energy": ["time", "energy"]}
# (column, measurement name, unit; None: the metric's unit)
_MEASUREMENTS = (
    ("median", "time", None), ("min", "time_min", None), ("iqr", "time_iqr", None), ("speedup", "speedup", ""),
    ("energy_j", "energy", "J"), ("power_w", "power", "W"), ("registers", "registers", ""),
    ("spill_stores", "spill_stores", "B"), ("spill_loads", "spill_loads", "B"), ("shared_bytes", "shared_memory", "B"),
)
_DEVICE_COLUMNS = ("gpu_name", "compute_capability", "accelerator_type", "driver_version", "cuda_version",
                   "hostname")


def _value(value: Any) -> Any:
    """A JSON scalar: numpy to Python, NaN/NA to None."""
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _ms(seconds: Any) -> float:
    value = _value(seconds)
    return 0.0 if value is None else round(1000.0 * float(value), 6)


def _result(row: pd.Series) -> dict[str, Any]:
    status = Status(row["status"])
    configuration: dict[str, Any] = {}
    for column, value in row.items():
        name = str(column)
        if name.startswith(PARAM_PREFIX) and _value(value) is not None:
            configuration[name[len(PARAM_PREFIX):]] = _value(value)
    for column, value in row.items():
        name = str(column)
        if name.startswith(FLAG_PREFIX) and _value(value) is not None:
            configuration[f"flag:{name[len(FLAG_PREFIX):]}"] = str(value)  # T4's key for a compiler option
    measurements = []
    for column, name, unit in _MEASUREMENTS:
        value = _value(row.get(column))
        if value is not None:
            measurements.append({"name": name, "value": value, "unit": str(row["unit"]) if unit is None else unit})
    samples = row.get("samples")
    started = row.get("started_at")
    return {
        "timestamp": started.isoformat() if isinstance(started, datetime) and not pd.isna(started) else "",
        "configuration": configuration,
        "objectives": OBJECTIVES.get(str(row.get("objective") or "time"), ["time"]),
        "times": {
            "compilation": _ms(row.get("compile_s")),
            "benchmark": _ms(row.get("run_s")),
            "framework": _ms(row.get("queue_s")),
            "search_algorithm": 0.0,
            "validation": _ms(row.get("verify_s")),
            "runtimes": [float(s) for s in samples] if samples is not None else [],
        },
        "invalidity": INVALIDITY[status],
        "correctness": 1 if status is Status.OK else 0,
        "measurements": measurements,
    }


def t4_document(rows: pd.DataFrame) -> dict[str, Any]:
    """The T4 results document of one study's rows (one target on one device type)."""
    studies = rows[["target", "device_type"]].drop_duplicates()
    if len(studies) != 1:
        raise ValueError(f"a T4 document holds one target on one device type, not {len(studies)}")
    listed = rows[rows["phase"] != Phase.FINAL.value].drop_duplicates("candidate_key")
    first = rows.iloc[0]
    measured = rows[rows["gpu_name"].notna()]
    device = measured.iloc[0] if len(measured) else first
    return {
        "schema_version": T4_VERSION,
        "results": [_result(row) for _, row in listed.iterrows()],
        "metadata": {
            "environment": {"device_query": {c: _value(device.get(c)) for c in _DEVICE_COLUMNS}},
            "warpfleet": {k: str(first[k]) for k in ("run_id", "target", "device_type", "arch", "toolchain",
                                                     "unit", "goal")},
        },
    }


def t4(request: ExportRequest) -> str:
    """One study's results (one target on one device); several need --target and --device."""
    best = request.best
    if len(best) > 1:
        studies = ", ".join(f"{b.target} on {b.device_type}" for b in best)
        raise ExportError(f"t4 holds one target on one device; choose with --target and --device among: {studies}")
    rows = request.rows
    study = rows[(rows["target"] == best[0].target) & (rows["device_type"] == best[0].device_type)]
    return json.dumps(t4_document(study), indent=1, allow_nan=False) + "\n"
