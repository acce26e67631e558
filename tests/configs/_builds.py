"""The nvcc builds of the program suites' tests (configs/public, configs/unseen), the engine's way
(``cluster.compile.build.compile_candidate``): the baselines that a module's selected tests need start
together on a pool of a worker a core, in the tests' order, and each test waits for its own (one at
a time, they were a third of the suite's time).

Whether a param reaches the program is asked of the preprocessor (``preprocessed``): the engine's
build command with ``-E``, a tenth of a build's time. A param that a source ``#define``s without an
``#ifndef`` guard, or never uses, leaves the preprocessed program unchanged, which is what the
suites' tests look for (``validate --build`` asks the same of whole builds)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from cluster.compile.build import BINARY_NAME, FLUSH_KERNEL, build_command, compile_candidate
from cluster.config import Target, load_target
from cluster.core.types import BuildArtifact, Candidate, KernelResources, Scalar, Status
from cluster.sandbox.sandbox import ProcessResult, run_command, write_bundle
from cluster.toolchains import get_toolchain

ARCH = "sm_90"
T = TypeVar("T")

# The preprocessor's line markers (# 12 "file" 2) name the folder the sources were staged in.
LINE_MARKER = re.compile(rb'^#(?: \d+| line \d+)(?: "[^"]*")?(?: \d+)*$', re.MULTILINE)


def _candidate(target: Target, params: dict[str, Scalar]) -> Candidate:
    return Candidate(target=target.name, toolchain="nvcc", device_type="t", arch=ARCH,
                     source_hash=target.bundle.hash, flags=(), params=tuple(params.items()))


def build(target: Target, params: dict[str, Scalar], root: Path) -> BuildArtifact:
    candidate = _candidate(target, params)
    artifact = compile_candidate(target, candidate, root)
    assert artifact.status is Status.OK, f"{target.name} {params}: {artifact.error_tail}"
    assert artifact.binary
    return artifact


def preprocessed(target: Target, params: dict[str, Scalar], root: Path) -> bytes:
    """The target's sources through nvcc's preprocessor as its build command passes them (the
    engine's ``build_command``, with ``-E`` and its output on stdout instead of the binary), without
    the line markers."""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as folder:
        workdir = Path(folder)
        write_bundle(target.bundle.files, workdir)
        argv = build_command(target, _candidate(target, params), workdir)
        at = argv.index("-o")
        argv = [argv[0], "-E", *argv[1:at], *argv[at + 2:]]
        result = subprocess.run(argv, cwd=workdir, capture_output=True, timeout=300, check=False)
    assert result.returncode == 0, f"{target.name} {params}: {result.stderr.decode(errors='replace')[-2000:]}"
    return LINE_MARKER.sub(b"", result.stdout)


_BASELINES: dict[Path, bytes] = {}


def preprocessed_baseline(path: Path, root: Path) -> bytes:
    """``preprocessed`` at the baseline params of the target in ``path``, once a process: each of
    its params' tests compares with it (a module's tests run on one pytest-xdist worker)."""
    if path not in _BASELINES:
        target = load_target(path)
        _BASELINES[path] = preprocessed(target, target.baseline_params, root)
    return _BASELINES[path]


def other_value(target: Target, name: str) -> Scalar:
    """The first value of ``name`` other than the baseline's that the constraints allow with the
    baseline's other params."""
    baseline = target.baseline_params
    for value in target.spec.params[name]:
        if value != baseline[name] and target.satisfies({**baseline, name: value}):
            return value
    raise AssertionError(f"{target.name}: no other value of {name} fits the constraints")


class Builds:
    """The baselines of ``wanted`` (target files), started at once on a pool of a worker a core, in
    order; ``get`` waits for one (and starts one that was not wanted)."""

    def __init__(self, root: Path, wanted: list[Path]) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="nvcc")
        self.futures: dict[Path, Future[BuildArtifact]] = {}
        for path in wanted:
            self._start(path)

    def _start(self, path: Path) -> Future[BuildArtifact]:
        if path not in self.futures:
            target = load_target(path)
            self.futures[path] = self.pool.submit(build, target, target.baseline_params, self.root)
        return self.futures[path]

    def get(self, path: Path) -> BuildArtifact:
        return self._start(path).result()


def wanted(request: pytest.FixtureRequest, baseline_test: str) -> list[Path]:
    """The baselines that the selected tests of the requesting module build (``baseline_test``,
    parametrized by ``path``), in the order they run."""
    paths: list[Path] = []
    for item in request.session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.module is request.module and params and item.originalname == baseline_test:
            paths.append(params["path"])
    return list(dict.fromkeys(paths))


