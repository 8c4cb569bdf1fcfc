/* Block-quantized weight x float32 activation products for small batches on the CPU.
 *
 * y[m][n] = sum_k x[m][k] * w[n][k], where w is stored in 32-wide blocks along k and each block
 * is dequantized in registers exactly as gguf-py dequantizes it, so the weights are
 * bit-identical to the float32 tensors the model holds:
 *   q4 (GGML Q4_0 / Q4_1): w = d * q + m, q in 0..15. d * q is exact in float32, so one fused
 *                          multiply-add rounds exactly like gguf-py's multiply-then-add.
 *   q8 (GGML Q8_0):         w = d * q, q in -128..127 (exact in float32).
 *
 * Layout: rows in tiles of 4 (N is a multiple of 4), tile g holding rows 4g..4g+3, block by
 * block, so one sequential stream feeds four outputs:
 *   q4 tile block (96 bytes):  float sc[4][2] = (d, m) per row, then uint8 qs[4][16]
 *                              (low nibble of byte j = element j, high nibble = element j+16);
 *   q8 tile block (144 bytes): float d[4], then int8 qs[4][32].
 *
 * Every (m, n) output is accumulated in the same order whatever M is and however tiles are split
 * across threads (acc0 += w[0:16] * x[0:16], acc1 += w[16:32] * x[16:32], block by block, then
 * reduce(acc0 + acc1)), so a row's result never depends on the rest of the batch.
 * Threads: OpenMP over tiles (the process's runtime: torch's, loaded before this library).
 */
#include <stdint.h>

#include "quant.h"

#define Q4_TILE 96
#define Q8_TILE 144
#define PREFETCH 3072 /* bytes ahead in the tile stream (measured: 2-4 KiB is best here) */
#define MC 2          /* activation rows per pass over a tile (4 x MC x 2 accumulators) */

#if defined(__AVX512F__)
#include <immintrin.h>

/* The 16 values d * j + m (j = 0..15): vpermps indexes it with the low 4 bits of each lane. */
static inline __m512 q4_table(float d, float mn) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_fmadd_ps(_mm512_set1_ps(d), iota, _mm512_set1_ps(mn));
}

static inline __attribute__((always_inline)) void unpack(int q8, const uint8_t *blk, int r,
                                                        __m512 *lo, __m512 *hi) {
    if (q8) {
        const float d = ((const float *)blk)[r];
        const __m512 vd = _mm512_set1_ps(d);
        const uint8_t *q = blk + 16 + 32 * r;
        *lo = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(
                                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))));
        *hi = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                    _mm_loadu_si128((const __m128i *)(q + 16)))));
    } else {
        const float *sc = (const float *)blk;
        const __m512 tab = q4_table(sc[2 * r], sc[2 * r + 1]);
        const __m512i idx =
            _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * r)));
        *lo = _mm512_permutexvar_ps(idx, tab);
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), tab);
    }
}

/* One tile (4 weight rows) against activation rows [m0, m0 + mc), mc <= MC (constant after
 * inlining, so the accumulators stay in registers). */
static inline __attribute__((always_inline)) void tile_pass(
        int q8, const float *x, int64_t K, int64_t m0, int mc, const uint8_t *tile,
        int64_t tile_bytes, float *y, int64_t N, int64_t n0) {
    __m512 a0[MC][4], a1[MC][4];
    for (int i = 0; i < mc; i++)
        for (int r = 0; r < 4; r++) a0[i][r] = a1[i][r] = _mm512_setzero_ps();
    const int64_t nb = K / 32;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = tile + b * tile_bytes;
        _mm_prefetch((const char *)(blk + PREFETCH), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + PREFETCH + 64), _MM_HINT_T0);
        if (q8) _mm_prefetch((const char *)(blk + PREFETCH + 128), _MM_HINT_T0);
        __m512 x0[MC], x1[MC];
        for (int i = 0; i < mc; i++) {
            x0[i] = _mm512_loadu_ps(x + (m0 + i) * K + b * 32);
            x1[i] = _mm512_loadu_ps(x + (m0 + i) * K + b * 32 + 16);
        }
        for (int r = 0; r < 4; r++) {
            __m512 lo, hi;
            unpack(q8, blk, r, &lo, &hi);
            for (int i = 0; i < mc; i++) {
                a0[i][r] = _mm512_fmadd_ps(lo, x0[i], a0[i][r]);
                a1[i][r] = _mm512_fmadd_ps(hi, x1[i], a1[i][r]);
            }
        }
    }
    for (int i = 0; i < mc; i++)
        for (int r = 0; r < 4; r++)
            y[(m0 + i) * N + n0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(a0[i][r], a1[i][r]));
}

/* Several activation rows: each block chunk of the tile is dequantized ONCE into an L1 buffer
 * (the same float32 values unpack() gives), then every row runs over it; accumulators persist
 * in `acc` between chunks, so each output is still summed block by block, in order. */
#define CHUNK 32   /* blocks per dequantized chunk: 32 x 4 rows x 32 floats = 16 KiB */
#define MAXM 32    /* activation rows per group (the accumulator buffer: 32 x 8 vectors) */

