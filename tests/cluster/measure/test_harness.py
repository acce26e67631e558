"""The CUDA timing harness (cluster/compile/include/warpfleet): its pure logic through a g++-built driver,
its builds through nvcc (compile only), and the example target on a GPU where there is one."""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cluster.compile.build import HARNESS_INCLUDE
from cluster.config import MetricSpec
from cluster.core.types import Stats
from cluster.measure.measure import harness_region, parse_samples
from tests.conftest import gpu_present, needs

INCLUDE = HARNESS_INCLUDE
EXAMPLE = INCLUDE / "warpfleet" / "example.cu"
NVCC_FLAGS = ["-std=c++17", f"-I{INCLUDE}", "-Xcompiler", "-Wall,-Wextra", "-Werror", "all-warnings"]

# Drives harness_core.hpp from the command line: one subcommand per piece of logic, numbers
# printed with %.17g so that Python sees the exact doubles.
DRIVER = r"""
#include <warpfleet/harness_core.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::vector<double> numbers(int argc, char** argv, int from) {
  std::vector<double> v;
  for (int i = from; i < argc; ++i) v.push_back(std::strtod(argv[i], nullptr));
  return v;
}

int main(int argc, char** argv) {
  const std::string cmd = argv[1];
  if (cmd == "spread") {  // spread v...: median iqr noise q1 q3
    std::vector<double> v = numbers(argc, argv, 2);
    std::sort(v.begin(), v.end());
    const wf::detail::Spread s = wf::detail::spread_of_sorted(v);
    std::printf("%.17g %.17g %.17g", s.median, s.iqr, s.noise);
    if (v.size() >= 2)
      std::printf(" %.17g %.17g", wf::detail::inclusive_quartile(v, 1), wf::detail::inclusive_quartile(v, 3));
    std::printf("\n");
  } else if (cmd == "stop") {  // stop min_samples min_time max_noise max_samples max_time samples total noise
    wf::Options o;
    o.min_samples = std::atoi(argv[2]);
    o.min_time_s = std::strtod(argv[3], nullptr);
    o.max_noise = std::strtod(argv[4], nullptr);
    o.max_samples = std::atoi(argv[5]);
    o.max_time_s = std::strtod(argv[6], nullptr);
    const wf::detail::Stop s = wf::detail::stop_decision(
        o, std::strtoul(argv[7], nullptr, 10), std::strtod(argv[8], nullptr), std::strtod(argv[9], nullptr));
    const char* names[] = {"continue", "converged", "max_samples", "max_time"};
    std::printf("%s\n", names[static_cast<int>(s)]);
  } else if (cmd == "parse" || cmd == "parse-strict") {  // parse args...: the options and the rest
    std::vector<std::string> rest;
    const wf::Options o = wf::parse_options(argc - 1, argv + 1, cmd == "parse" ? &rest : nullptr);
    std::printf("seed=%llu min_samples=%d min_time_s=%.17g max_noise=%.17g max_samples=%d "
                "max_time_s=%.17g warmup=%d flush_l2=%d\n", static_cast<unsigned long long>(o.seed),
                o.min_samples, o.min_time_s, o.max_noise, o.max_samples, o.max_time_s, o.warmup, o.flush_l2);
    for (const std::string& r : rest) std::printf("rest %s\n", r.c_str());
  } else if (cmd == "simulate") {  // simulate harness-args... -- ms...: feed samples (cycled) to the rule
    int dash = 2;
    while (std::strcmp(argv[dash], "--") != 0) ++dash;
    argv[dash] = argv[0];
    const wf::Options o = wf::parse_options(dash - 1, argv + 1);
    const std::vector<double> ms = numbers(argc, argv, dash + 1);
    wf::detail::Sampling sampling(o);
    size_t i = 0;
    while (!sampling.add(ms[i++ % ms.size()])) {}
    const wf::Result& r = sampling.result;
    std::printf("samples=%zu converged=%d median=%.17g noise=%.17g total=%.17g\n", r.samples_ms.size(),
                r.converged, r.median_ms, r.noise, sampling.total_s);
  } else if (cmd == "fill") {  // fill float|double seed n lo hi
    const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
    const size_t n = std::strtoul(argv[4], nullptr, 10);
    const double lo = std::strtod(argv[5], nullptr), hi = std::strtod(argv[6], nullptr);
    std::vector<double> out(n);
    if (std::string(argv[2]) == "float") {
      std::vector<float> f(n);
      wf::fill_uniform(f.data(), n, seed, float(lo), float(hi));
      out.assign(f.begin(), f.end());
    } else {
      wf::fill_uniform(out.data(), n, seed, lo, hi);
    }
    for (double v : out) std::printf("%.17g\n", v);
  } else if (cmd == "write") {  // write path v...: as float32
    std::vector<float> v;
    for (double d : numbers(argc, argv, 3)) v.push_back(float(d));
    wf::write_output(argv[2], v.data(), v.size());
  } else if (cmd == "lines") {  // the protocol lines for a known result
    wf::detail::print_sample(0.1234567891);
    const wf::Result r{{0.1234567891, 0.25}, 0.1875, 0.0625, true};
    wf::detail::print_summary(r, timespec{1700000000, 5}, timespec{1700000001, 123456789});
  }
  return 0;
}
"""


