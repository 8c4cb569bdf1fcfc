/* Shared declarations of the CPU quantized kernels (gemm.c, decode.c). */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H
#include <stdint.h>

/* y[M][N] = x[M][K] @ w.T for a tiled weight (q8 = 0: q4 tiles, 1: q8 tiles). Contains an
 * orphaned `omp for`: call it from every thread of a parallel region (or outside one). */
void kiln_gemm_tiles(int q8, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y);

#endif
