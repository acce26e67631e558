"""The warpfleet-against-Kernel-Tuner benchmark (scripts/bench_kerneltuner.py, scripts/kt_compare/), on
the CPU: both tools get the same configurations from one space definition, the same launch geometry
and the same inputs; the figures come out right from synthetic traces; the report is written from a
small synthetic Parquet; the kernels compile for sm_90; Kernel Tuner takes our arguments (its
simulation mode) and its parallel mode's worker count is what the benchmark says; a real warpfleet
sweep becomes a trace; and the whole command rehearses without a GPU.

Kernel Tuner is a benchmark-only dependency (the ``bench`` extra): the tests that need it skip
without it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest

from cluster.compile.build import HARNESS_INCLUDE
from cluster.config import load_target
from scripts.kt_compare import analysis, rehearsal
from scripts.kt_compare.lanes import Lane, LaneSpec, parse_key
from scripts.kt_compare.records import Block, Evaluation, RunResult, read_table, run_records, write_part
from scripts.kt_compare.spaces import (
    KERNEL_SPACES,
    Inputs,
    KernelSpace,
    config_key,
    fill_uniform,
    kernel_text,
    kt_arguments,
    kt_tune_params,
    write_wf_target,
)
from tests.conftest import REPO, needs, repo_pythonpath, write_target

SPACES = list(KERNEL_SPACES.values())
SCRIPT = REPO / "scripts" / "bench_kerneltuner.py"


def kt_configs(space: KernelSpace) -> set[str]:
    from kernel_tuner.searchspace import Searchspace

    tune_params, restrictions, _ = kt_tune_params(space)
    return {config_key(dict(zip(tune_params, values, strict=True)), space.names)
            for values in Searchspace(tune_params, restrictions, 1024).list}


# --- one space, both tools ------------------------------------------------------------------------


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_kernel_tuner_gets_exactly_warpfleets_configurations(space: KernelSpace) -> None:
    pytest.importorskip("kernel_tuner")
    ours = {config_key(c, space.names) for c in space.configs()}
    assert 50 <= len(ours) <= 150
    assert kt_configs(space) == ours


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_the_generated_warpfleet_target_has_the_same_space(space: KernelSpace, tmp_path: Path) -> None:
    target = load_target(write_wf_target(space, tmp_path / space.name, ["--min-time", "0.05"]))
    assert target.space.flags == {"none": ("",)}  # params only: no compiler flag is searched
    assert target.space_size() == len(space.configs())
    assert all(target.satisfies(c) for c in space.configs())
    assert target.baseline_params == space.defaults
    assert target.spec.run[-2:] == ["--min-time", "0.05"] and list(space.run_args) == target.spec.run[3:-2]
    assert (target.spec.verify.rtol, target.spec.verify.atol) == (space.rtol, space.atol)


def test_restrictions_agree_where_they_bite() -> None:
    """Points the constraints exclude are excluded by Kernel Tuner too, for its own reasons."""
    pytest.importorskip("kernel_tuner")
    matmul, conv = KERNEL_SPACES["matmul"], KERNEL_SPACES["convolution"]
    assert "TILE=8,WPT=4,UNROLL=1" not in kt_configs(matmul)  # 16 threads: under a warp
    assert not matmul.satisfies({"TILE": 8, "WPT": 4, "UNROLL": 1})
    too_big = {"block_size_x": 64, "block_size_y": 16, "tile_size_x": 4, "tile_size_y": 4}  # shared memory
    assert config_key(too_big, conv.names) not in kt_configs(conv) and not conv.satisfies(too_big)
    tune_params, restrictions, names = kt_tune_params(matmul)
    assert names == ["TILE", "kt_block_y"] and "kt_block_y == TILE // WPT" in restrictions
    assert tune_params["kt_block_y"] == [2, 4, 8, 16, 32]  # the TILE // WPT of the valid points


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_launch_geometry_is_kernel_tuners(space: KernelSpace) -> None:
    """The independent timer launches with space.threads/grid; Kernel Tuner computes its own from
    problem_size, grid_div and block_size_names: they agree on every configuration."""
    pytest.importorskip("kernel_tuner")
    from kernel_tuner import util
    from kernel_tuner.searchspace import Searchspace

    args = kt_arguments(space, Inputs([], 0, {}))
    tune_params, restrictions, names = kt_tune_params(space)
    names = list(names)
    util.append_default_block_size_names(names)
    for values in Searchspace(tune_params, restrictions, 1024).list:
        params = dict(zip(tune_params, values, strict=True))
        threads, grid = util.setup_block_and_grid(
            args["problem_size"], (args["grid_div_x"], args["grid_div_y"], args["grid_div_z"]), params, names)
        assert (tuple(threads), tuple(grid)) == (space.threads(params), space.grid(params)), params


def test_inputs_are_the_harness_fill_to_the_bit(tmp_path: Path) -> None:
    """Kernel Tuner's arrays are what wf::fill_uniform gives warpfleet's programs."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "fill.cpp").write_text(
        '#include <cstdio>\n#include <vector>\n#include "warpfleet/harness_core.hpp"\n'
        "int main() { std::vector<float> a(4099), b(77); wf::fill_uniform(a.data(), a.size(), 3);\n"
        "  wf::fill_uniform(b.data(), b.size(), 1u << 20, 0.f, 1.f);\n"
        '  for (float v : a) std::printf("%a\\n", v); for (float v : b) std::printf("%a\\n", v); }\n')
    subprocess.run([compiler, "-std=c++17", f"-I{HARNESS_INCLUDE}", "-o", str(tmp_path / "fill"),
                    str(tmp_path / "fill.cpp")], check=True)
    printed = subprocess.run([str(tmp_path / "fill")], capture_output=True, text=True, check=True).stdout.split()
    want = [float.fromhex(v) for v in printed]
    got = [*fill_uniform(4099, 3), *fill_uniform(77, 1 << 20, 0.0, 1.0)]
    assert [float(v) for v in got] == want


