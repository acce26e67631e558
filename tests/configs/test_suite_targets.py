"""The benchmark-suite targets (regpressure, unroll, transpose, each with a hand-optimized _opt):
they load, and they compile for sm_90 with the resources their designs promise.

The builds go the engine's way: the bundle written with ``write_bundle``, the command from
``build_command``, run by ``run_command``, the ptxas report read by the nvcc toolchain. They run
once per module, in parallel, in 8 nvcc invocations: the baselines of the six targets (shared with
the other modules that build them: tests/configs/_builds.py, ``compile_once``), regpressure with
-maxrregcount=64, and one invocation that compiles unroll.cu for every other UNROLL (a translation
unit per value, each defining UNROLL and including unroll.cu).
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.compile.build import HARNESS_INCLUDE, build_command
from cluster.config import Target, load_target
from cluster.core.types import Candidate, KernelResources
from cluster.sandbox.sandbox import ProcessResult, run_command, write_bundle
from cluster.toolchains import get_toolchain
from tests.configs._builds import SUITE_BUILDS, compile_params
from tests.conftest import needs

pytestmark = SUITE_BUILDS

TARGETS = Path(__file__).resolve().parents[2] / "configs" / "targets"
SUITE = {
    "regpressure": TARGETS / "regpressure" / "target.yaml",
    "regpressure_opt": TARGETS / "regpressure" / "target_opt.yaml",
    "unroll": TARGETS / "unroll" / "target.yaml",
    "unroll_opt": TARGETS / "unroll" / "target_opt.yaml",
    "transpose": TARGETS / "transpose" / "target.yaml",
    "transpose_opt": TARGETS / "transpose" / "target_opt.yaml",
}
UNROLLS = [1, 2, 4, 8, 16]
ARCH = "sm_90"


# --- loading -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SUITE)
def test_suite_target_loads_with_the_harness_build(name: str) -> None:
    target = load_target(SUITE[name])
    spec = target.spec
    assert (target.name, spec.toolchain, target.space.name) == (name, "nvcc", "nvcc")
    assert spec.sources == [f"{name}.cu"] and dict(target.bundle.files).keys() == {f"{name}.cu"}
    assert spec.build == ["nvcc", "{flags}", "{defines}", "{harness_include}", "-arch={arch}", "-o", "{binary}",
                          "{sources}"]
    assert spec.run[:3] == ["{binary}", "--seed", "{seed}"]  # inputs fresh per run
    assert [o.path for o in spec.verify.outputs] == ["out.bin"]
    assert spec.verify.outputs[0].dtype == "float32"
    assert spec.timeouts.run <= 30


@pytest.mark.parametrize("base", ["regpressure", "unroll", "transpose"])
def test_opt_target_runs_and_checks_like_its_baseline(base: str) -> None:
    plain, opt = load_target(SUITE[base]).spec, load_target(SUITE[f"{base}_opt"]).spec
    assert opt.run == plain.run and opt.verify == plain.verify
    assert opt.params == plain.params and opt.constraints == plain.constraints


def test_suite_params_and_baselines() -> None:
    assert load_target(SUITE["regpressure"]).spec.params == {}  # the flags are the whole space
    unroll, unroll_opt = load_target(SUITE["unroll"]), load_target(SUITE["unroll_opt"])
    assert unroll.spec.params == {"UNROLL": UNROLLS}
    assert (unroll.baseline_params, unroll_opt.baseline_params) == ({"UNROLL": 1}, {"UNROLL": 4})
    transpose = load_target(SUITE["transpose"])
    assert transpose.spec.params == {"TILE": [16, 32], "BLOCK_ROWS": [4, 8, 16, 32]}
    assert transpose.baseline_params == {"TILE": 32, "BLOCK_ROWS": 8}
    assert transpose.satisfies({"TILE": 16, "BLOCK_ROWS": 16})
    assert not transpose.satisfies({"TILE": 16, "BLOCK_ROWS": 32})
    assert (transpose.spec.verify.rtol, transpose.spec.verify.atol) == (0, 0)  # a copy is exact


# --- builds for sm_90 ------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    result: ProcessResult
    kernels: tuple[KernelResources, ...]
    workdir: Path

    def kernel(self, name: str) -> KernelResources:
        """The one kernel whose mangled name contains ``name`` (the harness's flush is another)."""
        found = [k for k in self.kernels if name in k.kernel]
        assert len(found) == 1, (name, [k.kernel for k in self.kernels])
        return found[0]


def _candidate(target: Target, flags: tuple[tuple[str, str], ...] = ()) -> Candidate:
    return Candidate(target=target.name, toolchain="nvcc", device_type="t", arch=ARCH,
                     source_hash=target.bundle.hash, flags=flags, params=tuple(target.baseline_params.items()))


def _job(target: Target, workdir: Path, flags: tuple[tuple[str, str], ...] = ()) -> tuple[list[str], Path]:
    workdir.mkdir(parents=True)
    write_bundle(target.bundle.files, workdir)
    return build_command(target, _candidate(target, flags), workdir), workdir


def _unroll_batch(target: Target, workdir: Path) -> tuple[list[str], Path]:
    """One nvcc for every UNROLL but the baseline's: a translation unit per value, objects only."""
    workdir.mkdir(parents=True)
    write_bundle(target.bundle.files, workdir)
    units = []
    for unroll in UNROLLS[1:]:
        (workdir / f"unroll_u{unroll}.cu").write_text(f'#define UNROLL {unroll}\n#include "unroll.cu"\n')
        units.append(f"unroll_u{unroll}.cu")
    report = list(get_toolchain("nvcc").report_flags)
    return ["nvcc", *report, f"-I{HARNESS_INCLUDE}", f"-arch={ARCH}", "-c", *units], workdir


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    root = tmp_path_factory.mktemp("suite")
    targets = {name: load_target(path) for name, path in SUITE.items()}
    jobs = {"regpressure_maxrreg64": _job(targets["regpressure"], root / "regpressure_maxrreg64",
                                          flags=(("maxrregcount", "-maxrregcount=64"),)),
            "unroll_others": _unroll_batch(targets["unroll"], root / "unroll_others")}
    nvcc = get_toolchain("nvcc")
    with ThreadPoolExecutor(max_workers=len(jobs) + len(targets)) as pool:
        shared = {name: pool.submit(compile_params, target) for name, target in targets.items()}
        futures = {name: pool.submit(run_command, argv, workdir, 600.0) for name, (argv, workdir) in jobs.items()}
        built = {name: Build(compiled.result, compiled.kernels, compiled.binary.parent)
                 for name, compiled in ((name, future.result()) for name, future in shared.items())}
        results = {name: future.result() for name, future in futures.items()}
    return {**built, **{name: Build(result, nvcc.parse_resources(result.stderr), jobs[name][1])
                        for name, result in results.items()}}


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("name", [*SUITE, "regpressure_maxrreg64", "unroll_others"])
def test_suite_target_builds_for_sm90(builds: dict[str, Build], name: str) -> None:
    build = builds[name]
    assert build.result.ok, build.result.tail()
    if name != "unroll_others":
        assert (build.workdir / "candidate.bin").stat().st_size > 0


@pytest.mark.nvcc
@needs("nvcc")
def test_regpressure_is_register_limited_until_capped(builds: dict[str, Build]) -> None:
    baseline = builds["regpressure"].kernel("series_sum")
    capped = builds["regpressure_maxrreg64"].kernel("series_sum")
    assert baseline.registers > 64, baseline  # 2 blocks of 256 per SM at most
    assert (baseline.spill_stores, baseline.spill_loads) == (0, 0)
    assert capped.registers <= 64 < baseline.registers  # 4 blocks of 256 fit
    # The cap costs a few spills at most (ptxas moves the warp-uniform coefficients into uniform
    # registers): the design is that the warps gained are not eaten by local-memory traffic.
    assert capped.spill_loads <= 128, capped


@pytest.mark.nvcc
@needs("nvcc")
def test_regpressure_opt_reaches_full_occupancy_without_spills(builds: dict[str, Build]) -> None:
    opt = builds["regpressure_opt"].kernel("series_sum")
    assert 0 < opt.registers <= 32, opt  # 8 blocks of 256: 64 warps per SM
    assert (opt.spill_stores, opt.spill_loads, opt.stack_bytes) == (0, 0, 0)


@pytest.mark.nvcc
@needs("nvcc")
def test_transpose_padding_adds_one_column_of_shared_memory(builds: dict[str, Build]) -> None:
    # TILE = 32 in both baselines: 32 x 32 floats unpadded, 32 x 33 padded.
    assert builds["transpose"].kernel("transpose").shared_bytes == 32 * 32 * 4
    assert builds["transpose_opt"].kernel("transpose").shared_bytes == 32 * 33 * 4


@pytest.mark.nvcc
@needs("nvcc")
def test_unroll_builds_for_every_unroll_and_the_pragma_takes_effect(builds: dict[str, Build]) -> None:
    firs = [k for k in builds["unroll_others"].kernels if "fir" in k.kernel]
    assert len(firs) == len(UNROLLS) - 1  # one per translation unit, in order
    for kernel in [builds["unroll"].kernel("fir"), *firs, builds["unroll_opt"].kernel("fir")]:
        assert kernel.registers > 0 and (kernel.spill_stores, kernel.spill_loads) == (0, 0), kernel
    # `#pragma unroll kUnroll` unrolls by the constant: the code, so the object, grows with it;
    # a loop that ignored UNROLL would give the same size every time. (The constexpr is needed:
    # nvcc does not expand a macro there, `#pragma unroll UNROLL` does not compile.)
    sizes = [(builds["unroll_others"].workdir / f"unroll_u{u}.o").stat().st_size for u in UNROLLS[1:]]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes), sizes


def test_every_suite_baseline_guards_its_check_and_output() -> None:
    """Agents edit kernels and launches; the check against the CPU reference and the output file
    sit in a read-only region that the patch tools refuse to touch."""
    from agents.patch import readonly_regions

    for name in ("regpressure", "unroll", "transpose", "multikernel", "matmul", "conv2d"):
        text = (TARGETS / name / f"{name}.cu").read_text()
        lines = text.splitlines()
        guarded = {line for begin, end in readonly_regions(text) for line in range(begin, end + 1)}
        for marker in ("cudaMemcpyDeviceToHost", "wf::write_output("):
            where = [i + 1 for i, line in enumerate(lines) if marker in line]
            assert where and all(line in guarded for line in where), (name, marker)
