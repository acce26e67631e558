"""The public-program suite (configs/public.yaml, issue 15 item 4) on the GPU at hand.

    python scripts/bench_public.py --out DIR --smoke
    python scripts/bench_public.py --out DIR [--trials 16] [--targets a,b] [--no-agents] [--hand-repeats 3]

--smoke: each public target's baseline built and run on seeds 0 and 1 (its outputs kept as the
reference), then its target_opt.yaml, where there is one, run against those outputs. Writes
DIR/public_smoke.json and prints a table: status, median time, seconds per run. Run it first: it
shows that every program runs, times itself and writes its output on this GPU.

Otherwise: one sweep of configs/public.yaml with the agent stage on (as scripts/bench_agents.py
does for configs/suite.yaml), then the hand-optimized speedup of each target that has a
target_opt.yaml (baseline and _opt each measured --hand-repeats times by the same harness), and
bench_agents' table (optimizations found, speedup found, hand-optimized speedup, share):
DIR/public_table.md, DIR/public.json, DIR/report-<run>.md, the run directory under DIR/runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from bench_agents import budget, hand_speedups, log, no_profile, table, verdicts  # noqa: E402

from cluster.api import RunPlan, configured, create_run, load_run, load_target, log_to, run_sweep  # noqa: E402
from cluster.compile.build import compile_candidate  # noqa: E402
from cluster.core.types import Candidate, DeviceInfo, Phase, Status  # noqa: E402
from cluster.measure.measure import Reference, measure_candidate  # noqa: E402
from cluster.outputs.optimize_report import write_report  # noqa: E402

PUBLIC = REPO / "configs" / "public.yaml"
FOLDERS = REPO / "configs" / "public"
SMOKE_SEEDS = 2


def _smoke_one(path: Path, device: DeviceInfo, reference: Reference | None) -> tuple[dict, Reference | None]:
    """Build ``path``'s baseline point and run it SMOKE_SEEDS times; against ``reference`` when
    given, else its outputs become the reference that is returned."""
    target = load_target(path)
    candidate = Candidate(target.name, target.spec.toolchain, device.device_type, device.arch, target.bundle.hash,
                          tuple(target.space.baseline.items()), tuple(target.baseline_params.items()), Phase.BASELINE)
    artifact = compile_candidate(target, candidate)
    if artifact.status is not Status.OK:
        return {"target": target.name, "status": artifact.status.value, "error": artifact.error_tail[-500:]}, None
    m = measure_candidate(target, candidate, artifact, device, reference, runs=SMOKE_SEEDS)
    record = {"target": target.name, "status": m.status.value, "median_ms": m.stats.median if m.stats else None,
              "samples": len(m.samples), "s_per_run": m.run_s / SMOKE_SEEDS, "error": m.error_tail[-500:]}
    log(f"{target.name}: {record['status']}, median {record['median_ms']} ms, {record['s_per_run']:.2f} s a run")
    keep = Reference(m.outputs) if reference is None and m.status is Status.OK else None
    return record, keep


def smoke(out: Path) -> None:
    from cluster.platform.devices import gpu_device

    device = gpu_device(0, "smoke")
    records = []
    for path in sorted(FOLDERS.glob("*/target.yaml")):
        record, reference = _smoke_one(path, device, None)
        records.append(record)
        opt = path.with_name("target_opt.yaml")
        if opt.is_file() and reference is not None:
            records.append(_smoke_one(opt, device, reference)[0])
    (out / "public_smoke.json").write_text(json.dumps({"device": device.name, "targets": records}, indent=1))
    lines = ["| target | status | median (ms) | samples | s per run |", "|---|---|---|---|---|"]
    for r in records:
        median = f"{r['median_ms']:.4f}" if r.get("median_ms") else "-"
        per_run = f"{r['s_per_run']:.2f}" if "s_per_run" in r else "-"
        lines.append(f"| {r['target']} | {r['status']} | {median} | {r.get('samples', '-')} | {per_run} |")
    print("\n".join(lines))
    failed = [r["target"] for r in records if r["status"] != Status.OK.value]
    log(f"{len(records) - len(failed)} of {len(records)} ran and verified" + (f"; failed: {failed}" if failed else ""))


def public_sweep(targets: list[str], trials: int, agents: bool, out: Path,
                 search_s: float | None = None, profile_winners: bool = True) -> Path:
    plan = load_run(PUBLIC)
    chosen = tuple(t for t in plan.targets if not targets or t.name in targets)
    plan = configured(RunPlan(plan.config, plan.file, chosen), output_dir=str(out / "runs"),
                      name="public-agents" if agents else "public", search={"trials": trials, **budget(search_s)},
                      agents={"enabled": agents, "sanitizer_timeout_s": 300},
                      **no_profile(plan.config, profile_winners))
    run = create_run(plan)
    log(f"sweep (agents {'on' if agents else 'off'}): {[t.name for t in chosen]}, {trials} trials each -> {run}")
    with log_to(log):
        run_sweep(plan, run)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="only run each baseline and _opt once, verified")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--targets", default="", help="comma-separated public targets (default: all)")
    parser.add_argument("--no-agents", action="store_true", help="flags and params only")
    parser.add_argument("--hand-repeats", type=int, default=3)
    parser.add_argument("--time-budget", type=float, dest="search_s",
                        help="the sweep's time budget, seconds of wall clock (default: the trials alone)")
    parser.add_argument("--no-profile", action="store_true", help="no Nsight Compute profile of the winners")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        smoke(args.out)
        return
    started = time.time()
    targets = [t for t in args.targets.split(",") if t]
    # The hand-optimized figures first, on the GPU alone, kept at once (as bench_agents does).
    names = [t.name for t in load_run(PUBLIC).targets if not targets or t.name in targets]
    hand = hand_speedups([FOLDERS / name for name in names], args.hand_repeats)
    (args.out / "public.json").write_text(json.dumps({"hand": hand}, indent=1, default=str))
    run = public_sweep(targets, args.trials, not args.no_agents, args.out, args.search_s,
                       profile_winners=not args.no_profile)
    text, records = table(run, hand)
    if not args.no_agents:
        (args.out / f"report-{run.name}.md").write_text(write_report(run).read_text())
    (args.out / "public_table.md").write_text(text)
    (args.out / "verdicts.md").write_text(verdicts(run))
    (args.out / "public.json").write_text(json.dumps({"run": str(run), "wall_s": time.time() - started,
                                                       "hand": hand, "targets": records}, indent=1, default=str))
    print(text)
    log(f"done in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
