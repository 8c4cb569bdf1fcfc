/* Attention over the paged KV cache for the C step (cpu_step.c): per (rows of one sequence, KV
 * head, part of the context), the rows read each cached K/V row once. Scores 16 positions at a
 * time with one reduction tree (AVX-512), a vector exp (vmath.h), V accumulated in registers;
 * parts of a long context merged by kiln_attend_merge; a scalar path for other CPUs and head
 * sizes. Every query's numbers depend only on its own row and context. */
#include <math.h>
#include <stdint.h>

#include "cpu_step.h"
#include "vmath.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Softmax attention of the G query heads that share KV head `kvh` over positions
 * 0..ctx_lens[m]-1 of row m's sequence: each cached K/V row is read once for the group. */
/* Cache row `slot` of KV head kvh as float32: in place, or converted into buf (hd floats). */
static const float *kv_row(const KilnCpuStepModel *md, const void *cache, int64_t slot,
                           int64_t kvh, float *buf) {
    const int64_t hd = md->head_dim, at = kiln_kv_at(md, slot, kvh);
    if (!md->kv_f16) return (const float *)cache + at;
    const uint16_t *h = (const uint16_t *)cache + at;
    for (int64_t i = 0; i < hd; i++) buf[i] = kiln_half_to_float(h[i]);
    return buf;
}

static void attend_rows_scalar(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int64_t m,
                               int64_t kvh, const float *q, int64_t G, const void *kc,
                               const void *vc, float *scores, float *out) {
    const int64_t hd = md->head_dim, bs = md->block_size;
    float buf[1024];
    const int64_t len = st->ctx_lens[m], stride = st->max_ctx;
    const int32_t *bt = st->block_tables + m * st->max_blocks;
    float mx[16];
    for (int64_t g = 0; g < G; g++) mx[g] = -INFINITY;
    for (int64_t p0 = 0, b = 0; p0 < len; p0 += bs, b++) {
        const int64_t n = (len - p0 < bs) ? len - p0 : bs, base = (int64_t)bt[b] * bs;
        for (int64_t o = 0; o < n; o++) {
            const float *k = kv_row(md, kc, base + o, kvh, buf);
            for (int64_t g = 0; g < G; g++) {
                const float sc = kiln_dot(q + g * hd, k, hd) * md->scale;
                scores[g * stride + p0 + o] = sc;
                if (sc > mx[g]) mx[g] = sc;
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *sg = scores + g * stride;
        const float sum = kiln_exp_shift_sum(sg, len, mx[g]);
#pragma omp simd
        for (int64_t p = 0; p < len; p++) sg[p] /= sum;
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = 0.0f;
    }
    for (int64_t p0 = 0, b = 0; p0 < len; p0 += bs, b++) {
        const int64_t n = (len - p0 < bs) ? len - p0 : bs, base = (int64_t)bt[b] * bs;
        for (int64_t o = 0; o < n; o++) {
            const float *v = kv_row(md, vc, base + o, kvh, buf);
            for (int64_t g = 0; g < G; g++) {
                const float w = scores[g * stride + p0 + o];
                float *og = out + g * hd;
#pragma omp simd
                for (int64_t i = 0; i < hd; i++) og[i] += w * v[i];
            }
        }
    }
}

#if defined(__AVX512F__)
/* The 16 horizontal sums of v[0..15], in order (a transpose-and-add tree: 45 ops). */
static inline __m512 hsum16(const __m512 *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* b[i] holds, per 128-bit lane L, the lane-L partial sums of v[4i..4i+3]. */
    const __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                    _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                    _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

/* The cache row of position p: walk (block, offset) without a division per position. `sb`,
 * `sp`: bytes between blocks and between positions of a block. */
typedef struct {
    const char *base;
    const int32_t *bt;
    int64_t bs, sb, sp, b, off;
} CacheWalk;

static inline const char *walk_at(const CacheWalk *w) {
    return w->base + (int64_t)w->bt[w->b] * w->sb + w->off * w->sp;
}

/* 16 cache values from chunk c of a row: float32, or IEEE half (F16, a constant after
 * inlining) widened exactly. */
static inline __attribute__((always_inline)) __m512 kv_load(const char *row, int64_t c,
                                                           int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * c)));
    return _mm512_loadu_ps((const float *)row + 16 * c);
}

static inline void walk_next(CacheWalk *w) {
    if (++w->off == w->bs) w->off = 0, w->b++;
}

/* Prefetch the `lines` cache lines of the row at w (the cache rows of a head are strided and
 * split at block ends). An asm statement, not _mm_prefetch: GCC 12 at -O1 and above deletes a
 * loop whose body is only __builtin_prefetch, which had silently dropped every prefetch here
 * (restoring them measured 4-9% faster steps at contexts of 100-1,000, tests/bench: A/B). */
