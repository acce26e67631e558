"""A long-lived host process per device that runs candidates in-process, and its client.

    measuring worker ─► HostRunner.execute ─► HostProcess.call(request) ═══ pipe ═══► serve():
                                                                          chdir, fd 1/2 to files,
                                                                          LOADERS[request.loader](request)

The host keeps what every candidate would otherwise pay for again: the process start, the CUDA
context (retained once), the runtime's own start-up. A loader (``LOADERS``: a program built as a
shared library, a kernel's cubin) runs one candidate inside the host. The host runs inside the
worker's sandbox, with the candidate's stdout and stderr in files of its scratch directory as a
process run's are, so that what comes back is the same ``ProcessResult``.

Isolation: a candidate that exits, crashes, hangs or leaves the CUDA context broken takes the host
down with it (the host exits when its context no longer answers); the client sees that, returns a
failed result like a process run's, and starts a fresh host for the next candidate.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import secrets
import select
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.core.limits import Limits
from cluster.sandbox.reaper import adopt_orphans, end_strays
from cluster.sandbox.sandbox import (
    DISK_POLL_S,
    STDERR_FILE,
    STDOUT_FILE,
    Ended,
    Prepared,
    ProcessResult,
    Sandbox,
    SandboxError,
    Unsandboxed,
    _read,
    kill_command,
)
from cluster.sandbox.untrusted_dir import UntrustedDir, kind_of

STDOUT_READ_LIMIT = 16 * 1024 * 1024
BROKEN_CONTEXT_EXIT = 70  # the host's exit status when its CUDA context stopped answering

# What a host can load, by a request's "loader": each a function (request) -> exit status, run in
# the host with the candidate's scratch directory as its working directory.
LOADERS = {
    "program": "cluster.runners.persistent:call_program",
    "kernel": "cluster.runners.kernel:call_kernel",
    "nvrtc": "cluster.compile.kernel:call_nvrtc",  # a compile, in a compile host (no CUDA context)
}


# -- inside the host ---------------------------------------------------------------------------

class _CudaContext:
    """The device's primary context, retained for the host's life so that candidates loaded and
    unloaded one after another all find it alive; and a check that it still answers."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.context = ctypes.c_void_p()
        device = ctypes.c_int()
        for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(device), 0)),
                           ("cuDevicePrimaryCtxRetain", (ctypes.byref(self.context), device)),
                           ("cuCtxSetCurrent", (self.context,))):
            status = getattr(self.cuda, call)(*args)
            if status != 0:
                raise RuntimeError(f"{call} failed with CUDA error {status}")

    def healthy(self) -> bool:
        self.cuda.cuCtxSetCurrent(self.context)
        return self.cuda.cuCtxSynchronize() == 0


def _loader(name: str) -> Any:
    module, _, function = LOADERS[name].partition(":")
    return getattr(importlib.import_module(module), function)


class CaptureRefused(OSError):
    """A request's stdout or stderr file is not a file the host may write: a link left there."""


def _capture(path: str) -> int:
    """``path`` open for writing, emptied: a regular file or nothing, never through a link (the host
    may run unsandboxed, as the worker) nor blocked by a FIFO a candidate left there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise CaptureRefused(exc.errno, f"{Path(path).name}: {exc.strerror} (a link left by the candidate?)") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CaptureRefused(0, f"{Path(path).name}: {kind_of(mode)} where warpfleet's own file was")
    os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def handle(request: Mapping[str, Any]) -> int:
    """Run one request with fd 1 and 2 sent to its files; returns the loader's exit status.
    Raises ``CaptureRefused`` when those files cannot be the run's own."""
    libc = ctypes.CDLL(None)
    out = _capture(request["stdout"])
    try:
        err = _capture(request["stderr"])
    except OSError:
        os.close(out)
        raise
    saved = os.dup(1), os.dup(2)
    previous = os.getcwd()
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(request["cwd"])
        try:
            return int(_loader(request["loader"])(request) or 0)
        except SystemExit as exc:  # a loader that exits like a program
            return exc.code if isinstance(exc.code, int) else 1
        except Exception:
            sys.stderr.write(traceback.format_exc())
            return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        libc.fflush(None)  # the candidate's C stdio buffers
        os.chdir(previous)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (out, err, *saved):
            os.close(fd)


