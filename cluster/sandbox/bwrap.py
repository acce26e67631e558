"""The bubblewrap sandbox: each build and run of a candidate in namespaces of its own.

What a command started through ``Bubblewrap.prepare`` gets (flags in ``_mounts`` and ``_namespaces``):

- the node's root file system read-only, but for the runs' output directory (the references,
  other candidates' rows and outputs), out of sight behind an empty tmpfs; its scratch directory
  (and ``writable``) the only places it may write to; a private ``/tmp``, and the scratch root
  behind a private tmpfs, so that it sees no other command's directory; credentials in the
  worker's home hidden;
- bubblewrap's minimal ``/dev``, and on GPU workers the platform's device nodes (NVIDIA's), nothing else;
- a PID namespace whose init (``INIT``) is the command's parent (``--die-with-parent``): when the
  command's main process exits, or the worker kills bubblewrap, every process it started is gone;
  ``/proc`` shows those processes only;
- no network but its own loopback (``--unshare-net``), its own IPC and host name;
- an environment of the variables it needs only (``Sandbox.environment``'s allow-list, with HOME
  its scratch directory and TMPDIR its /tmp), bubblewrap itself started with it, so that no
  ``/proc/*/environ`` in the sandbox holds a secret;
- its writable places bound by descriptor (``--bind-fd``), each opened refusing a link and handed
  over through that descriptor: a candidate that swapped a place for a link between two commands
  (a persistent host's staged directory) gets neither the link's target bound nor chowned;
- as root, a uid of its own per worker (``UID_BASE + the worker's pid``): the worker's files and
  ``~/.ray/auth_token`` (mode 600) are not its to read, and RLIMIT_NPROC, which root ignores,
  counts its processes. Bubblewrap then runs privileged (no user namespace) and setpriv drops to
  the uid inside; as another user, bubblewrap makes a user namespace and the command keeps its uid;
- a process limit and a memory limit: a cgroup per command where one is writable
  (``cluster.sandbox.cgroups``; the OOM killer's and the fork limit's hits are reported), else
  RLIMIT_NPROC and RLIMIT_DATA (never RLIMIT_AS: CUDA reserves far more address space than it uses).
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import SandboxSpec
from cluster.core.limits import MB, Limits
from cluster.platform import node_platform
from cluster.sandbox.cgroups import Cgroups, Leaf, node_memory_bytes
from cluster.sandbox.sandbox import Ended, Prepared, Sandbox, SandboxError
from cluster.sandbox.untrusted_dir import UntrustedDir

UID_BASE = 1_900_000_000  # + the worker's pid (below 2^22): a uid per worker, far from any real user's
BOOKKEEPING_PIDS = 2  # bubblewrap and INIT, in the command's process count
# The sandbox's pid 1: a shell that runs the command (not as pid 1, which
# ignores the signals it sends itself: abort() would not end it), reaps what it orphans, and exits
# with its status (128 + N for signal N), taking every process of the sandbox with it. Not
# bubblewrap's own init, which bubblewrap leaves behind as an orphan: a zombie against the uid's
# RLIMIT_NPROC where pid 1 does not reap.
INIT = ("/bin/sh", "-c", '"$@"; exit $?', "sh")
# Credentials under the worker's home, hidden even where the command could read them (not root).
HIDDEN = (".ray", ".ssh", ".aws", ".azure", ".kube", ".docker", ".gnupg", ".config/gcloud", ".config/gh",
          ".netrc", ".git-credentials", ".pypirc", ".cache/huggingface/token")
# Where scripts/bubblewrap.sh unpacks Debian's bubblewrap when the system has none: this environment's.
UNPACKED = Path(sys.prefix) / "bubblewrap" / "usr" / "bin" / "bwrap"


@dataclass(frozen=True)
class Program:
    """The bwrap executable and its version."""

    path: str
    version: tuple[int, ...]

    @classmethod
    def find(cls, configured: str | None) -> Program:
        """``configured`` (a path or a name on PATH), else ``bwrap`` on PATH, else the one unpacked
        into this virtual environment (``UNPACKED``), which no PATH outside the scripts names."""
        path = shutil.which(configured) if configured else shutil.which("bwrap") or shutil.which(str(UNPACKED))
        if path is None:
            where = f"{configured!r} not found" if configured else f"bwrap not found on PATH nor at {UNPACKED}"
            raise SandboxError(f"{where} (install bubblewrap, or set sandbox.bwrap or WARPFLEET_BWRAP)")
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxError(f"{path} does not run: {exc}") from None
        found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
        if not found:
            raise SandboxError(f"{path} is not bubblewrap (--version says {out.strip()[:60]!r})")
        return cls(path, tuple(int(x) for x in found.groups(default="0")))


class Bubblewrap(Sandbox):
    """Each command in bubblewrap, under the limits of ``spec`` (module docstring)."""

    name = "bwrap"

    def __init__(self, program: Program, spec: SandboxSpec, gpu: bool = False, cgroups: Cgroups | None = None,
                 uid: int | None = None, home: Path | None = None, hidden: Sequence[Path] = (),
                 out_of_sight: Sequence[Path] = ()) -> None:
        """``gpu``: bind the GPU platform's device nodes into every command; ``uid``: run commands as this
        uid (the worker is root); ``hidden``: more files to hide (a Ray token file elsewhere);
        ``out_of_sight``: folders no command may see, whenever they come to exist (the runs'
        output directory: the references, every candidate's rows and outputs)."""
        self.program, self.spec, self.gpu, self.cgroups, self.uid = program, spec, gpu, cgroups, uid
        self.passed = tuple(spec.env)
        self.memory_mb = spec.memory_mb or node_memory_bytes() // 2 // MB
        home = home or Path.home()
        self.hidden = tuple(p for p in (*(home / h for h in HIDDEN), *hidden) if p.exists())
        self.out_of_sight = tuple(Path(p).absolute() for p in out_of_sight)
        # The Python that runs warpfleet (a runner's host, a launcher) and warpfleet itself (its
        # harness headers) must be there for the command: where they live below the private /tmp
        # (a clone in /tmp) or below a folder the command's uid cannot pass (/root/.pyenv,
        # /root/warpfleet), they are bound in, read-only.
        self.readable = tuple(p for p in _python_homes()
                              if p.is_relative_to("/tmp") or (uid is not None and not _passable(p)))
        if gpu:
            node_platform().prepare_nodes()
        self.gpu_nodes = node_platform().device_paths()
        self.modern = program.version >= (0, 8)  # --size and --disable-userns
        self.by_fd = program.version >= (0, 5)  # --bind-fd
        self.setpriv = ""
        if uid is not None:
            self.setpriv = shutil.which("setpriv") or ""
            if not self.setpriv:
                raise SandboxError("setpriv not found (util-linux): as root, commands drop to their uid through it")

    def describe(self) -> str:
        limits = self.cgroups.describe() if self.cgroups else "rlimits (RLIMIT_NPROC, RLIMIT_DATA)"
        who = f"uid {self.uid}" if self.uid is not None else f"uid {os.getuid()} (not root: the worker's own)"
        return (f"bubblewrap {'.'.join(map(str, self.program.version))} at {self.program.path}; {who}; "
                f"{self.spec.pids} processes, {self.memory_mb} MB by {limits}; "
                f"network {'shared' if self.spec.network else 'off'}")

    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        cwd = Path(cwd).absolute()
        places = list(dict.fromkeys([cwd, *(Path(w).absolute() for w in writable)]))
        held: dict[Path, UntrustedDir] = {}
        try:
            for place in places:
                held[place] = UntrustedDir(place)  # a link is refused: never bound, never chowned
                if self.uid is not None:
                    held[place].hand_over(self.uid)
        except BaseException:
            for opened in held.values():
                opened.close()
            raise
        leaf = None
        try:
            leaf = self._leaf()
            args = [*self._mounts(held, limits, gpu or self.gpu), *self._namespaces(), "--chdir", str(cwd)]
            preexec = _child_setup(leaf.join_files() if leaf else (), self._rlimits(limits, leaf))
        except BaseException:
            self._finisher(leaf, held)(None)
            raise
        return Prepared([self.program.path, *args, "--", *INIT, *self._drop(), *argv],
                        self._environment(env, cwd), preexec, self._finisher(leaf, held),
                        tuple(d.fileno() for d in held.values()) if self.by_fd else ())

    def hand_over(self, place: Path) -> None:
        if self.uid is not None:
            with UntrustedDir(place) as held:
                held.hand_over(self.uid)

    def _drop(self) -> list[str]:
        """As root, bubblewrap runs privileged (no user namespace needed, and it reaches any scratch
        directory) and the command becomes its uid through setpriv, with no capability left. INIT
        stays root (with no capability but these two): a parent-death signal from bubblewrap, which
        --die-with-parent sets, reaches only a process of its own uid."""
        if self.uid is None:
            return []
        return [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--inh-caps=-all", "--"]

    def _leaf(self) -> Leaf | None:
        if self.cgroups is None:
            return None
        try:
            return self.cgroups.acquire(*self._cgroup_limits())
        except OSError as exc:
            raise SandboxError(f"cannot make the command's cgroup: {exc}") from None

    def _cgroup_limits(self) -> tuple[int, int]:
        return self.memory_mb * MB, self.spec.pids + BOOKKEEPING_PIDS

    def _mounts(self, places: dict[Path, UntrustedDir], limits: Limits | None, gpu: bool) -> list[str]:
        args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for node in self.gpu_nodes if gpu else ():
            args += ["--dev-bind", node, node]
        for path in self.hidden:
            args += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        for path in self.out_of_sight:
            if path.is_dir():  # an empty folder in its place: a command finds nothing there
                args += ["--perms", "0755", "--tmpfs", str(path)]
        size = ["--size", str(limits.disk_mb * MB)] if self.modern and limits and limits.disk_mb else []
        tops: list[Path] = [Path("/tmp")]
        for shared in ("/tmp", "/dev/shm"):  # private, and anyone's to write to, as on the host
            args += ["--perms", "1777", *size, "--tmpfs", shared]
        made: list[Path] = []
        for place, bind in [*((r, "--ro-bind") for r in self.readable), *((p, "--bind") for p in places)]:
            top = next((t for t in tops if place.is_relative_to(t)), None)
            if top is None:
                top = self._cover(place)
                tops.append(top)
                args += [*size, "--tmpfs", str(top)]
            # The folders down to the place, made in the tmpfs as the command's uid can pass them
            # (bubblewrap would make them root's only, copying the host's).
            for folder in reversed(place.parents):
                if folder.is_relative_to(top) and folder != top and folder not in made:
                    made.append(folder)
                    args += ["--dir", str(folder)]
            if bind == "--bind" and self.by_fd:
                args += ["--bind-fd", str(places[place].fileno()), str(place)]  # the folder held, not its name
            else:
                args += [bind, str(place), str(place)]
        return args

    def _cover(self, place: Path) -> Path:
        """Where a tmpfs goes over the host for a writable place outside /tmp: its parent (other
        commands' scratch directories out of sight), or higher, at the first folder the command's
        uid could not pass on the host (so that it can reach the place by its absolute path)."""
        if self.uid is not None:
            for folder in reversed(place.parents[:-1]):  # from the top down, / excluded
                if not folder.stat().st_mode & 0o001:
                    return folder
        return place.parent

    def _namespaces(self) -> list[str]:
        args = ["--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session"]
        if self.uid is not None:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]  # for setpriv (_drop) alone
        elif self.modern:
            args += ["--unshare-user", "--disable-userns"]  # no nested namespaces to widen the kernel's surface
        if not self.spec.network:
            args.append("--unshare-net")
        return args

    def _environment(self, env: Mapping[str, str], cwd: Path) -> dict[str, str]:
        return {**env, "HOME": str(cwd), "TMPDIR": "/tmp"}

    def _rlimits(self, limits: Limits | None, leaf: Leaf | None) -> list[tuple[int, int, int]]:
        """``limits``' own, and the sandbox's where no cgroup holds them."""
        out = limits.rlimits() if limits else []
        if self.uid is not None:  # a backstop even with a cgroup: the uid is the command's alone
            nproc = self.spec.pids + BOOKKEEPING_PIDS + 8
            out.append((resource.RLIMIT_NPROC, nproc, nproc))
        elif leaf is None or leaf.pids is None:  # the worker's own uid: its tasks count too
            nproc = _tasks_of(os.getuid()) + self.spec.pids + BOOKKEEPING_PIDS
            out.append((resource.RLIMIT_NPROC, nproc, nproc))
        if leaf is None or leaf.memory is None:
            data = self.memory_mb * MB
            out.append((resource.RLIMIT_DATA, data, data))
        return out

    def _finisher(self, leaf: Leaf | None, held: Mapping[Path, UntrustedDir]) -> Callable[[int | None], Ended]:
        before = leaf.hits() if leaf else (0, 0)  # a leaf serves command after command: count this one's

        def finish(returncode: int | None) -> Ended:
            for place in held.values():
                place.close()
            hit = ""
            if leaf and self.cgroups:
                after = leaf.hits()
                hit = "memory" if after[0] > before[0] else "processes" if after[1] > before[1] else ""
                self.cgroups.release(leaf, *self._cgroup_limits())
            amount = {"memory": f"{self.memory_mb} MB", "processes": str(self.spec.pids)}.get(hit, "")
            memory = self.memory_mb if leaf is None or leaf.memory is None else None  # held by rlimits
            pids = self.spec.pids if leaf is None or leaf.pids is None else None
            return Ended(_as_signal(returncode), hit, amount, memory, pids)

        return finish


def _as_signal(returncode: int | None) -> int | None:
    """The sandbox's init (and so bubblewrap) exits with 128 + N when the command died of signal N:
    say so, as Popen would (a program that exits with 137 itself reads as killed by SIGKILL; it is
    rare, and a failure either way)."""
    if returncode is not None and 128 < returncode <= 128 + 64:
        return 128 - returncode
    return returncode


PACKAGES = ("cluster", "agents", "search_spaces")  # warpfleet's top-level packages (pyproject.toml)


def _python_homes() -> list[Path]:
    """Where this Python's interpreter and installed packages are (its installation, the virtual
    environment, the package folders of its search path: named site-packages or dist-packages, or
    holding installed distributions' `*.dist-info`, as `pip install --target DIR` on PYTHONPATH
    does) and warpfleet's own packages (not the checkout around them, which may hold a user's
    files), the fewest folders that hold them all; never a working directory of the search path,
    nor / or /tmp themselves (a command's own places are bound as they are)."""
    source = Path(__file__).resolve().parents[2]  # a checkout's root, or site-packages
    found = [Path(os.path.realpath(sys.executable)).parents[1], Path(sys.prefix).resolve(),
             Path(sys.base_prefix).resolve(), *(source / package for package in PACKAGES),
             *(Path(p).resolve() for p in sys.path if p and (Path(p).name in ("site-packages", "dist-packages")
                                                             or _holds_distributions(Path(p), source)))]
    homes: list[Path] = []
    for path in sorted(set(found), key=lambda p: len(p.parts)):
        if path.is_dir() and path not in (Path("/"), Path("/tmp")) and not any(path.is_relative_to(h) for h in homes):
            homes.append(path)
    return homes


def _holds_distributions(folder: Path, checkout: Path) -> bool:
    """A folder of installed packages: it holds a distribution's `*.dist-info`; never the checkout
    (an editable install's, with `*.egg-info` and the user's files) nor the home folder or one
    above it (its secrets stay hidden)."""
    try:
        folder = folder.resolve()
        return (folder != checkout and not Path.home().resolve().is_relative_to(folder) and folder.is_dir()
                and any(folder.glob("*.dist-info")))
    except OSError:
        return False


def _passable(path: Path) -> bool:
    """Whether anyone may pass every folder down to ``path``."""
    return all(folder.stat().st_mode & 0o001 for folder in [*reversed(path.parents), path] if folder.exists())


def _tasks_of(uid: int) -> int:
    """Processes and threads of ``uid`` now: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _child_setup(join_files: Sequence[str], rlimits: list[tuple[int, int, int]]) -> Callable[[], None]:
    # Runs in the child between fork and exec: all is computed beforehand, it only makes system calls.
    def setup() -> None:
        for path in join_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # this process (Leaf.join_files)
            finally:
                os.close(fd)
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))

    return setup


def sandbox_uid() -> int | None:
    """The uid this worker's commands run as: None unless we are root (then they must not be)."""
    if os.geteuid() != 0:
        return None
    uid = UID_BASE + os.getpid()
    return uid if _mapped(uid) else _mapped_top() - (os.getpid() % 4096)


def _mapped(uid: int) -> bool:
    return any(lo <= uid < lo + n for lo, n in _uid_ranges())


def _mapped_top() -> int:
    """Below the highest uid this user namespace maps (a container may map 65536 only)."""
    return max((lo + n for lo, n in _uid_ranges()), default=65536) - 3  # never 65535 ((uid_t) -1 of old ABIs) or nobody


def _uid_ranges() -> list[tuple[int, int]]:
    with contextlib.suppress(OSError, ValueError):
        rows = [line.split() for line in Path("/proc/self/uid_map").read_text().splitlines()]
        return [(int(inside), int(count)) for inside, _, count in rows]
    return []
