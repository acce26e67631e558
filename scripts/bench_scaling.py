"""Scaling on the GPUs of one host (issues 9 and 13): the same sweep on 1, 2, 4 (, 8) GPUs, each in a
fresh process that sees only the first N cards (CUDA_VISIBLE_DEVICES) and starts its own local Ray.

    python scripts/bench_scaling.py CONFIG --counts 4,2,1 --trials 30 --out DIR
        [--time-budget 1:260,2:170,4:130] [--child-timeout-s 1:300,...] [--cpu]

Per count: wall time, search candidates per minute (over the sweep's wall time, and over the search
alone: from the first search candidate's start to the last one's end), scaling efficiency against
the smallest count ((rate_N / rate_1) / N), the time to the first search candidate, the time until
each target's final winner was first measured, whether the winners are the smallest count's, each
measuring worker's busy fraction (its rows' run and verify time over the time from the first job's
start to the last job's end: "after Ray is up") and in mid-search (bench_sim.py's ``structure``: the
baselines ahead and the finals' tail left out), and per row the medians of the steps the rows
record (queued for a worker, run, verify, compile, a row's time on its worker). ``--time-budget``
gives each count a time budget (the config's ``search.time_budget_s``: the sweep's wall clock
since issue 25; the search stops in time for the finals), so that a slow count cannot outrun the
command; ``--child-timeout-s``
kills a count's process past it, and its figures are then taken from the rows it had written.
``--cpu`` scales CPU measuring workers instead (for trying it on a machine without a GPU).
``--cpus-per-gpu K`` pins each count's process, its Ray and its compiles to K cores per GPU (count N:
N * K cores), so that every count has the same CPUs per GPU; ``--concurrent`` runs the counts at the
same time, each on cards and cores of its own (counts 1,2 on a four-GPU host: card 0, cards 1-2;
K defaults to the host's cores over its GPUs), so that a lease of fixed length holds more of them.
``--report DIR...`` writes the table of counts measured before (their count-N.json) without running.
DIR/scaling.json holds every figure, DIR/scaling.md the table, DIR/count-N.log each sweep's log.
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


def per_count(text: str) -> dict[int, float]:
    """``"1:200,2:110"`` -> {1: 200.0, 2: 110.0}."""
    out = {}
    for item in text.split(","):
        if item.strip():
            count, value = item.split(":")
            out[int(count)] = float(value)
    return out


def parse_cores(text: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]."""
    cores: list[int] = []
    for item in text.split(","):
        if item.strip():
            first, _, last = item.partition("-")
            cores += range(int(first), int(last or first) + 1)
    return cores


def placement(counts: list[int], concurrent: bool, cpus_per_gpu: int) -> dict[int, tuple[list[int], str]]:
    """Per count: its cards (or CPU workers' slots) and its cores (``"a-b"``, or "" for all). Counts
    run one after the other use the first cards; concurrent ones, cards and cores of their own."""
    out, first = {}, 0
    for count in counts:
        cards = list(range(first, first + count))
        cores = f"{first * cpus_per_gpu}-{(first + count) * cpus_per_gpu - 1}" if cpus_per_gpu else ""
        out[count] = (cards, cores)
        if concurrent:
            first += count
    return out


