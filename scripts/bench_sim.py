"""Where the driver becomes the bottleneck: the real engine on a simulated fleet (issue 13).

    python scripts/bench_sim.py --workers 8,16,32,64 --run-s 1.0,0.05 --candidates-per-worker 20 --out DIR

Each point starts Ray's multi-node test cluster (``ray.cluster_utils.Cluster``) with ``W`` fake GPU
resources over nodes of 8, ``cluster.engine.simulate``'s fake workers (a modelled run time per
candidate) and fake compiles (the same modelled time), and sweeps the saxpy target's space with
the real driver, scheduler, Optuna study (``--sampler``) and Parquet writer. It reports the
workers' busy fraction (their modelled run time over their wall time once the fleet is up),
candidates per second, and the driver's own time per candidate (asking Optuna, submitting,
recording, telling): as wall time outside its waits (on a host with fewer cores than the simulated
fleet's processes, that includes time the driver waited for a core) and as the driver process's
CPU time (its thread and Ray's threads in it) over the sweep, per row. Every point runs in a
process of its own. DIR/sim.json holds the figures, DIR/sim.md the table.
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


def point(workers: int, run_s: float, candidates: int, sampler: str, out: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from cluster.config import RunPlan, load_run
    from cluster.engine.driver import Sweep
    from cluster.engine.simulate import Model, simulated_fleet
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir

    per_node = 8
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": workers + 2})
    for _ in range((workers + per_node - 1) // per_node):
        cluster.add_node(num_cpus=0, num_gpus=per_node)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        plan = load_run(REPO / "configs" / "demo.yaml")
        saxpy = tuple(t for t in plan.targets if t.name == "saxpy")
        config = plan.config.model_copy(update={
            "output_dir": str(out / f"runs-{workers}-{run_s}"), "targets": ["targets/saxpy/target.yaml"],
            "search": plan.config.search.model_copy(update={"sampler": sampler, "trials": candidates}),
            "cluster": plan.config.cluster.model_copy(update={"compile_workers": workers + 2}),
            "measure": plan.config.measure.model_copy(update={"final_top_k": 1, "final_runs": 1}),
            "profile": plan.config.profile.model_copy(update={"candidates": "none"})})
        plan = RunPlan(config, plan.file, saxpy)
        run_dir = RunDir.create(plan)
        fleet, compile_model = simulated_fleet(workers, Model(compile_s=run_s, run_s=run_s))
        started = time.time()
        cpu_before = _cpu_s()
        summary = Sweep(plan, run_dir, log=lambda m: None, fleet=fleet, compile=compile_model).run(
            show_progress=False)
        driver_cpu_s = _cpu_s() - cpu_before
        rows = read_results(run_dir.path)
    finally:
        ray.shutdown()
        cluster.shutdown()
    search = rows[rows["phase"] == "search"]
    busy = float(rows["run_s"].fillna(0).sum()) / (workers * summary.ready_s)
    return {"workers": workers, "run_s": run_s, "sampler": sampler, "candidates": len(search),
            "rows": len(rows), "wall_s": round(time.time() - started, 2), "ready_s": round(summary.ready_s, 2),
            "busy": round(busy, 4), "candidates_per_s": round(len(search) / summary.ready_s, 2),
            "driver_ms_per_candidate": round(1000 * summary.bookkeeping_s / max(1, len(rows)), 3),
            "driver_cpu_ms_per_candidate": round(1000 * driver_cpu_s / max(1, len(rows)), 3)}


def _cpu_s() -> float:
    """CPU time of this process (the driver and Ray's threads in it), user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def table(results: list[dict]) -> str:
    lines = ["| simulated GPUs | modelled run and compile | sampler | candidates | busy | candidates/s | "
             "driver per candidate (wall) | driver CPU per candidate |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workers']} | {r['run_s'] * 1000:.0f} ms | {r['sampler']} | {r['candidates']} | "
                     f"{100 * r['busy']:.1f}% | {r['candidates_per_s']:.1f} | {r['driver_ms_per_candidate']:.2f} ms | "
                     f"{r['driver_cpu_ms_per_candidate']:.2f} ms |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="8,16,32,64")
    parser.add_argument("--run-s", default="1.0,0.05")
    parser.add_argument("--candidates-per-worker", type=int, default=20)
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--point", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.point:
        workers, run_s = args.point.split(":")
        result = point(int(workers), float(run_s), int(workers) * args.candidates_per_worker, args.sampler, args.out)
        print(json.dumps(result))
        return
    results = []
    for run_s in (float(s) for s in args.run_s.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            command = [sys.executable, __file__, "--point", f"{workers}:{run_s}", "--out", str(args.out),
                       "--candidates-per-worker", str(args.candidates_per_worker), "--sampler", args.sampler]
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