def test_kernel_text_is_the_kernel_cut_from_the_suite_program() -> None:
    for name, kernel in (("matmul", "sgemm_tiled"), ("stencil", "jacobi_step")):
        text = kernel_text(KERNEL_SPACES[name])
        assert "#include" not in text and "int main" not in text and "wf::" not in text
        assert f" {kernel}(" in text and text.rstrip().endswith("}")
        assert text.count("{") == text.count("}")
    assert kernel_text(KERNEL_SPACES["reduction"]) == KERNEL_SPACES["reduction"].source.read_text()


def test_outputs_match_is_the_check_of_both_tools() -> None:
    import numpy as np

    stencil, reduction = KERNEL_SPACES["stencil"], KERNEL_SPACES["reduction"]
    want = np.linspace(-1, 1, 100, dtype=np.float32)
    assert stencil.outputs_match(want.copy(), want)
    assert not stencil.outputs_match(want + 1e-3, want)
    assert not stencil.outputs_match(np.where(want > 0, np.nan, want).astype(np.float32), want)
    partial = np.zeros(2048, np.float32)
    partial[:3] = [1.0, 2.0, 3.0]
    other = np.zeros(2048, np.float32)
    other[:2] = [3.0, 3.0]  # other partial sums, the same total
    assert reduction.outputs_match(other, partial) and not reduction.outputs_match(other * 1.001, partial)


# --- the figures --------------------------------------------------------------------------------


def _reference(kernel: str, times: dict[str, float]) -> list[dict]:
    return [{"kernel": kernel, "key": k, "status": "ok", "median_ms": v} for k, v in times.items()]


def _run(tool: str, strategy: str, seed: int, trace: list[tuple[str, float]], repeat: int = 0, gpus: int = 1,
         winner: str | None = None, wall: float = 30.0, variant: str = "") -> tuple[list, list]:
    block = Block("run", "k", tool, strategy, seed, repeat, gpus, variant)
    result = RunResult([Evaluation(key, "ok", t, 1.0) for key, t in trace], wall, winner or trace[-1][0],
                       workers_requested=gpus, workers_used=gpus)
    name = {"warpfleet": "Optuna TPE", "kernel_tuner": "genetic_algorithm"}[tool] if strategy == "best" else "random"
    return run_records(block, result, name, 0.0)


def _data(runs: list[tuple[list, list]], reference: list[dict], remeasure: list[dict] | None = None) -> analysis.Data:
    evals = pd.DataFrame([e for r in runs for e in r[0]])
    table = pd.DataFrame([row for r in runs for row in r[1]])
    return analysis.Data(evals, table, pd.DataFrame(reference), pd.DataFrame(remeasure or []), pd.DataFrame())


REF = {"a": 1.000, "b": 1.005, "c": 1.2, "d": 2.0}  # a and b are within 1% of the optimum a


def test_time_to_within_one_percent_is_the_first_hit_and_censored_medians() -> None:
    runs = [
        _run("warpfleet", "best", 0, [("d", 1.0), ("c", 2.0), ("b", 3.5), ("a", 9.0)]),  # b at 3.5 s
        _run("warpfleet", "best", 1, [("d", 1.0), ("c", 2.0)]),  # never: censored
        _run("warpfleet", "best", 2, [("a", 0.5)]),
        _run("kernel_tuner", "best", 0, [("c", 1.0)]),
        _run("kernel_tuner", "best", 1, [("c", 1.0), ("a", 4.0)]),
        _run("kernel_tuner", "best", 2, [("b", 2.0)]),
        _run("kernel_tuner", "best", 3, [("a", 0.1)]),  # a seed warpfleet did not run: left out
    ]
    data = _data(runs, _reference("k", REF))
    best = analysis.optima(data.reference)
    assert best.iloc[0]["within_1pct"] == 2 and json.loads(best.iloc[0]["good_keys"]) == ["a", "b"]
    timed = analysis.time_to_target(data.runs, data.evals, best).set_index("run_id")["target_s"]
    assert timed["1gpu-warpfleet-k-best-s0-r0"] == 3.5 and math.isinf(timed["1gpu-warpfleet-k-best-s1-r0"])
    table = analysis.summary(data).set_index("tool")
    wf, kt = table.loc["warpfleet"], table.loc["kernel_tuner"]
    assert (wf["target_best_s"], wf["target_best_reached"], wf["target_best_runs"]) == (3.5, 2, 3)
    assert (kt["target_best_runs"], kt["target_best_reached"]) == (3, 2)  # seeds 0-2 only
    assert kt["target_best_s"] == 4.0  # the middle of (2.0, 4.0, never)
    assert analysis.censored_median([math.inf, math.inf, 1.0]) == math.inf


