"""Cross-evaluation: configurations tuned elsewhere, measured on the devices at hand.

    export file or run directory ─► Origin ─► Candidate per device type here ─► Scheduler ─► rows

Each configuration is rebuilt for the arch of each device type present (``sm_80`` on an A100)
and measured with ``measure.final_runs`` runs, after the target's baseline, which is measured
again in the same run: its outputs verify the configurations and its time is what their
speedups are over, so that runs from other clusters or days compare on this card. The result is
an ordinary run directory (rows of phase ``evaluate``, and the baseline's) whose ``meta.json``
lists where each configuration was tuned (``evaluated``), for ``warpfleet compare``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from cluster.config import RunConfig, RunPlan, Target, load_run
from cluster.core.encodings import flag_column
from cluster.core.errors import ConfigError
from cluster.core.types import Candidate, DeviceInfo, Measurement, Phase, Scalar, Status
from cluster.engine.driver import init_ray, run_flows
from cluster.engine.flow import Flow, Stage
from cluster.engine.progress import EvaluationProgress
from cluster.engine.scheduling.jobs import BaselineBuild, Build, Job, JobKind, JobResult
from cluster.engine.scheduling.scheduler import Scheduler
from cluster.engine.scheduling.workers import start_fleet, stop_fleet
from cluster.measure.measure import Reference
from cluster.store.results import ResultWriter, make_row, read_results, results_schema
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from cluster.store.variants import stored_variant
from cluster.toolchains import get_toolchain

log = logging.getLogger(f"warpfleet.{__name__}")


@dataclass(frozen=True)
class Origin:
    """A configuration to evaluate, and where it was tuned."""

    target: str
    flags: tuple[tuple[str, str], ...]  # (flag name, option); names of the space it was tuned in
    params: tuple[tuple[str, Scalar], ...]
    tuned_on: str = ""  # the device type it was selected on
    run_id: str = ""  # the run it was selected in ("" when read from an export file)
    source_hash: str = ""  # of the sources it was tuned with ("" when the export predates it)
    run_path: str = ""  # the run directory it came from: an agent's variant is rebuilt from its stored sources

    def source(self, target: Target) -> Target | None:
        """The sources it builds: the target's own, an agent's variant stored by its run, or None
        when neither has its source hash (the sources changed since it was tuned)."""
        if not self.source_hash or self.source_hash == target.bundle.hash:
            return target
        return stored_variant(Path(self.run_path), target, self.source_hash) if self.run_path else None


class _Record(BaseModel):
    """One record of ``warpfleet export --format json|yaml``: the fields evaluate needs."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    target: str
    device_type: str = ""
    flags: dict[str, str] = {}
    params: dict[str, int | float | str] = {}
    source_hash: str = ""


def origins_from_export(path: Path) -> list[Origin]:
    """The configurations of an export file (JSON or YAML records); a one-line error if it is
    not one."""
    try:
        data = yaml.safe_load(path.read_text())  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(path, "", f"cannot be read as an export file ({type(exc).__name__})") from None
    if not isinstance(data, list) or not data:
        raise ConfigError(path, "", "not an export file (a list of records from warpfleet export --format json)")
    origins = []
    for i, item in enumerate(data):
        try:
            record = _Record.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            raise ConfigError(path, f"[{i}]{where}", err["msg"]) from None
        origins.append(Origin(record.target, tuple(record.flags.items()), tuple(record.params.items()),
                              record.device_type, "", record.source_hash))
    return origins


def origins_from_run(path: Path) -> list[Origin]:
    """The winners of a run directory, one per (target, device type)."""
    run_dir = RunDir.open(path)
    best = select_best(read_results(run_dir.path))
    if not best:
        raise ConfigError(path, "results", "no correct candidate to evaluate")
    return [Origin(b.target, tuple(b.flags.items()), tuple(b.params.items()), b.device_type, run_dir.run_id,
                   b.source_hash, str(run_dir.path.resolve())) for b in best]


def load_origins(source: str) -> tuple[list[Origin], str | None]:
    """The configurations of a run directory or an export file, and the run's config file (the
    targets' sources) where the source is a run directory."""
    path = Path(source)
    if path.is_dir():
        meta = json.loads((path / RunDir.META).read_text()) if (path / RunDir.META).is_file() else {}
        return origins_from_run(path), meta.get("config_file")
    if not path.is_file():
        raise ConfigError(path, "", "neither a run directory nor an export file")
    return origins_from_export(path), None


