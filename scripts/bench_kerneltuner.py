"""warpfleet against Kernel Tuner on the same kernels, spaces and GPUs (issue 8), in one command.

    python scripts/bench_kerneltuner.py --out DIR [--gpus 1|2|4] [--wf-kind kernel|program] [--kernels ...]
        [--budget-s 460] [--quick] [--seeds 5] [--repeats 3] [--max-evals 20] [--run-limit-s 30]
    python scripts/bench_kerneltuner.py --out DIR --report-only [--merge DIR2 ...]

Four kernels (scripts/kt_compare/spaces.py): the suite's matmul and stencil, and a convolution and a
reduction written in Kernel Tuner's style. Each tool tunes each kernel over the same space with its
best strategy (warpfleet: Optuna's TPE; Kernel Tuner: its genetic algorithm) and with random search,
for every seed, with the same budget per run; seed 0 of the best strategy runs three times.

The work is split into lanes, each a process of its own (scripts/kt_compare/lanes.py):
- with two GPUs, the one-GPU runs of the two tools run at the same time, warpfleet on the first card
  and Kernel Tuner (after the independent timer's exhaustive pass) on the second; then the two-GPU
  runs, warpfleet's and then Kernel Tuner's (its parallel runner on Ray), each on both cards;
- with one GPU (or --sequential), one lane does it all, the two tools taking turns;
- at the end the winners are re-measured by the independent timer on its card.
Every lane has a deadline within --budget-s and skips what it cannot finish; every block writes its
own Parquet part under DIR/parts/, so a timeout loses at most the block in flight. The report
(DIR/report.md, DIR/summary.parquet) is written from whatever parts exist.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cluster.config.run import RACE, SEARCH_SAMPLES  # noqa: E402
from cluster.platform.devices import visible_gpu_count  # noqa: E402
from cluster.sandbox.sandbox import stop_command  # noqa: E402
from scripts.kt_compare.records import Block, stamp  # noqa: E402
from scripts.kt_compare.spaces import KERNEL_SPACES  # noqa: E402

GRACE_S = 20.0  # a lane past its deadline by this much is stopped
RUNNING: list[subprocess.Popen] = []  # lanes started and not yet waited for


def log(message: str) -> None:
    sys.stdout.write(f"[{stamp()} bench] {message}\n")  # one write per line, as the lanes do
    sys.stdout.flush()


# --- the plan -----------------------------------------------------------------------------------


def run_blocks(tool: str, kernels: list[str], seeds: int, repeats: int,
               strategies: tuple[str, ...] = ("best", "random")) -> list[Block]:
    """One tool's one-GPU runs, most useful first: seeds 0-1 of every kernel and strategy, the
    repeats of seed 0 kernel by kernel, then the remaining seeds. A lane cut short has whole seeds
    of every kernel and the repeats of whole kernels: every figure, on fewer seeds."""
    def seed_blocks(seed_range: range) -> list[Block]:
        return [Block("run", k, tool, strategy, seed) for seed in seed_range for k in kernels
                for strategy in strategies]

    first = min(seeds, 2)
    repeat = [Block("run", k, tool, "best", 0, r) for k in kernels for r in range(1, repeats) if "best" in strategies]
    return seed_blocks(range(first)) + repeat + seed_blocks(range(first, seeds))


def two_gpu_blocks(tool: str, kernels: list[str], repaired: bool, gpus: int = 2) -> list[Block]:
    """Seed 0 of both strategies on ``gpus`` GPUs. Kernel Tuner's parallel mode as shipped fails at its
    first result whatever the kernel (kt_run), so it runs on the first kernel only, to show it; the
    repaired one runs on all."""
    if tool == "warpfleet":
        return [Block("run", k, tool, strategy, 0, 0, gpus) for strategy in ("best", "random") for k in kernels]
    shipped = [Block("run", kernels[0], tool, strategy, 0, 0, gpus, "shipped") for strategy in ("best", "random")]
    fixed = [Block("run", k, tool, strategy, 0, 0, gpus, "repaired") for strategy in ("best", "random")
             for k in kernels]
    return shipped + (fixed if repaired else [])


def interleave(*lists: list[Block]) -> list[Block]:
    out = []
    for group in zip(*lists, strict=True):
        out += group
    return out


# --- lanes --------------------------------------------------------------------------------------


def start_lane(args: argparse.Namespace, name: str, devices: list[str], blocks: list[Block], deadline: float,
               settings: dict) -> subprocess.Popen | None:
    if not blocks:
        return None
    spec = {"name": name, "out": str(args.out.resolve()), "work": str(args.work.resolve()), "deadline": deadline,
            "gpus": len(devices), "blocks": [asdict(b) for b in blocks], "settings": settings}
    path = args.out / "lanes" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    log(f"lane {name}: {len(blocks)} blocks on GPU {','.join(devices)}, {deadline - time.time():.0f} s")
    proc = subprocess.Popen([sys.executable, "-m", "scripts.kt_compare.lanes", str(path)], cwd=REPO, env=env,
                            start_new_session=True)
    RUNNING.append(proc)
    return proc


def wait_lanes(lanes: list[tuple[subprocess.Popen | None, float]]) -> None:
    """Wait for the lanes; one still running GRACE_S past its deadline loses its process group."""
    for proc, deadline in lanes:
        if proc is None:
            continue
        try:
            proc.wait(timeout=max(1.0, deadline + GRACE_S - time.time()))
        except subprocess.TimeoutExpired:
            log(f"lane {proc.pid} past its deadline: stopping it")
            stop_command(proc, 10)
        if proc.returncode:
            log(f"lane {proc.pid} exited with status {proc.returncode}")
        RUNNING.remove(proc)


def stop_running_lanes() -> None:
    """On the way out (an error, SIGTERM): no lane outlives the command."""
    for proc in list(RUNNING):
        stop_command(proc, 10)
        RUNNING.remove(proc)


def visible_devices(gpus: int, dry_run: bool) -> list[str]:
    if dry_run:
        return [str(i) for i in range(gpus)]
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in listed.split(",") if d.strip()] if listed else [str(i) for i in range(gpus)]
    if len(devices) < gpus:
        raise SystemExit(f"--gpus {gpus}: only {len(devices)} GPU(s) visible ({devices})")
    return devices[:gpus]


def run_all(args: argparse.Namespace, settings: dict, kernels: list[str], t0: float) -> None:
    budget = args.budget_s
    devices = visible_devices(args.gpus, args.dry_run)
    concurrent = args.gpus >= 2 and not args.sequential
    reference = [Block("reference", k) for k in kernels]
    strategies = tuple(s for s in args.strategies.split(",") if s)
    wf = run_blocks("warpfleet", kernels, args.seeds, args.repeats, strategies)
    kt = run_blocks("kernel_tuner", kernels, args.seeds, args.repeats, strategies)
    one_gpu_end = t0 + budget * (0.62 if args.gpus >= 2 else 0.9)
    if concurrent:
        lanes = [(start_lane(args, "gpu0-warpfleet", devices[:1], wf, one_gpu_end, settings), one_gpu_end),
                 (start_lane(args, "gpu1-reference-kerneltuner", devices[1:2], reference + kt, one_gpu_end,
                             {**settings, "ray_cpus": 2}), one_gpu_end)]
        if args.gpus >= 4:  # the other two cards meanwhile: warpfleet on two GPUs, for its 1, 2, 4 curve
            lanes.append((start_lane(args, "2gpu-warpfleet", devices[2:4], two_gpu_blocks("warpfleet", kernels, True),
                                     one_gpu_end, {**settings, "ray_cpus": 2 * settings["ray_cpus"]}), one_gpu_end))
        wait_lanes(lanes)
    else:
        wait_lanes([(start_lane(args, "gpu0-all", devices[:1], reference + interleave(kt, wf), one_gpu_end,
                                settings), one_gpu_end)])
    if args.gpus >= 2:  # the multi-GPU runs on every card: 2, or 4
        two_gpu_end = t0 + budget * 0.9
        wf_end = time.time() + 0.45 * max(0.0, two_gpu_end - time.time())
        wf_blocks = two_gpu_blocks("warpfleet", kernels, True, args.gpus)
        wait_lanes([(start_lane(args, f"{args.gpus}gpu-warpfleet", devices, wf_blocks, wf_end,
                                {**settings, "ray_cpus": 2 * settings["ray_cpus"]}), wf_end)])
        kt_blocks = two_gpu_blocks("kernel_tuner", kernels, not args.no_repaired, args.gpus)
        wait_lanes([(start_lane(args, f"{args.gpus}gpu-kerneltuner", devices, kt_blocks, two_gpu_end, settings),
                     two_gpu_end)])
    ref_device = devices[1:2] if concurrent else devices[:1]
    end = t0 + budget * 0.98
    wait_lanes([(start_lane(args, "remeasure", ref_device, [Block("remeasure", k) for k in kernels], end, settings),
                 end)])


# --- the record ---------------------------------------------------------------------------------


def meta(args: argparse.Namespace, settings: dict, kernels: list[str]) -> dict:
    """Card, date, versions, command: what BENCHMARKS.md asks of every figure."""
    from importlib import metadata

    versions = {}
    for label, dist in (("warpfleet", "warpfleet"), ("Kernel Tuner", "kernel_tuner"), ("Ray", "ray"),
                        ("Optuna", "optuna"), ("CuPy", None), ("Python", None)):
        try:
            if label == "CuPy":
                import cupy

                versions[label] = cupy.__version__
            elif label == "Python":
                versions[label] = platform.python_version()
            else:
                versions[label] = metadata.version(dist)
        except Exception:
            versions[label] = _pyproject_version() if label == "warpfleet" else "not found"
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    versions["nvcc"] = nvcc[-1] if nvcc else "not found"
    out = {"date": time.strftime("%Y-%m-%d"), "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
           "host": platform.node(), "cpus": os.cpu_count(), "versions": versions, "settings": settings,
           "kernels": kernels, "seeds": list(range(args.seeds)), "repeats": args.repeats,
           "lanes": "concurrent (one card each)" if args.gpus >= 2 and not args.sequential else "one at a time",
           "gpus": [], "driver": "?"}
    try:
        import pynvml

        pynvml.nvmlInit()
        out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out["gpus"].append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle))})
        pynvml.nvmlShutdown()
    except Exception as exc:
        out["gpus_error"] = str(exc)
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pyproject_version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    return "?"


def report(out: Path, merge: list[Path]) -> str:
    from scripts.kt_compare.analysis import Data, optima, summary
    from scripts.kt_compare.report import markdown

    data = Data.load([out, *merge])
    raw = out / "raw"  # every table in one file each: the record to keep beside BENCHMARKS.md
    raw.mkdir(exist_ok=True)
    for name in ("evals", "runs", "reference", "remeasure", "blocks"):
        table = getattr(data, name)
        if len(table):
            table.to_parquet(raw / f"{name}.parquet", index=False)
    best = optima(data.reference) if len(data.reference) else optima_empty()
    table = summary(data)
    info = json.loads((out / "meta.json").read_text()) if (out / "meta.json").is_file() else {}
    text = markdown(info, best, table, data.blocks, data.runs)
    if len(table):
        table.to_parquet(out / "summary.parquet", index=False)
    (out / "report.md").write_text(text)
    return text


def optima_empty():
    import pandas as pd

    return pd.DataFrame(columns=["kernel", "configs", "ok"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results: parts/, report.md, summary.parquet")
    parser.add_argument("--work", type=Path, help="scratch (cubins, warpfleet runs); default: a temporary folder")
    parser.add_argument("--gpus", type=int, choices=(1, 2, 4), help="default: 2 where two are visible, else 1")
    parser.add_argument("--wf-kind", choices=("kernel", "program"), default="kernel",
                        help="warpfleet's lane: kernel targets measured in-process (default), or a program each")
    parser.add_argument("--kernels", default=",".join(KERNEL_SPACES))
    parser.add_argument("--budget-s", type=float, default=460.0, help="wall time of the whole command")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 1 seed, no repeats, 4 evaluations")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="runs of seed 0 (best strategy), the first included")
    parser.add_argument("--max-evals", type=int, default=20, help="configurations per tuning run")
    parser.add_argument("--run-limit-s", type=float, default=30.0, help="time limit of each tuning run")
    parser.add_argument("--wf-min-time", type=float, default=0.05, help="warpfleet harness --min-time")
    parser.add_argument("--wf-compile-workers", type=int, default=4)
    parser.add_argument("--wf-race", type=lambda v: None if v == "none" else float(v), default=RACE,
                        help="warpfleet's measure.race (losers stop sampling at this many times the study's "
                        "best); none: every configuration samples to the stopping rule, as the first comparisons")
    parser.add_argument("--wf-search-samples", type=lambda v: None if v == "none" else int(v),
                        default=SEARCH_SAMPLES, help="warpfleet's measure.search_samples (a search candidate's "
                        "samples at most; the finals sample by the full rule); none: the full rule in the search "
                        "too, as the comparisons before 2026-11-26's fourth lease")
    parser.add_argument("--wf-fresh-fleet", action="store_true", help="start warpfleet's measuring actors for "
                        "every run (the default keeps them for a lane's runs, as Kernel Tuner's lane keeps its "
                        "process and CUDA context; the runs of the first comparisons were fresh)")
    parser.add_argument("--kt-strategy", default="genetic_algorithm", help="Kernel Tuner's best strategy")
    parser.add_argument("--strategies", default="best,random", help="the one-GPU runs' strategies: best, random "
                        "or both (the repeats are of best)")
    parser.add_argument("--sequential", action="store_true", help="no concurrent one-GPU lanes on two GPUs")
    parser.add_argument("--no-repaired", action="store_true",
                        help="skip Kernel Tuner's parallel mode with its two bugs repaired (kt_run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="rehearse without a GPU: synthetic times, Kernel Tuner in simulation mode (rehearsal.py)")
    parser.add_argument("--rehearsal-pace-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--merge", type=Path, nargs="*", default=[], help="more output folders for the report")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        print(report(args.out, args.merge), flush=True)
        return
    t0 = time.time()
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in KERNEL_SPACES]
    if unknown:
        parser.error(f"unknown kernels {unknown} (known: {', '.join(KERNEL_SPACES)})")
    if args.gpus is None:
        args.gpus = 2 if args.dry_run or visible_gpu_count() >= 2 else 1
    if args.quick:
        args.seeds, args.repeats, args.max_evals = 1, 1, 4
        args.run_limit_s, args.wf_min_time = min(args.run_limit_s, 20.0), 0.02
        args.budget_s = min(args.budget_s, 300.0)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="kt-compare-work-"))
    cpus = os.cpu_count() or 4
    settings = {
        "max_evals": args.max_evals, "run_limit_s": args.run_limit_s,
        "wf_harness_args": ["--min-time", str(args.wf_min_time)], "wf_compile_workers": args.wf_compile_workers,
        "wf_kind": args.wf_kind, "wf_min_time": args.wf_min_time, "wf_keep_fleet": not args.wf_fresh_fleet,
        "wf_race": args.wf_race, "wf_search_samples": args.wf_search_samples, "kt_best": args.kt_strategy,
        "ray_cpus": max(2, cpus // args.gpus if args.gpus >= 2 else cpus),
        "jobs": max(2, cpus // 4), "dry_run": args.dry_run, "rehearsal_pace_s": args.rehearsal_pace_s,
        **({"ref_samples": 5, "ref_refine_top": 3, "ref_refine_samples": 5, "remeasure_rounds": 1,
            "remeasure_samples": 10, "wf_final_top_k": 1} if args.quick else {}),
    }
    info = meta(args, settings, kernels)
    if args.dry_run:
        info["gpus"] = [{"index": i, "name": "rehearsal: no GPU, synthetic times"} for i in range(args.gpus)]
    (args.out / "meta.json").write_text(json.dumps(info, indent=1))
    log(f"plan: {kernels}, {args.seeds} seeds, {args.repeats} repeats, {args.max_evals} evaluations per run, "
        f"{args.gpus} GPU(s), budget {args.budget_s:.0f} s; cards {[g['name'] for g in info['gpus']]}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally below runs
    try:
        run_all(args, settings, kernels, t0)
    finally:
        stop_running_lanes()
        log(f"all lanes done after {time.time() - t0:.0f} s; the report:")
        print(report(args.out, args.merge), flush=True)


if __name__ == "__main__":
    main()