def test_winner_ratio_stability_and_scaling() -> None:
    runs = [
        _run("warpfleet", "best", 0, [("c", 1.0), ("a", 2.0)], winner="a", wall=30.0),
        _run("warpfleet", "best", 0, [("b", 1.0)], repeat=1, winner="b", wall=30.0),
        _run("warpfleet", "best", 0, [("a", 1.0)], repeat=2, winner="a", wall=30.0),
        _run("warpfleet", "best", 0, [("c", 1.0), ("a", 2.0), ("b", 3.0), ("d", 4.0)], gpus=2, winner="a",
             wall=30.0),
        _run("kernel_tuner", "best", 0, [("c", 1.0)], winner="c", wall=30.0),
        _run("kernel_tuner", "best", 0, [("d", 1.0)], repeat=1, winner="d", wall=30.0),
    ]
    remeasured = _reference("k", {"a": 0.995, "b": 1.0, "c": 1.3, "d": 2.0})
    table = analysis.summary(_data(runs, _reference("k", REF), remeasured)).set_index(["tool", "gpus"])
    wf, kt = table.loc[("warpfleet", 1)], table.loc[("kernel_tuner", 1)]
    assert wf["winner_key"] == "a" and wf["winner_vs_optimum"] == pytest.approx(1.0)
    assert kt["winner_vs_optimum"] == pytest.approx(1.3 / 0.995)
    assert (wf["repeat_runs"], wf["repeat_distinct_winners"], wf["repeat_winners_within_1pct"]) == (3, 2, True)
    assert (kt["repeat_distinct_winners"], kt["repeat_winners_within_1pct"]) == (2, False)
    two = table.loc[("warpfleet", 2)]
    assert two["evals_per_min"] == pytest.approx(8.0) and two["scaling"] == pytest.approx(2.0)
    assert (two["workers_used"], two["workers_requested"]) == (2, 2)


def test_report_from_a_small_synthetic_parquet(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for block_rows in (_run("warpfleet", "best", 0, [("c", 1.0), ("a", 2.5)], winner="a"),
                       _run("kernel_tuner", "best", 0, [("b", 0.8)], winner="b"),
                       _run("warpfleet", "random", 0, [("d", 1.0)], winner="d"),
                       _run("kernel_tuner", "random", 0, [("a", 7.0)], winner="a")):
        name = block_rows[1][0]["run_id"]
        write_part(out, "evals", name, block_rows[0])
        write_part(out, "runs", name, block_rows[1])
    write_part(out, "reference", "reference-k", [{**r, "config": "{}", "samples": "[]"} for r in _reference("k", REF)])
    (out / "meta.json").write_text(json.dumps({"date": "2026-11-26", "command": "bench", "versions": {"x": "1"},
                                               "gpus": [{"index": 0, "name": "Test GPU"}], "settings": {}}))
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--report-only"], capture_output=True,
                          text=True, cwd=REPO, check=True)
    report = (out / "report.md").read_text()
    assert done.stdout.strip() == report.strip()
    assert "Test GPU (GPU 0)" in report and "Command: `bench`" in report
    assert "| k | 4 | 4 | 1.0000 | `a` | 2 |" in report
    rows = [line for line in report.splitlines() if line.startswith("| k | ")]
    assert "| k | warpfleet (Optuna TPE) | 3.0 | 2.5 s (1/1) | not reached (0/1) | `a` 1.0000 ms | 1.000x |" in rows[2]
    assert "| k | Kernel Tuner (genetic_algorithm) | 2.0 | 0.8 s (1/1) | 7.0 s (1/1) | `b` 1.0050 ms | 1.005x |" \
        in rows[1]
    summary = pd.read_parquet(out / "summary.parquet")
    assert set(summary["tool"]) == {"warpfleet", "kernel_tuner"}
    raw = out / "raw"
    assert len(pd.read_parquet(raw / "evals.parquet")) == 5 and len(pd.read_parquet(raw / "runs.parquet")) == 4


# --- the parts and the lanes --------------------------------------------------------------------


def test_part_files_are_whole_or_absent(tmp_path: Path) -> None:
    assert write_part(tmp_path, "runs", "x", []) is None
    write_part(tmp_path, "runs", "x", [{"a": 1, "b": [1, 2]}])
    write_part(tmp_path, "runs", "y", [{"a": 2, "b": [3]}])
    table = read_table([tmp_path], "runs")
    assert list(table["a"]) == [1, 2] and list(table["b"]) == ["[1, 2]", "[3]"]
    assert not list((tmp_path / "parts" / "runs").glob(".*"))


def test_lane_skips_the_blocks_it_cannot_finish_by_its_deadline(tmp_path: Path) -> None:
    blocks = [Block("run", "matmul", "warpfleet", "best", 0), Block("reference", "stencil")]
    spec = LaneSpec("late", str(tmp_path), str(tmp_path / "work"), time.time() + 5.0, 1,
                    [b.__dict__ for b in blocks], {"dry_run": True})
    Lane(spec).run()
    rows = read_table([tmp_path], "blocks").set_index("block_id")
    run = rows.loc["1gpu-warpfleet-matmul-best-s0-r0"]
    assert run["status"] == "skipped" and "would not finish" in run["detail"]  # the first guess, 15 s
    assert rows.loc["reference-stencil", "status"] == "done"  # the reference runs whatever the clock says
    assert len(read_table([tmp_path], "reference")) == len(KERNEL_SPACES["stencil"].configs())
    assert (tmp_path / "logs" / "late.log").is_file()


