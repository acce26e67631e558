// A small neural field evaluated at every point of a 2048 x 2048 grid, as a renderer queries a learned
// density: a fully connected network of 4 inputs (the point's x and y and two features of the
// point), two hidden layers of 32 ReLU units and one linear output. One thread per point; the
// network's parameters sit in one device buffer, as loaded from a checkpoint, and reach the kernel
// as a pointer per layer.
//
// BLOCK  threads per block (32 .. 1024)
//
// Usage: mlp [harness options, HARNESS_API.md] [--side N]   (an N x N grid of points, default 2048)
// Each timed sample evaluates every point (wf::bench). Checks every output is finite and every 64th
// point against the network in double (exit 1 naming the first bad point) and writes the outputs
// (float32, N * N values) to out.bin. Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef BLOCK
#define BLOCK 256
#endif

constexpr int kInputs = 4;
constexpr int kHidden = 32;
// The parameters' layout in the buffer: w1 [kHidden][kInputs], b1 [kHidden], w2 [kHidden][kHidden],
// b2 [kHidden], w3 [kHidden], b3 [1].
constexpr int kW1 = 0, kB1 = kW1 + kHidden * kInputs, kW2 = kB1 + kHidden, kB2 = kW2 + kHidden * kHidden,
              kW3 = kB2 + kHidden, kB3 = kW3 + kHidden, kParams = kB3 + 1;

__global__ void mlp_forward(int n, const float* points, const float* w1, const float* b1, const float* w2,
                            const float* b2, const float* w3, const float* b3, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float in[kInputs];
    for (int k = 0; k < kInputs; ++k) in[k] = points[(size_t)i * kInputs + k];

    float h1[kHidden];
    for (int j = 0; j < kHidden; ++j) {
        float sum = b1[j];
        for (int k = 0; k < kInputs; ++k) sum += w1[j * kInputs + k] * in[k];
        h1[j] = fmaxf(sum, 0.0f);
    }

    float result = b3[0];
    for (int j = 0; j < kHidden; ++j) {
        float sum = b2[j];
        for (int k = 0; k < kHidden; ++k) sum += w2[j * kHidden + k] * h1[k];
        result += w3[j] * fmaxf(sum, 0.0f);
    }
    out[i] = result;
}

// warpfleet: readonly begin
static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t& state, float bound) {
    return (float)(((double)(splitmix64(state) >> 40) * (2.0 / 16777216.0) - 1.0) * bound);
}

// The network: fixed (a trained model does not change with the input), He-uniform weights
// (bound sqrt(6 / fan-in)) and biases within 0.1, so the activations stay of order one.
static void make_network(std::vector<float>& p) {
    uint64_t state = 0x5EEDF00Dull;
    for (int k = 0; k < kHidden * kInputs; ++k) p[kW1 + k] = uniform(state, std::sqrt(6.0f / kInputs));
    for (int k = 0; k < kHidden * kHidden; ++k) p[kW2 + k] = uniform(state, std::sqrt(6.0f / kHidden));
    for (int k = 0; k < kHidden; ++k) p[kW3 + k] = uniform(state, std::sqrt(6.0f / kHidden));
    for (int k = 0; k < kHidden; ++k) p[kB1 + k] = uniform(state, 0.1f);
    for (int k = 0; k < kHidden; ++k) p[kB2 + k] = uniform(state, 0.1f);
    p[kB3] = uniform(state, 0.1f);
}

// The points: x and y on the grid over [-1, 1]^2, two features uniform in [-1, 1) from the seed.
static void make_points(std::vector<float>& points, int side, uint64_t seed) {
    std::vector<float> features(2 * (size_t)side * side);
    wf::fill_uniform(features.data(), features.size(), seed);
    for (size_t i = 0; i < (size_t)side * side; ++i) {
        points[i * kInputs + 0] = -1.0f + 2.0f * (float)(i % side) / (float)(side - 1);
        points[i * kInputs + 1] = -1.0f + 2.0f * (float)(i / side) / (float)(side - 1);
        points[i * kInputs + 2] = features[2 * i];
        points[i * kInputs + 3] = features[2 * i + 1];
    }
}