static inline __attribute__((always_inline)) void tile_many(
        int q8, const float *x, int64_t M, int64_t K, const uint8_t *tile, int64_t tile_bytes,
        float *y, int64_t N, int64_t n0) {
    __m512 buf[CHUNK][4][2];
    __m512 acc[MAXM][4][2];
    const int64_t nb = K / 32;
    for (int64_t g0 = 0; g0 < M; g0 += MAXM) {
        const int64_t gm = (M - g0 < MAXM) ? M - g0 : MAXM;
        for (int64_t i = 0; i < gm; i++)
            for (int r = 0; r < 4; r++) acc[i][r][0] = acc[i][r][1] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += CHUNK) {
            const int64_t cn = (nb - c0 < CHUNK) ? nb - c0 : CHUNK;
            for (int64_t b = 0; b < cn; b++) {
                const uint8_t *blk = tile + (c0 + b) * tile_bytes;
                _mm_prefetch((const char *)(blk + PREFETCH), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + PREFETCH + 64), _MM_HINT_T0);
                if (q8) _mm_prefetch((const char *)(blk + PREFETCH + 128), _MM_HINT_T0);
                for (int r = 0; r < 4; r++) unpack(q8, blk, r, &buf[b][r][0], &buf[b][r][1]);
            }
            int64_t i = 0;
            for (; i + MC <= gm; i += MC) {
                __m512 a[MC][4][2];
                for (int j = 0; j < MC; j++)
                    for (int r = 0; r < 4; r++)
                        a[j][r][0] = acc[i + j][r][0], a[j][r][1] = acc[i + j][r][1];
                for (int64_t b = 0; b < cn; b++) {
                    for (int j = 0; j < MC; j++) {
                        const float *xr = x + (g0 + i + j) * K + (c0 + b) * 32;
                        const __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
                        for (int r = 0; r < 4; r++) {
                            a[j][r][0] = _mm512_fmadd_ps(buf[b][r][0], x0, a[j][r][0]);
                            a[j][r][1] = _mm512_fmadd_ps(buf[b][r][1], x1, a[j][r][1]);
                        }
                    }
                }
                for (int j = 0; j < MC; j++)
                    for (int r = 0; r < 4; r++)
                        acc[i + j][r][0] = a[j][r][0], acc[i + j][r][1] = a[j][r][1];
            }
            for (; i < gm; i++) {
                for (int64_t b = 0; b < cn; b++) {
                    const float *xr = x + (g0 + i) * K + (c0 + b) * 32;
                    const __m512 x0 = _mm512_loadu_ps(xr), x1 = _mm512_loadu_ps(xr + 16);
                    for (int r = 0; r < 4; r++) {
                        acc[i][r][0] = _mm512_fmadd_ps(buf[b][r][0], x0, acc[i][r][0]);
                        acc[i][r][1] = _mm512_fmadd_ps(buf[b][r][1], x1, acc[i][r][1]);
                    }
                }
            }
        }
        for (int64_t i = 0; i < gm; i++)
            for (int r = 0; r < 4; r++)
                y[(g0 + i) * N + n0 + r] =
                    _mm512_reduce_add_ps(_mm512_add_ps(acc[i][r][0], acc[i][r][1]));
    }
}

static inline __attribute__((always_inline)) void tile_all(int q8, const float *x, int64_t M,
                                                          int64_t K, const uint8_t *tile,
                                                          int64_t tile_bytes, float *y,
                                                          int64_t N, int64_t n0) {
    if (M == 1)
        tile_pass(q8, x, K, 0, 1, tile, tile_bytes, y, N, n0);
    else
        tile_many(q8, x, M, K, tile, tile_bytes, y, N, n0);
}

int kiln_quant_simd(void) { return 512; }

#else
/* Portable path: the same weights; one fixed summation order per output. */
static float weight(int q8, const uint8_t *blk, int r, int j) {
    if (q8) return ((const float *)blk)[r] * (float)(int8_t)blk[16 + 32 * r + j];
    const float *sc = (const float *)blk;
    const uint8_t byte = blk[32 + 16 * r + (j & 15)];
    const float q = (float)(j < 16 ? (byte & 0x0F) : (byte >> 4));
    return sc[2 * r] * q + sc[2 * r + 1];
}

static void tile_all(int q8, const float *x, int64_t M, int64_t K, const uint8_t *tile,
                     int64_t tile_bytes, float *y, int64_t N, int64_t n0) {
    const int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int r = 0; r < 4; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++)
                for (int j = 0; j < 32; j++)
                    acc += weight(q8, tile + b * tile_bytes, r, j) * x[m * K + b * 32 + j];
            y[m * N + n0 + r] = acc;
        }
}

int kiln_quant_simd(void) { return 0; }
#endif

/* x float32 [M][K], w tiles [N/4][K/32][tile], y float32 [M][N]. */
void kiln_gemm_tiles(int q8, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y) {
    const int64_t tile = q8 ? Q8_TILE : Q4_TILE;
    const int64_t stride = (K / 32) * tile;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < N / 4; g++) {
        if (q8)
            tile_all(1, x, M, K, w + g * stride, Q8_TILE, y, N, 4 * g);
        else
            tile_all(0, x, M, K, w + g * stride, Q4_TILE, y, N, 4 * g);
    }
}

/* One product on `nthreads` threads (its own parallel region). */
void kiln_quant_gemm(int q8, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    kiln_gemm_tiles(q8, x, M, K, w, N, y);
}
