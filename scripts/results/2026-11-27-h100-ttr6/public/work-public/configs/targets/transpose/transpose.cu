// transpose: a shared-memory tiled matrix transpose, out = in^T (in: rows x cols floats).
//
// A block of TILE x BLOCK_ROWS threads moves one TILE x TILE tile: it reads the tile's rows from
// `in` (coalesced), stores them in shared memory, and writes the tile's columns as rows of `out`
// (coalesced again), each thread covering TILE / BLOCK_ROWS elements. The shared tile is
// tile[TILE][TILE + PAD] with PAD = 0 here: the column reads tile[threadIdx.x][...] of a warp
// fall in one bank (TILE = 32: a 32-way conflict; TILE = 16: 8-way). PAD is not a param of this
// target; transpose_opt.cu pads to TILE + 1 (reported on an H100, 8192 x 8192: 0.335 ms
// unpadded, 0.192 ms padded).
//
// Usage: transpose [--rows R] [--cols C] [harness options, HARNESS_API.md]
//   R and C multiples of 32 (both tiles divide them); `in` drawn from --seed.
// Checks every element of one out row in four against `in` (every row up to 2^24 elements; the
// row offsets rotate from one tile band to the next, so every tile and every offset in a tile is
// checked from 4 bands on). out.bin holds rows 32a + (a mod 32), a < 256, of out (C x R): every
// tile band once, every row offset in a tile, whole rows; 8 MiB at 8192 x 8192. The kernel
// always transposes the whole matrix.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#ifndef TILE
#define TILE 32
#endif
#ifndef BLOCK_ROWS
#define BLOCK_ROWS 8
#endif
#ifndef PAD
#define PAD 0
#endif

static_assert(TILE == 16 || TILE == 32, "TILE must be 16 or 32");
static_assert(BLOCK_ROWS >= 1 && BLOCK_ROWS <= TILE && TILE % BLOCK_ROWS == 0, "BLOCK_ROWS must divide TILE");
static_assert(PAD >= 0 && PAD <= 8, "PAD must be in [0, 8]");
constexpr int kAlign = 32;  // --rows and --cols granularity: every TILE divides it

__global__ void transpose(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[TILE][TILE + PAD];
  int x = blockIdx.x * TILE + threadIdx.x;  // a column of in
  int y = blockIdx.y * TILE + threadIdx.y;  // a row of in
#pragma unroll
  for (int j = 0; j < TILE; j += BLOCK_ROWS) tile[threadIdx.y + j][threadIdx.x] = in[size_t(y + j) * cols + x];
  __syncthreads();
  x = blockIdx.y * TILE + threadIdx.x;  // a column of out: a row of in
  y = blockIdx.x * TILE + threadIdx.y;  // a row of out
#pragma unroll
  for (int j = 0; j < TILE; j += BLOCK_ROWS) out[size_t(y + j) * rows + x] = tile[threadIdx.x][threadIdx.y + j];
}

static long parse_count(const std::string& flag, const std::string& text, long lo, long hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi || v % kAlign != 0) {
    std::fprintf(stderr, "transpose: %s wants a multiple of %d in [%ld, %ld], got '%s'\n", flag.c_str(), kAlign,
                 lo, hi, text.c_str());
    std::exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  std::vector<std::string> rest;
  const wf::Options opt = wf::parse_options(argc, argv, &rest);
  long rows = 8192, cols = 8192;
  for (size_t a = 0; a < rest.size(); a += 2) {
    if (a + 1 < rest.size() && rest[a] == "--rows") {
      rows = parse_count(rest[a], rest[a + 1], kAlign, 1 << 16);
    } else if (a + 1 < rest.size() && rest[a] == "--cols") {
      cols = parse_count(rest[a], rest[a + 1], kAlign, 1 << 16);
    } else {
      std::fprintf(stderr, "transpose: bad argument '%s' (usage: [--rows R] [--cols C])\n", rest[a].c_str());
      return 2;
    }
  }
  if (size_t(rows) * cols > (size_t(1) << 28)) {
    std::fprintf(stderr, "transpose: rows * cols must be at most 2^28\n");
    return 2;
  }

  // Uninitialised host buffers (no value-initialisation pass over 2 x 256 MiB).
  const size_t count = size_t(rows) * cols, bytes = count * sizeof(float);
  const std::unique_ptr<float[]> in(new float[count]), out(new float[count]);
  wf::fill_uniform(in.get(), count, opt.seed);

  float *d_in = nullptr, *d_out = nullptr;
  WF_CHECK(cudaMalloc(&d_in, bytes));
  WF_CHECK(cudaMalloc(&d_out, bytes));
  WF_CHECK(cudaMemcpy(d_in, in.get(), bytes, cudaMemcpyHostToDevice));
  WF_CHECK(cudaMemset(d_out, 0xFF, bytes));  // NaN: an element never written fails the check

  const dim3 grid(unsigned(cols / TILE), unsigned(rows / TILE)), block(TILE, BLOCK_ROWS);
  wf::bench(opt, [&](cudaStream_t stream) {
    transpose<<<grid, block, 0, stream>>>(d_in, d_out, int(rows), int(cols));
  });
  // warpfleet: readonly begin
  WF_CHECK(cudaMemcpy(out.get(), d_out, bytes, cudaMemcpyDeviceToHost));
  WF_CHECK(cudaFree(d_in));
  WF_CHECK(cudaFree(d_out));

  // out is cols x rows: out[r][c] = in[c][r]. Checked in bands of 32 rows of out and 64 of its
  // columns, so that the strided reads of `in` stay in the cache; compared bit for bit. Up to
  // 2^24 elements every row, above that one row in four (a full check of 2^26 takes ~0.5 s).
  const long every = count <= (size_t(1) << 24) ? 1 : 4;
  for (long r0 = 0; r0 < cols; r0 += 32) {
    for (long c0 = 0; c0 < rows; c0 += 64) {
      for (long r = r0 + (r0 / 32) % every; r < r0 + 32; r += every) {
        for (long c = c0; c < c0 + 64 && c < rows; ++c) {
          const float got = out[size_t(r) * rows + c], want = in[size_t(c) * cols + r];
          if (!(got == want)) {  // NaN fails too
            std::fprintf(stderr, "transpose: out[%ld][%ld] = %.9g, want %.9g (index %zu)\n", r, c, double(got),
                         double(want), size_t(r) * rows + c);
            return 1;
          }
        }
      }
    }
  }

  // Rows 32a + (a mod 32) of out: every tile band once, every row offset in a tile 8 times.
  const long picked = std::min<long>(256, cols / 32);
  std::vector<float> image(size_t(picked) * rows);
  for (long a = 0; a < picked; ++a) {
    const float* row = out.get() + size_t(32 * a + a % 32) * rows;
    std::copy(row, row + rows, image.begin() + a * rows);
  }
  wf::write_output("out.bin", image.data(), image.size());
  // warpfleet: readonly end
  return 0;
}
