/* The sampler's counter hash (kiln_kernels.sampling.counter_hash) for every (row, token id):
 * u[b][t] = uniform in (0, 1) from murmur3_32 of [seed_lo, seed_hi, step_lo, step_hi, t] and the
 * finalizer, exactly the torch reference's bits (uint32 arithmetic wraps as its masked int64
 * lanes do; ((h >> 9) + 0.5) / 2^23 is exact in float32). */
#include <stdint.h>

static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline uint32_t absorb(uint32_t h, uint32_t k) {
    k = rotl32(k * 0xCC9E2D51u, 15) * 0x1B873593u;
    return rotl32(h ^ k, 13) * 5u + 0xE6546B64u;
}

static inline uint32_t fmix(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

void kiln_counter_uniform(const int64_t *seeds, const int64_t *steps, int64_t B, int64_t V,
                          float *out) {
    for (int64_t b = 0; b < B; b++) {
        const uint64_t s = (uint64_t)seeds[b], t = (uint64_t)steps[b];
        uint32_t h = 0;
        h = absorb(h, (uint32_t)s);
        h = absorb(h, (uint32_t)(s >> 32));
        h = absorb(h, (uint32_t)t);
        h = absorb(h, (uint32_t)(t >> 32));
        float *o = out + b * V;
#pragma omp parallel for schedule(static)
        for (int64_t v = 0; v < V; v++)
            o[v] = ((float)(fmix(absorb(h, (uint32_t)v) ^ 20u) >> 9) + 0.5f) *
                   (1.0f / 8388608.0f);
    }
}
