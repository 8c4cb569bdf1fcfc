/* What one core of this CPU sustains for the loop skeleton of the quantized products
 * (kiln_kernels/cpu/matmul/gemm.c), without the kernel: 512-bit FMAs per ns
 *   regs:   32 FMAs per iteration into 16 accumulators, every operand in a register (8 x
 *           vectors, each used 4 times: 26 registers, no spills);
 *   loads:  the same 32 FMAs fed by 16 zmm loads from L1 (8 rows x 2 halves of a 32-wide block,
 *           each load used twice), the shape of an (8 rows x 2 weight rows) pass with its
 *           dequantization taken out.
 * Built and loaded by bench/bench_gemm_ceiling.py; -1 where the compiler has no AVX-512. */
#include <stdint.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* Returns FMAs per ns; *sink keeps the result alive. */
static double run(int with_loads, const float *x, int64_t K, int64_t iters, float *sink) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    __m512 w0 = _mm512_set1_ps(1e-3f), w1 = _mm512_set1_ps(2e-3f);
    __m512 xr[8];
    for (int i = 0; i < 8; i++) xr[i] = _mm512_set1_ps(0.5f + (float)i);
    const double t0 = now();
    for (int64_t b = 0; b < iters; b++) {
        __m512 xs[16];
        for (int i = 0; i < 16; i++)
            xs[i] = with_loads ? _mm512_loadu_ps(x + (i % 8) * K + (b & 15) * 32 + 16 * (i / 8))
                               : xr[i % 8];
        for (int i = 0; i < 8; i++) {
            acc[2 * i] = _mm512_fmadd_ps(w0, xs[i], acc[2 * i]);
            acc[2 * i + 1] = _mm512_fmadd_ps(w1, xs[i], acc[2 * i + 1]);
        }
        for (int i = 0; i < 8; i++) {
            acc[2 * i] = _mm512_fmadd_ps(w1, xs[8 + i], acc[2 * i]);
            acc[2 * i + 1] = _mm512_fmadd_ps(w0, xs[8 + i], acc[2 * i + 1]);
        }
        __asm__ volatile("" : "+v"(w0), "+v"(w1)); /* no hoisting across iterations */
    }
    const double dt = now() - t0;
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    *sink += _mm512_reduce_add_ps(s);
    return 32.0 * (double)iters / dt / 1e9;
}

double fma_ceiling(int with_loads, const float *x, int64_t K, int64_t iters, float *sink) {
    return run(with_loads, x, K, iters, sink);
}
#else
double fma_ceiling(int with_loads, const float *x, int64_t K, int64_t iters, float *sink) {
    (void)with_loads, (void)x, (void)K, (void)iters, (void)sink;
    return -1.0;
}
#endif