def _run(argv: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------- host logic, through g++

@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ not on PATH")
    folder = tmp_path_factory.mktemp("harness_core")
    (folder / "driver.cpp").write_text(DRIVER)
    built = _run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{INCLUDE}",
                  folder / "driver.cpp", "-o", folder / "driver"])
    assert built.returncode == 0, built.stderr
    return folder / "driver"


def _call(driver: Path, *args: object, env: dict[str, str] | None = None) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "WARPFLEET_PROFILE"} | (env or {})
    done = _run([driver, *map(str, args)], env=environ)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rc(driver: Path, *args: object) -> int:
    return _run([driver, *map(str, args)]).returncode


def _options(stdout: str) -> dict[str, float]:
    """``name=value`` fields of the first line; integers stay exact (a 64-bit seed)."""
    first = stdout.splitlines()[0]
    return {k: int(v) if v.isdigit() else float(v) for k, v in (token.split("=") for token in first.split())}


_rng = random.Random(11)
SPREAD_CASES = [
    [float(i) for i in range(1, 11)],
    [4.0, 1.0, 3.0, 2.0],
    [0.5, 0.5, 0.5, 0.7, 0.9],
    [1.0, 2.0, 2.0, 9.0, 10.0, 10.0],
    [_rng.lognormvariate(0, 0.3) for _ in range(7)],
    [_rng.uniform(0.01, 0.02) for _ in range(100)],
    [_rng.uniform(1, 3) for _ in range(1001)],
]


@pytest.mark.parametrize("values", SPREAD_CASES, ids=lambda v: f"n{len(v)}")
def test_median_iqr_and_noise_are_pythons(driver, values):
    median, iqr, noise, q1, q3 = map(float, _call(driver, "spread", *map(repr, values)).split())
    want_q1, _, want_q3 = statistics.quantiles(values, n=4, method="inclusive")
    stats = Stats.of(values)
    assert stats is not None
    # Same arithmetic as Python's, so the same bits: exact comparisons.
    assert (q1, q3) == (want_q1, want_q3)
    assert median == statistics.median(values) == stats.median
    assert iqr == want_q3 - want_q1 == stats.iqr
    assert noise == stats.rel_noise


@pytest.mark.parametrize("values", [[3.0], [2.0, 1.0], [1.0, 2.0, 5.0], [0.0, 0.0, 0.0, 1.0, 1.0]])
def test_short_and_zero_median_spreads_follow_stats(driver, values):
    median, iqr, noise = map(float, _call(driver, "spread", *map(repr, values)).split()[:3])
    stats = Stats.of(values)
    assert stats is not None
    assert (median, iqr, noise) == (stats.median, stats.iqr, stats.rel_noise)


