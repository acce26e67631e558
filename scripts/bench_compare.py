"""The output compare's cost per run: ``cluster.core.compare.compare`` against ``np.isclose`` on
whole float64 copies (what it did before 2026-11-26), on one float32 output of ``--values`` values,
bitwise equal to the baseline's and only close to it. Medians of ``--repeat`` calls, after one warm-up.

    python scripts/bench_compare.py [--values 16777216] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.core.compare import compare


def isclose_whole(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> bool:
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    return bool(np.isfinite(got64).all() and np.isclose(got64, want64, rtol=rtol, atol=atol).all())


def median_ms(call, repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=4096 * 4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    want = np.random.default_rng(0).random(args.values, dtype=np.float32)
    cases = {"bitwise equal": want.copy(), "close (1e-7 off)": want + np.float32(1e-7)}
    print(f"{args.values} float32 values ({args.values * 4 / 2**20:.0f} MiB); median ms of {args.repeat}")
    print("| output | np.isclose, whole float64 copies | compare | ratio |")
    print("|---|---|---|---|")
    for name, got in cases.items():
        old = median_ms(lambda got=got: isclose_whole(got, want, 1e-4, 1e-5), args.repeat)
        new = median_ms(lambda got=got: compare("out", got, want, 1e-4, 1e-5), args.repeat)
        print(f"| {name} | {old:.1f} | {new:.1f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
