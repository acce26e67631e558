"""Measurement benchmarks of the suite on the GPU at hand (issue 3), written as JSON and markdown.

    python scripts/bench_suite.py --out DIR [--repeats 10] [--sweeps 3] [--trials 12] [--targets a,b]

1. noise: each suite target's baseline and hand-optimized variant (``target_opt.yaml``), each run
   ``--repeats`` times as separate processes; the spread of the medians.
2. stability and throughput: ``--sweeps`` identical sweeps of the suite (``configs/suite.yaml``);
   whether each target's winner is the same every time, candidates per minute per GPU, and the
   fraction of wall time the GPU worker spent running candidates.
3. occupancy: the calculator's theoretical occupancy against ncu's for every profiled kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.api import RunPlan, create_run, log_to, read_results, read_table, run_sweep, select_best
from cluster.compile.build import compile_candidate
from cluster.config import load_run, load_target
from cluster.core.occupancy import limits_for, occupancy
from cluster.core.types import Candidate, Phase, Stats, Status
from cluster.measure.measure import measure_candidate
from cluster.platform.devices import gpu_device

REPO = Path(__file__).resolve().parent.parent


def noise(target_file: Path, repeats: int, device) -> dict:
    target = load_target(target_file)
    candidate = Candidate(target.name, target.spec.toolchain, device.device_type, device.arch, target.bundle.hash,
                          tuple(target.space.baseline.items()), tuple(target.baseline_params.items()), Phase.BASELINE)
    artifact = compile_candidate(target, candidate)
    if artifact.status is not Status.OK:
        return {"target": target.name, "status": artifact.status.value, "error": artifact.error_tail[-500:]}
    medians, statuses = [], []
    for _ in range(repeats):
        m = measure_candidate(target, candidate, artifact, device, None, runs=1)
        statuses.append(m.status.value)
        if m.stats:
            medians.append(m.stats.median)
    out = {"target": target.name, "statuses": sorted(set(statuses)), "medians_ms": medians}
    if medians:
        mid = statistics.median(medians)
        stats = Stats.of(medians)
        out |= {"median_ms": mid, "spread": (max(medians) - min(medians)) / mid,
                "iqr_rel": stats.rel_noise if stats else None}
    return out


def sweeps(config: Path, count: int, trials: int, out: Path, profile_first: bool, final: tuple[int, int]) -> dict:
    base = load_run(config)
    search = base.config.search.model_copy(update={"trials": trials})
    measure = base.config.measure.model_copy(update={"final_top_k": final[0], "final_runs": final[1]})
    winners: dict[str, list[str]] = {}
    runs = []
    for i in range(count):
        profile = base.config.profile.model_copy(update={"candidates": "best" if profile_first and i == 0 else "none"})
        plan = RunPlan(base.config.model_copy(update={"search": search, "output_dir": str(out / "runs"),
                                                      "profile": profile, "measure": measure}),
                       base.file, base.targets)
        run = create_run(plan)
        with log_to(print):
            summary = run_sweep(plan, run)
        rows = read_results(run)
        gpu = rows[rows["arch"].str.startswith("sm_")]
        measured = gpu[gpu["run_s"].notna()]
        search_rows = gpu[gpu["phase"] == "search"]
        best = select_best(rows)
        for b in best:
            winners.setdefault(b.target, []).append(b.candidate_key)
        runs.append({
            "run_dir": str(run), "wall_s": summary.wall_s,
            "search_candidates": len(search_rows),
            "candidates_per_minute_per_gpu":
                len(search_rows) / (summary.wall_s / 60) / max(1, gpu["gpu_uuid"].nunique()),
            "gpu_worker_busy_fraction": float((measured["run_s"] + measured["verify_s"]).sum()) / summary.wall_s,
            "timed_region_fraction": float(sum(sum(s) for s in measured["samples"]) / 1000) / summary.wall_s,
            "statuses": rows["status"].value_counts().to_dict(),
            "best": {b.target: {"speedup": b.speedup, "median": b.median, "flags": b.flag_argv,
                                "params": b.params, "reason": b.reason} for b in best},
        })
        print(f"sweep {i}: {runs[-1]['search_candidates']} candidates in {summary.wall_s:.0f} s", flush=True)
        (out / f"sweep_{i}.json").write_text(json.dumps({"run": runs[-1], "winners": winners}, default=str))
    stable = {t: len(set(keys)) == 1 and len(keys) == count for t, keys in winners.items()}
    return {"runs": runs, "winners": winners, "same_winner": stable}


def occupancy_check(run_dirs: list[str], compute_capability: str) -> list[dict]:
    limits = limits_for(compute_capability)
    out = []
    for run in run_dirs:
        prof = read_table(run, "profiles")
        if prof.empty:
            continue
        ok = prof[prof["status"] == "ok"]
        for (key, _launch, kernel), group in ok.groupby(["candidate_key", "launch", "kernel"]):
            m = dict(zip(group["metric"], group["value"], strict=False))
            needed = ["launch__registers_per_thread", "launch__block_size", "sm__maximum_warps_per_active_cycle_pct"]
            if any(m.get(k) is None for k in needed):
                continue
            shared = sum(m.get(f"launch__shared_mem_per_block_{kind}") or 0 for kind in ("static", "dynamic"))
            ours = occupancy(limits, int(m["launch__block_size"]), int(m["launch__registers_per_thread"]), int(shared))
            out.append({"kernel": kernel[:60], "candidate_key": key, "block": int(m["launch__block_size"]),
                        "registers": int(m["launch__registers_per_thread"]), "shared": int(shared),
                        "ncu_pct": m["sm__maximum_warps_per_active_cycle_pct"], "ours_pct": ours.percent,
                        "match": abs(ours.percent - m["sm__maximum_warps_per_active_cycle_pct"]) < 0.5})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sweeps", type=int, default=3)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--config", default=str(REPO / "configs" / "suite.yaml"))
    parser.add_argument("--skip-noise", action="store_true")
    parser.add_argument("--final-top-k", type=int, default=3)
    parser.add_argument("--final-runs", type=int, default=3)
    parser.add_argument("--no-profile", action="store_true", help="no ncu stage (default: in the first sweep)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = gpu_device(0)
    report: dict = {"date": time.strftime("%Y-%m-%d"), "gpu": device.name, "driver": device.driver_version,
                    "cuda": device.cuda_version, "compute_capability": device.compute_capability}
    if not args.skip_noise:
        report["noise"] = []
        for folder in sorted((REPO / "configs" / "targets").iterdir()):
            for name in ("target.yaml", "target_opt.yaml"):
                if (folder / "target_opt.yaml").is_file() and (folder / name).is_file():
                    result = noise(folder / name, args.repeats, device)
                    print(json.dumps({k: v for k, v in result.items() if k != "medians_ms"}))
                    report["noise"].append(result)
    if args.sweeps:
        report["sweeps"] = sweeps(Path(args.config), args.sweeps, args.trials, out, not args.no_profile,
                                  (args.final_top_k, args.final_runs))
        report["occupancy"] = occupancy_check([r["run_dir"] for r in report["sweeps"]["runs"]],
                                              device.compute_capability)
    (out / "bench_suite.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "noise"}, indent=1, default=str)[-6000:])


if __name__ == "__main__":
    main()
