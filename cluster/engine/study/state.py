"""One study per (target, device type): its Optuna study and what the sweep knows of it.

Optuna chooses (ask); the driver evaluates; results come back (tell). The same candidate key is
never evaluated twice: a trial that asks for a known key is told the known result, and a trial
that asks for a key in flight waits for it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
import re
import time
from collections import Counter, defaultdict
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
from cluster.engine.scheduling.jobs import BaselineBuild
from cluster.measure.measure import Reference
from cluster.store.journal import BatchedJournalStorage
from cluster.store.rundir import RunDir, break_stale_lock

T = TypeVar("T")

# Consecutive asks that propose nothing new before a study counts as exhausted.
MAX_REJECTIONS = 200
# Of the search candidates asked since the first variant joined, the share the variants' stream
# takes: while the own sources lead and every variant has had its first points, while a variant is
# new (fewer than VARIANT_FIRST_POINTS search points: its plan's points and the best flags so far),
# and while a variant leads. A stream that has not led after its first points gives its share back
# to the own sources' search, which is the one the agents-off sweep makes: on an H200 at 600 s, off's
# winners of three programs came at the own sources' 16th to 29th candidate, and a quarter's share
# for variants that never led left those programs 15 to 18.
VARIANT_SHARE = (0.1, 0.25, 0.5)
VARIANT_FIRST_POINTS = 3


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
    """An Optuna study of one (target, device type), created or loaded from the run's storage."""
    goal = target.spec.metric.goal
    directions = {"time": [goal], "energy": ["minimize"], "edp": ["minimize"],
                  "time_energy": [goal, "minimize"]}[search.objective]
    return storage_retry(lambda: optuna.create_study(study_name=name, storage=storage, directions=directions,
                                                     sampler=make_sampler(search), load_if_exists=True))


def search_study_name(study: str, run_id: str, signature: str = "") -> str:
    """The Optuna study behind a sweep's study: its name with the run's id (a shared database holds
    many runs, which must never meet), and, once its space grew, the grown space's digest."""
    return f"{study} [{run_id}]" + (f" ~{signature}" if signature else "")


