"""Where the driver becomes the bottleneck: the real engine on a simulated fleet (issue 13).

    python scripts/bench_sim.py --workers 8,16,32,64 --run-s 1.0,0.05 --candidates-per-worker 20 --out DIR

Each point starts Ray's multi-node test cluster (``ray.cluster_utils.Cluster``) with ``W`` fake GPU
resources over nodes of 8, ``cluster.engine.scheduling.simulate``'s fake workers (a modelled run time per
candidate) and fake compiles (the same modelled time), and sweeps the saxpy target's space with
the real driver, scheduler, Optuna study (``--sampler``) and Parquet writer. It reports the
workers' busy fraction (their modelled run time over their wall time once the fleet is up),
candidates per second, and the driver's own time per candidate (asking Optuna, submitting,
recording, telling): as wall time outside its waits (on a host with fewer cores than the simulated
fleet's processes, that includes time the driver waited for a core) and as the driver process's
CPU time (its thread and Ray's threads in it) over the sweep, per row. Every point runs in a
process of its own. DIR/sim.json holds the figures, DIR/sim.md the table.

A study has a structure that no driver removes: its baseline first (a compile and
``final_runs + 1`` runs, while the other workers wait), the first wave of compiles, the finals last.
A short sweep spends a large share of its time there, so the busy fraction is also given in the
steady state ("busy, mid-search": from the 10th to the 90th percentile of the search's start times,
the workers' time on rows over theirs), with the candidates per second there, and the times the
baseline and the finals held: the driver's capacity apart from the study's structure.

    python scripts/bench_sim.py --from-run RUN_DIR --workers W    the same figures from a stored run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def point(workers: int, run_s: float, candidates: int, sampler: str, out: Path,
          compile_s: float | None = None, compile_workers: int | None = None) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from cluster.api import RunPlan, configured, create_run, load_run, read_results, run_sweep

    # the measurement is of the engine on a fake fleet
    from cluster.engine.scheduling.simulate import Model, simulated_fleet

    per_node = 8
    compile_workers = compile_workers or workers + 2
    # A CPU for each measuring actor and each compile in flight, as on a GPU host with cores to spare.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": workers + compile_workers})
    for _ in range((workers + per_node - 1) // per_node):
        cluster.add_node(num_cpus=0, num_gpus=per_node)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        plan = load_run(REPO / "configs" / "demo.yaml")
        saxpy = tuple(t for t in plan.targets if t.name == "saxpy")
        plan = configured(RunPlan(plan.config, plan.file, saxpy), output_dir=str(out / f"runs-{workers}-{run_s}"),
                          targets=["targets/saxpy/target.yaml"], search={"sampler": sampler, "trials": candidates},
                          cluster={"compile_workers": compile_workers}, measure={"final_top_k": 1, "final_runs": 1},
                          profile={"candidates": "none"})
        config = plan.config
        run_dir = create_run(plan)
        modelled = Model(compile_s=run_s if compile_s is None else compile_s, run_s=run_s)
        fleet, compile_model = simulated_fleet(workers, modelled)
        started = time.time()
        cpu_before = _cpu_s()
        summary = run_sweep(plan, run_dir, fleet=fleet, compile=compile_model)
        driver_cpu_s = _cpu_s() - cpu_before
        rows = read_results(run_dir)
    finally:
        ray.shutdown()
        cluster.shutdown()
    search = rows[rows["phase"] == "search"]
    busy = float(rows["run_s"].fillna(0).sum()) / (workers * summary.ready_s)
    return {**structure(rows, workers), "workers": workers, "run_s": run_s, "compile_s": modelled.compile_s,
            "compile_workers": config.cluster.compile_workers, "sampler": sampler,
            "candidates": len(search),
            "rows": len(rows), "wall_s": round(time.time() - started, 2), "ready_s": round(summary.ready_s, 2),
            "busy": round(busy, 4), "candidates_per_s": round(len(search) / summary.ready_s, 2),
            "driver_ms_per_candidate": round(1000 * summary.bookkeeping_s / max(1, len(rows)), 3),
            "driver_cpu_ms_per_candidate": round(1000 * driver_cpu_s / max(1, len(rows)), 3)}


def structure(rows, workers: int) -> dict:
    """The study's structure in the rows' timestamps: how long the baseline and the finals held the
    sweep, and the workers' busy fraction and the rate in the middle of the search."""
    import pandas as pd

    def stamp(column: str) -> pd.Series:
        return pd.to_datetime(rows[column], utc=True).map(lambda t: t.timestamp())

    t0, t1 = stamp("started_at"), stamp("finished_at")
    phase = rows["phase"]
    first = float(t0.min())
    starts = t0[phase == "search"].sort_values()
    if len(starts) < 10:
        return {}
    lo, hi = float(starts.quantile(0.1)), float(starts.quantile(0.9))
    overlap = (t1.clip(upper=hi) - t0.clip(lower=lo)).clip(lower=0)
    return {"baseline_s": round(float(t1[phase == "baseline"].max()) - first, 2),
            "first_search_s": round(float(starts.iloc[0]) - first, 2),
            "finals_s": round(float(t1.max() - t0[phase == "final"].min()), 2) if (phase == "final").any() else None,
            "busy_mid_search": round(float(overlap.sum()) / (workers * (hi - lo)), 4),
            "rate_mid_search_per_s": round(float(((starts >= lo) & (starts <= hi)).sum()) / (hi - lo), 2)}