# min_samples min_time max_noise max_samples max_time | samples total_s noise -> decision
STOP_CASES = [
    ((10, 0.5, 0.005, 1000, 10.0), (9, 1.0, 0.0), "continue"),       # too few samples
    ((10, 0.5, 0.005, 1000, 10.0), (10, 0.4, 0.0), "continue"),      # too little time
    ((10, 0.5, 0.005, 1000, 10.0), (10, 0.5, 0.0051), "continue"),   # too noisy
    ((10, 0.5, 0.005, 1000, 10.0), (10, 0.5, math.inf), "continue"),
    ((10, 0.5, 0.005, 1000, 10.0), (10, 0.5, 0.005), "converged"),   # bounds are inclusive
    ((10, 0.5, 0.005, 1000, 10.0), (1000, 0.1, 1.0), "max_samples"),
    ((10, 0.5, 0.005, 1000, 10.0), (50, 10.0, 1.0), "max_time"),
    ((10, 0.5, 0.005, 1000, 10.0), (1000, 12.0, 0.001), "converged"),  # the rule wins when both hold
    ((10, 0.5, 0.005, 5, 10.0), (5, 1.0, 0.0), "max_samples"),         # the cap beats min_samples
    ((1, 0.0, 0.005, 1000, 10.0), (1, 0.0, 0.0), "converged"),
]


@pytest.mark.parametrize(("options", "state", "want"), STOP_CASES)
def test_stop_decision(driver, options, state, want):
    assert _call(driver, "stop", *options, *state).strip() == want


def _simulate(driver: Path, args: list[str], samples: list[float], env: dict[str, str] | None = None
              ) -> dict[str, float]:
    return _options(_call(driver, "simulate", *args, "--", *samples, env=env))


def test_sampling_stops_on_the_rule_or_a_cap(driver):
    steady = _simulate(driver, [], [100.0])  # 10 samples of 0.1 s: min_samples and min_time both met
    assert steady == {"samples": 10, "converged": 1, "median": 100.0, "noise": 0.0, "total": pytest.approx(1.0)}
    slow = _simulate(driver, ["--min-time", "2"], [100.0])  # now min_time is what it waits for
    assert slow["samples"] == 20 and slow["converged"] == 1
    tiny = _simulate(driver, [], [0.01])  # 1000 x 10 us never reaches 0.5 s
    assert tiny["samples"] == 1000 and tiny["converged"] == 0
    noisy = _simulate(driver, ["--max-samples", "100000"], [1.0, 2.0])  # never quiet: stops at 10 s
    assert noisy["converged"] == 0 and noisy["total"] >= 10 and noisy["samples"] == pytest.approx(6667, abs=1)
    # Five outliers first: it stops once enough steady samples push them out of the IQR, at the
    # first count where the Python side's noise is within bounds too.
    sequence = [2.0] * 5 + [1.0] * 200
    want = next(n for n in range(10, len(sequence)) if Stats.of(sequence[:n]).rel_noise <= 0.005)
    settles = _simulate(driver, ["--min-time", "0"], sequence)
    assert want > 10 and settles["samples"] == want and settles["converged"] == 1


def test_profile_mode_takes_exactly_one_sample(driver):
    args = ["--min-samples", "50", "--min-time", "3", "--warmup", "4", "--max-samples", "80"]
    forced = _options(_call(driver, "parse", *args, env={"WARPFLEET_PROFILE": "1"}))
    assert (forced["min_samples"], forced["min_time_s"], forced["warmup"], forced["max_samples"]) == (1, 0, 0, 1)
    for value in ("0", ""):
        kept = _options(_call(driver, "parse", *args, env={"WARPFLEET_PROFILE": value}))
        assert (kept["min_samples"], kept["min_time_s"], kept["warmup"]) == (50, 3, 4)
    noisy = _simulate(driver, args, [1.0, 9.0], env={"WARPFLEET_PROFILE": "1"})
    assert noisy["samples"] == 1


