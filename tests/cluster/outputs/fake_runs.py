"""Run directories written from given measurements, without running anything: what the readers of a
run (compare, report, export) see of a GPU sweep, on a machine with no GPU. Rows go through the
real ``make_row`` and ``ResultWriter``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cluster.config import Target
from cluster.core.types import (
    BuildArtifact,
    Candidate,
    DeviceInfo,
    KernelResources,
    Measurement,
    Phase,
    Scalar,
    Stats,
    Status,
    Telemetry,
)
from cluster.store.results import ResultWriter, make_row, results_schema


def gpu(name: str, compute_capability: str, accelerator: str = "") -> DeviceInfo:
    arch = "sm_" + compute_capability.replace(".", "")
    return DeviceInfo(kind="gpu", name=name, arch=arch, uuid=f"GPU-{name}", compute_capability=compute_capability,
                      accelerator_type=accelerator, driver_version="580.1", cuda_version="13.0", hostname="node")


@dataclass(frozen=True)
class Row:
    """One evaluated candidate: flags by name (unset ones may be left out), params, its samples."""

    params: dict[str, Scalar]
    samples: tuple[float, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)
    phase: Phase = Phase.SEARCH
    status: Status = Status.OK
    energy_j: float | None = None
    registers: int | None = None


def write_run(root: Path, run_id: str, target: Target, device: DeviceInfo, rows: list[Row], *,
              objective: str = "time", meta: dict | None = None, t0: float = 1_700_000_000.0) -> Path:
    """A run directory ``root/run_id`` holding ``rows`` for ``target`` on ``device``; the first
    baseline row is every row's baseline. Written again with another device, the run holds a
    study per device (a multi-architecture sweep)."""
    path = root / run_id
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "meta.json").exists():
        (path / "meta.json").write_text(json.dumps({"run_id": run_id, "targets": {target.name: target.bundle.hash},
                                                    **(meta or {})}))
    base = next((r for r in rows if r.phase is Phase.BASELINE), None)
    base_stats = Stats.of(base.samples) if base else None
    with ResultWriter(path, results_schema([target])) as writer:
        for i, row in enumerate(rows):
            flags = {name: row.flags.get(name, "") for name in target.space.flags}
            candidate = Candidate(target.name, target.spec.toolchain, device.device_type, device.arch,
                                  target.bundle.hash, tuple(flags.items()), tuple(row.params.items()), row.phase,
                                  trial_number=i if row.phase is Phase.SEARCH else None)
            kernels = (KernelResources("k", device.arch, registers=row.registers),) if row.registers else ()
            built = row.status not in (Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT)
            artifact = BuildArtifact(candidate.key, Status.OK if built else row.status, compile_s=1.5,
                                     kernels=kernels, binary_hash=f"bin{i}" if built else "",
                                     error_tail="" if built else "error: no")
            telemetry = Telemetry(row.energy_j, 300.0, 1980.0, 2619.0, 60.0) if row.energy_j is not None else None
            measurement = Measurement(candidate.key, row.status, device, tuple(row.samples), run_s=0.25,
                                      verify_s=0.05, queue_s=0.01, started_at=t0 + 10 * i,
                                      finished_at=t0 + 10 * i + 5, telemetry=telemetry) if built else None
            writer.append(make_row(run_id, candidate, artifact, measurement, base_stats.median if base_stats else None,
                                   target.spec.metric.goal, unit=target.spec.metric.unit, max_noise=0.05,
                                   objective=objective))
    return path


def relabel_device(run: Path, name: str) -> str:
    """Make a real run look as if it was measured on another machine: its devices renamed to
    ``name`` (keeping the arch), as another host's CPU would be. Returns the new device type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    device_type = ""
    for part in sorted((run / "results").glob("part-*.parquet")):
        table = pq.read_table(part)
        archs, targets = table.column("arch").to_pylist(), table.column("target").to_pylist()
        types = [f"{name} ({arch})" for arch in archs]
        device_type = types[0]
        for column, values in (("device_type", types), ("gpu_name", [name] * len(types)),
                               ("study", [f"{t}@{d}" for t, d in zip(targets, types, strict=True)])):
            table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, pa.string()))
        pq.write_table(table, part)
    return device_type
