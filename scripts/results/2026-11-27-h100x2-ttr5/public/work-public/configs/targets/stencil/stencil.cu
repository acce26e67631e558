// One Jacobi step of the 2D 5-point stencil on an n x n float32 grid: every interior point becomes
// the mean of itself and its four neighbours, out[y][x] = 0.2 * (c + north + south + west + east);
// border points are copied. The CUDA sibling of the C demo target stencil_c.
//
// BLOCK_X    threads per block in x (32, 64, 128, 256): one column each
// BLOCK_Y    threads per block in y (1, 2, 4, 8, 16)
// OUTPUTS_Y  rows per thread (1, 2, 4, 8): a thread walks down its column over OUTPUTS_Y
//            consecutive rows, keeping the centre and north values in registers, so each input
//            row is read from memory once per column instead of three times. OUTPUTS_Y = 1 is the
//            textbook one-point-per-thread kernel (the baseline).
// The block covers BLOCK_X columns and BLOCK_Y * OUTPUTS_Y rows.
//
// Usage: stencil [harness options, HARNESS_API.md] [--n N]   (N a multiple of 256, default 2048)
// The five values are summed in one fixed order, so all params give the same bits. Checks every
// point (the output starts as NaN) against the CPU, which computes the same float expression; exit 1
// naming the first bad index. Writes the output grid (float32, N * N values, 16 MiB at 2048) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef BLOCK_X
#define BLOCK_X 32
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 8
#endif
#ifndef OUTPUTS_Y
#define OUTPUTS_Y 1
#endif

constexpr int kBlockX = BLOCK_X, kBlockY = BLOCK_Y, kOutputsY = OUTPUTS_Y;
static_assert(kBlockX * kBlockY >= 1 && kBlockX * kBlockY <= 1024, "BLOCK_X * BLOCK_Y must be in [1, 1024]");
static_assert(kOutputsY >= 1, "OUTPUTS_Y must be at least 1");
constexpr int kSizeMultiple = 256;  // the sizes the program accepts: every block shape divides them

__global__ void __launch_bounds__(kBlockX * kBlockY) jacobi_step(int n, const float* __restrict__ in,
                                                                 float* __restrict__ out) {
    const int x = blockIdx.x * kBlockX + threadIdx.x;
    const int y0 = (blockIdx.y * kBlockY + threadIdx.y) * kOutputsY;  // this thread's first row
    if (x >= n || y0 >= n) return;
    float north = y0 > 0 ? in[(size_t)(y0 - 1) * n + x] : 0.0f;
    float centre = in[(size_t)y0 * n + x];
#pragma unroll
    for (int r = 0; r < kOutputsY; ++r) {
        const int y = y0 + r;
        if (y >= n) break;
        const size_t i = (size_t)y * n + x;
        const float south = y + 1 < n ? in[i + n] : 0.0f;
        const bool border = x == 0 || y == 0 || x == n - 1 || y == n - 1;
        out[i] = border ? centre : 0.2f * ((((centre + north) + south) + in[i - 1]) + in[i + 1]);
        north = centre;
        centre = south;
    }
}

// The first wrong point in row-major order; true when all are right. The CPU evaluates the same
// float expression in the same order, so a correct kernel matches it to the bit; the tolerance is
// room for a flag such as --use_fast_math.
static bool check(const std::vector<float>& in, const std::vector<float>& out, int n) {
    for (int y = 0; y < n; ++y) {
        for (int x = 0; x < n; ++x) {
            const size_t i = (size_t)y * n + x;
            const bool border = x == 0 || y == 0 || x == n - 1 || y == n - 1;
            const float want =
                border ? in[i] : 0.2f * ((((in[i] + in[i - n]) + in[i + n]) + in[i - 1]) + in[i + 1]);
            if (!(std::fabs(out[i] - want) <= 1e-6f)) {
                std::fprintf(stderr, "stencil: out[%d][%d] (index %zu) = %.9g, want %.9g\n", y, x, i, (double)out[i],
                             (double)want);
                return false;
            }
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
        std::fprintf(stderr, "stencil: bad argument '%s' (usage: --n N, N a multiple of %d in [%d, 16384])\n",
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

    std::vector<float> in(count), out(count);
    wf::fill_uniform(in.data(), count, opt.seed);
    float *d_in = nullptr, *d_out = nullptr;
    WF_CHECK(cudaMalloc(&d_in, bytes));
    WF_CHECK(cudaMalloc(&d_out, bytes));
    WF_CHECK(cudaMemcpy(d_in, in.data(), bytes, cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_out, 0xFF, bytes));  // NaN: a point never written fails the check

    const dim3 block(kBlockX, kBlockY);
    const dim3 grid((n + kBlockX - 1) / kBlockX, (n + kBlockY * kOutputsY - 1) / (kBlockY * kOutputsY));
    wf::bench(opt, [&](cudaStream_t stream) { jacobi_step<<<grid, block, 0, stream>>>(n, d_in, d_out); });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_in));
    WF_CHECK(cudaFree(d_out));
    if (!check(in, out, n)) return 1;
    wf::write_output("out.bin", out.data(), count);
    // warpfleet: readonly end
    return 0;
}
