"""What the sandbox adds to each build and run of a candidate (issue 16; goal: at most 20 ms).

Times ``run_command`` bare (``Unsandboxed``: rlimits and a new session, what ran before) and in
this node's bubblewrap sandbox, interleaved, on three commands: ``true``, a small C program's run
(it writes its output file and prints the metric), and that program's build with ``cc -O2``. Each
command gets a fresh scratch directory and a target's default limits, as in a sweep. ``--cuda``
(on a GPU node) adds a small CUDA program's run (a context, a kernel, its output file written) and
its build with nvcc, the sandbox binding the NVIDIA device nodes as on a GPU worker.

    python scripts/bench_sandbox.py [--repeat 200] [--ballast-mb 0] [--cuda] [--json OUT.json]

``--ballast-mb`` makes this process as large as a Ray worker before it forks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.config import LimitsSpec, SandboxSpec
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import Sandbox, Unsandboxed, run_command, scratch_dir, write_bundle

PROGRAM = rb"""
#include <stdio.h>
int main(void) {
    float v[1024];
    for (int i = 0; i < 1024; i++) v[i] = (float)i;
    FILE *f = fopen("out.bin", "wb");
    fwrite(v, sizeof v, 1, f);
    fclose(f);
    printf("@warpfleet time_ms=1.5\n");
    return 0;
}
"""

CUDA_PROGRAM = rb"""
#include <stdio.h>
__global__ void fill(float *v, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) v[i] = 2.0f * i; }
int main(void) {
    const int n = 1 << 20;
    float *d, *h = (float *)malloc(n * sizeof(float));
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return 3;
    fill<<<n / 256, 256>>>(d, n);
    if (cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return 4;
    FILE *f = fopen("out.bin", "wb");
    fwrite(h, sizeof(float), n, f);
    fclose(f);
    printf("@warpfleet time_ms=1.5\n");
    return 0;
}
"""


def time_one(sandbox: Sandbox, case: str, binaries: dict[str, bytes]) -> float:
    """One command in a fresh scratch directory holding the target's files and the built binary."""
    limits = LimitsSpec()
    with scratch_dir(None, f"bench-{case}-") as workdir:
        source, binary = ("tiny.cu", binaries["cuda"]) if case.startswith("cuda") else ("tiny.c", binaries["c"])
        write_bundle([(source, CUDA_PROGRAM if case.startswith("cuda") else PROGRAM), ("candidate.bin", binary)],
                     workdir)
        (workdir / "candidate.bin").chmod(0o755)
        out = str(workdir / "candidate.bin")
        argv = {"true": ["true"], "run": [out], "build": ["cc", "-O2", "-o", out, "tiny.c"],
                "cuda_run": [out], "cuda_build": ["nvcc", "-O2", "-o", out, "tiny.cu"]}[case]
        start = time.perf_counter()
        build = case.endswith("build")
        result = run_command(argv, workdir, 120, limits=limits.for_build() if build else limits.for_run(),
                             sandbox=sandbox)
        seconds = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"{case} failed in {sandbox.name}: {result.tail()}")
    return seconds * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--ballast-mb", type=int, default=0)
    parser.add_argument("--cuda", action="store_true", help="also a CUDA program's run and nvcc build (GPU node)")
    parser.add_argument("--json")
    args = parser.parse_args()
    ballast = bytearray(args.ballast_mb << 20)
    ballast[::4096] = b"\1" * len(ballast[::4096])  # touched: the pages are really there to copy at fork
    sandboxes: dict[str, Sandbox] = {"bare": Unsandboxed(), "bwrap": start_bubblewrap(SandboxSpec(), gpu=args.cuda)}
    print(sandboxes["bwrap"].describe())  # type: ignore[attr-defined]
    binaries = {}
    with scratch_dir(None, "bench-bin-") as bindir:
        write_bundle([("tiny.c", PROGRAM), ("tiny.cu", CUDA_PROGRAM)], bindir)
        builds = {"c": ["cc", "-O2", "-o", "c.bin", "tiny.c"], "cuda": ["nvcc", "-O2", "-o", "cuda.bin", "tiny.cu"]}
        for kind, argv in builds.items():
            if kind == "cuda" and not args.cuda:
                continue
            built = run_command(argv, bindir, 120)
            assert built.ok, built.tail()
            binaries[kind] = (bindir / f"{kind}.bin").read_bytes()
    cases = ("true", "run", "build") + (("cuda_run", "cuda_build") if args.cuda else ())
    times: dict[str, dict[str, list[float]]] = {case: {n: [] for n in sandboxes} for case in cases}
    for case, by_name in times.items():
        repeat = max(1, args.repeat // 4) if case == "cuda_build" else args.repeat  # nvcc: a second a build
        for _ in range(repeat):
            for name, sandbox in sandboxes.items():  # interleaved: the machine's drift hits both
                by_name[name].append(time_one(sandbox, case, binaries))
    report = {}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; milliseconds per command")
    print(f"{'command':10} {'bare median':>12} {'bwrap median':>13} {'added':>8} {'bare min':>9} {'bwrap min':>10} "
          f"{'bare p90':>9} {'bwrap p90':>10}")
    for case, by_name in times.items():
        bare, boxed = by_name["bare"], by_name["bwrap"]
        row = {"bare_median_ms": statistics.median(bare), "bwrap_median_ms": statistics.median(boxed),
               "bare_min_ms": min(bare), "bwrap_min_ms": min(boxed), "bare_p90_ms": _p90(bare),
               "bwrap_p90_ms": _p90(boxed)}
        row["added_median_ms"] = row["bwrap_median_ms"] - row["bare_median_ms"]
        report[case] = row
        widths = {"bare_median_ms": 12, "bwrap_median_ms": 13, "added_median_ms": 8, "bare_min_ms": 9,
                  "bwrap_min_ms": 10, "bare_p90_ms": 9, "bwrap_p90_ms": 10}
        print(f"{case:10} " + " ".join(f"{row[key]:{width}.2f}" for key, width in widths.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"repeat": args.repeat, "ballast_mb": args.ballast_mb,
                                               "load_average": os.getloadavg()[0], "cases": report}, indent=2) + "\n")


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


if __name__ == "__main__":
    main()
