"""Per-command control groups: a process limit and a memory limit that hold for every process a
command starts, and that tell afterwards which of them the command ran into.

Each command gets a leaf ``<pid>-<n>`` (its worker's pid) under ``warpfleet/`` in the worker's own
cgroup, in the cgroup v1 ``pids`` and ``memory`` hierarchies or the one v2 hierarchy, wherever they
are writable. A worker that dies leaves its leaves behind; the next ``Cgroups.detect`` on the node
removes them. Where no cgroup can be written, ``detect`` finds nothing and the sandbox falls back on
rlimits (``cluster.sandbox.bwrap``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.sandbox.sandbox import pid_alive

_LEAF = re.compile(r"(\d+)-\d+")
_counter = itertools.count()


@dataclass(frozen=True)
class Leaf:
    """A cgroup for one command at a time: a directory per hierarchy (one in v2, pids and memory in v1)."""

    pids: Path | None
    memory: Path | None
    version: int

    @property
    def dirs(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(d for d in (self.pids, self.memory) if d is not None))

    def join_files(self) -> tuple[str, ...]:
        """What the child writes "0" (itself) to, between fork and exec, to enter the leaf. In v1
        the ``tasks`` file: it moves the one thread without the global lock that ``cgroup.procs``
        takes, whose synchronize_rcu costs milliseconds on a busy node."""
        return tuple(str(d / ("tasks" if self.version == 1 else "cgroup.procs")) for d in self.dirs)

    def hits(self) -> tuple[int, int]:
        """Processes the OOM killer ended and forks the process limit refused, so far."""
        oom = 0
        if self.memory is not None:
            oom = (_counter_in(self.memory / "memory.events", "oom_kill")
                   or _counter_in(self.memory / "memory.oom_control", "oom_kill"))
        return oom, _counter_in(self.pids / "pids.events", "max") if self.pids is not None else 0

    def emptied(self, wait_s: float) -> bool:
        """Kill whatever is left in the leaf; True once nothing is."""
        return _emptied(self.dirs, wait_s)

    def remove(self, wait_s: float = 2.0) -> None:
        """Kill whatever is left in the leaf and remove it (else a later ``clean_stale`` does)."""
        _emptied(self.dirs, wait_s)
        for path in self.dirs:
            with contextlib.suppress(OSError):
                path.rmdir()


class Cgroups:
    """Where this worker's per-command cgroups go. A leaf serves one command at a time and is kept
    for the next (making and removing one per command costs a few hundred microseconds)."""

    def __init__(self, pids_parent: Path | None, memory_parent: Path | None, version: int) -> None:
        self.pids_parent, self.memory_parent, self.version = pids_parent, memory_parent, version
        self._free: list[tuple[Leaf, int | None, int | None]] = []
        self._lock = threading.Lock()

    def acquire(self, memory_bytes: int | None, pids: int | None) -> Leaf:
        """A leaf with these limits (None: that controller is not limited), for one command."""
        with self._lock:
            kept = self._free.pop() if self._free else None
        if kept is not None and kept[1:] == (memory_bytes, pids):
            return kept[0]
        if kept is not None:
            kept[0].remove(0)
        return self.create(memory_bytes, pids)

    def release(self, leaf: Leaf, memory_bytes: int | None, pids: int | None) -> None:
        """The command is over: keep the leaf once nothing of it is left, else remove it."""
        if leaf.emptied(2.0):
            with self._lock:
                self._free.append((leaf, memory_bytes, pids))
        else:
            leaf.remove(0)  # a later clean_stale takes what is left

    @classmethod
    def detect(cls) -> Cgroups | None:
        """The writable hierarchies of this node (v1 ``pids`` and ``memory``, else v2), their
        ``warpfleet/`` folders made and cleared of dead workers' leaves; None where none is."""
        mine = _own_cgroups()
        pids = _v1_parent("pids", mine)
        memory = _v1_parent("memory", mine)
        if pids or memory:
            found = cls(pids, memory, 1)
        else:
            parent = _v2_parent(mine)
            if parent is None:
                return None
            found = cls(parent, parent, 2)
        found.clean_stale()
        return found

    def describe(self) -> str:
        kinds = [name for name, parent in (("pids", self.pids_parent), ("memory", self.memory_parent)) if parent]
        where = ", ".join(str(p) for p in dict.fromkeys(p for p in (self.pids_parent, self.memory_parent) if p))
        return f"cgroup v{self.version} {' and '.join(kinds)} under {where}"

    def create(self, memory_bytes: int | None, pids: int | None) -> Leaf:
        """A fresh leaf with these limits (None: that controller is not limited)."""
        name = f"{os.getpid()}-{next(_counter)}"
        leaf = Leaf(self.pids_parent / name if self.pids_parent else None,
                    self.memory_parent / name if self.memory_parent else None, self.version)
        try:
            for path in leaf.dirs:
                path.mkdir()
            if leaf.pids is not None and pids is not None:
                (leaf.pids / "pids.max").write_text(str(pids))
            if leaf.memory is not None and memory_bytes is not None:
                self._limit_memory(leaf.memory, memory_bytes)
        except OSError:
            leaf.remove(0)
            raise
        return leaf

    def _limit_memory(self, path: Path, memory_bytes: int) -> None:
        if self.version == 2:
            (path / "memory.max").write_text(str(memory_bytes))
            optional = {"memory.swap.max": "0"}
        else:
            (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
            optional = {"memory.memsw.limit_in_bytes": str(memory_bytes)}  # no escape into swap
        for name, value in optional.items():
            with contextlib.suppress(OSError):
                (path / name).write_text(value)

    def clean_stale(self) -> None:
        """Remove the leaves of workers that are gone."""
        for parent in {p for p in (self.pids_parent, self.memory_parent) if p}:
            with contextlib.suppress(OSError), os.scandir(parent) as entries:
                for entry in entries:
                    match = _LEAF.fullmatch(entry.name)
                    if match and entry.is_dir() and not pid_alive(int(match[1])):
                        Leaf(Path(entry.path), None, self.version).remove(0.5)


def node_memory_bytes() -> int:
    """The memory this node gives its processes: RAM, or less where this process's cgroup says so."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    mine = _own_cgroups()
    for controller, version, name in (("memory", 1, "memory.limit_in_bytes"), ("", 2, "memory.max")):
        mount = _mount(controller, version)
        if mount is not None and controller in mine:
            with contextlib.suppress(OSError, ValueError):  # v2 says "max" where there is no limit
                total = min(total, int((mount / mine[controller].lstrip("/") / name).read_text()))
    return total


# -- finding the hierarchies ---------------------------------------------------------------------

def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, and "" for the v2 hierarchy."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    return out


def _mount(controller: str, version: int) -> Path | None:
    """Where the v1 hierarchy of ``controller``, or the v2 hierarchy, is mounted."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, where, fstype, options, *_ = line.split()
            if version == 1 and fstype == "cgroup" and controller in options.split(","):
                return Path(where)
            if version == 2 and fstype == "cgroup2":
                return Path(where)
    return None


def _v1_parent(controller: str, mine: dict[str, str]) -> Path | None:
    mount = _mount(controller, 1)
    if mount is None or controller not in mine:
        return None
    parent = mount / mine[controller].lstrip("/") / "warpfleet"
    try:
        parent.mkdir(exist_ok=True)
    except OSError:
        return None
    return parent if os.access(parent, os.W_OK) else None


def _v2_parent(mine: dict[str, str]) -> Path | None:
    """``warpfleet/`` under this process's v2 cgroup, with the memory and pids controllers on for
    its children. A cgroup that holds processes cannot hand controllers down (unless it is the
    root), so this mostly works at the top of a hierarchy given to warpfleet (a container's)."""
    mount = _mount("", 2)
    if mount is None or "" not in mine:
        return None
    own = mount / mine[""].lstrip("/")
    parent = own / "warpfleet"
    try:
        if not {"memory", "pids"} <= set((own / "cgroup.controllers").read_text().split()):
            return None
        (own / "cgroup.subtree_control").write_text("+memory +pids")
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        return None
    return parent


def _counter_in(path: Path, name: str) -> int:
    with contextlib.suppress(ValueError):
        for line in _read(path).splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _emptied(dirs: tuple[Path, ...], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for d in dirs for pid in _read(d / "cgroup.procs").split()]
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.005)
