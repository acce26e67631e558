"""The comparison's kernels as warpfleet kernel targets (scripts/kt_compare/kernel_targets.py): the
same space, geometry and inputs as Kernel Tuner gets, and cubins that build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cluster.compile.build import compile_candidate
from cluster.compile.kernel import nvrtc_version
from cluster.config import load_target
from cluster.core.types import Candidate, Status
from cluster.runners.kernel_harness import host_values
from scripts.kt_compare.kernel_targets import write_wf_kernel_target
from scripts.kt_compare.spaces import KERNEL_SPACES, KernelSpace

SPACES = list(KERNEL_SPACES.values())


@pytest.fixture(params=SPACES, ids=[s.name for s in SPACES])
def space(request: pytest.FixtureRequest) -> KernelSpace:
    return request.param


def test_same_space_geometry_and_check(space: KernelSpace, tmp_path: Path) -> None:
    target = load_target(write_wf_kernel_target(space, tmp_path / space.name, 0.05))
    assert target.spec.kind == "kernel" and target.space.flags == {"none": ("",)}
    assert target.space_size() == len(space.configs()) and target.baseline_params == space.defaults
    assert (target.spec.verify.rtol, target.spec.verify.atol) == (space.rtol, space.atol)
    assert target.spec.kernel.bench.min_time_s == 0.05
    for config in space.configs():
        plan = target.spec.kernel.plan(config)
        assert plan.grid == space.grid(config) and plan.block == space.threads(config), config


def test_inputs_are_the_programs_to_the_bit(space: KernelSpace, tmp_path: Path) -> None:
    target = load_target(write_wf_kernel_target(space, tmp_path / space.name, 0.05))
    plan = target.spec.kernel.plan(space.defaults)
    values = host_values(plan, 5, tmp_path)
    inputs = space.make_inputs(5)
    for arg, want in zip(plan.arguments, inputs.arguments, strict=True):
        got = values[arg.name]
        assert got.dtype == np.asarray(want).dtype and np.array_equal(got.reshape(-1), np.asarray(want).reshape(-1))
    for symbol in plan.constants:
        assert np.array_equal(values[symbol.name], inputs.cmem[symbol.name])
    assert [a.output for a in plan.arguments].index(True) == inputs.output


@pytest.mark.skipif(nvrtc_version() is None, reason="NVRTC not loadable")
def test_the_kernel_targets_build_for_sm90(space: KernelSpace, tmp_path: Path) -> None:
    target = load_target(write_wf_kernel_target(space, tmp_path / space.name, 0.05))
    configs = space.configs()
    for config in (configs[0], configs[-1]):
        candidate = Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash, (), tuple(config.items()))
        artifact = compile_candidate(target, candidate, tmp_path)
        assert artifact.status is Status.OK, artifact.error_tail
        assert artifact.kernels and artifact.kernels[0].registers > 0
