"""Scaling on the GPUs of one host (issue 9): the same sweep on 1, 2, 4 (, 8) GPUs, each in a fresh
process that sees only the first N cards (CUDA_VISIBLE_DEVICES) and starts its own local Ray.

    python scripts/bench_scaling.py CONFIG --counts 1,2,4 --trials 8 --out DIR [--cpu]

Per count: wall time, search candidates per minute, scaling efficiency against one GPU
((rate_N / rate_1) / N), the time until the run's final winner was first measured, whether that
winner is the one-GPU run's, each measuring worker's busy fraction (the time it spent running
candidates over the wall time), and the compile slots the driver used. ``--cpu`` scales CPU
measuring workers instead (for trying it on a machine without a GPU). DIR/scaling.json holds
every figure, DIR/scaling.md the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child(config: str, count: int, trials: int, out: Path, cpu: bool) -> dict:
    """One sweep with ``count`` measuring workers; runs in its own process."""
    import pandas as pd

    from cluster.config import RunPlan, load_run
    from cluster.engine.driver import Sweep
    from cluster.outputs.select import select_best
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir

    plan = load_run(config)
    update = {"output_dir": str(out / f"runs-{count}"),
              "search": plan.config.search.model_copy(update={"trials": trials}),
              "measure": plan.config.measure.model_copy(update={"final_top_k": 1, "final_runs": 2}),
              "profile": plan.config.profile.model_copy(update={"candidates": "none"})}
    if cpu:
        update["cluster"] = plan.config.cluster.model_copy(update={"cpu_workers": count})
    plan = RunPlan(plan.config.model_copy(update=update), plan.file, plan.targets)
    run_dir = RunDir.create(plan)
    started = time.time()
    summary = Sweep(plan, run_dir, log=lambda m: None).run(show_progress=False)
    wall = time.time() - started
    import ray

    compile_slots = plan.config.cluster.compile_workers or int(ray.cluster_resources().get("CPU", 1))
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    busy = {}
    for worker, group in rows[rows["worker_id"].notna()].groupby("worker_id"):
        busy[str(worker)] = float(group["run_s"].fillna(0).sum() + group["verify_s"].fillna(0).sum()) / wall
    winners = {}
    for best in select_best(rows):
        mine = rows[(rows["candidate_key"] == best.candidate_key) & rows["finished_at"].notna()]
        first = pd.Timestamp(mine["finished_at"].min()).timestamp() if len(mine) else None
        winners[best.target] = {"key": best.candidate_key, "speedup": best.speedup, "median": best.median,
                                "config": " ".join([*best.flag_argv, *best.defines]),
                                "found_after_s": first - started if first else None}
    return {"count": count, "wall_s": wall, "search_candidates": len(search),
            "rate_per_min": 60 * len(search) / wall, "busy": busy, "compile_slots": compile_slots,
            "winners": winners, "statuses": rows["status"].value_counts().to_dict(), "run_dir": str(run_dir.path),
            "rows": summary.evaluated}


def table(results: list[dict]) -> str:
    one = results[0]
    lines = ["| GPUs | wall (s) | candidates/min | efficiency vs 1 | same winners as 1 | winner found after (s, "
             "median over targets) | busy per worker | compile slots |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        efficiency = (r["rate_per_min"] / one["rate_per_min"]) / (r["count"] / one["count"])
        same = sum(r["winners"].get(t, {}).get("key") == w["key"] for t, w in one["winners"].items())
        found = sorted(w["found_after_s"] for w in r["winners"].values() if w["found_after_s"] is not None)
        median = found[len(found) // 2] if found else None
        busy = ", ".join(f"{v:.0%}" for _, v in sorted(r["busy"].items()))
        lines.append(f"| {r['count']} | {r['wall_s']:.0f} | {r['rate_per_min']:.1f} | {efficiency:.0%} | "
                     f"{same}/{len(one['winners'])} | {median:.0f} | {busy} | {r['compile_slots']} |"
                     if median is not None else f"| {r['count']} | {r['wall_s']:.0f} | {r['rate_per_min']:.1f} | "
                     f"{efficiency:.0%} | {same}/{len(one['winners'])} | - | {busy} | {r['compile_slots']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="scale CPU measuring workers (no GPU needed)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        result = child(args.config, args.child, args.trials, args.out, args.cpu)
        (args.out / f"count-{args.child}.json").write_text(json.dumps(result, indent=1, default=str))
        return
    results = []
    for count in [int(c) for c in args.counts.split(",") if c]:
        env = dict(os.environ)
        if not args.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count))
        env.pop("RAY_ADDRESS", None)
        print(f"[{time.strftime('%H:%M:%S')}] {count} workers", flush=True)
        done = subprocess.run([sys.executable, __file__, args.config, "--child", str(count), "--trials",
                               str(args.trials), "--out", str(args.out), *(["--cpu"] if args.cpu else [])],
                              env=env, check=False)
        path = args.out / f"count-{count}.json"
        if done.returncode != 0 or not path.exists():
            print(f"{count} workers: failed (exit {done.returncode})", flush=True)
            break
        results.append(json.loads(path.read_text()))
        print(f"  {results[-1]['wall_s']:.0f} s, {results[-1]['rate_per_min']:.1f} candidates/min", flush=True)
    if results:
        text = table(results)
        (args.out / "scaling.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "scaling.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
