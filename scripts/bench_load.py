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

from cluster.api import configured, create_run, load_run, log_to, read_results, run_sweep

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
    plan = configured(load_run(CONFIG), search={"trials": args.trials}, output_dir=args.output_dir)
    run = create_run(plan)
    samples: list[tuple[float, float, int]] = []  # (seconds, RSS MB, rows on disk)
    stop = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        while not stop.wait(5.0):
            rows = sum(1 for _ in (run / "results").glob("*.parquet"))  # the run's results table (README)
            samples.append((time.monotonic() - start, rss_mb(), rows))

    threading.Thread(target=watch, daemon=True).start()
    with log_to(print):
        summary = run_sweep(plan, run)
    stop.set()
    rows = read_results(run)
    search_rows = rows[rows["phase"] == "search"]
    report = {
        "date": time.strftime("%Y-%m-%d"), "trials": args.trials, "run_dir": str(run),
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
