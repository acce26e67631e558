"""The fixed cost of a candidate run, with a process per run and with the persistent runner (issue 13).

    python scripts/bench_runners.py [CONFIG] --repeats 10 --out DIR

For each target of CONFIG (default: configs/suite.yaml) that uses the timing harness, the baseline is
built for both runners and run ``--repeats`` times with each, interleaved, through the engine's own
path (``Runner.stage`` + ``Staged.run``, then the output compare). Per run, from the harness's
summary line: the time from the launch to the first timed sample (process start, CUDA context,
inputs, copies), the time after the last sample (outputs checked or written, teardown), and the
output compare against the first run's outputs (what the runner did not check itself: the kernel
runner's host checks outputs where they are, ``Runner.verified_outputs``). The fixed cost is the
sum of the three: what a candidate pays besides its timed samples. Medians per target and runner;
DIR/runners.json, DIR/runners.md.

    python scripts/bench_runners.py [CONFIG] --actor --repeats 30 --out DIR

Where a measuring actor's time goes per job besides the run (``--actor``): the baseline measured
``--repeats`` times as GpuWorker.measure measures a search candidate (``measure_candidate`` with the
NVML monitor, capped at ``--max-samples``), with and without the monitor, against the run's and the
verify's own times; and the pieces alone: one NVML reading, the monitor's start and stop with its
summary, staging the binary. Medians; DIR/actor.json, DIR/actor.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def built(target, runner_name: str, phase_name: str = "baseline"):
    """The target's baseline configuration built for ``runner_name`` on GPU 0 (on the CPU for a
    cc target), and a runner to run it: (device, arch, candidate, artifact, runner)."""
    from cluster.compile.build import compile_candidate
    from cluster.core.registry import RUNNERS
    from cluster.core.types import Candidate, Phase, Status
    from cluster.platform.devices import cpu_device, gpu_device
    from cluster.toolchains import get_toolchain

    gpu = target.spec.toolchain != "cc"
    device = gpu_device(0, "bench") if gpu else cpu_device("bench")
    arch = get_toolchain(target.spec.toolchain).arch_for(device)
    candidate = Candidate(target.name, target.spec.toolchain, device.device_type, arch, target.bundle.hash,
                          tuple(target.space.baseline.items()), tuple(target.baseline_params.items()),
                          Phase(phase_name), runner=runner_name)
    artifact = compile_candidate(target, candidate)
    if artifact.status is not Status.OK:
        raise RuntimeError(f"{target.name} ({runner_name}) did not build: {artifact.error_tail[-500:]}")
    runner = RUNNERS.load(runner_name)(cuda=gpu) if runner_name != "process" else RUNNERS.load("process")()
    return device, arch, candidate, artifact, runner


def runs(target, runner_name: str, repeats: int) -> list[dict]:
    from cluster.measure.measure import _run_outputs, harness_region, verify_outputs
    from cluster.runners._base import Invocation

    _, arch, candidate, artifact, runner = built(target, runner_name)
    out, reference = [], None
    try:
        for i in range(repeats + 1):  # the first run warms the runner up (a persistent host starts once)
            with runner.stage(target, dict(candidate.params), arch, artifact.binary) as staged:
                launched = time.time()
                result = staged.run(Invocation(seed=0, reference=reference))  # as measure_candidate runs a candidate
                ended = time.time()
                region = harness_region(result.stdout)
                if not result.ok or region is None:
                    raise RuntimeError(f"{target.name} ({runner_name}): {result.tail()[-500:]}")
                t0 = time.perf_counter()
                verified = runner.verified_outputs(staged, reference) if reference else frozenset()
                problem = verify_outputs(staged.workdir, result.stdout, target.spec.verify, reference, verified)
                compare_s = time.perf_counter() - t0
                if problem:
                    raise RuntimeError(f"{target.name} ({runner_name}): {problem}")
                if reference is None:
                    reference = _run_outputs(staged.workdir, result.stdout, target.spec.verify)
            if i:
                out.append({"before_s": region[0] - launched, "after_s": ended - region[1], "compare_s": compare_s,
                            "timed_s": region[1] - region[0], "checked_by_runner": sorted(verified)})
    finally:
        runner.close()
    return out


def actor_jobs(target, runner_name: str, repeats: int, max_samples: int, source=None) -> dict:
    """Per job, as the measuring actor does it: measure_candidate's wall time with the monitor on
    ``source`` (NVML on a GPU) and without, the run's and the verify's times within it, and the
    pieces alone (an NVML reading, the monitor, the staging). Seconds, medians over ``repeats``."""
    from cluster.core.types import Status
    from cluster.measure.measure import Reference, measure_candidate
    from cluster.measure.telemetry import Monitor
    from cluster.platform.nvidia import NvmlSource

    device, arch, candidate, artifact, runner = built(target, runner_name, "search")
    source = source if source is not None else NvmlSource(0)
    figures: dict[str, list[float]] = {k: [] for k in ("job_s", "run_s", "verify_s", "job_plain_s", "run_plain_s",
                                                       "nvml_read_s", "monitor_s", "stage_s")}
    try:
        base = measure_candidate(target, candidate, artifact, device, None, 1, runner)  # warms up; the reference
        if base.status is not Status.OK:
            raise RuntimeError(f"{target.name} ({runner_name}): {base.status.value} {base.error_tail[-500:]}")
        reference = Reference(base.outputs)
        for _ in range(repeats):
            for monitored in (True, False):
                t0 = time.perf_counter()
                m = measure_candidate(target, candidate, artifact, device, reference, 1, runner,
                                      Monitor(source) if monitored else None, max_samples=max_samples)
                wall = time.perf_counter() - t0
                if m.status is not Status.OK:
                    raise RuntimeError(f"{target.name} ({runner_name}): {m.status.value} {m.error_tail[-500:]}")
                if monitored:
                    figures["job_s"].append(wall)
                    figures["run_s"].append(m.run_s)
                    figures["verify_s"].append(m.verify_s)
                else:
                    figures["job_plain_s"].append(wall)
                    figures["run_plain_s"].append(m.run_s)
            t0 = time.perf_counter()
            source.read()
            figures["nvml_read_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with Monitor(source) as monitor:
                pass
            monitor.summary([], 1)
            figures["monitor_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with runner.stage(target, dict(candidate.params), arch, artifact.binary):
                pass
            figures["stage_s"].append(time.perf_counter() - t0)
    finally:
        runner.close()
    row = {"target": target.name, "runner": runner_name, "jobs": repeats, "max_samples": max_samples,
           **{k: median(v) for k, v in figures.items()}}
    row["outside_run_s"] = row["job_s"] - row["run_s"] - row["verify_s"]
    row["outside_run_plain_s"] = row["job_plain_s"] - row["run_plain_s"]
    return row


def actor_table(rows: list[dict]) -> str:
    lines = ["| target | runner | job (monitor on) | its run | its verify | outside the run | job (monitor off) | "
             "outside the run, monitor off | one NVML reading | monitor alone | staging alone |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = {k: f"{1e3 * v:.2f} ms" for k, v in r.items() if k.endswith("_s")}
        lines.append(f"| {r['target']} | {r['runner']} | {ms['job_s']} | {ms['run_s']} | {ms['verify_s']} | "
                     f"**{ms['outside_run_s']}** | {ms['job_plain_s']} | {ms['outside_run_plain_s']} | "
                     f"{ms['nvml_read_s']} | {ms['monitor_s']} | {ms['stage_s']} |")
    return "\n".join(lines) + "\n"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "suite.yaml"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--actor", action="store_true", help="where a measuring actor's time goes per job")
    parser.add_argument("--max-samples", type=int, default=10, help="--actor: samples a job (a raced candidate: 10)")
    args = parser.parse_args()
    from cluster.config import load_run

    args.out.mkdir(parents=True, exist_ok=True)
    if args.actor:
        rows = [actor_jobs(t, "kernel" if t.spec.kind == "kernel" else "persistent", args.repeats, args.max_samples)
                for t in load_run(args.config).targets]
        (args.out / "actor.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "actor.md").write_text(actor_table(rows))
        print(actor_table(rows))
        return
    results = []
    for target in load_run(args.config).targets:
        kernel = target.spec.kind == "kernel"  # a kernel target: the kernel runner (configs/kernels.yaml)
        if not kernel and b"warpfleet/harness.cuh" not in b"".join(c for _, c in target.bundle.files):
            continue
        for runner in ("kernel",) if kernel else ("process", "persistent"):
            figures = runs(target, runner, args.repeats)
            row = {"target": target.name, "runner": runner, "runs": len(figures),
                   **{k: median([f[k] for f in figures]) for k in ("before_s", "after_s", "compare_s", "timed_s")}}
            row["fixed_s"] = row["before_s"] + row["after_s"] + row["compare_s"]
            row["checked_by_runner"] = sorted({name for f in figures for name in f["checked_by_runner"]})
            results.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| target | runner | launch to first sample | after the last | output compare | fixed cost | "
             "timed region |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['target']} | {r['runner']} | {1e3 * r['before_s']:.1f} ms | {1e3 * r['after_s']:.1f} ms | "
                     f"{1e3 * r['compare_s']:.1f} ms | **{1e3 * r['fixed_s']:.1f} ms** | {1e3 * r['timed_s']:.0f} ms |")
    (args.out / "runners.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "runners.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
