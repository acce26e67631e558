// 2D convolution (in the CNN sense: no flip) of a float32 image with a 7 x 7 filter, zero
// padding at the borders: out[y][x] = sum_{ky,kx} f[ky][kx] * in[y + ky - 3][x + kx - 3].
// Shared-memory halo tiling: a block loads its output tile plus a 3-pixel halo once, then each
// thread computes TILE outputs of one column from shared memory. The filter is read from global
// memory (cached).
//
// BLOCK_X  threads per block in x (16, 32, 64): the tile's width
// BLOCK_Y  threads per block in y (2, 4, 8, 16)
// TILE     outputs per thread in y (1, 2, 4): rows y, y + BLOCK_Y, ...; the tile is
//          BLOCK_X x (BLOCK_Y * TILE) outputs, and shared memory holds it plus the halo:
//          (BLOCK_X + 6) * (BLOCK_Y * TILE + 6) floats, at most 19.6 KB.
//
// Usage: conv2d [harness options, HARNESS_API.md] [--width W] [--height H]   (default 2048 x 2048)
// Every output is summed in the order ky, then kx with one fmaf each, so all params give the
// same bits. Checks that every pixel was written (the output starts as NaN) and a fixed sample
// (8 rows and columns at each border, and every 29th row: 29 is prime to every tile height, so
// those rows meet every row position in a tile) against a float64 CPU reference; exit 1 naming
// the first bad index. Writes the output image (float32, W * H values, 16 MiB at 2048^2) to out.bin.
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
#ifndef TILE
#define TILE 1
#endif

constexpr int kRadius = 3;
constexpr int kTaps = 2 * kRadius + 1;
constexpr int kBlockX = BLOCK_X, kBlockY = BLOCK_Y, kTile = TILE;
constexpr int kTileRows = kBlockY * kTile;  // output rows per block
constexpr int kHaloW = kBlockX + 2 * kRadius, kHaloH = kTileRows + 2 * kRadius;

static_assert(kBlockX * kBlockY >= 1 && kBlockX * kBlockY <= 1024, "BLOCK_X * BLOCK_Y must be in [1, 1024]");
static_assert(kTile >= 1, "TILE must be at least 1");
static_assert(kHaloW * kHaloH * sizeof(float) <= 48 * 1024, "the tile and its halo must fit 48 KiB");

__global__ void __launch_bounds__(kBlockX * kBlockY) conv2d(int width, int height, const float* __restrict__ in,
                                                           const float* __restrict__ filter, float* __restrict__ out) {
    __shared__ float halo[kHaloH][kHaloW];
    const int x0 = blockIdx.x * kBlockX, y0 = blockIdx.y * kTileRows;
    for (int i = threadIdx.y * kBlockX + threadIdx.x; i < kHaloH * kHaloW; i += kBlockX * kBlockY) {
        const int hy = i / kHaloW, hx = i % kHaloW;
        const int gy = y0 + hy - kRadius, gx = x0 + hx - kRadius;
        halo[hy][hx] = gy >= 0 && gy < height && gx >= 0 && gx < width ? in[(size_t)gy * width + gx] : 0.0f;
    }
    __syncthreads();
    const int x = x0 + threadIdx.x;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
        const int ty = threadIdx.y + t * kBlockY;  // the output's row in the tile
        float acc = 0.0f;
#pragma unroll
        for (int ky = 0; ky < kTaps; ++ky)
#pragma unroll
            for (int kx = 0; kx < kTaps; ++kx) acc = fmaf(filter[ky * kTaps + kx], halo[ty + ky][threadIdx.x + kx], acc);
        if (x < width && y0 + ty < height) out[(size_t)(y0 + ty) * width + x] = acc;
    }
}

