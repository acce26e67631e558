"""Portability benchmark: sweep the suite on this GPU, evaluate another GPU's winners here, compare.

    python scripts/bench_portability.py --out DIR [--trials 6] [--other RUN ...] [--run RUN] [--arch sm_80]

1. sweep ``--config`` (default ``configs/suite.yaml``) on the GPUs here with ``--trials`` per study
   (no Nsight Compute; the best 2 and the baseline re-measured twice), into ``DIR/runs``, unless
   ``--run`` names a sweep of this GPU made before;
2. with ``--other RUN`` (a sweep made on another GPU; repeatable): evaluate its winners and this
   run's here, with the baseline measured again (an evaluation run passed as ``--other`` only joins
   the comparison);
3. compare every run (``DIR/matrix.md``, ``DIR/matrix.json``; ``--arch`` adds ptxas's resources
   for an arch with no GPU here) and write the report (``DIR/report/``); print the matrix.

Everything printed also goes to ``DIR/bench.log``; ``DIR/summary.json`` holds the run directories
and the wall time of each step. It stops at the first problem with a message and a non-zero exit:
bad arguments or runs (before anything is swept), no GPU or no nvcc, a study that did not run.

For a complete matrix of two GPUs, X and Y:

    on X:  bench_portability.py --out DIR_X
    on Y:  bench_portability.py --out DIR_Y --other DIR_X/runs/<X's sweep>
    on X:  bench_portability.py --out DIR_X2 --run DIR_X/runs/<X's sweep> --other DIR_Y/runs/<Y's sweep>
           --other DIR_Y/runs/<Y's evaluation>
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.api import configured, create_run, load_run, log_to, read_results, run_meta, run_sweep, select_best
from cluster.core.errors import ConfigError
from cluster.engine.evaluate import Evaluation, create_run_dir, plan_for  # `evaluate`'s steps: not in the API
from cluster.outputs.compare import add_resources, build_matrices, load_run_dir, load_targets
from cluster.outputs.compare_text import to_json, to_markdown

REPO = Path(__file__).resolve().parent.parent


class Failed(Exception):
    """A problem that ends the benchmark: printed in one line, exit status 1."""


class Log:
    """Prints and appends to ``DIR/bench.log``, each line with the seconds since the start."""

    def __init__(self, path: Path) -> None:
        self.file: TextIO = path.open("a")
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.start:7.1f} s] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the runs, the log and the report")
    parser.add_argument("--config", default=str(REPO / "configs" / "suite.yaml"))
    parser.add_argument("--trials", type=int, default=6, help="search candidates per study (default 6)")
    parser.add_argument("--final-top-k", type=int, default=2)
    parser.add_argument("--final-runs", type=int, default=2)
    parser.add_argument("--run", type=Path, help="a sweep of this GPU made before: no new sweep")
    parser.add_argument("--other", type=Path, action="append", default=[], help="a run made on another GPU")
    parser.add_argument("--arch", action="append", default=[], help="an arch for ptxas's resources (sm_80)")
    parser.add_argument("--no-report", action="store_true",
                        help="skip the HTML/PNG report (a host without matplotlib); `warpfleet report` makes it later")
    parser.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a CPU config, for trying)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.final_runs < 1 or args.final_top_k < 0:
        parser.error("--trials and --final-runs must be at least 1, --final-top-k at least 0")
    return args


def check_machine(allow_cpu: bool) -> str:
    """The GPUs here, by name; a Failed when there is none (or no nvcc) and a CPU run was not asked for."""
    if allow_cpu:
        return "CPU (--allow-cpu)"
    if shutil.which("nvcc") is None:
        raise Failed("nvcc is not on PATH")
    try:
        import pynvml

        pynvml.nvmlInit()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no NVML: say what NVML said
        raise Failed(f"no GPU: NVML: {exc}") from None
    if not names:
        raise Failed("no GPU: NVML lists none")
    return ", ".join(n.decode() if isinstance(n, bytes) else n for n in names)


def check_runs(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The runs given, before anything is swept: (sweeps whose winners to evaluate, evaluation runs)."""
    sweeps, evaluations = [], []
    for path in [*([args.run] if args.run else []), *args.other]:
        meta = run_meta(path)
        if read_results(path).empty:
            raise Failed(f"{path}: no results")
        (evaluations if meta.get("kind") == "evaluate" else sweeps).append(str(path))
    if sweeps:
        plan_for(sweeps, args.config)  # their targets are the config's, with the same sources
    return sweeps, evaluations


