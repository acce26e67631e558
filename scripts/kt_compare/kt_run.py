"""One Kernel Tuner tuning run (``tune_kernel``, CuPy backend), as an evaluation trace.

What Kernel Tuner 1.5.0 does, as read in its source and checked here:

- ``seed`` reaches only the pymoo strategies; the others draw from Python's ``random`` and NumPy's
  global generator, so both are seeded before every call.
- ``parallel=True`` is meant to start one Ray actor per GPU for the strategies listed in
  ``interface._STRATEGY_PARALLEL`` (brute_force, random_sample, diff_evo, genetic_algorithm, pso,
  firefly_algorithm) and one worker for the rest. The check compares the strategy *module* with
  those names (``strategy not in _STRATEGY_PARALLEL``), so it never matches and every strategy gets
  one worker. Then ``ParallelRunner.run`` looks each result up by the objective *list* that
  ``tune_kernel`` made (``result.get(["time"])``) and raises ``TypeError: unhashable type: 'list'``
  at the first result: as shipped, no parallel run finishes. The ``repaired`` variant fixes both for
  its call (``parallel_mode_repaired``); the runs record how many workers each call really used.
- Each configuration is compiled (NVRTC, through CuPy) and measured in the process or actor that owns
  the GPU: compile and measurement take turns. ``CUPY_CACHE_IN_MEMORY=1`` keeps CuPy's on-disk kernel
  cache out of it, and CuPy's memo of every module it compiled in this process (``_get_raw_module`` is
  memoized per device) is cleared before each run (``cupy.clear_memo``), so every run compiles cold,
  as warpfleet's does (its compile cache is emptied before each of its runs: lanes.py). Until
  2026-11-26 the memo was kept: a run after the first of a kernel found the modules that earlier
  runs had compiled, and its configurations per minute counted compiles it never made.
- A configuration whose output fails ``verify`` raises and ends the tuning run (recorded as an error).
- The sequential runner counts a configuration served from its cache (one the strategy asked for
  again) against ``max_fevals``: the genetic algorithm, which revisits configurations, evaluates
  fewer distinct ones than the budget. The figures count distinct configurations.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np

from scripts.kt_compare.records import Evaluation, RunResult
from scripts.kt_compare.spaces import KernelSpace, config_key, evaluate, kt_arguments, kt_tune_params, kt_verify

os.environ.setdefault("CUPY_CACHE_IN_MEMORY", "1")


def strategy_for(kind: str, best: str, max_evals: int) -> tuple[str, dict[str, Any]]:
    """Kernel Tuner's strategy and options for ``best`` or ``random``. The genetic algorithm's
    population (26 by default) would spend a small budget on its first generation alone, a random
    sample; it gets a quarter of the budget, so that it breeds a few generations."""
    if kind == "random":
        return "random_sample", {}
    if best == "genetic_algorithm":
        return best, {"popsize": max(4, max_evals // 4)}
    return best, {}


def baseline_params(space: KernelSpace) -> dict[str, int]:
    """The baseline configuration with Kernel Tuner's derived block params."""
    tune_params, _, names = kt_tune_params(space)
    params = dict(space.defaults)
    for axis_name, expr in zip(names, space.block, strict=False):
        if axis_name not in params:
            params[axis_name] = evaluate(expr, space.defaults)
    return {k: params[k] for k in tune_params}


