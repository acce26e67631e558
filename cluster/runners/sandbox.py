"""Running untrusted commands: an argument list, its own scratch directory, a timeout, limits.

Every compile and every run of a candidate goes through ``run_command``. It never uses a
shell, starts the command in a new session so that a timeout kills the whole process group
(a hung kernel launched by a forked helper included), and keeps stdout and stderr in files so
that a program printing gigabytes cannot fill the worker's memory. ``Limits`` bound what the
command may take: address space, the size of any one file (its output files included), and the
total size of its scratch directory. The command sees the worker's environment minus anything
that looks like a secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import resource
import shutil
import signal
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
DISK_POLL_S = 0.05  # how often the scratch directory is measured while the command runs (~1 ms for a small one)

# Substrings, not whole words: PGPASSWORD and APIKEY are secrets too. A harmless name caught by
# mistake (KEYBOARD_LAYOUT) costs a candidate nothing it needs.
_SECRET_NAME = re.compile("KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# What programs print when an allocation fails (strerror(ENOMEM), C++, CUDA and most runtimes, Python).
_OUT_OF_MEMORY = re.compile(r"Cannot allocate memory|std::bad_alloc|out of memory|MemoryError", re.IGNORECASE)


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # None when it was killed for the timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    start_error: str = ""  # the command could not be started at all
    limit_exceeded: str = ""  # "memory", "file size", "disk", "cpu time" when that is known to be the cause
    limits: Limits | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.start_error and not self.limit_exceeded

    def describe(self) -> str:
        """One line on how it ended."""
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s"
        how = f"exit status {self.returncode}"
        if self.returncode is not None and self.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                how = f"killed by signal {-self.returncode}"
        if self.limit_exceeded and self.limits:
            how += f": {self.limit_exceeded} limit of {self.limits.amount(self.limit_exceeded)} exceeded"
        return how

    def tail(self, limit: int = TAIL_BYTES) -> str:
        """The end of stderr and stdout together, for a row's error column."""
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip()
        head = self.describe()
        return head + ("\n" + text[-limit:] if text else "")


@dataclass(frozen=True)
class Prepared:
    """A command as a sandbox starts it: the argv and environment to exec, and what to do in the
    child between fork and exec."""

    argv: list[str]
    env: dict[str, str]
    preexec: Callable[[], None] | None = None


class Sandbox(ABC):
    """Isolation around each command that runs candidate code (built or run): a plug-in, so that
    the runners and the builder never know which one a node uses."""

    name: str = ""

    @abstractmethod
    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False) -> Prepared:
        """``argv`` to run in ``cwd`` (the only writable place) with ``env`` and ``limits``;
        ``gpu``: the device's nodes are needed."""


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
    """Run ``argv`` in ``cwd`` under ``limits`` (inside ``sandbox`` when given); never raises for
    the command's own failures.

    ``env`` (default: this process's environment) reaches the command without its secrets.
    """
    out_path, err_path = cwd / ".warpfleet.stdout", cwd / ".warpfleet.stderr"
    start = time.perf_counter()
    with out_path.open("w+b") as out, err_path.open("w+b") as err:
        environment = scrubbed_env(os.environ if env is None else env)
        launch = Prepared(list(argv), environment, _set_rlimits(limits.rlimits()) if limits else None)
        try:
            if sandbox is not None:
                launch = sandbox.prepare(argv, cwd, environment, limits, gpu)
            proc = subprocess.Popen(
                launch.argv, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env=launch.env, start_new_session=True, preexec_fn=launch.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return ProcessResult(None, "", "", time.perf_counter() - start, start_error=str(exc))
        try:
            timed_out = _wait(proc, cwd, start + timeout, limits.disk_mb if limits else None)
        finally:
            _kill_group(proc)
        seconds = time.perf_counter() - start
        # Read through our own handles: the command may have deleted or replaced the files.
        result = ProcessResult(
            None if timed_out else proc.returncode,
            _read(out, stdout_limit),
            _read(err, 64 * 1024),
            seconds,
            timed_out=timed_out,
            limits=limits,
        )
        if limits and not timed_out:
            result = _with_limit_exceeded(result, limits, cwd, (out, err))
    return result


def _set_rlimits(rlimits: list[tuple[int, int, int]]) -> Callable[[], None]:
    # Runs in the child between fork and exec: computed beforehand, it only makes system calls.
    def apply() -> None:
        for res, soft, hard in rlimits:
            resource.setrlimit(res, (soft, hard))

    return apply


def _wait(proc: subprocess.Popen[bytes], cwd: Path, deadline: float, disk_mb: int | None) -> bool:
    """Wait for the command to exit; True if the deadline came first. With a disk limit, stop
    waiting as soon as ``cwd`` grows past it (the caller kills the group either way)."""
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            return True
        try:
            proc.wait(timeout=remaining if disk_mb is None else min(remaining, DISK_POLL_S))
            return False
        except subprocess.TimeoutExpired:
            if disk_mb is not None and directory_size(cwd) > disk_mb * MB:
                return False


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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # Children left behind by the command (or a hung one) must not outlive the candidate.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def scratch_dir(root: Path | None, prefix: str) -> Iterator[Path]:
    """A fresh directory that is removed afterwards, whatever happened inside."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_bundle(files: Sequence[tuple[str, bytes]], into: Path) -> None:
    for rel, content in files:
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
