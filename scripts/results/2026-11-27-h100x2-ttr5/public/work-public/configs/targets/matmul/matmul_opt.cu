// SGEMM, C = A * B for n x n row-major float32 matrices, hand-optimized: each block computes a
// 128 x 128 tile of C with 256 threads, each thread an 8 x 8 sub-tile held in registers, so every
// value read from shared memory serves 8 FMAs (matmul.cu's baseline: 1). A and B come in through
// 16-byte loads, one float4 of each per thread per k-step of 8, and the next k-step's loads are
// issued before this one's math (register double buffering). A's tile is stored transposed, so
// that a thread's 8 rows are two float4 reads; a thread's rows (and columns) are two groups of 4,
// 64 apart, so a warp's shared-memory reads are contiguous (no bank conflicts).
//
// Usage: matmul_opt [harness options, HARNESS_API.md] [--n N]   (N a multiple of 128, default 2048)
// Every output is summed in increasing k with one fmaf each: the same bits as matmul.cu. The
// check and out.bin are matmul.cu's (C, float32, N * N values).
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

constexpr int kBlockTile = 128;  // C tile per block, square
constexpr int kStepK = 8;        // k per shared-memory step
constexpr int kThreadTile = 8;   // C tile per thread, square: two groups of 4 rows (columns)...
constexpr int kGroupGap = kBlockTile / 2;  // ...this far apart
constexpr int kThreads = (kBlockTile / kThreadTile) * (kBlockTile / kThreadTile);  // 256
constexpr int kSizeMultiple = kBlockTile;

static_assert(kBlockTile * kStepK == 4 * kThreads, "each thread loads one float4 of A and one of B per k-step");
static_assert(kThreadTile == 8 && kGroupGap == 16 * 4, "the index arithmetic below assumes 16 x 16 threads of 2 x 2 float4");

__device__ inline float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

__global__ void __launch_bounds__(kThreads) sgemm_register_blocked(int n, const float* __restrict__ a,
                                                                  const float* __restrict__ b,
                                                                  float* __restrict__ c) {
    __shared__ __align__(16) float a_tile[kStepK][kBlockTile];  // transposed: a_tile[k][row]
    __shared__ __align__(16) float b_tile[kStepK][kBlockTile];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;  // this thread's column and row group
    const int row0 = blockIdx.y * kBlockTile, col0 = blockIdx.x * kBlockTile;
    // This thread's share of each k-step: A's row tid / 2, k (tid % 2) * 4 + 0..3, and B's row
    // tid / 32, columns (tid % 32) * 4 + 0..3.
    const int a_row = tid / 2, a_k = (tid % 2) * 4, b_row = tid / 32, b_col = (tid % 32) * 4;
    const float* a_src = a + (size_t)(row0 + a_row) * n + a_k;
    const float* b_src = b + (size_t)b_row * n + col0 + b_col;

    float acc[kThreadTile][kThreadTile] = {};
    float4 a_next = load4(a_src), b_next = load4(b_src);
    for (int k0 = 0; k0 < n; k0 += kStepK) {
        a_tile[a_k + 0][a_row] = a_next.x;
        a_tile[a_k + 1][a_row] = a_next.y;
        a_tile[a_k + 2][a_row] = a_next.z;
        a_tile[a_k + 3][a_row] = a_next.w;
        *reinterpret_cast<float4*>(&b_tile[b_row][b_col]) = b_next;
        __syncthreads();
        if (k0 + kStepK < n) {  // in flight while this step computes
            a_next = load4(a_src + k0 + kStepK);
            b_next = load4(b_src + (size_t)(k0 + kStepK) * n);
        }
#pragma unroll
        for (int k = 0; k < kStepK; ++k) {
            const float4 a_lo = load4(&a_tile[k][ty * 4]), a_hi = load4(&a_tile[k][kGroupGap + ty * 4]);
            const float4 b_lo = load4(&b_tile[k][tx * 4]), b_hi = load4(&b_tile[k][kGroupGap + tx * 4]);
            const float av[kThreadTile] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
            const float bv[kThreadTile] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
            for (int i = 0; i < kThreadTile; ++i)
#pragma unroll
                for (int j = 0; j < kThreadTile; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kThreadTile; ++i) {
        const int row = row0 + (i / 4) * kGroupGap + ty * 4 + i % 4;
        float* dst = c + (size_t)row * n + col0 + tx * 4;
        *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *reinterpret_cast<float4*>(dst + kGroupGap) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
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

    const dim3 grid(n / kBlockTile, n / kBlockTile);
    wf::bench(opt, [&](cudaStream_t stream) {
        sgemm_register_blocked<<<grid, kThreads, 0, stream>>>(n, da, db, dc);
    });

    WF_CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(da));
    WF_CHECK(cudaFree(db));
    WF_CHECK(cudaFree(dc));
    if (!check(a, b, c, n)) return 1;
    wf::write_output("out.bin", c.data(), count);
    return 0;
}
