// One time step of an all-pairs gravitational N-body simulation: every body sums the softened
// attraction of every other body (N^2 interactions, a reciprocal square root each), then a leapfrog
// update of its velocity and position. Bodies are float4 (x, y, z, mass) and velocities float4
// (vx, vy, vz, unused). The straightforward kernel: one thread per body, the inner loop reading every
// body's position from global memory.
//
// BLOCK  threads per block (32 .. 1024)
//
// Usage: nbody [--n N] [--seed S] [--reps R]
// Times R steps (each from the same initial state into separate output arrays) with CUDA events and
// prints one "@warpfleet time_ms=<ms>" line per step (after one untimed step). Checks 512 bodies
// against a CPU step in double (exit 1 naming the first bad one) and writes the new positions and
// velocities (float32, 8 * N values) to out.bin.
// Exit status: 0 ok, 1 wrong result, 2 bad arguments or a CUDA error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#ifndef BLOCK
#define BLOCK 256
#endif

#define CUDA_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t err_ = (call);                                                                  \
        if (err_ != cudaSuccess) {                                                                  \
            std::fprintf(stderr, "nbody: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                         cudaGetErrorString(err_));                                                 \
            std::exit(2);                                                                           \
        }                                                                                           \
    } while (0)

#define SOFTENING2 1e-4f   // squared softening length: a body's pull on itself is zero, never inf
#define DT 1e-3f           // the time step

__global__ void nbody_step(int n, const float4* pos, const float4* vel, float4* pos_out, float4* vel_out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float4 p = pos[i];
    float ax = 0.0f, ay = 0.0f, az = 0.0f;
    for (int j = 0; j < n; ++j) {
        const float4 q = pos[j];
        const float dx = q.x - p.x, dy = q.y - p.y, dz = q.z - p.z;
        const float d2 = dx * dx + dy * dy + dz * dz + SOFTENING2;
        const float inv = rsqrtf(d2);
        const float s = q.w * inv * inv * inv;
        ax += s * dx;
        ay += s * dy;
        az += s * dz;
    }
    const float4 v = vel[i];
    const float vx = v.x + ax * DT, vy = v.y + ay * DT, vz = v.z + az * DT;
    vel_out[i] = make_float4(vx, vy, vz, 0.0f);
    pos_out[i] = make_float4(p.x + vx * DT, p.y + vy * DT, p.z + vz * DT, p.w);
}

// warpfleet: readonly begin
// Initial state from the seed (splitmix64): positions uniform in the unit ball's bounding cube
// [-1, 1)^3 with a denser core (half the bodies within [-0.25, 0.25)^3), masses uniform in
// [0.5, 1.5) / N, velocities uniform in [-0.1, 0.1).
static uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t& state, float lo, float hi) {
    return lo + (hi - lo) * (float)((splitmix64(state) >> 40) * (1.0 / 16777216.0));
}

static void make_bodies(std::vector<float4>& pos, std::vector<float4>& vel, uint64_t seed) {
    const int n = (int)pos.size();
    uint64_t state = seed * 0xD1B54A32D192ED03ull + 3;
    for (int i = 0; i < n; ++i) {
        const float r = i % 2 ? 0.25f : 1.0f;
        pos[i] = make_float4(uniform(state, -r, r), uniform(state, -r, r), uniform(state, -r, r),
                             uniform(state, 0.5f, 1.5f) / (float)n);
        vel[i] = make_float4(uniform(state, -0.1f, 0.1f), uniform(state, -0.1f, 0.1f), uniform(state, -0.1f, 0.1f), 0.0f);
    }
}

// 512 bodies spread over the array, stepped on the CPU in double. The GPU's acceleration (its
// velocity change over DT) must be within 1e-4 of the sum of the pulls' magnitudes (far above float
// rounding in any summation order, and above rsqrtf's error), the positions within that times DT
// plus float rounding; masses are copied, the fourth velocity component is 0.
static bool check(const std::vector<float4>& pos, const std::vector<float4>& vel, const std::vector<float4>& pos_out,
                  const std::vector<float4>& vel_out) {
    const int n = (int)pos.size();
    for (int s = 0; s < 512; ++s) {
        const int i = (int)(((long long)s * n / 512 + s % 7) % n);
        double a[3] = {0.0, 0.0, 0.0}, scale = 0.0;
        for (int j = 0; j < n; ++j) {
            const double d[3] = {(double)pos[j].x - pos[i].x, (double)pos[j].y - pos[i].y, (double)pos[j].z - pos[i].z};
            const double d2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + (double)SOFTENING2;
            const double f = pos[j].w / (d2 * std::sqrt(d2));
            for (int k = 0; k < 3; ++k) a[k] += f * d[k];
            scale += f * std::sqrt(d2);
        }
        const double v0[3] = {vel[i].x, vel[i].y, vel[i].z}, p0[3] = {pos[i].x, pos[i].y, pos[i].z};
        const float got_v[3] = {vel_out[i].x, vel_out[i].y, vel_out[i].z};
        const float got_p[3] = {pos_out[i].x, pos_out[i].y, pos_out[i].z};
        const double tol_v = 1e-4 * scale * (double)DT + 1e-7;
        for (int k = 0; k < 3; ++k) {
            const double want_v = v0[k] + a[k] * (double)DT, want_p = p0[k] + want_v * (double)DT;
            if (!(std::fabs(got_v[k] - want_v) <= tol_v) || !(std::fabs(got_p[k] - want_p) <= tol_v * (double)DT + 1e-6) ||
                vel_out[i].w != 0.0f || pos_out[i].w != pos[i].w) {
                std::fprintf(stderr, "nbody: body %d, axis %d: v = %.9g (want %.9g), p = %.9g (want %.9g)\n", i, k,
                             (double)got_v[k], want_v, (double)got_p[k], want_p);
                return false;
            }
        }
    }
    return true;
}
// warpfleet: readonly end

static long long parse_int(const char* flag, const char* text, long long lo, long long hi) {
    char* end;
    const long long value = std::strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value < lo || value > hi) {
        std::fprintf(stderr, "nbody: %s wants an integer in [%lld, %lld], got '%s'\n", flag, lo, hi, text);
        std::exit(2);
    }
    return value;
}