# --- one build of a suite target's candidate for the modules that all need it -----------------

# The benchmark suite's baselines were built by tests/configs/test_suite_targets*.py and again by
# tests/agents/test_stack.py and tests/cluster/engine/test_workflow_suite.py (the same nvcc command
# on the same sources, 7 builds of about 3 CPU-seconds each); those tests are one pytest-xdist group,
# SUITE_BUILDS, so that they share them.
SUITE_BUILDS = pytest.mark.xdist_group("suite_builds")


@dataclass(frozen=True)
class Compiled:
    """A build by the engine's own command (``build_command``, run by ``run_command``), with ptxas's
    report read by the nvcc toolchain; ``kernels`` has the harness's L2-flush kernel too."""

    params: dict[str, Scalar]
    argv: list[str]
    result: ProcessResult
    binary: Path
    kernels: tuple[KernelResources, ...]

    def kernel(self, name: str) -> KernelResources:
        """The one kernel whose mangled name contains ``name``."""
        found = [k for k in self.kernels if name in k.kernel]
        assert len(found) == 1, (name, [k.kernel for k in self.kernels])
        return found[0]

    @property
    def target_kernels(self) -> tuple[KernelResources, ...]:
        """The target's own kernels, as ``compile_candidate`` reports them (no L2-flush kernel)."""
        return tuple(k for k in self.kernels if FLUSH_KERNEL not in k.kernel)


_COMPILED: dict[tuple[str, tuple[str, ...]], Future[Compiled]] = {}
_ARTIFACTS: dict[tuple[str, tuple[str, ...]], Future[BuildArtifact]] = {}
_ONCE_LOCK = threading.Lock()
_COMPILED_ROOT: list[tempfile.TemporaryDirectory[str]] = []


def _inputs(target: Target, candidate: Candidate) -> tuple[str, tuple[str, ...]]:
    """What a build's result depends on: the sources' hash and the command (its folder left out)."""
    return target.bundle.hash, tuple(build_command(target, candidate, Path("/build")))


def _once(futures: dict[tuple[str, tuple[str, ...]], Future[T]], key: tuple[str, tuple[str, ...]],
          make: Callable[[], T]) -> T:
    """``make()`` once a process for ``key``; a second caller waits for the first's result."""
    with _ONCE_LOCK:
        future, mine = futures.get(key), False
        if future is None:
            future, mine = futures.setdefault(key, Future()), True
    if mine:
        try:
            future.set_result(make())
        except BaseException as exc:
            future.set_exception(exc)
            raise
    return future.result()


def compile_once(target: Target, candidate: Candidate) -> Compiled:
    """``candidate`` of ``target`` built once a process for each of the build's inputs (the sources'
    hash and the command, its folder left out); a second caller waits for the first's build."""

    def make() -> Compiled:
        with _ONCE_LOCK:
            if not _COMPILED_ROOT:
                _COMPILED_ROOT.append(tempfile.TemporaryDirectory(prefix="wf-suite-builds-"))
        workdir = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=_COMPILED_ROOT[0].name))
        write_bundle(target.bundle.files, workdir)
        argv = build_command(target, candidate, workdir)
        result = run_command(argv, workdir, timeout=target.spec.timeouts.build)
        kernels = get_toolchain(target.spec.toolchain).parse_resources(result.stderr + "\n" + result.stdout)
        return Compiled(dict(candidate.params), argv, result, workdir / BINARY_NAME, kernels)

    return _once(_COMPILED, _inputs(target, candidate), make)


def build_once(target: Target, candidate: Candidate, scratch_root: Path | None = None) -> BuildArtifact:
    """``compile_candidate`` once a process for each of the build's inputs, its artifact under
    ``candidate``'s key: the experts' variants of the suite's targets (transpose's padding,
    regpressure's constant table, unroll and their stack, multikernel's streams) are built by the
    workflow's tests (tests/cluster/engine/test_workflow_suite.py, through ``LocalVerifier``'s
    ``build``) and again by each expert's own test, the same command on the same sources."""
    artifact = _once(_ARTIFACTS, _inputs(target, candidate), lambda: compile_candidate(target, candidate, scratch_root))
    return dataclasses.replace(artifact, candidate_key=candidate.key)


def compile_params(target: Target, params: dict[str, Scalar] | None = None) -> Compiled:
    """``target`` at ``params`` (None: its baseline's) with no flags, built once a process."""
    params = target.baseline_params if params is None else params
    return compile_once(target, _candidate(target, params))
