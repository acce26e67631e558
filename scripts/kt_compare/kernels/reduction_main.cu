// warpfleet's program around the Kernel Tuner-style kernel in reduction.cu (included below, so both
// tools compile the same kernel text): inputs, the timed launches through the harness, the final
// sum of the partial sums, a check against the CPU and the output file.
//
// Usage: reduction_main [harness options, HARNESS_API.md] [--n N]   (N a multiple of 4, default 2^24)
// Input: N floats of wf::fill_uniform(--seed) in [0, 1) (positive, so the sum is well conditioned).
// num_blocks (a tunable parameter, -Dnum_blocks=...) is the grid size. Checks the sum of the partial
// sums, added in float64, against a float64 CPU sum (relative 1e-5: fp32 partial sums of different
// lengths for different parameters); exit 1 when it differs. Writes the sum (one float64) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "reduction.cu"

#ifndef num_blocks
#define num_blocks 512
#endif

// --n N from the arguments the harness left; anything else is an error.
static int parse_n(const std::vector<std::string>& args) {
    long long n = 1 << 24;
    for (size_t i = 0; i < args.size(); ++i) {
        char* end = nullptr;
        if (args[i] == "--n" && i + 1 < args.size()) {
            n = std::strtoll(args[++i].c_str(), &end, 10);
            if (*end == '\0' && n >= 4 && n <= (1ll << 30) && n % 4 == 0) continue;
        }
        std::fprintf(stderr, "reduction: bad argument '%s' (usage: --n N, N a multiple of 4 in [4, 2^30])\n",
                     args[i].c_str());
        std::exit(2);
    }
    return (int)n;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    const int n = parse_n(rest);
    std::vector<float> input(n), partial(num_blocks);
    wf::fill_uniform(input.data(), input.size(), opt.seed, 0.0f, 1.0f);
    float *d_input = nullptr, *d_partial = nullptr;
    WF_CHECK(cudaMalloc(&d_input, (size_t)n * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_partial, num_blocks * sizeof(float)));
    WF_CHECK(cudaMemcpy(d_input, input.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemset(d_partial, 0xFF, num_blocks * sizeof(float)));  // NaN: a block that never wrote fails

    wf::bench(opt, [&](cudaStream_t stream) { sum_floats<<<num_blocks, block_size_x, 0, stream>>>(d_partial, d_input, n); });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(partial.data(), d_partial, num_blocks * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_input));
    WF_CHECK(cudaFree(d_partial));
    double total = 0, want = 0;
    for (float p : partial) total += p;
    for (float v : input) want += v;
    if (!(std::fabs(total - want) <= 1e-5 * want)) {
        std::fprintf(stderr, "reduction: sum = %.9g, want %.9g\n", total, want);
        return 1;
    }
    wf::write_output("out.bin", &total, 1);
    // warpfleet: readonly end
    return 0;
}
