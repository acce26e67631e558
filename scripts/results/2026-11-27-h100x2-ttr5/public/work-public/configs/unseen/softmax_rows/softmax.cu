// Row-wise softmax of a float32 matrix (logits of a batch of rows over a vocabulary of 1000), one
// block per row, with the three passes of the textbook version: the row's maximum (a strided loop,
// then a shared-memory tree), the sum of exp(x - max) (the same), and the normalized outputs.
//
// BLOCK  threads per block (a power of two, 32 .. 1024): the tree reduction halves it
//
// Usage: softmax [--rows R] [--cols C] [--seed S] [--reps N]
// Times N launches with CUDA events and prints one "@warpfleet time_ms=<ms>" line per launch
// (after one untimed launch). Checks every element against a CPU softmax in double (exit 1 naming
// the first bad one) and writes the output matrix (float32, R * C values) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
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

static_assert(BLOCK >= 32 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK must be a power of two in [32, 1024]");

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t err_ = (call);                                                                  \
        if (err_ != cudaSuccess) {                                                                  \
            std::fprintf(stderr, "softmax: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                         cudaGetErrorString(err_));                                                 \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

__global__ void softmax_rows(const float* x, float* y, int cols) {
    __shared__ float red[BLOCK];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    const int t = threadIdx.x;

    float m = -INFINITY;
    for (int c = t; c < cols; c += BLOCK) m = fmaxf(m, row[c]);
    red[t] = m;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) red[t] = fmaxf(red[t], red[t + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();

    float sum = 0.0f;
    for (int c = t; c < cols; c += BLOCK) sum += expf(row[c] - m);
    red[t] = sum;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) red[t] += red[t + s];
        __syncthreads();
    }
    sum = red[0];

    for (int c = t; c < cols; c += BLOCK) out[c] = expf(row[c] - m) / sum;
}

// warpfleet: readonly begin
// Logits: splitmix64 from the seed, uniform in [-8, 8), plus one large logit per row (a peaked
// distribution, as a trained model's are) at a position drawn from the seed.
static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void make_logits(std::vector<float>& x, int rows, int cols, uint64_t seed) {
    uint64_t state = seed * 0xD1B54A32D192ED03ull + 1;
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)((splitmix64(state) >> 40) * (16.0 / 16777216.0) - 8.0);
    for (int r = 0; r < rows; ++r) x[(size_t)r * cols + splitmix64(state) % (uint64_t)cols] += 12.0f;
}

// Every element against a softmax computed in double; the tolerance is far above float rounding
// (and --use_fast_math's exp), far below any real error.
static bool check(const std::vector<float>& x, const std::vector<float>& y, int rows, int cols) {
    std::vector<double> e(cols);
    for (int r = 0; r < rows; ++r) {
        const float* row = &x[(size_t)r * cols];
        double m = -INFINITY, sum = 0.0;
        for (int c = 0; c < cols; ++c) m = row[c] > m ? row[c] : m;
        for (int c = 0; c < cols; ++c) sum += e[c] = std::exp((double)row[c] - m);
        for (int c = 0; c < cols; ++c) {
            const double want = e[c] / sum;
            const float got = y[(size_t)r * cols + c];
            if (!(std::fabs(got - want) <= 1e-5 * want + 1e-9)) {
                std::fprintf(stderr, "softmax: y[%d][%d] = %.9g, want %.9g\n", r, c, (double)got, want);
                return false;
            }
        }
    }
    return true;
}
// warpfleet: readonly end

static long long parse_int(const char* flag, const char* text, long long lo, long long hi) {
    char* end;
    const long long value = std::strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value < lo || value > hi) {
        std::fprintf(stderr, "softmax: %s wants an integer in [%lld, %lld], got '%s'\n", flag, lo, hi, text);
        std::exit(2);
    }
    return value;
}

int main(int argc, char** argv) {
    int rows = 16384, cols = 1000, reps = 20;
    uint64_t seed = 0;
    for (int i = 1; i < argc; ++i) {
        if (i + 1 < argc && std::strcmp(argv[i], "--rows") == 0) {
            rows = (int)parse_int("--rows", argv[++i], 1, 1 << 20);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--cols") == 0) {
            cols = (int)parse_int("--cols", argv[++i], 1, 1 << 20);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--seed") == 0) {
            seed = (uint64_t)parse_int("--seed", argv[++i], 0, 1LL << 62);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--reps") == 0) {
            reps = (int)parse_int("--reps", argv[++i], 1, 100000);
        } else {
            std::fprintf(stderr, "usage: softmax [--rows R] [--cols C] [--seed S] [--reps N]\n");
            return 2;
        }
    }
    const size_t count = (size_t)rows * cols, bytes = count * sizeof(float);

    std::vector<float> x(count), y(count);
    make_logits(x, rows, cols, seed);

    float *d_x = nullptr, *d_y = nullptr;
    CUDA_CHECK(cudaMalloc(&d_x, bytes));
    CUDA_CHECK(cudaMalloc(&d_y, bytes));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_y, 0xFF, bytes));  // NaN: an element never written fails the check

    // warpfleet: readonly begin
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r <= reps; ++r) {  // launch 0 is a warm-up, not printed
        CUDA_CHECK(cudaEventRecord(start));
        // warpfleet: readonly end
        softmax_rows<<<rows, BLOCK>>>(d_x, d_y, cols);
        // warpfleet: readonly begin
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r > 0) std::printf("@warpfleet time_ms=%.6f\n", ms);
    }
    CUDA_CHECK(cudaMemcpy(y.data(), d_y, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    if (!check(x, y, rows, cols)) return 1;
    FILE* file = std::fopen("out.bin", "wb");
    if (!file || std::fwrite(y.data(), sizeof(float), count, file) != count || std::fclose(file) != 0) {
        std::perror("softmax: writing out.bin");
        return 2;
    }
    // warpfleet: readonly end
    return 0;
}
