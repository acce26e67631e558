"""Issue 4's acceptance on a GPU: the workflow on the benchmark suite, as a table like Table 1 of
the WarpDrive paper (optimization, class, motivating metrics, speedup found, hand-optimized
speedup, share of it reached).

    python scripts/bench_agents.py --out DIR [--trials 6] [--targets transpose,regpressure]

1. The hand-optimized speedup: each target's baseline and its ``target_opt.yaml``, measured
   ``--hand-repeats`` times on the same GPU by the same harness, medians compared; kept in
   DIR/agents.json before the sweep starts.
2. One sweep of the chosen suite targets with the agent stage on: baseline ncu profile, the
   experts, verification (outputs, compute-sanitizer memcheck + racecheck, dependence graph),
   then a search over verified variants and flags, the final re-measure and (without
   ``--no-profile``) the winners' profiles.
3. DIR/agents_table.md (the table), DIR/agents.json (every figure), DIR/report-<run>.md (the
   optimize report), the run directory under DIR/runs. A sweep cut short by a time box: its
   table from the rows written, ``--from-run DIR/runs/RUN --hand DIR/agents.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from bench_suite import noise  # noqa: E402

from cluster.api import (  # noqa: E402
    BestConfig,
    RunPlan,
    configured,
    create_run,
    load_run,
    log_to,
    read_results,
    read_table,
    run_sweep,
    select_best,
)
from cluster.outputs.optimize_report import optimization_results, write_report  # noqa: E402

SUITE = REPO / "configs" / "suite.yaml"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def agent_sweep(targets: list[str], trials: int, out: Path, search_s: float | None = None,
                profile_winners: bool = True) -> Path:
    plan = load_run(SUITE)
    chosen = tuple(t for t in plan.targets if not targets or t.name in targets)
    plan = configured(RunPlan(plan.config, plan.file, chosen), output_dir=str(out / "runs"), name="suite-agents",
                      search={"trials": trials, **budget(search_s)}, measure={"final_top_k": 2, "final_runs": 3},
                      agents={"enabled": True, "sanitizer_timeout_s": 90}, **no_profile(plan.config, profile_winners))
    run = create_run(plan)
    log(f"sweep with agents: {[t.name for t in chosen]}, {trials} trials each -> {run}")
    with log_to(log):
        run_sweep(plan, run)
    return run


def no_profile(config, profile_winners: bool) -> dict:
    """Without ``profile_winners``: no Nsight Compute profile of the winners after the finals (the
    analysts' profile of each baseline still runs), so that a lease of fixed length holds the table."""
    return {} if profile_winners else {"profile": config.profile.model_copy(update={"candidates": "baseline"})}


def budget(time_budget_s: float | None) -> dict:
    """The sweep's time budget (search.time_budget_s: its wall clock, issue 25), where one is given:
    the search stops in time for the finals, so that a GPU lease of fixed length holds the command."""
    return {"time_budget_s": time_budget_s} if time_budget_s else {}


def hand_speedups(folders: list[Path], repeats: int) -> dict[str, dict]:
    """Per target folder that has a ``target_opt.yaml``: its baseline and hand-optimized version,
    each measured ``repeats`` times on GPU 0 by the same harness. A folder without one (a control
    such as the suite's stencil) is left out."""
    out: dict[str, dict] = {}
    device = None
    for folder in folders:
        if not (folder / "target_opt.yaml").is_file():
            log(f"hand-optimized {folder.name}: none (no target_opt.yaml)")
            continue
        if device is None:
            from cluster.platform.devices import gpu_device

            device = gpu_device(0, "bench")
        base = noise(folder / "target.yaml", repeats, device)
        opt = noise(folder / "target_opt.yaml", repeats, device)
        if "median_ms" in base and "median_ms" in opt:
            out[folder.name] = {"baseline_ms": base["median_ms"], "hand_ms": opt["median_ms"],
                                "hand_speedup": base["median_ms"] / opt["median_ms"]}
        else:
            out[folder.name] = {"error": json.dumps([base, opt])[:500]}
        log(f"hand-optimized {folder.name}: {out[folder.name]}")
    return out


def step_times(rows: pd.DataFrame, variants: pd.DataFrame) -> dict[str, float]:
    """A study's steps in seconds, from its rows' and variants' times: ``agents`` (the baseline's
    end to the last expert's verdict recorded), ``search`` (its first search row's start to its last
    one's end) and ``finals``; a step that did not run is left out."""
    def span(phase: str) -> tuple[float, float] | None:
        mine = rows[rows["phase"] == phase]
        start = pd.to_datetime(mine["started_at"], utc=True).dropna()
        end = pd.to_datetime(mine["finished_at"], utc=True).dropna()
        return (start.min().timestamp(), end.max().timestamp()) if len(start) and len(end) else None

    steps: dict[str, float] = {}
    baseline = span("baseline")
    if baseline and len(variants):
        steps["agents"] = float(variants["created_at"].max()) - baseline[1]
    for phase, name in (("search", "search"), ("final", "finals")):
        found = span(phase)
        if found:
            steps[name] = found[1] - found[0]
    return steps


CHEATS = ("timing_code", "poisoned_outputs", "cached_results", "untimed_work")
SANITIZER = ("memcheck", "racecheck", "initcheck", "synccheck")


def verification(variants: pd.DataFrame) -> dict[str, object]:
    """What verification did with a study's variants: how many reached it, how many it rejected,
    each check's outcomes over them ({check: {passed/failed/skipped: count}}) and the seconds each
    kind of check took in all (a verdict's own time; sanitizer tools and cheat checks as one each);
    the four cheat checks count as one, `cheats`, failed when any of them failed."""
    checked = variants[variants["verdicts"].fillna("").str.len() > 2]
    checks: dict[str, dict[str, int]] = {}
    seconds: dict[str, float] = {}
    for text in checked["verdicts"]:
        verdicts = json.loads(text)
        cheats = [v for v in verdicts if v["check"] in CHEATS]
        others = [(v["check"], v["status"]) for v in verdicts if v["check"] not in CHEATS]
        if cheats:
            failed = any(v["status"] == "failed" for v in cheats)
            passed = all(v["status"] == "passed" for v in cheats)
            others.append(("cheats", "failed" if failed else "passed" if passed else "skipped"))
        for check, status in others:
            counts = checks.setdefault(check, {})
            counts[status] = counts.get(status, 0) + 1
        for v in verdicts:
            kind = "cheats" if v["check"] in CHEATS else "sanitizer" if v["check"] in SANITIZER else v["check"]
            seconds[kind] = seconds.get(kind, 0.0) + float(v.get("seconds") or 0.0)
    return {"variants": len(checked), "rejected": int((checked["stage"] == "rejected").sum()), "checks": checks,
            "seconds": {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]) if v > 0}}


