/* Copyright (c) 2022, NVIDIA CORPORATION. All rights reserved.
 *
 * Redistribution and use in source and binary forms, with or without
 * modification, are permitted provided that the following conditions
 * are met:
 *  * Redistributions of source code must retain the above copyright
 *    notice, this list of conditions and the following disclaimer.
 *  * Redistributions in binary form must reproduce the above copyright
 *    notice, this list of conditions and the following disclaimer in the
 *    documentation and/or other materials provided with the distribution.
 *  * Neither the name of NVIDIA CORPORATION nor the names of its
 *    contributors may be used to endorse or promote products derived
 *    from this software without specific prior written permission.
 *
 * THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS ``AS IS'' AND ANY
 * EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
 * IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 * PURPOSE ARE DISCLAIMED.  IN NO EVENT SHALL THE COPYRIGHT OWNER OR
 * CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
 * EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO,
 * PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR
 * PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY
 * OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT
 * (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
 * OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 */

/**
 * Matrix multiplication: C = A * B.
 * Host code.
 *
 * This sample implements matrix multiplication which makes use of shared memory
 * to ensure data reuse, the matrix multiplication is done using tiling approach.
 * It has been written for clarity of exposition to illustrate various CUDA programming
 * principles, not with the goal of providing the most performant generic kernel for matrix multiplication.
 * See also:
 * V. Volkov and J. Demmel, "Benchmarking GPUs to tune dense linear algebra,"
 * in Proc. 2008 ACM/IEEE Conf. on Supercomputing (SC '08),
 * Piscataway, NJ: IEEE Press, 2008, pp. Art. 31:1-11.
 */

// System includes
#include <assert.h>
#include <stdio.h>

// CUDA runtime
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

// Helper functions and utilities to work with CUDA
#include <helper_cuda.h>
#include <helper_functions.h>

// warpfleet: the timing harness (wf::bench), seeded inputs and the output file
#include <warpfleet/harness.cuh>


/**
 * warpfleet: matrixMul_opt, a hand-optimized kernel in place of the sample's MatrixMulCUDA<BLOCK_SIZE>
 * (the rest of this file is matrixMul.cu as edited for warpfleet). Each block computes a 128 x 128
 * tile of C with 256 threads, each thread an 8 x 8 sub-tile held in registers, so that every value
 * read from shared memory serves 8 multiply-adds (the sample's: 1). A and B come in through 16-byte
 * loads, one float4 of each per thread per k-step of 8, and the next k-step's loads are issued
 * before this one's math (register double buffering). A's tile is stored transposed, so that a
 * thread's 8 rows are two float4 reads; a thread's rows (and columns) are two groups of 4, 64
 * apart, so a warp's shared-memory reads are contiguous (no bank conflicts). Each output is summed
 * in increasing k, one multiply-add at a time, as in the sample. The kernel is warpfleet's
 * configs/targets/matmul/matmul_opt.cu with the sample's parameters (wA, wB: A is hA x wA, B is
 * wA x wB). Needs hA and wB multiples of 128 and wA a multiple of 8.
 */
constexpr int kBlockTile  = 128;            // C tile per block, square
constexpr int kStepK      = 8;              // k per shared-memory step
constexpr int kThreadTile = 8;              // C tile per thread: two groups of 4 rows (columns)...
constexpr int kGroupGap   = kBlockTile / 2; // ...this far apart
constexpr int kThreads    = (kBlockTile / kThreadTile) * (kBlockTile / kThreadTile); // 256

__device__ inline float4 load4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

