// Sum of n floats in two steps: num_blocks blocks each reduce a grid-stride share of the input and
// write one partial sum; the partial sums are added afterwards (by the host here). Written in the
// form of Kernel Tuner's documented reduction example (its problem size is "num_blocks" blocks,
// not a division of n), for the comparison of warpfleet with Kernel Tuner (scripts/bench_kerneltuner.py).
//
// block_size_x  threads per block (a power of two)
// vector_width  floats per load: 1, 2 or 4 (float, float2, float4); n must be a multiple of 4
//               (Kernel Tuner's example calls it vector, a name that -D would clash with std::vector)
// num_blocks    blocks in the grid (the launch's grid size; the kernel reads gridDim.x)
// use_shuffle   0: the block's threads combine their sums through shared memory alone;
//               1: each warp combines its 32 sums with shuffles first, then the warps' sums
#ifndef block_size_x
#define block_size_x 256
#endif
#ifndef vector_width
#define vector_width 1
#endif
#ifndef use_shuffle
#define use_shuffle 0
#endif

#if vector_width == 1
#define floatvector float
#elif vector_width == 2
#define floatvector float2
#elif vector_width == 4
#define floatvector float4
#endif

__device__ __forceinline__ float lanes_sum(float v) { return v; }
__device__ __forceinline__ float lanes_sum(float2 v) { return v.x + v.y; }
__device__ __forceinline__ float lanes_sum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

extern "C" __global__ void sum_floats(float* __restrict__ partial, const float* __restrict__ input, int n) {
    const floatvector* in = reinterpret_cast<const floatvector*>(input);
    const int count = n / vector_width;
    float sum = 0.0f;
    for (int i = blockIdx.x * block_size_x + threadIdx.x; i < count; i += gridDim.x * block_size_x) {
        sum += lanes_sum(in[i]);
    }

#if use_shuffle == 1
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    __shared__ float warp_sums[block_size_x / 32 > 0 ? block_size_x / 32 : 1];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < block_size_x / 32 ? warp_sums[threadIdx.x] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
#else
    __shared__ float sh_sum[block_size_x];
    sh_sum[threadIdx.x] = sum;
    __syncthreads();
    for (int s = block_size_x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh_sum[threadIdx.x] += sh_sum[threadIdx.x + s];
        __syncthreads();
    }
    sum = sh_sum[0];
#endif
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}
