/* Shared by the CPU sampler's files (sample.c, top_p.c). */
#ifndef KILN_SAMPLE_H
#define KILN_SAMPLE_H
#include <stdint.h>

#include "isa.h"

#define SORT_LIMIT 4096 /* top-p sorts at most this many kept tokens, else histograms */
#define HIST_BITS 12
#define NB ((int64_t)1 << HIST_BITS)

/* The lanes of v that `bits` (vm_bits(m)) names, in order, to dst; returns how many. A whole
 * block is one plain store (no lane-by-lane compress where the build emulates it). */
static inline int64_t kiln_keep_f(float *dst, unsigned bits, vm m, vf v) {
    if (bits == 0xFFFFu) {
        vf_store(dst, v);
        return 16;
    }
    return bits ? vf_compress_store(dst, m, v) : 0;
}

static inline int64_t kiln_keep_i(int32_t *dst, unsigned bits, vm m, vi v) {
    if (bits == 0xFFFFu) {
        vi_store(dst, v);
        return 16;
    }
    return bits ? vi_compress_store(dst, m, v) : 0;
}

/* sum of exp(x - m) over x >= thr (the kept tokens). */
float kiln_kept_exp_sum(const float *x, int64_t V, float thr, float m);

/* Top-p over the tokens with x >= thr: the x of the first token, in descending order, at which
 * the cumulative probability reaches tp (the last kept token if none does). `vals`: the work
 * space, V + SORT_LIMIT + 2 NB floats. */
float kiln_top_p_threshold(const float *x, int64_t V, float thr, float tp, float m, float *vals);

#endif
