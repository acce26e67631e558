// A minimal warpfleet target: y = a * x over --n floats, timed with the harness, checked against
// a CPU reference and written to out.bin. Build and run:
//   nvcc -std=c++17 -arch=sm_90 -I<repo>/cluster/include example.cu -o example
//   ./example --n 16777216 --seed 3 [harness options, HARNESS_API.md]
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

__global__ void scale(const float* __restrict__ x, float* __restrict__ y, float a, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = a * x[i];
}

// --n N from the arguments the harness left; anything else, or an N below 1, is an error.
static size_t parse_n(const std::vector<std::string>& args) {
  long long n = 1 << 24;
  for (size_t i = 0; i < args.size(); ++i) {
    char* end = nullptr;
    if (args[i] == "--n" && i + 1 < args.size()) {
      n = std::strtoll(args[++i].c_str(), &end, 10);
      if (*end == '\0' && n >= 1) continue;
    }
    std::fprintf(stderr, "example: bad argument '%s' (usage: --n N, N >= 1)\n", args[i].c_str());
    std::exit(2);
  }
  return size_t(n);
}

int main(int argc, char** argv) {
  std::vector<std::string> rest;
  const wf::Options opt = wf::parse_options(argc, argv, &rest);
  const size_t n = parse_n(rest);
  const float a = 2.5f;

  std::vector<float> x(n), y(n);
  wf::fill_uniform(x.data(), n, opt.seed);
  float *dx = nullptr, *dy = nullptr;
  WF_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  WF_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  WF_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  WF_CHECK(cudaMemset(dy, 0xFF, n * sizeof(float)));  // NaN: an element never written fails the check

  const unsigned blocks = unsigned(std::min<size_t>((n + 255) / 256, 65536));
  wf::bench(opt, [&](cudaStream_t stream) { scale<<<blocks, 256, 0, stream>>>(dx, dy, a, n); });

  WF_CHECK(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  WF_CHECK(cudaFree(dx));
  WF_CHECK(cudaFree(dy));
  for (size_t i = 0; i < n; ++i) {
    const float want = a * x[i];
    if (!(std::fabs(y[i] - want) <= 1e-6f * std::fabs(want))) {  // written this way round, NaN fails
      std::fprintf(stderr, "example: y[%zu] = %g, want %g\n", i, double(y[i]), double(want));
      return 1;
    }
  }
  wf::write_output("out.bin", y.data(), n);
  return 0;
}