static inline void walk_prefetch(const CacheWalk *w, int64_t lines) {
    const char *r = walk_at(w);
    for (int64_t i = 0; i < lines; i++) __asm__ volatile("prefetcht0 %0" : : "m"(r[64 * i]));
}

/* V rows prefetched this far ahead in the V pass. The K pass prefetches no V: doing so (this
 * chunk's V rows while it was scored, 8 ahead here) measured 1.02-1.04x the step time at
 * contexts of 700-1,500 (A/B of the C step, interleaved builds), and equal at context 100. */
#define PF_AHEAD 16 /* positions */

/* out[q] = sum_p wq[q][p] * V[p] for QG queries over positions 0..len-1 (weights past a
 * query's own context are 0), NC 16-float chunks per head: each V row is loaded once for all
 * QG queries, the QG x NC accumulators stay in registers. */
static inline __attribute__((always_inline)) void pv_group(int NC, int QG, int F16,
                                                           CacheWalk w, int64_t len,
                                                           float *const *wq,
                                                           float *const *out) {
    __m512 acc[16][16];
    for (int q = 0; q < QG; q++)
        for (int c = 0; c < NC; c++) acc[q][c] = _mm512_setzero_ps();
    CacheWalk ahead = w;
    for (int64_t p = 0; p < len && p < PF_AHEAD; p++) walk_next(&ahead);
    for (int64_t p = 0; p < len; p++) {
        if (p + PF_AHEAD < len) {
            walk_prefetch(&ahead, F16 ? (NC + 1) / 2 : NC);
            walk_next(&ahead);
        }
        const char *v = walk_at(&w);
        walk_next(&w);
        __m512 vv[16];
        for (int c = 0; c < NC; c++) vv[c] = kv_load(v, c, F16);
        for (int q = 0; q < QG; q++) {
            const __m512 s = _mm512_set1_ps(wq[q][p]);
            for (int c = 0; c < NC; c++) acc[q][c] = _mm512_fmadd_ps(s, vv[c], acc[q][c]);
        }
    }
    for (int q = 0; q < QG; q++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(out[q] + 16 * c, acc[q][c]);
}

/* Any head size that is a multiple of 16: one query at a time, accumulators in memory. */
static void pv_one(int64_t nc, int f16, CacheWalk w, int64_t len, const float *wq,
                   float *out) {
    for (int64_t c = 0; c < nc; c++) _mm512_storeu_ps(out + 16 * c, _mm512_setzero_ps());
    for (int64_t p = 0; p < len; p++) {
        const char *v = walk_at(&w);
        walk_next(&w);
        const __m512 s = _mm512_set1_ps(wq[p]);
        for (int64_t c = 0; c < nc; c++)
            _mm512_storeu_ps(out + 16 * c,
                             _mm512_fmadd_ps(s, f16 ? kv_load(v, c, 1) : kv_load(v, c, 0),
                                             _mm512_loadu_ps(out + 16 * c)));
    }
}

#define PV_CASES(NC)                                                                        \
    switch (n) {                                                                            \
    case 4: pv_group(NC, 4, F16, w, len, wq, out); break;                                  \
    case 3: pv_group(NC, 3, F16, w, len, wq, out); break;                                  \
    case 2: pv_group(NC, 2, F16, w, len, wq, out); break;                                  \
    default: pv_group(NC, 1, F16, w, len, wq, out); break;                                 \
    }

/* Up to 4 queries at once (QG x NC <= 16 accumulators). */
static inline __attribute__((always_inline)) void pv_queries(int64_t nc, int64_t n, int F16,
                                                             CacheWalk w, int64_t len,
                                                             float *const *wq,
                                                             float *const *out) {
    if (nc == 4) {
        PV_CASES(4)
    } else if (nc == 8) {
        int64_t q = 0;
        for (; q + 2 <= n; q += 2) pv_group(8, 2, F16, w, len, wq + q, out + q);
        if (q < n) pv_group(8, 1, F16, w, len, wq + q, out + q);
    } else {
        for (int64_t q = 0; q < n; q++) pv_one(nc, F16, w, len, wq[q], out[q]);
    }
}

/* The walk over KV head kvh's rows of `cache` from position p. */
static inline CacheWalk walk_from(const KilnCpuStepModel *md, const char *cache, int64_t kvh,
                                  const int32_t *bt, int64_t esize, int64_t p) {
    const int64_t bs = md->block_size;
    const CacheWalk w = {cache + kvh * md->kv_sh * esize, bt, bs, md->kv_sb * esize,
                         md->kv_sp * esize, p / bs, p % bs};
    return w;
}

int64_t kiln_attend_part(const KilnCpuStepModel *md) {
    return (md->head_dim % 16 || md->head_dim > 256) ? INT64_MAX : ATTEND_PART;
}

/* Attention of R consecutive rows of one sequence (query heads kvh*G.. of each; row r's
 * queries at q + r*ldq), positions [p0, p1) of their contexts, for head_dim a multiple of 16
 * (<= 256): scores 16 positions at a time with one reduction tree, each cached K row read once
 * for the R*G queries, softmax with exp16, then V read once per group of up to 4 queries.
 * A row whose context fits one part (ctx <= ATTEND_PART; then p0 = 0) gets its normalized
 * output at out + r*ldo; a longer row gets, per query, the part's record at
 * part + r*part_row + g*part_head: [max score, sum of exp(score - max), sum of exp * V]. */
static inline __attribute__((always_inline)) void attend_impl(
        const KilnCpuStepModel *md, const KilnCpuStepRows *st, int64_t m0, int64_t R, int64_t kvh,
        const float *q, int64_t ldq, int64_t G, const char *kc, const char *vc, float *scores,
        float *out, int64_t ldo, int64_t p0, int64_t p1, float *part, int64_t part_row,
        int64_t part_head, int F16) {
    const int64_t hd = md->head_dim;
    const int64_t stride = st->max_ctx, nc = hd / 16, esize = F16 ? 2 : 4;
    const int64_t lines = (hd * esize + 63) / 64;
    const int32_t *bt = st->block_tables + m0 * st->max_blocks;
    int64_t longest = 0;
    for (int64_t r = 0; r < R; r++)
        longest = st->ctx_lens[m0 + r] > longest ? st->ctx_lens[m0 + r] : longest;
    const int64_t end = longest < p1 ? longest : p1;
    if (end <= p0) return;
    const __m512 scale = _mm512_set1_ps(md->scale);
    CacheWalk kw = walk_from(md, kc, kvh, bt, esize, p0);
    {
        CacheWalk first = kw;
        for (int64_t o = 0; o < 16 && p0 + o < end; o++) {
            walk_prefetch(&first, lines);
            walk_next(&first);
        }
    }
    for (int64_t c0 = p0; c0 < end; c0 += 16) {
        /* In flight while this chunk is scored: the next chunk's K rows (V: PF_AHEAD). */
        CacheWalk ahead = kw;
        for (int64_t o = 0; o < 16 && c0 + o < end; o++) walk_next(&ahead);
        for (int64_t o = 16; o < 32 && c0 + o < end; o++) {
            walk_prefetch(&ahead, lines);
            walk_next(&ahead);
        }
        const char *rows[16];
        for (int64_t o = 0; o < 16; o++) {
            if (c0 + o < end) {
                rows[o] = walk_at(&kw);
                walk_next(&kw);
            } else {
                rows[o] = rows[0];
            }
        }
        for (int64_t r = 0; r < R; r++) {
            const int64_t len = st->ctx_lens[m0 + r] < end ? st->ctx_lens[m0 + r] : end;
            if (c0 >= len) continue;
            const int64_t n = (len - c0 < 16) ? len - c0 : 16; /* never past the part */
            const __mmask16 k = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            for (int64_t g = 0; g < G; g++) {
                const float *qg = q + r * ldq + g * hd;
                __m512 acc[16];
                /* chunk c of 16 positions at a time: 16 independent chains of loads */
                const __m512 q0 = _mm512_loadu_ps(qg);
                for (int o = 0; o < 16; o++) acc[o] = _mm512_mul_ps(q0, kv_load(rows[o], 0, F16));
                for (int64_t c = 1; c < nc; c++) {
                    const __m512 qc = _mm512_loadu_ps(qg + 16 * c);
                    for (int o = 0; o < 16; o++)
                        acc[o] = _mm512_fmadd_ps(qc, kv_load(rows[o], c, F16), acc[o]);
                }
                _mm512_mask_storeu_ps(scores + (r * G + g) * stride + c0, k,
                                      _mm512_mul_ps(hsum16(acc), scale));
            }
        }
    }
    /* Softmax of each query over its positions in [p0, end); zero weights up to `end`. */
    for (int64_t r = 0; r < R; r++) {
        const int64_t len = st->ctx_lens[m0 + r], e = len < end ? len : end;
        const int whole = len <= ATTEND_PART;
        for (int64_t g = 0; g < G; g++) {
            float *sg = scores + (r * G + g) * stride;
            float *rec = part + r * part_row + g * part_head;
            if (e <= p0) { /* nothing of this row in the part */
                for (int64_t p = p0; p < end; p++) sg[p] = 0.0f;
                rec[0] = -INFINITY, rec[1] = 0.0f;
                continue;
            }
            __m512 vm = _mm512_set1_ps(-INFINITY);
            for (int64_t p = p0; p < e; p += 16) {
                const __mmask16 k = (__mmask16)(e - p >= 16 ? 0xFFFF : (1u << (e - p)) - 1);
                vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(vm, k, sg + p));
            }
            const float mx = _mm512_reduce_max_ps(vm);
            const float sum = kiln_exp_shift_sum(sg + p0, e - p0, mx);
            if (whole) {
                const float inv = 1.0f / sum;
                for (int64_t p = p0; p < e; p++) sg[p] *= inv;
            } else {
                rec[0] = mx, rec[1] = sum;
            }
            for (int64_t p = e; p < end; p++) sg[p] = 0.0f;
        }
    }
    /* V: groups of up to 4 queries; a long row's sums go to its part record. */
    const CacheWalk vw = walk_from(md, vc, kvh, bt, esize, p0);
    for (int64_t q0 = 0; q0 < R * G; q0 += 4) {
        const int64_t n = R * G - q0 < 4 ? R * G - q0 : 4;
        float *wq[4], *oq[4];
        for (int64_t j = 0; j < n; j++) {
            const int64_t r = (q0 + j) / G, g = (q0 + j) % G;
            wq[j] = scores + (q0 + j) * stride + p0;
            const int whole = st->ctx_lens[m0 + r] <= ATTEND_PART;
            oq[j] = whole && p0 == 0 ? out + r * ldo + g * hd /* (a later part: unused) */
                                     : part + r * part_row + g * part_head + 2;
        }
        pv_queries(nc, n, F16, vw, end - p0, wq, oq);
    }
}

