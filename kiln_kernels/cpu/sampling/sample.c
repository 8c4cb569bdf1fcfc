/* The CPU sampler (kiln_kernels.sampling.native): the torch reference's order of operations
 * (kiln_kernels/sampling/reference.py) row by row in C, on one private copy of the row, with no
 * [rows, vocab] temporaries:
 *   1. penalties on the row's seen tokens only (repetition, frequency, presence; float32, in the
 *      reference's order, so a penalized logit has the reference's bits);
 *   2. greedy rows (temperature < 1e-5 or top_k == 1): argmax, ties to the lowest id;
 *   3. x / temperature, then one threshold folding top-k (a bounded heap, or quickselect), min-p
 *      (max x + log(min(min_p, 1)), log from the caller) and top-p over the kept tokens (sorted when few,
 *      else located by a histogram of their probability mass);
 *   4. Gumbel-max over the kept tokens with the counter hash of (seed, step, token id) (counter.c),
 *      ties to the lowest id; logprob = x[token] - logsumexp(kept x).
 * A row's result depends on nothing but its own inputs. The code is written once on the ISA
 * layer (isa.h): every build (AVX-512, AVX2, NEON, plain C) runs the same operations in the same
 * order, with the layer's own e^x and ln x (vf_exp / vf_log and their one-lane kiln_exp /
 * kiln_log, never libm), so tokens and logprobs are bit-identical on every build. Those
 * transcendentals are not torch's, so values may differ from torch's in the last bits: a token
 * can differ only where a top-p cumulative sum or two noisy scores tie to within that
 * rounding. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "counter.h"
#include "isa.h"
#include "sample.h"

typedef struct {
    int64_t B, V, ld;
    const float *logits;                                     /* [B][ld] float32 */
    const float *temperature, *top_p, *log_min_p;            /* log_min_p: -inf when off */
    const float *repetition, *frequency, *presence;          /* repetition: 1 when off */
    const int64_t *top_k, *seeds, *steps;                    /* [B] */
    const int64_t *seen_off;                                 /* [B + 1] into seen_* */
    const int64_t *seen_ids;                                 /* token ids (may repeat) */
    const int32_t *seen_counts;                              /* output count (0: prompt) */
    float *scratch; /* kiln_sample_scratch_floats(); zeros on first use (the marks) */
    int64_t *tokens;
    float *logprobs;
} KilnSampleBatch;

#define GREEDY_TEMPERATURE 1e-5f
/* Penalties on the seen tokens: `mark` (V int32, all zero on entry and on return) sums each
 * id's count + 1 so repeated ids get one update with their total count. */
static void penalize(const KilnSampleBatch *s, int64_t b, float *x, int32_t *mark) {
    const int64_t lo = s->seen_off[b], hi = s->seen_off[b + 1];
    const float r = s->repetition[b], f = s->frequency[b], p = s->presence[b];
    for (int64_t i = lo; i < hi; i++) {
        int32_t *mk = mark + s->seen_ids[i];
        *mk += s->seen_counts[i] + (*mk == 0);
    }
    for (int64_t i = lo; i < hi; i++) {
        const int64_t id = s->seen_ids[i];
        if (mark[id] == 0) continue; /* done (a repeated id) */
        const float c = (float)(mark[id] - 1);
        float v = x[id];
        v = v > 0.0f ? v / r : v * r;
        v = v - f * c;
        v = v - p * (c > 0.0f ? 1.0f : 0.0f);
        x[id] = v;
        mark[id] = 0;
    }
}

/* The first index of the largest value (NaN counts as the largest, as in torch.argmax). */
static int64_t argmax(const float *x, int64_t V) {
    int64_t j = 0;
    vf vmax = vf_set1(-INFINITY);
    for (; j + 16 <= V; j += 16) {
        const vf v = vf_load(x + j);
        const unsigned nan = vm_bits(vf_unord(v, v));
        if (nan) return j + __builtin_ctz(nan);
        vmax = vf_max(v, vmax);
    }
    float m = vf_hmax(vmax); /* the max is exact: the same in any order */
    int64_t best = -1;
    for (int64_t i = j; i < V; i++) {
        if (x[i] != x[i]) return i; /* no NaN before the tail */
        if (x[i] > m) m = x[i], best = i;
    }
    if (best >= j) return best; /* the tail holds the (first) largest */
    for (int64_t i = 0; i < j; i++)
        if (x[i] == m) return i;
    return best < 0 ? 0 : best;
}

static void sift_down(float *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[i] <= h[c]) return;
        const float t = h[i];
        h[i] = h[c], h[c] = t, i = c;
    }
}

