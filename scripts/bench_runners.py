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

    python scripts/bench_runners.py [CONFIG] --split --repeats 3 --out DIR

Where a program target's run second goes (``--split``, any program target of CONFIG, its own
timer or the harness): per repeat, in turn, the same staged baseline run as a bare process (no
sandbox, no device clock), in the sandbox, and as the engine runs it (the worker's runner: the
sandbox and, on a GPU, the device clock), the output compare, and a search job's
``measure_candidate`` around one such run (its samples capped at ``--max-samples`` where the
program samples through the harness); beside them a process that only makes a CUDA context
(``cudaFree(0)``; on the CPU an empty program). The pieces: the process and its context, the
program's own untimed work (inputs, its CPU check, teardown), its timed samples, the sandbox, the
device clock, the compare, the job's own rest. Medians; DIR/split.json, DIR/split.md.
"""

from __future__ import annotations

import argparse
import json
import os
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


CONTEXT_SOURCE = """#include <cuda_runtime.h>
int main() { return cudaFree(0) == cudaSuccess ? 0 : 1; }
"""


def context_program(folder: Path, gpu: bool) -> list[str]:
    """A process that makes a CUDA context and ends (an empty program on the CPU), built in ``folder``."""
    import subprocess

    source = folder / ("context.cu" if gpu else "context.c")
    source.write_text(CONTEXT_SOURCE if gpu else "int main(void) { return 0; }\n")
    binary = folder / "context"
    subprocess.run(["nvcc" if gpu else "cc", "-O2", "-o", str(binary), str(source)], check=True)
    return [str(binary)]


def split_runs(target, repeats: int, context: list[str], max_samples: int) -> dict:
    """Seconds, medians over ``repeats``, of the pieces of one run of ``target``'s baseline."""
    import subprocess

    from cluster.core.registry import RUNNERS
    from cluster.core.types import Status
    from cluster.measure.clock import seconds_per_unit
    from cluster.measure.measure import Reference, measure_candidate, parse_samples, verify_outputs
    from cluster.runners._base import Invocation, harness_env
    from cluster.sandbox.isolation import node_sandbox
    from cluster.sandbox.sandbox import run_command

    device, arch, candidate, artifact, _ = built(target, "process", "search")
    runner = RUNNERS.load("process").for_worker(node_sandbox(gpu=device.kind == "gpu"), None, device)
    # Warms up; the reference, its samples capped as the job's (a clock of more samples is a claim)
    base = measure_candidate(target, candidate, artifact, device, None, 1, runner, max_samples=max_samples)
    if base.status is not Status.OK:
        raise RuntimeError(f"{target.name}: {base.status.value} {base.error_tail[-500:]}")
    reference = Reference(base.outputs, base.clock)
    unit = seconds_per_unit(target.spec.metric) or 0.0
    figures: dict[str, list[float]] = {k: [] for k in ("context_s", "bare_s", "timed_s", "sandbox_s", "engine_s",
                                                       "compare_s", "job_s")}

    def timed(argv: list[str], cwd: Path, **kwargs) -> tuple[float, str]:
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, **kwargs)
        return time.perf_counter() - t0, done.stdout

    for _ in range(repeats):
        figures["context_s"].append(timed(context, REPO)[0])
        invocation = Invocation(seed=0)
        with runner.stage(target, dict(candidate.params), arch, artifact.binary) as staged:
            seconds, stdout = timed(staged.argv(invocation), staged.workdir, env={**os.environ, **harness_env(
                invocation)}, timeout=target.spec.timeouts.run)
            figures["bare_s"].append(seconds)
            figures["timed_s"].append(sum(parse_samples(stdout, target.spec.metric)) * unit)
            staged.reset()
            t0 = time.perf_counter()
            run_command(staged.argv(invocation), staged.workdir, target.spec.timeouts.run,
                        own_env=harness_env(invocation), limits=target.spec.limits.for_run(), sandbox=runner.sandbox)
            figures["sandbox_s"].append(time.perf_counter() - t0)
            staged.reset()
            t0 = time.perf_counter()
            result = staged.run(Invocation(seed=0, reference=reference.for_run(0)))
            figures["engine_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            problem = verify_outputs(staged.files, result.stdout, target.spec.verify, reference.for_run(0), frozenset())
            figures["compare_s"].append(time.perf_counter() - t0)
            if problem or not result.ok:
                raise RuntimeError(f"{target.name}: {problem or result.tail()[-500:]}")
        t0 = time.perf_counter()
        job = measure_candidate(target, candidate, artifact, device, reference, 1, runner, max_samples=max_samples)
        figures["job_s"].append(time.perf_counter() - t0)
        if job.status is not Status.OK:
            raise RuntimeError(f"{target.name}: the job: {job.status.value} {job.error_tail[-500:]}")
    runner.close()
    row = {"target": target.name, "repeats": repeats, **{k: median(v) for k, v in figures.items()}}
    row.update({"own_untimed_s": row["bare_s"] - row["context_s"] - row["timed_s"],
                "sandbox_cost_s": row["sandbox_s"] - row["bare_s"],
                "device_clock_s": row["engine_s"] - row["sandbox_s"],
                "job_rest_s": row["job_s"] - row["engine_s"] - row["compare_s"]})
    return row


SPLIT_COLUMNS = (("a job", "job_s"), ("process and context", "context_s"),
                 ("the program's own untimed work", "own_untimed_s"), ("its timed samples", "timed_s"),
                 ("the sandbox", "sandbox_cost_s"), ("the device clock", "device_clock_s"),
                 ("the output compare", "compare_s"), ("the job's rest", "job_rest_s"))


def split_table(rows: list[dict]) -> str:
    head = "| target | " + " | ".join(name for name, _ in SPLIT_COLUMNS) + " |"
    body = ["| " + " | ".join([r["target"], *(f"{1e3 * r[key]:.0f} ms" for _, key in SPLIT_COLUMNS)]) + " |"
            for r in rows]
    return "\n".join([head, "|---" * (len(SPLIT_COLUMNS) + 1) + "|", *body]) + "\n"


def split(config: str, repeats: int, out: Path, max_samples: int, seconds: float) -> None:
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from cluster.config import load_run

    targets = [t for t in load_run(config).targets if t.spec.kind != "kernel"]
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:  # the builds at once: nvcc takes seconds each
        list(pool.map(lambda t: built(t, "process", "search"), targets))  # the compile cache keeps them
    rows, started = [], time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        context = context_program(Path(folder), any(t.spec.toolchain != "cc" for t in targets))
        for target in targets:
            if time.monotonic() - started > seconds:
                print(f"{target.name}: not measured, past --seconds", flush=True)
                continue
            try:
                rows.append(split_runs(target, repeats, context, max_samples))
            except (RuntimeError, OSError) as exc:  # one target that fails is a line, not the end
                print(f"{target.name}: {exc}", flush=True)
                continue
            print(json.dumps(rows[-1]), flush=True)
            (out / "split.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "split.md").write_text(split_table(rows))
    print(split_table(rows))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "suite.yaml"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--actor", action="store_true", help="where a measuring actor's time goes per job")
    parser.add_argument("--max-samples", type=int, default=None,
                        help="samples a job: --actor 10 (a raced candidate), --split the sweep's search cap")
    parser.add_argument("--split", action="store_true", help="where a program target's run second goes")
    parser.add_argument("--seconds", type=float, default=600.0, help="--split: begin no target after this long")
    args = parser.parse_args()
    from cluster.config import load_run

    args.out.mkdir(parents=True, exist_ok=True)
    if args.split:
        from cluster.config.run import SEARCH_SAMPLES

        split(args.config, args.repeats, args.out, args.max_samples or SEARCH_SAMPLES, args.seconds)
        return
    if args.actor:
        samples = args.max_samples or 10
        rows = [actor_jobs(t, "kernel" if t.spec.kind == "kernel" else "persistent", args.repeats, samples)
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
