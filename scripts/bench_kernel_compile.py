"""Compile time per candidate on the four comparison kernels: NVRTC and ``nvcc -cubin`` for a kernel
target, and the whole program that the program lane builds with nvcc, each cold (no cache).

    python scripts/bench_kernel_compile.py [--configs 6] [--arch sm_90] [--out FILE.md]

What chose the kernel targets' default compiler (BENCHMARKS.md, "Kernel targets"). CPU only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cluster.config import load_target  # noqa: E402
from cluster.core.types import Candidate, Status  # noqa: E402
from cluster.runners.build import compile_candidate  # noqa: E402
from cluster.runners.kernel_build import nvcc_version, nvrtc_version  # noqa: E402
from scripts.kt_compare.kernel_targets import write_wf_kernel_target  # noqa: E402
from scripts.kt_compare.spaces import KERNEL_SPACES, write_wf_target  # noqa: E402


def timed(target, params: dict, arch: str) -> float:
    candidate = Candidate(target.name, "nvcc", "bench", arch, target.bundle.hash, (), tuple(params.items()))
    with tempfile.TemporaryDirectory(prefix="wf-compile-") as scratch:  # a fresh cache: a cold compile
        start = time.perf_counter()
        artifact = compile_candidate(target, candidate, Path(scratch))
        seconds = time.perf_counter() - start
    if artifact.status is not Status.OK:
        raise SystemExit(f"{target.name} {params}: {artifact.status.value}: {artifact.error_tail[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=6, help="configurations per kernel, spread over the space")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wf-compile-bench-"))
    rows = [f"NVRTC: {nvrtc_version()}; nvcc: {nvcc_version()}; {args.configs} configurations per kernel, "
            f"median seconds per candidate, cold", "",
            "| kernel | NVRTC (kernel target) | nvcc -cubin (kernel target) | nvcc program (program target) |",
            "|---|---|---|---|"]
    for name, space in KERNEL_SPACES.items():
        configs = space.configs()
        picked = [configs[i * len(configs) // args.configs] for i in range(args.configs)]
        lanes = {}
        for compiler in ("nvrtc", "nvcc"):
            path = write_wf_kernel_target(space, work / f"{name}-{compiler}", 0.05)
            text = path.read_text().replace("toolchain: nvcc\n", "toolchain: nvcc\n", 1)
            path.write_text(text.replace("  name: ", f"  compiler: {compiler}\n  name: ", 1))
            target = load_target(path)
            assert target.spec.kernel and target.spec.kernel.compiler == compiler
            lanes[compiler] = [timed(target, c, args.arch) for c in picked]
        program = load_target(write_wf_target(space, work / f"{name}-program", ["--min-time", "0.05"]))
        lanes["program"] = [timed(program, c, args.arch) for c in picked]
        rows.append(f"| {name} | " + " | ".join(f"{statistics.median(lanes[k]):.3f}"
                                               for k in ("nvrtc", "nvcc", "program")) + " |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
