// warpfleet timing harness: header-only CUDA C++17, the contract is HARNESS_API.md beside this.
// The pure logic (options, fill, statistics, stopping rule, output lines) is in harness_core.hpp
// so that it is unit-tested without a GPU; this file adds the CUDA parts: error checks, the L2
// flush and the timed loop. Everything is inline, a template or static, so that a program whose
// several .cu files include this header still links.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "harness_core.hpp"

#define WF_CHECK(call)                                                                    \
  do {                                                                                    \
    const cudaError_t wf_err_ = (call);                                                   \
    if (wf_err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "wf: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
                   cudaGetErrorString(wf_err_));                                          \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

#define WF_CHECK_LAUNCH() WF_CHECK(cudaGetLastError())

namespace wf {
namespace detail {

// Reads the whole buffer so that every L2 line holds flush data afterwards: the timed launch then
// starts from a cold cache, as it would in a real program between uses of its data. Reads, not a
// memset: written lines would be dirty and their write-back would land inside the timed region.
// The buffer is all zeros, so the store never happens, but the compiler cannot know that and must
// keep every load. Named wf_l2_flush: the profiler stage drops kernels of that name. static, since
// a __global__ function cannot be inline: each translation unit gets its own copy and launch stub.
static __global__ void wf_l2_flush(const int4* __restrict__ data, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int4 v = data[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc != 0) *sink = acc;
}

struct L2Flush {
  int4* data = nullptr;
  size_t n = 0;  // int4 elements
  int* sink = nullptr;
  int blocks = 0;
};

// The flush buffer of the current device: allocated at the first bench call on that device and
// kept until the process exits (one allocation, not one per sample or per bench call).
inline const L2Flush& l2_flush_buffer() {
  static std::vector<L2Flush> per_device;
  int device = 0, l2_bytes = 0, sms = 0;
  WF_CHECK(cudaGetDevice(&device));
  if (size_t(device) >= per_device.size()) per_device.resize(device + 1);
  L2Flush& f = per_device[device];
  if (f.data) return f;
  WF_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  WF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const size_t bytes = 2 * std::max<size_t>(l2_bytes, size_t(1) << 20);  // 2x: L2 is not a perfect LRU
  f.n = bytes / sizeof(int4);
  WF_CHECK(cudaMalloc(&f.data, f.n * sizeof(int4)));
  WF_CHECK(cudaMalloc(&f.sink, sizeof(int)));
  WF_CHECK(cudaMemset(f.data, 0, f.n * sizeof(int4)));
  WF_CHECK(cudaDeviceSynchronize());
  f.blocks = 8 * sms;  // 8 x 256 threads fill an SM: enough loads in flight for full bandwidth
  return f;
}

// Fills every registered output buffer with 0xFF bytes on `stream` when the poison check asks.
inline void poison_outputs(cudaStream_t stream) {
  if (!poison_requested()) return;
  for (const PoisonBuffer& b : poison_buffers()) WF_CHECK(cudaMemsetAsync(b.ptr, 0xFF, b.bytes, stream));
}

}  // namespace detail

// Registers a device buffer that every launch must write in full. Only under the guardrails'
// poisoned-outputs check (WARPFLEET_POISON set) does bench act on it: it fills the buffer with
// 0xFF bytes (NaN) before each warm-up and timed launch, outside the timed region.
inline void poison_output(void* device_ptr, size_t bytes) {
  detail::poison_buffers().push_back({device_ptr, bytes});
}

// Times `launch` (a callable that enqueues the work to measure on `stream`): warm-up runs, then
// per sample an L2 flush, event record, launch(stream), event record, synchronize, elapsed ms,
// until the stopping rule of harness_core.hpp says stop. Prints one `@warpfleet time_ms=` line per
// sample and the summary line (HARNESS_API.md); every CUDA call is checked.
template <class Launch> Result bench(const Options& opt, Launch&& launch, cudaStream_t stream = 0) {
  const detail::L2Flush* flush = opt.flush_l2 ? &detail::l2_flush_buffer() : nullptr;
  for (int i = 0; i < opt.warmup; ++i) {
    detail::poison_outputs(stream);
    launch(stream);
    WF_CHECK_LAUNCH();
  }
  WF_CHECK(cudaStreamSynchronize(stream));

  cudaEvent_t start, stop;
  WF_CHECK(cudaEventCreate(&start));
  WF_CHECK(cudaEventCreate(&stop));
  detail::Sampling sampling{opt};
  const timespec region_start = detail::wall_now();
  for (;;) {
    detail::poison_outputs(stream);  // before the flush: its write-back is not timed either
    // The flush also keeps the GPU busy while the host enqueues the events and the launch, so the
    // start event fires right before the work instead of waiting out the launch latency.
    if (flush) {
      detail::wf_l2_flush<<<flush->blocks, 256, 0, stream>>>(flush->data, flush->n, flush->sink);
      WF_CHECK_LAUNCH();
    }
    WF_CHECK(cudaEventRecord(start, stream));
    launch(stream);
    WF_CHECK_LAUNCH();
    WF_CHECK(cudaEventRecord(stop, stream));
    WF_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    WF_CHECK(cudaEventElapsedTime(&ms, start, stop));

    detail::print_sample(ms);
    if (sampling.add(ms)) break;
  }
  const timespec region_end = detail::wall_now();
  WF_CHECK(cudaEventDestroy(start));
  WF_CHECK(cudaEventDestroy(stop));
  detail::print_summary(sampling.result, region_start, region_end);
  return sampling.result;
}

}  // namespace wf