def _cpu_s() -> float:
    """CPU time of this process (the driver and Ray's threads in it), user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def table(results: list[dict]) -> str:
    lines = ["| simulated GPUs | modelled run, compile | sampler | candidates | busy | candidates/s | "
             "busy, mid-search | candidates/s, mid-search | baseline, first search, finals (s) | "
             "driver per candidate (wall) | driver CPU per candidate |", "|" + "---|" * 11]
    for r in results:
        mid = (f"{100 * r['busy_mid_search']:.1f}% | {r['rate_mid_search_per_s']:.1f} | "
               f"{r['baseline_s']:.1f}, {r['first_search_s']:.1f}, {_num(r.get('finals_s'))}"
               if "busy_mid_search" in r else "- | - | -")
        lines.append(f"| {r['workers']} | {r['run_s'] * 1000:.0f} ms, {r.get('compile_s', r['run_s']) * 1000:.0f} ms"
                     f" | {r['sampler']} | {r['candidates']} | "
                     f"{100 * r['busy']:.1f}% | {r['candidates_per_s']:.1f} | {mid} | "
                     f"{r['driver_ms_per_candidate']:.2f} ms | {r['driver_cpu_ms_per_candidate']:.2f} ms |")
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="8,16,32,64")
    parser.add_argument("--run-s", default="1.0,0.05")
    parser.add_argument("--candidates-per-worker", type=int, default=20)
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random"])
    parser.add_argument("--compile-s", type=float, help="the modelled compile (default: the run time)")
    parser.add_argument("--compile-workers", type=int, help="compiles in flight (default: workers + 2)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--point", help=argparse.SUPPRESS)
    parser.add_argument("--from-run", type=Path, help="no sweep: the structure figures of this stored run "
                        "(--workers: its number of workers)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_run:
        from cluster.api import read_results

        figures = structure(read_results(args.from_run), int(args.workers))
        (args.out / "structure.json").write_text(json.dumps(figures, indent=1) + "\n")
        print(json.dumps(figures))
        return
    if args.point:
        workers, run_s = args.point.split(":")
        result = point(int(workers), float(run_s), int(workers) * args.candidates_per_worker, args.sampler, args.out,
                       args.compile_s, args.compile_workers)
        print(json.dumps(result))
        return
    results = []
    for run_s in (float(s) for s in args.run_s.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            command = [sys.executable, __file__, "--point", f"{workers}:{run_s}", "--out", str(args.out),
                       "--candidates-per-worker", str(args.candidates_per_worker), "--sampler", args.sampler,
                       *(["--compile-s", str(args.compile_s)] if args.compile_s is not None else []),
                       *(["--compile-workers", str(args.compile_workers)] if args.compile_workers else [])]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                print(f"{workers} workers, {run_s} s: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            results.append(json.loads(lines[-1]))
            print(json.dumps(results[-1]), flush=True)
    (args.out / "sim.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "sim.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
