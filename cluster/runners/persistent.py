"""The persistent runner: a program built as a shared library, run inside a host process per device.

The build renames the program's ``main`` and adds an entry point (include/warpfleet/wf_entry.cpp,
``.c`` for C): ``Toolchain.shared_flags``. The host (cluster/sandbox/host.py) keeps the CUDA
context and loads each candidate with ``dlopen``, calls ``wf_entry(argc, argv)`` in the candidate's
scratch directory and unloads it, so that a run pays neither a process start nor a context. What a
run must not share with the host's next one (a changed environment for the cheat checks, a
profiler or sanitizer in front) runs as a process of its own instead: the same library through
``python -m cluster.sandbox.host program LIBRARY ARGS...``.
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cluster.runners._base import BINARY_FILE, POISON_ENV, HostRunner, Invocation, Staged, harness_env
from cluster.runners.device_clock import RECORD_FILE
from cluster.sandbox.host import STDERR_FILE, STDOUT_FILE, host_python
from cluster.sandbox.sandbox import ProcessResult


def call_program(request: Mapping[str, Any]) -> int:
    """In the host: load ``request["library"]``, run its ``wf_entry`` with ``request["argv"]`` and
    the harness's variables ``request["env"]`` (set for this run only), unload."""
    with _variables(request.get("env") or {}):
        return _call_entry(request)


@contextlib.contextmanager
def _variables(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in the host's environment (the harness's getenv reads it) for the block, then as before."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _call_entry(request: Mapping[str, Any]) -> int:
    libc = ctypes.CDLL(None)
    with contextlib.suppress(ValueError):  # a libc without the symbol
        ctypes.c_int.in_dll(libc, "optind").value = 0  # getopt starts afresh (glibc: 0 re-initializes)
    library = ctypes.CDLL(request["library"], mode=os.RTLD_NOW | os.RTLD_LOCAL)
    try:
        entry = library.wf_entry
        entry.restype = ctypes.c_int
        entry.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        args = [str(a).encode() for a in request["argv"]]
        argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        status = entry(len(args), argv)
        libc.fflush(None)
        return int(status)
    finally:
        _ctypes.dlclose(library._handle)


class PersistentRunner(HostRunner):
    """Runs each candidate's ``run`` command inside one host process kept per worker."""

    name = "persistent"

    def in_host(self, invocation: Invocation) -> bool:
        """Whether the invocation may share the host: the plain run, nothing in front, no variables
        but the poison (the harness reads it with each launch; the finals' runs all have it)."""
        return invocation.command == "run" and not invocation.wrapper and set(invocation.env) <= {POISON_ENV}

    def execute(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        if not self.in_host(invocation):
            return self.run_process(staged, invocation)
        library = str(staged.workdir / BINARY_FILE)
        argv = staged.argv(invocation, binary=library)  # {binary}: the library itself, in the host
        spec = staged.target.spec
        timeout = invocation.timeout if invocation.timeout is not None else spec.timeouts.run
        request = {"loader": "program", "library": library, "argv": argv, "env": harness_env(invocation),
                   "cwd": str(staged.workdir), "stdout": str(staged.workdir / STDOUT_FILE),
                   "stderr": str(staged.workdir / STDERR_FILE)}
        clock = self.device_clock if self.clocked(invocation) else None
        if clock is None:
            return self.call(staged, request, timeout)
        clock.forget(staged.files)
        request["device_record"] = str(staged.workdir / RECORD_FILE)  # the host writes it after the candidate
        return dataclasses.replace(self.call(staged, request, timeout), device=clock.read(staged.files))

    def binary_argv(self, workdir: Path) -> list[str]:
        return host_python("-m", "cluster.sandbox.host", "program", str(workdir / BINARY_FILE))

