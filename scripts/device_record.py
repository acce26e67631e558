#!/usr/bin/env python3
"""What the device clock sees, run by run, for a target's baseline and candidates run in turn:
the samples a run printed (how many, their sum and median), the run's wall time, and the device's
record (busy, kernels' busy, kernels' span). To see why a claim was or was not borne out.

    scripts/device_record.py TARGET_YAML [--flags "-Xptxas -O1"] [--define K=V ...]
        [--patch FILE.diff ...] [--runs 4] [--max-samples N] [--json OUT]

Each ``--patch`` is applied to a copy of the target's folder (``patch -p1``) and built as one more
candidate; ``--flags``/``--define`` make one more of the baseline's source. Runs through the process
runner without the sandbox; the device's columns need a GPU target on a node with CUPTI (elsewhere,
a CPU target for one, they are left empty).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.errors import ConfigError
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.clock import seconds_per_unit
from cluster.measure.measure import parse_samples
from cluster.runners._base import Invocation, ProcessRunner
from cluster.runners.device_clock import DeviceClock, build_library
from cluster.toolchains import get_toolchain


def _candidate(target, device, flags: str = "", defines: dict | None = None) -> Candidate:
    toolchain = get_toolchain(target.spec.toolchain)
    values = {**target.baseline_params, **(defines or {})}
    flag_items = tuple(target.baseline_flags.items()) + ((("extra", flags),) if flags else ())
    return Candidate(target.name, target.spec.toolchain, device.device_type, toolchain.arch_for(device),
                     target.bundle.hash, flag_items, tuple(values.items()), Phase.SEARCH, runner=target.runner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target")
    parser.add_argument("--flags", default="")
    parser.add_argument("--define", action="append", default=[])
    parser.add_argument("--patch", action="append", default=[])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from cluster.platform.devices import cpu_device, gpu_device
    try:
        base_target = load_target(Path(args.target))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gpu = get_toolchain(base_target.spec.toolchain).device_kind == "gpu"
    device = gpu_device(0, "diag") if gpu else cpu_device("diag")
    library, why = build_library() if gpu else (None, "a CPU target")
    if library is None:
        print(f"no device clock ({why}): the device's columns stay empty", file=sys.stderr)
    runner = ProcessRunner(None, device_clock=DeviceClock(library) if library else None)
    builds = [("baseline", base_target, _candidate(base_target, device))]
    if args.flags or args.define:
        defines = dict(d.split("=", 1) for d in args.define)
        builds.append(("flags", base_target, _candidate(base_target, device, args.flags, defines)))
    # Beside the target's folder: its links to shared folders (``shared:``) lead where they did.
    home = Path(args.target).resolve().parent
    copies = [Path(tempfile.mkdtemp(prefix=f".wf-diag-{home.name}-", dir=home.parent)) for _ in args.patch]
    for folder, patch in zip(copies, args.patch, strict=True):
        shutil.copytree(home, folder, symlinks=True, dirs_exist_ok=True)
        subprocess.run(["patch", "-p1", "-d", str(folder), "-i", str(Path(patch).resolve())], check=True)
        target = load_target(folder / Path(args.target).name)
        builds.append((Path(patch).stem, target, _candidate(target, device)))
    built = []
    for name, target, candidate in builds:
        artifact = compile_candidate(target, candidate)
        if artifact.status is not Status.OK:
            print(f"{name}: {artifact.status.value}: {artifact.error_tail[-400:]}", file=sys.stderr)
            return 1
        built.append((name, target, candidate, artifact))
    unit = seconds_per_unit(base_target.spec.metric) or 1.0
    rows = []
    for index in range(args.runs):
        for name, target, candidate, artifact in built:
            with runner.stage(target, dict(candidate.params), candidate.arch, artifact.binary) as staged:
                result = staged.run(Invocation(seed=index, max_samples=args.max_samples))
            samples = parse_samples(result.stdout, target.spec.metric)
            record = result.device
            row = {"name": name, "run": index, "ok": result.ok, "n": len(samples),
                   "sum_ms": 1e3 * unit * sum(samples), "median": statistics.median(samples) if samples else None,
                   "wall_ms": 1e3 * result.seconds,
                   "busy_ms": 1e3 * record.busy_s if record else None,
                   "kernel_ms": 1e3 * record.kernel_s if record and record.kernel_s is not None else None,
                   "span_ms": 1e3 * record.span_s if record and record.span_s is not None else None,
                   "records": record.records if record else None}
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    for folder in copies:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