class KernelTunerRuns:
    """Kernel Tuner runs of one process: inputs and the baseline's answer computed once per kernel."""

    def __init__(self, log: Any = print) -> None:
        import kernel_tuner

        self.kt = kernel_tuner
        self.version = kernel_tuner.__version__
        self.log = log
        self._prepared: dict[str, tuple[dict[str, Any], list[Any]]] = {}

    def prepare(self, space: KernelSpace) -> tuple[dict[str, Any], list[Any]]:
        """tune_kernel's arguments and the answer: the baseline configuration's output, computed with
        Kernel Tuner's own run_kernel (its documented way to get a reference)."""
        if space.name not in self._prepared:
            inputs = space.make_inputs(0)
            args = kt_arguments(space, inputs)
            outputs = self.kt.run_kernel(
                args["kernel_name"], args["kernel_source"], args["problem_size"], args["arguments"],
                baseline_params(space), grid_div_x=args["grid_div_x"], grid_div_y=args["grid_div_y"],
                grid_div_z=args["grid_div_z"], lang=args["lang"], cmem_args=args["cmem_args"],
                compiler_options=args["compiler_options"], block_size_names=args["block_size_names"], quiet=True)
            answer: list[Any] = [None] * len(inputs.arguments)
            answer[inputs.output] = np.array(outputs[inputs.output])
            self._prepared[space.name] = (args, answer)
        return self._prepared[space.name]

    def run(self, space: KernelSpace, kind: str, best: str, seed: int, max_evals: int, time_limit_s: float,
            gpus: int, repaired: bool = False) -> tuple[RunResult, str]:
        args, answer = self.prepare(space)
        strategy, options = strategy_for(kind, best, max_evals)
        options = {**options, "max_fevals": max_evals, "time_limit": time_limit_s}
        random.seed(seed)
        np.random.seed(seed)
        forget_compiled()
        parallel = gpus > 1
        t0 = time.time()
        try:
            with parallel_mode_repaired(repaired):
                results, env = self.kt.tune_kernel(
                    **args, answer=answer, verify=kt_verify(space), strategy=strategy, strategy_options=options,
                    parallel=parallel, seed=seed, quiet=True, verbose=False)
        except Exception as exc:  # Kernel Tuner ends a run on a wrong output; a row, not the end
            return RunResult(wall_s=time.time() - t0, error=f"{type(exc).__name__}: {exc}"[-2000:],
                             workers_requested=gpus), strategy
        wall = time.time() - t0
        return trace(space, results, env, t0, wall, gpus), strategy


def forget_compiled() -> None:
    """Cold compiles for the next run: CuPy keeps every RawModule it compiled (per device, in
    memory) for the life of the process, and Kernel Tuner's CuPy backend makes one per configuration."""
    import cupy

    cupy.clear_memo()


@contextlib.contextmanager
def parallel_mode_repaired(repaired: bool) -> Iterator[None]:
    """For the repaired variant, two fixes for the length of one call:

    - the strategy modules join ``_STRATEGY_PARALLEL``, so that its check finds the strategies it lists
      (and only those) and lets them have a worker per GPU;
    - ``ParallelRunner.run`` gets the objective's name, not the one-element list ``tune_kernel`` makes
      of it: as shipped, ``result.get(objective)`` with that list raises ``TypeError: unhashable type:
      'list'`` at the first result, so no parallel run finishes.
    """
    from kernel_tuner import interface
    from kernel_tuner.runners import parallel

    if not repaired:
        yield
        return
    added = [interface.strategy_map[n] for n in interface._STRATEGY_PARALLEL if isinstance(n, str)]
    shipped_run = parallel.ParallelRunner.run

    def run(self: Any, parameter_space: Any, tuning_options: Any) -> Any:
        objective = tuning_options.objective
        if isinstance(objective, list | tuple) and len(objective) == 1:
            # A shallow copy: tune_kernel keeps some options as attributes of this dict (cache,
            # restrictions, verify), which a copy of its items alone would lose.
            tuning_options = copy.copy(tuning_options)
            tuning_options.objective = objective[0]
        return shipped_run(self, parameter_space, tuning_options)

    interface._STRATEGY_PARALLEL.extend(added)
    parallel.ParallelRunner.run = run
    try:
        yield
    finally:
        parallel.ParallelRunner.run = shipped_run
        for module in added:
            interface._STRATEGY_PARALLEL.remove(module)


def trace(space: KernelSpace, results: list[dict[str, Any]], env: dict[str, Any], t0: float, wall: float,
          gpus: int) -> RunResult:
    """Kernel Tuner's results (one dict per configuration it ran, with a UTC timestamp set when its
    result came in) as evaluations; its winner is env["best_config"]."""
    evaluations = []
    for r in results:
        error = r.get("__error__")
        ok = error is None and isinstance(r.get("time"), int | float)
        stamp = r.get("timestamp")
        t_s = datetime.fromisoformat(str(stamp)).timestamp() - t0 if stamp else None
        evaluations.append(Evaluation(config_key(r, space.names), "ok" if ok else str(error or "error"), t_s,
                                      float(r["time"]) if ok else None, str(r.get("ray_actor_id") or "local")))
    best = env.get("best_config") if isinstance(env.get("best_config"), dict) else None
    workers = env.get("workers")
    return RunResult(
        evaluations, wall, config_key(best, space.names) if best else None,
        float(best["time"]) if best and isinstance(best.get("time"), int | float) else None,
        workers_requested=gpus, workers_used=len(workers) if isinstance(workers, list) else 1,
        notes=f"actors seen in results: {len({e.worker for e in evaluations})}" if gpus > 1 else "")