def test_each_warpfleet_run_compiles_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel targets' compile cache is emptied before each warpfleet run of a lane, as CuPy's memo
    is before each Kernel Tuner run: neither tool's configurations per minute count compiles an
    earlier run made."""
    from cluster.compile.kernel import cache_dir

    monkeypatch.setenv("WARPFLEET_SCRATCH", str(tmp_path / "scratch"))
    cached = cache_dir(tmp_path / "scratch") / "an-entry.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("{}")
    spec = LaneSpec("cold", str(tmp_path / "out"), str(tmp_path / "work"), time.time() + 600, 1, [],
                    {"dry_run": True, "wf_kind": "kernel", "max_evals": 4})
    result = Lane(spec)._warpfleet(Block("run", "reduction", "warpfleet", "random", 0), KERNEL_SPACES["reduction"])
    assert not result.error and result.unique_evaluations >= 1
    assert not cached.parent.exists()


def test_plan_puts_whole_seeds_first_then_the_repeats() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_kerneltuner as bench

    blocks = bench.run_blocks("warpfleet", ["matmul", "stencil"], seeds=5, repeats=3)
    order = [(b.seed, b.repeat) for b in blocks]
    assert order[:8] == [(s, 0) for s in range(2) for _ in range(4)]
    assert order[8:12] == [(0, 1), (0, 2), (0, 1), (0, 2)]
    assert order[12:] == [(s, 0) for s in (2, 3, 4) for _ in range(4)]
    assert [b.kernel for b in blocks[8:12]] == ["matmul", "matmul", "stencil", "stencil"]  # whole kernels first
    assert {b.strategy for b in blocks} == {"best", "random"} and len(blocks) == 2 * (2 * 5 + 2)
    # The best strategy alone (--strategies best): seed 0 of each kernel, then its repeats.
    best = bench.run_blocks("warpfleet", ["matmul", "stencil"], seeds=1, repeats=3, strategies=("best",))
    assert [(b.kernel, b.strategy, b.seed, b.repeat) for b in best] == [
        ("matmul", "best", 0, 0), ("stencil", "best", 0, 0), ("matmul", "best", 0, 1), ("matmul", "best", 0, 2),
        ("stencil", "best", 0, 1), ("stencil", "best", 0, 2)]
    two = bench.two_gpu_blocks("kernel_tuner", ["matmul", "stencil"], repaired=True)
    assert [(b.kernel, b.strategy, b.variant) for b in two] == [
        ("matmul", "best", "shipped"), ("matmul", "random", "shipped"),  # it fails whatever the kernel
        ("matmul", "best", "repaired"), ("stencil", "best", "repaired"),
        ("matmul", "random", "repaired"), ("stencil", "random", "repaired")]
    assert {b.gpus for b in two} == {2} and len(bench.two_gpu_blocks("warpfleet", ["matmul"], True)) == 2
    assert parse_key(config_key({"A": 1, "B": 20}, ["A", "B"])) == {"A": 1, "B": 20}


# --- Kernel Tuner: our arguments, its parallel mode -----------------------------------------------


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_kernel_tuner_takes_our_arguments_in_its_simulation_mode(space: KernelSpace, tmp_path: Path) -> None:
    """The real tune_kernel on our arguments (its check of the kernel's signature against them, the
    restrictions, both strategies and the budget), replaying a cache of synthetic times."""
    pytest.importorskip("kernel_tuner")
    cache = rehearsal.kt_cache(space, tmp_path)
    valid = {config_key(c, space.names) for c in space.configs()}
    for kind, expected in (("best", "genetic_algorithm"), ("random", "random_sample")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            result, strategy = rehearsal.kt_run(space, cache, kind, "genetic_algorithm", seed=1, max_evals=12,
                                                time_limit_s=60.0)
        # Kernel Tuner checks each argument against the kernel's signature, and only warns.
        assert not [w for w in seen if "does not match" in str(w.message)], [str(w.message) for w in seen]
        assert strategy == expected and not result.error
        keys = [e.key for e in result.evaluations]
        assert set(keys) <= valid and 1 <= result.unique_evaluations <= 12
        assert result.winner_key in keys
        assert result.winner_tool_ms == min(e.tool_ms for e in result.evaluations if e.tool_ms is not None)
    again, _ = rehearsal.kt_run(space, cache, "random", "genetic_algorithm", seed=1, max_evals=12, time_limit_s=60.0)
    assert [e.key for e in again.evaluations] == keys  # seeded through random and numpy.random


class _RunnerStarted(Exception):
    pass


@pytest.mark.parametrize(("strategy", "patched", "workers"), [
    ("random_sample", False, 1), ("genetic_algorithm", False, 1),  # listed as parallel, yet one worker
    ("random_sample", True, None), ("genetic_algorithm", True, None),  # None: one per GPU in Ray
    ("bayes_opt", True, 1),  # not listed: one worker, by design
])
def test_kernel_tuner_parallel_mode_gives_one_worker_unless_its_check_is_repaired(
        strategy: str, patched: bool, workers: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Kernel Tuner 1.5.0's tune_kernel(parallel=True) asks its ParallelRunner for: its check
    `strategy not in _STRATEGY_PARALLEL` compares a module with names, so every strategy gets one
    worker; with the modules added to the list (the 'patched' variant) the listed ones get all GPUs."""
    pytest.importorskip("kernel_tuner")
    pytest.importorskip("ray")
    from kernel_tuner.runners import parallel

    from scripts.kt_compare.kt_run import parallel_mode_repaired

    seen = []

    def record(self, *args, num_workers=None, **kwargs):
        seen.append(num_workers)
        raise _RunnerStarted

    monkeypatch.setattr(parallel.ParallelRunner, "__init__", record)
    space = KERNEL_SPACES["reduction"]
    from kernel_tuner import tune_kernel

    with parallel_mode_repaired(patched), pytest.raises(_RunnerStarted):
        tune_kernel(**kt_arguments(space, space.make_inputs(0)), strategy=strategy, parallel=True, quiet=True)
    assert seen == [workers]
    from kernel_tuner import interface

    assert all(isinstance(n, str) for n in interface._STRATEGY_PARALLEL)  # the list is restored
    assert parallel.ParallelRunner.run.__qualname__ == "ParallelRunner.run"  # and the runner's run


