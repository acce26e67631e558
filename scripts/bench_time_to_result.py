"""Time to result on the user's path (issue 25): `warpfleet sweep CONFIG --time-budget S`, with a
plain config a user writes (its targets and `agents: {enabled: true}`, nothing else), run as a user
runs it (a subprocess, its wall clock from the command's start), then read back from the run's rows.

    python scripts/bench_time_to_result.py --out DIR --config configs/unseen.yaml --budget 600
    python scripts/bench_time_to_result.py --out DIR --config configs/public.yaml --budget 600 --no-sanitize-run
    python scripts/bench_time_to_result.py --report DIR/RUN ...     # the table of runs already made
    python scripts/bench_time_to_result.py --out DIR --config C --budget 300 --agents off   # the pair's other half
    python scripts/bench_time_to_result.py --out DIR --pair RUN_OFF RUN_ON   # per program: both winners and searches

The config given is reduced to its name and targets (the targets' files as they are), and
`agents: {enabled: true}` is added: every other setting is warpfleet's default, as a user who
turns the agents on gets it. `--no-sanitize-run` copies the config's folder and drops each target's
`verify.sanitize_run` (the smaller problem compute-sanitizer gets): a user's program has none.
Nothing here adds a setting that hides a cost.

Per study, from the rows and the jobs table: when its baseline ended and its first search candidate
started (seconds from the command's start), rows per phase, whether it reached a re-measured winner
(select_best, finals on fresh seeds), the winner's speedup against the best verified speedup the run
measured (a variant's candidates count once its expensive checks passed; a 10x candidate once its
review passed). Per worker: the share of the command's wall clock it spent on jobs, checks included.
Writes DIR/ttr-<run>.json and DIR/ttr-<run>.md, and prints the table.

`--stacks` also samples the sweep's main thread every 50 ms (scripts/driver_stacks, a
sitecustomize that only a `cluster.cli sweep` process runs) into DIR/stacks/, and adds where the
driver's loop spent its time: waiting for its workers (``poll``), writing Parquet parts, the Optuna
journal, the rest; and its longest stretch away from its workers. The sampler costs the loop a
stack walk every 50 ms: compare runs made with it only with each other.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cluster.api import read_results, read_table, select_best, verified  # noqa: E402
from cluster.core.encodings import speedup  # noqa: E402

if TYPE_CHECKING:
    from cluster.api import Verified


def plain_config(config: Path, work: Path, no_sanitize_run: bool, agents: bool = True) -> Path:
    """The user's config: the given one's name and targets, the agents on (or off). With ``no_sanitize_run``
    the config's folder is copied (links kept) and each target's verify.sanitize_run dropped."""
    spec = yaml.safe_load(config.read_text())
    base = config.parent
    if no_sanitize_run:
        copy = work / "configs"
        shutil.copytree(base, copy, symlinks=True, dirs_exist_ok=True)
        for target in spec["targets"]:
            path = copy / target
            data = yaml.safe_load(path.read_text())
            if (data.get("verify") or {}).pop("sanitize_run", None) is not None:
                path.write_text(yaml.safe_dump(data, sort_keys=False))
        base = copy
    work.mkdir(parents=True, exist_ok=True)
    side = "agents" if agents else "flags"
    out = work / f"ttr-{spec['name']}-{side}.yaml"
    targets = [os.path.abspath(base / target) for target in spec["targets"]]
    out.write_text(yaml.safe_dump({"name": f"{spec['name']}-{side}", "targets": targets,
                                   "output_dir": str(work / "runs"), "agents": {"enabled": agents}}, sort_keys=False))
    return out


def run_sweep(config: Path, budget: float, log: Path, stacks: Path | None = None) -> tuple[Path, float, int]:
    """`warpfleet sweep CONFIG --time-budget S --no-progress`: the run directory, the command's wall
    clock and its exit status. ``stacks``: a folder for the main thread's samples (``driver_time``)."""
    command = [sys.executable, "-m", "cluster.cli", "sweep", str(config), "--time-budget", str(budget),
               "--no-progress"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if stacks is not None:
        path = os.pathsep.join(p for p in (str(REPO / "scripts" / "driver_stacks"), env.get("PYTHONPATH")) if p)
        env.update(PYTHONPATH=path, WF_STACKS_DIR=str(stacks))
    started = time.time()
    with log.open("w") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    wall = time.time() - started
    run = next(line.split(": ", 1)[1].strip() for line in log.read_text().splitlines()
               if line.startswith("run directory: "))
    (Path(run) / "bench.json").write_text(json.dumps({"command": command, "started": started, "wall_s": wall,
                                                       "exit": done.returncode, "budget_s": budget,
                                                       "stacks": str(stacks) if stacks else None}))
    return Path(run), wall, done.returncode


# Where the driver's main thread was: the first of these (file, function; "" for any) whose frame a
# sample's stack shows, else "other".
WHERE = (("poll", ("scheduler.py", "poll")), ("parquet parts", ("parts.py", "")),
         ("parquet parts", ("results.py", "flush")), ("optuna journal", ("journal.py", "")))


def driver_time(stacks: Path) -> dict[str, float]:
    """From the main thread's samples (scripts/driver_stacks): seconds by where it was (``WHERE``,
    else "other"), and the longest run of samples away from ``poll`` (the loop not looking at its
    workers, from its first poll on). Each sample stands for the time since the one before (a
    sampler held up counts)."""
    seconds: dict[str, float] = {}
    longest = away = 0.0
    looping = False  # from the loop's first poll on (not Ray's start, the imports)
    for path in sorted(stacks.glob("stacks-*.txt")):
        for line in path.read_text().splitlines():
            kind, _, gap, stack = [*line.split(" ", 3), "", "", ""][:4]
            if kind != "M":
                continue
            frames = [f.split(":") for f in stack.split(" <- ")]
            where = next((name for name, (file, function) in WHERE
                          if any(f[0] == file and (not function or f[-1] == function) for f in frames)), "other")
            seconds[where] = seconds.get(where, 0.0) + float(gap)
            looping = looping or where == "poll"
            away = 0.0 if where == "poll" else away + float(gap)
            longest = max(longest, away if looping else 0.0)
    return {**{k: round(v, 1) for k, v in sorted(seconds.items())}, "longest_away_from_poll": round(longest, 1)}


def verified_best(group: pd.DataFrame, trust: Verified) -> float | None:
    """The best speedup the run measured on a candidate it trusts (the winner's selection aside)."""
    base = group[(group["phase"] == "baseline") & (group["status"] == "ok")]
    if base.empty:
        return None
    baseline = base.iloc[0]
    best = None
    for _, row in group[(group["status"] == "ok") & group["median"].notna()].iterrows():
        ratio = speedup(float(row["median"]), float(baseline["median"]), str(row["goal"]))
        if ratio is not None and trust.trusted(row, baseline, ratio) and (best is None or ratio > best):
            best = ratio
    return best


def busy(jobs, started: float, ended: float) -> dict[str, float]:
    """Per worker, the share of [started, ended] it spent on jobs (their union: a worker runs one at a time)."""
    out = {}
    for worker, group in jobs[jobs["worker_id"].fillna("") != ""].groupby("worker_id"):
        spans = sorted((max(started, s.timestamp()), min(ended, e.timestamp()))
                       for s, e in zip(group["started_at"], group["finished_at"], strict=True)
                       if not pd.isna(s) and not pd.isna(e))
        total, reach = 0.0, started
        for a, b in spans:
            a = max(a, reach)
            if b > a:
                total, reach = total + b - a, b
        out[str(worker)] = total / max(ended - started, 1e-9)
    return out


def report(run: Path) -> dict:
    meta = json.loads((run / "bench.json").read_text()) if (run / "bench.json").exists() else {}
    rows = read_results(run)
    jobs = read_table(run, "jobs")
    started = meta.get("started") or rows["started_at"].min().timestamp()
    ended = started + meta["wall_s"] if meta.get("wall_s") else rows["finished_at"].max().timestamp()
    trust = verified(run)
    winners = {(b.target, b.device_type): b for b in select_best(rows)}
    studies = []
    for (target, device), group in rows.groupby(["target", "device_type"], sort=True):
        base = group[group["phase"] == "baseline"]
        search = group[group["phase"] == "search"]
        winner = winners.get((target, device))
        final = group[(group["phase"] == "final") & (group["status"] == "ok")]
        remeasured = winner is not None and winner.candidate_key in set(final["candidate_key"])
        best = verified_best(group, trust)
        base_end = base["finished_at"].max().timestamp() - started if len(base) else None
        first = search["started_at"].min().timestamp() - started if len(search) else None
        studies.append({
            "target": target, "device": device, "baseline_end_s": base_end, "first_search_s": first,
            "first_after_baseline_s": first - base_end if first is not None and base_end is not None else None,
            "search": len(search), "verify": int((group["phase"] == "verify").sum()), "finals": len(final),
            "winner": winner.speedup if winner is not None else None, "remeasured": remeasured,
            "best_verified": best, "share": winner.speedup / best if winner is not None and best else None,
            "winner_source": "variant" if winner is not None and winner.is_variant else "flags/params"})
    kinds = jobs.groupby("kind")["service_s"].sum().round(1).to_dict() if len(jobs) else {}
    stacks = meta.get("stacks")
    searched = jobs[jobs["kind"] == "search"]["started_at"].dropna() if len(jobs) else []
    done = jobs["finished_at"].dropna() if len(jobs) else []
    return {"run": run.name, "budget_s": meta.get("budget_s"), "wall_s": round(ended - started, 1),
            "exit": meta.get("exit"), "busy": busy(jobs, started, ended) if len(jobs) else {},
            # where the plan's reserve went: the search's last start and the last job's end
            "search_closed_s": round(searched.max().timestamp() - started, 1) if len(searched) else None,
            "last_job_s": round(done.max().timestamp() - started, 1) if len(done) else None,
            "worker_s_by_kind": kinds, "studies": studies,
            "driver_s": driver_time(Path(stacks)) if stacks and Path(stacks).is_dir() else None}


def markdown(result: dict) -> str:
    def f(x, fmt="{:.0f}"):
        return "-" if x is None else fmt.format(x)

    lines = [f"### {result['run']}: budget {f(result['budget_s'])} s, wall {f(result['wall_s'])} s, "
             f"exit {result['exit']}", "",
             "| target | baseline end | first search | after baseline | search | verify | finals | winner | "
             "re-measured | best verified | share |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in result["studies"]:
        lines.append(f"| {s['target']} | {f(s['baseline_end_s'])} s | {f(s['first_search_s'])} s | "
                     f"{f(s['first_after_baseline_s'])} s | {s['search']} | {s['verify']} | {s['finals']} | "
                     f"{f(s['winner'], '{:.2f}x')} | {'yes' if s['remeasured'] else 'no'} | "
                     f"{f(s['best_verified'], '{:.2f}x')} | {f(s['share'], '{:.0%}')} |")
    lines += ["", "workers busy: " + ", ".join(f"{w} {b:.0%}" for w, b in result["busy"].items()),
              "worker seconds by job kind: " + ", ".join(f"{k} {v}" for k, v in result["worker_s_by_kind"].items()),
              ""]
    if result.get("driver_s"):
        lines[-1:] = ["driver's main thread, seconds: " + ", ".join(f"{k} {v}" for k, v in result["driver_s"].items()),
                      ""]
    return "\n".join(lines)


def pair(off: dict, on: dict) -> str:
    """The agents' pair: the same plain config and budget on one GPU, agents off and on; per program
    both winners, their ratio, both search counts, and worker-seconds by job kind."""
    def f(x, fmt="{:.2f}x"):
        return "-" if x is None else fmt.format(x)

    by_off = {s["target"]: s for s in off["studies"]}
    lines = [f"### pair: {off['run']} (agents off) / {on['run']} (agents on), budget {off['budget_s']} s", "",
             "| target | winner off | winner on | on / off | search off | search on | verify on |",
             "|---|---|---|---|---|---|---|"]
    ratios, gm_off, gm_on, shares = [], [], [], []
    for s_on in on["studies"]:
        s_off = by_off.get(s_on["target"], {})
        w_off, w_on = s_off.get("winner"), s_on["winner"]
        if s_off.get("search"):  # the agents' variants' admission runs are their first search points
            shares.append((s_on["search"] + s_on["verify"]) / s_off["search"])
        ratio = w_on / w_off if w_on and w_off else None
        if ratio is not None:
            ratios.append(ratio)
            gm_off.append(math.log(w_off))
            gm_on.append(math.log(w_on))
        lines.append(f"| {s_on['target']} | {f(w_off)} | {f(w_on)} | {f(ratio, '{:.3f}')} | "
                     f"{s_off.get('search', '-')} | {s_on['search']} | {s_on['verify']} |")
    if ratios:
        lines += ["", f"programs with on/off >= 0.98: {sum(r >= 0.98 for r in ratios)} of {len(ratios)}; "
                      f"geometric mean of the winners: off {math.exp(sum(gm_off) / len(gm_off)):.3f}x, "
                      f"on {math.exp(sum(gm_on) / len(gm_on)):.3f}x"]
    if shares:
        half = sum(r >= 0.5 for r in shares)
        lines.append(f"search candidates on (with the variants' admission runs) over off's, per program: "
                     f"{min(shares):.2f} at the least ({half} of {len(shares)} at half or more)")
    for name, side in (("off", off), ("on", on)):
        if side.get("search_closed_s") is not None and side.get("last_job_s") is not None:
            lines.append(f"agents {name}: the search's last start at {side['search_closed_s']:.0f} s, the last "
                         f"job's end at {side['last_job_s']:.0f} s, of a budget of {side['budget_s']:.0f} s")
        kinds = side["worker_s_by_kind"]
        total = sum(kinds.values()) or 1.0
        lines.append(f"worker seconds by kind, agents {name}: " + ", ".join(
            f"{k} {v} ({v / total:.0%})" for k, v in kinds.items())
            + f"; search and admissions {(kinds.get('search', 0) + kinds.get('verify', 0)) / total:.0%}")
    return "\n".join([*lines, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--budget", type=float, default=600.0)
    parser.add_argument("--no-sanitize-run", action="store_true")
    parser.add_argument("--stacks", action="store_true", help="sample the driver's main thread (scripts/driver_stacks)")
    parser.add_argument("--report", type=Path, nargs="*", help="runs made before: their tables only")
    parser.add_argument("--agents", choices=("on", "off"), default="on", help="the config's agents (default on)")
    parser.add_argument("--pair", type=Path, nargs=2, metavar=("RUN_OFF", "RUN_ON"),
                        help="two runs of one config and budget, agents off and on: the pair's table")
    args = parser.parse_args()
    if args.pair:
        args.out.mkdir(parents=True, exist_ok=True)
        text = pair(report(args.pair[0]), report(args.pair[1]))
        (args.out / f"pair-{args.pair[1].name}.md").write_text(text)
        print(text, flush=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    runs = list(args.report or [])
    if args.config is not None:
        work = args.out / f"work-{args.config.stem}-{args.agents}"
        config = plain_config(args.config.resolve(), work, args.no_sanitize_run, args.agents == "on")
        stacks = (args.out / "stacks").resolve() if args.stacks else None
        run, wall, code = run_sweep(config, args.budget, args.out / f"sweep-{args.config.stem}.log", stacks)
        print(f"{run}: {wall:.0f} s, exit {code}", flush=True)
        runs.append(run)
    for run in runs:
        result = report(run)
        (args.out / f"ttr-{run.name}.json").write_text(json.dumps(result, indent=1, default=str))
        text = markdown(result)
        (args.out / f"ttr-{run.name}.md").write_text(text)
        print(text, flush=True)


if __name__ == "__main__":
    main()
