/* The CPU sampler (kiln_kernels.sampling.native): the torch reference's order of operations
 * (kernels/sampling/reference.py) row by row in C, on one private copy of the row, with no
 * [rows, vocab] temporaries:
 *   1. penalties on the row's seen tokens only (repetition, frequency, presence; float32, in the
 *      reference's order, so a penalized logit has the reference's bits);
 *   2. greedy rows (temperature < 1e-5 or top_k == 1): argmax, ties to the lowest id;
 *   3. x / temperature, then one threshold folding top-k (a bounded heap, or quickselect), min-p
 *      (max x + log(min_p), log from the caller) and top-p over the kept tokens (sorted when few,
 *      else located by a histogram of their probability mass);
 *   4. Gumbel-max over the kept tokens with the counter hash of (seed, step, token id) (counter.c),
 *      ties to the lowest id; logprob = x[token] - logsumexp(kept x).
 * A row's result depends on nothing but its own inputs. Transcendentals are libm's (and exp16),
 * so probabilities may differ from torch's in the last bits: a token can differ only where a
 * top-p cumulative sum or two noisy scores tie to within that rounding. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "counter.h"
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
#define SORT_LIMIT 4096 /* top-p sorts at most this many kept tokens, else histograms */
#define HIST_BITS 12
#define NB ((int64_t)1 << HIST_BITS)

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
    int64_t best = 0;
    float m = x[0];
    if (m != m) return 0;
    for (int64_t j = 1; j < V; j++) {
        if (x[j] > m) m = x[j], best = j;
        else if (x[j] != x[j]) return j;
    }
    return best;
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

/* sum of exp(x - m) over x >= thr (the kept tokens). */
static float kept_exp_sum(const float *x, int64_t V, float thr, float m) {
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

/* Top-p over the tokens with x >= thr: the x of the first token, in descending order, at which
 * the cumulative probability reaches tp (the last kept token if none does). */
static float top_p_threshold(const float *x, int64_t V, float thr, float tp, float m,
                             float *vals, uint32_t *hist_n, float *hist_mass) {
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++)
        if (x[j] >= thr) {
            if (n < SORT_LIMIT) vals[n] = x[j];
            n++;
        }
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
    const float target = tp * kept_exp_sum(x, V, thr, m);
    float cum = 0.0f;
    uint32_t prefix = 0;
    for (int level = 0; level < 2; level++) {
        const int shift = 32 - HIST_BITS * (level + 1);
        memset(hist_n, 0, (size_t)NB * sizeof(uint32_t));
        memset(hist_mass, 0, (size_t)NB * sizeof(float));
        for (int64_t j = 0; j < V; j++) {
            if (!(x[j] >= thr)) continue;
            const uint32_t key = key_of(x[j]);
            if (level && (key >> (shift + HIST_BITS)) != prefix) continue;
            const uint32_t bk = (key >> shift) & (uint32_t)(NB - 1);
            hist_n[bk]++, hist_mass[bk] += expf(x[j] - m);
        }
        int64_t bk = NB - 1; /* cum: the mass of every kept token above bucket bk */
        for (; bk > 0; bk--) {
            if (hist_n[bk] && cum + hist_mass[bk] >= target) break;
            cum += hist_mass[bk];
        }
        prefix = (prefix << HIST_BITS) | (uint32_t)bk;
    }
    float prev = INFINITY, last = thr;
    for (;;) {
        float v = -INFINITY;
        int64_t count = 0;
        for (int64_t j = 0; j < V; j++) {
            if (!(x[j] >= thr) || !(x[j] < prev) || (key_of(x[j]) >> 8) > prefix) continue;
            if (x[j] > v) v = x[j], count = 1;
            else if (x[j] == v) count++;
        }
        if (count == 0) return last;
        cum += (float)count * expf(v - m);
        if (cum >= target) return v;
        prev = last = v;
    }
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
    float m = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        x[j] = x[j] / t;
        m = x[j] > m ? x[j] : m;
    }
    float thr = -INFINITY;
    if (k > 0 && k < V) thr = kth_largest(x, V, k, tmp);
    const float lmp = s->log_min_p[b];
    if (lmp > -INFINITY) thr = fmaxf(thr, m + lmp);
    const float tp = s->top_p[b];
    if (tp > 0.0f && tp < 1.0f)
        thr = fmaxf(thr, top_p_threshold(x, V, thr, tp, m, tmp, (uint32_t *)(tmp + SORT_LIMIT),
                                         tmp + SORT_LIMIT + NB));
    /* Gumbel-max over the kept tokens, ascending ids, strict > so ties keep the lowest id. */
    const uint32_t row = kiln_counter_row(s->seeds[b], s->steps[b]);
    int64_t best = 0;
    float top = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        if (!(x[j] >= thr)) continue;
        const float u = kiln_counter_u(row, j);
        const float score = x[j] - logf(-logf(u));
        if (score > top) top = score, best = j;
    }
    s->tokens[b] = best;
    s->logprobs[b] = x[best] - (m + logf(kept_exp_sum(x, V, thr, m)));
}

/* Per thread: the row [V], work space [V + SORT_LIMIT + 2 NB], the marks [V] (int32). */
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