void kiln_attend_seq(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int64_t m0,
                     int64_t R, int64_t kvh, const float *q, int64_t ldq, int64_t G,
                     const void *kc, const void *vc, float *scores, float *out, int64_t ldo,
                     int64_t p0, int64_t p1, float *part, int64_t part_row,
                     int64_t part_head) {
    const int64_t hd = md->head_dim;
    if (hd % 16 || hd > 256) {
        if (p0 > 0) return; /* one part: kiln_attend_part() */
        for (int64_t r = 0; r < R; r++)
            attend_rows_scalar(md, st, m0 + r, kvh, q + r * ldq, G, kc, vc,
                               scores + r * G * st->max_ctx, out + r * ldo);
        return;
    }
    if (md->kv_f16)
        attend_impl(md, st, m0, R, kvh, q, ldq, G, (const char *)kc, (const char *)vc, scores,
                    out, ldo, p0, p1, part, part_row, part_head, 1);
    else
        attend_impl(md, st, m0, R, kvh, q, ldq, G, (const char *)kc, (const char *)vc, scores,
                    out, ldo, p0, p1, part, part_row, part_head, 0);
}

/* Out = the merged parts of a long row's query: sum_j e^(m_j - M) o_j / sum_j e^(m_j - M) s_j
 * (M = max_j m_j), parts in order. */
