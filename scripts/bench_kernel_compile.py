"""Compile time per candidate on the four comparison kernels: NVRTC and ``nvcc -cubin`` for a kernel
target, and the whole program that the program lane builds with nvcc, each cold (no cache), each
in the node's sandbox as a sweep compiles them (NVRTC in the worker's compile host); and NVRTC in
this process, outside any sandbox, for what the sandbox costs.

    python scripts/bench_kernel_compile.py [--configs 6] [--arch sm_90] [--out FILE.md]

What chose the kernel targets' default compiler (BENCHMARKS.md, "Kernel targets"). CPU only.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cluster.compile import kernel as kernel_build  # noqa: E402
from cluster.compile.build import compile_candidate  # noqa: E402
from cluster.compile.kernel import nvcc_version, nvrtc_version  # noqa: E402
from cluster.config import load_target  # noqa: E402
from cluster.core.types import Candidate, Status  # noqa: E402
from cluster.sandbox.sandbox import scratch_dir, write_bundle  # noqa: E402
from scripts.kt_compare.kernel_targets import write_wf_kernel_target  # noqa: E402
from scripts.kt_compare.spaces import KERNEL_SPACES, write_wf_target  # noqa: E402


def timed(target, params: dict, arch: str, scratch: Path) -> float:
    candidate = Candidate(target.name, "nvcc", "bench", arch, target.bundle.hash, (), tuple(params.items()))
    shutil.rmtree(kernel_build.cache_dir(scratch), ignore_errors=True)  # a cold compile
    start = time.perf_counter()
    artifact = compile_candidate(target, candidate, scratch)  # the scratch root (and compile host) kept
    seconds = time.perf_counter() - start
    if artifact.status is not Status.OK:
        raise SystemExit(f"{target.name} {params}: {artifact.status.value}: {artifact.error_tail[-500:]}")
    return seconds


def timed_in_process(target, params: dict, arch: str, scratch: Path) -> float:
    """NVRTC in this process, as kernel targets compiled before the sandbox took them."""
    candidate = Candidate(target.name, "nvcc", "bench", arch, target.bundle.hash, (), tuple(params.items()))
    start = time.perf_counter()
    plan = target.spec.kernel.plan(dict(candidate.params))
    options = kernel_build.kernel_options(target, candidate, plan)
    with scratch_dir(scratch, "inproc-") as workdir:
        write_bundle(target.bundle.files, workdir)
        kernel_build.compile_nvrtc(workdir / target.spec.sources[0], plan.kernel, options, workdir)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=6, help="configurations per kernel, spread over the space")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wf-compile-bench-"))
    rows = [f"NVRTC: {nvrtc_version()}; nvcc: {nvcc_version()}; {args.configs} configurations per kernel, "
            f"median seconds per candidate, cold", "",
            "| kernel | NVRTC (kernel target) | NVRTC in-process, no sandbox | nvcc -cubin (kernel target) "
            "| nvcc program (program target) |",
            "|---|---|---|---|---|"]
    scratch = work / "scratch"
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
            lanes[compiler] = [timed(target, c, args.arch, scratch) for c in picked]
            if compiler == "nvrtc":
                lanes["in-process"] = [timed_in_process(target, c, args.arch, scratch) for c in picked]
        program = load_target(write_wf_target(space, work / f"{name}-program", ["--min-time", "0.05"]))
        lanes["program"] = [timed(program, c, args.arch, scratch) for c in picked]
        rows.append(f"| {name} | " + " | ".join(f"{statistics.median(lanes[k]):.3f}"
                                               for k in ("nvrtc", "in-process", "nvcc", "program")) + " |")
        print(rows[-1], flush=True)
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
