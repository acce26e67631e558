"""The nvcc builds of the program suites' tests (configs/public, configs/unseen): each baseline once,
and each param's other value, the engine's way (``cluster.build.build.compile_candidate``). A
module's selected tests name the builds they need; those start together on a pool of a worker a
core, in the tests' order, and each test waits for its own (one at a time, they were a third of the
suite's time)."""

from __future__ import annotations

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster.build.build import compile_candidate
from cluster.config import Target, load_target
from cluster.core.types import BuildArtifact, Candidate, Scalar, Status

ARCH = "sm_90"

# nvcc names its temporary files tmpxft_<pid>_<counter>-...; the name lands in the host object.
NVCC_TEMP_NAME = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")

BuildKey = tuple[Path, str | None]  # a target file, and the param given its other value (None: the baseline)


def build(target: Target, params: dict[str, Scalar], root: Path) -> BuildArtifact:
    candidate = Candidate(target=target.name, toolchain="nvcc", device_type="t", arch=ARCH,
                          source_hash=target.bundle.hash, flags=(), params=tuple(params.items()))
    artifact = compile_candidate(target, candidate, root)
    assert artifact.status is Status.OK, f"{target.name} {params}: {artifact.error_tail}"
    assert artifact.binary
    return artifact


def masked(artifact: BuildArtifact) -> bytes:
    """The binary with nvcc's per-process temporary names masked: two builds of the same source and
    defines are the same bytes."""
    assert artifact.binary is not None
    return NVCC_TEMP_NAME.sub(b"tmpxft_", artifact.binary)


def other_value(target: Target, name: str) -> Scalar:
    """The first value of ``name`` other than the baseline's that the constraints allow with the
    baseline's other params."""
    baseline = target.baseline_params
    for value in target.spec.params[name]:
        if value != baseline[name] and target.satisfies({**baseline, name: value}):
            return value
    raise AssertionError(f"{target.name}: no other value of {name} fits the constraints")


class Builds:
    """The builds of ``wanted``, started at once on a pool of a worker a core, in order; ``get``
    waits for one (and starts one that was not wanted)."""

    def __init__(self, root: Path, wanted: list[BuildKey]) -> None:
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="nvcc")
        self.futures: dict[BuildKey, Future[BuildArtifact]] = {}
        for key in wanted:
            self._start(key)

    def _start(self, key: BuildKey) -> Future[BuildArtifact]:
        if key not in self.futures:
            path, name = key
            target = load_target(path)
            params = target.baseline_params if name is None else \
                {**target.baseline_params, name: other_value(target, name)}
            self.futures[key] = self.pool.submit(build, target, params, self.root)
        return self.futures[key]

    def get(self, path: Path, name: str | None = None) -> BuildArtifact:
        return self._start((path, name)).result()


def wanted(request: pytest.FixtureRequest, baseline_test: str, param_test: str) -> list[BuildKey]:
    """The builds that the selected tests of the requesting module need, in the order they run:
    ``baseline_test`` (parametrized by ``path``) needs the baseline, ``param_test`` (by ``path`` and
    ``name``) the baseline and the param's other value."""
    keys: list[BuildKey] = []
    for item in request.session.items:
        params = getattr(item, "callspec", None) and item.callspec.params
        if item.module is not request.module or not params or "path" not in params:
            continue
        if item.originalname == baseline_test:
            keys.append((params["path"], None))
        elif item.originalname == param_test:
            keys += [(params["path"], None), (params["path"], params["name"])]
    return list(dict.fromkeys(keys))
