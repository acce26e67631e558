"""The kernel runner's host logic (cluster/runners/kernel_harness.py) against the C++ harness's:
inputs to the bit, the stopping rule, the protocol lines that measure.py reads."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.config import MetricSpec
from cluster.config.kernel import BenchOptions, LaunchPlan, ResolvedArgument
from cluster.measure.measure import harness_region, metric_problem, parse_samples
from cluster.runners.kernel_harness import (
    MAX_BATCH,
    Sampling,
    bench,
    fill_uniform,
    host_values,
    profile_options,
    spread,
    write_output,
)
from scripts.kt_compare.spaces import fill_uniform as numpy_reference


def test_fill_uniform_is_the_harness_generator():
    # scripts/kt_compare/spaces.py's fill_uniform is checked bit for bit against wf::fill_uniform.
    for seed, lo, hi in ((0, -1.0, 1.0), (7, 0.0, 1.0), (2**40 + 3, -3.5, 10.0)):
        want = numpy_reference(5000, seed, lo, hi)
        got = fill_uniform(5000, seed, lo, hi)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    doubles = fill_uniform(1000, 3, -1.0, 1.0, "float64")
    assert doubles.dtype == np.float64 and doubles.min() >= -1.0 and doubles.max() < 1.0


def _array(name, n, fill="uniform", **kw):
    return ResolvedArgument(name, kw.pop("dtype", "float32"), (n,), fill=fill, **kw)


def test_uniform_inputs_continue_one_stream_in_argument_order(tmp_path):
    # as matmul.cu fills A then B: one stream, so one program's inputs and a kernel target's agree
    plan = LaunchPlan("k", (1, 1, 1), (1, 1, 1), 0, (),
                      (_array("c", 8, "constant", constant=0.5, output=True), _array("a", 100, lo=-1, hi=1),
                       ResolvedArgument("n", "int32", None, 100, "scalar"), _array("b", 50, lo=0, hi=2)),
                      (_array("w", 9, lo=-1, hi=1),))
    values = host_values(plan, 11, tmp_path)
    stream = numpy_reference(159, 11)  # a, then b (its own range), then the constant symbol w
    assert np.array_equal(values["a"], stream[:100])
    assert np.array_equal(values["b"], numpy_reference(159, 11, 0.0, 2.0)[100:150])
    assert np.array_equal(values["w"], stream[150:])
    assert values["c"].tolist() == [0.5] * 8 and values["n"].dtype == np.int32 and int(values["n"]) == 100
    assert not np.array_equal(host_values(plan, 12, tmp_path)["a"], values["a"])  # fresh inputs per seed


def test_kept_inputs_are_generated_once_across_plans_that_differ_in_an_output(tmp_path):
    """A param that sizes only an output (a reduction's partial sums) reuses the input generated for
    another plan; the kept arrays are the uncached ones, read-only; another seed or place in the
    stream is another array."""
    def plan(partials):
        return LaunchPlan("k", (1, 1, 1), (1, 1, 1), 0, (),
                          (_array("x", 1000, lo=-1, hi=1), _array("out", partials, "constant", constant=0.0,
                                                                  output=True)))

    kept: dict = {}
    first = host_values(plan(4), 3, tmp_path, kept)
    second = host_values(plan(16), 3, tmp_path, kept)
    assert second["x"] is first["x"] and len(kept) == 1 and second["out"].shape == (16,)
    assert np.array_equal(first["x"], host_values(plan(4), 3, tmp_path)["x"]) and not first["x"].flags.writeable
    assert host_values(plan(4), 4, tmp_path, kept)["x"] is not first["x"] and len(kept) == 2


def test_file_inputs_are_read_and_shaped(tmp_path):
    np.save(tmp_path / "w.npy", np.arange(6, dtype=np.float64))
    plan = LaunchPlan("k", (1, 1, 1), (1, 1, 1), 0, (),
                      (ResolvedArgument("w", "float32", (2, 3), fill="file", file="w.npy"),))
    w = host_values(plan, 0, tmp_path)["w"]
    assert w.shape == (2, 3) and w.dtype == np.float32 and w[1, 2] == 5.0


def test_spread_is_the_harness_statistics():
    import statistics

    samples = sorted([1.0, 1.2, 0.9, 1.1, 5.0, 1.05, 0.95])
    median, iqr, noise = spread(samples)
    q = statistics.quantiles(samples, n=4, method="inclusive")
    assert median == statistics.median(samples) and iqr == pytest.approx(q[2] - q[0]) and noise == iqr / median
    assert spread([2.0, 3.0]) == (2.5, 1.0, 0.4)  # under 4 samples: the range


@pytest.mark.parametrize(("options", "samples", "count", "converged"), [
    (BenchOptions(min_time_s=0.0), [1.0] * 50, 10, True),  # min_samples, noise 0
    (BenchOptions(min_time_s=0.05), [1.0] * 100, 50, True),  # 50 x 1 ms = the minimum time
    (BenchOptions(min_time_s=0.0, max_samples=30), [1.0, 2.0] * 50, 30, False),  # never quiet: the cap
    (BenchOptions(min_time_s=0.0, max_time_s=0.1), [30.0, 60.0] * 5, 3, False),  # the time cap
])
def test_the_stopping_rule(options, samples, count, converged):
    sampling = Sampling(options)
    taken = 0
    for ms in samples:
        taken += 1
        if sampling.add(ms):
            break
    assert taken == count and sampling.converged is converged


def test_bench_prints_the_protocol_that_measure_reads():
    lines: list[str] = []
    times = iter([0.5] + [0.25] * 100)  # the rule stops at 4: the rest of the batch is dropped
    sampling = bench(BenchOptions(min_samples=4, min_time_s=0.0, max_noise=1.0),
                     lambda k: [next(times) for _ in range(k)], lines.append)
    stdout = "".join(lines)
    assert parse_samples(stdout, MetricSpec()) == [0.5, 0.25, 0.25, 0.25] and sampling.converged
    start, end, count = harness_region(stdout)
    assert count == 4 and start <= end
    assert metric_problem(parse_samples(stdout, MetricSpec()), MetricSpec()) is None
    one = profile_options(BenchOptions())
    assert (one.min_samples, one.max_samples, one.warmup, one.min_time_s) == (1, 1, 0, 0.0)


@pytest.mark.parametrize(("stop_above", "raced", "count"), [
    (1.5, True, 10),  # every sample 2 ms against a bound of 1.5: lost after min_samples
    (2.5, False, 40),  # under the bound: the stopping rule decides (max_samples here)
    (None, False, 40),  # no bound: no racing
])
def test_racing_stops_a_clear_loser_after_min_samples(stop_above, raced, count):
    sampling = Sampling(BenchOptions(min_time_s=0.0, max_samples=40), stop_above)
    taken = 0
    for ms in [2.0, 2.2] * 100:
        taken += 1
        if sampling.add(ms):
            break
    assert (taken, sampling.raced, sampling.converged) == (count, raced, False)


def test_racing_takes_the_lower_quartile_and_gives_way_to_convergence():
    # Half the samples under the bound: the lower quartile is too, so the candidate is not a clear loser.
    sampling = Sampling(BenchOptions(min_time_s=0.0, max_samples=12), stop_above=1.5)
    assert not any(sampling.add(ms) for ms in [1.0, 3.0] * 5) and not sampling.raced
    # Converged (no noise) above the bound: a converged row, not a raced one.
    sampling = Sampling(BenchOptions(min_time_s=0.0), stop_above=1.5)
    assert [sampling.add(2.0) for _ in range(10)][-1] and sampling.converged and not sampling.raced


def test_bench_batches_samples_without_changing_the_rule():
    """Batches grow once a sample's length is known, never past max_samples; what the rule keeps
    is what one sample at a time would have kept, and the lines say it."""
    import random

    rng = random.Random(7)
    stream = [0.01 * (1 + 0.1 * rng.random()) for _ in range(5000)]
    options = BenchOptions(min_time_s=0.0, max_samples=300)
    sequential = Sampling(options)
    for ms in stream:
        if sequential.add(ms):
            break
    asked: list[int] = []
    position = 0

    def sample_batch(k: int) -> list[float]:
        nonlocal position
        asked.append(k)
        position += k
        return stream[position - k:position]

    lines: list[str] = []
    batched = bench(options, sample_batch, lines.append)
    assert batched.samples == sequential.samples and len(batched.samples) == 300
    assert asked[0] == 1 and max(asked) == MAX_BATCH and sum(asked) == 300  # never past max_samples
    assert parse_samples("".join(lines), MetricSpec()) == pytest.approx(sequential.samples, rel=1e-8)
    # A loser stops within its batch: the samples after the one that decided are dropped.
    raced = bench(BenchOptions(min_time_s=0.0), lambda k: ([0.5, 0.6] * k)[:k], lines.append, stop_above=0.4)
    assert raced.raced and len(raced.samples) == 10 and lines[-1].count(" raced=1 ") == 1


def test_outputs_as_files(tmp_path):
    values = np.array([1.5, 2.5, -1.0], dtype=np.float32)
    write_output(tmp_path, _array("c", 3, "constant", output=True), values)
    assert np.array_equal(np.fromfile(tmp_path / "c.bin", dtype=np.float32), values)
    write_output(tmp_path, _array("p", 3, "constant", output=True, compare="sum"), values)
    assert np.fromfile(tmp_path / "p.bin", dtype=np.float64).tolist() == [3.0]


def test_capped_options_lower_the_hard_stop_and_the_minimum_only():
    from cluster.runners.kernel_harness import capped_options

    rule = BenchOptions(min_samples=10, max_samples=1000, min_time_s=0.5)
    assert (capped_options(rule, 100).min_samples, capped_options(rule, 100).max_samples) == (10, 100)
    assert (capped_options(rule, 3).min_samples, capped_options(rule, 3).max_samples) == (3, 3)
    assert capped_options(rule, 5000).max_samples == 1000  # a cap never raises the rule's own
    assert capped_options(rule, 100).min_time_s == 0.5 and rule.max_samples == 1000  # a copy