def child(config: str, count: int, trials: int, out: Path, cpu: bool, search_s: float | None,
          cores: str = "") -> dict:
    """One sweep with ``count`` measuring workers; runs in its own process (on ``cores``, where given:
    Ray's processes and the compiles inherit the affinity, and the compile slots are as many)."""
    from cluster.api import configured, create_run, load_run, log_to, run_sweep

    pinned = parse_cores(cores)
    if pinned:
        os.sched_setaffinity(0, pinned)
    search = {"trials": trials, **({"time_budget_s": search_s} if search_s else {})}
    cluster = {**({"cpu_workers": count} if cpu else {}), **({"compile_workers": len(pinned)} if pinned else {})}
    plan = configured(load_run(config), output_dir=str(out / f"runs-{count}"), search=search,
                      measure={"final_top_k": 1, "final_runs": 2}, profile={"candidates": "none"},
                      **({"cluster": cluster} if cluster else {}))
    run_dir = create_run(plan)
    started = time.time()
    (out / f"count-{count}.started.json").write_text(json.dumps({"run_dir": str(run_dir), "started": started}))
    log_file = (out / f"count-{count}.log").open("a")

    def log(message: str) -> None:
        log_file.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
        log_file.flush()

    try:
        with log_to(log):
            summary = run_sweep(plan, run_dir)
    except Exception as exc:
        log(f"the sweep failed: {type(exc).__name__}: {exc}")
        raise
    wall = time.time() - started
    import ray

    compile_slots = plan.config.cluster.compile_workers or int(ray.cluster_resources().get("CPU", 1))
    return figures(run_dir, count, started, wall, compile_slots, rows_written=summary.evaluated)


def figures(run_dir: Path, count: int, started: float, wall: float, compile_slots: int | None,
            rows_written: int | None = None, finished: bool = True) -> dict:
    """Every figure of one count, from its run directory's rows (also for a count that was killed)."""
    import pandas as pd

    from cluster.api import read_results, select_best

    rows = read_results(run_dir)
    stamp = {c: pd.to_datetime(rows[c], utc=True).map(lambda t: t.timestamp() if not pd.isna(t) else None)
             for c in ("started_at", "finished_at")}
    rows = rows.assign(t_start=stamp["started_at"], t_end=stamp["finished_at"])
    search = rows[rows["phase"] == "search"]
    timed = rows[rows["t_start"].notna() & rows["t_end"].notna()]
    busy = {}
    if len(timed):
        first, last = timed["t_start"].min(), timed["t_end"].max()
        for worker, group in timed[timed["worker_id"].notna()].groupby("worker_id"):
            work = float(group["run_s"].fillna(0).sum() + group["verify_s"].fillna(0).sum())
            busy[str(worker)] = work / max(last - first, 1e-9)
    searched = search[search["t_start"].notna() & search["t_end"].notna()]
    search_span = float(searched["t_end"].max() - searched["t_start"].min()) if len(searched) else None
    winners = {}
    for best in select_best(rows) if finished else []:
        mine = rows[(rows["candidate_key"] == best.candidate_key) & rows["t_end"].notna()]
        first_seen = mine["t_end"].min() if len(mine) else None
        winners[best.target] = {"key": best.candidate_key, "speedup": best.speedup, "median": best.median,
                                "config": " ".join([*best.flag_argv, *best.defines]),
                                "found_after_s": first_seen - started if first_seen else None}

    def median(series: pd.Series) -> float | None:
        series = series.dropna()
        return float(series.median()) if len(series) else None

    from scripts.bench_sim import structure

    steps = {"queue_s": median(search["queue_s"]), "run_s": median(search["run_s"]),
             "verify_s": median(search["verify_s"]), "compile_s": median(search["compile_s"]),
             "row_on_worker_s": median(searched["t_end"] - searched["t_start"])}
    return {"count": count, "wall_s": wall, "finished": finished, "search_candidates": len(search),
            "rate_per_min": 60 * len(search) / wall,
            "search_rate_per_min": 60 * len(searched) / search_span if search_span else None,
            "first_search_after_s": float(searched["t_end"].min() - started) if len(searched) else None,
            "busy": busy, "busy_mid_search": structure(rows, count).get("busy_mid_search"),
            "steps_median": steps, "compile_slots": compile_slots, "winners": winners,
            "statuses": rows["status"].value_counts().to_dict(), "run_dir": str(run_dir),
            "rows": rows_written if rows_written is not None else len(rows)}