def _device_record() -> Callable[[str | None], int] | None:
    """The device clock's writer, where the driver injected its library into this process
    (``cluster.runners.device_clock``): ``write(PATH)`` writes what the GPU did since the last
    call, ``write(None)`` drops it."""
    library = os.environ.get("CUDA_INJECTION64_PATH")
    if not library:
        return None
    try:
        write = ctypes.CDLL(library).wf_device_record_write
    except (OSError, AttributeError):
        return None
    write.argtypes, write.restype = [ctypes.c_char_p], ctypes.c_int

    def record(path: str | None) -> int:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)  # made afresh: never written through what a candidate left at the name
        return int(write(path.encode() if path is not None else None))

    return record


PRIVATE = ("/tmp", "/dev/shm")  # the sandbox's own for the host: emptied after each candidate


def _empty_private(workdir: Path) -> None:
    """/tmp and /dev/shm emptied but for the way to the host's own folder (bound in there)."""
    for place in PRIVATE:
        with contextlib.suppress(OSError), UntrustedDir(place) as held:
            held.clear(keep={workdir.relative_to(place).parts[0]} if workdir.is_relative_to(place) else ())


def serve(fd_in: int, fd_out: int, cuda: bool, private: bool = False) -> None:
    """The host's loop: one JSON request a line in, one JSON reply a line out, until EOF. Each
    reply carries its request's nonce, which the candidate never sees (popped before it runs): a
    line a candidate writes on the reply channel is not taken for the host's. ``private``: /tmp
    and /dev/shm are the sandbox's own, emptied after each candidate."""
    context = _CudaContext() if cuda else None
    device = _device_record() if cuda else None
    requests = os.fdopen(fd_in, "r")
    replies = os.fdopen(fd_out, "w")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # candidates read no stdin
    adopt_orphans()
    workdir = Path.cwd()  # the client starts the host in its folder
    for line in requests:
        start = time.perf_counter()
        refused = ""
        request = json.loads(line)
        nonce = request.pop("nonce", "")
        line = ""
        if device:
            device(None)  # what the host did between candidates is no candidate's
        try:
            status = handle(request)
        except CaptureRefused as exc:
            status, refused = 1, exc.strerror or str(exc)
        end_strays()
        if private:
            _empty_private(workdir)
        healthy = context.healthy() if context else True
        if device and healthy and request.get("device_record"):
            device(request["device_record"])
        replies.write(json.dumps({"rc": status, "seconds": time.perf_counter() - start, "healthy": healthy,
                                  "refused": refused, "nonce": nonce}) + "\n")
        replies.flush()
        if not healthy:
            os._exit(BROKEN_CONTEXT_EXIT)  # nothing else may run on a broken context


def main(argv: list[str]) -> None:
    """``python -m cluster.sandbox.host serve FD_IN FD_OUT [--cuda]``: the host's loop; or one
    candidate as a process of its own (what ncu, compute-sanitizer and the cheat checks run):
    ``... program LIBRARY [ARGS...]`` (a program built as a shared library) or ``... once
    REQUEST.json`` (any loader's request); either exits with the candidate's status."""
    if argv[:1] == ["serve"]:
        serve(int(argv[1]), int(argv[2]), "--cuda" in argv, "--private" in argv)
        return
    if argv[:1] == ["program"] and len(argv) >= 2:
        request: dict[str, Any] = {"loader": "program", "library": argv[1], "argv": argv[1:]}
    elif argv[:1] == ["once"] and len(argv) == 2:
        request = json.loads(Path(argv[1]).read_text())
    else:
        sys.exit("usage: python -m cluster.sandbox.host serve FD_IN FD_OUT [--cuda] | program LIBRARY [ARGS...] "
                 "| once REQUEST.json")
    status = _loader(request["loader"])(request)
    sys.stdout.flush()
    ctypes.CDLL(None).fflush(None)
    device, path = _device_record(), os.environ.get("WARPFLEET_DEVICE_RECORD")
    if device and path:
        device(path)  # os._exit skips the library's exit handler that would write it
    os._exit(int(status or 0))


