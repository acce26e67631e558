"""What the device clock (CUPTI's activity records through the injected library) costs a run
(goal: at most 5% of a run's time).

Builds each target's baseline and runs it ``--repeat`` times with the device clock and as many
without, interleaved (with, without, with, ...), through the runner a sweep would take for it (a
process per run, or the persistent host: a host of each kind kept for all its runs, as a worker
keeps one). Reports per target and runner the median wall time a run took each way, the difference
as a share of the run without, the median sample the program printed each way (whether the records
disturb the timed kernels) and the device's busy time a run by the record.

    python scripts/bench_device_clock.py [--repeat 10] [--json OUT.json] [TARGET.yaml ...]

Default targets: the suite's multikernel (eight small kernels a sample, the most launches a
millisecond) and saxpy (a process per run), each sample time-based by the harness.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.measure import parse_samples
from cluster.platform.devices import gpu_device
from cluster.runners._base import Invocation, ProcessRunner
from cluster.runners.device_clock import DeviceClock, build_library
from cluster.runners.persistent import PersistentRunner
from cluster.toolchains import get_toolchain

REPO = Path(__file__).resolve().parent.parent
DEFAULT = [REPO / "configs/targets/multikernel/target.yaml", REPO / "configs/targets/saxpy/target.yaml"]


def bench(path: Path, repeat: int, clock: DeviceClock) -> dict:
    target = load_target(path)
    device = gpu_device(0, "bench")
    candidate = Candidate(target.name, "nvcc", device.device_type, get_toolchain("nvcc").arch_for(device),
                          target.bundle.hash, tuple(target.baseline_flags.items()),
                          tuple(target.baseline_params.items()), Phase.BASELINE, runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    make = (lambda c: PersistentRunner(cuda=True, device_clock=c)) if target.runner == "persistent" else (
        lambda c: ProcessRunner(device_clock=c))
    runners = {"with": make(clock), "without": make(None)}
    walls: dict[str, list[float]] = {"with": [], "without": []}
    samples: dict[str, list[float]] = {"with": [], "without": []}
    busy: list[float] = []
    with contextlib.ExitStack() as stack:
        for runner in runners.values():
            stack.callback(runner.close)
        staged = {way: stack.enter_context(runner.stage(target, dict(candidate.params), candidate.arch,
                                                        artifact.binary)) for way, runner in runners.items()}
        for way in runners:  # a first run each, left out: a host's start, the driver's caches
            staged[way].run(Invocation(seed=0))
        for i in range(repeat):
            for way in ("with", "without") if i % 2 == 0 else ("without", "with"):
                staged[way].reset()
                result = staged[way].run(Invocation(seed=0))
                assert result.ok, result.tail()
                walls[way].append(result.seconds)
                samples[way].append(statistics.median(parse_samples(result.stdout, target.spec.metric)))
                if way == "with" and result.device is not None:
                    busy.append(result.device.busy_s)
    wall = {way: statistics.median(v) for way, v in walls.items()}
    return {"target": target.name, "runner": target.runner, "runs_each": repeat,
            "wall_ms": {w: round(1e3 * v, 2) for w, v in wall.items()},
            "added_ms": round(1e3 * (wall["with"] - wall["without"]), 2),
            "added_share": round((wall["with"] - wall["without"]) / wall["without"], 4),
            "sample_ms": {w: round(statistics.median(v), 5) for w, v in samples.items()},
            "device_busy_ms": round(1e3 * statistics.median(busy), 2) if busy else None,
            "records_complete": len(busy) == repeat}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    library, why = build_library()
    if library is None:
        sys.exit(f"no device clock: {why}")
    results = [bench(path, args.repeat, DeviceClock(library)) for path in args.targets]
    for r in results:
        print(f"{r['target']:12} {r['runner']:10} run {r['wall_ms']['without']:8.1f} ms, +{r['added_ms']:6.2f} ms "
              f"({100 * r['added_share']:+.2f}%) with the device clock; sample {r['sample_ms']['without']} ms vs "
              f"{r['sample_ms']['with']} ms; device busy {r['device_busy_ms']} ms a run", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"library": str(library), "results": results}, indent=1))


if __name__ == "__main__":
    main()