def test_the_engines_sample_cap_lowers_max_and_min_samples(driver):
    """WARPFLEET_MAX_SAMPLES (measure.search_samples): the flags cannot raise it; it caps the
    rule's minimum too; a bad value exits 2."""
    args = ["--min-samples", "50", "--max-samples", "800", "--min-time", "0"]
    capped = _options(_call(driver, "parse", *args, env={"WARPFLEET_MAX_SAMPLES": "20"}))
    assert (capped["min_samples"], capped["max_samples"]) == (20, 20)
    roomy = _options(_call(driver, "parse", *args, env={"WARPFLEET_MAX_SAMPLES": "5000"}))
    assert (roomy["min_samples"], roomy["max_samples"]) == (50, 800)
    unset = _options(_call(driver, "parse", *args, env={"WARPFLEET_MAX_SAMPLES": ""}))
    assert unset["max_samples"] == 800
    noisy = _simulate(driver, ["--min-time", "0"], [1.0, 9.0] * 100, env={"WARPFLEET_MAX_SAMPLES": "30"})
    assert noisy["samples"] == 30 and noisy["converged"] == 0
    environ = {**os.environ, "WARPFLEET_MAX_SAMPLES": "0"}
    bad = _run([driver, "parse"], env=environ)
    assert bad.returncode == 2 and "WARPFLEET_MAX_SAMPLES" in bad.stderr


def test_parse_options_defaults_match_the_api(driver):
    assert _options(_call(driver, "parse")) == {
        "seed": 0, "min_samples": 10, "min_time_s": 0.5, "max_noise": 0.005, "max_samples": 1000,
        "max_time_s": 10.0, "warmup": 1, "flush_l2": 1}


def test_parse_options_reads_every_flag_and_leaves_the_rest(driver):
    out = _call(driver, "parse", "--n", "7", "--seed", "18446744073709551615", "--min-samples", "12",
                "--min-time=0.25", "--max-noise", "0.01", "--max-samples", "99", "extra", "--max-time", "3.5",
                "--warmup", "0", "--no-flush", "--m=3")
    assert _options(out) == {
        "seed": 2**64 - 1, "min_samples": 12, "min_time_s": 0.25, "max_noise": 0.01, "max_samples": 99,
        "max_time_s": 3.5, "warmup": 0, "flush_l2": 0}
    assert re.findall(r"^rest (.*)$", out, re.MULTILINE) == ["--n", "7", "extra", "--m=3"]


@pytest.mark.parametrize("args", [
    ["--min-samples", "0"], ["--max-samples", "-3"], ["--min-time", "abc"], ["--max-noise", "-0.1"],
    ["--seed", "-1"], ["--seed", "12x"], ["--warmup", "1.5"], ["--max-time", "nan"], ["--warmup"],
])
def test_parse_options_rejects_bad_values(driver, args):
    assert _rc(driver, "parse", *args) == 2


def test_unknown_arguments_are_an_error_without_a_rest_list(driver):
    assert _rc(driver, "parse-strict", "--seed", "3") == 0
    assert _rc(driver, "parse-strict", "--n", "3") == 2


def _fill(driver: Path, kind: str, seed: int, n: int, lo: float, hi: float) -> list[float]:
    return [float(v) for v in _call(driver, "fill", kind, seed, n, repr(lo), repr(hi)).split()]


@pytest.mark.parametrize("kind", ["float", "double"])
def test_fill_uniform_is_deterministic_per_seed_and_in_range(driver, kind):
    first = _fill(driver, kind, 7, 4000, -1.0, 1.0)
    assert first == _fill(driver, kind, 7, 4000, -1.0, 1.0)
    other = _fill(driver, kind, 8, 4000, -1.0, 1.0)
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 3900
    assert all(-1.0 <= v < 1.0 for v in first) and abs(statistics.fmean(first)) < 0.05
    assert len(set(first)) > 3900
    shifted = _fill(driver, kind, 7, 4000, 2.0, 3.0)
    assert all(2.0 <= v < 3.0 for v in shifted)


def _splitmix64(seed: int, n: int) -> list[int]:
    state, out, mask = seed, [], 2**64 - 1
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return out


def test_fill_uniform_is_the_documented_splitmix64(driver):
    # On [0, 1) the fill is the generator's top bits scaled: the same numbers on every machine.
    raw = _splitmix64(12345, 64)
    assert _fill(driver, "double", 12345, 64, 0.0, 1.0) == [(z >> 11) * 2.0**-53 for z in raw]
    assert _fill(driver, "float", 12345, 64, 0.0, 1.0) == [(z >> 40) * 2.0**-24 for z in raw]