__global__ void __launch_bounds__(kThreads)
    MatrixMulRegisterBlocked(float *__restrict__ C, const float *__restrict__ A, const float *__restrict__ B, int wA, int wB)
{
    __shared__ __align__(16) float a_tile[kStepK][kBlockTile]; // transposed: a_tile[k][row]
    __shared__ __align__(16) float b_tile[kStepK][kBlockTile];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16; // this thread's column and row group
    const int row0 = blockIdx.y * kBlockTile, col0 = blockIdx.x * kBlockTile;
    // This thread's share of each k-step: A's row tid / 2, k (tid % 2) * 4 + 0..3, and B's row
    // tid / 32, columns (tid % 32) * 4 + 0..3.
    const int    a_row = tid / 2, a_k = (tid % 2) * 4, b_row = tid / 32, b_col = (tid % 32) * 4;
    const float *a_src = A + (size_t)(row0 + a_row) * wA + a_k;
    const float *b_src = B + (size_t)b_row * wB + col0 + b_col;

    float  acc[kThreadTile][kThreadTile] = {};
    float4 a_next = load4(a_src), b_next = load4(b_src);
    for (int k0 = 0; k0 < wA; k0 += kStepK) {
        a_tile[a_k + 0][a_row] = a_next.x;
        a_tile[a_k + 1][a_row] = a_next.y;
        a_tile[a_k + 2][a_row] = a_next.z;
        a_tile[a_k + 3][a_row] = a_next.w;
        *reinterpret_cast<float4 *>(&b_tile[b_row][b_col]) = b_next;
        __syncthreads();
        if (k0 + kStepK < wA) { // in flight while this step computes
            a_next = load4(a_src + k0 + kStepK);
            b_next = load4(b_src + (size_t)(k0 + kStepK) * wB);
        }
#pragma unroll
        for (int k = 0; k < kStepK; ++k) {
            const float4 a_lo = load4(&a_tile[k][ty * 4]), a_hi = load4(&a_tile[k][kGroupGap + ty * 4]);
            const float4 b_lo = load4(&b_tile[k][tx * 4]), b_hi = load4(&b_tile[k][kGroupGap + tx * 4]);
            const float  av[kThreadTile] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
            const float  bv[kThreadTile] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
            for (int i = 0; i < kThreadTile; ++i)
#pragma unroll
                for (int j = 0; j < kThreadTile; ++j)
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kThreadTile; ++i) {
        const int row = row0 + (i / 4) * kGroupGap + ty * 4 + i % 4;
        float    *dst = C + (size_t)row * wB + col0 + tx * 4;
        *reinterpret_cast<float4 *>(dst)             = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        *reinterpret_cast<float4 *>(dst + kGroupGap) = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
}

void ConstantInit(float *data, int size, float val)
{
    for (int i = 0; i < size; ++i) {
        data[i] = val;
    }
}

/**
 * Run a simple test of matrix multiplication using CUDA
 */
int MatrixMultiply(int argc, char **argv, int block_size, const dim3 &dimsA, const dim3 &dimsB)
{
    // warpfleet: --seed and the harness's options; the sample's own -name=value flags are left
    std::vector<std::string> sampleArgs;
    const wf::Options        opt = wf::parse_options(argc, argv, &sampleArgs);

    // Allocate host memory for matrices A and B
    unsigned int size_A     = dimsA.x * dimsA.y;
    unsigned int mem_size_A = sizeof(float) * size_A;
    float       *h_A;
    checkCudaErrors(cudaMallocHost(&h_A, mem_size_A));
    unsigned int size_B     = dimsB.x * dimsB.y;
    unsigned int mem_size_B = sizeof(float) * size_B;
    float       *h_B;
    checkCudaErrors(cudaMallocHost(&h_B, mem_size_B));
    cudaStream_t stream;

    // Initialize host memory
    // warpfleet: readonly begin
    // warpfleet: random inputs in [0, 1) from --seed instead of constants (1.0 and 0.01), so that
    // the output file tells a wrong index from a right one
    wf::fill_uniform(h_A, size_A, opt.seed, 0.0f, 1.0f);
    wf::fill_uniform(h_B, size_B, opt.seed + 1, 0.0f, 1.0f);
    // warpfleet: readonly end

    // Allocate device memory
    float *d_A, *d_B, *d_C;

    // Allocate host matrix C
    dim3         dimsC(dimsB.x, dimsA.y, 1);
    unsigned int mem_size_C = dimsC.x * dimsC.y * sizeof(float);
    float       *h_C;
    checkCudaErrors(cudaMallocHost(&h_C, mem_size_C));

    if (h_C == NULL) {
        fprintf(stderr, "Failed to allocate host matrix C!\n");
        exit(EXIT_FAILURE);
    }

    checkCudaErrors(cudaMalloc(reinterpret_cast<void **>(&d_A), mem_size_A));
    checkCudaErrors(cudaMalloc(reinterpret_cast<void **>(&d_B), mem_size_B));
    checkCudaErrors(cudaMalloc(reinterpret_cast<void **>(&d_C), mem_size_C));
    // Allocate CUDA events that we'll use for timing
    cudaEvent_t start, stop;
    checkCudaErrors(cudaEventCreate(&start));
    checkCudaErrors(cudaEventCreate(&stop));

    checkCudaErrors(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // copy host memory to device
    checkCudaErrors(cudaMemcpyAsync(d_A, h_A, mem_size_A, cudaMemcpyHostToDevice, stream));
    checkCudaErrors(cudaMemcpyAsync(d_B, h_B, mem_size_B, cudaMemcpyHostToDevice, stream));

    // Setup execution parameters
    // warpfleet: matrixMul_opt's blocks: 256 threads, a 128 x 128 tile of C each
    dim3 threads(kThreads);
    dim3 grid(dimsB.x / kBlockTile, dimsA.y / kBlockTile);

    // Create and start timer
    printf("Computing result using CUDA Kernel...\n");

    // warpfleet: the warm-up and the 300 timed launches between two events replaced by the
    // harness, which warms up, flushes the L2 before each sample and prints every sample
    const wf::Result timing = wf::bench(
        opt,
        [&](cudaStream_t s) {
            MatrixMulRegisterBlocked<<<grid, threads, 0, s>>>(d_C, d_A, d_B, dimsA.x, dimsB.x);
        },
        stream);

    printf("done\n");
    float msecTotal = timing.median_ms;
    int   nIter     = 1;

    // Compute and print the performance
    float  msecPerMatrixMul = msecTotal / nIter;
    double flopsPerMatrixMul =
        2.0 * static_cast<double>(dimsA.x) * static_cast<double>(dimsA.y) * static_cast<double>(dimsB.x);
    double gigaFlops = (flopsPerMatrixMul * 1.0e-9f) / (msecPerMatrixMul / 1000.0f);
    printf("Performance= %.2f GFlop/s, Time= %.3f msec, Size= %.0f Ops,"
           " WorkgroupSize= %u threads/block\n",
           gigaFlops,
           msecPerMatrixMul,
           flopsPerMatrixMul,
           threads.x * threads.y);

    // warpfleet: readonly begin
    // Copy result from device to host
    checkCudaErrors(cudaMemcpyAsync(h_C, d_C, mem_size_C, cudaMemcpyDeviceToHost, stream));
    checkCudaErrors(cudaStreamSynchronize(stream));

    printf("Checking computed result for correctness: ");
    bool correct = true;

    // test relative error by the formula
    //     |<x, y>_cpu - <x,y>_gpu|/<|x|, |y|>  < eps
    double eps = 1.e-6; // machine zero

    // warpfleet: the reference is a CPU product (double) of every 64th row and the last one,
    // instead of the constant dimsA.x * valB; the sample's error test is unchanged
    std::vector<double> refRow(dimsC.x);
    for (int row = 0; row < static_cast<int>(dimsC.y); row++) {
        if (row % 64 != 0 && row != static_cast<int>(dimsC.y) - 1) {
            continue;
        }
        std::fill(refRow.begin(), refRow.end(), 0.0);
        for (int k = 0; k < static_cast<int>(dimsA.x); k++) {
            const double a = h_A[row * dimsA.x + k];
            for (int col = 0; col < static_cast<int>(dimsC.x); col++) {
                refRow[col] += a * h_B[k * dimsB.x + col];
            }
        }
        for (int col = 0; col < static_cast<int>(dimsC.x); col++) {
            int    i          = row * dimsC.x + col;
            double abs_err    = fabs(h_C[i] - refRow[col]);
            double dot_length = dimsA.x;
            double abs_val    = fabs(h_C[i]);
            double rel_err    = abs_err / abs_val / dot_length;

            if (rel_err > eps) {
                printf("Error! Matrix[%05d]=%.8f, ref=%.8f error term is > %E\n", i, h_C[i], refRow[col], eps);
                correct = false;
            }
        }
    }

    // warpfleet: the output file, compared with the baseline's (C, float32, row-major)
    wf::write_output("out.bin", h_C, dimsC.x * dimsC.y);
    // warpfleet: readonly end

    printf("%s\n", correct ? "Result = PASS" : "Result = FAIL");

    // Clean up memory
    checkCudaErrors(cudaFreeHost(h_A));
    checkCudaErrors(cudaFreeHost(h_B));
    checkCudaErrors(cudaFreeHost(h_C));
    checkCudaErrors(cudaFree(d_A));
    checkCudaErrors(cudaFree(d_B));
    checkCudaErrors(cudaFree(d_C));
    checkCudaErrors(cudaEventDestroy(start));
    checkCudaErrors(cudaEventDestroy(stop));
    printf("\nNOTE: The CUDA Samples are not meant for performance "
           "measurements. Results may vary when GPU Boost is enabled.\n");

    if (correct) {
        return EXIT_SUCCESS;
    }
    else {
        return EXIT_FAILURE;
    }
}


/**
 * Program main
 */
int main(int argc, char **argv)
{
    printf("[Matrix Multiply Using CUDA] - Starting...\n");

    if (checkCmdLineFlag(argc, (const char **)argv, "help") || checkCmdLineFlag(argc, (const char **)argv, "?")) {
        printf("Usage -device=n (n >= 0 for deviceID)\n");
        printf("      -wA=WidthA -hA=HeightA (Width x Height of Matrix A)\n");
        printf("      -wB=WidthB -hB=HeightB (Width x Height of Matrix B)\n");
        printf("  Note: Outer matrix dimensions of A & B matrices"
               " must be equal.\n");

        exit(EXIT_SUCCESS);
    }

    // This will pick the best possible CUDA capable device, otherwise
    // override the device ID based on input provided at the command line
    int dev = findCudaDevice(argc, (const char **)argv);

    int block_size = 32;

    dim3 dimsA(5 * 2 * block_size, 5 * 2 * block_size, 1);
    dim3 dimsB(5 * 4 * block_size, 5 * 2 * block_size, 1);

    // width of Matrix A
    if (checkCmdLineFlag(argc, (const char **)argv, "wA")) {
        dimsA.x = getCmdLineArgumentInt(argc, (const char **)argv, "wA");
    }

    // height of Matrix A
    if (checkCmdLineFlag(argc, (const char **)argv, "hA")) {
        dimsA.y = getCmdLineArgumentInt(argc, (const char **)argv, "hA");
    }

    // width of Matrix B
    if (checkCmdLineFlag(argc, (const char **)argv, "wB")) {
        dimsB.x = getCmdLineArgumentInt(argc, (const char **)argv, "wB");
    }

    // height of Matrix B
    if (checkCmdLineFlag(argc, (const char **)argv, "hB")) {
        dimsB.y = getCmdLineArgumentInt(argc, (const char **)argv, "hB");
    }

    if (dimsA.x != dimsB.y) {
        printf("Error: outer matrix dimensions must be equal. (%d != %d)\n", dimsA.x, dimsB.y);
        exit(EXIT_FAILURE);
    }

    printf("MatrixA(%d,%d), MatrixB(%d,%d)\n", dimsA.x, dimsA.y, dimsB.x, dimsB.y);

    checkCudaErrors(cudaProfilerStart());
    int matrix_result = MatrixMultiply(argc, argv, block_size, dimsA, dimsB);
    checkCudaErrors(cudaProfilerStop());

    exit(matrix_result);
}
