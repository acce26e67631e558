"""The driver's loop while the agents work: how long it goes without looking at its workers.

    python scripts/bench_driver_loop.py --out DIR [--config configs/public.yaml] [--trials 12] [--no-lock]

A sweep of the config's targets with the agents on (the rule-based experts, their real analyses,
plans, transformations and static checks), on one simulated GPU (``cluster.engine.scheduling.simulate``: a
modelled run, compile and check time; the driver, scheduler, Optuna, flows and Parquet are real),
on a local Ray instance. It reports the loop's iterations (from one ``Scheduler.poll`` to the next:
what the driver did in between), the longest of them with the threads' stacks sampled there, and
for each study the time from its baseline to its first search candidate. On an H100 the public
suite's GPU stood idle 43 s after its baselines while eight studies' agents (about fifty threads)
walked their parse trees: the loop did not get the GIL to see its finished jobs. ``--no-lock``
runs the agents without ``agents.workflow.engine.COMPUTING`` (the one lock their computing takes),
to show that cost. DIR/driver_loop.json holds the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class _NoLock:
    def __enter__(self) -> _NoLock:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def _stack(frame, depth: int = 6) -> str:
    frames = traceback.extract_stack(frame)[-depth:]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(frames))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "public.yaml")
    parser.add_argument("--trials", type=int, default=12, help="search candidates a study")
    parser.add_argument("--run-s", type=float, default=0.3, help="a simulated run")
    parser.add_argument("--compile-s", type=float, default=1.0, help="a simulated compile")
    parser.add_argument("--check-s", type=float, default=1.0, help="a simulated expensive check")
    parser.add_argument("--no-lock", action="store_true", help="the agents' computing without COMPUTING")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import ray

    import agents.workflow.engine as engine
    import cluster.engine.scheduling.scheduler as scheduler_module
    import cluster.engine.verification.verify as verify
    from cluster.api import RunPlan, create_run, load_run, read_results, run_sweep
    from cluster.engine.scheduling.simulate import Model, simulated_fleet  # the fleet is a fake; the engine is real

    if args.no_lock:
        engine.COMPUTING = verify.COMPUTING = _NoLock()  # type: ignore[assignment]
    plan = load_run(args.config)
    config = plan.config.model_copy(update={
        "output_dir": str(args.out / "runs"),
        "search": plan.config.search.model_copy(update={"trials": args.trials}),
        "agents": plan.config.agents.model_copy(update={"enabled": True})})
    plan = RunPlan(config, plan.file, plan.targets)
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    run_dir = create_run(plan)
    fleet, compile_model = simulated_fleet(1, Model(compile_s=args.compile_s, run_s=args.run_s, check_s=args.check_s))

    # The loop's iterations: from the end of one poll to the start of the next.
    polls: list[tuple[float, float]] = []  # (gap, its end)
    last: list[float] = []
    poll = scheduler_module.Scheduler.poll

    def timed_poll(self, timeout):
        now = time.perf_counter()
        if last:
            polls.append((now - last[0], now))
        try:
            return poll(self, timeout)
        finally:
            last[:] = [time.perf_counter()]

    scheduler_module.Scheduler.poll = timed_poll  # type: ignore[method-assign]
    samples: list[tuple[float, str, str]] = []  # (when, main thread's stack, another thread's)
    main_id, stop = threading.main_thread().ident, threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            now = time.perf_counter()
            for ident, frame in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                samples.append((now, "main" if ident == main_id else "other", _stack(frame)))

    threading.Thread(target=sample, daemon=True).start()
    started = time.perf_counter()
    summary = run_sweep(plan, run_dir, fleet=fleet, compile=compile_model)
    wall = time.perf_counter() - started
    stop.set()
    ray.shutdown()

    rows = read_results(run_dir)
    studies = {}
    for study, group in rows.groupby("study"):
        base = group[group["phase"] == "baseline"]["finished_at"].min()
        first = group[group["phase"] == "search"]["started_at"].min()
        studies[str(study)] = round((first - base).total_seconds(), 1) if base == base and first == first else None
    longest = sorted(polls, reverse=True)[:5]
    stacks = []
    for gap, end in longest[:2]:
        found = collections.Counter(f"{who}: {stack}" for when, who, stack in samples
                                    if end - gap <= when <= end and "wait" not in stack.split(" <- ")[0])
        stacks.append({"gap_s": round(gap, 1), "at_s": round(end - started, 1), "stacks": found.most_common(4)})
    result = {"config": str(args.config), "trials": args.trials, "lock": not args.no_lock, "wall_s": round(wall, 1),
              "bookkeeping_s": round(summary.bookkeeping_s, 1), "iterations": len(polls),
              "longest_iterations_s": [round(g, 2) for g, _ in longest],
              "first_search_after_baseline_s": studies, "longest_iterations_stacks": stacks,
              "run_dir": str(run_dir)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "driver_loop.json").write_text(json.dumps(result, indent=1))
    after = sorted(v for v in studies.values() if v is not None)
    print(f"wall {wall:.0f} s, loop iterations {len(polls)}, longest {result['longest_iterations_s']} s; "
          f"first search after the baseline: {after[0] if after else '-'}..{after[-1] if after else '-'} s "
          f"(median {after[len(after) // 2] if after else '-'} s) over {len(studies)} studies; "
          f"COMPUTING {'on' if not args.no_lock else 'off'}")


if __name__ == "__main__":
    main()