/* The k-th largest value of x (0 < k < V), counting repeats like torch.topk. */
static float kth_largest(const float *x, int64_t V, int64_t k, float *tmp) {
    if (k <= 1024) { /* a min-heap of the k largest so far */
        memcpy(tmp, x, (size_t)k * sizeof(float));
        for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(tmp, k, i);
        int64_t j = k;
        for (; j + 16 <= V; j += 16) { /* 16 at a time past those no larger than the heap's top */
            if (!vm_bits(vf_gt(vf_load(x + j), vf_set1(tmp[0])))) continue;
            for (int64_t i = j; i < j + 16; i++)
                if (x[i] > tmp[0]) tmp[0] = x[i], sift_down(tmp, k, 0);
        }
        for (; j < V; j++)
            if (x[j] > tmp[0]) tmp[0] = x[j], sift_down(tmp, k, 0);
        return tmp[0];
    }
    memcpy(tmp, x, (size_t)V * sizeof(float)); /* quickselect of position k - 1, descending */
    int64_t lo = 0, hi = V - 1, want = k - 1;
    while (lo < hi) {
        const float pivot = tmp[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > pivot) i++;
            while (tmp[j] < pivot) j--;
            if (i <= j) {
                const float t = tmp[i];
                tmp[i++] = tmp[j], tmp[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return tmp[want];
    }
    return tmp[want];
}

/* x[j] /= t for every j; returns the largest (NaN never wins, as in the reference's max). */
static float scale_max(float *x, int64_t V, float t) {
    int64_t j = 0;
    const vf vt = vf_set1(t);
    vf vmax = vf_set1(-INFINITY);
    for (; j + 16 <= V; j += 16) {
        const vf v = vf_div(vf_load(x + j), vt);
        vf_store(x + j, v);
        vmax = vf_max(v, vmax); /* NaN lanes keep vmax */
    }
    float m = vf_hmax(vmax);
    for (; j < V; j++) {
        x[j] = x[j] / t;
        m = x[j] > m ? x[j] : m;
    }
    return m;
}

/* The kept token with the largest x + Gumbel noise -ln(-ln u), u from the counter hash of its
 * id; ties to the lowest id. Kept ids are gathered first (into `ids`, V int32), so a row with a
 * handful kept hashes only those, and every row uses the same arithmetic per token. Each lane
 * keeps the first of its largest scores, and the lowest id among the lanes holding the largest
 * wins: the lowest id of the largest score, whichever lanes the ids fell in. */
static int64_t gumbel_max(const float *x, int64_t V, float thr, uint32_t row, int32_t *ids) {
    int64_t n = 0, j = 0;
    const vf vt = vf_set1(thr);
    vi iota = vi_iota();
    for (; j + 16 <= V; j += 16, iota = vi_add(iota, vi_set1(16))) {
        const vm k = vf_ge(vf_load(x + j), vt);
        n += kiln_keep_i(ids + n, vm_bits(k), k, iota);
    }
    for (; j < V; j++)
        if (x[j] >= thr) ids[n++] = (int32_t)j;
    if (n == 0) return 0;
    vf vbest = vf_set1(-INFINITY);
    vi vidx = vi_set1(ids[0]);
    for (int64_t i = 0; i < n; i += 16) {
        const vm k = vm_first(n - i);
        const vi id = vi_load_n(ids + i, n - i);
        const vf u = kiln_counter_u16(row, id);
        const vf g = vf_log(vf_sub(vf_zero(), vf_log(u)));
        /* 16 consecutive ids (ids ascend): one load, else a gather */
        const vf xv = i + 16 <= n && ids[i + 15] - ids[i] == 15 ? vf_load(x + ids[i])
                                                                 : vf_gather(x, id, k, vt);
        const vf sc = vf_sub(xv, g);
        const vm up = vm_and(vf_gt(sc, vbest), k);
        vbest = vf_select(up, sc, vbest);
        vidx = vi_select(up, id, vidx);
    }
    const float top = vf_hmax(vbest);
    float b[16];
    int32_t d[16];
    vf_store(b, vbest);
    vi_store(d, vidx);
    int64_t best = -1;
    for (int l = 0; l < 16; l++)
        if (b[l] == top && (best < 0 || d[l] < best)) best = d[l];
    return best < 0 ? ids[0] : best;
}

static void sample_row(const KilnSampleBatch *s, int64_t b, float *x, float *tmp,
                       int32_t *mark) {
    const int64_t V = s->V;
    memcpy(x, s->logits + b * s->ld, (size_t)V * sizeof(float));
    penalize(s, b, x, mark);
    const float t = s->temperature[b];
    const int64_t k = s->top_k[b];
    if (t < GREEDY_TEMPERATURE || k == 1) {
        s->tokens[b] = argmax(x, V);
        s->logprobs[b] = 0.0f;
        return;
    }
    const float m = scale_max(x, V, t);
    float thr = -INFINITY;
    if (k > 0 && k < V) thr = kth_largest(x, V, k, tmp);
    const float lmp = s->log_min_p[b];
    if (lmp > -INFINITY) thr = fmaxf(thr, m + lmp);
    const float tp = s->top_p[b];
    if (tp > 0.0f && tp < 1.0f)
        thr = fmaxf(thr, kiln_top_p_threshold(x, V, thr, tp, m, tmp));
    const int64_t best = gumbel_max(x, V, thr, kiln_counter_row(s->seeds[b], s->steps[b]),
                                    (int32_t *)tmp);
    s->tokens[b] = best;
    s->logprobs[b] = x[best] - (m + kiln_log(kiln_kept_exp_sum(x, V, thr, m)));
}

/* Per thread: the row [V], work space [V + SORT_LIMIT + 2 NB] (the top-k heap or quickselect
 * copy, top-p's sorted values or 4 histograms when V > SORT_LIMIT, the kept ids), the marks [V]
 * (int32). */
int64_t kiln_sample_scratch_floats(int64_t V, int64_t nthreads) {
    return nthreads * (3 * V + SORT_LIMIT + 2 * NB);
}

/* Every row of the batch, spread over `nthreads` threads (each on its scratch slice). */
void kiln_sample(const KilnSampleBatch *s, int nthreads) {
    const int64_t per = 3 * s->V + SORT_LIMIT + 2 * NB;
#pragma omp parallel num_threads(nthreads)
    {
        float *x = s->scratch + omp_get_thread_num() * per;
        float *tmp = x + s->V;
        int32_t *mark = (int32_t *)(tmp + s->V + SORT_LIMIT + 2 * NB);
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < s->B; b++) sample_row(s, b, x, tmp, mark);
    }
}
