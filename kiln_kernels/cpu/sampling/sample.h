/* Shared by the CPU sampler's files (sample.c, top_p.c). */
#ifndef KILN_SAMPLE_H
#define KILN_SAMPLE_H
#include <stdint.h>

#define SORT_LIMIT 4096 /* top-p sorts at most this many kept tokens, else histograms */
#define HIST_BITS 12
#define NB ((int64_t)1 << HIST_BITS)

/* sum of exp(x - m) over x >= thr (the kept tokens). */
float kiln_kept_exp_sum(const float *x, int64_t V, float thr, float m);

/* Top-p over the tokens with x >= thr: the x of the first token, in descending order, at which
 * the cumulative probability reaches tp (the last kept token if none does). `vals`: the work
 * space, V + SORT_LIMIT + 2 NB floats. */
float kiln_top_p_threshold(const float *x, int64_t V, float thr, float tp, float m, float *vals);

#endif