def test_fill_uniform_never_reaches_hi(driver):
    hi = float(np.nextafter(np.float32(1), np.float32(2)))  # one float step: half the draws round up
    assert set(_fill(driver, "float", 3, 1000, 1.0, hi)) == {1.0}
    assert _rc(driver, "fill", "float", 3, 10, "1", "1") == 2


def test_write_output_writes_raw_values(driver, tmp_path):
    _call(driver, "write", tmp_path / "out.bin", 1.5, -2, 3)
    assert (tmp_path / "out.bin").read_bytes() == np.array([1.5, -2, 3], dtype=np.float32).tobytes()
    _call(driver, "write", tmp_path / "empty.bin")
    assert (tmp_path / "empty.bin").read_bytes() == b""
    assert _rc(driver, "write", tmp_path / "missing" / "out.bin", 1) == 2


def test_protocol_lines_parse_on_the_python_side(driver):
    out = _call(driver, "lines")
    assert parse_samples(out, MetricSpec()) == [0.123456789]  # %.9g: a float's every digit
    assert harness_region(out) == (1700000000.000000005, 1700000001.123456789, 2)
    summary = out.splitlines()[-1]
    assert "median_ms=0.1875 noise=0.0625 converged=1" in summary
    assert "region_start_unix=1700000000.000000005 " in summary


# ---------------------------------------------------------------- nvcc builds, compile only

SECOND_TU = r"""
#include <warpfleet/harness.cuh>
// Uses everything the header defines, so that duplicate definitions would show at link time.
__global__ void twice(double* v) { v[threadIdx.x] *= 2; }
int second_translation_unit(int argc, char** argv) {
  std::vector<std::string> rest;
  const wf::Options opt = wf::parse_options(argc, argv, &rest);
  std::vector<double> h(32);
  std::vector<float> f(32);
  wf::fill_uniform(h.data(), h.size(), opt.seed);
  wf::fill_uniform(f.data(), f.size(), opt.seed);
  double* d = nullptr;
  WF_CHECK(cudaMalloc(&d, 32 * sizeof(double)));
  const wf::Result r = wf::bench(opt, [&](cudaStream_t s) { twice<<<1, 32, 0, s>>>(d); });
  WF_CHECK_LAUNCH();
  wf::write_output("second.bin", h.data(), h.size());
  return r.converged;
}
"""


@dataclass(frozen=True)
class Example:
    """The example compiled (``obj``) and linked (``binary``) for one arch: the two steps of a
    one-command build; ``stderr`` of both."""

    returncode: int
    stderr: str
    obj: Path
    binary: Path


def _build_example(folder: Path, arch: str) -> Example:
    obj, binary = folder / "example.o", folder / "example"
    compiled = _run(["nvcc", *NVCC_FLAGS, f"-arch={arch}", "-c", EXAMPLE, "-o", obj])
    if compiled.returncode != 0:
        return Example(compiled.returncode, compiled.stderr, obj, binary)
    linked = _run(["nvcc", *NVCC_FLAGS, f"-arch={arch}", obj, "-o", binary])
    return Example(linked.returncode, compiled.stderr + linked.stderr, obj, binary)


@pytest.fixture(scope="module")
def example_sm90(tmp_path_factory: pytest.TempPathFactory) -> Example:
    """The example built for sm_90 once: the warning check, the argument checks and the whole-program
    link with a second translation unit read the same build (about 3 CPU-seconds each time)."""
    return _build_example(tmp_path_factory.mktemp("example-sm_90"), "sm_90")


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_example_builds_warning_clean(tmp_path, arch, example_sm90):
    built = example_sm90 if arch == "sm_90" else _build_example(tmp_path, arch)
    assert built.returncode == 0, built.stderr
    assert "warning" not in built.stderr.lower()
    assert built.binary.stat().st_size > 0


