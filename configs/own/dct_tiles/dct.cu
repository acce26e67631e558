// The 2-D DCT-II of every 32x32 tile of a grey image, as a block transform codec computes it (32x32
// is HEVC's largest transform). One block per tile: it stages the tile and the 32x32 basis in shared
// memory, transforms the rows (rows[r][u] = sum_x tile[r][x] * basis[u][x]) and then the columns
// (coeffs[v][u] = sum_r basis[v][r] * rows[r][u]). A block is 32 x BLOCK_ROWS threads: threadIdx.x
// is the frequency u (and the column when loading), threadIdx.y picks every BLOCK_ROWS-th row.
//
// BLOCK_ROWS  threads of a block along y (1 .. 32, a divisor of 32): the block is 32 x BLOCK_ROWS
//
// Usage: dct [harness options, HARNESS_API.md] [--size N]   (an N x N image, N a multiple of 32, default 4096)
// Each timed sample transforms the whole image (wf::bench). Checks every tile's DC coefficient and
// all coefficients of one tile in 31 against a CPU transform in double (exit 1 naming the first bad
// coefficient) and writes the coefficients (float32, N * N values, tile by tile in place) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef BLOCK_ROWS
#define BLOCK_ROWS 8
#endif

#define TILE 32

static_assert(BLOCK_ROWS >= 1 && BLOCK_ROWS <= TILE && TILE % BLOCK_ROWS == 0, "BLOCK_ROWS must divide 32");

