"""Running untrusted commands: an argument list, its own scratch directory, a timeout, limits.

Every compile and every run of a candidate goes through ``run_command``. It never uses a
shell, starts the command in a new session so that a timeout kills the whole process group
(a hung kernel launched by a forked helper included), and keeps stdout and stderr in files so
that a program printing gigabytes cannot fill the worker's memory. ``Limits`` bound what the
command may take: address space, the size of any one file (its output files included), and the
total size of its scratch directory and the number of files in it. The command's environment is
an allow-list (``CANDIDATE_ENV``, and the names the run config's ``sandbox.env`` adds). The
worker reaches its files in the scratch directory (its stdout and stderr among them) only through
``UntrustedDir``: never through a link the candidate left there.

A ``Sandbox`` decides how the command is started: ``cluster.sandbox.bwrap.Bubblewrap`` (its own
namespaces, a process and a memory limit, under another uid), or ``Unsandboxed`` (the above
only). ``cluster.sandbox.isolation.node_sandbox`` says which one this node uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cluster.core.limits import MB, Limits
from cluster.core.types import DeviceRecord
from cluster.sandbox.untrusted_dir import UntrustedDir

STDOUT_FILE, STDERR_FILE = ".warpfleet.stdout", ".warpfleet.stderr"  # a command's output, in its directory
TAIL_BYTES = 4096
STDOUT_READ_LIMIT = 16 * 1024 * 1024  # the metric parser reads at most this much stdout
KILL_GRACE_S = 0.5  # after its children are killed, how long a command that ran out of time may take to exit
DISK_POLL_S = 0.05  # how often the scratch directory is measured while the command runs (~1 ms for a small one)
WALK_SHARE = 0.1  # walking a command's directory (LimitWatch) takes at most this share of its time

# What a compiler or a CUDA program needs of the worker's environment (README, Security): nothing
# else reaches a command unless the run config's sandbox.env names it. HOME and TMPDIR are set by
# the sandbox (its scratch directory, its private /tmp).
CANDIDATE_ENV = frozenset({
    "PATH", "LD_LIBRARY_PATH", "TMPDIR", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ",
    "TERM",
    # compilers
    "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "PKG_CONFIG_PATH", "CC", "CXX",
    "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CUDA_HOME", "CUDA_PATH",
    # the CUDA driver and runtime
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
    "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_TF32_OVERRIDE",
    # OpenMP
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
})
# Substrings, not whole words: PGPASSWORD and APIKEY are secrets too. A harmless name caught by
# mistake (KEYBOARD_LAYOUT) costs a candidate nothing it needs.
_SECRET_NAME = re.compile("KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# What programs print when an allocation fails (strerror(ENOMEM), C++, CUDA and most runtimes, Python).
_OUT_OF_MEMORY = re.compile(r"Cannot allocate memory|std::bad_alloc|out of memory|MemoryError", re.IGNORECASE)
# What programs print when a fork or a thread is refused (strerror(EAGAIN), shells, C++).
_NO_PROCESS = re.compile(r"Resource temporarily unavailable|Cannot fork|can't fork|fork: retry", re.IGNORECASE)


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # None when it was killed for the timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    start_error: str = ""  # the command could not be started at all
    # "memory", "file size", "disk", "files", "cpu time", "processes" when known to be the cause
    limit_exceeded: str = ""
    limits: Limits | None = None
    limit_amount: str = ""  # the exceeded limit's size where the sandbox, not ``limits``, set it: "256 MB"
    refused: str = ""  # what the worker would not go through in the directory (a link where its file was)
    device: DeviceRecord | None = None  # what the GPU did, by warpfleet's device clock; None: not recorded

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and not self.start_error and not self.limit_exceeded
                and not self.refused)

    def describe(self) -> str:
        """One line on how it ended."""
        if self.refused:
            return f"refused: {self.refused}"
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.timed_out:
            reached = f": {self.limit_exceeded} limit of {self.limit_amount} reached" if self.limit_amount else ""
            return f"timed out after {self.seconds:.1f} s{reached}"
        how = f"exit status {self.returncode}" if self.returncode is not None else "stopped"
        if self.returncode is not None and self.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                how = f"killed by signal {-self.returncode}"
        if self.limit_exceeded and (self.limit_amount or self.limits):
            amount = self.limit_amount or self.limits.amount(self.limit_exceeded)  # type: ignore[union-attr]
            how += f": {self.limit_exceeded} limit of {amount} exceeded"
        return how

    def tail(self, limit: int = TAIL_BYTES) -> str:
        """The end of stderr and stdout together, for a row's error column."""
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip()
        head = self.describe()
        return head + ("\n" + text[-limit:] if text else "")


