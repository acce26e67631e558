// Sparse matrix-vector product y = A * x with A in CSR form (row pointers, column indices, values),
// the scalar kernel: one thread per row, looping over the row's non-zeros and gathering x.
// The matrix is square, with rows of 8 to 40 non-zeros near the diagonal and one row in 1024 much
// denser (1500 non-zeros), as matrices from meshes with a few coupling rows are: the rows' lengths
// differ within a warp, and x is gathered through the column indices.
//
// BLOCK  threads per block (32 .. 1024)
//
// Usage: spmv [harness options, HARNESS_API.md] [--rows N]   (N rows and columns, default 2^19)
// Each timed sample is one product (wf::bench). Checks every y[i] against a CPU product in double
// (exit 1 naming the first bad row) and writes y (float32, N values) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
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

__global__ void spmv_csr_scalar(int rows, const int* row_ptr, const int* cols, const float* vals, const float* x,
                                float* y) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < rows) {
        float sum = 0.0f;
        for (int k = row_ptr[row]; k < row_ptr[row + 1]; ++k) sum += vals[k] * x[cols[k]];
        y[row] = sum;
    }
}

// warpfleet: readonly begin
constexpr int kDenseEvery = 1024;  // one row in kDenseEvery is dense
constexpr int kDenseLength = 1500;
constexpr int kMaxGap = 8;         // consecutive columns of a row are 1 .. kMaxGap apart

struct Csr {
    int rows = 0;
    std::vector<int> row_ptr, cols;
    std::vector<float> vals;
};

static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The matrix from the seed: row r has 8 + (draw % 33) non-zeros (kDenseLength every kDenseEvery
// rows), at increasing columns from a start within 32768 of the diagonal, values uniform in
// [-1, 1). Columns stay below `rows`: the start is clamped to leave room for the row.
static Csr make_matrix(int rows, uint64_t seed) {
    Csr a;
    a.rows = rows;
    a.row_ptr.resize((size_t)rows + 1);
    uint64_t state = seed * 0xD1B54A32D192ED03ull + 7;
    a.row_ptr[0] = 0;
    for (int r = 0; r < rows; ++r) {
        const int length = r % kDenseEvery == kDenseEvery / 2 ? kDenseLength : 8 + (int)(splitmix64(state) % 33);
        long long start = (long long)r - 32768 + (long long)(splitmix64(state) % 65536);
        const long long last_start = (long long)rows - 1 - (long long)kMaxGap * length;
        if (start > last_start) start = last_start;
        if (start < 0) start = 0;
        long long c = start;
        for (int k = 0; k < length; ++k) {
            const uint64_t draw = splitmix64(state);
            c += 1 + (long long)(draw % kMaxGap);
            a.cols.push_back((int)c);
            a.vals.push_back((float)((draw >> 40) * (2.0 / 16777216.0) - 1.0));
        }
        a.row_ptr[(size_t)r + 1] = (int)a.cols.size();
    }
    return a;
}

// Every row against the product in double, within 1e-5 of the row's sum of |a_ij * x_j| (float
// rounding in any summation order is far below that).
static bool check(const Csr& a, const std::vector<float>& x, const std::vector<float>& y) {
    for (int r = 0; r < a.rows; ++r) {
        double want = 0.0, scale = 0.0;
        for (int k = a.row_ptr[r]; k < a.row_ptr[(size_t)r + 1]; ++k) {
            const double term = (double)a.vals[k] * x[a.cols[k]];
            want += term;
            scale += std::fabs(term);
        }
        if (!(std::fabs(y[r] - want) <= 1e-5 * scale + 1e-6)) {
            std::fprintf(stderr, "spmv: y[%d] = %.9g, want %.9g\n", r, (double)y[r], want);
            return false;
        }
    }
    return true;
}
// warpfleet: readonly end

// --rows N from the arguments the harness left; anything else is an error.
static int parse_rows(const std::vector<std::string>& args) {
    long long n = 1 << 19;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--rows" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= 2 * kMaxGap * kDenseLength && n <= (1 << 24)) continue;
        }
        std::fprintf(stderr, "spmv: bad argument '%s' (usage: --rows N, %d <= N <= 2^24)\n", args[i].c_str(),
                     2 * kMaxGap * kDenseLength);
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int rows = parse_rows(rest);

    const Csr a = make_matrix(rows, opt.seed);
    const size_t nnz = a.cols.size();
    std::vector<float> x(rows), y(rows);
    wf::fill_uniform(x.data(), x.size(), opt.seed + 1);

    int *d_row_ptr = nullptr, *d_cols = nullptr;
    float *d_vals = nullptr, *d_x = nullptr, *d_y = nullptr;
    WF_CHECK(cudaMalloc(&d_row_ptr, ((size_t)rows + 1) * sizeof(int)));
    WF_CHECK(cudaMalloc(&d_cols, nnz * sizeof(int)));
    WF_CHECK(cudaMalloc(&d_vals, nnz * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_x, (size_t)rows * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_y, (size_t)rows * sizeof(float)));
    WF_CHECK(cudaMemcpy(d_row_ptr, a.row_ptr.data(), ((size_t)rows + 1) * sizeof(int), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_cols, a.cols.data(), nnz * sizeof(int), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_vals, a.vals.data(), nnz * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpy(d_x, x.data(), (size_t)rows * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_y, 0xFF, (size_t)rows * sizeof(float)));  // NaN: a row never written fails the check

    const unsigned grid = (unsigned)((rows + BLOCK - 1) / BLOCK);
    wf::bench(opt, [&](cudaStream_t stream) {
        spmv_csr_scalar<<<grid, BLOCK, 0, stream>>>(rows, d_row_ptr, d_cols, d_vals, d_x, d_y);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(y.data(), d_y, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_row_ptr));
    WF_CHECK(cudaFree(d_cols));
    WF_CHECK(cudaFree(d_vals));
    WF_CHECK(cudaFree(d_x));
    WF_CHECK(cudaFree(d_y));
    if (!check(a, x, y)) return 1;
    wf::write_output("out.bin", y.data(), y.size());
    // warpfleet: readonly end
    return 0;
}
