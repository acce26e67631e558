"""One study per (target, device type): its Optuna study and what the sweep knows of it.

Optuna chooses (ask); the driver evaluates; results come back (tell). The same candidate key is
never evaluated twice: a trial that asks for a known key is told the known result, and a trial
that asks for a key in flight waits for it.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import optuna
import pandas as pd
import ray
from sqlalchemy.exc import OperationalError

from cluster.config import SearchSpec, Target
from cluster.core.encodings import (
    OPTUNA_FLAG,
    OPTUNA_PARAM,
    OPTUNA_PARAM_INDEX,
    VARIANT,
    Positions,
    indexed,
    optuna_point,
)
from cluster.core.errors import ConfigError
from cluster.core.registry import SAMPLERS
from cluster.core.types import Candidate, Clock, DeviceInfo, Phase, RunOutputs, Scalar, Status, study_name
from cluster.runners.measure import Reference
from cluster.store.journal import BatchedJournalStorage
from cluster.store.rundir import RunDir, break_stale_lock

T = TypeVar("T")

# Consecutive asks that propose nothing new before a study counts as exhausted.
MAX_REJECTIONS = 200


GRID_LIMIT = 100_000


def make_sampler(search: SearchSpec) -> optuna.samplers.BaseSampler:
    """The registered sampler that ``search.sampler`` names (search_spaces/samplers.py)."""
    return SAMPLERS.load(search.sampler)(search)


def enqueue_grid(study: optuna.Study, target: Target, seed: int) -> None:
    """Enqueue every valid point of the space once, in a seeded random order."""
    if study.trials:
        return  # resumed: the journal holds the rest of the grid
    if target.space_size() > GRID_LIMIT:
        raise ConfigError(target.file, "search.sampler",
                          f"grid over {target.space_size()} points (more than {GRID_LIMIT}); use tpe or random")
    flag_names, param_names = list(target.space.flags), list(target.spec.params)
    space = {name: Positions(values) for name, values in target.spec.params.items()}
    points = []
    for flags in itertools.product(*target.space.flags.values()):
        for values in itertools.product(*target.spec.params.values()):
            params = dict(zip(param_names, values, strict=True))
            if target.satisfies(params):
                points.append(optuna_point(dict(zip(flag_names, flags, strict=True)), params, space))
    random.Random(seed).shuffle(points)
    for point in points:
        storage_retry(lambda p=point: study.enqueue_trial(p, skip_if_exists=False))


def storage_retry(call: Callable[[], T], attempts: int = 8, first_wait_s: float = 0.5) -> T:
    """Run one Optuna storage call, waiting out a locked or briefly unreachable database (doubling
    waits, about two minutes in all) before giving up."""
    for attempt in range(attempts):
        try:
            return call()
        except (optuna.exceptions.StorageInternalError, OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(first_wait_s * 2**attempt)
    raise AssertionError("unreachable")


def create_study(search: SearchSpec, target: Target, name: str,
                 storage: optuna.storages.BaseStorage | str) -> optuna.Study:
    """The study of one (target, device type), created or loaded from the run's storage."""
    goal = target.spec.metric.goal
    directions = {"time": [goal], "energy": ["minimize"], "edp": ["minimize"],
                  "time_energy": [goal, "minimize"]}[search.objective]
    study = storage_retry(lambda: optuna.create_study(study_name=name, storage=storage, directions=directions,
                                                      sampler=make_sampler(search), load_if_exists=True))
    if search.sampler == "grid":
        enqueue_grid(study, target, search.seed)
    return study


def open_storage(search: SearchSpec, run_dir: Path, flush_interval_s: float = 2.0) -> optuna.storages.BaseStorage | str:
    """The run's Optuna storage: the RDB that ``search.storage`` names, else the run directory's
    journal, written in batches every ``flush_interval_s`` (``BatchedJournalStorage.flush``)."""
    if search.storage:
        if search.storage.startswith("sqlite"):  # wait for a lock longer than SQLite's 5 s default
            return optuna.storages.RDBStorage(search.storage, engine_kwargs={"connect_args": {"timeout": 30}})
        return search.storage
    break_stale_lock(run_dir)  # issue 17: a killed driver's lock would stall this resume 30 s
    return BatchedJournalStorage(run_dir / RunDir.JOURNAL, flush_interval_s)


@dataclass
class Evaluated:
    status: Status
    median: float | None
    energy_j: float | None = None

    def values(self, objective: str) -> list[float] | None:
        """What Optuna is told for this objective; None when it cannot be said (a failed trial)."""
        if self.status is not Status.OK or self.median is None:
            return None
        if objective == "time":
            return [self.median]
        if self.energy_j is None:
            return None
        return {"energy": [self.energy_j], "edp": [self.energy_j * self.median],
                "time_energy": [self.median, self.energy_j]}[objective]