# -- the client, in the measuring worker --------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    returncode: int | None  # None: timed out, or the host could not start
    seconds: float  # the worker's own clock around the request, never the host's word (a candidate runs there)
    timed_out: bool = False
    host_died: bool = False  # the host ended with the candidate (exit, crash, broken context)
    limit: str = ""  # the sandbox's limit that ended it ("memory", "processes"), and its amount
    amount: str = ""
    error: str = ""  # why no host could run it
    refused: str = ""  # why the host would not write the run's capture files (ProcessResult.refused)
    forged: bool = False  # the line read was not the host's reply (no nonce of the request's)


def package_root() -> str:
    """The folder that holds the ``cluster`` package, for the host's PYTHONPATH (on a Ray worker
    node, the runtime environment's copy)."""
    return str(Path(__file__).resolve().parents[2])


def host_python(*args: str) -> list[str]:
    """The command line of a Python that runs warpfleet's host module inside the sandbox: the
    sandbox passes no PYTHONPATH of the worker's, so ``env`` sets the one this Python needs (the
    package and the worker's own search path, read-only inside)."""
    path = os.pathsep.join(filter(None, [package_root(), os.environ.get("PYTHONPATH", "")]))
    return ["env", f"PYTHONPATH={path}", sys.executable, *args]


class HostProcess:
    """A host process started on first use and again after it died; ``call`` never raises for
    what the candidate did. It runs inside ``sandbox`` with ``workdir`` (where its candidates are
    staged) as its only writable place."""

    def __init__(self, cuda: bool, sandbox: Sandbox | None = None, workdir: Path | None = None,
                 limits: Limits | None = None, env: Mapping[str, str] | None = None) -> None:
        """``env``: warpfleet's own variables for the host (the device clock's library)."""
        self.cuda, self.sandbox, self.limits, self.env = cuda, sandbox or Unsandboxed(), limits, dict(env or {})
        self.workdir = workdir or Path.cwd()
        self.proc: subprocess.Popen[bytes] | None = None
        self.prepared: Prepared | None = None
        self.starts = 0

    def _start(self) -> None:
        to_host, from_client = os.pipe()
        to_client, from_host = os.pipe()
        argv = host_python("-m", "cluster.sandbox.host", "serve", str(to_host), str(from_host),
                           *(["--cuda"] if self.cuda else []),
                           *(["--private"] if not isinstance(self.sandbox, Unsandboxed) else []))
        env = self.sandbox.environment(os.environ, self.env)
        try:
            self.prepared = self.sandbox.prepare(argv, self.workdir, env, self.limits, self.cuda,
                                                 writable=(self.workdir,))
            self.proc = subprocess.Popen(self.prepared.argv, env=self.prepared.env, preexec_fn=self.prepared.preexec,
                                         pass_fds=(to_host, from_host, *self.prepared.fds), stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=self.workdir)
        except BaseException:
            for fd in (to_host, from_client, to_client, from_host):
                os.close(fd)
            self._finish(None)
            raise
        os.close(to_host)
        os.close(from_host)
        self.requests = os.fdopen(from_client, "w")
        self.replies = os.fdopen(to_client, "r")
        self.starts += 1

    def call(self, request: Mapping[str, Any], timeout: float, over: Callable[[], str] | None = None) -> Reply:
        """``request`` run in the host within ``timeout``; ``over``, asked every ``DISK_POLL_S`` while
        it runs, names a limit the run is past ("disk", "files"): the host is stopped for it.

        A reply without the request's nonce was written by a candidate (this one, or a thread an
        earlier one left): the host is no longer warpfleet's, so it is stopped and the request run
        once more in a fresh one; a second such reply refuses the run."""
        reply = self._call(request, timeout, over)
        if reply.forged:
            self.stop()
            reply = self._call(request, timeout, over)
        if reply.forged:
            self.stop()
            return Reply(None, reply.seconds, host_died=True,
                         refused="a reply on the host's channel that the host did not write (the candidate's)")
        return reply

    def _call(self, request: Mapping[str, Any], timeout: float, over: Callable[[], str] | None) -> Reply:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            try:
                self._start()
            except (OSError, SandboxError) as exc:
                return Reply(None, 0.0, host_died=True, error=f"the host process could not start: {exc}")
        start = time.perf_counter()
        nonce = secrets.token_hex(16)
        try:
            self.requests.write(json.dumps({**request, "nonce": nonce}) + "\n")
            self.requests.flush()
        except (BrokenPipeError, OSError):
            return self._died(start)
        deadline = start + timeout
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                self.stop()
                return Reply(None, time.perf_counter() - start, timed_out=True, host_died=True)
            if select.select([self.replies], [], [], min(remaining, DISK_POLL_S) if over else remaining)[0]:
                break
            limit = over() if over else ""
            if limit:
                self.stop()
                return Reply(None, time.perf_counter() - start, host_died=True, limit=limit)
        line = self.replies.readline()
        if not line:
            return self._died(start)
        seconds = time.perf_counter() - start
        try:
            reply = json.loads(line)
        except ValueError:
            reply = {}
        if not isinstance(reply, dict) or reply.get("nonce") != nonce:
            return Reply(None, seconds, host_died=True, forged=True)
        if not reply["healthy"]:
            self.stop()
        return Reply(reply["rc"], seconds, host_died=not reply["healthy"], refused=reply.get("refused", ""))

    def _died(self, start: float) -> Reply:
        """The host ended with the candidate: its exit status as the candidate's own (the sandbox
        translates a signal it reports as 128 + n), and the sandbox's limit if one ended it."""
        assert self.proc is not None
        self.proc.wait()
        ended = self.stop()
        return Reply(ended.returncode if ended else None, time.perf_counter() - start, host_died=True,
                     limit=ended.limit if ended else "", amount=ended.amount if ended else "")

    def stop(self) -> Ended | None:
        if self.proc is None:
            return None
        kill_command(self.proc)
        for stream in ("requests", "replies"):
            with contextlib.suppress(AttributeError, OSError):
                getattr(self, stream).close()
        ended = self._finish(self.proc.returncode)
        self.proc = None
        return ended

    def _finish(self, returncode: int | None) -> Ended:
        prepared, self.prepared = self.prepared, None
        return prepared.finish(returncode) if prepared and prepared.finish else Ended(returncode)


def read_result(files: UntrustedDir, reply: Reply, limits: Limits | None = None) -> ProcessResult:
    """The run's ``ProcessResult`` from the files the host wrote, as ``run_command`` makes one: read
    through ``files``, so that a capture file the candidate replaced with a link is refused, not read."""
    outputs, refused = [], reply.refused
    for name, limit in ((STDOUT_FILE, STDOUT_READ_LIMIT), (STDERR_FILE, 64 * 1024)):
        try:
            with files.open_read(name) as fh:
                outputs.append(_read(fh, limit))
        except FileNotFoundError:
            outputs.append("")
        except OSError as exc:
            outputs.append("")
            refused = refused or f"{exc.strerror or exc} (the candidate replaced warpfleet's capture file)"
    return ProcessResult(reply.returncode, outputs[0], outputs[1], reply.seconds, timed_out=reply.timed_out,
                         start_error=reply.error, limit_exceeded=reply.limit, limits=limits,
                         limit_amount=reply.amount, refused=refused)


if __name__ == "__main__":
    main(sys.argv[1:])
