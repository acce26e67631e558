/* A 2D 5-point Jacobi stencil, spatially blocked: the CPU-only warpfleet demo target.
 *
 * TILE   side of the square blocks the interior is swept in (cache blocking).
 * UNROLL how many points the innermost loop updates per iteration (1, 2, 4 or 8).
 *
 * Every point of a sweep reads only the previous grid, so the result is the same for every
 * TILE and UNROLL; only the traversal order and the loop structure change.
 *
 * Usage: stencil [--n N] [--iters K] [--reps R]
 * Prints one "@warpfleet time_ms=<ms>" line per repetition; writes the final grid (float32,
 * (N+2)^2 values, halo included) to out.bin.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TILE
#define TILE 64
#endif
#ifndef UNROLL
#define UNROLL 1
#endif

#if TILE < 1
#error "TILE must be positive"
#endif
#if UNROLL != 1 && UNROLL != 2 && UNROLL != 4 && UNROLL != 8
#error "UNROLL must be 1, 2, 4 or 8"
#endif

/* The weighted Jacobi update of point (i, j) from `src` into `dst`; rows are `w` floats. */
#define UPDATE(j) \
    dst[(i) * w + (j)] = 0.5f * src[(i) * w + (j)] + \
        0.125f * ((src[(i - 1) * w + (j)] + src[(i + 1) * w + (j)]) + \
                  (src[(i) * w + (j) - 1] + src[(i) * w + (j) + 1]))

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A fixed-seed xorshift generator, so inputs are the same on every platform and libc. */
static uint32_t next_random(uint32_t *state) {
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* One sweep over the interior rows/cols 1..n of a (n+2)-wide grid, in TILE x TILE blocks. */
static void sweep(float *restrict dst, const float *restrict src, int n) {
    const int w = n + 2;
    for (int ii = 1; ii <= n; ii += TILE) {
        const int i_end = ii + TILE <= n + 1 ? ii + TILE : n + 1;
        for (int jj = 1; jj <= n; jj += TILE) {
            const int j_end = jj + TILE <= n + 1 ? jj + TILE : n + 1;
            for (int i = ii; i < i_end; ++i) {
                int j = jj;
                for (; j + UNROLL <= j_end; j += UNROLL) {
                    UPDATE(j);
#if UNROLL >= 2
                    UPDATE(j + 1);
#endif
#if UNROLL >= 4
                    UPDATE(j + 2);
                    UPDATE(j + 3);
#endif
#if UNROLL >= 8
                    UPDATE(j + 4);
                    UPDATE(j + 5);
                    UPDATE(j + 6);
                    UPDATE(j + 7);
#endif
                }
                for (; j < j_end; ++j) { /* the remainder when UNROLL does not divide the tile */
                    UPDATE(j);
                }
            }
        }
    }
}

static int parse_int(const char *flag, const char *text, int lo, int hi) {
    char *end;
    long value = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value < lo || value > hi) {
        fprintf(stderr, "stencil: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi, text);
        exit(2);
    }
    return (int)value;
}

int main(int argc, char **argv) {
    int n = 250, iters = 16, reps = 5;
    for (int a = 1; a < argc; ++a) {
        if (a + 1 < argc && strcmp(argv[a], "--n") == 0) {
            n = parse_int("--n", argv[++a], 1, 1 << 14);
        } else if (a + 1 < argc && strcmp(argv[a], "--iters") == 0) {
            iters = parse_int("--iters", argv[++a], 1, 1 << 20);
        } else if (a + 1 < argc && strcmp(argv[a], "--reps") == 0) {
            reps = parse_int("--reps", argv[++a], 1, 1 << 20);
        } else {
            fprintf(stderr, "usage: stencil [--n N] [--iters K] [--reps R]\n");
            return 2;
        }
    }
    const size_t w = (size_t)n + 2, cells = w * w;
    float *initial = malloc(cells * sizeof(float));
    float *a = malloc(cells * sizeof(float));
    float *b = malloc(cells * sizeof(float));
    if (!initial || !a || !b) {
        fprintf(stderr, "stencil: out of memory for n=%d\n", n);
        return 1;
    }
    /* Random interior in [0, 1); a hot top edge and cold other edges, held fixed (Dirichlet). */
    uint32_t state = 12345u;
    for (size_t i = 0; i < w; ++i) {
        for (size_t j = 0; j < w; ++j) {
            int edge = i == 0 || j == 0 || i == w - 1 || j == w - 1;
            float value = (next_random(&state) >> 8) * (1.0f / 16777216.0f);
            initial[i * w + j] = edge ? (i == 0 ? 1.0f : 0.0f) : value;
        }
    }

    float *result = a;
    for (int r = 0; r < reps; ++r) {
        /* Each repetition starts from the same grid, so the output does not depend on reps. */
        memcpy(a, initial, cells * sizeof(float));
        memcpy(b, initial, cells * sizeof(float));
        float *src = a, *dst = b;
        double start = now_ms();
        for (int it = 0; it < iters; ++it) {
            sweep(dst, src, n);
            float *t = src;
            src = dst;
            dst = t;
        }
        double elapsed = now_ms() - start;
        result = src;
        printf("@warpfleet time_ms=%.6f\n", elapsed);
    }

    FILE *out = fopen("out.bin", "wb");
    if (!out || fwrite(result, sizeof(float), cells, out) != cells || fclose(out) != 0) {
        perror("stencil: writing out.bin");
        return 1;
    }
    free(initial);
    free(a);
    free(b);
    return 0;
}
