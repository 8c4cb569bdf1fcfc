/* Attention over the paged KV cache for the C step (cpu_step.c): per (rows of one sequence, KV
 * head, part of the context), the rows read each cached K/V row once. Written once on the ISA
 * layer (isa.h): scores 16 positions at a time with its reduction tree (vf_hsum16), the
 * layer's exp (vmath.h), V accumulated with fma in registers; parts of a long context merged by
 * kiln_attend_merge; a scalar path (one fixed order too) for head sizes that are not a multiple
 * of 16 or over 256. Every query's numbers depend only on its own row and context, and are the
 * same bits on every build: the register blocking below (a speed choice, by KILN_VREGS) never
 * changes any output's order of operations. */
#include <math.h>
#include <stdint.h>

#include "cpu_step.h"
#include "vmath.h"

/* Register blocking by the register file (KILN_VREGS vf): positions whose score accumulators
 * are live at once (a vf_hsum16 takes 16, kept in memory between blocks); V accumulators
 * (queries x 16-float chunks) live in a V pass, and the most chunks of a head per pass. */
#if KILN_VREGS >= 32
#define SCORE_BLOCK 16
#define PV_ACC 16
#define PV_CHUNKS 8
#else
#define SCORE_BLOCK 4
#define PV_ACC 4
#define PV_CHUNKS 2
#endif

/* Cache row `slot` of KV head kvh as float32: in place, or converted into buf (hd floats). */
static const float *kv_row(const KilnCpuStepModel *md, const void *cache, int64_t slot,
                           int64_t kvh, float *buf) {
    const int64_t hd = md->head_dim, at = kiln_kv_at(md, slot, kvh);
    if (!md->kv_f16) return (const float *)cache + at;
    const uint16_t *h = (const uint16_t *)cache + at;
    for (int64_t i = 0; i < hd; i++) buf[i] = kiln_half_to_float(h[i]);
    return buf;
}

/* Softmax attention of the G query heads that share KV head `kvh` over positions
 * 0..ctx_lens[m]-1 of row m's sequence, for the head sizes attend_impl does not take: one
 * fixed order on every build (kiln_dot's, the layer's exp, elementwise sums in position
 * order). */
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
                for (int64_t i = 0; i < hd; i++) og[i] += w * v[i];
            }
        }
    }
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
KILN_INLINE vf kv_load(const char *row, int64_t c, int F16) {
    if (F16) return vf_load_f16(row + 32 * c);
    return vf_load((const float *)row + 16 * c);
}

static inline void walk_next(CacheWalk *w) {
    if (++w->off == w->bs) w->off = 0, w->b++;
}

/* Prefetch `lines` cache lines from byte `off` of the row at w (the cache rows of a head are
 * strided and split at block ends). kiln_prefetch is an asm statement: GCC 12 at -O1 and above
 * deletes a loop whose body is only __builtin_prefetch, which had silently dropped every
 * prefetch here (restoring them measured 4-9% faster steps at contexts of 100-1,000). */
static inline void walk_prefetch(const CacheWalk *w, int64_t off, int64_t lines) {
    const char *r = walk_at(w) + off;
    for (int64_t i = 0; i < lines; i++) kiln_prefetch(r + 64 * i);
}

/* V rows prefetched this far ahead in the V pass. The K pass prefetches no V: doing so (this
 * chunk's V rows while it was scored, 8 ahead here) measured 1.02-1.04x the step time at
 * contexts of 700-1,500 (A/B of the C step, interleaved builds), and equal at context 100. */
#define PF_AHEAD 16 /* positions */

/* acc[o] = sum_c q chunk c * K row o chunk c (fma from chunk 0's product, chunks in order)
 * for SB positions: the accumulators stay in registers over the head's chunks. */
KILN_INLINE void score_block(int SB, int F16, const float *qg, int64_t nc,
                             const char *const *rows, vf *acc) {
    vf a[16];
    const vf q0 = vf_load(qg);
    for (int o = 0; o < SB; o++) a[o] = vf_mul(q0, kv_load(rows[o], 0, F16));
    for (int64_t c = 1; c < nc; c++) {
        const vf qc = vf_load(qg + 16 * c);
        for (int o = 0; o < SB; o++) a[o] = vf_fma(qc, kv_load(rows[o], c, F16), a[o]);
    }
    for (int o = 0; o < SB; o++) acc[o] = a[o];
}

/* out[q][16 (c0 + c) ..] = sum_p wq[q][p] * V[p] chunk c0 + c (fma from zero, positions in
 * order) for QG queries and CB chunks (weights past a query's own context are 0): each V chunk
 * is loaded once for all QG queries, the QG x CB accumulators stay in registers. */
KILN_INLINE void pv_block(int CB, int QG, int F16, CacheWalk w, int64_t len, int64_t c0,
                          float *const *wq, float *const *out) {
    vf acc[4][8];
    for (int q = 0; q < QG; q++)
        for (int c = 0; c < CB; c++) acc[q][c] = vf_zero();
    const int64_t cbytes = F16 ? 32 : 64, off = c0 * cbytes, lines = (CB * cbytes + 63) / 64;
    CacheWalk ahead = w;
    for (int64_t p = 0; p < len && p < PF_AHEAD; p++) walk_next(&ahead);
    for (int64_t p = 0; p < len; p++) {
        if (p + PF_AHEAD < len) {
            walk_prefetch(&ahead, off, lines);
            walk_next(&ahead);
        }
        const char *v = walk_at(&w);
        walk_next(&w);
        vf vv[8];
        for (int c = 0; c < CB; c++) vv[c] = kv_load(v, c0 + c, F16);
        for (int q = 0; q < QG; q++) {
            const vf s = vf_set1(wq[q][p]);
            for (int c = 0; c < CB; c++) acc[q][c] = vf_fma(s, vv[c], acc[q][c]);
        }
    }
    for (int q = 0; q < QG; q++)
        for (int c = 0; c < CB; c++) vf_store(out[q] + 16 * (c0 + c), acc[q][c]);
}

