"""The Runner seam: stage a built candidate, run it, return what the run printed and took.

    BuildArtifact ─► Runner.stage(...) ─► Staged (a scratch directory with the files and the binary)
                                            └─► Staged.run(Invocation) ─► ProcessResult

Every run of candidate code goes through here: the measurement, the cheat checks, Nsight Compute
and compute-sanitizer. This is the one place that expands the target's commands (``run``,
``verify.sanitize_run``, ``verify.test``) and applies its limits and the sandbox; a runner decides
how the candidate's code is started: a fresh process per run (``ProcessRunner``), or a process per
device that keeps its CUDA context (``HostRunner``, over ``cluster.sandbox.host``) and loads each
candidate into it: as a shared library (``PersistentRunner``), or a kernel's cubin (``KernelRunner``).
The search never knows which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cluster.config import Target
from cluster.core.placeholders import expand
from cluster.core.types import DeviceInfo, RunOutputs
from cluster.runners.device_clock import DeviceClock
from cluster.sandbox.host import HostProcess, read_result
from cluster.sandbox.isolation import node_sandbox
from cluster.sandbox.sandbox import (
    STDERR_FILE,
    STDOUT_FILE,
    LimitWatch,
    ProcessResult,
    Sandbox,
    over_limit,
    owned_suffix,
    run_command,
    scratch_dir,
)
from cluster.sandbox.untrusted_dir import UntrustedDir, kind_of

BINARY_FILE = "candidate.bin"
Command = Literal["run", "sanitize_run", "test"]


@dataclass(frozen=True)
class Invocation:
    """One run of a staged candidate: which of the target's commands, on which seed, and what
    wraps it (a profiler or a sanitizer in front, variables for the harness)."""

    command: Command = "run"
    seed: int = 0
    wrapper: tuple[str, ...] = ()  # argv put in front of the command: ncu ..., compute-sanitizer ...
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables: WARPFLEET_PROFILE, WARPFLEET_POISON
    timeout: float | None = None  # default: the target's run timeout
    # Racing (measure.race): the metric value above which a run may stop sampling once its
    # lower quartile is past it; a runner that cannot stop early ignores it (the kernel runner can).
    stop_above: float | None = None
    # At most this many timed samples (measure.search_samples): the harness's stopping rule capped
    # there, its minimum samples too; a run that does not sample through the harness ignores it.
    max_samples: int | None = None
    # The outputs this run must reproduce (the baseline's for its seed), for a runner that checks
    # them where they are made (the kernel runner's host); None: the worker compares the files.
    reference: RunOutputs | None = field(default=None, repr=False, compare=False)


class Staged:
    """A built candidate ready to run in its own scratch directory (``workdir``). Runs in one
    staged directory see what earlier runs left there (the cheat checks rely on that) unless the
    directory is ``reset`` between them (the measurement does: nothing a run leaves can serve the
    next). The worker reads and writes files there through ``files`` only, never by path
    (``UntrustedDir``)."""

    def __init__(self, runner: Runner, target: Target, params: Mapping[str, Any], arch: str, workdir: Path,
                 files: UntrustedDir, binary: bytes = b"") -> None:
        self.runner, self.target, self.params, self.arch, self.workdir = runner, target, dict(params), arch, workdir
        self.files, self.binary = files, binary

    def reset(self) -> str | None:
        """The directory as it was staged: everything an earlier run left there removed (a cache of
        its outputs, a marker of a first run done, a folder planted at an output's name). Returns
        why not, where the last run replaced warpfleet's own files (its capture files) with
        something else: the sign of a candidate that tampered, whose run fails as if they were read."""
        if not self.runner.isolates_runs:
            return None
        for name in (STDOUT_FILE, STDERR_FILE):
            with contextlib.suppress(FileNotFoundError):
                mode = os.stat(name, dir_fd=self.files.fileno(), follow_symlinks=False).st_mode
                if not stat.S_ISREG(mode):
                    return f"{name}: {kind_of(mode)} where warpfleet's own file was (left by the candidate)"
        self.files.clear()
        write_staged(self.files, self.target, self.binary)
        return None

    def values(self, seed: int, binary: str | list[str] | None = None) -> dict[str, Any]:
        """The commands' placeholder values: params, binary, workdir, arch, seed."""
        return {**self.params, "binary": self.runner.binary_argv(self.workdir) if binary is None else binary,
                "workdir": str(self.workdir), "arch": self.arch, "seed": seed}

    def argv(self, invocation: Invocation, binary: str | list[str] | None = None) -> list[str]:
        """The invocation's command line; ``binary``: what ``{binary}`` stands for, if not the
        runner's process form."""
        spec = self.target.spec
        template = {"run": spec.run, "sanitize_run": spec.verify.sanitize_run or spec.run,
                    "test": spec.verify.test or []}[invocation.command]
        return [*invocation.wrapper, *expand(template, self.values(invocation.seed, binary))]

    def run(self, invocation: Invocation = Invocation()) -> ProcessResult:
        """Run the candidate once; its failures come back in the result, never as an exception."""
        return self.runner.execute(self, invocation)


class Runner(ABC):
    """How a measuring worker runs candidates. One instance per worker; ``close`` ends whatever it
    keeps running (a persistent process), and the runner starts it again when next used."""

    name: str = ""
    # Whether a run's samples are warpfleet's own measurements (the kernel runner's CUDA events), not
    # the program's words: then there is no claim to check against the wall clock (measure.clock).
    samples_are_warpfleets: bool = False
    # Whether a measurement's runs each start from the staged directory afresh (``Staged.reset``); a
    # runner whose candidates write no files of their own (a kernel's cubin) keeps what it handed them.
    isolates_runs: bool = True

    def __init__(self, sandbox: Sandbox | None = None, scratch_root: Path | None = None,
                 device_clock: DeviceClock | None = None) -> None:
        """``sandbox``: default, the node's (``cluster.sandbox.isolation.node_sandbox``);
        ``device_clock``: record what the GPU does in each run (a GPU worker's)."""
        self.sandbox = sandbox if sandbox is not None else node_sandbox()
        self.scratch_root = scratch_root
        self.device_clock = None if self.samples_are_warpfleets else device_clock

    @classmethod
    def for_worker(cls, sandbox: Sandbox, scratch_root: Path | None, device: DeviceInfo) -> Runner:
        """The runner of a measuring worker that owns ``device``: each runner takes the options it
        needs; on a GPU, the node's device clock."""
        return cls(sandbox=sandbox, scratch_root=scratch_root, device_clock=worker_clock(device))

    @contextmanager
    def stage(self, target: Target, params: Mapping[str, Any], arch: str, binary: bytes | None,
              prefix: str = "run-") -> Iterator[Staged]:
        """A scratch directory with the target's files and the built candidate, removed afterwards."""
        with scratch_dir(self.scratch_root, prefix) as workdir, UntrustedDir(workdir) as files:
            write_staged(files, target, binary or b"")
            yield Staged(self, target, params, arch, workdir, files, binary or b"")

    def binary_argv(self, workdir: Path) -> str | list[str]:
        """What ``{binary}`` stands for in a command run as a process."""
        return str(workdir / BINARY_FILE)

    @abstractmethod
    def execute(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        """Run ``invocation`` of ``staged``: in a process, or in the runner's own."""

    def run_process(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        """The invocation as a process in the staged directory, under the target's limits and the
        runner's sandbox: what every runner does for commands it cannot run in-process."""
        spec = staged.target.spec
        timeout = invocation.timeout if invocation.timeout is not None else spec.timeouts.run
        env = harness_env(invocation)
        clock = self.device_clock if self.clocked(invocation) else None
        if clock:
            clock.forget(staged.files)
            env.update(clock.process_env(staged.workdir))
        result = run_command(staged.argv(invocation), staged.workdir, timeout, own_env=env,
                             limits=spec.limits.for_run(), sandbox=self.sandbox)
        return dataclasses.replace(result, device=clock.read(staged.files)) if clock else result

    def clocked(self, invocation: Invocation) -> bool:
        """Whether the device clock records this run: a plain run of the target's program (not a
        profiler's nor a sanitizer's, which bring their own CUPTI)."""
        return self.device_clock is not None and invocation.command == "run" and not invocation.wrapper

    def verified_outputs(self, staged: Staged, reference: RunOutputs) -> frozenset[str]:
        """The output files of the last run that the runner itself found to match ``reference``
        (the worker then compares only the others); a runner whose candidates could write that
        verdict themselves (a program's own code) must answer none."""
        return frozenset()

    def close(self) -> None:  # noqa: B027  (a runner that keeps nothing running has nothing to stop)
        """Stop whatever the runner keeps running."""


class ProcessRunner(Runner):
    """A fresh process for every run: the candidate's own program, as built."""

    name = "process"

    def execute(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        return self.run_process(staged, invocation)


class HostRunner(Runner):
    """A runner whose candidates run inside a host process of its own (``HostProcess``): it stages
    them in a folder of its own, the host's one writable place in the sandbox."""

    def __init__(self, sandbox: Sandbox | None = None, scratch_root: Path | None = None, cuda: bool = True,
                 device_clock: DeviceClock | None = None) -> None:
        super().__init__(sandbox, scratch_root, device_clock)
        if scratch_root is not None:
            scratch_root.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"host-{self.name}-", suffix=owned_suffix(), dir=scratch_root))
        self.scratch_root = self.root  # where stage() makes the candidates' directories
        self.host = HostProcess(cuda, self.sandbox, self.root,
                                env=self.device_clock.host_env() if self.device_clock else None)
        self.live: set[str] = set()  # the staged directories in ``root`` now

    @contextmanager
    def stage(self, target: Target, params: Mapping[str, Any], arch: str, binary: bytes | None,
              prefix: str = "run-") -> Iterator[Staged]:
        with super().stage(target, params, arch, binary, prefix) as staged:
            self.live.add(staged.workdir.name)
            try:
                yield staged
            finally:
                self.live.discard(staged.workdir.name)

    @classmethod
    def for_worker(cls, sandbox: Sandbox, scratch_root: Path | None, device: DeviceInfo) -> Runner:
        """A host with a CUDA context on a GPU worker, without on a CPU one."""
        return cls(sandbox=sandbox, scratch_root=scratch_root, cuda=device.kind == "gpu",
                   device_clock=worker_clock(device))

    def call(self, staged: Staged, request: Mapping[str, Any], timeout: float) -> ProcessResult:
        """``request`` in the host; the run's result as a process run's. What the worker put in the
        staged directory since the last call (a poisoned output file, a file of the test) becomes the
        candidate's first, as a process run's directory does when its sandbox is prepared: the host,
        already running as the sandbox's uid, writes there."""
        try:
            with UntrustedDir(self.root) as root:  # what an earlier candidate left beside its own folder goes
                root.clear(keep=self.live)
            self.sandbox.hand_over(staged.workdir)
        except OSError as exc:  # the staged directory swapped for a link by a process the last candidate left
            return ProcessResult(None, "", "", 0.0, refused=str(exc))
        limits = staged.target.spec.limits.for_run()
        reply = self.host.call(request, timeout, LimitWatch(staged.files, limits).over)
        result = read_result(staged.files, reply, limits)
        limit = result.limit_exceeded or (over_limit(staged.files, limits) if not result.timed_out else "")
        return dataclasses.replace(result, limit_exceeded=limit) if limit != result.limit_exceeded else result

    def close(self) -> None:
        self.host.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def write_staged(files: UntrustedDir, target: Target, binary: bytes) -> None:
    """The target's files and the build, afresh, in a scratch directory."""
    for rel, content in target.bundle.files:
        files.write(rel, content)
    files.write(BINARY_FILE, binary, mode=0o755)


def worker_clock(device: DeviceInfo) -> DeviceClock | None:
    """The device clock of a worker that owns ``device``: a GPU's, where the node can build it."""
    return DeviceClock.on_node() if device.kind == "gpu" else None


# Set for a run whose outputs are poisoned: the harness fills the buffers registered with
# wf::poison_output with 0xFF bytes (NaN) before every launch, outside the timed region.
POISON_ENV = "WARPFLEET_POISON"
MAX_SAMPLES_ENV = "WARPFLEET_MAX_SAMPLES"  # read by the harness (harness_core.hpp: parse_options)


def harness_env(invocation: Invocation) -> dict[str, str]:
    """The invocation's variables, with those the harness reads for its fields (``max_samples``)."""
    env = dict(invocation.env)
    if invocation.max_samples is not None:
        env[MAX_SAMPLES_ENV] = str(invocation.max_samples)
    return env

