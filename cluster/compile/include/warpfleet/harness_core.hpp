// warpfleet timing harness, host-only part: options, inputs, statistics, the stopping rule and
// the output lines. Plain C++17 with no CUDA in it, so that the pure logic compiles with g++ and
// is unit-tested on machines without a GPU (tests/cluster/test_harness.py). Targets include
// <warpfleet/harness.cuh>, which includes this; HARNESS_API.md is the contract.
#pragma once

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <type_traits>
#include <vector>

namespace wf {

struct Options {
  uint64_t seed = 0;          // --seed N        inputs are generated from this seed: the engine gives each run its own
  int    min_samples = 10;    // --min-samples N (nvbench's default)
  double min_time_s = 0.5;    // --min-time S    total timed-region time before stopping
  double max_noise = 0.005;   // --max-noise F   stop early once relative noise (IQR/median) <= F, after min_samples
  int    max_samples = 1000;  // --max-samples N hard stop
  double max_time_s = 10.0;   // --max-time S    hard stop on total timed time
  int    warmup = 1;          // --warmup N      untimed runs first
  bool   flush_l2 = true;     // --no-flush      an L2 flush (a read of >= 2x the L2 size) before every sample
};

struct Result { std::vector<double> samples_ms; double median_ms; double noise; bool converged; };

namespace detail {

[[noreturn]] inline void die(const char* what, const char* why) {
  std::fprintf(stderr, "wf: %s: %s\n", what, why);
  std::exit(2);
}

// Whole-string numeric parses: "10x", "" and out-of-range values are errors, not a silent 10.
inline bool parse_int(const char* text, long lo, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno || end == text || *end || v < lo || v > INT_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

inline bool parse_double(const char* text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno || end == text || *end || !(v >= 0) || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

inline bool parse_u64(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  if (*text < '0' || *text > '9') return false;  // strtoull takes " -1" and wraps it to 2^64-1
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno || end == text || *end) return false;
  *out = v;
  return true;
}

// Sets one option from its flag; false when `flag` is not one of ours. A missing (null) or bad
// value exits 2: a typo in a sweep's run line must not quietly measure the defaults.
inline bool set_option(Options* opt, const std::string& flag, const char* value) {
  bool ok = value != nullptr;
  if (flag == "--seed") ok = ok && parse_u64(value, &opt->seed);
  else if (flag == "--min-samples") ok = ok && parse_int(value, 1, &opt->min_samples);
  else if (flag == "--min-time") ok = ok && parse_double(value, &opt->min_time_s);
  else if (flag == "--max-noise") ok = ok && parse_double(value, &opt->max_noise);
  else if (flag == "--max-samples") ok = ok && parse_int(value, 1, &opt->max_samples);
  else if (flag == "--max-time") ok = ok && parse_double(value, &opt->max_time_s);
  else if (flag == "--warmup") ok = ok && parse_int(value, 0, &opt->warmup);
  else return false;
  if (!ok) {
    std::fprintf(stderr, "wf: %s: bad value '%s' (numbers only, none negative; counts are integers, "
                         "--min-samples and --max-samples at least 1)\n", flag.c_str(), value ? value : "");
    std::exit(2);
  }
  return true;
}

}  // namespace detail

// Parses the options above out of argv ("--flag value" or "--flag=value"); a bad value exits 2.
// Arguments that are not ours go to `rest` in order, argv[0] excluded; with `rest` null they exit
// 2, since a program that takes no arguments of its own should not ignore one it was given.
// WARPFLEET_PROFILE set (to anything but "" or "0") forces min_samples=1, min_time_s=0, warmup=0
// and max_samples=1, whatever the flags say: exactly one launch, for profilers. Else
// WARPFLEET_MAX_SAMPLES=N (N >= 1) lowers max_samples, and min_samples with it, to N: the
// engine's cap on a search candidate's samples (measure.search_samples); the flags cannot raise it.
inline Options parse_options(int argc, char** argv, std::vector<std::string>* rest = nullptr) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg == "--no-flush") {
      opt.flush_l2 = false;
      continue;
    }
    if (eq != std::string::npos) {
      if (detail::set_option(&opt, arg.substr(0, eq), argv[i] + eq + 1)) continue;
    } else if (detail::set_option(&opt, arg, i + 1 < argc ? argv[i + 1] : nullptr)) {
      ++i;
      continue;
    }
    if (!rest) detail::die("unknown argument", argv[i]);
    rest->push_back(arg);
  }
  const char* profile = std::getenv("WARPFLEET_PROFILE");
  if (profile && *profile && std::strcmp(profile, "0") != 0) {
    opt.min_samples = 1;
    opt.min_time_s = 0;
    opt.warmup = 0;
    opt.max_samples = 1;
  } else if (std::getenv("WARPFLEET_MAX_SAMPLES") && *std::getenv("WARPFLEET_MAX_SAMPLES")) {
    const char* cap = std::getenv("WARPFLEET_MAX_SAMPLES");
    int n = 0;
    if (!detail::parse_int(cap, 1, &n)) detail::die("WARPFLEET_MAX_SAMPLES must be an integer >= 1", cap);
    opt.max_samples = std::min(opt.max_samples, n);
    opt.min_samples = std::min(opt.min_samples, n);
  }
  return opt;
}

