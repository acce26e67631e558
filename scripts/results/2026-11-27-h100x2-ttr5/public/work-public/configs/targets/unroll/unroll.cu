// unroll: an FIR filter whose inner loop over the taps is where `#pragma unroll N` matters.
//
//     out[i] = sum over t < taps of h[t] * x[i + t]      (in order of t, one fmaf per tap)
//
// One thread per output, 256 per block; the block stages its x window in shared memory and reads
// the taps h from __constant__ memory. The tap count is a run-time argument (--taps), so the
// compiler cannot unroll the loop away: UNROLL picks the factor it unrolls by.
//   UNROLL=1 (the baseline): 8 instructions a tap (LDS, ULDC, FFMA and 5 of loop bookkeeping),
//            issue-bound at about 2 cycles per warp-tap per SM.
//   UNROLL=2, 4, 8, 16: 5.5, 4, 3.25, 2.9 instructions a tap (the loads use immediate offsets,
//            the taps come in pairs through ULDC.64, the bookkeeping is shared). From 4 on,
//            shared-memory bandwidth, one LDS a tap, is the limit: about 1 cycle per warp-tap per SM.
// nvcc does not expand a macro inside `#pragma unroll`, hence the constexpr kUnroll.
// unroll_opt.cu is the hand-optimized version.
//
// Usage: unroll [--n N] [--taps T] [harness options, HARNESS_API.md]
//   N outputs (a multiple of 1024), T taps in [1, 1024]; x (N + T floats) and h from --seed.
// Checks a deterministic sample of outputs against a CPU reference that does the same fmaf
// chain (the results are bit-identical), then writes out (float32, N values) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef UNROLL
#define UNROLL 1
#endif

constexpr int kUnroll = UNROLL;
static_assert(kUnroll >= 1 && kUnroll <= 64, "UNROLL must be in [1, 64]");
constexpr int kBlock = 256;      // threads (and outputs) per block
constexpr int kMaxTaps = 1024;
constexpr int kOutputAlign = 1024;  // --n granularity, the same as unroll_opt's, so both take one run line

__constant__ float c_taps[kMaxTaps];

__global__ void __launch_bounds__(kBlock) fir(const float* __restrict__ x, float* __restrict__ out, int taps) {
  __shared__ float tile[kBlock + kMaxTaps];
  const size_t base = size_t(blockIdx.x) * kBlock;
  for (int k = threadIdx.x; k < kBlock + taps - 1; k += kBlock) tile[k] = x[base + k];
  __syncthreads();
  const float* w = tile + threadIdx.x;
  float sum = 0.0f;
#pragma unroll kUnroll
  for (int t = 0; t < taps; ++t) sum = fmaf(c_taps[t], w[t], sum);
  out[base + threadIdx.x] = sum;
}

static float reference(const std::vector<float>& x, const std::vector<float>& h, int taps, size_t i) {
  float sum = 0.0f;
  for (int t = 0; t < taps; ++t) sum = std::fma(h[t], x[i + t], sum);
  return sum;
}

static long parse_count(const std::string& flag, const std::string& text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "unroll: %s wants an integer in [%ld, %ld], got '%s'\n", flag.c_str(), lo, hi, text.c_str());
    std::exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  std::vector<std::string> rest;
  const wf::Options opt = wf::parse_options(argc, argv, &rest);
  long n = 1 << 22;
  int taps = 512;
  for (size_t a = 0; a < rest.size(); a += 2) {
    if (a + 1 < rest.size() && rest[a] == "--n") {
      n = parse_count(rest[a], rest[a + 1], kOutputAlign, 1L << 26);
    } else if (a + 1 < rest.size() && rest[a] == "--taps") {
      taps = int(parse_count(rest[a], rest[a + 1], 1, kMaxTaps));
    } else {
      std::fprintf(stderr, "unroll: bad argument '%s' (usage: [--n N] [--taps T])\n", rest[a].c_str());
      return 2;
    }
  }
  if (n % kOutputAlign != 0) {
    std::fprintf(stderr, "unroll: --n must be a multiple of %d\n", kOutputAlign);
    return 2;
  }

  // One draw for x (n + taps values, the last taps only feed the last outputs) and h after it.
  const size_t nx = size_t(n) + taps;
  std::vector<float> inputs(nx + taps), out(n);
  wf::fill_uniform(inputs.data(), inputs.size(), opt.seed);
  const std::vector<float> x(inputs.begin(), inputs.begin() + nx), h(inputs.begin() + nx, inputs.end());

  float *d_x = nullptr, *d_out = nullptr;
  WF_CHECK(cudaMalloc(&d_x, nx * sizeof(float)));
  WF_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  WF_CHECK(cudaMemcpy(d_x, x.data(), nx * sizeof(float), cudaMemcpyHostToDevice));
  WF_CHECK(cudaMemcpyToSymbol(c_taps, h.data(), taps * sizeof(float)));
  WF_CHECK(cudaMemset(d_out, 0xFF, n * sizeof(float)));  // NaN: an output never written fails the check

  const unsigned blocks = unsigned(n / kBlock);
  wf::bench(opt, [&](cudaStream_t stream) { fir<<<blocks, kBlock, 0, stream>>>(d_x, d_out, taps); });
  // warpfleet: readonly begin
  WF_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  WF_CHECK(cudaFree(d_x));
  WF_CHECK(cudaFree(d_out));

  // The first and last 1024 outputs and 4096 spread between them, at every offset in a block.
  const size_t stride = n > 4096 ? size_t(n) / 4096 : 1;
  for (size_t k = 0; k < 4096 + 2048; ++k) {
    const size_t i = k < 1024 ? k : k < 2048 ? n - 1 - (k - 1024) : (k - 2048) * stride + (k - 2048) % stride;
    if (i >= size_t(n)) continue;
    const float want = reference(x, h, taps, i);
    if (!(std::fabs(out[i] - want) <= 1e-5f * std::fabs(want) + 1e-6f)) {  // NaN fails too
      std::fprintf(stderr, "unroll: out[%zu] = %.9g, want %.9g\n", i, double(out[i]), double(want));
      return 1;
    }
  }
  wf::write_output("out.bin", out.data(), size_t(n));
  // warpfleet: readonly end
  return 0;
}