@dataclass(frozen=True)
class Ended:
    """What a sandbox tells of a command after it ended: its exit status as the command's own
    (a sandbox in between may report a signal as 128 + its number), and the sandbox's limit that
    ended it, if one did."""

    returncode: int | None
    limit: str = ""  # "memory", "processes"
    amount: str = ""  # "256 MB", "64" (processes)
    memory_mb: int | None = None  # the memory limit, where only the program's own words can tell it was hit
    pids: int | None = None  # the process limit, likewise (RLIMIT_NPROC)


@dataclass(frozen=True)
class Prepared:
    """A command as a sandbox starts it: the argv and environment to exec, what to do in the child
    between fork and exec, and what to call once the command (every process of it) has ended."""

    argv: list[str]
    env: dict[str, str]
    preexec: Callable[[], None] | None = None
    finish: Callable[[int | None], Ended] | None = None
    fds: tuple[int, ...] = ()  # descriptors the command must be given (``Popen(pass_fds=...)``); finish closes them


class SandboxError(OSError):
    """The sandbox cannot start a command on this node (``warpfleet doctor`` says why)."""


class Sandbox(ABC):
    """Isolation around each command that runs candidate code (built or run): a plug-in, so that
    the runners and the builder never know which one a node uses.

    Whoever starts a prepared command (``run_command``, or a runner that keeps a process alive)
    passes ``Prepared.argv``, ``env`` and ``preexec`` to ``subprocess.Popen`` with
    ``start_new_session=True`` and ``pass_fds`` holding ``Prepared.fds`` (and more as it likes: file
    descriptors reach the command), ends it with ``kill_command`` when it is done, and then calls
    ``Prepared.finish`` with the exit status, exactly once, also when ``Popen`` failed (with None)."""

    name: str = ""
    passed: tuple[str, ...] = ()  # more of the worker's variables a command gets (the run config's sandbox.env)

    def environment(self, base: Mapping[str, str], own: Mapping[str, str] | None = None) -> dict[str, str]:
        """A command's environment: of ``base`` (the worker's) the names in ``CANDIDATE_ENV`` and
        ``passed``, then ``own`` (warpfleet's own variables for it: the harness's, whatever their names)."""
        kept = {name: value for name, value in base.items() if name in CANDIDATE_ENV or name in self.passed}
        return {**kept, **(own or {})}

    @abstractmethod
    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        """``argv`` to run in ``cwd`` with ``env`` (``environment``'s; the sandbox sets HOME and
        TMPDIR) and ``limits``; ``cwd`` and ``writable`` are the only places it may write to; ``gpu``:
        the device's nodes are needed. Raises ``SandboxError`` (or another ``OSError``: a place that is
        a link) when the command cannot be started."""

    def hand_over(self, place: Path) -> None:  # noqa: B027  (a sandbox that keeps the worker's uid has nothing to do)
        """Make ``place``, made after its command started (a persistent host's candidate), the
        command's to write, as ``prepare`` does for the places it is given."""


class Unsandboxed(Sandbox):
    """No isolation beyond ``Limits``' rlimits and a new session: what ``--unsandboxed`` runs."""

    name = "off"

    def __init__(self, passed: Sequence[str] = ()) -> None:
        self.passed = tuple(passed)

    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        return Prepared(list(argv), {**env, "HOME": str(cwd)}, _set_rlimits(limits.rlimits()) if limits else None)


