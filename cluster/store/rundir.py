"""A run directory: everything a sweep writes, and all that ``--resume``, ``show`` and ``export`` read.
``RunDir`` owns every path in it; nothing else spells a name of the layout.

    runs/<name>-<UTC time>/
        meta.json          run id, when, which config, the targets' source and spec hashes, the
                           budget given (a resume checks them: RunDir.check_resumable), and
                           the targets whose study a resume replaced (generations, superseded)
        config.yaml        a copy of the run config as it was given
        optuna.journal     the Optuna studies (unless search.storage names an RDB)
        results/           the Parquet dataset, one part file per flush
        profiles/          Nsight Compute metrics (a Parquet dataset)
        variants/          the agents' workflow, one row per outcome (a Parquet dataset)
        variant_sources/   the accepted variants' sources, for a resume and for rebuilding a winner
        reviews/           suspiciously fast candidates re-verified on fresh seeds (a Parquet dataset)
        references/<key>/  the baseline's output files that candidates are compared with
        llm/               every LLM exchange (agents.llm.store)
        quarantine/        part files that ``warpfleet check`` found unreadable, moved aside
        report.md          ``warpfleet optimize``'s report

Creation is atomic: the directory is made with one ``mkdir`` (a clash takes the next suffix), and
``config.yaml`` and ``meta.json`` are written to a temporary file and renamed into place, so a run
directory never holds a half-written one; if the copy fails, the new directory is removed again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from cluster.config import RunPlan, Target
from cluster.core.errors import ConfigError
from cluster.core.types import study_of

_MAX_SUFFIX = 1000  # run directories of one name started in one second


@dataclass(frozen=True)
class RunDir:
    path: Path
    run_id: str

    META: ClassVar[str] = "meta.json"
    CONFIG: ClassVar[str] = "config.yaml"
    JOURNAL: ClassVar[str] = "optuna.journal"
    RESULTS: ClassVar[str] = "results"
    PROFILES: ClassVar[str] = "profiles"
    VARIANTS: ClassVar[str] = "variants"
    VARIANT_SOURCES: ClassVar[str] = "variant_sources"
    REVIEWS: ClassVar[str] = "reviews"
    JOBS: ClassVar[str] = "jobs"  # every job a worker did, with its time (cluster.store.tables)
    REFERENCES: ClassVar[str] = "references"
    LLM: ClassVar[str] = "llm"
    QUARANTINE: ClassVar[str] = "quarantine"
    REPORT: ClassVar[str] = "report.md"
    OWNER_LOCK: ClassVar[str] = ".driver.lock"  # held (flock) by the driver of the run: see claim
    TABLES: ClassVar[tuple[str, ...]] = (RESULTS, PROFILES, VARIANTS, REVIEWS, JOBS)  # the Parquet datasets

    @classmethod
    def create(cls, plan: RunPlan, output_dir: Path | None = None, meta: dict[str, Any] | None = None) -> RunDir:
        """A new run directory under ``output_dir`` (default: the config's ``output_dir``, relative to
        the working directory), with the config copied and ``meta.json`` (plus ``meta``) written.
        Raises ConfigError, one line, when the place cannot hold one (a file, read-only, full)."""
        root = Path(output_dir or plan.config.output_dir)
        field = "output_dir"
        try:
            root.mkdir(parents=True, exist_ok=True)
            path = _make_unique(root, f"{plan.config.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        except OSError as exc:
            raise ConfigError(plan.file, field, f"{root}: cannot create a run directory there "
                              f"({_reason(exc)})") from None
        run_dir = cls(path, path.name)
        try:
            write_atomic(run_dir.config, Path(plan.file).read_bytes())
            run_dir.write_meta({
                "run_id": path.name,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "config_file": str(Path(plan.file).resolve()),
                "targets": {t.name: t.bundle.hash for t in plan.targets},
                "target_specs": {t.name: spec_hash(t) for t in plan.targets},
                **(meta or {}),
            })
        except OSError as exc:
            shutil.rmtree(path, ignore_errors=True)  # nothing written: no run directory left behind
            raise ConfigError(plan.file, field, f"{path}: cannot write the run directory ({_reason(exc)})") from None
        return run_dir

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory; a one-line error if it is not one."""
        path = Path(path)
        meta = path / cls.META
        if not meta.is_file():
            raise ConfigError(path, "", f"not a warpfleet run directory (no {cls.META})")
        try:
            run_id = json.loads(meta.read_text())["run_id"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigError(meta, "run_id", "missing or unreadable") from None
        return cls(path, str(run_id))

    # -- the layout ---------------------------------------------------------------------------
    @property
    def meta(self) -> Path:
        return self.path / self.META

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def journal(self) -> Path:
        return self.path / self.JOURNAL

    @property
    def results(self) -> Path:
        return self.path / self.RESULTS

    @property
    def profiles(self) -> Path:
        return self.path / self.PROFILES

    @property
    def variants(self) -> Path:
        return self.path / self.VARIANTS

    @property
    def variant_sources(self) -> Path:
        return self.path / self.VARIANT_SOURCES

    @property
    def reviews(self) -> Path:
        return self.path / self.REVIEWS

    @property
    def references(self) -> Path:
        return self.path / self.REFERENCES

    @property
    def quarantine(self) -> Path:
        return self.path / self.QUARANTINE

    @property
    def report(self) -> Path:
        return self.path / self.REPORT

    # -- who drives it ------------------------------------------------------------------------
    def claim(self) -> None:
        """Make this process the run's one driver until it ends (an ``flock`` on ``.driver.lock``,
        which the kernel drops however the process dies: a dead driver's lock is free at once).
        Another live driver holding it is a one-line ``ConfigError`` naming it: two drivers of one
        run would both evaluate the same candidates (issue 26: 144 rows where 83 were due)."""
        if _own(self.path):
            return
        holder = _holder(self.path)
        raise ConfigError(self.path / self.OWNER_LOCK, "", f"another driver is running this run ({holder}); "
                          "wait for it to end, or stop it and resume")

    # -- meta.json ----------------------------------------------------------------------------
    def check_resumable(self, plan: RunPlan, accept_changes: bool = False) -> list[str]:
        """A resume continues the run as it was made: a one-line error naming what changed since
        in the config (its budget, where runs go and which cluster runs it aside), a target's
        sources or its spec. Otherwise rows and Optuna trials of the old would mix with the new
        (a changed target's study re-ran whole, with a second baseline).

        With ``accept_changes`` (``--accept-changes``) a target whose sources or spec changed is
        no error, nor a change of the config's list of targets: returned are the names of the
        changed targets, each to get a new study (``start_new_studies``). Any other change of the
        config still is one."""
        try:
            then = yaml.safe_load(self.config.read_text())
            now = yaml.safe_load(Path(plan.file).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(self.config, "", f"cannot be read to compare with {plan.file} ({exc})") from None
        changed = _first_difference(then, now, (), TARGET_LIST if accept_changes else frozenset())
        if changed is not None:
            where, old, new = changed
            if accept_changes:
                advice = "--accept-changes covers changed targets only: restore it, or start a new run"
            elif (where,) in TARGET_LIST:
                advice = ("restore it, start a new run, or resume with --accept-changes to sweep the "
                          "targets listed now")
            else:
                advice = "a resume continues the run as it was made: restore it, or start a new run"
            raise ConfigError(self.config, where, f"changed since the run ({_short(old)} -> {_short(new)}) in "
                              f"{plan.file}; {advice}")
        changed_targets = []
        for target, key, was, now_hash in self._target_changes(plan):
            if not accept_changes:
                what = "sources" if key == "targets" else "spec"
                raise ConfigError(self.meta, f"{key}.{target.name}", f"the {what} of target {target.name} "
                                  f"changed since the run ({was} -> {now_hash}; {target.file}): its rows and "
                                  f"Optuna study belong to the old; restore them, start a new run, or resume "
                                  f"with --accept-changes to start a new study for it")
            changed_targets.append(target.name)
        return list(dict.fromkeys(changed_targets))

    def _target_changes(self, plan: RunPlan) -> list[tuple[Target, str, str, str]]:
        """(target, meta.json key, hash then, hash now) of each target that changed since the run."""
        meta = self.read_meta()
        changes = []
        for target in plan.targets:
            for key, now_hash in (("targets", target.bundle.hash), ("target_specs", spec_hash(target))):
                was = meta.get(key, {}).get(target.name)
                if was is not None and was != now_hash:
                    changes.append((target, key, was, now_hash))
        return changes

    def start_new_studies(self, plan: RunPlan, changed: list[str]) -> dict[str, int]:
        """The ``changed`` targets (``check_resumable(plan, accept_changes=True)``) each start their
        study's next generation; returns their new generations. Their rows, Optuna trials and the
        rest stay in the run but count no more (``read_results`` leaves them out); meta.json takes
        the targets' hashes of now (those of targets added to the config too), and keeps the
        replaced ones under ``superseded``."""
        meta = self.read_meta()
        generations = {str(k): int(v) for k, v in meta.get("generations", {}).items()}
        superseded = list(meta.get("superseded", []))
        replaced_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name in changed:
            generation = generations.get(name, 1)
            superseded.append({"target": name, "generation": generation,
                               "sources": meta.get("targets", {}).get(name),
                               "spec": meta.get("target_specs", {}).get(name), "replaced_at": replaced_at})
            generations[name] = generation + 1
        self.update_meta(targets={**meta.get("targets", {}), **{t.name: t.bundle.hash for t in plan.targets}},
                         target_specs={**meta.get("target_specs", {}),
                                       **{t.name: spec_hash(t) for t in plan.targets}},
                         generations=generations, superseded=superseded)
        return {name: generations[name] for name in changed}

    def generations(self) -> dict[str, int]:
        """Each target's study generation, where above 1 (``start_new_studies``)."""
        return read_generations(self.path)

    def read_meta(self) -> dict[str, Any]:
        try:
            data = json.loads(self.meta.read_text())
        except (OSError, ValueError):
            raise ConfigError(self.meta, "", "missing or unreadable") from None
        if not isinstance(data, dict):
            raise ConfigError(self.meta, "", "not a JSON object")
        return data

    def write_meta(self, meta: dict[str, Any]) -> None:
        write_atomic(self.meta, (json.dumps(meta, indent=2) + "\n").encode())

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        """meta.json with ``fields`` set, written atomically; returns the new contents."""
        meta = self.read_meta() | fields
        self.write_meta(meta)
        return meta


# Config fields a resume may change: the budget (a resume may extend it), where new runs go, and
# which cluster runs the rest.
RESUMABLE_CHANGES = frozenset({("search", "trials"), ("search", "time_budget_s"), ("output_dir",),
                               ("cluster", "address")})


# What --accept-changes lets a resume change in the config besides RESUMABLE_CHANGES: which targets.
TARGET_LIST = frozenset({("targets",)})


def read_generations(run_dir: Path) -> dict[str, int]:
    """The study generation of each target of the run in ``run_dir`` whose first study was
    superseded (meta.json ``generations``); {} where there is none, or no meta.json to say."""
    try:
        data = json.loads((Path(run_dir) / RunDir.META).read_text())
        return {str(name): int(n) for name, n in data.get("generations", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def is_current_study(study: str, generations: dict[str, int]) -> bool:
    """Whether ``study`` (a name of ``cluster.core.types.study_name``) is its target's current one."""
    target, generation = study_of(study)
    return generation == generations.get(target, 1)


def spec_hash(target: Target) -> str:
    """A target spec's identity (its YAML as validated: run command, params, verification...)."""
    return hashlib.sha256(target.spec.model_dump_json().encode()).hexdigest()[:16]


def _first_difference(then: Any, now: Any, path: tuple[str, ...],
                      also: frozenset[tuple[str, ...]] = frozenset()) -> tuple[str, Any, Any] | None:
    """The first (dotted field, old, new) where two parsed configs differ, outside RESUMABLE_CHANGES
    and ``also``."""
    if path in RESUMABLE_CHANGES or path in also:
        return None
    if isinstance(then, dict) and isinstance(now, dict):
        for key in sorted(set(then) | set(now), key=str):
            found = _first_difference(then.get(key), now.get(key), (*path, str(key)), also)
            if found is not None:
                return found
        return None
    return None if then == now else (".".join(path) or "(the whole file)", then, now)


def _short(value: Any) -> str:
    text = "absent" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def output_dir_problem(root: Path) -> str:
    """Why no run directory can be made under ``root`` ("" when one can), in the words of the error
    that making one would give, found without writing anything: the nearest folder of it that
    exists must be a folder this process may write to."""
    place = Path(root).absolute()
    while not os.path.lexists(place):
        place = place.parent
    if not place.is_dir():
        code = errno.ENOTDIR
    elif not os.access(place, os.W_OK | os.X_OK):
        code = errno.EROFS if os.statvfs(place).f_flag & os.ST_RDONLY else errno.EACCES
    else:
        return ""
    return os.strerror(code) + ("" if place == Path(root).absolute() else f": {place}")


def _make_unique(root: Path, name: str) -> Path:
    """``root/name``, or ``name-2``, ``name-3``, ...: one ``mkdir`` each, so that two sweeps started
    in the same second never share a directory (no check-then-create race)."""
    for suffix in range(1, _MAX_SUFFIX + 1):
        path = root / (name if suffix == 1 else f"{name}-{suffix}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, f"{_MAX_SUFFIX} run directories named {name} already")


def write_atomic(path: Path, content: bytes) -> None:
    """``path`` holds ``content`` whole or is left as it was: a temporary file, fsynced, renamed."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        with open(temp, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# -- the Optuna journal's lock -------------------------------------------------------------------
_owned: dict[Path, int] = {}  # run directory -> the descriptor of its owner lock, held by this process


def break_stale_lock(run_dir: Path | RunDir) -> bool:
    """Remove ``optuna.journal.lock`` when whoever took it is gone; True when one was removed.

    Optuna's journal lock (``JournalFileSymlinkLock``: a symlink made with ``os.symlink``, removed on
    release) names no owner, so a driver killed while holding it leaves it behind and every later
    writer waits out Optuna's 30 s grace period. The driver of a run therefore holds an ``flock`` on
    the run's ``.driver.lock`` for as long as it lives (the kernel drops it when the process dies,
    however it dies). Here that lock is taken (and kept for this process): if it is free, no live
    driver can hold the journal's lock, which is then stale. If another live process holds it,
    nothing is touched. Where ``flock`` does not exist (Windows), nothing is done.
    """
    path = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
    if not _own(path):
        return False
    lock = path / f"{RunDir.JOURNAL}.lock"
    try:
        os.unlink(lock)  # a symlink (or JournalFileOpenLock's plain file): unlink, never follow
    except FileNotFoundError:
        return False
    return True


def _own(path: Path) -> bool:
    """This process holds the run's owner lock (taken now if free); False if another process does."""
    try:
        import fcntl
    except ImportError:
        return False
    key = path.resolve()
    if key in _owned:
        return True
    fd = os.open(key / RunDir.OWNER_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _owned[key] = fd  # held until this process ends
    with contextlib.suppress(OSError):  # who holds it, for the next one's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
    return True


def _holder(path: Path) -> str:
    """Who holds the run's owner lock, as its holder wrote it: "pid 123 on host, since ..."."""
    try:
        data = json.loads((path / RunDir.OWNER_LOCK).read_text())
        return f"pid {int(data['pid'])} on {data['host']}, since {data['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said who it is"
