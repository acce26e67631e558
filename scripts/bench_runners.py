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


def runs(target, runner_name: str, repeats: int) -> list[dict]:
    from cluster.core.registry import RUNNERS
    from cluster.core.types import Candidate, Phase, Status
    from cluster.runners._base import Invocation
    from cluster.runners.build import compile_candidate
    from cluster.runners.devices import gpu_device
    from cluster.runners.measure import _run_outputs, harness_region, verify_outputs
    from cluster.toolchains import get_toolchain

    device = gpu_device(0, "bench")
    arch = get_toolchain(target.spec.toolchain).arch_for(device)
    candidate = Candidate(target.name, target.spec.toolchain, device.device_type, arch, target.bundle.hash,
                          tuple(target.space.baseline.items()), tuple(target.baseline_params.items()),
                          Phase.BASELINE, runner=runner_name)
    artifact = compile_candidate(target, candidate)
    if artifact.status is not Status.OK:
        raise RuntimeError(f"{target.name} ({runner_name}) did not build: {artifact.error_tail[-500:]}")
    runner = RUNNERS.load(runner_name)(cuda=True) if runner_name != "process" else RUNNERS.load("process")()
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


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=str(REPO / "configs" / "suite.yaml"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from cluster.config import load_run

    args.out.mkdir(parents=True, exist_ok=True)
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