__global__ void dct32x32(const float* image, const float* basis_in, float* coeffs, int width) {
    __shared__ float basis[TILE][TILE];
    __shared__ float pixels[TILE][TILE];
    __shared__ float rows[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const size_t x0 = (size_t)blockIdx.x * TILE, y0 = (size_t)blockIdx.y * TILE;

    for (int r = ty; r < TILE; r += BLOCK_ROWS) {
        basis[r][tx] = basis_in[r * TILE + tx];
        pixels[r][tx] = image[(y0 + r) * width + x0 + tx];
    }
    __syncthreads();

    // Each row's 32 frequencies: thread tx computes frequency u = tx of rows ty, ty + BLOCK_ROWS, ...
    for (int r = ty; r < TILE; r += BLOCK_ROWS) {
        float sum = 0.0f;
        for (int x = 0; x < TILE; ++x) sum += pixels[r][x] * basis[tx][x];
        rows[r][tx] = sum;
    }
    __syncthreads();

    // Then each column of the row-transformed tile: coefficient (v, u = tx) for v = ty, ty + BLOCK_ROWS, ...
    for (int v = ty; v < TILE; v += BLOCK_ROWS) {
        float sum = 0.0f;
        for (int r = 0; r < TILE; ++r) sum += basis[v][r] * rows[r][tx];
        coeffs[(y0 + v) * width + x0 + tx] = sum;
    }
}

// warpfleet: readonly begin
// The orthonormal DCT-II basis: basis[u][x] = s(u) cos(pi (2x + 1) u / 64), s(0) = sqrt(1/32),
// s(u) = sqrt(2/32) otherwise.
static void make_basis(std::vector<double>& basis) {
    const double pi = 3.14159265358979323846;
    for (int u = 0; u < TILE; ++u)
        for (int x = 0; x < TILE; ++x)
            basis[u * TILE + x] = std::sqrt((u == 0 ? 1.0 : 2.0) / TILE) * std::cos(pi * (2 * x + 1) * u / (2.0 * TILE));
}

// Every coefficient is finite (the output starts as NaN: a coefficient never written fails), every
// tile's DC coefficient is its pixels' sum / 32 (s(0)^2 = 1/32), and every coefficient of each 31st
// tile matches a transform in double (about 40 ms of CPU in all at 4096 x 4096). The tolerance,
// 1e-6 of the tile's pixel sum (about 0.13 at a mean grey of 128) plus 1e-3, is about ten times
// float32's worst rounding of the two 32-term sums in any order, and a hundred times below one
// missing or misplaced term (a pixel of about 128 times two basis values of about 0.18).
static bool check(const std::vector<float>& image, const std::vector<float>& coeffs, const std::vector<double>& basis,
                  int size) {
    for (size_t i = 0; i < coeffs.size(); ++i) {
        if (!std::isfinite(coeffs[i])) {
            std::fprintf(stderr, "dct: coefficient %zu = %g, not finite\n", i, (double)coeffs[i]);
            return false;
        }
    }
    const int tiles = size / TILE;
    std::vector<double> rows(TILE * TILE);
    for (int ty = 0; ty < tiles; ++ty) {
        for (int tx = 0; tx < tiles; ++tx) {
            const size_t origin = (size_t)ty * TILE * size + (size_t)tx * TILE;
            double sum = 0.0, magnitude = 0.0;
            for (int r = 0; r < TILE; ++r)
                for (int x = 0; x < TILE; ++x) {
                    sum += image[origin + (size_t)r * size + x];
                    magnitude += std::fabs(image[origin + (size_t)r * size + x]);
                }
            const double tolerance = 1e-6 * magnitude + 1e-3;
            // One tile in 31, not 32: the tiles checked in full fall in every column.
            const bool full = (ty * tiles + tx) % 31 == 0;
            for (int r = 0; full && r < TILE; ++r)
                for (int u = 0; u < TILE; ++u) {
                    double s = 0.0;
                    for (int x = 0; x < TILE; ++x) s += image[origin + (size_t)r * size + x] * basis[u * TILE + x];
                    rows[r * TILE + u] = s;
                }
            for (int v = 0; v < (full ? TILE : 1); ++v)
                for (int u = 0; u < (full ? TILE : 1); ++u) {
                    double want = sum / TILE;
                    if (full) {
                        want = 0.0;
                        for (int r = 0; r < TILE; ++r) want += basis[v * TILE + r] * rows[r * TILE + u];
                    }
                    const float got = coeffs[origin + (size_t)v * size + u];
                    if (!(std::fabs(got - want) <= tolerance)) {
                        std::fprintf(stderr, "dct: tile (%d, %d), coefficient (%d, %d) = %.9g, want %.9g\n", ty, tx, v, u,
                                     (double)got, want);
                        return false;
                    }
                }
        }
    }
    return true;
}
// warpfleet: readonly end

// --size N from the arguments the harness left; anything else is an error.
static int parse_size(const std::vector<std::string>& args) {
    long long n = 4096;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--size" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= TILE && n <= 16384 && n % TILE == 0) continue;
        }
        std::fprintf(stderr, "dct: bad argument '%s' (usage: --size N, a multiple of 32 in [32, 16384])\n",
                     args[i].c_str());
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int size = parse_size(rest);
    const size_t count = (size_t)size * size, bytes = count * sizeof(float);

    std::vector<float> image(count), coeffs(count), basis(TILE * TILE);
    wf::fill_uniform(image.data(), count, opt.seed, 0.0f, 256.0f);  // grey levels
    std::vector<double> basis64(TILE * TILE);
    make_basis(basis64);
    for (int i = 0; i < TILE * TILE; ++i) basis[i] = (float)basis64[i];

    float *d_image = nullptr, *d_basis = nullptr, *d_coeffs = nullptr;
    WF_CHECK(cudaMalloc(&d_image, bytes));
    WF_CHECK(cudaMalloc(&d_basis, TILE * TILE * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_coeffs, bytes));
    WF_CHECK(cudaMemcpy(d_image, image.data(), bytes, cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_basis, basis.data(), TILE * TILE * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_coeffs, 0xFF, bytes));  // NaN: a coefficient never written fails the check

    const dim3 block(TILE, BLOCK_ROWS), grid(size / TILE, size / TILE);
    wf::bench(opt, [&](cudaStream_t stream) {
        dct32x32<<<grid, block, 0, stream>>>(d_image, d_basis, d_coeffs, size);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(coeffs.data(), d_coeffs, bytes, cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_image));
    WF_CHECK(cudaFree(d_basis));
    WF_CHECK(cudaFree(d_coeffs));
    if (!check(image, coeffs, basis64, size)) return 1;
    wf::write_output("out.bin", coeffs.data(), coeffs.size());
    // warpfleet: readonly end
    return 0;
}
