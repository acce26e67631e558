"""One warpfleet sweep of a generated target (spaces.write_wf_target), as an evaluation trace.

A real sweep: a run config written to disk and loaded by ``cluster.api.load_run``, run by
``cluster.api.run_sweep`` on the Ray instance the lane started (one measuring actor per GPU it was
given), its rows read back from the run's Parquet dataset and its winner from ``select_best``.
The baseline is the first evaluation (so ``max_evals`` counts it), the search the rest; the final
re-measure of the best few is part of the run's wall time but adds no evaluation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from cluster.config.run import RACE, SEARCH_SAMPLES
from scripts.kt_compare.records import Evaluation, RunResult
from scripts.kt_compare.spaces import KernelSpace, config_key

SAMPLERS = {"best": "tpe", "random": "random"}


def write_run_config(folder: Path, target: Path, space: KernelSpace, kind: str, seed: int, max_evals: int,
                     time_limit_s: float, compile_workers: int | None, final_top_k: int, final_runs: int,
                     race: float | None = RACE, search_samples: int | None = SEARCH_SAMPLES) -> Path:
    spec: dict[str, Any] = {
        "name": f"{space.name}-{kind}-s{seed}", "targets": [str(target.resolve())],
        "output_dir": str((folder / "runs").resolve()),
        "search": {"sampler": SAMPLERS[kind], "seed": seed, "trials": max(1, max_evals - 1),
                   "time_budget_s": time_limit_s},
        "cluster": {"compile_workers": compile_workers, "inflight_per_worker": 2},
        "measure": {"runs": 1, "final_top_k": final_top_k, "final_runs": final_runs, "race": race,
                    "search_samples": search_samples},
        "profile": {"candidates": "none"},
        "flush_interval_s": 1.0,
    }
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_sweep(config_path: Path, space: KernelSpace, gpus: int, log: Any = print, fleet: Any = None) -> RunResult:
    """Run the sweep (Ray must be up) and read its trace; any failure is a row, never a raise.
    ``fleet``: a ``KeptFleet`` whose measuring actors serve this run and the lane's next ones (as
    Kernel Tuner's lane keeps its process and CUDA context), or None for a fleet of this run's own."""
    from cluster.api import create_run, load_run, log_to, read_results
    from cluster.api import run_sweep as sweep

    t0 = time.time()
    try:
        plan = load_run(config_path)
        run_dir = create_run(plan)
        with log_to(log):
            sweep(plan, run_dir, **({"fleet": fleet} if fleet is not None else {}))
        wall = time.time() - t0
        rows = read_results(run_dir)
    except Exception as exc:
        return RunResult(wall_s=time.time() - t0, error=f"{type(exc).__name__}: {exc}"[-2000:],
                         workers_requested=gpus)
    result = trace(space, rows, t0, wall, gpus)
    result.notes = f"run dir {run_dir.name}"
    return result


def _number(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def trace(space: KernelSpace, rows: pd.DataFrame, t0: float, wall: float, gpus: int) -> RunResult:
    """The baseline and search rows in the order their results came in (``finished_at``; a row
    whose build failed has none and goes last), and warpfleet's own selection as the winner."""
    from cluster.api import select_best

    if rows.empty:
        return RunResult(wall_s=wall, workers_requested=gpus, error="no rows")
    searched = rows[rows["phase"].isin(["baseline", "search"])].copy()
    finished = pd.to_datetime(searched["finished_at"], utc=True)
    searched["t_s"] = [ts.timestamp() - t0 if not pd.isna(ts) else None for ts in finished]
    searched = searched.sort_values("t_s", na_position="last", kind="stable")
    evaluations = []
    for row in searched.to_dict("records"):
        config = {name: row[f"p_{name}"] for name in space.names}
        ok = row["status"] == "ok" and row["median"] is not None and not pd.isna(row["median"])
        figures = {name: _number(row.get(column)) for name, column in
                   (("compile_s", "compile_s"), ("queue_s", "queue_s"), ("run_s", "run_s"), ("verify_s", "verify_s"))}
        evaluations.append(Evaluation(config_key(config, space.names), str(row["status"]), row["t_s"],
                                      float(row["median"]) if ok else None, str(row.get("worker_id") or ""),
                                      samples=int(row["n_samples"]) if _number(row.get("n_samples")) else None,
                                      raced=bool(row["raced"]) if "raced" in row and row["raced"] is not None
                                      and not pd.isna(row["raced"]) else None, **figures))
    best = select_best(rows)
    winner = best[0] if best else None
    workers = {e.worker for e in evaluations if e.worker}
    return RunResult(evaluations, wall, config_key(winner.params, space.names) if winner else None,
                     float(winner.median) if winner else None, workers_requested=gpus, workers_used=len(workers))
