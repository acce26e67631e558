"""Running untrusted commands: an argument list, its own scratch directory, a timeout, limits.

Every compile and every run of a candidate goes through ``run_command``. It never uses a
shell, starts the command in a new session so that a timeout kills the whole process group
(a hung kernel launched by a forked helper included), and keeps stdout and stderr in files so
that a program printing gigabytes cannot fill the worker's memory. ``Limits`` bound what the
command may take: address space, the size of any one file (its output files included), and the
total size of its scratch directory. The command sees the worker's environment minus anything
that looks like a secret.

A ``Sandbox`` decides how the command is started: ``cluster.runners.bwrap.Bubblewrap`` (its own
namespaces, a process and a memory limit, under another uid), or ``Unsandboxed`` (the above
only). ``cluster.runners.isolation.node_sandbox`` says which one this node uses.
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

TAIL_BYTES = 4096
STDOUT_READ_LIMIT = 16 * 1024 * 1024  # the metric parser reads at most this much stdout
KILL_GRACE_S = 0.5  # after its children are killed, how long a command that ran out of time may take to exit
DISK_POLL_S = 0.05  # how often the scratch directory is measured while the command runs (~1 ms for a small one)

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
    limit_exceeded: str = ""  # "memory", "file size", "disk", "cpu time", "processes" when known to be the cause
    limits: Limits | None = None
    limit_amount: str = ""  # the exceeded limit's size where the sandbox, not ``limits``, set it: "256 MB"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.start_error and not self.limit_exceeded

    def describe(self) -> str:
        """One line on how it ended."""
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.timed_out:
            reached = f": {self.limit_exceeded} limit of {self.limit_amount} reached" if self.limit_amount else ""
            return f"timed out after {self.seconds:.1f} s{reached}"
        how = f"exit status {self.returncode}"
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


class SandboxError(OSError):
    """The sandbox cannot start a command on this node (``warpfleet doctor`` says why)."""


class Sandbox(ABC):
    """Isolation around each command that runs candidate code (built or run): a plug-in, so that
    the runners and the builder never know which one a node uses.

    Whoever starts a prepared command (``run_command``, or a runner that keeps a process alive)
    passes ``Prepared.argv``, ``env`` and ``preexec`` to ``subprocess.Popen`` with
    ``start_new_session=True`` (and ``pass_fds`` as it likes: file descriptors reach the command),
    ends it with ``kill_command`` when it is done, and then calls ``Prepared.finish`` with the exit
    status, exactly once, also when ``Popen`` failed (with None)."""

    name: str = ""

    @abstractmethod
    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        """``argv`` to run in ``cwd`` with ``env`` and ``limits``; ``cwd`` and ``writable`` are the
        only places it may write to; ``gpu``: the device's nodes are needed. Raises ``SandboxError``
        when the command cannot be started."""

    def hand_over(self, place: Path) -> None:  # noqa: B027  (a sandbox that keeps the worker's uid has nothing to do)
        """Make ``place``, made after its command started (a persistent host's candidate), the
        command's to write, as ``prepare`` does for the places it is given."""


class Unsandboxed(Sandbox):
    """No isolation beyond ``Limits``' rlimits and a new session: what ``--unsandboxed`` runs."""

    name = "off"

    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        return Prepared(list(argv), dict(env), _set_rlimits(limits.rlimits()) if limits else None)


def scrubbed_env(base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` without the variables whose names look like secrets (keys, tokens, passwords).

    A candidate is untrusted code, and whatever it can read it can print into a row's error column.
    """
    return {name: value for name, value in base.items() if not _SECRET_NAME.search(name)}


def _read(fh: BinaryIO, limit: int) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - limit))
    return fh.read(limit).decode(errors="replace")


def directory_size(path: Path) -> int:
    """Bytes in the files under ``path``. Links are not followed; files that vanish are skipped."""
    total, pending = 0, [path]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
    return total


def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    stdout_limit: int = STDOUT_READ_LIMIT,
    limits: Limits | None = None,
    sandbox: Sandbox | None = None,
    gpu: bool = False,
) -> ProcessResult:
    """Run ``argv`` in ``cwd`` under ``limits`` inside ``sandbox`` (default: ``Unsandboxed``);
    never raises for the command's own failures.

    ``env`` (default: this process's environment) reaches the command without its secrets.
    """
    out_path, err_path = cwd / ".warpfleet.stdout", cwd / ".warpfleet.stderr"
    start = time.perf_counter()
    with out_path.open("w+b") as out, err_path.open("w+b") as err:
        environment = scrubbed_env(os.environ if env is None else env)
        launch: Prepared | None = None
        try:
            launch = (sandbox or Unsandboxed()).prepare(argv, cwd, environment, limits, gpu)
            proc = subprocess.Popen(
                launch.argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env=launch.env, start_new_session=True, preexec_fn=launch.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if launch is not None and launch.finish:
                launch.finish(None)
            return ProcessResult(None, "", "", time.perf_counter() - start, start_error=str(exc))
        try:
            timed_out = _wait(proc, cwd, start + timeout, limits.disk_mb if limits else None)
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
            result = _with_limit_exceeded(result, limits, cwd, (out, err))
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


def _wait(proc: subprocess.Popen[bytes], cwd: Path, deadline: float, disk_mb: int | None) -> bool:
    """Wait for the command to exit; True if the deadline came first. With a disk limit, stop
    waiting as soon as ``cwd`` grows past it (the caller kills the group either way).

    Waits on a pidfd where there is one: ``Popen.wait(timeout)`` polls with doubling sleeps, which
    adds up to half a command's time to a short one."""
    with _pidfd(proc.pid) as fd:
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return True
            step = remaining if disk_mb is None else min(remaining, DISK_POLL_S)
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
            if disk_mb is not None and directory_size(cwd) > disk_mb * MB:
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


def _with_limit_exceeded(result: ProcessResult, limits: Limits, cwd: Path,
                         outputs: tuple[BinaryIO, BinaryIO]) -> ProcessResult:
    """Name the limit that ended (or spoiled) the run, where that can be told."""
    kind = ""
    if limits.disk_mb is not None and directory_size(cwd) > limits.disk_mb * MB:
        kind = "disk"
    elif result.returncode == -signal.SIGXFSZ:
        kind = "file size"
    elif result.returncode == -signal.SIGXCPU:
        kind = "cpu time"
    elif limits.file_mb is not None and (any(os.fstat(f.fileno()).st_size >= limits.file_mb * MB for f in outputs)
                                         or (result.returncode != 0 and "File too large" in result.stderr)):
        kind = "file size"  # a program that ignores SIGXFSZ gets EFBIG (strerror: File too large) instead
    elif limits.memory_mb is not None and result.returncode != 0 and _OUT_OF_MEMORY.search(result.stderr):
        kind = "memory"  # RLIMIT_AS makes allocations fail; a program that dies of it may not say so
    return dataclasses.replace(result, limit_exceeded=kind)


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


def inside(workdir: Path, rel: str) -> Path | None:
    """``workdir / rel`` if it is a file that is really there, links followed; None otherwise. A
    candidate that leaves a link to /etc/shadow where its output should be must not get the
    worker to read it."""
    path = workdir / rel
    real = path.resolve()
    return path if real.is_relative_to(workdir.resolve()) and real.is_file() else None


def write_bundle(files: Sequence[tuple[str, bytes]], into: Path) -> None:
    for rel, content in files:
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
