// Monte Carlo prices of 32 arithmetic-average Asian call options: for each option, 65536 paths of a
// geometric Brownian motion monitored daily over a year (252 steps), the normals drawn by
// Box-Muller from a counter-based generator (a hash of the seed, the option and the path, then a
// linear congruential stream), the discounted payoff of each path written out. Each thread
// simulates paths of one option in a grid-stride loop; the grid's y is the option.
//
// BLOCK             threads per block (32 .. 1024)
// PATHS_PER_THREAD  paths a thread simulates (the grid's x is 65536 / (BLOCK * PATHS_PER_THREAD))
//
// Usage: asian [harness options, HARNESS_API.md] [--steps S]   (S monitoring dates, even, default 252)
// Each timed sample simulates every path of every option (wf::bench). Checks every payoff is finite
// and every 256th path of each option against the same path in double (exit 1 naming the first bad
// one), prints each option's price and writes the payoffs (float32, 32 * 65536 values, option by
// option) to out.bin. Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef PATHS_PER_THREAD
#define PATHS_PER_THREAD 4
#endif

constexpr int kOptions = 32;
constexpr int kPaths = 65536;  // per option
constexpr float kSpot = 100.0f, kRate = 0.03f, kMaturity = 1.0f;
constexpr float kTwoPi = 6.283185307179586f;

static_assert(kPaths % (BLOCK * PATHS_PER_THREAD) == 0, "BLOCK * PATHS_PER_THREAD must divide 65536");

// lowbias32 (Chris Wellons' integer hash): the path's starting state.
__host__ __device__ inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

// The next uniform in (0, 1] of a path's stream: an LCG step, hashed, 24 bits.
__host__ __device__ inline uint32_t next_bits(uint32_t& state) {
    state = state * 1664525U + 1013904223U;
    return (hash32(state) >> 8) + 1U;
}

__global__ void asian_paths(uint32_t seed, int steps, const float* strike, const float* sigma, float* payoff) {
    const int option = blockIdx.y;
    const float k = strike[option], vol = sigma[option];
    const float dt = kMaturity / steps;
    const float drift = (kRate - 0.5f * vol * vol) * dt, diffusion = vol * sqrtf(dt);
    const float discount = expf(-kRate * kMaturity);

    for (int path = blockIdx.x * blockDim.x + threadIdx.x; path < kPaths; path += gridDim.x * blockDim.x) {
        uint32_t state = hash32(seed ^ hash32((uint32_t)(option * kPaths + path)));
        float s = kSpot, sum = 0.0f;
        for (int t = 0; t < steps; t += 2) {
            const float u1 = next_bits(state) * (1.0f / 16777216.0f);
            const float u2 = next_bits(state) * (1.0f / 16777216.0f);
            const float r = sqrtf(fmaxf(-2.0f * logf(u1), 0.0f));  // log(u1) <= 0; an approximate log may round above
            float z1, z2;
            sincosf(kTwoPi * u2, &z2, &z1);
            s *= expf(drift + diffusion * r * z1);
            sum += s;
            s *= expf(drift + diffusion * r * z2);
            sum += s;
        }
        payoff[(size_t)option * kPaths + path] = discount * fmaxf(sum / steps - k, 0.0f);
    }
}

// warpfleet: readonly begin
// The options: strikes 80, 85.7, ..., 120 at volatilities 0.15, 0.20, 0.25, 0.30 (fixed).
static void make_options(std::vector<float>& strike, std::vector<float>& sigma) {
    for (int o = 0; o < kOptions; ++o) {
        strike[o] = 80.0f + 40.0f * (float)(o % 8) / 7.0f;
        sigma[o] = 0.15f + 0.05f * (float)(o / 8);
    }
}

