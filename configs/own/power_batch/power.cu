// The dominant eigenpair of each of eight symmetric matrices of different sizes (covariance-like:
// a dominant diagonal and small couplings), by a fixed number of power iterations: x <- A x / |A x|.
// Each matrix is solved in turn, the way the code for one matrix was written first: per iteration a
// matrix-vector product (one thread per row; the matrices are column-major, as BLAS keeps them, so a
// warp's loads are contiguous) and a normalization (one block: the norm by a shared-memory tree,
// then the scaled vector). The matrices are small: a product launches 2 to 5 blocks, a
// normalization 1.
//
// BLOCK  threads per block of both kernels (a power of two, 32 .. 1024): the tree halves it
//
// Usage: power [harness options, HARNESS_API.md]
// Each timed sample runs every matrix's iterations from the same starting vector (wf::bench). Checks
// every eigenvalue and vector against the same iterations on the CPU in double (exit 1 naming the
// first bad value) and writes the eight eigenvalues, then the eight vectors (float32, 8 + 6656
// values), to out.bin. Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
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

static_assert(BLOCK >= 32 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK must be a power of two in [32, 1024]");

constexpr int kMatrices = 8;
constexpr int kSizes[kMatrices] = {384, 512, 640, 768, 896, 1024, 1152, 1280};
constexpr int kIterations = 20;

// y = A x, A n x n column-major.
__global__ void matvec(int n, const float* a, const float* x, float* y) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n) {
        float sum = 0.0f;
        for (int k = 0; k < n; ++k) sum += a[(size_t)k * n + row] * x[k];
        y[row] = sum;
    }
}

// One block: x = y / |y|, and |y| (the eigenvalue's estimate) into *lambda.
__global__ void normalize(int n, const float* y, float* x, float* lambda) {
    __shared__ float partial[BLOCK];
    const int t = threadIdx.x;
    float sum = 0.0f;
    for (int i = t; i < n; i += BLOCK) sum += y[i] * y[i];
    partial[t] = sum;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        __syncthreads();
    }
    const float norm = sqrtf(partial[0]);
    for (int i = t; i < n; i += BLOCK) x[i] = y[i] / norm;
    if (t == 0) *lambda = norm;
}

