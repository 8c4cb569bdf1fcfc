/* The sampler's counter hash (kiln_kernels.sampling.counter_hash): murmur3_32 of [seed_lo,
 * seed_hi, step_lo, step_hi, token id] and the finalizer, as uint32 arithmetic (it wraps as the
 * torch reference's masked int64 lanes do). Shared by counter.c and sample.c. */
#ifndef KILN_COUNTER_H
#define KILN_COUNTER_H
#include <stdint.h>

static inline uint32_t kiln_rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t kiln_absorb(uint32_t h, uint32_t k) {
    k = kiln_rotl32(k * 0xCC9E2D51u, 15) * 0x1B873593u;
    return kiln_rotl32(h ^ k, 13) * 5u + 0xE6546B64u;
}

static inline uint32_t kiln_fmix(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

/* The hash state after a row's (seed, step). */
static inline uint32_t kiln_counter_row(int64_t seed, int64_t step) {
    const uint64_t s = (uint64_t)seed, t = (uint64_t)step;
    uint32_t h = kiln_absorb(0u, (uint32_t)s);
    h = kiln_absorb(h, (uint32_t)(s >> 32));
    h = kiln_absorb(h, (uint32_t)t);
    return kiln_absorb(h, (uint32_t)(t >> 32));
}

/* Uniform in (0, 1) for token id v of the row: ((h >> 9) + 0.5) / 2^23, exact in float32. */
static inline float kiln_counter_u(uint32_t row, int64_t v) {
    return ((float)(kiln_fmix(kiln_absorb(row, (uint32_t)v) ^ 20u) >> 9) + 0.5f) *
           (1.0f / 8388608.0f);
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* kiln_counter_u for 16 token ids at once (the same bits). */
static inline __m512 kiln_counter_u16(uint32_t row, __m512i ids) {
    const __m512i c1 = _mm512_set1_epi32((int)0xCC9E2D51u), c2 = _mm512_set1_epi32(0x1B873593);
    __m512i k = _mm512_rol_epi32(_mm512_mullo_epi32(ids, c1), 15);
    k = _mm512_mullo_epi32(k, c2);
    __m512i h = _mm512_rol_epi32(_mm512_xor_si512(_mm512_set1_epi32((int)row), k), 13);
    h = _mm512_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 2), h),
                         _mm512_set1_epi32((int)0xE6546B64u));
    h = _mm512_xor_si512(h, _mm512_set1_epi32(20));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85EBCA6Bu));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xC2B2AE35u));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    const __m512 q = _mm512_cvtepi32_ps(_mm512_srli_epi32(h, 9)); /* < 2^23: exact */
    return _mm512_mul_ps(_mm512_add_ps(q, _mm512_set1_ps(0.5f)), _mm512_set1_ps(1.0f / 8388608));
}
#endif
#endif
