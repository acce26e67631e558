"""The timing harness's host logic for the kernel runner, in Python: the inputs (``wf::fill_uniform``
to the bit), the stopping rule and the line protocol of cluster/compile/include/warpfleet/
harness_core.hpp, and the output files. Nothing here touches CUDA, so it is tested on any machine;
cluster/runners/kernel.py adds the device side.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cluster.config.kernel import BenchOptions, LaunchPlan, ResolvedArgument

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(seed: int, start: int, count: int) -> np.ndarray:
    """Outputs ``start`` .. ``start + count - 1`` of the splitmix64 generator from state ``seed``."""
    with np.errstate(over="ignore"):
        state = np.uint64(seed) + np.arange(start + 1, start + count + 1, dtype=np.uint64) * _GOLDEN
        z = (state ^ (state >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def fill_uniform(n: int, seed: int, lo: float = -1.0, hi: float = 1.0, dtype: str = "float32",
                 start: int = 0) -> np.ndarray:
    """``wf::fill_uniform`` from position ``start`` of the stream: float32 to the bit (u the top 24
    bits, one rounding as the harness's fma); float64 from the top 53 bits (its last bit may differ
    from the harness's fma); float16 through float32."""
    z = splitmix64(seed, start, n)
    if dtype == "float64":
        u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
        v = (hi - lo) * u + lo
        return np.where(v < hi, v, np.nextafter(hi, lo))
    u = (z >> np.uint64(40)).astype(np.float64) * 2.0**-24
    # (hi - lo) * u + lo is exact in float64 for float32 bounds, so this is one rounding: an fma.
    v = (np.float64(np.float32(hi) - np.float32(lo)) * u + np.float64(np.float32(lo))).astype(np.float32)
    v = np.where(v < np.float32(hi), v, np.nextafter(np.float32(hi), np.float32(lo)))
    return v.astype(np.float32 if dtype == "float32" else dtype)


def host_values(plan: LaunchPlan, seed: int, workdir: Path,
                kept: MutableMapping[tuple, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every argument's and constant's initial values for a run on ``seed``: the uniform arrays take
    consecutive stretches of one stream, in the order arguments then constants (so that inputs
    filled in one program as A then B are filled alike). ``kept``: uniform arrays already generated,
    by what determines them (dtype, shape, bounds, seed, place in the stream), so that plans that
    differ in another argument (an output sized by a param) generate an input once; never written to."""
    values: dict[str, np.ndarray] = {}
    position = 0
    for arg in (*plan.arguments, *plan.constants):
        if arg.fill == "scalar":
            values[arg.name] = np.array(arg.value, dtype=arg.dtype)
        elif arg.fill == "file":
            data = np.load(workdir / str(arg.file), allow_pickle=False)
            values[arg.name] = np.ascontiguousarray(data.reshape(arg.shape) if arg.shape else data, dtype=arg.dtype)
        elif arg.fill == "uniform":
            count = int(np.prod(arg.shape))
            key = (arg.dtype, tuple(arg.shape), arg.lo, arg.hi, seed, position)
            data = kept.get(key) if kept is not None else None
            if data is None:
                data = fill_uniform(count, seed, arg.lo, arg.hi, arg.dtype, position).reshape(arg.shape)
                data.flags.writeable = False
                if kept is not None:
                    kept[key] = data
            values[arg.name] = data
            position += count
        else:
            values[arg.name] = np.full(arg.shape or (), arg.constant, dtype=arg.dtype)
    return values


def write_output(workdir: Path, arg: ResolvedArgument, data: np.ndarray) -> None:
    """``<name>.bin``: the raw values, or for ``compare: sum`` their float64 total (partial sums that
    differ per configuration, whose total must not)."""
    if arg.compare == "sum":
        data = np.array([np.sum(data, dtype=np.float64)])
    (workdir / arg.output_file).write_bytes(np.ascontiguousarray(data).tobytes())


# -- the stopping rule and the protocol lines (harness_core.hpp) -------------------------------

def quartile(sorted_samples: Sequence[float], i: int) -> float:
    """The ``i``-th inclusive quartile (0: the smallest, 4: the largest) of at least 2 samples."""
    s, m = sorted_samples, len(sorted_samples) - 1
    j, delta = i * m // 4, i * m % 4
    return (s[j] * (4 - delta) + s[j + 1] * delta) / 4 if delta else s[j]


def spread(sorted_samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, IQR, noise) as the harness's ``spread_of_sorted``: inclusive quartiles, or the range
    under 4 samples; noise = IQR / median, infinite for a zero median."""
    n = len(sorted_samples)
    if n == 0:
        return 0.0, 0.0, float("inf")
    s = sorted_samples
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    iqr = quartile(s, 3) - quartile(s, 1) if n >= 4 else s[-1] - s[0]
    return median, iqr, iqr / median if median else float("inf")


@dataclass
class Sampling:
    """The samples so far and the stopping rule over them (``detail::Sampling``), with racing:
    given ``stop_above`` (ms), a candidate whose lower quartile after ``min_samples`` samples is
    above it stops there (``raced``): it is slower than the study's best by more than the margin
    that set ``stop_above``, and more samples would only make that certain."""

    options: BenchOptions
    stop_above: float | None = None
    samples: list[float] = field(default_factory=list)
    ordered: list[float] = field(default_factory=list)
    total_s: float = 0.0
    median: float = 0.0
    noise: float = float("inf")
    converged: bool = False
    raced: bool = False

    def add(self, ms: float) -> bool:
        """Records one sample; True when it is time to stop."""
        self.samples.append(ms)
        bisect.insort(self.ordered, ms)
        self.total_s += ms / 1e3
        self.median, _, self.noise = spread(self.ordered)
        o = self.options
        n = len(self.ordered)
        self.converged = n >= o.min_samples and self.total_s >= o.min_time_s and self.noise <= o.max_noise
        if not self.converged and self.stop_above is not None and n >= max(o.min_samples, 2):
            self.raced = quartile(self.ordered, 1) > self.stop_above
        return self.converged or self.raced or n >= o.max_samples or self.total_s >= o.max_time_s


def profile_options(options: BenchOptions) -> BenchOptions:
    """One launch, no warm-up: what the harness does under WARPFLEET_PROFILE (ncu, compute-sanitizer)."""
    return options.model_copy(update={"min_samples": 1, "min_time_s": 0.0, "warmup": 0, "max_samples": 1})


def capped_options(options: BenchOptions, max_samples: int) -> BenchOptions:
    """At most ``max_samples`` samples (the search's cap, ``Invocation.max_samples``): the rule's
    hard stop lowered there, and its minimum with it, as the harness's WARPFLEET_MAX_SAMPLES does."""
    cap = max(1, max_samples)
    return options.model_copy(update={"max_samples": min(options.max_samples, cap),
                                      "min_samples": min(options.min_samples, cap)})


def sample_line(ms: float) -> str:
    return f"@warpfleet time_ms={ms:.9g}\n"


def summary_line(sampling: Sampling, start: float, end: float) -> str:
    raced = " raced=1" if sampling.raced else ""
    return (f"@warpfleet samples={len(sampling.samples)} median_ms={sampling.median:.9g} noise={sampling.noise:.6g} "
            f"converged={int(sampling.converged)}{raced} region_start_unix={start:.9f} region_end_unix={end:.9f}\n")


BATCH_S = 0.002  # kernel time enqueued between two waits for the GPU, once a sample's length is known
MAX_BATCH = 64


def bench(options: BenchOptions, sample_batch: Callable[[int], Sequence[float]], write: Callable[[str], None],
          stop_above: float | None = None) -> Sampling:
    """Samples until the stopping rule says stop, writing each sample's line and the summary line
    marking the timed region. ``sample_batch(k)``: ``k`` flushed, timed launches enqueued back to
    back and waited for once (milliseconds each): one wait a sample would leave the GPU idle while
    the host asks for the next. The first batch is one sample; then about ``BATCH_S`` of kernel time,
    never past ``max_samples``. The rule is applied sample by sample, and samples after the one it
    stopped at are dropped: the statistics are those of one sample at a time."""
    sampling = Sampling(options, stop_above)
    start = time.time()
    batch = 1
    while True:
        for ms in sample_batch(batch):
            write(sample_line(ms))
            if sampling.add(ms):
                write(summary_line(sampling, start, time.time()))
                return sampling
        per_sample_s = max(sampling.median, 1e-6) / 1e3
        batch = max(1, min(MAX_BATCH, int(BATCH_S / per_sample_s), options.max_samples - len(sampling.samples)))
