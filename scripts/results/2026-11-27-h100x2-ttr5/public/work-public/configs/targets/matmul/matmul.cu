// SGEMM, C = A * B for n x n row-major float32 matrices: the textbook shared-memory tiled kernel,
// with the tile side, the outputs per thread and the k-loop unrolling as tuning params.
//
// TILE    side of the square tiles of A, B and C that a block works on (8, 16, 32)
// WPT     outputs per thread (1, 2, 4, 8): the block has TILE x TILE/WPT threads, and thread
//         (x, y) computes column x of rows y, y + TILE/WPT, ...: each B value read from shared
//         memory serves WPT outputs. Needs TILE % WPT == 0.
// UNROLL  unrolling of the loop over a tile's k (1 = not unrolled)
// Static shared memory: 2 * TILE * TILE floats (8 KiB at TILE = 32).
//
// Usage: matmul [harness options, HARNESS_API.md] [--n N]   (N a multiple of 128, default 2048)
// Every output is summed in increasing k with one fmaf each, so all params give the same bits.
// Checks that every element was written (C starts as NaN) and a fixed sample (the first and last
// rows and columns, and 4096 scattered entries) against a float64 CPU reference; exit 1 naming
// the first bad index. Writes C (float32, N * N values: 16 MiB at N = 2048) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef TILE
#define TILE 16
#endif
#ifndef WPT
#define WPT 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

constexpr int kTile = TILE;
constexpr int kWpt = WPT;
constexpr int kUnroll = UNROLL;  // a constant, not the macro: nvcc does not expand macros in #pragma unroll
constexpr int kRowStep = kTile / kWpt;  // threads per block in y; a thread's rows are this far apart

static_assert(kTile >= 1 && kTile <= 32, "TILE must be in [1, 32]");
static_assert(kWpt >= 1 && kTile % kWpt == 0, "WPT must divide TILE");
static_assert(kUnroll >= 1, "UNROLL must be at least 1");
static_assert(2 * kTile * kTile * sizeof(float) <= 48 * 1024, "the tiles must fit 48 KiB of static shared memory");
constexpr int kSizeMultiple = 128;  // the sizes the program accepts: every TILE divides them

__global__ void __launch_bounds__(kTile * kRowStep) sgemm_tiled(int n, const float* __restrict__ a,
                                                               const float* __restrict__ b, float* __restrict__ c) {
    __shared__ float a_tile[kTile][kTile];
    __shared__ float b_tile[kTile][kTile];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * kTile, col = blockIdx.x * kTile + tx;
    float acc[kWpt];
#pragma unroll
    for (int w = 0; w < kWpt; ++w) acc[w] = 0.0f;

    for (int k0 = 0; k0 < n; k0 += kTile) {
#pragma unroll
        for (int w = 0; w < kWpt; ++w) {
            const int r = ty + w * kRowStep;
            a_tile[r][tx] = a[(size_t)(row0 + r) * n + k0 + tx];
            b_tile[r][tx] = b[(size_t)(k0 + r) * n + col];
        }
        __syncthreads();
#pragma unroll kUnroll
        for (int k = 0; k < kTile; ++k) {
            const float bk = b_tile[k][tx];
#pragma unroll
            for (int w = 0; w < kWpt; ++w) acc[w] = fmaf(a_tile[ty + w * kRowStep][k], bk, acc[w]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int w = 0; w < kWpt; ++w) c[(size_t)(row0 + ty + w * kRowStep) * n + col] = acc[w];
}

// The entries checked against the CPU, in increasing index: the first and last rows and
// columns (tile edges at the matrix border) and 4096 scattered ones (a fixed LCG).
static std::vector<size_t> sample_entries(int n) {
    std::vector<size_t> picks;
    for (int j = 0; j < n; ++j) {
        picks.push_back(j);
        picks.push_back((size_t)(n - 1) * n + j);
        picks.push_back((size_t)j * n);
        picks.push_back((size_t)j * n + n - 1);
    }
    uint64_t state = 0x2545F4914F6CDD1Dull;
    for (int s = 0; s < 4096; ++s) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        picks.push_back((state >> 17) % ((size_t)n * n));
    }
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    return picks;
}

// The tolerance, 2e-6 * sum_k |a_ik b_kj| (1e-3 at n = 2048), is some 8x the worst fp32 rounding
// seen on a CPU replay of the kernel's order of FMAs; a wrong index or a lost term is off by far
// more (one term is 0.25 on average).
static bool check(const float* a, const float* b, const std::vector<float>& c, int n) {
    for (size_t i = 0; i < c.size(); ++i) {
        if (!std::isfinite(c[i])) {
            std::fprintf(stderr, "matmul: C[%zu] (row %zu, column %zu) = %g (never written?)\n", i, i / n, i % n,
                         (double)c[i]);
            return false;
        }
    }
    std::vector<float> bt((size_t)n * n);  // B transposed: the reference reads its columns in order
    for (int k = 0; k < n; ++k)
        for (int j = 0; j < n; ++j) bt[(size_t)j * n + k] = b[(size_t)k * n + j];
    for (size_t idx : sample_entries(n)) {
        const size_t row = idx / n, col = idx % n;
        double want = 0, magnitude = 0;
        for (int k = 0; k < n; ++k) {
            const double term = (double)a[row * n + k] * (double)bt[col * n + k];
            want += term;
            magnitude += std::fabs(term);
        }
        if (!(std::fabs(c[idx] - want) <= 2e-6 * magnitude)) {
            std::fprintf(stderr, "matmul: C[%zu] (row %zu, column %zu) = %.9g, want %.9g\n", idx, row, col,
                         (double)c[idx], want);
            return false;
        }
    }
    return true;
}

// --n N from the arguments the harness left; anything else is an error.
static int parse_n(const std::vector<std::string>& args) {
    long long n = 2048;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--n" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= kSizeMultiple && n <= 16384 && n % kSizeMultiple == 0) continue;
        }
        std::fprintf(stderr, "matmul: bad argument '%s' (usage: --n N, N a multiple of %d in [%d, 16384])\n",
                     args[i].c_str(), kSizeMultiple, kSizeMultiple);
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int n = parse_n(rest);
    const size_t count = (size_t)n * n, bytes = count * sizeof(float);

    std::vector<float> inputs(2 * count), c(count);  // A then B, one stream of the seed
    wf::fill_uniform(inputs.data(), inputs.size(), opt.seed);
    const float *a = inputs.data(), *b = inputs.data() + count;
    float *da = nullptr, *db = nullptr, *dc = nullptr;
    WF_CHECK(cudaMalloc(&da, bytes));
    WF_CHECK(cudaMalloc(&db, bytes));
    WF_CHECK(cudaMalloc(&dc, bytes));
    WF_CHECK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(dc, 0xFF, bytes));  // NaN: an element never written fails the check

    const dim3 block(kTile, kRowStep), grid(n / kTile, n / kTile);
    wf::bench(opt, [&](cudaStream_t stream) { sgemm_tiled<<<grid, block, 0, stream>>>(n, da, db, dc); });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(da));
    WF_CHECK(cudaFree(db));
    WF_CHECK(cudaFree(dc));
    if (!check(a, b, c, n)) return 1;
    wf::write_output("out.bin", c.data(), count);
    // warpfleet: readonly end
    return 0;
}
