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
 * A row's result depends on nothing but its own inputs. Transcendentals are libm's and vector
 * ones (exp16, log16; libm without AVX-512), so values may differ from torch's in the last bits:
 * a token can differ only where a top-p cumulative sum or two noisy scores tie to within that
 * rounding. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "counter.h"
#include "sample.h"
#include "vmath.h"

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
    float m = -INFINITY;
#if defined(__AVX512F__)
    __m512 vm = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (; j + 16 <= V && !nan; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        vm = _mm512_max_ps(v, vm);
    }
    if (nan) return j - 16 + __builtin_ctz((unsigned)nan);
    m = _mm512_reduce_max_ps(vm);
#endif
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
        for (int64_t j = k; j < V; j++)
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
    float m = -INFINITY;
#if defined(__AVX512F__)
    const __m512 vt = _mm512_set1_ps(t);
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (; j + 16 <= V; j += 16) {
        const __m512 v = _mm512_div_ps(_mm512_loadu_ps(x + j), vt);
        _mm512_storeu_ps(x + j, v);
        vm = _mm512_max_ps(v, vm);
    }
    m = _mm512_reduce_max_ps(vm);
#endif
    for (; j < V; j++) {
        x[j] = x[j] / t;
        m = x[j] > m ? x[j] : m;
    }
    return m;
}

/* The kept token with the largest x + Gumbel noise -ln(-ln u), u from the counter hash of its
 * id; ties to the lowest id. Kept ids are gathered first (into `ids`, V int32), so a row with a
 * handful kept hashes only those, and every row uses the same arithmetic per token. */
static int64_t gumbel_max(const float *x, int64_t V, float thr, uint32_t row, int32_t *ids) {
    int64_t n = 0, j = 0;
#if defined(__AVX512F__)
    const __m512 vt = _mm512_set1_ps(thr);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; j + 16 <= V; j += 16, iota = _mm512_add_epi32(iota, step)) {
        const __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + j), vt, _CMP_GE_OQ);
        _mm512_mask_compressstoreu_epi32(ids + n, k, iota);
        n += __builtin_popcount((unsigned)k);
    }
#endif
    for (; j < V; j++)
        if (x[j] >= thr) ids[n++] = (int32_t)j;
    if (n == 0) return 0;
    int64_t i = 0, best = ids[0];
    float top = -INFINITY;
#if defined(__AVX512F__)
    __m512 vbest = _mm512_set1_ps(-INFINITY);
    __m512i vidx = _mm512_set1_epi32(ids[0]);
    for (; i < n; i += 16) {
        const __mmask16 k = (__mmask16)(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
        const __m512i id = _mm512_maskz_loadu_epi32(k, ids + i);
        const __m512 u = kiln_counter_u16(row, id);
        const __m512 g = log16(_mm512_sub_ps(_mm512_setzero_ps(), log16(u)));
        const __m512 sc = _mm512_sub_ps(_mm512_mask_i32gather_ps(vt, k, id, x, 4), g);
        const __mmask16 up = _mm512_mask_cmp_ps_mask(k, sc, vbest, _CMP_GT_OQ);
        vbest = _mm512_mask_mov_ps(vbest, up, sc);
        vidx = _mm512_mask_mov_epi32(vidx, up, id);
    }
    top = _mm512_reduce_max_ps(vbest);
    const __mmask16 at = _mm512_cmp_ps_mask(vbest, _mm512_set1_ps(top), _CMP_EQ_OQ);
    best = _mm512_mask_reduce_min_epi32(at, vidx);
#else
    for (; i < n; i++) {
        const float score = x[ids[i]] - logf(-logf(kiln_counter_u(row, ids[i])));
        if (score > top) top = score, best = ids[i];
    }
#endif
    return best;
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
    s->logprobs[b] = x[best] - (m + logf(kiln_kept_exp_sum(x, V, thr, m)));
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