def scrubbed_env(base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` without the variables whose names look like secrets (keys, tokens, passwords): what
    Ray's workers are started with (``isolation.ray_env_vars``). A command gets far less
    (``Sandbox.environment``)."""
    return {name: value for name, value in base.items() if not _SECRET_NAME.search(name)}


def _read(fh: BinaryIO, limit: int) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - limit))
    return fh.read(limit).decode(errors="replace")


def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    stdout_limit: int = STDOUT_READ_LIMIT,
    limits: Limits | None = None,
    sandbox: Sandbox | None = None,
    gpu: bool = False,
    own_env: Mapping[str, str] | None = None,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` under ``limits`` inside ``sandbox`` (default: ``Unsandboxed``);
    never raises for the command's own failures.

    Of ``env`` (default: this process's environment) the command gets what ``Sandbox.environment``
    allows, and ``own_env`` (warpfleet's variables for it) whatever their names. Its stdout and
    stderr go to fresh files in ``cwd``: a link, a FIFO or a folder that a command before it left at
    their names is refused (``ProcessResult.refused``), never opened.
    """
    sandbox = sandbox or Unsandboxed()
    start = time.perf_counter()
    try:
        place = UntrustedDir(cwd)
    except OSError as exc:
        return ProcessResult(None, "", "", 0.0, refused=str(exc))
    with contextlib.ExitStack() as stack:
        stack.callback(place.close)
        try:
            out = stack.enter_context(place.capture(STDOUT_FILE))
            err = stack.enter_context(place.capture(STDERR_FILE))
        except OSError as exc:
            return ProcessResult(None, "", "", 0.0, refused=f"{exc.strerror or exc} (in {cwd})")
        environment = sandbox.environment(os.environ if env is None else env, own_env)
        launch: Prepared | None = None
        try:
            launch = sandbox.prepare(argv, cwd, environment, limits, gpu)
            proc = subprocess.Popen(
                launch.argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, pass_fds=launch.fds,
                env=launch.env, start_new_session=True, preexec_fn=launch.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if launch is not None and launch.finish:
                launch.finish(None)
            return ProcessResult(None, "", "", time.perf_counter() - start, start_error=str(exc))
        try:
            timed_out = _wait(proc, place, start + timeout, limits)
        finally:
            kill_command(proc)
        ended = launch.finish(proc.returncode) if launch.finish else Ended(proc.returncode)
        seconds = time.perf_counter() - start
        # Read through our own handles: the command may have deleted or replaced the files.
        result = ProcessResult(
            None if timed_out else ended.returncode,
            _read(out, stdout_limit),
            _read(err, 64 * 1024),
            seconds,
            timed_out=timed_out,
            limits=limits,
        )
        if limits and not timed_out:
            result = _with_limit_exceeded(result, limits, place, (out, err))
        if not result.limit_exceeded and not result.ok:
            result = _with_sandbox_limit(result, ended)
    return result


def _with_sandbox_limit(result: ProcessResult, ended: Ended) -> ProcessResult:
    """Name the sandbox's limit that ended the command: the one it saw hit, or where only rlimits
    hold them, the one the program said it ran into (an allocation or a fork refused)."""
    if ended.limit:
        return dataclasses.replace(result, limit_exceeded=ended.limit, limit_amount=ended.amount)
    if ended.memory_mb is not None and _OUT_OF_MEMORY.search(result.stderr):
        return dataclasses.replace(result, limit_exceeded="memory", limit_amount=f"{ended.memory_mb} MB")
    if ended.pids is not None and _NO_PROCESS.search(result.stderr):
        return dataclasses.replace(result, limit_exceeded="processes", limit_amount=str(ended.pids))
    return result


def _set_rlimits(rlimits: list[tuple[int, int, int]]) -> Callable[[], None]:
    # Runs in the child between fork and exec: computed beforehand, it only makes system calls.
    def apply() -> None:
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))

    return apply


def over_limit(place: UntrustedDir, limits: Limits | None) -> str:
    """The limit of ``limits`` on the directory that it is past now: "disk", "files" or ""."""
    if limits is None or (limits.disk_mb is None and limits.files is None):
        return ""
    max_bytes = limits.disk_mb * MB if limits.disk_mb is not None else None
    size, entries = place.usage(max_bytes, limits.files)
    if max_bytes is not None and size > max_bytes:
        return "disk"
    return "files" if limits.files is not None and entries > limits.files else ""


class LimitWatch:
    """Whether a running command's directory is past its disk or file-count limit, at a bounded cost.

    The file system's own counters (``statvfs``: blocks and inodes in use) say how much all of it
    grew since the command started; while that is within the limits, so is the directory, and
    nothing is walked. Past them (another process's files count too), or where the file system
    keeps no inode count, the directory is walked (``over_limit``), and the next walk waits nine
    times as long as this one took: counting an inode bomb's 100,000 files (a second or more on a
    busy node) must not take the CPU that the bomb, and the node, need. A sparse file, whose size
    the block counters do not see, is found by the walk after the command ends."""

    def __init__(self, place: UntrustedDir, limits: Limits | None) -> None:
        self.place, self.limits = place, limits
        self.active = limits is not None and (limits.disk_mb is not None or limits.files is not None)
        self.start = self._in_use() if self.active else None
        self.next_walk = 0.0

    def _in_use(self) -> tuple[int, int | None] | None:
        """(bytes, inodes) in use on the directory's file system; inodes None where it keeps no count."""
        try:
            fs = os.fstatvfs(self.place.fileno())
        except OSError:
            return None
        return (fs.f_blocks - fs.f_bfree) * fs.f_frsize, (fs.f_files - fs.f_ffree) if fs.f_files else None

    def _within_by_counters(self) -> bool:
        now, limits = self._in_use(), self.limits
        if now is None or self.start is None or now[1] is None or self.start[1] is None or limits is None:
            return False
        disk_ok = limits.disk_mb is None or now[0] - self.start[0] <= limits.disk_mb * MB
        files_ok = limits.files is None or now[1] - self.start[1] <= limits.files
        return disk_ok and files_ok

    def over(self) -> str:
        """The limit the directory is past ("disk", "files"), or "" (also: not looked at this time)."""
        if not self.active or self._within_by_counters() or time.perf_counter() < self.next_walk:
            return ""
        began = time.perf_counter()
        kind = over_limit(self.place, self.limits)
        ended = time.perf_counter()
        self.next_walk = ended + (ended - began) * (1 - WALK_SHARE) / WALK_SHARE
        return kind


def _wait(proc: subprocess.Popen[bytes], place: UntrustedDir, deadline: float, limits: Limits | None) -> bool:
    """Wait for the command to exit; True if the deadline came first. With a disk or a file-count
    limit, stop waiting as soon as the directory grows past it (the caller kills the group either way).

    Waits on a pidfd where there is one: ``Popen.wait(timeout)`` polls with doubling sleeps, which
    adds up to half a command's time to a short one."""
    watch = LimitWatch(place, limits)
    watched = watch.active
    with _pidfd(proc.pid) as fd:
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return True
            step = min(remaining, DISK_POLL_S) if watched else remaining
            if fd is not None:
                select.select([fd], [], [], step)
                if proc.poll() is not None:
                    return False
            else:
                try:
                    proc.wait(timeout=step)
                    return False
                except subprocess.TimeoutExpired:
                    pass
            if watched and watch.over():
                return False


@contextmanager
def _pidfd(pid: int) -> Iterator[int | None]:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _with_limit_exceeded(result: ProcessResult, limits: Limits, place: UntrustedDir,
                         outputs: tuple[BinaryIO, BinaryIO]) -> ProcessResult:
    """Name the limit that ended (or spoiled) the run, where that can be told."""
    return dataclasses.replace(result, limit_exceeded=over_limit(place, limits) or _limit_hit(result, limits, outputs))


def _limit_hit(result: ProcessResult, limits: Limits, outputs: tuple[BinaryIO, BinaryIO]) -> str:
    """The rlimit that ended the run, where its signal or its words tell."""
    if result.returncode == -signal.SIGXFSZ:
        return "file size"
    if result.returncode == -signal.SIGXCPU:
        return "cpu time"
    if limits.file_mb is not None and (any(os.fstat(f.fileno()).st_size >= limits.file_mb * MB for f in outputs)
                                       or (result.returncode != 0 and "File too large" in result.stderr)):
        return "file size"  # a program that ignores SIGXFSZ gets EFBIG (strerror: File too large) instead
    if limits.memory_mb is not None and result.returncode != 0 and _OUT_OF_MEMORY.search(result.stderr):
        return "memory"  # RLIMIT_AS makes allocations fail; a program that dies of it may not say so
    return ""


def kill_command(proc: subprocess.Popen[bytes]) -> None:
    """End a command started in a new session, and every process of it; reaps it."""
    # Children left behind by the command (or a hung one) must not outlive the candidate.
    if proc.poll() is None:
        # Its children first, and a moment for it to reap them: a sandbox's init killed after
        # bubblewrap would be an orphan, a zombie of the sandbox's uid where pid 1 does not reap.
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_command(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """End a command started in a new session politely: SIGTERM to its process group and ``grace_s``
    to exit (a Ray driver shuts its workers down), then ``kill_command`` for what is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    kill_command(proc)


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@contextmanager
def scratch_dir(root: Path | None, prefix: str) -> Iterator[Path]:
    """A fresh directory that is removed afterwards, whatever happened inside. Its name ends in
    ``.wf<pid>@<host>``, its owner's, so that ``clean_stale_scratch`` can tell a dead worker's."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=owned_suffix(), dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_HOST = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]


_OWNED = re.compile(r"\.wf(\d+)@([A-Za-z0-9_.-]+)$")


def owned_suffix() -> str:
    """The end of a scratch folder's name that says whose it is (``clean_stale_scratch`` reads it)."""
    return f".wf{os.getpid()}@{_HOST}"


def clean_stale_scratch(root: Path | None) -> int:
    """Remove the scratch directories under ``root`` (default: the temporary directory) that a
    process of this host made and that outlived it (a worker killed mid-command); returns how many."""
    removed = 0
    with contextlib.suppress(OSError), os.scandir(root or tempfile.gettempdir()) as entries:
        for entry in entries:
            owner = _OWNED.search(entry.name)
            if owner and owner[2] == _HOST and not pid_alive(int(owner[1])) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def read_output(place: UntrustedDir, rel: str) -> bytes | None:
    """The file ``rel`` that a command wrote in ``place``, or None where there is no regular file
    (a link to /etc/shadow where an output should be is not read)."""
    try:
        return place.read(rel)
    except OSError:
        return None


def write_bundle(files: Sequence[tuple[str, bytes]], into: Path) -> None:
    for rel, content in files:
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
