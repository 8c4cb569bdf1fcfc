/* Top-p for the CPU sampler (sample.c): the probability threshold over the kept tokens, by a
 * sort when at most SORT_LIMIT are kept, else by two 12-bit histograms of their probability mass
 * over the float order and a walk of the distinct values in the last bucket; and the kept
 * tokens' exp sum. A row's numbers depend on nothing but the row. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"
#include "vmath.h"

static int desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* A float's bits as an unsigned key in the float order (for the histogram). */
static inline uint32_t key_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* sum of exp(x - m) over x >= thr (the kept tokens). */
float kiln_kept_exp_sum(const float *x, int64_t V, float thr, float m) {
    int64_t j = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    const __m512 vt = _mm512_set1_ps(thr), vm = _mm512_set1_ps(m);
    for (; j + 16 <= V; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        const __mmask16 k = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(v, vm))));
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; j < V; j++)
        if (x[j] >= thr) sum += expf(x[j] - m);
    return sum;
}

/* e[i] = exp(x[i] - m) for i < w <= 16 (exp16 where there is AVX-512). */
static inline void exp_shifted(const float *x, int64_t w, float m, float *e) {
#if defined(__AVX512F__)
    const __mmask16 k = (__mmask16)(w == 16 ? 0xFFFF : (1u << w) - 1);
    _mm512_storeu_ps(e, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x), _mm512_set1_ps(m))));
#else
    for (int64_t i = 0; i < w; i++) e[i] = expf(x[i] - m);
#endif
}

/* The largest kept value below `prev` whose key >> 8 is at most `prefix`, and how many tokens
 * hold it (0: none). */
static float next_below(const float *x, int64_t V, float thr, float prev, uint32_t prefix,
                        int64_t *count) {
    float v = -INFINITY;
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++) {
        if (!(x[j] >= thr) || !(x[j] < prev) || (key_of(x[j]) >> 8) > prefix) continue;
        if (x[j] > v) v = x[j], n = 1;
        else if (x[j] == v) n++;
    }
    *count = n;
    return v;
}

/* Top-p over the tokens with x >= thr: the x of the first token, in descending order, at which
 * the cumulative probability reaches tp (the last kept token if none does). */
float kiln_top_p_threshold(const float *x, int64_t V, float thr, float tp, float m,
                             float *vals) {
    int64_t n = 0, j = 0;
#if defined(__AVX512F__)
    const __m512 vthr = _mm512_set1_ps(thr);
    for (; j + 16 <= V; j += 16) { /* count, then copy only when few enough to sort */
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), vthr, _CMP_GE_OQ);
        n += __builtin_popcount((unsigned)k);
    }
    for (; j < V; j++) n += x[j] >= thr;
    if (n <= SORT_LIMIT) {
        int64_t c = 0;
        for (j = 0; j + 16 <= V; j += 16) {
            const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), vthr, _CMP_GE_OQ);
            _mm512_mask_compressstoreu_ps(vals + c, k, _mm512_loadu_ps(x + j));
            c += __builtin_popcount((unsigned)k);
        }
        for (; j < V; j++)
            if (x[j] >= thr) vals[c++] = x[j];
    }
#else
    for (; j < V; j++)
        if (x[j] >= thr) {
            if (n < SORT_LIMIT) vals[n] = x[j];
            n++;
        }
