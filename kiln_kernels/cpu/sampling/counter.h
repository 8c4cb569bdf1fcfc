/* The sampler's counter hash (kiln_kernels.sampling.counter_hash): murmur3_32 of [seed_lo,
 * seed_hi, step_lo, step_hi, token id] and the finalizer, as uint32 arithmetic (it wraps as the
 * torch reference's masked int64 lanes do). Shared by counter.c and sample.c. */
#ifndef KILN_COUNTER_H
#define KILN_COUNTER_H
#include <stdint.h>

#include "isa.h"

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

/* kiln_counter_u for 16 token ids at once (the same bits, on every build). */
static inline vf kiln_counter_u16(uint32_t row, vi ids) {
    vi k = vi_rol(vi_mullo(ids, vi_set1((int32_t)0xCC9E2D51u)), 15);
    k = vi_mullo(k, vi_set1(0x1B873593));
    vi h = vi_rol(vi_xor(vi_set1((int32_t)row), k), 13);
    h = vi_add(vi_add(vi_sll(h, 2), h), vi_set1((int32_t)0xE6546B64u)); /* h * 5 + c */
    h = vi_xor(h, vi_set1(20));
    h = vi_xor(h, vi_srl(h, 16));
    h = vi_mullo(h, vi_set1((int32_t)0x85EBCA6Bu));
    h = vi_xor(h, vi_srl(h, 13));
    h = vi_mullo(h, vi_set1((int32_t)0xC2B2AE35u));
    h = vi_xor(h, vi_srl(h, 16));
    const vf q = vf_from_i(vi_srl(h, 9)); /* < 2^23: exact */
    return vf_mul(vf_add(q, vf_set1(0.5f)), vf_set1(1.0f / 8388608));
}
#endif