namespace detail {

// splitmix64 (Steele, Lea, Flood 2014): one 64-bit step of the generator whose state is `*state`.
inline uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i is lo + (hi - lo) * u_i, u_i the top 24 (float) or 53 (double) bits of the i-th
// splitmix64 output from state `seed`, scaled to [0, 1). std::fma rounds once on every machine,
// where a*b+c may or may not be contracted to an fma by the compiler: the same bits everywhere.
template <class T, int kBits>
void fill_uniform(T* host, size_t n, uint64_t seed, T lo, T hi) {
  if (!(lo < hi) || !std::isfinite(hi - lo)) die("fill_uniform", "needs finite lo < hi");
  const T scale = std::ldexp(T(1), -kBits);
  uint64_t state = seed;
  for (size_t i = 0; i < n; ++i) {
    const T u = static_cast<T>(splitmix64(&state) >> (64 - kBits)) * scale;
    const T v = std::fma(hi - lo, u, lo);
    host[i] = v < hi ? v : std::nextafter(hi, lo);  // rounding can reach hi; the range is open there
  }
}

}  // namespace detail

// Deterministic pseudo-random fill (splitmix64-based, the same on every machine) in [lo, hi).
inline void fill_uniform(float* host, size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  detail::fill_uniform<float, 24>(host, n, seed, lo, hi);
}
inline void fill_uniform(double* host, size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  detail::fill_uniform<double, 53>(host, n, seed, lo, hi);
}

// Writes `n` values to a binary file (outputs compared with the baseline's): exits 2 on error.
template <class T> void write_output(const char* path, const T* host, size_t n) {
  static_assert(std::is_trivially_copyable<T>::value, "write_output writes raw bytes");
  FILE* f = std::fopen(path, "wb");
  if (!f) detail::die(path, std::strerror(errno));
  const bool written = n == 0 || std::fwrite(host, sizeof(T), n, f) == n;
  if (std::fclose(f) != 0 || !written) detail::die(path, std::strerror(errno));
}