# --- the kernels compile -------------------------------------------------------------------------


def _largest(space: KernelSpace) -> dict[str, int]:
    return max(space.configs(), key=lambda c: (space.threads(c)[0] * space.threads(c)[1], sorted(c.values())))


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_the_independent_timers_cubins_build_for_sm90_and_name_the_kernel(space: KernelSpace,
                                                                          tmp_path: Path) -> None:
    from scripts.kt_compare.reference import compile_cubin, kernel_symbol

    source = tmp_path / "kernel.cu"
    source.write_text(kernel_text(space))
    for label, config in (("baseline", space.defaults), ("largest", _largest(space))):
        cubin = tmp_path / f"{label}.cubin"
        assert compile_cubin(source, cubin, config, "sm_90") is None
        symbol = kernel_symbol(cubin, space.kernel_name)
        assert symbol == space.kernel_name or symbol.startswith(f"_Z{len(space.kernel_name)}{space.kernel_name}")


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_the_generated_warpfleet_targets_build_for_sm90(space: KernelSpace, tmp_path: Path) -> None:
    from cluster.compile.build import compile_candidate
    from cluster.core.types import Candidate, Status

    target = load_target(write_wf_target(space, tmp_path / space.name, ["--min-time", "0.05"]))
    candidates = [Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash, (("none", ""),),
                            tuple(config.items())) for config in (space.defaults, _largest(space))]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two builds at once, on two cores
        artifacts = list(pool.map(lambda candidate: compile_candidate(target, candidate), candidates))
    for artifact in artifacts:
        assert artifact.status == Status.OK, artifact.error_tail
        assert any(space.kernel_name in k.kernel for k in artifact.kernels)
        assert all(k.spill_stores == 0 for k in artifact.kernels if space.kernel_name in k.kernel)


# --- warpfleet: a real sweep becomes a trace -------------------------------------------------------


def test_the_run_config_carries_the_search_sample_cap(tmp_path: Path) -> None:
    """--wf-search-samples: measure.search_samples in the written config, which loads; none: the full rule."""
    from cluster.config import load_run
    from cluster.config.run import SEARCH_SAMPLES
    from scripts.kt_compare.wf_run import write_run_config

    target = write_target(tmp_path, params={"N": [1, 2]}, defaults={"N": 1})
    space = KernelSpace("tiny", "main", target, target, {"N": (1, 2)}, {"N": 1}, (), ("1",), (1,), ((),), (),
                        lambda seed: Inputs([], 0, {}), 0.0, 0.0)
    common = {"time_limit_s": 60.0, "compile_workers": None, "final_top_k": 1, "final_runs": 1}
    default = write_run_config(tmp_path, target, space, "random", seed=1, max_evals=3, **common)
    assert load_run(default).config.measure.search_samples == SEARCH_SAMPLES
    (tmp_path / "full").mkdir()
    full = write_run_config(tmp_path / "full", target, space, "random", seed=1, max_evals=3, search_samples=None,
                            **common)
    assert load_run(full).config.measure.search_samples is None


def test_a_real_warpfleet_sweep_becomes_a_trace(tmp_path: Path, ray_local: None) -> None:
    """wf_run on the CPU: the run config it writes loads, the sweep runs (a C target standing in for
    a GPU one, params only), and its rows come back as evaluations in the order they finished."""
    from scripts.kt_compare.wf_run import run_sweep, write_run_config

    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "space.yaml").write_text("name: none\ntoolchain: cc\nflags: {none: ['']}\n")
    target = write_target(folder, space="space.yaml", params={"N": [1000, 2000, 3000, 4000]}, defaults={"N": 2000})
    space = KernelSpace("tiny", "main", target, target, {"N": (1000, 2000, 3000, 4000)}, {"N": 2000}, (), ("1",),
                        (1,), ((),), (), lambda seed: Inputs([], 0, {}), 0.0, 0.0)
    config = write_run_config(tmp_path, target, space, "random", seed=3, max_evals=3, time_limit_s=60.0,
                              compile_workers=None, final_top_k=1, final_runs=1)
    result = run_sweep(config, space, gpus=1, log=lambda m: None)
    assert not result.error, result.error
    keys = [e.key for e in result.evaluations]
    assert keys[0] == "N=2000" and len(keys) == 3 == len(set(keys))  # the baseline, then two trials
    assert set(keys) <= {"N=1000", "N=2000", "N=3000", "N=4000"}
    times = [e.t_s for e in result.evaluations]
    assert all(t is not None and 0 < t <= result.wall_s for t in times) and times == sorted(times)
    # The tiny program writes N into its output: another N is a wrong answer against the baseline's.
    assert [(e.status, e.tool_ms) for e in result.evaluations] == [("ok", 2.5), ("verify_failed", None),
                                                                   ("verify_failed", None)]
    assert all(e.worker == "cpu-0" for e in result.evaluations)
    # Where each configuration's time went, from its row: the baseline's one run (measure.runs) of 3 samples,
    # so that the search starts from it (its other final_runs come as a final row, outside the trace), its
    # build, its run; never raced (the baseline samples in full, and tiny is a program).
    base = result.evaluations[0]
    assert base.samples == 3 and base.raced is False and base.compile_s > 0 and base.run_s > 0
    assert all(e.compile_s is not None and e.run_s is not None for e in result.evaluations)
    assert (result.winner_key, result.winner_tool_ms, result.workers_used) == ("N=2000", 2.5, 1)
    assert result.notes.startswith("run dir ")
    # A lane's runs on one kept fleet (the default): the second run is measured by the first's actor.
    from cluster.engine.scheduling.workers import KeptFleet

    with KeptFleet() as kept:
        for seed in (4, 5):
            (tmp_path / f"kept-{seed}").mkdir()
            again = write_run_config(tmp_path / f"kept-{seed}", target, space, "random", seed=seed, max_evals=3,
                                     time_limit_s=60.0, compile_workers=None, final_top_k=1, final_runs=1)
            kept_result = run_sweep(again, space, gpus=1, log=lambda m: None, fleet=kept)
            assert not kept_result.error and kept_result.winner_key == "N=2000"
        assert kept.starts == 1


