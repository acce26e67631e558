"""Benchmark a sweep: wall time, each candidate's time split, and how busy the measuring
workers were. Writes a JSON summary and prints a markdown table.

    python scripts/bench_sweep.py configs/demo.yaml [--trials N] [--json OUT.json] [--output-dir D]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.api import configured, create_run, load_run, log_to, read_results, run_sweep, select_best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--trials", type=int)
    parser.add_argument("--json")
    parser.add_argument("--output-dir", default="runs")
    args = parser.parse_args()
    plan = configured(load_run(args.config), output_dir=args.output_dir,
                      **({"search": {"trials": args.trials}} if args.trials else {}))
    run = create_run(plan)
    start = time.monotonic()
    with log_to(print):
        summary = run_sweep(plan, run)
    wall = time.monotonic() - start
    rows = read_results(run)
    report = {"config": args.config, "run_dir": str(run), "wall_s": wall,
              "sweep_wall_s": summary.wall_s, "rows": len(rows), "host": platform.node(),
              "date": time.strftime("%Y-%m-%d"), "studies": []}
    for (target, device), group in rows.groupby(["target", "device_type"]):
        measured = group[group["run_s"].notna()]
        busy = float((measured["run_s"] + measured["verify_s"]).sum())
        kernel_ms = float(sum(sum(s) for s in measured["samples"] if s is not None))
        span = (group["finished_at"].max() - group["started_at"].min()).total_seconds()
        best = [b for b in select_best(group)]
        report["studies"].append({
            "target": target, "device": device, "candidates": len(group),
            "statuses": group["status"].value_counts().to_dict(),
            "median_compile_s": float(group["compile_s"].median()),
            "median_queue_s": float(measured["queue_s"].median()),
            "median_run_s": float(measured["run_s"].median()),
            "median_verify_s": float(measured["verify_s"].median()),
            "worker_busy_s": busy, "worker_busy_fraction_of_wall": busy / wall,
            "measured_span_s": span, "timed_region_s": kernel_ms / 1000 if group["unit"].iloc[0] == "ms" else None,
            "best": {"speedup": best[0].speedup, "median": best[0].median, "flags": best[0].flag_argv,
                     "params": best[0].params, "reason": best[0].reason} if best else None,
        })
    report["bookkeeping_s"] = summary.bookkeeping_s
    report["bookkeeping_ms_per_candidate"] = 1000 * summary.bookkeeping_s / max(1, len(rows))
    text = json.dumps(report, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
