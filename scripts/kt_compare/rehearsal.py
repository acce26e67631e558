"""The rehearsal (``--dry-run``): the whole command on a machine without a GPU, to find what would
break before a GPU is spent on it. The lanes, deadlines, part files, analysis and report are the real
ones; what needs a GPU is replaced:

- the independent timer gives every configuration a synthetic time (a fixed function of its key);
- Kernel Tuner runs for real, in its simulation mode, on a cache file of those times: its argument
  checks (the kernel's signature against the arguments), restrictions, strategies and budget are
  its own; only the timestamps are synthetic (the cached compile and benchmark times, added up);
- warpfleet's target is generated and loaded by the engine as on the GPU, but the sweep is a seeded
  sample of the space at a synthetic pace, since no GPU worker can run it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from scripts.kt_compare.records import Evaluation, RunResult
from scripts.kt_compare.reference import Measured
from scripts.kt_compare.spaces import KernelSpace, config_key, kt_arguments, kt_tune_params

COMPILE_MS, VERIFY_MS, BENCHMARK_MS = 150.0, 20.0, 10.0  # Kernel Tuner's per-configuration costs, made up


def synthetic_ms(key: str) -> float:
    digest = hashlib.sha256(key.encode()).digest()
    return 0.05 + int.from_bytes(digest[:4], "little") / 2**32 * 0.5


def reference(space: KernelSpace) -> list[Measured]:
    return [Measured(space.name, config_key(c, space.names), c, "ok", [synthetic_ms(config_key(c, space.names))] * 3)
            for c in space.configs()]


def remeasure(space: KernelSpace, configs: list[dict[str, int]]) -> list[Measured]:
    return [Measured(space.name, config_key(c, space.names), c, "ok", [synthetic_ms(config_key(c, space.names))])
            for c in [space.defaults, *configs]]


def kt_cache(space: KernelSpace, folder: Path) -> Path:
    """A Kernel Tuner cache file holding every valid configuration, as its simulation mode needs."""
    from kernel_tuner.searchspace import Searchspace

    tune_params, restrictions, _ = kt_tune_params(space)
    entries = {}
    for values in Searchspace(tune_params, restrictions, 1024).list:
        params = dict(zip(tune_params, values, strict=True))
        ms = synthetic_ms(config_key(params, space.names))
        entries[",".join(str(v) for v in values)] = {
            **params, "time": ms, "times": [ms] * 7, "compile_time": COMPILE_MS, "verification_time": VERIFY_MS,
            "benchmark_time": BENCHMARK_MS}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{space.name}.json"
    path.write_text(json.dumps({
        "device_name": "Simulation", "kernel_name": space.kernel_name, "problem_size": list(space.problem_size),
        "tune_params_keys": list(tune_params), "tune_params": tune_params, "objective": "time", "cache": entries}))
    return path


def kt_run(space: KernelSpace, cache: Path, kind: str, best: str, seed: int, max_evals: int,
           time_limit_s: float) -> tuple[RunResult, str]:
    """A real tune_kernel call in simulation mode (sequential: Kernel Tuner refuses parallel there)."""
    import time

    import numpy as np
    from kernel_tuner import tune_kernel

    from scripts.kt_compare.kt_run import strategy_for, trace

    strategy, options = strategy_for(kind, best, max_evals)
    random.seed(seed)
    np.random.seed(seed)
    args = kt_arguments(space, space.make_inputs(0))
    t0 = time.time()
    results, env = tune_kernel(**args, strategy=strategy, strategy_options={**options, "max_fevals": max_evals,
                                                                             "time_limit": time_limit_s},
                               simulation_mode=True, cache=str(cache), quiet=True, verbose=False, seed=seed)
    result = trace(space, results, env, t0, time.time() - t0, 1)
    elapsed = 0.0
    stamped = []
    for r, e in zip(results, result.evaluations, strict=True):
        elapsed += (r.get("compile_time", 0) + r.get("verification_time", 0) + r.get("benchmark_time", 0)) / 1000
        stamped.append(Evaluation(e.key, e.status, elapsed, e.tool_ms, e.worker))
    result.evaluations, result.wall_s = stamped, max(result.wall_s, elapsed)
    return result, strategy


def wf_run(space: KernelSpace, target: Path, kind: str, seed: int, max_evals: int, gpus: int) -> RunResult:
    """warpfleet's generated target, loaded as a sweep would load it; the sweep itself synthetic."""
    from cluster.config import load_target

    loaded = load_target(target)
    configs = space.configs()
    assert loaded.space_size() == len(configs), "the generated target's space is not the space"
    rng = random.Random(f"{kind}-{seed}")
    picked = [space.defaults, *rng.sample([c for c in configs if c != space.defaults], max_evals - 1)]
    evaluations = [Evaluation(config_key(c, space.names), "ok", 2.0 + 0.4 * i / gpus,
                              synthetic_ms(config_key(c, space.names)), f"gpu-{i % gpus}")
                   for i, c in enumerate(picked)]
    winner = min(evaluations, key=lambda e: e.tool_ms or 0.0)
    return RunResult(evaluations, 3.0 + 0.4 * len(picked) / gpus, winner.key, winner.tool_ms,
                     workers_requested=gpus, workers_used=gpus, notes="rehearsal: synthetic sweep")