/* pv_block for qg queries (the shapes that fit: no other is instantiated) */
#define PV_FITS(CB, QG) ((CB) <= PV_CHUNKS && (CB) * (QG) <= PV_ACC)
#define PV_QG(CB)                                                                           \
    switch (qg) {                                                                           \
    case 4: if (PV_FITS(CB, 4)) pv_block(CB, 4, F16, w, len, c0, wq + q, out + q); break;  \
    case 3: if (PV_FITS(CB, 3)) pv_block(CB, 3, F16, w, len, c0, wq + q, out + q); break;  \
    case 2: if (PV_FITS(CB, 2)) pv_block(CB, 2, F16, w, len, c0, wq + q, out + q); break;  \
    default: if (PV_FITS(CB, 1)) pv_block(CB, 1, F16, w, len, c0, wq + q, out + q); break; \
    }

/* Up to 4 queries' V sums: the head's nc chunks in passes of up to PV_CHUNKS, each pass over
 * groups of queries that fit PV_ACC accumulators. */
KILN_INLINE void pv_queries(int64_t nc, int64_t n, int F16, CacheWalk w, int64_t len,
                            float *const *wq, float *const *out) {
    for (int64_t c0 = 0; c0 < nc;) {
        const int64_t left = nc - c0;
        const int cb = left >= 8 && PV_CHUNKS >= 8 ? 8 : left >= 4 && PV_CHUNKS >= 4 ? 4
                     : left >= 2 && PV_CHUNKS >= 2 ? 2 : 1;
        const int64_t qmax = PV_ACC / cb > 4 ? 4 : PV_ACC / cb < 1 ? 1 : PV_ACC / cb;
        for (int64_t q = 0; q < n;) {
            const int64_t qg = n - q < qmax ? n - q : qmax;
            if (cb == 8) {
                PV_QG(8)
            } else if (cb == 4) {
                PV_QG(4)
            } else if (cb == 2) {
                PV_QG(2)
            } else {
                PV_QG(1)
            }
            q += qg;
        }
        c0 += cb;
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
 * for the R*G queries, softmax with the layer's exp, then V read once per group of queries.
 * A row whose context fits one part (ctx <= ATTEND_PART; then p0 = 0) gets its normalized
 * output at out + r*ldo; a longer row gets, per query, the part's record at
 * part + r*part_row + g*part_head: [max score, sum of exp(score - max), sum of exp * V]. */
KILN_INLINE void attend_impl(
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
    const vf scale = vf_set1(md->scale);
    CacheWalk kw = walk_from(md, kc, kvh, bt, esize, p0);
    {
        CacheWalk first = kw;
        for (int64_t o = 0; o < 16 && p0 + o < end; o++) {
            walk_prefetch(&first, 0, lines);
            walk_next(&first);
        }
    }
    for (int64_t c0 = p0; c0 < end; c0 += 16) {
        /* In flight while this chunk is scored: the next chunk's K rows (V: PF_AHEAD). */
        CacheWalk ahead = kw;
        for (int64_t o = 0; o < 16 && c0 + o < end; o++) walk_next(&ahead);
        for (int64_t o = 16; o < 32 && c0 + o < end; o++) {
            walk_prefetch(&ahead, 0, lines);
            walk_next(&ahead);
        }
        const char *rows[16] = {0};
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
            for (int64_t g = 0; g < G; g++) {
                const float *qg = q + r * ldq + g * hd;
                /* 16 positions' dot products (lane o of the sums: position c0 + o); blocks of
                 * SCORE_BLOCK positions past n are not scored (their lanes are not stored) */
                vf acc[16];
                for (int o0 = 0; o0 < 16; o0 += SCORE_BLOCK) {
                    if (o0 < n) {
                        score_block(SCORE_BLOCK, F16, qg, nc, rows + o0, acc + o0);
                    } else {
                        for (int o = o0; o < o0 + SCORE_BLOCK; o++) acc[o] = vf_zero();
                    }
                }
                vf_store_n(scores + (r * G + g) * stride + c0, vf_mul(vf_hsum16(acc), scale), n);
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
            vf vmx = vf_set1(-INFINITY);
            for (int64_t p = p0; p < e; p += 16)
                vmx = vf_max(vmx, vf_select(vm_first(e - p), vf_load_n(sg + p, e - p),
                                            vf_set1(-INFINITY)));
            const float mx = vf_hmax(vmx);
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
 * (M = max_j m_j), parts in order (the layer's one-lane e^x). */
void kiln_attend_merge(const float *part, int64_t nparts, int64_t hd, float *out) {
    const int64_t rec = hd + 2;
    float top = -INFINITY;
    for (int64_t j = 0; j < nparts; j++) top = part[j * rec] > top ? part[j * rec] : top;
    float denom = 0.0f;
    for (int64_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int64_t j = 0; j < nparts; j++) {
        const float *r = part + j * rec;
        if (r[1] == 0.0f) continue;
        const float w = kiln_exp(r[0] - top);
        denom += w * r[1];
        for (int64_t i = 0; i < hd; i++) out[i] += w * r[2 + i];
    }
    const float inv = 1.0f / denom;
    for (int64_t i = 0; i < hd; i++) out[i] *= inv;
}
