// A matrix transpose through a shared-memory tile, as a kernel target (kind: kernel): warpfleet
// compiles this kernel alone (NVRTC) and launches it in its GPU host process, with the params as -D
// defines and the launch computed from them (target.yaml).
//
// TILE  the tile's side (threads per block in x)
// ROWS  threads per block in y: each thread moves TILE / ROWS elements of its column
// PAD   one extra column in the tile (1) keeps a warp's column reads on 32 different banks
#ifndef TILE
#define TILE 32
#endif
#ifndef ROWS
#define ROWS 8
#endif
#ifndef PAD
#define PAD 0
#endif

extern "C" __global__ void transpose(float* __restrict__ out, const float* __restrict__ in, int width, int height) {
    __shared__ float tile[TILE][TILE + PAD];
    int x = blockIdx.x * TILE + threadIdx.x;
    int y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS) {
        if (x < width && y + j < height) tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(y + j) * width + x];
    }
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += ROWS) {
        if (x < height && y + j < width) out[(size_t)(y + j) * height + x] = tile[threadIdx.x][threadIdx.y + j];
    }
}