def sweep_study_of(name: str) -> str:
    """The sweep's study that an Optuna study of ``search_study_name`` belongs to (a name without
    the run's id, written before 2026-11-27, is its own)."""
    return re.sub(r" \[[^\]]*\]( ~[0-9a-f]+)?$", "", name)


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
    """What the sweep knows of one study, and its Optuna study (``open_study``).

    The search is two streams, each its own Optuna study: the target's own sources (flags and
    params: the search as it is with the agents off, the same sampler on the same space, so its
    points are the ones a sweep without agents would try), and the agents' variants (a ``variant``
    dimension, with the flags and each variant's params). The variants never take the own
    stream's trials: ``ask`` draws from the variants' stream a share of the candidates asked since
    the first variant joined (``VARIANT_SHARE``: more while a variant is new, the most while one
    measures better than the best of the own sources), its plan's points first.

    The search runs while the agents work: a variant that joins, or a flag that gains options (the
    register expert's ``-maxrregcount`` values), grows a stream's space. An Optuna categorical
    cannot grow, so that stream moves to a new Optuna study over the grown space (``widen``), seeded
    with every result of the stream so far (the rows are the truth; a study is what the sampler
    learned from them) and the points queued in the old one; a trial of the old study still in
    flight is told there and copied into the new one when its result comes.
    """

    target: Target
    target_ref: ray.ObjectRef
    device: DeviceInfo
    workers: list[int]
    study: optuna.Study | None
    arch: str
    objective: str = "time"
    generation: int = 1  # the target's study generation (RunDir.start_new_studies)
    reference: ray.ObjectRef | None = None
    baseline_build: BaselineBuild | None = None  # for the measurements' fresh baseline clock (measure.beside)
    baseline_median: float | None = None
    baseline_run_s: float | None = None  # the baseline's time a run on its worker (the time plan's unit)
    disabled: str = ""  # why the study stopped (its baseline failed)
    results: dict[str, Evaluated] = field(default_factory=dict)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    asked: dict[str, list[tuple[optuna.Study, int]]] = field(default_factory=lambda: defaultdict(list))
    binaries: dict[str, Any] = field(default_factory=dict)  # binary hash -> Measurement
    n_search: int = 0
    n_failed: int = 0
    rejections: int = 0
    space_size: int = 0
    # Agents' verified variants (source hash -> target with their files and params): a search
    # dimension, "variant", beside the flags; "" is the target's own sources.
    variants: dict[str, Target] = field(default_factory=dict)
    variant_refs: dict[str, ray.ObjectRef] = field(default_factory=dict)
    retired: dict[str, Target] = field(default_factory=dict)  # variants that failed a later check: out of the space
    # Where ``open_study`` and ``widen`` make the Optuna studies (None: ``study`` is given and fixed).
    search: SearchSpec | None = None
    storage: Any = None
    run_id: str = ""
    variant_study: optuna.Study | None = None  # the variants' stream (``study``: the own sources')
    # Search candidates asked for (key -> the source hash it builds), and their count by source hash
    # (kept with it: the driver's loop asks each stream's trials used on every turn).
    search_keys: dict[str, str] = field(default_factory=dict)
    searched: Counter[str] = field(default_factory=Counter)
    streamed: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})  # asks since a variant joined

    @property
    def name(self) -> str:
        return study_name(self.target.name, self.device.device_type, self.generation)

    @property
    def goal(self) -> str:
        return self.target.spec.metric.goal

    def better(self, a: float, b: float) -> bool:
        return a < b if self.goal == "minimize" else a > b

    best: float | None = None  # the best median so far, kept as results come in
    # Kept as results come in, by the objective's first value (``ranked``'s order): the best candidate
    # of the target's own sources (the baseline is one) and the best value of a variant still in the space.
    own_best: str | None = None
    variant_best: float | None = None

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
        if candidate.source_hash in self.retired:
            return self.retired[candidate.source_hash], self.variant_refs[candidate.source_hash]
        return self.target, self.target_ref

    def retire(self, source_hash: str) -> None:
        """A variant that failed its expensive checks leaves the space (its rows stay, never selected):
        the search moves to a study without it, its queued points dropped."""
        variant = self.variants.pop(source_hash, None)
        if variant is None:
            return
        self.retired[source_hash] = variant
        self.space_size -= variant.space_size()
        self.variant_best = None
        for key, result in self.results.items():
            self._keep_best(self.candidates[key], result)
        self.widen()

    def _ahead(self, a: float, b: float) -> bool:
        """Whether objective value ``a`` ranks before ``b`` (``ranked``'s order)."""
        return a > b if self.goal == "maximize" and self.objective == "time" else a < b

    def _keep_best(self, candidate: Candidate, result: Evaluated) -> None:
        values = result.values(self.objective)
        if not values:
            return
        if candidate.source_hash == self.target.bundle.hash:
            own = self.results[self.own_best].values(self.objective) if self.own_best else None
            if not own or self._ahead(values[0], own[0]):
                self.own_best = candidate.key
        elif candidate.source_hash in self.variants and (
                self.variant_best is None or self._ahead(values[0], self.variant_best)):
            self.variant_best = values[0]

    def used(self, variants: bool) -> int:
        """Search candidates of one stream measured or in flight (its trials used); a retired
        variant's are given back to the variants' stream (a cheat's trials are no variant's)."""
        if variants:
            return sum(self.searched[source] for source in self.variants)
        return self.searched[self.target.bundle.hash]

    def _searched(self, candidate: Candidate) -> None:
        if candidate.key not in self.search_keys:
            self.search_keys[candidate.key] = candidate.source_hash
            self.searched[candidate.source_hash] += 1

    def room(self, trials: int | None) -> tuple[bool, bool]:
        """(own, variants): whether each stream has trials left of its ``trials`` (``search.trials``).
        A variant that joined after its stream spent them has one more, for its first point (the best
        flags so far, entered first): an agent slower than the search still has its variant searched
        (a fake GPU's second variant, 1 s behind the first, joined a stream whose 16 trials the first
        had spent, and was never searched)."""
        unsearched = sum(1 for source in self.variants if not self.searched[source])
        return ((trials is None or self.used(False) < trials),
                self.stream_of(True) is not None and (trials is None or self.used(True) < trials + unsearched))

    def stream_of(self, variants: bool) -> optuna.Study | None:
        """The Optuna study of a stream; a fixed study (``search`` None: tests, tools) is both."""
        if not variants:
            return self.study
        if self.search is None:
            return self.study if self.variants else None
        return self.variant_study if self.variants else None

    def variants_lead(self) -> bool:
        """Whether a variant still in the space measured better than every candidate of the
        target's own sources."""
        if self.variant_best is None:
            return False
        own = self.results[self.own_best].values(self.objective) if self.own_best else None
        return not own or self._ahead(self.variant_best, own[0])

    def next_stream(self, own: bool = True, variants: bool = True) -> bool | None:
        """The stream the next search candidate comes from (True: the variants'), of those with
        room (``own``, ``variants``: trials left); None where neither has. The variants' stream
        takes ``VARIANT_SHARE`` of the candidates asked since the first variant joined: the least
        once every variant has had its first points and none leads, more while one is new, the most
        while one leads. Its plan's points are its first candidates."""
        variants = variants and self.stream_of(True) is not None
        if not (own or variants):
            return None
        if not (own and variants):
            return variants
        if self.variants_lead():
            share = VARIANT_SHARE[2]
        elif any(self.searched[source] < VARIANT_FIRST_POINTS for source in self.variants):
            share = VARIANT_SHARE[1]
        else:
            share = VARIANT_SHARE[0]
        asked = self.streamed[False] + self.streamed[True]
        return self.streamed[True] < share * (asked + 1)

    def add_variant(self, variant: Target) -> None:
        """A variant into the space; ``widen`` then moves the search to the grown space."""
        self.variants[variant.bundle.hash] = variant
        self.variant_refs[variant.bundle.hash] = ray.put(variant)
        self.space_size += variant.space_size()

    def baseline_candidate(self) -> Candidate:
        return self.candidate(self.target.space.baseline, self.target.baseline_params, Phase.BASELINE)

    # -- the Optuna study -----------------------------------------------------------------------
    def variant_choices(self) -> list[str]:
        """The variant dimension's choices: the variants in a fixed order, so that a resumed run
        meets the same distribution."""
        return sorted(self.variants)

    def signature(self, variants: bool = False) -> str:
        """A stream's space as far as it grows during a sweep (the own sources' "" while it has not):
        flag options, and the variants of the variants' stream."""
        flags = {k: list(v) for k, v in self.target.space.flags.items()}
        if not variants and flags == self._initial_flags:
            return ""
        chosen = sorted(self.variants) if variants else []
        return hashlib.sha256(json.dumps([flags, chosen], sort_keys=True).encode()).hexdigest()[:12]

    def open_study(self) -> None:
        """The Optuna studies of the current spaces (the variants' once a variant joined): loaded
        where an earlier invocation made them (their trials left running settled against the
        results), else created and seeded."""
        assert self.search is not None and self.storage is not None
        self.study = self._open(self.study, variants=False)
        self.variant_study = self._open(self.variant_study, variants=True) if self.variants else None

    def _open(self, old: optuna.Study | None, variants: bool) -> optuna.Study:
        assert self.search is not None
        name = search_study_name(self.name, self.run_id, self.signature(variants))
        if old is not None and old.study_name == name:
            return old  # the space did not grow (a register value it had already): the search stays
        study = create_study(self.search, self.target, name, self.storage)
        if study.trials:
            self._settle_trials(study)
            return study
        self._seed(study, old, variants)
        return study

    def widen(self) -> None:
        """A space grew: move its stream to a study of the grown space."""
        if self.search is None:  # a fixed study (tests, tools): the old behaviour, no growth
            return
        self.open_study()

    def _seed(self, study: optuna.Study, old: optuna.Study | None, variants: bool) -> None:
        """A new study: every result of its stream so far as a finished trial, then the old study's
        queued points (or, for the first study of a grid search, the grid)."""
        trials = [t for key, result in self.results.items()
                  if (t := self._as_trial(key, result, variants)) is not None]
        if trials:
            storage_retry(lambda: study.add_trials(trials))
        if old is None:
            if not variants and self.search is not None and self.search.sampler == "grid":
                enqueue_grid(study, self.target, self.search.seed)
            return
        for trial in old.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            point = dict(trial.system_attrs.get("fixed_params", {}))
            if variants and point.get(VARIANT) not in self.variants:
                continue  # a retired variant's point
            if not variants:
                point.pop(VARIANT, None)
            storage_retry(lambda p=point: study.enqueue_trial(p, skip_if_exists=True))

    def _as_trial(self, key: str, result: Evaluated, variants: bool) -> optuna.trial.FrozenTrial | None:
        """A result as a finished trial of a stream's current space (None where it is not a point of it)."""
        candidate = self.candidates.get(key)
        if candidate is None:
            return None
        source = self.variants.get(candidate.source_hash, self.target)
        if candidate.source_hash != source.bundle.hash or (source is not self.target) != variants:
            return None
        flags, params = dict(candidate.flags), dict(candidate.params)
        point: dict[str, Any] = {}
        distributions: dict[str, optuna.distributions.BaseDistribution] = {}
        if variants:
            point[VARIANT] = candidate.source_hash
            distributions[VARIANT] = optuna.distributions.CategoricalDistribution(self.variant_choices())
        for name, options in self.target.space.flags.items():
            if flags.get(name) not in options:
                return None
            point[OPTUNA_FLAG + name] = flags[name]
            distributions[OPTUNA_FLAG + name] = optuna.distributions.CategoricalDistribution(list(options))
        for name, values in source.spec.params.items():
            if name not in params or params[name] not in values:
                return None
            if indexed(values):
                point[OPTUNA_PARAM_INDEX + name] = list(values).index(params[name])
                distributions[OPTUNA_PARAM_INDEX + name] = optuna.distributions.IntDistribution(0, len(values) - 1)
            else:
                point[OPTUNA_PARAM + name] = params[name]
                distributions[OPTUNA_PARAM + name] = optuna.distributions.CategoricalDistribution(list(values))
        values = result.values(self.objective)
        state = optuna.trial.TrialState.COMPLETE if values is not None else optuna.trial.TrialState.FAIL
        return optuna.trial.create_trial(state=state, values=values, params=point, distributions=distributions,
                                         user_attrs={"key": key})

    def __post_init__(self) -> None:
        self._initial_flags = {k: list(v) for k, v in self.target.space.flags.items()}

    # -- ask and tell ---------------------------------------------------------------------------
    def ask(self, own: bool = True, variants: bool = True) -> tuple[optuna.trial.Trial, Candidate] | None:
        """A new trial and its candidate, from the stream ``next_stream`` picks of those with room
        (``own``, ``variants``), or None when the trial proposed nothing new."""
        stream = self.next_stream(own, variants)
        study = self.stream_of(bool(stream))
        assert study is not None and stream is not None
        if self.variants:
            self.streamed[stream] += 1
        trial = storage_retry(study.ask)
        source = self.target
        if stream:
            chosen = storage_retry(lambda: trial.suggest_categorical(VARIANT, self.variant_choices()))
            source = self.variants.get(chosen, self.target)
        flags = {k: storage_retry(lambda k=k, v=v: trial.suggest_categorical(OPTUNA_FLAG + k, list(v)))
                 for k, v in self.target.space.flags.items()}
        params = {k: _suggest_param(trial, k, v) for k, v in source.spec.params.items()}
        if not source.satisfies(params):
            storage_retry(lambda: study.tell(trial, state=optuna.trial.TrialState.FAIL))
            self.rejections += 1
            return None
        candidate = self.candidate(flags, params, Phase.SEARCH, trial.number, source)
        storage_retry(lambda: trial.set_user_attr("key", candidate.key))
        if candidate.key in self.results:
            self._tell(study, trial.number, self.results[candidate.key])
            self.rejections += 1
            return None
        self.asked[candidate.key].append((study, trial.number))
        if candidate.key in self.pending:
            self.rejections += 1
            return None
        self.rejections = 0
        self._searched(candidate)
        return trial, candidate

    def tell(self, trial_number: int, result: Evaluated) -> None:
        assert self.study is not None
        self._tell(self.study, trial_number, result)

    def _tell(self, study: optuna.Study, trial_number: int, result: Evaluated) -> None:
        values = result.values(self.objective)
        try:
            if values is not None:
                storage_retry(lambda: study.tell(trial_number, values))
            else:
                storage_retry(lambda: study.tell(trial_number, state=optuna.trial.TrialState.FAIL))
        except ValueError:
            # A trial already finished (Optuna: "Cannot tell a FAIL trial"): the sampler's record is
            # off by one trial, the rows are whole; a sweep must not end on it.
            trial = next((t for t in study.get_trials(deepcopy=False) if t.number == trial_number), None)
            if trial is None or not trial.state.is_finished():
                raise
            logging.getLogger(__name__).warning(
                f"{self.name}: trial {trial_number} of {study.study_name} was already {trial.state.name}; "
                f"its result ({result.status.value}) is in the rows only")

    def record(self, candidate: Candidate, result: Evaluated) -> None:
        """A candidate's result is in: remember it and answer every trial that asked for it (a
        trial of a study the search has left is answered there, and the result copied over)."""
        self.pending.discard(candidate.key)
        self.candidates.setdefault(candidate.key, candidate)
        if candidate.phase is Phase.FINAL:
            return
        self.results[candidate.key] = result
        if result.status is Status.OK and result.median is not None and (
                self.best is None or self.better(result.median, self.best)):
            self.best = result.median
        self._keep_best(candidate, result)
        of_variant = candidate.source_hash in self.variants or candidate.source_hash in self.retired
        if candidate.phase is Phase.SEARCH:
            self.n_search += 1
            self.n_failed += result.status is not Status.OK
            self._searched(candidate)
        copied = False
        current = self.stream_of(of_variant)
        for study, number in self.asked.pop(candidate.key, []):
            self._tell(study, number, result)
            if (current is not None and study.study_name != current.study_name  # the search moved on
                    and not copied and self.search is not None):
                trial = self._as_trial(candidate.key, result, of_variant)
                if trial is not None:
                    storage_retry(lambda trial=trial: current.add_trial(trial))
                copied = True

    def top(self, k: int) -> list[Candidate]:
        """The ``k`` best by the objective's first value (time for time_energy)."""
        return self.ranked()[:k]

    def ranked(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[Candidate]:
        """Every candidate measured ok, best first by the objective's first value."""
        ok = [(values[0], key) for key, r in self.results.items()
              if key not in exclude and (values := r.values(self.objective))]
        ok.sort(reverse=self.goal == "maximize" and self.objective == "time")
        return [self.candidates[key] for _, key in ok]

    def restore(self, rows: pd.DataFrame) -> None:
        """Rebuild the state from this study's rows (resume); ``open_study`` then settles the journal."""
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
        if self.study is not None and self.search is None:
            self._settle_trials(self.study)

    def _settle_trials(self, study: optuna.Study) -> None:
        """Trials left running by an interrupted driver: told their result if their candidate has a
        row, else failed and enqueued again so that the candidate is evaluated exactly once."""
        # Trials this driver asked and still waits for are in flight, not left running: their
        # result is told when it comes (a space that grew back to an earlier study's, say, by a
        # variant retired). Failed here, that tell raised and ended the sweep.
        in_flight = {number for asked in self.asked.values() for other, number in asked
                     if other.study_name == study.study_name}
        for trial in study.get_trials(deepcopy=False):
            key = trial.user_attrs.get("key")
            if trial.state is optuna.trial.TrialState.RUNNING:
                if trial.number in in_flight:
                    continue
                if key in self.results:
                    self._tell(study, trial.number, self.results[key])
                    continue
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                if key:
                    study.enqueue_trial(trial.params, skip_if_exists=False)
            elif trial.state is optuna.trial.TrialState.COMPLETE and key and key not in self.results:
                study.enqueue_trial(trial.params, skip_if_exists=False)  # its row was never flushed


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
    if reference.clock is not None:  # the baseline's claimed and wall time a run (measure.clock), for a resume
        clock = reference.clock
        (folder / "clock.json").write_text(json.dumps([clock.claimed_s, clock.wall_s, clock.wall_spread_s,
                                                       clock.device_s, clock.device_spread_s,
                                                       clock.kernel_s, clock.kernel_spread_s,
                                                       clock.span_s, clock.span_spread_s,
                                                       clock.samples, clock.records]))
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
    return Reference(tuple(runs), Clock(*json.loads(clock.read_text())) if clock.is_file() else None)
