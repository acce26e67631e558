"""Running untrusted commands: an argument list, its own scratch directory, a timeout.

Every compile and every run of a candidate goes through ``run_command``. It never uses a
shell, starts the command in a new session so that a timeout kills the whole process group
(a hung kernel launched by a forked helper included), and keeps stdout and stderr in files so
that a program printing gigabytes cannot fill the worker's memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 4096
STDOUT_READ_LIMIT = 16 * 1024 * 1024  # the metric parser reads at most this much stdout


@dataclass(frozen=True)
class ProcessResult:
    returncode: int | None  # None when it was killed for the timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    start_error: str = ""  # the command could not be started at all

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.start_error

    def describe(self) -> str:
        """One line on how it ended."""
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.timed_out:
            return f"timed out after {self.seconds:.1f} s"
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit status {self.returncode}"

    def tail(self, limit: int = TAIL_BYTES) -> str:
        """The end of stderr and stdout together, for a row's error column."""
        text = (self.stderr.strip() + "\n" + self.stdout.strip()).strip()
        head = self.describe()
        return head + ("\n" + text[-limit:] if text else "")


def _read(path: Path, limit: int) -> str:
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - limit))
        return fh.read(limit).decode(errors="replace")


def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    stdout_limit: int = STDOUT_READ_LIMIT,
) -> ProcessResult:
    """Run ``argv`` in ``cwd``; never raises for the command's own failures."""
    out_path, err_path = cwd / ".warpfleet.stdout", cwd / ".warpfleet.stderr"
    start = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        try:
            proc = subprocess.Popen(
                list(argv), cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, start_new_session=True,
            )
        except OSError as exc:
            return ProcessResult(None, "", "", time.perf_counter() - start, start_error=str(exc))
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
    seconds = time.perf_counter() - start
    return ProcessResult(
        None if timed_out else proc.returncode,
        _read(out_path, stdout_limit),
        _read(err_path, 64 * 1024),
        seconds,
        timed_out=timed_out,
    )


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