// Every output finite (out starts as NaN: a point never written fails) and every 64th point against
// the network in double (about 60 ms of CPU at 2048 x 2048). The tolerance is 1e-5 of the output's
// magnitude bound (every term's magnitude through the three layers, about 80) plus 1e-6: five times
// float32's worst rounding of the sums in any order, and far below one weight missed or misplaced
// (about 0.1).
static bool check(const std::vector<float>& points, const std::vector<float>& p, const std::vector<float>& out) {
    for (size_t i = 0; i < out.size(); ++i) {
        if (!std::isfinite(out[i])) {
            std::fprintf(stderr, "mlp: out[%zu] = %g, not finite\n", i, (double)out[i]);
            return false;
        }
    }
    double h1[kHidden], bound1[kHidden];
    for (size_t i = 0; i < out.size(); i += 64) {
        for (int j = 0; j < kHidden; ++j) {
            double sum = p[kB1 + j], bound = std::fabs(p[kB1 + j]);
            for (int k = 0; k < kInputs; ++k) {
                sum += (double)p[kW1 + j * kInputs + k] * points[i * kInputs + k];
                bound += std::fabs((double)p[kW1 + j * kInputs + k] * points[i * kInputs + k]);
            }
            h1[j] = sum > 0.0 ? sum : 0.0;
            bound1[j] = bound;
        }
        double want = p[kB3], bound = std::fabs(p[kB3]);
        for (int j = 0; j < kHidden; ++j) {
            double sum = p[kB2 + j], bound2 = std::fabs(p[kB2 + j]);
            for (int k = 0; k < kHidden; ++k) {
                sum += (double)p[kW2 + j * kHidden + k] * h1[k];
                bound2 += std::fabs(p[kW2 + j * kHidden + k]) * bound1[k];
            }
            want += (double)p[kW3 + j] * (sum > 0.0 ? sum : 0.0);
            bound += std::fabs(p[kW3 + j]) * bound2;
        }
        if (!(std::fabs(out[i] - want) <= 1e-5 * bound + 1e-6)) {
            std::fprintf(stderr, "mlp: out[%zu] = %.9g, want %.9g\n", i, (double)out[i], want);
            return false;
        }
    }
    return true;
}
// warpfleet: readonly end

// --side N from the arguments the harness left; anything else is an error.
static int parse_side(const std::vector<std::string>& args) {
    long long n = 2048;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--side" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= 2 && n <= 16384) continue;
        }
        std::fprintf(stderr, "mlp: bad argument '%s' (usage: --side N, 2 <= N <= 16384)\n", args[i].c_str());
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int side = parse_side(rest);
    const int n = side * side;

    std::vector<float> points((size_t)n * kInputs), params(kParams), out(n);
    make_network(params);
    make_points(points, side, opt.seed);

    float *d_points = nullptr, *d_params = nullptr, *d_out = nullptr;
    WF_CHECK(cudaMalloc(&d_points, points.size() * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_params, kParams * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_out, (size_t)n * sizeof(float)));
    WF_CHECK(cudaMemcpy(d_points, points.data(), points.size() * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_params, params.data(), kParams * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_out, 0xFF, (size_t)n * sizeof(float)));  // NaN: a point never written fails the check

    const unsigned grid = (unsigned)((n + BLOCK - 1) / BLOCK);
    wf::bench(opt, [&](cudaStream_t stream) {
        mlp_forward<<<grid, BLOCK, 0, stream>>>(n, d_points, d_params + kW1, d_params + kB1, d_params + kW2,
                                                d_params + kB2, d_params + kW3, d_params + kB3, d_out);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(out.data(), d_out, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_points));
    WF_CHECK(cudaFree(d_params));
    WF_CHECK(cudaFree(d_out));
    if (!check(points, params, out)) return 1;
    wf::write_output("out.bin", out.data(), out.size());
    // warpfleet: readonly end
    return 0;
}