def _verification_cell(v: dict) -> str:
    """`12 verified, 0 rejected; failed: outputs 1` (each check's failures), `none` when no variant
    reached verification."""
    if not v["variants"]:
        return "none reached it"
    failed = ", ".join(f"{check} {counts['failed']}" for check, counts in v["checks"].items() if counts.get("failed"))
    ran = [check for check, counts in v["checks"].items() if counts.get("passed") or counts.get("failed")]
    took = ", ".join(f"{k} {s:.0f}" for k, s in v.get("seconds", {}).items())
    return (f"{v['variants']} verified, {v['rejected']} rejected" + (f" (failed: {failed})" if failed else "")
            + f"; checks run: {', '.join(ran)}" + (f"; seconds: {took}" if took else ""))


def _variants_cell(found: list[dict]) -> str:
    """Each accepted optimization's speedup alone (with flags): `restrict 1.30x (1.31x)`."""
    def x(v: float | None) -> str:
        return f"{v:.2f}x" if v else "-"
    return "; ".join(f"{f['optimization']} {x(f['alone'])} ({x(f['best'])})" for f in found if f["accepted"]) or "-"


def verdicts(run: Path) -> str:
    """Each expert's verdict per program: accepted (with its evidence) or why it does not apply, one
    line per program and optimization (the first of its reasons; `+N more` counts the rest)."""
    variants = read_table(run, "variants")  # the latest record of each outcome
    lines = ["| program | optimization | verdict | evidence or reason |", "|---|---|---|---|"]
    for (target, optimization), group in variants.groupby(["target", "optimization"], sort=True):
        stages = group["stage"].value_counts().to_dict()
        verdict = ", ".join(f"{stage} x{n}" if n > 1 else stage for stage, n in sorted(stages.items()))
        accepted = group[group["stage"] == "accepted"]
        notes = [e for e in (accepted["evidence"] if len(accepted) else group["reason"]) if e]
        notes = list(dict.fromkeys(notes))
        note = (notes[0].replace("\n", "; ").replace("|", "/")[:200] + (f" (+{len(notes) - 1} more)" if len(notes) > 1
                else "")) if notes else "-"
        lines.append(f"| {target} | {optimization} | {verdict} | {note} |")
    return "\n".join(lines) + "\n"


def winner_label(b: BestConfig | None, variants: pd.DataFrame) -> str:
    """What won, in the experts' words: the accepted optimizations whose source the winner is, with
    `+ -maxrregcount` where its flags hold a register cap the register expert proposed (the flags
    space's own `-maxrregcount` values are flags like any other); `flags only` otherwise."""
    winner = "flags only"
    if b is not None and b.is_variant:
        match = variants[(variants["source_hash"] == b.source_hash) & (variants["stage"] == "accepted")]
        winner = ", ".join(dict.fromkeys(match["optimization"])) or "variant"
    caps = {f"-maxrregcount={v}" for text in variants.loc[(variants["optimization"] == "registers")
                                                          & (variants["stage"] == "accepted"), "search"]
            for v in json.loads(text or "{}").get("maxrregcount", [])}
    if b is not None and caps & set(b.flag_argv):
        winner = f"{winner} + -maxrregcount" if winner != "flags only" else "registers (-maxrregcount)"
    return winner


