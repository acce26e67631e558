// A small CUDA program for rehearsing an LLM setup (scripts/llm_rehearsal.py): one kernel with a
// run-time loop, which the scripted conversations of script.json unroll by a searched factor.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void row_sums(const float* a, float* sums, int rows, int cols) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (int c = 0; c < cols; ++c) acc += a[r * cols + c];
  sums[r] = acc;
}

int main() {
  const int rows = 1024, cols = 512;
  float *a = nullptr, *sums = nullptr;
  cudaMalloc(&a, sizeof(float) * rows * cols);
  cudaMalloc(&sums, sizeof(float) * rows);
  cudaMemset(a, 0, sizeof(float) * rows * cols);
  row_sums<<<(rows + 127) / 128, 128>>>(a, sums, rows, cols);
  // warpfleet: readonly begin
  float first = -1.0f;
  cudaMemcpy(&first, sums, sizeof(float), cudaMemcpyDeviceToHost);
  std::printf("@warpfleet time_ms=1\n");
  return first == 0.0f ? 0 : 1;
  // warpfleet: readonly end
}