# --- the whole command, rehearsed ------------------------------------------------------------------


def test_the_whole_command_rehearses_without_a_gpu(tmp_path: Path) -> None:
    """--dry-run: the real lanes (processes), deadlines, part files, analysis and report, with
    synthetic times and Kernel Tuner in its simulation mode."""
    pytest.importorskip("kernel_tuner")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--work", str(tmp_path / "work"),
                           "--dry-run", "--quick", "--kernels", "matmul,reduction", "--budget-s", "120"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    blocks = read_table([out], "blocks")
    assert set(blocks["status"]) == {"done"}, blocks[["block_id", "status", "detail"]]
    assert set(blocks["lane"]) == {"gpu0-warpfleet", "gpu1-reference-kerneltuner", "2gpu-warpfleet",
                                   "2gpu-kerneltuner", "remeasure"}
    summary = pd.read_parquet(out / "summary.parquet")
    # Per kernel: two tools on one GPU, warpfleet and Kernel Tuner repaired on two; as shipped: the first kernel.
    assert len(summary) == 2 * 4 + 1
    report = (out / "report.md").read_text()
    assert "rehearsal: no GPU" in report and "### Two GPUs" in report
    assert json.loads((out / "meta.json").read_text())["settings"]["dry_run"] is True
    assert "[" in done.stdout and "bench] all lanes done" in done.stdout  # timestamped progress lines


# --- the independent timer, on a stand-in for CuPy ------------------------------------------------


class _FakeCupy:
    """Just the CuPy the independent timer uses, on NumPy: a "kernel" writes the configuration's
    first param value into the output (so the baseline's output differs from others' unless the
    check compares sums) and takes 1 ms per unit of its first param."""

    int32 = "int32"

    def __init__(self) -> None:
        import types

        import numpy as np

        self.np = np
        self.launches: list[tuple] = []
        self.elapsed: list[float] = []
        fake = self

        class Device:
            compute_capability = "90"
            attributes: ClassVar[dict[str, int]] = {"L2CacheSize": 50 << 20, "MultiProcessorCount": 132}
            id = 0

            def synchronize(self) -> None:
                pass

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                self.non_blocking = non_blocking

            def synchronize(self) -> None:
                pass

        class Event:
            def record(self, stream: object = None) -> None:
                pass

            def synchronize(self) -> None:
                pass

        class Module:
            def __init__(self, path: str) -> None:
                found = re.search(r"^[A-Za-z_]+?(\d+)", Path(path).stem)  # BLOCK_X32_BLOCK_Y8_...: 32
                self.value = int(found.group(1)) if found else 0

            def get_function(self, name: str):
                def launch(grid, block, args, stream=None):
                    assert stream is not None and not stream.non_blocking
                    if name == "wf_ref_flush":  # the L2 flush: reads, writes nothing
                        assert args[0].nbytes == 2 * (50 << 20) and int(args[1]) * 16 == args[0].nbytes
                        return
                    fake.launches.append((grid, block))
                    fake.elapsed.append(float(self.value))
                    out = [a for a in args if isinstance(a, np.ndarray) and a.dtype == np.float32][-1]
                    out[...] = self.value
                return launch

            def get_global(self, name: str):
                return ("symbol", name)

        self.cuda = types.SimpleNamespace(Device=Device, Stream=Stream, Event=Event,
                                          get_elapsed_time=lambda a, b: fake.elapsed[-1])
        self.RawModule = lambda path: Module(path)

    def asarray(self, a):
        return self.np.array(a)

    def asnumpy(self, a):
        return self.np.array(a)

    def zeros(self, n, dtype):
        return self.np.zeros(n, dtype)

    def ndarray(self, shape, dtype, pointer):
        return self.np.zeros(shape, dtype)