void kiln_attend_merge(const float *part, int64_t nparts, int64_t hd, float *out) {
    const int64_t rec = hd + 2;
    float top = -INFINITY;
    for (int64_t j = 0; j < nparts; j++) top = part[j * rec] > top ? part[j * rec] : top;
    float denom = 0.0f;
    for (int64_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int64_t j = 0; j < nparts; j++) {
        const float *r = part + j * rec;
        if (r[1] == 0.0f) continue;
        const float w = expf(r[0] - top);
        denom += w * r[1];
        for (int64_t i = 0; i < hd; i++) out[i] += w * r[2 + i];
    }
    const float inv = 1.0f / denom;
    for (int64_t i = 0; i < hd; i++) out[i] *= inv;
}
#else
int64_t kiln_attend_part(const KilnCpuStepModel *md) {
    (void)md;
    return INT64_MAX;
}

void kiln_attend_seq(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int64_t m0,
                     int64_t R, int64_t kvh, const float *q, int64_t ldq, int64_t G,
                     const void *kc, const void *vc, float *scores, float *out, int64_t ldo,
                     int64_t p0, int64_t p1, float *part, int64_t part_row,
                     int64_t part_head) {
    (void)p1, (void)part, (void)part_row, (void)part_head;
    if (p0 > 0) return; /* one part: kiln_attend_part() */
    for (int64_t r = 0; r < R; r++)
        attend_rows_scalar(md, st, m0 + r, kvh, q + r * ldq, G, kc, vc,
                           scores + r * G * st->max_ctx, out + r * ldo);
}

void kiln_attend_merge(const float *part, int64_t nparts, int64_t hd, float *out) {
    (void)part, (void)nparts, (void)hd, (void)out; /* never called: one part */
}
#endif
