/* Floating-point weights, tiled like the blocks (32 weights of each of 4 rows per tile block,
 * the rows one after another) and widened exactly in registers: IEEE half (F16), bfloat16
 * (BF16, the upper half of a float32) and float32 itself. Included by blocks.h only. */
#ifndef KILN_BLOCKS_FLOAT_H
#define KILN_BLOCKS_FLOAT_H

static inline float w_f16(const uint8_t *blk, int r, int j) { return kiln_half(blk + 64 * r + 2 * j); }

static inline float w_bf16(const uint8_t *blk, int r, int j) {
    uint16_t h;
    memcpy(&h, blk + 64 * r + 2 * j, sizeof h);
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float w_f32(const uint8_t *blk, int r, int j) {
    float f;
    memcpy(&f, blk + 128 * r + 4 * j, sizeof f);
    return f;
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void u_f16(const uint8_t *blk, int r, __m512 *lo,
                                                       __m512 *hi) {
    const uint8_t *p = blk + 64 * r;
    *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
}

static inline __attribute__((always_inline)) void u_bf16(const uint8_t *blk, int r, __m512 *lo,
                                                        __m512 *hi) {
    const uint8_t *p = blk + 64 * r;
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    *hi = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32))), 16));
}

static inline __attribute__((always_inline)) void u_f32(const uint8_t *blk, int r, __m512 *lo,
                                                       __m512 *hi) {
    const float *p = (const float *)(blk + 128 * r);
    *lo = _mm512_loadu_ps(p);
    *hi = _mm512_loadu_ps(p + 16);
}
#endif

#endif
