// regpressure: a kernel whose occupancy is limited by registers, so that -maxrregcount matters.
//
// Each thread owns one element i and sums a degree-80 polynomial over a stream of samples:
//     out[i] = sum over s < steps of p(x[s][i]),  p(v) = c[0] + c[1] v + ... + c[80] v^80
// evaluated by Horner's rule (a chain of 80 dependent FMAs per sample). The coefficients come
// through a pointer and this baseline caches them in a register array for the whole loop, as a
// first version often does: 81 live registers, 94 in all at sm_90 (nvcc 13.0), so only 2 blocks
// of 256 threads fit an SM (16 warps of 64). Each step waits for its sample from device memory and
// then for its FMA chain, and 16 warps cannot hide that: the kernel is latency-bound. Capping the
// registers (-maxrregcount=64: 4 blocks, 24 bytes of spills, as ptxas moves the warp-uniform
// coefficients into uniform registers) lets more warps hide the latency.
// regpressure_opt.cu is the hand-optimized version.
//
// Usage: regpressure [--n N] [--steps S] [harness options, HARNESS_API.md]
//   N elements (a multiple of 256), S samples each; x holds S * N floats, drawn from --seed.
// Checks a deterministic sample of the elements against a CPU reference that does the same
// float operations in the same order (the results are bit-identical), then writes out (float32,
// N values) to out.bin. Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

constexpr int kBlock = 256;  // threads per block
constexpr int kTerms = 81;   // polynomial degree 80

// No __launch_bounds__: it would override -maxrregcount, the flag this target is about.
__global__ void series_sum(const float* __restrict__ x, const float* __restrict__ coef,
                           float* __restrict__ out, int n, int steps) {
  float c[kTerms];  // indexed by constants only (unrolled loops), so it lives in registers
#pragma unroll
  for (int k = 0; k < kTerms; ++k) c[k] = coef[k];
  const int i = blockIdx.x * kBlock + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const float v = x[size_t(s) * n + i];
    float p = c[kTerms - 1];
#pragma unroll
    for (int k = kTerms - 2; k >= 0; --k) p = fmaf(p, v, c[k]);
    acc += p;
  }
  out[i] = acc;
}

// The coefficients of ln(1 + 0.9 v) / (0.9 v), truncated: |p| < 3 on [-1, 1).
static std::vector<float> coefficients() {
  std::vector<float> c(kTerms);
  float power = 1.0f;
  for (int k = 0; k < kTerms; ++k) {
    c[k] = power / float(k + 1);
    power *= -0.9f;
  }
  return c;
}

static float reference(const std::vector<float>& x, const std::vector<float>& c, int n, int steps, int i) {
  float acc = 0.0f;
  for (int s = 0; s < steps; ++s) {
    const float v = x[size_t(s) * n + i];
    float p = c[kTerms - 1];
    for (int k = kTerms - 2; k >= 0; --k) p = std::fma(p, v, c[k]);
    acc += p;
  }
  return acc;
}

static long parse_count(const std::string& flag, const std::string& text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "regpressure: %s wants an integer in [%ld, %ld], got '%s'\n", flag.c_str(), lo, hi,
                 text.c_str());
    std::exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  std::vector<std::string> rest;
  const wf::Options opt = wf::parse_options(argc, argv, &rest);
  int n = 1 << 20, steps = 32;
  for (size_t a = 0; a < rest.size(); a += 2) {
    if (a + 1 < rest.size() && rest[a] == "--n") {
      n = int(parse_count(rest[a], rest[a + 1], kBlock, 1 << 24));
    } else if (a + 1 < rest.size() && rest[a] == "--steps") {
      steps = int(parse_count(rest[a], rest[a + 1], 1, 4096));
    } else {
      std::fprintf(stderr, "regpressure: bad argument '%s' (usage: [--n N] [--steps S])\n", rest[a].c_str());
      return 2;
    }
  }
  if (n % kBlock != 0 || size_t(n) * steps > (size_t(1) << 28)) {
    std::fprintf(stderr, "regpressure: --n must be a multiple of %d and n * steps at most 2^28\n", kBlock);
    return 2;
  }

  const size_t samples = size_t(n) * steps;
  std::vector<float> x(samples), out(n);
  wf::fill_uniform(x.data(), samples, opt.seed);
  const std::vector<float> coef = coefficients();

  float *d_x = nullptr, *d_coef = nullptr, *d_out = nullptr;
  WF_CHECK(cudaMalloc(&d_x, samples * sizeof(float)));
  WF_CHECK(cudaMalloc(&d_coef, kTerms * sizeof(float)));
  WF_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  WF_CHECK(cudaMemcpy(d_x, x.data(), samples * sizeof(float), cudaMemcpyHostToDevice));
  WF_CHECK(cudaMemcpy(d_coef, coef.data(), kTerms * sizeof(float), cudaMemcpyHostToDevice));
  WF_CHECK(cudaMemset(d_out, 0xFF, n * sizeof(float)));  // NaN: an element never written fails the check

  wf::bench(opt, [&](cudaStream_t stream) {
    series_sum<<<n / kBlock, kBlock, 0, stream>>>(d_x, d_coef, d_out, n, steps);
  });
  // warpfleet: readonly begin
  WF_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  WF_CHECK(cudaFree(d_x));
  WF_CHECK(cudaFree(d_coef));
  WF_CHECK(cudaFree(d_out));

  // The first and last 256 elements and 2048 spread between them, at every offset in a block.
  const int stride = n > 2048 ? n / 2048 : 1;
  for (int k = 0; k < 2048 + 512; ++k) {
    const int i = k < 256 ? k : k < 512 ? n - 1 - (k - 256) : (k - 512) * stride + (k - 512) % stride;
    if (i < 0 || i >= n) continue;
    const float want = reference(x, coef, n, steps, i);
    if (!(std::fabs(out[i] - want) <= 1e-6f * std::fabs(want) + 1e-6f)) {  // NaN fails too
      std::fprintf(stderr, "regpressure: out[%d] = %.9g, want %.9g\n", i, double(out[i]), double(want));
      return 1;
    }
  }
  wf::write_output("out.bin", out.data(), size_t(n));
  // warpfleet: readonly end
  return 0;
}