def test_the_independent_timer_checks_before_it_times_and_refines_the_fastest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scripts.kt_compare import reference

    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)

    def fake_compile(source: Path, out: Path, defines: dict, arch: str) -> str | None:
        assert arch == "sm_90"
        if defines.get("OUTPUTS_Y") == 8 and defines.get("BLOCK_X") == 256:
            return "error: a stand-in compile error"
        out.write_bytes(b"cubin")
        return None

    monkeypatch.setattr(reference, "compile_cubin", fake_compile)
    monkeypatch.setattr(reference, "kernel_symbol", lambda path, name: name)
    space = KERNEL_SPACES["stencil"]  # cubin names start with the BLOCK_X value: the fake kernel's time
    measured = {m.key: m for m in reference.exhaustive(space, tmp_path, jobs=2, samples=3, refine_top=2,
                                                       refine_samples=4, log=lambda m: None)}
    assert len(measured) == len(space.configs())
    baseline = measured[config_key(space.defaults, space.names)]
    assert baseline.status == "ok" and baseline.median == 32.0
    statuses = {m.status for k, m in measured.items() if k != baseline.key}
    # Every other BLOCK_X writes another value than the baseline's 32: wrong output, never timed.
    assert {m.status for m in measured.values() if m.config["BLOCK_X"] == 32} == {"ok"}
    assert "wrong_output" in statuses and "compile_error" in statuses
    assert all(not m.samples for m in measured.values() if m.status != "ok")
    oks = [m for m in measured.values() if m.status == "ok"]
    assert sorted(len(m.samples) for m in oks)[-2:] == [7, 7] and min(len(m.samples) for m in oks) == 3
    assert all(block[0] * block[1] <= 1024 for _, block in fake.launches)

    again = reference.remeasure(space, [m.config for m in oks[:2]], tmp_path / "again", jobs=1, rounds=2, samples=5)
    assert {m.key for m in again} == {m.key for m in oks[:2]} | {baseline.key}
    assert all(m.status == "ok" and len(m.samples) == 10 for m in again)


# --- Kernel Tuner's CuPy path, on a stand-in for CuPy ----------------------------------------------


FAKE_CUPY = r'''"""A stand-in for CuPy: what Kernel Tuner's CuPy backend and the independent timer use, on NumPy. A
"kernel" reads its configuration from the #defines Kernel Tuner prepends (or, loaded from a file,
from the JSON the test's stand-in compiler wrote there), records its launch in LAUNCHES, and sets
every float array it gets to 1 (the same output for every configuration)."""
import json
import re
import types

import numpy as np

LAUNCHES = []
MEMO_CLEARED = []  # one entry per cupy.clear_memo(): a run that forgets the modules compiled before it
int32 = np.int32


def clear_memo():
    MEMO_CLEARED.append(len(LAUNCHES))


class ndarray(np.ndarray):  # device arrays
    pass


class Device:
    id = 0

    def __init__(self, index=0):
        self.attributes = {"MaxThreadsPerBlock": 1024, "L2CacheSize": 1 << 20, "MultiProcessorCount": 4}
        self.compute_capability = "90"

    def use(self):
        pass

    def synchronize(self):
        pass


class Stream:
    def __init__(self, non_blocking=False):
        self.non_blocking = non_blocking

    def synchronize(self):
        pass


class Event:
    done = True

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Module:
    def __init__(self, code=None, options=(), name_expressions=None, path=None):
        if path is not None:
            self.defines = {k: str(v) for k, v in json.loads(open(path).read()).items()}
        else:
            assert "-std=c++17" in options
            prefix = code.split("#line 1")[0]  # Kernel Tuner's #defines, before the kernel's own defaults
            self.defines = dict(re.findall(r"^#define (\w+) (\S+)$", prefix, re.MULTILINE))
        self.globals = {}

    def get_function(self, name):
        module = self

        def launch(grid, block, args, stream=None, shared_mem=0):
            if name != "wf_ref_flush":
                LAUNCHES.append((module.defines, tuple(grid), tuple(block)))
            for a in args:
                if isinstance(a, ndarray) and a.dtype == np.float32:
                    a[...] = 1.0

        launch.num_regs = 32
        return launch

    def get_global(self, name):
        return self.globals.setdefault(name, bytearray(1 << 16))


def array(a):
    return np.array(a).view(ndarray)


asarray = array


def asnumpy(a):
    return np.array(a).view(np.ndarray)


def zeros(n, dtype):
    return np.zeros(n, dtype).view(ndarray)


copyto = np.copyto
RawModule = Module

cuda = types.SimpleNamespace(
    Device=Device, Stream=Stream, Event=Event, get_elapsed_time=lambda start, end: 0.25,
    runtime=types.SimpleNamespace(driverGetVersion=lambda: 13000,
                                  getDeviceProperties=lambda i: {"uuid": bytes(16), "name": b"Fake GPU"}))
'''

FAKE_CUPYX = '''def get_runtime_info():
    return "CuPy Version: fake\\nDevice 0 Name: Fake GPU\\nDevice 0 PCI Bus ID: 0000:00:00.0\\n"
'''