namespace detail {

// Median and relative noise exactly as the Python side (cluster.types.Stats) computes them:
// statistics.median, and IQR from statistics.quantiles(n=4, method="inclusive") with its own
// arithmetic (so the same bits), or the range max - min under 4 samples; noise = IQR / median,
// infinite for a zero median.
struct Spread { double median; double iqr; double noise; };

inline double inclusive_quartile(const std::vector<double>& sorted, size_t i) {
  const size_t m = sorted.size() - 1, j = i * m / 4, delta = i * m % 4;
  return (sorted[j] * double(4 - delta) + sorted[j + 1] * double(delta)) / 4;
}

inline Spread spread_of_sorted(const std::vector<double>& sorted) {
  const size_t n = sorted.size();
  if (n == 0) return {0, 0, INFINITY};
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  const double iqr = n >= 4 ? inclusive_quartile(sorted, 3) - inclusive_quartile(sorted, 1)
                            : sorted[n - 1] - sorted[0];
  return {median, iqr, median != 0 ? iqr / median : INFINITY};
}

enum class Stop { kContinue, kConverged, kMaxSamples, kMaxTime };

// The stopping rule after each sample. The hard caps win over min_samples/min_time_s; converged
// means the rule itself was met: enough samples, enough timed time and noise within bounds.
inline Stop stop_decision(const Options& opt, size_t samples, double total_s, double noise) {
  if (samples >= size_t(opt.min_samples) && total_s >= opt.min_time_s && noise <= opt.max_noise)
    return Stop::kConverged;
  if (samples >= size_t(opt.max_samples)) return Stop::kMaxSamples;
  if (total_s >= opt.max_time_s) return Stop::kMaxTime;
  return Stop::kContinue;
}

// The samples so far and the stopping rule over them: bench's bookkeeping, kept apart from CUDA.
struct Sampling {
  explicit Sampling(const Options& options) : opt(options) {}

  const Options& opt;
  Result result{{}, 0, 0, false};
  std::vector<double> sorted{};  // kept sorted as samples come, so the noise costs no sort per sample
  double total_s = 0;

  // Records one sample; true when it is time to stop (`result` is then final).
  bool add(double ms) {
    result.samples_ms.push_back(ms);
    sorted.insert(std::upper_bound(sorted.begin(), sorted.end(), ms), ms);
    total_s += ms / 1e3;
    const Spread spread = spread_of_sorted(sorted);
    const Stop why = stop_decision(opt, sorted.size(), total_s, spread.noise);
    result.median_ms = spread.median;
    result.noise = spread.noise;
    result.converged = why == Stop::kConverged;
    return why != Stop::kContinue;
  }
};

// The line protocol that cluster/measure.py reads. %.9g round-trips a float (the event timer's
// type); flushed at once so a crash or timeout keeps the samples taken so far.
inline void print_sample(double ms) {
  std::printf("@warpfleet time_ms=%.9g\n", ms);
  std::fflush(stdout);
}

inline timespec wall_now() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return t;
}

inline void print_summary(const Result& r, const timespec& start, const timespec& end) {
  std::printf("@warpfleet samples=%zu median_ms=%.9g noise=%.6g converged=%d "
              "region_start_unix=%lld.%09ld region_end_unix=%lld.%09ld\n",
              r.samples_ms.size(), r.median_ms, r.noise, r.converged ? 1 : 0,
              static_cast<long long>(start.tv_sec), static_cast<long>(start.tv_nsec),
              static_cast<long long>(end.tv_sec), static_cast<long>(end.tv_nsec));
  std::fflush(stdout);
}

// The guardrails' poisoned-outputs check (cluster/guardrails.py) runs a candidate with
// WARPFLEET_POISON set (to anything but "" or "0"): the output buffers registered with
// wf::poison_output are then filled with 0xFF bytes (a NaN as float or double) before every
// launch, outside the timed region, so a launch that leaves its output unwritten fails.
inline bool poison_requested() {
  const char* poison = std::getenv("WARPFLEET_POISON");
  return poison && *poison && std::strcmp(poison, "0") != 0;
}

struct PoisonBuffer { void* ptr; size_t bytes; };

inline std::vector<PoisonBuffer>& poison_buffers() {
  static std::vector<PoisonBuffer> buffers;
  return buffers;
}

}  // namespace detail
}  // namespace wf
