// A 256-bin histogram of an 8-bit image, the way a first CUDA version is usually written: each
// block keeps a private histogram in shared memory, every thread walks the image in a grid-stride
// loop and counts each byte with a shared-memory atomicAdd, and each block adds its histogram into
// the global one with global atomics at the end. The image's values are skewed, as a real image's
// are: three quarters of the pixels fall in a band of 32 grey levels, so the atomics on those bins
// contend.
//
// BLOCK          threads per block (64 .. 1024)
// BLOCKS_PER_SM  blocks launched per multiprocessor (the grid is BLOCKS_PER_SM * the device's SMs)
//
// Usage: histogram [harness options, HARNESS_API.md] [--n N]   (N pixels, default 2^27 = 128 MiB)
// Each timed sample clears the histogram and counts the whole image (wf::bench). Checks every bin
// against a CPU count (exit 1 naming the first wrong bin) and writes the 256 counts (uint32) to
// out.bin. Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef BLOCK
#define BLOCK 256
#endif
#ifndef BLOCKS_PER_SM
#define BLOCKS_PER_SM 4
#endif

#define NUM_BINS 256

__global__ void histogram256(const unsigned char* image, size_t n, unsigned int* hist) {
    __shared__ unsigned int local[NUM_BINS];
    for (int b = threadIdx.x; b < NUM_BINS; b += blockDim.x) local[b] = 0;
    __syncthreads();

    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&local[image[i]], 1u);
    __syncthreads();

    for (int b = threadIdx.x; b < NUM_BINS; b += blockDim.x)
        if (local[b] != 0) atomicAdd(&hist[b], local[b]);
}

// warpfleet: readonly begin
// The image: splitmix64 from the seed, 8 pixels a draw. Three quarters of the pixels lie in
// [96, 128), the rest anywhere in [0, 256).
static void make_image(std::vector<unsigned char>& image, uint64_t seed) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < image.size(); i += 8) {
        state += 0x9E3779B97F4A7C15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        for (size_t k = 0; k < 8 && i + k < image.size(); ++k) {
            const unsigned byte = (unsigned)(z >> (8 * k)) & 0xFF;
            image[i + k] = (unsigned char)((byte & 3) != 0 ? 96 + (byte >> 3) : byte);
        }
    }
}

static bool check(const std::vector<unsigned char>& image, const std::vector<unsigned int>& hist) {
    std::vector<unsigned long long> want(NUM_BINS, 0);
    for (unsigned char v : image) ++want[v];
    for (int b = 0; b < NUM_BINS; ++b) {
        if (hist[b] != want[b]) {
            std::fprintf(stderr, "histogram: bin %d = %u, want %llu\n", b, hist[b], want[b]);
            return false;
        }
    }
    return true;
}
// warpfleet: readonly end

// --n N from the arguments the harness left; anything else is an error.
static size_t parse_n(const std::vector<std::string>& args) {
    long long n = 1LL << 27;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--n" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= 1 && n <= (1LL << 32) - 1) continue;
        }
        std::fprintf(stderr, "histogram: bad argument '%s' (usage: --n N, 1 <= N < 2^32)\n", args[i].c_str());
        std::exit(2);
    }
    return (size_t)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const size_t n = parse_n(rest);

    std::vector<unsigned char> image(n);
    make_image(image, opt.seed);
    std::vector<unsigned int> hist(NUM_BINS);

    unsigned char* d_image = nullptr;
    unsigned int* d_hist = nullptr;
    WF_CHECK(cudaMalloc(&d_image, n));
    WF_CHECK(cudaMalloc(&d_hist, NUM_BINS * sizeof(unsigned int)));
    WF_CHECK(cudaMemcpy(d_image, image.data(), n, cudaMemcpyHostToDevice));

    int device = 0, sms = 0;
    WF_CHECK(cudaGetDevice(&device));
    WF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const unsigned grid = (unsigned)(BLOCKS_PER_SM * sms);

    wf::bench(opt, [&](cudaStream_t stream) {
        WF_CHECK(cudaMemsetAsync(d_hist, 0, NUM_BINS * sizeof(unsigned int), stream));
        histogram256<<<grid, BLOCK, 0, stream>>>(d_image, n, d_hist);
    });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(hist.data(), d_hist, NUM_BINS * sizeof(unsigned int), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_image));
    WF_CHECK(cudaFree(d_hist));
    if (!check(image, hist)) return 1;
    wf::write_output("out.bin", hist.data(), hist.size());
    // warpfleet: readonly end
    return 0;
}