def sweep(args: argparse.Namespace, log: Log) -> Path:
    plan = configured(load_run(args.config), output_dir=str(args.out / "runs"), search={"trials": args.trials},
                      measure={"final_top_k": args.final_top_k, "final_runs": args.final_runs},
                      profile={"candidates": "none"})
    run_dir = create_run(plan)
    log(f"sweep {plan.file}: {len(plan.targets)} targets, {args.trials} trials each, into {run_dir}")
    with log_to(log):
        summary = run_sweep(plan, run_dir)
    if summary.skipped:
        raise Failed(f"the sweep left out: {'; '.join(summary.skipped)}")
    best = select_best(read_results(run_dir))
    missing = sorted({t.name for t in plan.targets} - {b.target for b in best})
    if missing:
        raise Failed(f"no correct candidate for {', '.join(missing)} (see {run_dir})")
    for b in best:
        log(f"  {b.target} on {b.device_type}: {b.speedup:.2f}x ({' '.join([*b.flag_argv, *b.defines])})")
    return run_dir


def evaluate(sources: list[str], args: argparse.Namespace, log: Log) -> Path:
    plan, origins = plan_for(sources, args.config)
    run_dir = create_run_dir(plan, origins, sources, str(args.out / "runs"))
    log(f"evaluate {len(origins)} configurations of {len(sources)} runs here, into {run_dir.path}")
    with log_to(log):
        summary = Evaluation(plan, origins, run_dir, args.final_runs).run()
    if summary.skipped:
        raise Failed(f"the evaluation left out: {'; '.join(summary.skipped)}")
    rows = read_results(run_dir.path)
    failed = rows[rows["status"] != "ok"]
    for _, row in failed.iterrows():
        log(f"  {row['target']}: {row['flags']} {row['defines']}: {row['status']}")
    return run_dir.path


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "bench.log")
    summary: dict[str, Any] = {"argv": sys.argv if argv is None else argv, "steps": {}}
    try:
        summary["device"] = check_machine(args.allow_cpu)
        log(f"device: {summary['device']}")
        sweeps, evaluations = check_runs(args)
        step = time.monotonic()
        this = args.run.resolve() if args.run else sweep(args, log)
        summary["steps"]["sweep_s"] = time.monotonic() - step
        runs = [str(this), *(str(p) for p in args.other)]
        others = [s for s in sweeps if Path(s).resolve() != this]
        if others:
            step = time.monotonic()
            runs.append(str(evaluate([str(this), *others], args, log)))
            summary["steps"]["evaluate_s"] = time.monotonic() - step
        step = time.monotonic()
        loaded = [load_run_dir(r) for r in runs]
        targets, problems = load_targets(loaded, args.config)
        for problem in problems:
            log(problem)
        matrices = [add_resources(m, loaded, args.arch, targets) for m in build_matrices(loaded)]
        (args.out / "matrix.md").write_text(to_markdown(matrices))
        (args.out / "matrix.json").write_text(to_json(matrices))
        page = None
        if not args.no_report:
            from cluster.outputs.report import write_report

            page, _ = write_report(runs, args.out / "report")
        summary["steps"]["compare_report_s"] = time.monotonic() - step
        summary |= {"runs": runs, "evaluations_given": evaluations, "report": str(page)}
        print(to_markdown(matrices), flush=True)
        log(f"matrix: {args.out / 'matrix.md'}; report: {page}")
        return 0
    except (Failed, ConfigError) as exc:
        log(f"FAILED: {exc}")
        summary["failed"] = str(exc)
        return 1
    finally:
        summary["wall_s"] = time.monotonic() - log.start
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
