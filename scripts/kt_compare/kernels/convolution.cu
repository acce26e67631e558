// 2D convolution of a 1024 x 1024 float32 image with a 17 x 17 filter in constant memory, tiled through
// shared memory: written in the form of Kernel Tuner's documented examples (a kernel file whose
// tunable parameters are macros with defaults, the image size fixed at compile time), for the
// comparison of warpfleet with Kernel Tuner (scripts/bench_kerneltuner.py).
//
// block_size_x, block_size_y  threads per block
// tile_size_x, tile_size_y    outputs per thread in x and y: a block computes a
//                             (block_size_x * tile_size_x) x (block_size_y * tile_size_y) tile of
//                             the output and stages that tile plus its 16-pixel border in shared memory
//
// output[y][x] = sum over fy, fx of input[y + fy][x + fx] * filter[fy][fx], the input already padded
// by the border (input_width x input_height). Every output is summed in the order fy, then fx with
// one fmaf each, so all parameter values give the same bits.
#ifndef image_width
#define image_width 1024
#endif
#ifndef image_height
#define image_height 1024
#endif
#define filter_width 17
#define filter_height 17
#define border_width (filter_width / 2 * 2)
#define border_height (filter_height / 2 * 2)
#define input_width (image_width + border_width)
#define input_height (image_height + border_height)

#ifndef block_size_x
#define block_size_x 16
#endif
#ifndef block_size_y
#define block_size_y 16
#endif
#ifndef tile_size_x
#define tile_size_x 1
#endif
#ifndef tile_size_y
#define tile_size_y 1
#endif

#define tile_width (block_size_x * tile_size_x)
#define tile_height (block_size_y * tile_size_y)

__constant__ float d_filter[filter_height * filter_width];

extern "C" __global__ void convolution_kernel(float* __restrict__ output, const float* __restrict__ input) {
    __shared__ float sh_input[tile_height + border_height][tile_width + border_width];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int bx = blockIdx.x * tile_width, by = blockIdx.y * tile_height;

    for (int i = ty; i < tile_height + border_height; i += block_size_y) {
        for (int j = tx; j < tile_width + border_width; j += block_size_x) {
            const int y = by + i, x = bx + j;
            sh_input[i][j] = y < input_height && x < input_width ? input[y * input_width + x] : 0.0f;
        }
    }
    __syncthreads();

    float sum[tile_size_y][tile_size_x];
#pragma unroll
    for (int yi = 0; yi < tile_size_y; yi++)
#pragma unroll
        for (int xi = 0; xi < tile_size_x; xi++) sum[yi][xi] = 0.0f;

    for (int fy = 0; fy < filter_height; fy++) {
        for (int fx = 0; fx < filter_width; fx++) {
            const float f = d_filter[fy * filter_width + fx];
#pragma unroll
            for (int yi = 0; yi < tile_size_y; yi++)
#pragma unroll
                for (int xi = 0; xi < tile_size_x; xi++)
                    sum[yi][xi] = fmaf(sh_input[ty + yi * block_size_y + fy][tx + xi * block_size_x + fx], f, sum[yi][xi]);
        }
    }

#pragma unroll
    for (int yi = 0; yi < tile_size_y; yi++) {
#pragma unroll
        for (int xi = 0; xi < tile_size_x; xi++) {
            const int y = by + ty + yi * block_size_y, x = bx + tx + xi * block_size_x;
            if (y < image_height && x < image_width) output[y * image_width + x] = sum[yi][xi];
        }
    }
}