def check_origins(origins: list[Origin], plan: RunPlan, source: str) -> list[Origin]:
    """Each origin against the plan's targets: known target, params and values, unchanged sources;
    params in the target's order (the order its sweep defined them in)."""
    targets = {t.name: t for t in plan.targets}
    checked = []
    for i, origin in enumerate(origins):
        target = targets.get(origin.target)
        if target is None:
            raise ConfigError(source, f"[{i}].target", f"{origin.target!r} is not a target of {plan.file}")
        built = origin.source(target)
        if built is None:
            raise ConfigError(source, f"[{i}].source_hash", f"the sources of {origin.target} changed since it was "
                              f"tuned ({origin.source_hash}, now {target.bundle.hash}), and no agent's variant "
                              f"of that hash is stored in its run")
        params = dict(origin.params)
        unknown = sorted(set(params) - set(built.spec.params))
        if unknown:
            raise ConfigError(source, f"[{i}].params.{unknown[0]}", f"is not a param of target {origin.target}")
        for name, value in params.items():
            if value not in built.spec.params[name]:  # a value of another space: a column of another type
                raise ConfigError(source, f"[{i}].params.{name}", f"{value!r} is not one of the target's values")
        ordered = tuple((name, params[name]) for name in built.spec.params if name in params)
        checked.append(dataclasses.replace(origin, params=ordered))
    return checked


def plan_for(sources: list[str], config: str | None) -> tuple[RunPlan, list[Origin]]:
    """The run config (``config``, else the first run directory's) and every source's checked
    configurations, duplicates removed."""
    loaded = [(source, *load_origins(source)) for source in sources]
    config_file = config or next((c for _, _, c in loaded if c), None)
    if config_file is None:
        raise ConfigError(sources[0], "--config", "name the run config whose targets these configurations are of")
    plan = load_run(config_file)
    origins: dict[tuple[Any, ...], Origin] = {}
    for source, found, _ in loaded:
        for origin in check_origins(found, plan, source):
            key = (origin.target, origin.flags, origin.params, origin.tuned_on)
            if key not in origins or not origins[key].run_id:  # the one that names its run
                origins[key] = origin
    return plan, list(origins.values())


@dataclass(frozen=True)
class EvaluationSummary:
    run_dir: Path
    rows: int
    skipped: tuple[str, ...]


class Evaluation:
    """Measures ``origins`` on every device type present that their toolchains run on: the same
    scheduler and loop as a sweep, with a flow per study of baseline ─► configurations."""

    def __init__(self, plan: RunPlan, origins: list[Origin], run_dir: RunDir, runs: int | None = None) -> None:
        self.plan, self.origins, self.run_dir = plan, origins, run_dir
        self.runs = runs or plan.config.measure.final_runs
        self.skipped: list[str] = []

    def run(self, address: str | None = None, show_progress: bool = False) -> EvaluationSummary:
        config = self.plan.config
        init_ray(address or config.cluster.address)
        targets = [t for t in self.plan.targets if any(o.target == t.name for o in self.origins)]
        kinds = {get_toolchain(t.spec.toolchain).device_kind for t in targets}
        workers, devices, left_out = start_fleet(config.cluster, kinds, self.plan.file)
        try:
            return self._run(config, targets, workers, devices, left_out, show_progress)
        finally:
            stop_fleet(workers)

    def _run(self, config: RunConfig, targets: list[Target], workers: list[ray.actor.ActorHandle],
             devices: list[DeviceInfo], left_out: list[str], show_progress: bool) -> EvaluationSummary:
        self.skipped += left_out
        groups: dict[str, list[int]] = defaultdict(list)
        for i, device in enumerate(devices):
            groups[device.device_type].append(i)
        slots = config.cluster.compile_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        scheduler = Scheduler(workers, devices, config.cluster.inflight_per_worker, slots,
                              config.cluster.max_attempts)
        with ResultWriter(self.run_dir.path, self._schema(targets), config.flush_interval_s) as writer:
            flows = [EvaluationFlow(study, scheduler, writer, self.run_dir.run_id, config, self.runs)
                     for study in self._studies(targets, devices, groups)]
            with EvaluationProgress(flows, enabled=show_progress) as progress:
                run_flows(flows, scheduler, writer, on_job=progress.measured)
        self.skipped += [f"{f.name}: its baseline failed; nothing evaluated" for f in flows if f.stage is Stage.FAILED]
        for reason in self.skipped:
            log.info(f"skipped {reason}")
        return EvaluationSummary(self.run_dir.path, writer.written, tuple(self.skipped))

    def _studies(self, targets: list[Target], devices: list[DeviceInfo],
                 groups: dict[str, list[int]]) -> list[_Study]:
        studies = []
        for target in targets:
            toolchain = get_toolchain(target.spec.toolchain)
            matching = [idx for idx in groups.values() if devices[idx[0]].kind == toolchain.device_kind]
            if not matching:
                self.skipped.append(f"{target.name}: no {toolchain.device_kind.upper()} worker in the cluster")
            origins = [o for o in self.origins if o.target == target.name]
            for indices in matching:
                studies.append(_Study(target, ray.put(target), devices[indices[0]], indices,
                                      toolchain.arch_for(devices[indices[0]]), origins))
        return studies

    def _schema(self, targets: list[Target]) -> pa.Schema:
        """The run's schema, with a column for every flag of the spaces the origins were tuned in."""
        schema = results_schema(targets)
        for origin in self.origins:
            for name, _ in origin.flags:
                if flag_column(name) not in schema.names:
                    schema = schema.insert(schema.get_field_index("status"), pa.field(flag_column(name), pa.string()))
        return schema


