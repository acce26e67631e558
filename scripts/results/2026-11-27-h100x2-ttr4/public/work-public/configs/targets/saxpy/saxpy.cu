// A SAXPY-like CUDA kernel for the GPU demo: out = a * p(x) + y, with p a degree-8 polynomial
// evaluated by Horner's rule (8 FMAs per element), so that per-thread work, registers and
// unrolling matter on top of the memory traffic.
//
// BLOCK  threads per block (64..1024).
// ITEMS  elements per thread per tile (1, 2, 4, 8): all loads of a tile are issued before the
//        math, so more items mean more memory parallelism per thread and more registers.
//
// Usage: saxpy [--n N] [--reps R]
// Prints one "@warpfleet time_ms=<ms>" line per timed launch (cudaEvent timing); checks a
// sample of the result against a CPU reference (exit 1 if wrong); writes the result (float32,
// n values) to out.bin. Every CUDA call is checked; any error exits non-zero.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef ITEMS
#define ITEMS 1
#endif

static_assert(BLOCK >= 32 && BLOCK <= 1024 && BLOCK % 32 == 0, "BLOCK must be a multiple of 32 in [32, 1024]");
static_assert(ITEMS >= 1 && ITEMS <= 64, "ITEMS must be in [1, 64]");

#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            std::fprintf(stderr, "saxpy: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                         cudaGetErrorString(err_));                                          \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

constexpr int kDegree = 8;
__constant__ float c_coef[kDegree + 1];

__host__ __device__ inline float poly_axpy(float a, float x, float y, const float* coef) {
    float p = coef[kDegree];
    for (int k = kDegree - 1; k >= 0; --k) p = fmaf(p, x, coef[k]);
    return fmaf(a, p, y);
}

// Each block handles tiles of BLOCK * ITEMS consecutive elements; thread t takes elements
// t, t + BLOCK, ... of a tile, so every load and store is coalesced. The grid-stride loop over
// tiles keeps the kernel correct for any grid size.
__global__ void __launch_bounds__(BLOCK)
saxpy_poly(long long n, float a, const float* __restrict__ x, const float* __restrict__ y,
           float* __restrict__ out) {
    constexpr long long tile = (long long)BLOCK * ITEMS;
    for (long long base = (long long)blockIdx.x * tile; base < n; base += (long long)gridDim.x * tile) {
        float xv[ITEMS], yv[ITEMS];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            long long i = base + threadIdx.x + (long long)k * BLOCK;
            xv[k] = i < n ? x[i] : 0.0f;
            yv[k] = i < n ? y[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            long long i = base + threadIdx.x + (long long)k * BLOCK;
            if (i < n) out[i] = poly_axpy(a, xv[k], yv[k], c_coef);
        }
    }
}

// A fixed-seed xorshift generator: the same inputs on every machine.
static uint32_t next_random(uint32_t& state) {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
}

static float uniform(uint32_t& state) {  // in [-1, 1)
    return (next_random(state) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static long long parse_int(const char* flag, const char* text, long long lo, long long hi) {
    char* end;
    long long value = std::strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value < lo || value > hi) {
        std::fprintf(stderr, "saxpy: %s wants an integer in [%lld, %lld], got '%s'\n", flag, lo, hi, text);
        std::exit(2);
    }
    return value;
}

int main(int argc, char** argv) {
    long long n = 1LL << 24;
    int reps = 20;
    for (int i = 1; i < argc; ++i) {
        if (i + 1 < argc && std::strcmp(argv[i], "--n") == 0) {
            n = parse_int("--n", argv[++i], 1, 1LL << 30);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--reps") == 0) {
            reps = (int)parse_int("--reps", argv[++i], 10, 100000);
        } else {
            std::fprintf(stderr, "usage: saxpy [--n N] [--reps R>=10]\n");
            return 2;
        }
    }

    const float a = 1.5f;
    float coef[kDegree + 1];
    for (int k = 0; k <= kDegree; ++k) coef[k] = (k % 2 ? -1.0f : 1.0f) / (float)(k + 1);
    std::vector<float> x(n), y(n), out(n);
    uint32_t state = 2463534242u;
    for (long long i = 0; i < n; ++i) x[i] = uniform(state);
    for (long long i = 0; i < n; ++i) y[i] = uniform(state);

    const size_t bytes = (size_t)n * sizeof(float);
    float *d_x, *d_y, *d_out;
    CUDA_CHECK(cudaMalloc(&d_x, bytes));
    CUDA_CHECK(cudaMalloc(&d_y, bytes));
    CUDA_CHECK(cudaMalloc(&d_out, bytes));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_y, y.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpyToSymbol(c_coef, coef, sizeof(coef)));

    // One pass over the data: one block per tile (at most 2^30 / 64 blocks, within grid limits).
    const long long tile = (long long)BLOCK * ITEMS;
    const unsigned grid = (unsigned)((n + tile - 1) / tile);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));

    saxpy_poly<<<grid, BLOCK>>>(n, a, d_x, d_y, d_out);  // warm-up
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; ++r) {
        // The kernel writes a separate output buffer, so every launch computes the same result.
        CUDA_CHECK(cudaEventRecord(start));
        saxpy_poly<<<grid, BLOCK>>>(n, a, d_x, d_y, d_out);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        std::printf("@warpfleet time_ms=%.6f\n", ms);
    }
    CUDA_CHECK(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost));

    // Check the first and last elements and a random sample in between against the CPU.
    long long wrong = 0, checked = 0;
    uint32_t pick = 88172645u;
    for (long long s = 0; s < 65536 + 2048; ++s) {
        long long i = s < 1024 ? s : s < 2048 ? n - 1 - (s - 1024) : (long long)(next_random(pick) % (uint64_t)n);
        if (i < 0 || i >= n) continue;
        float ref = poly_axpy(a, x[i], y[i], coef);
        ++checked;
        if (!(std::fabs(out[i] - ref) <= 1e-5f * std::fabs(ref) + 1e-6f)) {
            if (wrong++ < 5) std::fprintf(stderr, "saxpy: out[%lld] = %.9g, expected %.9g\n", i, out[i], ref);
        }
    }
    if (wrong) {
        std::fprintf(stderr, "saxpy: %lld of %lld checked elements are wrong\n", wrong, checked);
        return 1;
    }

    FILE* file = std::fopen("out.bin", "wb");
    if (!file || std::fwrite(out.data(), sizeof(float), (size_t)n, file) != (size_t)n || std::fclose(file) != 0) {
        std::perror("saxpy: writing out.bin");
        return 1;
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    CUDA_CHECK(cudaFree(d_out));
    return 0;
}