int main(int argc, char** argv) {
    int n = 32768, reps = 20;
    uint64_t seed = 0;
    for (int i = 1; i < argc; ++i) {
        if (i + 1 < argc && std::strcmp(argv[i], "--n") == 0) {
            n = (int)parse_int("--n", argv[++i], 512, 1 << 22);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--seed") == 0) {
            seed = (uint64_t)parse_int("--seed", argv[++i], 0, 1LL << 62);
        } else if (i + 1 < argc && std::strcmp(argv[i], "--reps") == 0) {
            reps = (int)parse_int("--reps", argv[++i], 1, 100000);
        } else {
            std::fprintf(stderr, "usage: nbody [--n N] [--seed S] [--reps R]\n");
            return 2;
        }
    }
    const size_t bytes = (size_t)n * sizeof(float4);

    std::vector<float4> pos(n), vel(n), pos_out(n), vel_out(n);
    make_bodies(pos, vel, seed);

    float4 *d_pos = nullptr, *d_vel = nullptr, *d_pos_out = nullptr, *d_vel_out = nullptr;
    CUDA_CHECK(cudaMalloc(&d_pos, bytes));
    CUDA_CHECK(cudaMalloc(&d_vel, bytes));
    CUDA_CHECK(cudaMalloc(&d_pos_out, bytes));
    CUDA_CHECK(cudaMalloc(&d_vel_out, bytes));
    CUDA_CHECK(cudaMemcpy(d_pos, pos.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_vel, vel.data(), bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_pos_out, 0xFF, bytes));  // NaN: a body never written fails the check
    CUDA_CHECK(cudaMemset(d_vel_out, 0xFF, bytes));

    const unsigned grid = (unsigned)((n + BLOCK - 1) / BLOCK);
    // warpfleet: readonly begin
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r <= reps; ++r) {  // step 0 is a warm-up, not printed
        CUDA_CHECK(cudaEventRecord(start));
        // warpfleet: readonly end
        nbody_step<<<grid, BLOCK>>>(n, d_pos, d_vel, d_pos_out, d_vel_out);
        // warpfleet: readonly begin
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (r > 0) std::printf("@warpfleet time_ms=%.6f\n", ms);
    }
    CUDA_CHECK(cudaMemcpy(pos_out.data(), d_pos_out, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(vel_out.data(), d_vel_out, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    CUDA_CHECK(cudaFree(d_pos));
    CUDA_CHECK(cudaFree(d_vel));
    CUDA_CHECK(cudaFree(d_pos_out));
    CUDA_CHECK(cudaFree(d_vel_out));
    if (!check(pos, vel, pos_out, vel_out)) return 1;
    std::vector<float4> out(pos_out);
    out.insert(out.end(), vel_out.begin(), vel_out.end());
    FILE* file = std::fopen("out.bin", "wb");
    if (!file || std::fwrite(out.data(), sizeof(float4), out.size(), file) != out.size() || std::fclose(file) != 0) {
        std::perror("nbody: writing out.bin");
        return 2;
    }
    // warpfleet: readonly end
    return 0;
}
