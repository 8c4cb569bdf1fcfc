/* Top-p for the CPU sampler (sample.c): the probability threshold over the kept tokens, by a
 * sort when at most SORT_LIMIT are kept, else by two 12-bit histograms of their probability mass
 * over the float order and a walk of the distinct values in the last bucket; and the kept
 * tokens' exp sum. A row's numbers depend on nothing but the row, and are the same bits on every
 * build of the ISA layer (isa.h): one algorithm, the layer's e^x, fixed summation orders. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"
#include "sample.h"

static int desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* A float's bits as an unsigned key in the float order (for the histogram). */
static inline uint32_t key_of(float x) {
    const uint32_t u = kiln_f_bits(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* key_of for 16 lanes. */
static inline vi keys_of(vf v) {
    const vi u = vf_bits(v);
    return vi_xor(u, vi_or(vi_sra(u, 31), vi_set1(INT32_MIN)));
}

/* sum of exp(x - m) over x >= thr (the kept tokens): one 16-lane accumulator in index order
 * (the last lanes masked), then vf_hsum's tree. */
float kiln_kept_exp_sum(const float *x, int64_t V, float thr, float m) {
    vf acc = vf_zero();
    const vf vt = vf_set1(thr), vm_ = vf_set1(m);
    int64_t j = 0;
    for (; j + 16 <= V; j += 16) {
        const vf v = vf_load(x + j);
        const vm k = vf_ge(v, vt);
        if (!vm_bits(k)) continue; /* adding 16 zeros leaves acc (>= +0) as it is */
        acc = vf_add(acc, vf_maskz(k, vf_exp(vf_sub(v, vm_))));
    }
    if (j < V) {
        const vf v = vf_load_n(x + j, V - j);
        acc = vf_add(acc, vf_maskz(vm_and(vf_ge(v, vt), vm_first(V - j)), vf_exp(vf_sub(v, vm_))));
    }
    return vf_hsum(acc);
}

/* e[i] = exp(x[i] - m) for i < w <= 16 (e: 16 floats; the lanes from w on are exp(-m)). */
static inline void exp_shifted(const float *x, int64_t w, float m, float *e) {
    vf_store(e, vf_exp(vf_sub(vf_load_n(x, w), vf_set1(m))));
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
    const vf vthr = vf_set1(thr);
    for (; j + 16 <= V; j += 16) { /* count, and copy while few enough to sort (vals holds V) */
        const vf v = vf_load(x + j);
        const vm k = vf_ge(v, vthr);
        const unsigned bits = vm_bits(k);
        if (n <= SORT_LIMIT) kiln_keep_f(vals + n, bits, k, v);
        n += __builtin_popcount(bits);
    }
    for (; j < V; j++)
        if (x[j] >= thr) vals[n++] = x[j];
    if (n == 0) return thr;
    if (n <= SORT_LIMIT) {
        qsort(vals, (size_t)n, sizeof(float), desc);
        float *e = vals + SORT_LIMIT; /* exp(vals[i] - vals[0]), past the sorted values */
        for (int64_t i = 0; i < n; i += 16)
            vf_store_n(e + i, vf_exp(vf_sub(vf_load_n(vals + i, n - i), vf_set1(vals[0]))), n - i);
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += e[i];
        float cum = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            cum += e[i] / sum;
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
            const vf v = vf_load_n(x + j0, w);
            const vi key = keys_of(v);
            vm k = vm_and(vf_ge(v, vthr), vm_first(w));
            if (level) /* only the tokens in the bucket the first level found */
                k = vm_and(k, vi_eq(vi_srl(key, 32 - HIST_BITS), vi_set1((int32_t)prefix)));
            unsigned bits = vm_bits(k);
            if (!bits) continue; /* skips the exps of 16 tokens none of which counts */
            float e[16];
            int32_t bucket[16];
            exp_shifted(x + j0, w, m, e);
            vi_store(bucket, vi_and(vi_srl(key, shift), vi_set1((int32_t)(NB - 1))));
            for (; bits; bits &= bits - 1) { /* lanes in order: the same sums on every build */
                const int i = __builtin_ctz(bits);
                hist[(i & 3) * NB + bucket[i]] += e[i];
            }
        }
        for (int64_t bk = 0; bk < NB; bk++)
            hist[bk] = (hist[bk] + hist[NB + bk]) + (hist[2 * NB + bk] + hist[3 * NB + bk]);
        int64_t bk = NB - 1; /* cum: the mass of every kept token above bucket bk */
        for (; bk > 0; bk--) { /* (vf_exp >= e^-87 > 0: a bucket with tokens has mass) */
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
    for (; j + 16 <= V && nc + 16 <= room; j += 16) {
        const vf v = vf_load(x + j);
        const vm k = vm_and(vf_ge(v, vthr), vi_eq(vi_srl(keys_of(v), 8), vi_set1((int32_t)prefix)));
        nc += kiln_keep_f(cand + nc, vm_bits(k), k, v);
    }
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
        cum += (float)count * kiln_exp(v - m);
        if (cum >= target) return v;
        prev = last = v;
    }
}

