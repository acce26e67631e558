"""Load test of the driver (issue 7): a sweep of many candidates on a trivial C target, recording
the driver's memory over time, candidates per second and its bookkeeping cost per candidate.

    python scripts/bench_load.py [--trials 10000] [--json OUT.json] [--output-dir D]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.api import log_to
from cluster.config import RunPlan, load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results
from cluster.store.rundir import RunDir

CONFIG = Path(__file__).resolve().parent / "load" / "load.yaml"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--json")
    parser.add_argument("--output-dir", default="runs")
    args = parser.parse_args()
    plan = load_run(CONFIG)
    search = plan.config.search.model_copy(update={"trials": args.trials})
    plan = RunPlan(plan.config.model_copy(update={"search": search, "output_dir": args.output_dir}),
                   plan.file, plan.targets)
    run_dir = RunDir.create(plan)
    samples: list[tuple[float, float, int]] = []  # (seconds, RSS MB, rows on disk)
    stop = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        while not stop.wait(5.0):
            rows = sum(1 for _ in run_dir.results.glob("*.parquet"))
            samples.append((time.monotonic() - start, rss_mb(), rows))

    threading.Thread(target=watch, daemon=True).start()
    with log_to(print):
        summary = Sweep(plan, run_dir).run(show_progress=False)
    stop.set()
    rows = read_results(run_dir.path)
    search_rows = rows[rows["phase"] == "search"]
    report = {
        "date": time.strftime("%Y-%m-%d"), "trials": args.trials, "run_dir": str(run_dir.path),
        "rows": len(rows), "search_rows": len(search_rows), "unique_keys": int(search_rows["candidate_key"].nunique()),
        "statuses": rows["status"].value_counts().to_dict(), "wall_s": summary.wall_s,
        "candidates_per_s": len(search_rows) / summary.wall_s,
        "bookkeeping_s": summary.bookkeeping_s,
        "bookkeeping_ms_per_candidate": 1000 * summary.bookkeeping_s / max(1, len(rows)),
        "rss_mb": [(round(t), round(m, 1), parts) for t, m, parts in samples],
        "rss_final_mb": rss_mb(),
    }
    text = json.dumps(report, indent=1, default=str)
    if args.json:
        Path(args.json).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