@pytest.mark.nvcc
@needs("nvcc")
@pytest.mark.parametrize("rdc", [False, True], ids=["whole", "rdc"])
def test_header_links_from_two_translation_units(tmp_path, rdc, example_sm90):
    (tmp_path / "second.cu").write_text(SECOND_TU)
    flags = [*NVCC_FLAGS, "-arch=sm_90", *(["-rdc=true"] if rdc else [])]
    units = [(tmp_path / "second.cu", tmp_path / "second.o")]
    if rdc:  # whole-program compilation's object of the example is example_sm90's (the same command)
        units.append((EXAMPLE, tmp_path / "example.o"))
    with ThreadPoolExecutor(max_workers=2) as pool:  # the compiles at once, on two cores
        compiled = list(pool.map(lambda unit: _run(["nvcc", *flags, "-c", unit[0], "-o", unit[1]]), units))
    for built in compiled:
        assert built.returncode == 0, built.stderr
    assert example_sm90.returncode == 0, example_sm90.stderr
    example = tmp_path / "example.o" if rdc else example_sm90.obj
    linked = _run(["nvcc", *flags, example, tmp_path / "second.o", "-o", tmp_path / "both"])
    assert linked.returncode == 0, linked.stderr


@pytest.mark.nvcc
@needs("nvcc")
def test_flush_kernel_reads_its_buffer(tmp_path):
    built = _run(["nvcc", *NVCC_FLAGS, "-arch=sm_90", "-ptx", EXAMPLE, "-o", tmp_path / "example.ptx"])
    assert built.returncode == 0, built.stderr
    entries = (tmp_path / "example.ptx").read_text().split(".entry ")[1:]
    flush = [body for body in entries if body.split("(")[0].endswith("wf_l2_flushEPK4int4mPi")]
    assert len(flush) == 1, [body.split("(")[0] for body in entries]
    assert "ld.global" in flush[0] and "st.global" in flush[0]  # loads kept, the sink store conditional


@pytest.mark.nvcc
@needs("nvcc")
def test_example_rejects_bad_arguments_before_touching_the_gpu(tmp_path, example_sm90):
    assert example_sm90.returncode == 0, example_sm90.stderr
    for args in (["--n", "-1"], ["--n", "0"], ["--n", "x"], ["--bogus"], ["--min-samples", "0"]):
        done = _run([example_sm90.binary, *args], cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "@warpfleet" not in done.stdout


# ---------------------------------------------------------------- the real thing, on a GPU

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")
def test_example_runs_and_reports_on_the_gpu(tmp_path):
    import pynvml

    pynvml.nvmlInit()
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
    pynvml.nvmlShutdown()
    built = _run(["nvcc", *NVCC_FLAGS, f"-arch=sm_{major}{minor}", EXAMPLE, "-o", tmp_path / "example"])
    assert built.returncode == 0, built.stderr

    done = _run([tmp_path / "example", "--n", "1000000", "--seed", "5", "--min-samples", "12",
                 "--min-time", "0.05"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    samples = parse_samples(done.stdout, MetricSpec())
    assert len(samples) >= 12 and all(s > 0 for s in samples)
    summary = re.search(r"^@warpfleet samples=(\d+) median_ms=(\S+) noise=(\S+) converged=([01]) "
                        r"region_start_unix=(\d+\.\d{9}) region_end_unix=(\d+\.\d{9})$", done.stdout, re.MULTILINE)
    assert summary, done.stdout[-2000:]
    assert int(summary[1]) == len(samples) and float(summary[2]) == pytest.approx(statistics.median(samples))
    assert float(summary[4]) in {0, 1} and float(summary[6]) > float(summary[5])
    assert (tmp_path / "out.bin").stat().st_size == 1000000 * 4

    profiled = _run([tmp_path / "example", "--n", "1000"], cwd=tmp_path, env={**os.environ, "WARPFLEET_PROFILE": "1"})
    assert profiled.returncode == 0, profiled.stderr
    assert len(parse_samples(profiled.stdout, MetricSpec())) == 1

    rejected = _run([tmp_path / "example", "--n", "-1"], cwd=tmp_path)
    assert rejected.returncode != 0