#endif
    if (n == 0) return thr;
    if (n <= SORT_LIMIT) {
        qsort(vals, (size_t)n, sizeof(float), desc);
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += expf(vals[i] - vals[0]);
        float cum = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            cum += expf(vals[i] - vals[0]) / sum;
            if (cum >= tp) return vals[i];
        }
        return vals[n - 1];
    }
    /* Many kept: bucket their mass by the top 12 bits of the float order, then the next 12
     * bits inside the bucket where the mass crosses tp, then walk distinct values down from the
     * top of that last bucket (256 steps in the last place wide; the walk goes on below it when
     * rounding left the crossing there). */
    const float target = tp * kiln_kept_exp_sum(x, V, thr, m);
    float cum = 0.0f;
    uint32_t prefix = 0;
    float *hist = vals; /* 4 interleaved histograms (no store-to-load chains), then merged */
    for (int level = 0; level < 2; level++) {
        const int shift = 32 - HIST_BITS * (level + 1);
        memset(hist, 0, 4 * (size_t)NB * sizeof(float));
        for (int64_t j0 = 0; j0 < V; j0 += 16) {
            const int64_t w = V - j0 < 16 ? V - j0 : 16;
#if defined(__AVX512F__)
            if (level && w == 16) { /* skip the exps of 16 tokens none of which is in the bucket */
                const __m512i u = _mm512_loadu_si512((const void *)(x + j0));
                const __m512i key = _mm512_xor_si512(
                    u, _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(INT32_MIN)));
                if (!_mm512_cmpeq_epi32_mask(_mm512_srli_epi32(key, shift + HIST_BITS),
                                             _mm512_set1_epi32((int)prefix)))
                    continue;
            }
#endif
            float e[16];
            exp_shifted(x + j0, w, m, e);
            for (int64_t i = 0; i < w; i++) {
                const float v = x[j0 + i];
                if (!(v >= thr)) continue;
                const uint32_t key = key_of(v);
                if (level && (key >> (shift + HIST_BITS)) != prefix) continue;
                hist[(i & 3) * NB + ((key >> shift) & (uint32_t)(NB - 1))] += e[i];
            }
        }
        for (int64_t bk = 0; bk < NB; bk++)
            hist[bk] = (hist[bk] + hist[NB + bk]) + (hist[2 * NB + bk] + hist[3 * NB + bk]);
        int64_t bk = NB - 1; /* cum: the mass of every kept token above bucket bk */
        for (; bk > 0; bk--) { /* (exp16 >= e^-87 > 0: a bucket with tokens has mass) */
            if (hist[bk] > 0.0f && cum + hist[bk] >= target) break;
            cum += hist[bk];
        }
        prefix = (prefix << HIST_BITS) | (uint32_t)bk;
    }
    /* The last bucket's tokens, gathered once and sorted (a handful, normally), give its
     * distinct values in descending order; only a walk that leaves the bucket, or a bucket too
     * full for the buffer, scans the row again per value (next_below). Same values, counts and
     * sums in the same order either way. */
    float prev = INFINITY, last = thr;
    float *cand = vals + 4 * NB;
    const int64_t room = V - 4 * NB + SORT_LIMIT + 2 * NB; /* what is left of the work space */
    int64_t nc = 0;
    j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= V && nc + 16 <= room; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        const __m512i u = _mm512_castps_si512(v);
        const __m512i key = _mm512_xor_si512(
            u, _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(INT32_MIN)));
        const __mmask16 k = _mm512_mask_cmpeq_epi32_mask(
            _mm512_cmp_ps_mask(v, vthr, _CMP_GE_OQ), _mm512_srli_epi32(key, 8),
            _mm512_set1_epi32((int)prefix));
        _mm512_mask_compressstoreu_ps(cand + nc, k, v);
        nc += __builtin_popcount((unsigned)k);
    }
#endif
    for (; j < V && nc <= room; j++)
        if (x[j] >= thr && (key_of(x[j]) >> 8) == prefix) {
            if (nc < room) cand[nc] = x[j];
            nc++;
        }
    if (nc <= room) qsort(cand, (size_t)nc, sizeof(float), desc);
    else nc = 0; /* too many to hold: every value from next_below */
    for (int64_t i = 0;;) {
        float v;
        int64_t count = 0;
        if (i < nc) {
            v = cand[i];
            for (; i < nc && cand[i] == v; i++) count++;
        } else {
            v = next_below(x, V, thr, prev, prefix, &count);
            if (count == 0) return last;
        }
        float ev;
        exp_shifted(&v, 1, m, &ev);
        cum += (float)count * ev;
        if (cum >= target) return v;
        prev = last = v;
    }
}