@dataclass
class StudyState:
    target: Target
    target_ref: ray.ObjectRef
    device: DeviceInfo
    workers: list[int]
    study: optuna.Study
    arch: str
    objective: str = "time"
    generation: int = 1  # the target's study generation (RunDir.start_new_studies)
    reference: ray.ObjectRef | None = None
    baseline_median: float | None = None
    disabled: str = ""  # why the study stopped (its baseline failed)
    results: dict[str, Evaluated] = field(default_factory=dict)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    waiting: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    binaries: dict[str, Any] = field(default_factory=dict)  # binary hash -> Measurement
    n_search: int = 0
    n_failed: int = 0
    rejections: int = 0
    space_size: int = 0
    # Agents' verified variants (source hash -> target with their files and params): a search
    # dimension, "variant", beside the flags; "" is the target's own sources.
    variants: dict[str, Target] = field(default_factory=dict)
    variant_refs: dict[str, ray.ObjectRef] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return study_name(self.target.name, self.device.device_type, self.generation)

    @property
    def goal(self) -> str:
        return self.target.spec.metric.goal

    def better(self, a: float, b: float) -> bool:
        return a < b if self.goal == "minimize" else a > b

    best: float | None = None  # the best median so far, kept as results come in

    @property
    def exhausted(self) -> bool:
        # Every key in results (the baseline included) is a point of the space.
        return self.rejections >= MAX_REJECTIONS or len(self.results) >= self.space_size

    def candidate(self, flags: dict[str, str], params: dict[str, Scalar], phase: Phase,
                  trial_number: int | None = None, source: Target | None = None) -> Candidate:
        return Candidate(
            target=self.target.name, toolchain=self.target.spec.toolchain,
            device_type=self.device.device_type, arch=self.arch, source_hash=(source or self.target).bundle.hash,
            flags=tuple(flags.items()), params=tuple(params.items()), phase=phase, trial_number=trial_number,
            runner=self.target.runner, generation=self.generation,
        )

    def source_of(self, candidate: Candidate) -> tuple[Target, ray.ObjectRef]:
        """The target (its own, or an agent's variant) that ``candidate`` builds, and its object ref."""
        if candidate.source_hash in self.variants:
            return self.variants[candidate.source_hash], self.variant_refs[candidate.source_hash]
        return self.target, self.target_ref

    def add_variant(self, variant: Target) -> None:
        self.variants[variant.bundle.hash] = variant
        self.variant_refs[variant.bundle.hash] = ray.put(variant)
        self.space_size += variant.space_size()

    def baseline_candidate(self) -> Candidate:
        return self.candidate(self.target.space.baseline, self.target.baseline_params, Phase.BASELINE)

    def ask(self) -> tuple[optuna.trial.Trial, Candidate] | None:
        """A new trial and its candidate, or None when the trial proposed nothing new."""
        trial = storage_retry(self.study.ask)
        source = self.target
        if self.variants:
            chosen = storage_retry(lambda: trial.suggest_categorical(VARIANT, ["", *self.variants]))
            source = self.variants.get(chosen, self.target)
        flags = {k: storage_retry(lambda k=k, v=v: trial.suggest_categorical(OPTUNA_FLAG + k, list(v)))
                 for k, v in self.target.space.flags.items()}
        params = {k: _suggest_param(trial, k, v) for k, v in source.spec.params.items()}
        if not source.satisfies(params):
            storage_retry(lambda: self.study.tell(trial, state=optuna.trial.TrialState.FAIL))
            self.rejections += 1
            return None
        candidate = self.candidate(flags, params, Phase.SEARCH, trial.number, source)
        storage_retry(lambda: trial.set_user_attr("key", candidate.key))
        if candidate.key in self.results:
            self.tell(trial.number, self.results[candidate.key])
            self.rejections += 1
            return None
        if candidate.key in self.pending:
            self.waiting[candidate.key].append(trial.number)
            self.rejections += 1
            return None
        self.rejections = 0
        return trial, candidate

    def tell(self, trial_number: int, result: Evaluated) -> None:
        values = result.values(self.objective)
        if values is not None:
            storage_retry(lambda: self.study.tell(trial_number, values))
        else:
            storage_retry(lambda: self.study.tell(trial_number, state=optuna.trial.TrialState.FAIL))

    def record(self, candidate: Candidate, result: Evaluated) -> None:
        """A candidate's result is in: remember it and answer every trial that asked for it."""
        self.pending.discard(candidate.key)
        self.candidates.setdefault(candidate.key, candidate)
        if candidate.phase is Phase.FINAL:
            return
        self.results[candidate.key] = result
        if result.status is Status.OK and result.median is not None and (
                self.best is None or self.better(result.median, self.best)):
            self.best = result.median
        if candidate.phase is Phase.SEARCH:
            self.n_search += 1
            self.n_failed += result.status is not Status.OK
        numbers = self.waiting.pop(candidate.key, [])
        if candidate.trial_number is not None:
            numbers.append(candidate.trial_number)
        for number in numbers:
            self.tell(number, result)

    def top(self, k: int) -> list[Candidate]:
        """The ``k`` best by the objective's first value (time for time_energy)."""
        ok = [(values[0], key) for key, r in self.results.items() if (values := r.values(self.objective))]
        ok.sort(reverse=self.goal == "maximize" and self.objective == "time")
        return [self.candidates[key] for _, key in ok[:k]]

    def restore(self, rows: pd.DataFrame) -> None:
        """Rebuild the state from this study's rows (resume), then settle the journal."""
        for row in rows.itertuples(index=False):
            row_dict = row._asdict()
            flags = {k: str(row_dict.get(f"f_{k}") or "") for k in self.target.space.flags}
            source = self.variants.get(row_dict.get("source_hash") or "", self.target)
            params = {k: _native(row_dict.get(f"p_{k}")) for k in source.spec.params}
            phase = Phase(row_dict["phase"])
            candidate = self.candidate(flags, params, phase, source=source)
            if candidate.key != row_dict["candidate_key"]:
                continue  # written from other sources or flags than the current target's
            median = row_dict.get("median")
            energy = row_dict.get("energy_j")
            result = Evaluated(Status(row_dict["status"]), None if pd.isna(median) else float(median),
                               None if energy is None or pd.isna(energy) else float(energy))
            if phase is Phase.BASELINE:
                self.baseline_median = result.median
            self.record(candidate, result)
        self._settle_trials()

    def _settle_trials(self) -> None:
        """Trials left running by an interrupted driver: told their result if their candidate has a
        row, else failed and enqueued again so that the candidate is evaluated exactly once."""
        for trial in self.study.get_trials(deepcopy=False):
            key = trial.user_attrs.get("key")
            if trial.state is optuna.trial.TrialState.RUNNING:
                if key in self.results:
                    self.tell(trial.number, self.results[key])
                    continue
                self.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                if key:
                    self.study.enqueue_trial(trial.params, skip_if_exists=False)
            elif trial.state is optuna.trial.TrialState.COMPLETE and key and key not in self.results:
                self.study.enqueue_trial(trial.params, skip_if_exists=False)  # its row was never flushed