// The CPU reference for one pixel, in float64, and the sum of its terms' magnitudes.
static double reference(const float* image, const float* filter, int width, int height, int x, int y,
                        double* magnitude) {
    double sum = 0, mag = 0;
    for (int ky = 0; ky < kTaps; ++ky) {
        const int gy = y + ky - kRadius;
        if (gy < 0 || gy >= height) continue;
        for (int kx = 0; kx < kTaps; ++kx) {
            const int gx = x + kx - kRadius;
            if (gx < 0 || gx >= width) continue;
            const double term = (double)filter[ky * kTaps + kx] * image[(size_t)gy * width + gx];
            sum += term;
            mag += std::fabs(term);
        }
    }
    *magnitude = mag;
    return sum;
}

// The first wrong pixel in row-major order; true when all are right. The tolerance, 4e-6 times
// the sum of the terms' magnitudes, bounds fp32 rounding over 49 fused terms (49 * 2^-24 = 2.9e-6).
static bool check(const float* image, const float* filter, const std::vector<float>& out, int width, int height) {
    const int edge = 8;
    for (int y = 0; y < height; ++y) {
        const bool whole_row = y < edge || y >= height - edge || y % 29 == 0;
        for (int x = 0; x < width; ++x) {
            const float got = out[(size_t)y * width + x];
            if (!std::isfinite(got)) {
                std::fprintf(stderr, "conv2d: out[%d][%d] (index %zu) = %g (never written?)\n", y, x,
                             (size_t)y * width + x, (double)got);
                return false;
            }
            if (!whole_row && x >= edge && x < width - edge) continue;
            double magnitude;
            const double want = reference(image, filter, width, height, x, y, &magnitude);
            if (!(std::fabs(got - want) <= 4e-6 * magnitude + 1e-7)) {
                std::fprintf(stderr, "conv2d: out[%d][%d] (index %zu) = %.9g, want %.9g\n", y, x,
                             (size_t)y * width + x, (double)got, want);
                return false;
            }
        }
    }
    return true;
}

struct Size {
    int width = 2048, height = 2048;
};

// --width W and --height H from the arguments the harness left; anything else is an error.
static Size parse_size(const std::vector<std::string>& args) {
    Size size;
    for (size_t i = 0; i < args.size(); ++i) {
        int* field = args[i] == "--width" ? &size.width : args[i] == "--height" ? &size.height : nullptr;
        char* end = nullptr;
        if (field && i + 1 < args.size()) {
            const long long v = std::strtoll(args[++i].c_str(), &end, 10);
            *field = (int)v;
            if (*end == '\0' && v >= 16 && v <= 16384) continue;
        }
        std::fprintf(stderr, "conv2d: bad argument '%s' (usage: --width W --height H, each in [16, 16384])\n",
                     args[i].c_str());
        std::exit(2);
    }
    return size;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const Size size = parse_size(rest);
    const size_t pixels = (size_t)size.width * size.height, bytes = pixels * sizeof(float);

    std::vector<float> inputs(pixels + kTaps * kTaps), out(pixels);  // the image, then the filter
    wf::fill_uniform(inputs.data(), inputs.size(), opt.seed);
    const float *image = inputs.data(), *filter = inputs.data() + pixels;
    float *d_image = nullptr, *d_filter = nullptr, *d_out = nullptr;
    WF_CHECK(cudaMalloc(&d_image, bytes));
    WF_CHECK(cudaMalloc(&d_filter, kTaps * kTaps * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_out, bytes));
    WF_CHECK(cudaMemcpy(d_image, image, bytes, cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_filter, filter, kTaps * kTaps * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_out, 0xFF, bytes));  // NaN: a pixel never written fails the check

    const dim3 block(kBlockX, kBlockY);
    const dim3 grid((size.width + kBlockX - 1) / kBlockX, (size.height + kTileRows - 1) / kTileRows);
    wf::bench(opt, [&](cudaStream_t stream) {
        conv2d<<<grid, block, 0, stream>>>(size.width, size.height, d_image, d_filter, d_out);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_image));
    WF_CHECK(cudaFree(d_filter));
    WF_CHECK(cudaFree(d_out));
    if (!check(image, filter, out, size.width, size.height)) return 1;
    wf::write_output("out.bin", out.data(), pixels);
    // warpfleet: readonly end
    return 0;
}