// Every payoff finite (out starts as NaN: a path never written fails) and every 256th path of each
// option (8192 paths, about 0.1 s of CPU) against the same draws in double. float32 drifts from
// double by about 1e-6 of the price over a path's 252 steps (4e-5 at worst, with approximate
// exp, log and sincos as well); the tolerance, 1e-2 plus 1e-4 of the path's average, is above that
// and far below a step missed or a normal drawn wrong (about 0.5 and more).
static bool check(const std::vector<float>& payoff, const std::vector<float>& strike, const std::vector<float>& sigma,
                  uint32_t seed, int steps) {
    for (size_t i = 0; i < payoff.size(); ++i) {
        if (!std::isfinite(payoff[i])) {
            std::fprintf(stderr, "asian: payoff %zu = %g, not finite\n", i, (double)payoff[i]);
            return false;
        }
    }
    const double pi2 = 6.283185307179586476925;
    for (int option = 0; option < kOptions; ++option) {
        const double vol = sigma[option], dt = (double)kMaturity / steps;
        const double drift = ((double)kRate - 0.5 * vol * vol) * dt, diffusion = vol * std::sqrt(dt);
        for (int path = 0; path < kPaths; path += 256) {
            uint32_t state = hash32(seed ^ hash32((uint32_t)(option * kPaths + path)));
            double s = kSpot, sum = 0.0;
            for (int t = 0; t < steps; t += 2) {
                const double u1 = next_bits(state) / 16777216.0, u2 = next_bits(state) / 16777216.0;
                const double r = std::sqrt(-2.0 * std::log(u1));
                s *= std::exp(drift + diffusion * r * std::cos(pi2 * u2));
                sum += s;
                s *= std::exp(drift + diffusion * r * std::sin(pi2 * u2));
                sum += s;
            }
            const double average = sum / steps;
            const double want = std::exp(-(double)kRate * kMaturity) * std::fmax(average - strike[option], 0.0);
            const float got = payoff[(size_t)option * kPaths + path];
            if (!(std::fabs(got - want) <= 1e-2 + 1e-4 * average)) {
                std::fprintf(stderr, "asian: option %d, path %d: payoff %.9g, want %.9g\n", option, path, (double)got,
                             want);
                return false;
            }
        }
    }
    return true;
}
// warpfleet: readonly end

// --steps S from the arguments the harness left; anything else is an error.
static int parse_steps(const std::vector<std::string>& args) {
    long long n = 252;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--steps" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= 2 && n <= 100000 && n % 2 == 0) continue;
        }
        std::fprintf(stderr, "asian: bad argument '%s' (usage: --steps S, even, 2 <= S <= 100000)\n", args[i].c_str());
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int steps = parse_steps(rest);
    const uint32_t seed = (uint32_t)(opt.seed ^ (opt.seed >> 32));
    const size_t count = (size_t)kOptions * kPaths;

    std::vector<float> strike(kOptions), sigma(kOptions), payoff(count);
    make_options(strike, sigma);

    float *d_strike = nullptr, *d_sigma = nullptr, *d_payoff = nullptr;
    WF_CHECK(cudaMalloc(&d_strike, kOptions * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_sigma, kOptions * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_payoff, count * sizeof(float)));
    WF_CHECK(cudaMemcpy(d_strike, strike.data(), kOptions * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_sigma, sigma.data(), kOptions * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_payoff, 0xFF, count * sizeof(float)));  // NaN: a path never written fails the check

    const dim3 grid(kPaths / (BLOCK * PATHS_PER_THREAD), kOptions);
    wf::bench(opt, [&](cudaStream_t stream) {
        asian_paths<<<grid, BLOCK, 0, stream>>>(seed, steps, d_strike, d_sigma, d_payoff);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(payoff.data(), d_payoff, count * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_strike));
    WF_CHECK(cudaFree(d_sigma));
    WF_CHECK(cudaFree(d_payoff));
    if (!check(payoff, strike, sigma, seed, steps)) return 1;
    for (int o = 0; o < kOptions; ++o) {
        double price = 0.0;
        for (int p = 0; p < kPaths; ++p) price += payoff[(size_t)o * kPaths + p];
        std::printf("option %d (strike %.2f, volatility %.2f): price %.4f\n", o, (double)strike[o], (double)sigma[o],
                    price / kPaths);
    }
    wf::write_output("out.bin", payoff.data(), payoff.size());
    // warpfleet: readonly end
    return 0;
}