def table(results: list[dict]) -> str:
    base = min(results, key=lambda r: r["count"])
    lines = ["| GPUs | wall (s) | search candidates | candidates/min (wall) | candidates/min (search) | "
             "efficiency vs " + str(base["count"]) + " (wall, search) | "
             "same winners (candidate; params; speedups within) | first search candidate (s) | "
             "winner found after (s, median) | busy per worker | busy, mid-search | "
             "per row: queued, run, verify, on worker (s) |", "|" + "---|" * 12]
    for r in sorted(results, key=lambda r: r["count"]):
        scale = r["count"] / base["count"]
        eff = (r["rate_per_min"] / base["rate_per_min"]) / scale if base["rate_per_min"] else None
        search_eff = ((r["search_rate_per_min"] / base["search_rate_per_min"]) / scale
                      if r["search_rate_per_min"] and base["search_rate_per_min"] else None)
        keys, params, spread = agreement(base["winners"], r["winners"])
        same = f"{keys}/{len(base['winners'])}; {params}/{len(base['winners'])}; " + _num(spread, "{:.1%}")
        found = sorted(w["found_after_s"] for w in r["winners"].values() if w["found_after_s"] is not None)
        busy = ", ".join(f"{v:.0%}" for _, v in sorted(r["busy"].items()))
        steps = r["steps_median"]
        cells = [str(r["count"]) + ("" if r["finished"] else " (killed)"), f"{r['wall_s']:.0f}",
                 str(r["search_candidates"]), f"{r['rate_per_min']:.1f}", _num(r["search_rate_per_min"], "{:.1f}"),
                 f"{_num(eff, '{:.0%}')}, {_num(search_eff, '{:.0%}')}", same,
                 _num(r["first_search_after_s"], "{:.0f}"), _num(found[len(found) // 2] if found else None, "{:.0f}"),
                 busy, _num(r.get("busy_mid_search"), "{:.0%}"),
                 ", ".join(_num(steps[k], "{:.2f}") for k in ("queue_s", "run_s", "verify_s", "row_on_worker_s"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def agreement(base: dict, other: dict) -> tuple[int, int, float | None]:
    """How far two counts' winners agree, per target of ``base``: the same candidate (flags and params);
    the same params (``-D`` defines: the same code, where only flags that did not matter differ); and
    the largest relative difference of their speedups (None: no target in common)."""
    keys = params = 0
    spread = []
    for target, mine in base.items():
        theirs = other.get(target)
        if not theirs:
            continue
        keys += theirs["key"] == mine["key"]
        params += _defines(theirs["config"]) == _defines(mine["config"])
        if mine.get("speedup") and theirs.get("speedup"):
            spread.append(abs(theirs["speedup"] / mine["speedup"] - 1))
    return keys, params, max(spread) if spread else None


def _defines(config: str) -> list[str]:
    return sorted(t for t in config.split() if t.startswith("-D"))


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def start_count(args: argparse.Namespace, count: int, cards: list[int], cores: str) -> subprocess.Popen:
    env = dict(os.environ)
    if not args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in cards)
    env.pop("RAY_ADDRESS", None)
    print(f"[{time.strftime('%H:%M:%S')}] {count} workers" + (f" on cards {cards}" if not args.cpu else "")
          + (f", cores {cores}" if cores else ""), flush=True)
    search_s = per_count(args.search_s).get(count)
    argv = [sys.executable, __file__, args.config, "--child", str(count), "--trials", str(args.trials),
            "--out", str(args.out), *(["--cpu"] if args.cpu else []), *(["--cores", cores] if cores else []),
            *(["--time-budget", f"{count}:{search_s}"] if search_s else [])]
    return subprocess.Popen(argv, env=env, start_new_session=True)


def finish_count(args: argparse.Namespace, count: int, proc: subprocess.Popen, deadline: float | None) -> dict | None:
    from cluster.sandbox.sandbox import stop_command

    killed = False
    try:
        proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        killed = True
        print(f"  {count} workers: past its time limit, stopped; figures from the rows written", flush=True)
        stop_command(proc, 20)
    path = args.out / f"count-{count}.json"
    if proc.returncode == 0 and path.exists():
        return json.loads(path.read_text())
    started_file = args.out / f"count-{count}.started.json"
    if not killed or not started_file.exists():
        print(f"  {count} workers: failed (exit {proc.returncode}; its log: {args.out}/count-{count}.log)", flush=True)
        return None
    info = json.loads(started_file.read_text())
    try:
        result = figures(Path(info["run_dir"]), count, info["started"], time.time() - info["started"], None,
                         finished=False)
    except Exception as exc:  # no rows yet, or unreadable: the count is lost, the others stand
        print(f"  {count} workers: no figures ({type(exc).__name__}: {exc})", flush=True)
        return None
    if not result["search_candidates"]:
        print(f"  {count} workers: stopped before its first search candidate", flush=True)
        return None
    path.write_text(json.dumps(result, indent=1, default=str))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--time-budget", dest="search_s", default="",
                        help="each count's time budget (the sweep's wall clock), e.g. 1:260,2:170,4:130")
    parser.add_argument("--child-timeout-s", default="", help="kill a count's process past this, e.g. 1:300")
    parser.add_argument("--cpu", action="store_true", help="scale CPU measuring workers (no GPU needed)")
    parser.add_argument("--cpus-per-gpu", type=int, default=None,
                        help="pin each count to this many cores per GPU (default: all cores; with --concurrent, "
                             "the host's cores over its GPUs)")
    parser.add_argument("--concurrent", action="store_true", help="run the counts at the same time, on cards "
                        "and cores of their own")
    parser.add_argument("--report", type=Path, nargs="*", help="no runs: the table of the count-N.json in these "
                        "folders (and --out's)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cores", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child is not None:
        result = child(args.config, args.child, args.trials, args.out, args.cpu,
                       per_count(args.search_s).get(args.child), args.cores)
        (args.out / f"count-{args.child}.json").write_text(json.dumps(result, indent=1, default=str))
        return
    if args.report is not None:
        results = {}
        for folder in [*args.report, args.out]:
            for path in sorted(folder.glob("count-*.json")):
                if path.stem.removeprefix("count-").isdigit():
                    result = json.loads(path.read_text())
                    results[result["count"]] = result
        if not results:
            sys.exit(f"bench_scaling: --report: no count-N.json in {[str(f) for f in [*args.report, args.out]]}")
        write_results(args.out, list(results.values()))
        return
    from cluster.platform.devices import visible_gpu_count

    counts = [int(c) for c in args.counts.split(",") if c]
    gpus = sum(counts) if args.cpu else visible_gpu_count()
    cpus_per_gpu = args.cpus_per_gpu
    if cpus_per_gpu is None and args.concurrent:
        cpus_per_gpu = len(os.sched_getaffinity(0)) // max(1, gpus)
    if args.concurrent and sum(counts) > gpus:
        sys.exit(f"bench_scaling: --concurrent: counts {counts} need {sum(counts)} GPUs, {gpus} visible")
    where = placement(counts, args.concurrent, cpus_per_gpu or 0)
    timeouts = per_count(args.child_timeout_s)
    results = []

    def record(count: int, result: dict | None) -> None:
        if result is None:
            return
        results.append(result)
        print(f"  {count} workers: {result['wall_s']:.0f} s, {result['search_candidates']} search candidates, "
              f"{result['rate_per_min']:.1f}/min", flush=True)
        (args.out / "scaling.json").write_text(json.dumps(results, indent=1, default=str))  # after every count

    if args.concurrent:
        started = {c: (start_count(args, c, *where[c]), time.time()) for c in counts}
        for count, (proc, t0) in started.items():
            timeout = timeouts.get(count)
            record(count, finish_count(args, count, proc, t0 + timeout if timeout else None))
    else:
        for count in counts:
            timeout = timeouts.get(count)
            proc = start_count(args, count, *where[count])
            record(count, finish_count(args, count, proc, time.time() + timeout if timeout else None))
    write_results(args.out, results)


def write_results(out: Path, results: list[dict]) -> None:
    if results:
        text = table(results)
        (out / "scaling.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
