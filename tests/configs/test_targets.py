"""The shipped targets and test fixtures: they load, build, run and behave as documented.

Builds expand each target's own build template (``cluster.core.placeholders.expand``) with real
values and run it as an argument list, as the engine does, adding ``-Wall -Wextra -Werror`` so
that the C sources stay warning-free.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cluster.config import Target, load_run, load_target
from cluster.core.placeholders import expand
from cluster.core.types import Scalar

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
FIXTURES = REPO / "tests" / "fixtures"
STENCIL = CONFIGS / "targets" / "stencil_c" / "target.yaml"
SAXPY = CONFIGS / "targets" / "saxpy" / "target.yaml"
FAULTY = FIXTURES / "targets" / "faulty" / "target.yaml"

WARNINGS_AS_ERRORS = ["-Wall", "-Wextra", "-Werror"]
METRIC_LINE = re.compile(r"^@warpfleet time_ms=(\S+)$", re.MULTILINE)
STENCIL_CELLS = (250 + 2) ** 2  # the run command's --n 250, plus the halo
FAULTY_VALUES = 1024


@dataclass(frozen=True)
class Built:
    build: subprocess.CompletedProcess[str]
    binary: Path
    workdir: Path


def _build_template(target: Target) -> list[str]:
    from cluster.toolchains import get_toolchain

    return list(target.spec.build or get_toolchain(target.spec.toolchain).default_build)


def _options(*options: str) -> list[str]:
    """Flag-space options as compiler arguments ("" adds nothing; "-Xptxas -v" adds two)."""
    return [arg for option in options for arg in shlex.split(option)]


def build(target: Target, workdir: Path, params: dict[str, Scalar], flags: list[str],
          arch: str = "host") -> Built:
    workdir.mkdir(parents=True)
    for name, content in target.bundle.files:
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_bytes(content)
    binary = workdir / "candidate"
    argv = expand(_build_template(target), {
        "flags": flags, "defines": [f"-D{k}={v}" for k, v in params.items()], "arch": arch,
        "binary": str(binary), "sources": list(target.spec.sources), "workdir": str(workdir),
        **params})
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True,
                            timeout=target.spec.timeouts.build)
    return Built(result, binary, workdir)


def run(target: Target, built: Built, params: dict[str, Scalar], rundir: Path,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    assert built.build.returncode == 0, built.build.stderr
    rundir.mkdir(parents=True)
    argv = expand(target.spec.run, {"binary": str(built.binary), "workdir": str(built.workdir),
                                    "arch": "host", **params})
    return subprocess.run(argv, cwd=rundir, capture_output=True, text=True,
                          timeout=timeout or target.spec.timeouts.run)


def metrics(stdout: str) -> list[float]:
    return [float(value) for value in METRIC_LINE.findall(stdout)]


# --- loading -------------------------------------------------------------------------------


def test_saxpy_target_loads() -> None:
    target = load_target(SAXPY)
    assert (target.name, target.spec.toolchain, target.space.name) == ("saxpy", "nvcc", "nvcc")
    assert dict(target.bundle.files).keys() == {"saxpy.cu"}
    assert target.spec.params == {"BLOCK": [64, 128, 256, 512, 1024], "ITEMS": [1, 2, 4, 8]}
    assert target.baseline_params == {"BLOCK": 256, "ITEMS": 1}
    assert target.satisfies({"BLOCK": 1024, "ITEMS": 4})
    assert not target.satisfies({"BLOCK": 1024, "ITEMS": 8})
    assert [o.path for o in target.spec.verify.outputs] == ["out.bin"]
    assert target.spec.verify.outputs[0].dtype == "float32"
    assert (target.spec.timeouts.build, target.spec.timeouts.run) == (180, 60)


def test_stencil_target_loads() -> None:
    target = load_target(STENCIL)
    assert (target.name, target.spec.toolchain, target.space.name) == ("stencil_c", "cc", "cc")
    assert target.spec.params == {"TILE": [16, 32, 64, 128], "UNROLL": [1, 2, 4]}
    assert target.baseline_params == {"TILE": 64, "UNROLL": 1}
    assert target.satisfies({"TILE": 128, "UNROLL": 2})
    assert not target.satisfies({"TILE": 128, "UNROLL": 4})
    assert "-ffast-math" in target.space.flags["fast_math"]  # why the tolerance is loose
    assert (target.spec.verify.rtol, target.spec.verify.atol) == (1e-4, 1e-6)


def test_faulty_target_loads_with_its_own_space() -> None:
    target = load_target(FAULTY)
    assert target.space.name == "none"
    assert target.space.flags == {"opt_level": ("-O1",)}
    assert target.spec.params == {"MODE": list(range(10))}
    assert target.baseline_params == {"MODE": 0}
    assert target.space_size() == 10
    assert (target.spec.timeouts.build, target.spec.timeouts.run) == (60, 3)
    limits = target.spec.limits
    assert (limits.memory_mb, limits.file_mb, limits.disk_mb) == (256, 32, 64)  # modes 8 and 9 hit them


def test_demo_config_names_both_targets() -> None:
    plan = load_run(CONFIGS / "demo.yaml")
    assert plan.config.name == "demo"
    assert [t.name for t in plan.targets] == ["saxpy", "stencil_c"]
    search, measure = plan.config.search, plan.config.measure
    assert (search.sampler, search.seed, search.trials) == ("tpe", 0, 24)
    assert (measure.runs, measure.final_top_k, measure.final_runs) == (1, 3, 3)


def test_fixture_configs_load() -> None:
    cpu = load_run(FIXTURES / "demo_cpu.yaml")
    assert [t.name for t in cpu.targets] == ["stencil_c"]
    assert cpu.config.search.trials == 8
    assert (cpu.config.measure.final_top_k, cpu.config.measure.final_runs) == (2, 2)
    faulty = load_run(FIXTURES / "faulty.yaml")
    assert [t.name for t in faulty.targets] == ["faulty"]
    assert (faulty.config.search.sampler, faulty.config.search.trials) == ("grid", 10)


# --- the stencil -----------------------------------------------------------------------------

# (params, space options): the baseline, and variants whose loop structure and code differ.
STENCIL_VARIANTS = {
    "baseline-O0": ({"TILE": 64, "UNROLL": 1}, ("",)),
    "tile16-unroll4-O3": ({"TILE": 16, "UNROLL": 4}, ("-O3",)),
    "tile128-unroll2-O2-unrolled": ({"TILE": 128, "UNROLL": 2}, ("-O2", "-funroll-loops")),
    "tile32-unroll1-O3-fast-math": ({"TILE": 32, "UNROLL": 1}, ("-O3", "-march=native", "-ffast-math")),
}


@dataclass(frozen=True)
class StencilRun:
    times_ms: list[float]
    wall_s: float
    grid: np.ndarray


@pytest.fixture(scope="module")
def stencil_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StencilRun]:
    target = load_target(STENCIL)
    runs = {}
    for name, (params, options) in STENCIL_VARIANTS.items():
        root = tmp_path_factory.mktemp(name)
        built = build(target, root / "build", params, [*_options(*options), *WARNINGS_AS_ERRORS])
        start = time.perf_counter()
        result = run(target, built, params, root / "run")
        wall_s = time.perf_counter() - start
        assert result.returncode == 0, result.stderr
        out = root / "run" / "out.bin"
        assert out.stat().st_size == STENCIL_CELLS * 4
        runs[name] = StencilRun(metrics(result.stdout), wall_s, np.fromfile(out, dtype=np.float32))
    return runs


def test_stencil_prints_several_timings(stencil_runs: dict[str, StencilRun]) -> None:
    for run_ in stencil_runs.values():
        assert len(run_.times_ms) == 5
        assert all(t > 0 for t in run_.times_ms)


# Timing claims (-O3 against -O0) belong in benchmarks, not in tests: see BENCHMARKS.md.


def test_stencil_result_is_a_real_relaxation(stencil_runs: dict[str, StencilRun]) -> None:
    grid = stencil_runs["baseline-O0"].grid.reshape(252, 252)
    assert np.all(grid[0] == 1.0) and np.all(grid[-1] == 0.0)  # the fixed edges
    interior = grid[1:-1, 1:-1]
    assert np.all((interior >= 0) & (interior <= 1)) and np.isfinite(interior).all()
    # Averaging smooths the random start: neighbours end up much closer than uniform noise.
    assert np.abs(np.diff(interior, axis=1)).mean() < 0.1


@pytest.mark.parametrize("variant", [v for v in STENCIL_VARIANTS if v != "baseline-O0"])
def test_stencil_result_does_not_depend_on_tile_unroll_or_flags(
        stencil_runs: dict[str, StencilRun], variant: str) -> None:
    baseline = stencil_runs["baseline-O0"].grid
    grid = stencil_runs[variant].grid
    if "fast-math" in variant:
        spec = load_target(STENCIL).spec.verify
        np.testing.assert_allclose(grid, baseline, rtol=spec.rtol, atol=spec.atol)
    else:
        np.testing.assert_allclose(grid, baseline, rtol=1e-5, atol=0)


# --- the faulty target ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty_baseline(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    target = load_target(FAULTY)
    root = tmp_path_factory.mktemp("faulty-baseline")
    built = build(target, root / "build", {"MODE": 0}, ["-O1", *WARNINGS_AS_ERRORS])
    result = run(target, built, {"MODE": 0}, root / "run")
    assert result.returncode == 0, result.stderr
    assert len(metrics(result.stdout)) == 3
    return np.fromfile(root / "run" / "out.bin", dtype=np.float32)


def _faulty(tmp_path: Path, mode: int, timeout: float = 2.0) -> tuple[subprocess.CompletedProcess[str], Path]:
    target = load_target(FAULTY)
    built = build(target, tmp_path / "build", {"MODE": mode}, ["-O1", *WARNINGS_AS_ERRORS])
    return run(target, built, {"MODE": mode}, tmp_path / "run", timeout=timeout), tmp_path / "run" / "out.bin"


def test_faulty_mode0_is_correct(faulty_baseline: np.ndarray) -> None:
    assert faulty_baseline.shape == (FAULTY_VALUES,) and np.isfinite(faulty_baseline).all()


@pytest.mark.parametrize(("mode", "signal_number"), [(1, signal.SIGSEGV), (6, signal.SIGABRT)])
def test_faulty_modes_that_die_by_signal(tmp_path: Path, mode: int, signal_number: int) -> None:
    result, out = _faulty(tmp_path, mode)
    assert result.returncode == -signal_number
    assert not out.exists()


def test_faulty_mode2_hangs(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        _faulty(tmp_path, 2, timeout=2.0)


def test_faulty_mode3_writes_wrong_values(tmp_path: Path, faulty_baseline: np.ndarray) -> None:
    result, out = _faulty(tmp_path, 3)
    assert result.returncode == 0 and len(metrics(result.stdout)) == 3
    wrong = np.fromfile(out, dtype=np.float32)
    assert wrong.shape == faulty_baseline.shape
    assert not np.allclose(wrong, faulty_baseline, rtol=1e-5, atol=1e-8)


def test_faulty_mode4_prints_no_metric(tmp_path: Path) -> None:
    result, out = _faulty(tmp_path, 4)
    assert result.returncode == 0 and result.stdout.strip()
    assert metrics(result.stdout) == [] and "@warpfleet" not in result.stdout
    assert out.stat().st_size == FAULTY_VALUES * 4


def test_faulty_mode5_does_not_compile(tmp_path: Path) -> None:
    target = load_target(FAULTY)
    built = build(target, tmp_path / "build", {"MODE": 5}, ["-O1"])
    assert built.build.returncode != 0
    assert "MODE 5" in built.build.stderr
    assert not built.binary.exists()


def test_faulty_mode7_exits_with_status_3(tmp_path: Path) -> None:
    result, _ = _faulty(tmp_path, 7)
    assert result.returncode == 3
    assert len(metrics(result.stdout)) == 3


# --- the CUDA target -------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize(("params", "options"), [
    ({"BLOCK": 256, "ITEMS": 1}, ()),
    ({"BLOCK": 1024, "ITEMS": 4}, ("-maxrregcount=32", "--use_fast_math", "-Xptxas -dlcm=cg")),
])
def test_saxpy_compiles_for_sm90(tmp_path: Path, params: dict[str, Scalar], options: tuple[str, ...]) -> None:
    from cluster.toolchains import get_toolchain

    target = load_target(SAXPY)
    report = list(get_toolchain("nvcc").report_flags)  # makes ptxas print the registers used
    flags = [*_options(*options), *report, "-Xcompiler=-Wall,-Wextra,-Werror"]
    built = build(target, tmp_path / "build", params, flags, arch="sm_90")
    assert built.build.returncode == 0, built.build.stderr
    assert built.binary.is_file()
    registers = re.findall(r"Used (\d+) registers", built.build.stdout + built.build.stderr)
    assert registers and all(0 < int(r) <= 255 for r in registers)