class EvaluationFlow(Flow):
    """One target on one device type of an evaluation: its baseline, then every configuration."""

    def __init__(self, study: _Study, scheduler: Scheduler, writer: ResultWriter, run_id: str, config: RunConfig,
                 runs: int) -> None:
        super().__init__(study.name, study.device.device_type)
        self.study, self.scheduler, self.writer, self.run_id, self.config, self.runs = (
            study, scheduler, writer, run_id, config, runs)
        self.awaited: set[int] = set()
        self.started = False

    def step(self) -> None:
        if not self.started:
            self.started = True
            self._submit(Build(self.study.target, self.study.target_ref, self.study.baseline), None)
        elif self.stage is Stage.FINAL and not self.awaited:
            self.stage = Stage.DONE

    def _submit(self, build: Build, reference: ray.ObjectRef | None) -> None:
        study = self.study
        kind = JobKind.BASELINE if reference is None else JobKind.EVALUATE
        job = Job(kind, study.name, study.workers, study.device, (build,), runs=self.runs, reference=reference,
                  baseline=study.baseline_build)
        self.awaited.add(job.seq)
        self.scheduler.submit(job)

    def on_result(self, result: JobResult) -> None:
        study, job = self.study, result.job
        self.awaited.discard(job.seq)
        measurement = result.measurement
        if measurement is None and result.failure is not None:
            measurement = Measurement(job.candidate.key, result.failure, job.device, error_tail=result.error)
        stats = measurement.stats if measurement else None
        if job.kind is JobKind.BASELINE and measurement and measurement.status is Status.OK and stats:
            study.reference = ray.put(Reference(measurement.outputs, measurement.clock))
            study.baseline_median = stats.median
            study.baseline_build = BaselineBuild(study.target_ref, job.candidate, job.binary_refs[0])
        self.writer.append(make_row(self.run_id, job.candidate, result.artifact, measurement, study.baseline_median,
                                    study.target.spec.metric.goal, unit=study.target.spec.metric.unit,
                                    max_noise=self.config.measure.max_noise, objective=self.config.search.objective))
        if job.kind is JobKind.BASELINE:
            if study.reference is None:
                self.stage = Stage.FAILED
                return
            self.stage = Stage.FINAL  # every configuration, measured like a sweep's finals
            for build in study.builds():
                self._submit(build, study.reference)


@dataclass
class _Study:
    """One target on one device type of this evaluation: its baseline and the configurations."""

    target: Target
    target_ref: ray.ObjectRef
    device: DeviceInfo
    workers: list[int]
    arch: str
    origins: list[Origin]
    reference: ray.ObjectRef | None = None
    baseline_median: float | None = None
    baseline_build: BaselineBuild | None = None  # the configurations' fresh baseline clock (measure.beside)

    @property
    def name(self) -> str:
        return f"{self.target.name}@{self.device.device_type}"

    def _candidate(self, flags: tuple[tuple[str, str], ...], params: tuple[tuple[str, Scalar], ...],
                   phase: Phase) -> Candidate:
        return Candidate(self.target.name, self.target.spec.toolchain, self.device.device_type, self.arch,
                         self.target.bundle.hash, flags, params, phase, runner=self.target.runner)

    @property
    def baseline(self) -> Candidate:
        return self._candidate(tuple(self.target.space.baseline.items()),
                               tuple(self.target.baseline_params.items()), Phase.BASELINE)

    def builds(self) -> list[Build]:
        """One per distinct build (the baseline's key aside: it is measured already), from the
        sources each configuration was tuned with (an agent's variant's, stored by its run)."""
        chosen: dict[str, Build] = {self.baseline.key: Build(self.target, self.target_ref, self.baseline)}
        for origin in self.origins:
            source = origin.source(self.target) or self.target
            candidate = dataclasses.replace(self._candidate(origin.flags, origin.params, Phase.EVALUATE),
                                            source_hash=source.bundle.hash)
            if candidate.key not in chosen:
                ref = self.target_ref if source is self.target else ray.put(source)
                chosen[candidate.key] = Build(source, ref, candidate)
        return [b for b in chosen.values() if b.candidate.phase is Phase.EVALUATE]


def create_run_dir(plan: RunPlan, origins: list[Origin], sources: list[str], output_dir: str | None) -> RunDir:
    """The evaluation's run directory, ``<name>-eval-<time>``, with the origins in its meta.json."""
    config = plan.config.model_copy(update={"name": f"{plan.config.name}-eval",
                                            **({"output_dir": output_dir} if output_dir else {})})
    return RunDir.create(RunPlan(config, plan.file, plan.targets), meta={
        "kind": "evaluate", "sources": [str(Path(s).resolve()) for s in sources],
        "evaluated": [dataclasses.asdict(o) for o in origins]})