def _fake_cupy(folder: Path) -> Path:
    """Packages ``cupy`` and ``cupyx`` (the stand-in) in ``folder``, for sys.path or PYTHONPATH."""
    for name, text in (("cupy", FAKE_CUPY), ("cupyx", FAKE_CUPYX)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(text)
    return folder


def _use_fake_cupy(folder: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(_fake_cupy(folder)))
    for module in ("cupy", "cupyx", "kernel_tuner.backends.cupy", "kernel_tuner.observers.cupy"):
        monkeypatch.delitem(sys.modules, module, raising=False)  # the last two bound cupy when imported
    import cupy

    return cupy


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_kernel_tuners_cupy_path_on_a_stand_in_for_cupy(space: KernelSpace, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """kt_run as on the GPU (the answer from run_kernel, tune_kernel's sequential runner, our verify,
    constant memory, the trace with Kernel Tuner's timestamps), with CuPy replaced: every launch has
    the geometry of the space definition for the configuration Kernel Tuner compiled."""
    pytest.importorskip("kernel_tuner")
    cupy = _use_fake_cupy(tmp_path, monkeypatch)
    launches = cupy.LAUNCHES
    from scripts.kt_compare.kt_run import KernelTunerRuns

    runs = KernelTunerRuns()
    runs.prepare(space)  # the answer, once per kernel: not part of a run
    for number, kind in enumerate(("best", "random")):
        before = len(launches)
        result, strategy = runs.run(space, kind, "genetic_algorithm", seed=2, max_evals=6, time_limit_s=60.0, gpus=1)
        assert not result.error, result.error
        assert strategy == ("genetic_algorithm" if kind == "best" else "random_sample")
        assert 1 <= result.unique_evaluations <= 6 and all(e.status == "ok" for e in result.evaluations)
        times = [e.t_s for e in result.evaluations]
        assert all(t is not None and 0 <= t <= result.wall_s + 1 for t in times) and times == sorted(times)
        assert result.winner_key in {e.key for e in result.evaluations} and result.winner_tool_ms == 0.25
        assert (result.workers_requested, result.workers_used) == (1, 1)
        assert cupy.MEMO_CLEARED[number] == before  # compiles cold: the memo forgotten before the run's first
    assert launches and len(cupy.MEMO_CLEARED) == 2
    for defines, grid, block in launches:
        config = {name: int(defines[name]) for name in space.names}
        assert space.satisfies(config)
        assert (grid, block) == (space.grid(config), space.threads(config)), config


PARALLEL_RUN = """
import json
import ray
ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
         configure_logging=False)
from scripts.kt_compare.kt_run import KernelTunerRuns
from scripts.kt_compare.spaces import KERNEL_SPACES
runs, out = KernelTunerRuns(), {}
for name, kind, repaired in (("shipped", "random", False), ("repaired", "random", True), ("ga", "best", True)):
    result, _ = runs.run(KERNEL_SPACES["reduction"], kind, "genetic_algorithm", 0, 8, 120.0, 2, repaired=repaired)
    out[name] = {"error": result.error, "used": result.workers_used, "requested": result.workers_requested,
                         "actors": sorted({e.worker for e in result.evaluations}), "n": result.unique_evaluations,
                         "t": [e.t_s for e in result.evaluations]}
ray.shutdown()
print("RESULT " + json.dumps(out))
"""


def test_kernel_tuners_parallel_runner_on_two_stand_in_gpus(tmp_path: Path) -> None:
    """Kernel Tuner's parallel mode as the two-GPU lane runs it (Ray with two GPUs, its actors, our
    verify shipped to them, its timestamps), CuPy stood in for in every process: as shipped it starts
    one actor and fails at the first result; repaired, it uses both GPUs."""
    pytest.importorskip("kernel_tuner")
    pytest.importorskip("ray")
    env = {**__import__("os").environ, "PYTHONPATH": repo_pythonpath(str(_fake_cupy(tmp_path))), "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-c", PARALLEL_RUN], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    shipped = out["shipped"]
    assert shipped["error"] == "TypeError: unhashable type: 'list'" and shipped["n"] == 0
    for repaired in (out["repaired"], out["ga"]):
        assert not repaired["error"], repaired["error"]
        assert (repaired["requested"], repaired["used"], len(repaired["actors"])) == (2, 2, 2)
        assert 1 <= repaired["n"] <= 8 and all(t is not None and t > 0 for t in repaired["t"])


def test_a_lane_runs_the_reference_kernel_tuner_and_the_remeasure_on_a_stand_in_for_cupy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU lane's own code (no rehearsal): the exhaustive reference, Kernel Tuner's runs and the
    re-measurement, CuPy stood in for and nvcc replaced by a writer of the defines; then the report."""
    pytest.importorskip("kernel_tuner")
    _use_fake_cupy(tmp_path / "fake", monkeypatch)
    from scripts.kt_compare import reference

    def compile_defines(source: Path, out: Path, defines: dict, arch: str) -> None:
        out.write_text(json.dumps(defines))

    monkeypatch.setattr(reference, "compile_cubin", compile_defines)
    monkeypatch.setattr(reference, "kernel_symbol", lambda path, name: name)
    out = tmp_path / "out"
    blocks = [Block("reference", "convolution"), Block("run", "convolution", "kernel_tuner", "best", 0),
              Block("run", "convolution", "kernel_tuner", "random", 1), Block("remeasure", "convolution")]
    settings = {"max_evals": 6, "ref_samples": 3, "ref_refine_top": 2, "ref_refine_samples": 3,
                "remeasure_rounds": 1, "remeasure_samples": 3, "jobs": 2}
    Lane(LaneSpec("gpu1", str(out), str(tmp_path / "work"), time.time() + 600, 1,
                  [b.__dict__ for b in blocks], settings)).run()
    assert set(read_table([out], "blocks")["status"]) == {"done"}
    ref = read_table([out], "reference")
    assert len(ref) == len(KERNEL_SPACES["convolution"].configs()) and set(ref["status"]) == {"ok"}
    assert set(ref["gpu_name"]) == {"Fake GPU"} and ref["median_ms"].eq(0.25).all()
    runs = read_table([out], "runs")
    assert list(runs["error"]) == ["", ""] and list(runs["strategy_name"]) == ["genetic_algorithm", "random_sample"]
    remeasured = read_table([out], "remeasure")
    assert set(runs["winner_key"]) <= set(remeasured["key"])
    sys.path.insert(0, str(SCRIPT.parent))
    import bench_kerneltuner as bench

    text = bench.report(out, [])
    assert "| convolution | 123 | 123 | 0.2500 |" in text and "Kernel Tuner (genetic_algorithm)" in text
