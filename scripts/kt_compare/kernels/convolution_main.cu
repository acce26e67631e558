// warpfleet's program around the Kernel Tuner-style kernel in convolution.cu (included below, so
// both tools compile the same kernel text): inputs, the timed launches through the harness, a check
// against the CPU and the output file.
//
// Usage: convolution_main [harness options, HARNESS_API.md]
// Inputs: the padded image, then the 17 x 17 filter, as one wf::fill_uniform stream of --seed in [-1, 1).
// Checks that every output was written (it starts as NaN) and a fixed sample (8 rows and columns at
// each border, and every 29th row) against a float64 CPU reference; exit 1 naming the first bad
// index. Writes the output image (float32, 1024 * 1024 values, 4 MiB) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <warpfleet/harness.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "convolution.cu"

constexpr int kTaps = filter_width * filter_height;

// The first wrong output in row-major order; true when all are right. The tolerance, 4e-6 times
// the sum of the terms' magnitudes, bounds fp32 rounding over 289 fused terms at the order of
// magnitude seen (the fused sums round once per term).
static bool check(const float* input, const float* filter, const std::vector<float>& out) {
    const int edge = 8;
    for (int y = 0; y < image_height; ++y) {
        const bool whole_row = y < edge || y >= image_height - edge || y % 29 == 0;
        for (int x = 0; x < image_width; ++x) {
            const size_t index = (size_t)y * image_width + x;
            if (!std::isfinite(out[index])) {
                std::fprintf(stderr, "convolution: out[%d][%d] (index %zu) = %g (never written?)\n", y, x, index,
                             (double)out[index]);
                return false;
            }
            if (!whole_row && x >= edge && x < image_width - edge) continue;
            double want = 0, magnitude = 0;
            for (int fy = 0; fy < filter_height; ++fy) {
                for (int fx = 0; fx < filter_width; ++fx) {
                    const double term =
                        (double)input[(size_t)(y + fy) * input_width + x + fx] * filter[fy * filter_width + fx];
                    want += term;
                    magnitude += std::fabs(term);
                }
            }
            if (!(std::fabs(out[index] - want) <= 4e-6 * magnitude + 1e-7)) {
                std::fprintf(stderr, "convolution: out[%d][%d] (index %zu) = %.9g, want %.9g\n", y, x, index,
                             (double)out[index], want);
                return false;
            }
        }
    }
    return true;
}

int main(int argc, char** argv) {
    std::vector<std::string> rest;
    const wf::Options opt = wf::parse_options(argc, argv, &rest);
    if (!rest.empty()) {
        std::fprintf(stderr, "convolution: unexpected argument '%s' (the image size is fixed at compile time)\n",
                     rest[0].c_str());
        return 2;
    }
    const size_t in_count = (size_t)input_width * input_height, out_count = (size_t)image_width * image_height;
    std::vector<float> inputs(in_count + kTaps), out(out_count);  // the padded image, then the filter
    wf::fill_uniform(inputs.data(), inputs.size(), opt.seed);
    const float *input = inputs.data(), *filter = inputs.data() + in_count;
    float *d_input = nullptr, *d_output = nullptr;
    WF_CHECK(cudaMalloc(&d_input, in_count * sizeof(float)));
    WF_CHECK(cudaMalloc(&d_output, out_count * sizeof(float)));
    WF_CHECK(cudaMemcpy(d_input, input, in_count * sizeof(float), cudaMemcpyHostToDevice));
    WF_CHECK(cudaMemcpyToSymbol(d_filter, filter, kTaps * sizeof(float)));
    WF_CHECK(cudaMemset(d_output, 0xFF, out_count * sizeof(float)));  // NaN: an output never written fails

    const dim3 block(block_size_x, block_size_y);
    const dim3 grid((image_width + tile_width - 1) / tile_width, (image_height + tile_height - 1) / tile_height);
    wf::bench(opt, [&](cudaStream_t stream) { convolution_kernel<<<grid, block, 0, stream>>>(d_output, d_input); });

    // warpfleet: readonly begin
    WF_CHECK(cudaMemcpy(out.data(), d_output, out_count * sizeof(float), cudaMemcpyDeviceToHost));
    WF_CHECK(cudaFree(d_input));
    WF_CHECK(cudaFree(d_output));
    if (!check(input, filter, out)) return 1;
    wf::write_output("out.bin", out.data(), out_count);
    // warpfleet: readonly end
    return 0;
}