def table(run: Path, hand: dict[str, dict]) -> tuple[str, list[dict]]:
    rows = read_results(run)
    variants = read_table(run, "variants")
    best = {b.target: b for b in select_best(rows)}
    records = []
    for target in sorted(set(rows["target"])):
        mine = variants[variants["target"] == target]
        results = [r for r in optimization_results(rows, mine) if r.target == target]
        found = [r for r in results if r.accepted]
        b = best.get(target)
        winner = winner_label(b, mine)
        hand_speedup = hand.get(target, {}).get("hand_speedup")
        speedup = b.speedup if b is not None else None
        steps = step_times(rows[rows["target"] == target], mine)
        # A study a time box ended before its finals has no winner yet; a hand version no faster than
        # the baseline is no yardstick: neither gets a share.
        finished = "finals" in steps
        records.append({
            "target": target, "winner": winner, "flags": " ".join([*b.flag_argv, *b.defines]) if b else "",
            "found": [{"optimization": r.optimization, "class": r.level, "accepted": r.accepted,
                       "rejected": r.rejected, "alone": r.alone, "best": r.best, "evidence": r.evidence}
                      for r in results],
            "speedup": speedup, "hand_speedup": hand_speedup,
            "share": speedup / hand_speedup if speedup and hand_speedup and hand_speedup > 1 and finished else None,
            "finished": finished,
            "not_applicable": sorted(set(mine.loc[mine["stage"] == "not_applicable", "optimization"])),
            "steps_s": steps, "verification": verification(mine),
        })
    lines = ["| target | optimizations found (class) | motivating metrics | alone (with flags) | speedup found | "
             "winner | hand-optimized | share | steps (s) | verification |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        found = ", ".join(f"{f['optimization']} ({f['class']})" for f in r["found"] if f["accepted"]) or "none"
        evidence = "; ".join(f["evidence"] for f in r["found"] if f["accepted"] and f["evidence"])[:220]
        cells = [r["target"], found, evidence.replace("|", "/") or "-", _variants_cell(r["found"]),
                 (f"{r['speedup']:.2f}x" if r["speedup"] else "-") + ("" if r["finished"] else " (unfinished)"),
                 f"{r['winner']}: `{r['flags'] or '-'}`",
                 f"{r['hand_speedup']:.2f}x" if r["hand_speedup"] else "-",
                 f"{100 * r['share']:.0f}%" if r["share"] else "-",
                 ", ".join(f"{k} {v:.0f}" for k, v in r["steps_s"].items()) or "-",
                 _verification_cell(r["verification"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--targets", default="", help="comma-separated suite targets (default: all)")
    parser.add_argument("--hand-repeats", type=int, default=3)
    parser.add_argument("--time-budget", type=float, dest="search_s",
                        help="the sweep's time budget, seconds of wall clock (default: the trials alone)")
    parser.add_argument("--no-profile", action="store_true", help="no Nsight Compute profile of the winners")
    parser.add_argument("--from-run", type=Path, help="no GPU work: the table of this stored run, with the "
                        "hand-optimized figures of --hand (an agents.json written before)")
    parser.add_argument("--hand", type=Path, help="with --from-run: the agents.json holding the hand figures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_run:
        hand = json.loads(args.hand.read_text())["hand"] if args.hand else {}
        text, _ = table(args.from_run, hand)
        (args.out / "agents_table.md").write_text(text)
        (args.out / "verdicts.md").write_text(verdicts(args.from_run))
        print(text)
        return
    targets = [t for t in args.targets.split(",") if t]
    started = time.time()
    # The hand-optimized figures first, on the GPU alone (before Ray starts), kept at once: a sweep
    # that a time box ends leaves them, and `--from-run RUN --hand agents.json` makes the table.
    names = [t.name for t in load_run(SUITE).targets if not targets or t.name in targets]
    hand = hand_speedups([REPO / "configs" / "targets" / name for name in names], args.hand_repeats)
    (args.out / "agents.json").write_text(json.dumps({"hand": hand}, indent=1, default=str))
    run = agent_sweep(targets, args.trials, args.out, args.search_s, profile_winners=not args.no_profile)
    text, records = table(run, hand)
    report = write_report(run)
    (args.out / f"report-{run.name}.md").write_text(report.read_text())
    (args.out / "agents_table.md").write_text(text)
    (args.out / "verdicts.md").write_text(verdicts(run))
    (args.out / "agents.json").write_text(json.dumps({"run": str(run), "wall_s": time.time() - started,
                                                       "hand": hand, "targets": records}, indent=1, default=str))
    print(text)
    log(f"done in {time.time() - started:.0f} s; median share "
        f"{statistics.median([r['share'] for r in records if r['share']] or [0]):.2f}")


if __name__ == "__main__":
    main()