// warpfleet: readonly begin
static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t& state, double lo, double hi) {
    return lo + (hi - lo) * (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

// Matrix m from the seed, symmetric: couplings uniform in [-1e-3, 1e-3) everywhere, and on the
// diagonal 1.0 at one row, 0.8 at another, the rest uniform in [-0.7, 0.7). The couplings move the
// eigenvalues little, so the second largest is about 0.8 of the largest: after 20 iterations its
// part of the vector is still about 1% of what it started, and one iteration more or less changes
// the result by about 2e-3 (2.2e-3 to 2.9e-3 on matrices 0 and 7 of seed 0, in numpy).
static void make_matrix(std::vector<float>& a, int n, uint64_t seed, int m) {
    uint64_t state = seed * 0xD1B54A32D192ED03ull + 11 + (uint64_t)m;
    for (int j = 0; j < n; ++j)
        for (int i = 0; i <= j; ++i) a[(size_t)j * n + i] = a[(size_t)i * n + j] = (float)uniform(state, -1e-3, 1e-3);
    const int first = (int)(splitmix64(state) % (uint64_t)n);
    const int second = (first + 1 + (int)(splitmix64(state) % (uint64_t)(n - 1))) % n;
    for (int i = 0; i < n; ++i) {
        const double d = i == first ? 1.0 : i == second ? 0.8 : uniform(state, -0.7, 0.7);
        a[(size_t)i * n + i] += (float)d;
    }
}

// The same iterations in double from the same start (about 0.1 s of CPU). The power iteration
// damps rounding errors rather than growing them: float32's stay near 1e-7 (numpy, seed 0), and the
// tolerance, 1e-4 of the vector's largest component and 1e-5 of the eigenvalue, is far below what
// one iteration more or less changes (about 2e-3).
static bool check(const std::vector<std::vector<float>>& a, const std::vector<float>& lambda,
                  const std::vector<std::vector<float>>& x) {
    for (int m = 0; m < kMatrices; ++m) {
        const int n = kSizes[m];
        std::vector<double> v(n, 1.0 / std::sqrt((double)n)), y(n);
        double norm = 0.0;
        for (int it = 0; it < kIterations; ++it) {
            for (int i = 0; i < n; ++i) y[i] = 0.0;
            for (int k = 0; k < n; ++k)
                for (int i = 0; i < n; ++i) y[i] += (double)a[m][(size_t)k * n + i] * v[k];
            norm = 0.0;
            for (int i = 0; i < n; ++i) norm += y[i] * y[i];
            norm = std::sqrt(norm);
            for (int i = 0; i < n; ++i) v[i] = y[i] / norm;
        }
        if (!(std::fabs(lambda[m] - norm) <= 1e-5 * norm)) {
            std::fprintf(stderr, "power: matrix %d: eigenvalue %.9g, want %.9g\n", m, (double)lambda[m], norm);
            return false;
        }
        double largest = 0.0;
        for (int i = 0; i < n; ++i) largest = std::fmax(largest, std::fabs(v[i]));
        for (int i = 0; i < n; ++i) {
            if (!(std::fabs(x[m][i] - v[i]) <= 1e-4 * largest)) {
                std::fprintf(stderr, "power: matrix %d: x[%d] = %.9g, want %.9g\n", m, i, (double)x[m][i], v[i]);
                return false;
            }
        }
    }
    return true;
}
// warpfleet: readonly end

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    if (!rest.empty()) {
        std::fprintf(stderr, "power: bad argument '%s' (it takes only the harness's options)\n", rest[0].c_str());
        return 2;
    }

    std::vector<std::vector<float>> a(kMatrices), x(kMatrices);
    float *d_a[kMatrices], *d_x0[kMatrices], *d_x[kMatrices], *d_y[kMatrices];
    for (int m = 0; m < kMatrices; ++m) {
        const int n = kSizes[m];
        a[m].resize((size_t)n * n);
        x[m].resize(n);
        make_matrix(a[m], n, opt.seed, m);
        const std::vector<float> start(n, 1.0f / std::sqrt((float)n));
        WF_CHECK(cudaMalloc(&d_a[m], (size_t)n * n * sizeof(float)));
        WF_CHECK(cudaMalloc(&d_x0[m], n * sizeof(float)));
        WF_CHECK(cudaMalloc(&d_x[m], n * sizeof(float)));
        WF_CHECK(cudaMalloc(&d_y[m], n * sizeof(float)));
        WF_CHECK(cudaMemcpy(d_a[m], a[m].data(), (size_t)n * n * sizeof(float), cudaMemcpyHostToDevice));
        WF_CHECK(cudaMemcpy(d_x0[m], start.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        WF_CHECK(cudaMemset(d_x[m], 0xFF, n * sizeof(float)));  // NaN: a vector never written fails the check
    }
    float* d_lambda = nullptr;
    WF_CHECK(cudaMalloc(&d_lambda, kMatrices * sizeof(float)));
    WF_CHECK(cudaMemset(d_lambda, 0xFF, kMatrices * sizeof(float)));

    wf::bench(opt, [&](cudaStream_t stream) {
        for (int m = 0; m < kMatrices; ++m) {
            const int n = kSizes[m];
            const unsigned grid = (unsigned)((n + BLOCK - 1) / BLOCK);
            for (int it = 0; it < kIterations; ++it) {
                matvec<<<grid, BLOCK, 0, stream>>>(n, d_a[m], it == 0 ? d_x0[m] : d_x[m], d_y[m]);
                normalize<<<1, BLOCK, 0, stream>>>(n, d_y[m], d_x[m], d_lambda + m);
            }
        }
    });

    // warpfleet: readonly begin
    std::vector<float> lambda(kMatrices);
    WF_CHECK(cudaMemcpy(lambda.data(), d_lambda, kMatrices * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_lambda));
    for (int m = 0; m < kMatrices; ++m) {
        WF_CHECK(cudaMemcpy(x[m].data(), d_x[m], kSizes[m] * sizeof(float), cudaMemcpyDeviceToHost));
        WF_CHECK(cudaFree(d_a[m]));
        WF_CHECK(cudaFree(d_x0[m]));
        WF_CHECK(cudaFree(d_x[m]));
        WF_CHECK(cudaFree(d_y[m]));
    }
    if (!check(a, lambda, x)) return 1;
    std::vector<float> out(lambda);
    for (int m = 0; m < kMatrices; ++m) out.insert(out.end(), x[m].begin(), x[m].end());
    wf::write_output("out.bin", out.data(), out.size());
    // warpfleet: readonly end
    return 0;
}