def _suggest_param(trial: optuna.trial.Trial, name: str, values: list[Scalar]) -> Scalar:
    """A param's value for ``trial``: a categorical of its values, or its index in a long list."""
    if indexed(values):
        return values[storage_retry(lambda: trial.suggest_int(OPTUNA_PARAM_INDEX + name, 0, len(values) - 1))]
    return storage_retry(lambda: trial.suggest_categorical(OPTUNA_PARAM + name, list(values)))


def _native(value: Any) -> Scalar:
    if hasattr(value, "item"):
        value = value.item()
    return value


def save_reference(run_dir: Path, key: str, reference: Reference) -> None:
    """Keep the baseline's outputs (one folder per seed) so that a resumed sweep needs no re-run."""
    folder = run_dir / RunDir.REFERENCES / key
    manifest = []
    for index, run in enumerate(reference.runs):
        (folder / str(index)).mkdir(parents=True, exist_ok=True)
        names = []
        for n, (path, content) in enumerate(run.files):
            (folder / str(index) / f"{n}.out").write_bytes(content)
            names.append(path)
        manifest.append({"files": names, "stdout_values": list(run.stdout_values)})
    if reference.clock is not None:  # the baseline's claimed and wall time a run (runners.clock), for a resume
        clock = reference.clock
        (folder / "clock.json").write_text(json.dumps([clock.claimed_s, clock.wall_s, clock.wall_spread_s]))
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest))
    tmp.replace(folder / "manifest.json")  # written last: its presence means the folder is whole


def load_reference(run_dir: Path, key: str) -> Reference | None:
    folder = run_dir / RunDir.REFERENCES / key
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    runs = []
    for index, run in enumerate(json.loads(manifest_path.read_text())):
        files = tuple((path, (folder / str(index) / f"{n}.out").read_bytes()) for n, path in enumerate(run["files"]))
        runs.append(RunOutputs(files, tuple(run["stdout_values"])))
    clock = folder / "clock.json"
    return Reference(tuple(runs), Clock(*map(float, json.loads(clock.read_text()))) if clock.is_file() else None)
