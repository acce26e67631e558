/* The load test's target: as small and fast as a program can be, with a 100 x 100 param space,
   so that the sweep engine's own costs are what gets measured. */
#include <stdio.h>
int main(void) {
    double x = A * 0.5 + B * 0.25;
    FILE *f = fopen("out.bin", "wb");
    float v = 1.0f;
    fwrite(&v, sizeof v, 1, f);
    fclose(f);
    printf("@warpfleet time_ms=%g\n", 1.0 + x * 1e-3);
    return 0;
}
