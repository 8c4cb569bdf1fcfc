/* One forward step of a llama / qwen2 / qwen3 decoder over the paged KV cache, whole, in ONE
 * OpenMP parallel region, for M token rows (single-token decodes, or the rows of short prefill
 * chunks: a row attends to its own sequence's positions 0..pos, and every row's K/V is stored
 * before any row attends): every projection is a tiled quantized product (gemm.c), everything
 * between them (RMSNorm, q/k bias and norm, NEOX rotary, the KV store, attention over the
 * cached context, SiLU gate, residuals, final norm, the LM head) is done here in float32.
 *
 * It computes what kiln.model's torch path computes for rows that each decode one token
 * (same weights, same order of operations; float sums may round differently), for a batch of
 * M sequences. Per-row work never mixes rows, so a sequence's result does not depend on the
 * rest of the batch. Phases are separated by the implicit barriers of `omp for`.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* Fields of one layer in the layer table (int64: addresses, format flags). */
enum {
    F_QKV, F_QKV_Q8, F_O, F_O_Q8, F_GU, F_GU_Q8, F_DOWN, F_DOWN_Q8,
    F_IN_NORM, F_POST_NORM, F_Q_NORM, F_K_NORM, F_Q_BIAS, F_K_BIAS, F_V_BIAS,
    F_K_CACHE, F_V_CACHE, F_COUNT
};

typedef struct {
    int64_t layers, hidden, inter, heads, kv_heads, head_dim, vocab, block_size, fields;
    float eps, scale;
    const int64_t *table; /* [layers][F_COUNT] */
    const float *final_norm;
    const uint8_t *head;
    int64_t head_q8;
} KilnDecodeModel;

/* LoRA for the rows of a step (kiln.model.lora_slots layout): per module (q, k, v, o, gate,
 * up, down) an A stack [layers][nslots][rank][in] and a B^T stack [layers][nslots][rank][out]
 * (NULL: no adapter targets the module); each row has up to K (slot, scale) pairs, slot -1 for
 * none. y += sum_k scale_k * B_k (A_k x). */
enum { LORA_MODULES = 7 };

typedef struct {
    int64_t K, nslots, rank;
    const int32_t *slot_idx; /* [K][M] */
    const float *scales;     /* [K][M] */
    const float *a[LORA_MODULES];
    const float *bt[LORA_MODULES];
    float *t; /* scratch [M][K][rank] */
} KilnLora;

typedef struct {
    int64_t M, max_blocks, max_ctx, L;
    float *x;                    /* [M][hidden]: the token embeddings in, clobbered */
    const float *cos, *sin;      /* [M][head_dim] */
    const int64_t *ctx_lens;     /* [M]: positions this token attends to (its position + 1) */
    const int32_t *block_tables; /* [M][max_blocks]: the block table of the token's sequence */
    const int64_t *slots;        /* [M]: cache slot of the token */
    const int64_t *seq_first;    /* [M]: first row of the token's sequence in this step (rows
                                  * of one sequence are consecutive, positions increasing) */
    const int64_t *logit_rows;   /* [L]: rows whose logits are wanted */
    float *logits;               /* [L][vocab] */
    float *scratch;              /* kiln_decode_scratch_floats(model, M, max_ctx) floats */
    const KilnLora *lora;        /* NULL: base model only */
} KilnDecodeStep;

int64_t kiln_decode_layout_version(void) { return F_COUNT; }

int64_t kiln_decode_scratch_floats(const KilnDecodeModel *md, int64_t M, int64_t max_ctx) {
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * md->head_dim;
    return M * (2 * md->hidden + nqkv + md->heads * md->head_dim + 3 * md->inter) +
           M * md->heads * max_ctx + M * md->hidden;
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* e^x for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by a degree-6 polynomial, times 2^n
 * (scalef). Relative error ~2e-7 over the softmax range (x <= 0); -inf gives 0. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif

/* scores[p] = exp(scores[p] - top) for p < len; returns their sum. */
static float exp_shift_sum(float *scores, int64_t len, float top) {
    int64_t p = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    const __m512 vt = _mm512_set1_ps(top);
    for (; p + 16 <= len; p += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + p), vt));
        _mm512_storeu_ps(scores + p, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (p < len) {
        const __mmask16 k = (__mmask16)((1u << (len - p)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, scores + p), vt));
        _mm512_mask_storeu_ps(scores + p, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
        p = len;
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; p < len; p++) {
        scores[p] = expf(scores[p] - top);
        sum += scores[p];
    }
    return sum;
}

static const float *fptr(const int64_t *row, int f) { return (const float *)(intptr_t)row[f]; }

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void rms_norm(const float *x, const float *w, float *out, int64_t n, float eps) {
    const float r = 1.0f / sqrtf(dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* NEOX rotate_half rotary on one head vector, in place. */
static void rotary(float *v, const float *cos, const float *sin, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* Bias, per-head norm and rotary of one q or k head vector, in place. */
static void prepare_head(float *v, const float *bias, const float *norm, const float *cos,
                         const float *sin, int64_t hd, float eps) {
    if (bias)
        for (int64_t i = 0; i < hd; i++) v[i] += bias[i];
    if (norm) rms_norm(v, norm, v, hd, eps);
    rotary(v, cos, sin, hd);
}

/* Softmax attention of the G query heads that share KV head `kvh` over positions
 * 0..ctx_lens[m]-1 of row m's sequence: each cached K/V row is read once for the group. */
static void attend_group_scalar(const KilnDecodeModel *md, const KilnDecodeStep *st, int64_t m,
                                int64_t kvh, const float *q, int64_t G, const float *kc,
                                const float *vc, float *scores, float *out) {
    const int64_t hd = md->head_dim, nkv = md->kv_heads, bs = md->block_size;
    const int64_t len = st->ctx_lens[m], stride = st->max_ctx;
    const int32_t *bt = st->block_tables + m * st->max_blocks;
    float mx[16], total[16];
    for (int64_t g = 0; g < G; g++) mx[g] = -INFINITY, total[g] = 0.0f;
    for (int64_t p0 = 0, b = 0; p0 < len; p0 += bs, b++) {
        const int64_t n = (len - p0 < bs) ? len - p0 : bs, base = (int64_t)bt[b] * bs;
        for (int64_t o = 0; o < n; o++) {
            const float *k = kc + ((base + o) * nkv + kvh) * hd;
            for (int64_t g = 0; g < G; g++) {
                const float sc = dot(q + g * hd, k, hd) * md->scale;
                scores[g * stride + p0 + o] = sc;
                if (sc > mx[g]) mx[g] = sc;
            }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *sg = scores + g * stride;
        const float sum = exp_shift_sum(sg, len, mx[g]);
#pragma omp simd
        for (int64_t p = 0; p < len; p++) sg[p] /= sum;
        total[g] = sum;
        for (int64_t i = 0; i < hd; i++) out[g * hd + i] = 0.0f;
    }
    for (int64_t p0 = 0, b = 0; p0 < len; p0 += bs, b++) {
        const int64_t n = (len - p0 < bs) ? len - p0 : bs, base = (int64_t)bt[b] * bs;
        for (int64_t o = 0; o < n; o++) {
            const float *v = vc + ((base + o) * nkv + kvh) * hd;
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

/* Attention of R consecutive rows of one sequence (query heads kvh*G.. of each; row r's
 * queries at q + r*ldq, outputs at out + r*ldo), for head_dim a multiple of 16 (<= 256):
 * scores 16 positions at a time with one reduction tree, each cached K row read once for the
 * R*G queries, softmax with exp16, V accumulated in registers per query. */
static void attend_seq(const KilnDecodeModel *md, const KilnDecodeStep *st, int64_t m0,
                       int64_t R, int64_t kvh, const float *q, int64_t ldq, int64_t G,
                       const float *kc, const float *vc, float *scores, float *out,
                       int64_t ldo) {
    const int64_t hd = md->head_dim, nkv = md->kv_heads, bs = md->block_size;
    const int64_t stride = st->max_ctx, nc = hd / 16;
    if (hd % 16 || hd > 256) {
        for (int64_t r = 0; r < R; r++)
            attend_group_scalar(md, st, m0 + r, kvh, q + r * ldq, G, kc, vc,
                                scores + r * G * stride, out + r * ldo);
        return;
    }
    const int32_t *bt = st->block_tables + m0 * st->max_blocks;
    int64_t longest = 0;
    for (int64_t r = 0; r < R; r++)
        longest = st->ctx_lens[m0 + r] > longest ? st->ctx_lens[m0 + r] : longest;
    const __m512 scale = _mm512_set1_ps(md->scale);
    for (int64_t p0 = 0; p0 < longest; p0 += 16) {
        const float *rows[16];
        for (int64_t o = 0; o < 16; o++) {
            const int64_t p = p0 + o < longest ? p0 + o : p0;
            rows[o] = kc + (((int64_t)bt[p / bs] * bs + p % bs) * nkv + kvh) * hd;
        }
        for (int64_t r = 0; r < R; r++) {
            const int64_t len = st->ctx_lens[m0 + r];
            if (p0 >= len) continue;
            const int64_t n = (len - p0 < 16) ? len - p0 : 16;
            const __mmask16 k = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            for (int64_t g = 0; g < G; g++) {
                const float *qg = q + r * ldq + g * hd;
                __m512 acc[16];
                for (int o = 0; o < 16; o++) {
                    __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qg), _mm512_loadu_ps(rows[o]));
                    for (int64_t c = 1; c < nc; c++)
                        a = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16 * c),
                                            _mm512_loadu_ps(rows[o] + 16 * c), a);
                    acc[o] = a;
                }
                _mm512_mask_storeu_ps(scores + (r * G + g) * stride + p0, k,
                                      _mm512_mul_ps(hsum16(acc), scale));
            }
        }
    }
    for (int64_t r = 0; r < R; r++) {
        const int64_t len = st->ctx_lens[m0 + r];
        for (int64_t g = 0; g < G; g++) {
            float *sg = scores + (r * G + g) * stride;
            float mx = -INFINITY;
            for (int64_t p = 0; p < len; p++) mx = sg[p] > mx ? sg[p] : mx;
            const float inv = 1.0f / exp_shift_sum(sg, len, mx);
            __m512 acc[16];
            for (int64_t c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
            for (int64_t p = 0; p < len; p++) {
                const float *v = vc + (((int64_t)bt[p / bs] * bs + p % bs) * nkv + kvh) * hd;
                const __m512 w = _mm512_set1_ps(sg[p] * inv);
                for (int64_t c = 0; c < nc; c++)
                    acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + 16 * c), acc[c]);
            }
            for (int64_t c = 0; c < nc; c++)
                _mm512_storeu_ps(out + r * ldo + g * hd + 16 * c, acc[c]);
        }
    }
}
#else
static void attend_seq(const KilnDecodeModel *md, const KilnDecodeStep *st, int64_t m0,
                       int64_t R, int64_t kvh, const float *q, int64_t ldq, int64_t G,
                       const float *kc, const float *vc, float *scores, float *out,
                       int64_t ldo) {
    for (int64_t r = 0; r < R; r++)
        attend_group_scalar(md, st, m0 + r, kvh, q + r * ldq, G, kc, vc,
                            scores + r * G * st->max_ctx, out + r * ldo);
}
#endif

static void attention_block(const KilnDecodeModel *md, const KilnDecodeStep *st,
                            const int64_t *row, float *qkv, float *attn, float *scores) {
    const int64_t M = st->M, hd = md->head_dim, nh = md->heads, nkv = md->kv_heads;
    const int64_t nqkv = (nh + 2 * nkv) * hd;
    float *kc = (float *)(intptr_t)row[F_K_CACHE], *vc = (float *)(intptr_t)row[F_V_CACHE];
    const float *kb = fptr(row, F_K_BIAS), *vb = fptr(row, F_V_BIAS), *qb = fptr(row, F_Q_BIAS);
    /* K and V of the new tokens into the cache. */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M * nkv; t++) {
        const int64_t m = t / nkv, h = t % nkv;
        float *k = qkv + m * nqkv + (nh + h) * hd, *v = k + nkv * hd;
        prepare_head(k, kb ? kb + h * hd : 0, fptr(row, F_K_NORM), st->cos + m * hd,
                     st->sin + m * hd, hd, md->eps);
        if (vb)
            for (int64_t i = 0; i < hd; i++) v[i] += vb[h * hd + i];
        const int64_t slot = st->slots[m];
        memcpy(kc + (slot * nkv + h) * hd, k, (size_t)hd * sizeof(float));
        memcpy(vc + (slot * nkv + h) * hd, v, (size_t)hd * sizeof(float));
    }
    /* Query heads by (sequence, KV head): the rows of one sequence read its cache once
     * (GQA: head h reads KV head h / (nh / nkv)). */
    const int64_t G = nh / nkv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < M * nkv; t++) {
        const int64_t m = t / nkv, kvh = t % nkv;
        if (st->seq_first[m] != m) continue;
        int64_t R = 1;
        while (m + R < M && st->seq_first[m + R] == m) R++;
        for (int64_t r = m; r < m + R; r++)
            for (int64_t g = 0; g < G; g++) {
                const int64_t h = kvh * G + g;
                prepare_head(qkv + r * nqkv + h * hd, qb ? qb + h * hd : 0,
                             fptr(row, F_Q_NORM), st->cos + r * hd, st->sin + r * hd, hd,
                             md->eps);
            }
        attend_seq(md, st, m, R, kvh, qkv + m * nqkv + kvh * G * hd, nqkv, G, kc, vc,
                   scores + (m * nkv + kvh * R) * G * st->max_ctx,
                   attn + m * nh * hd + kvh * G * hd, nh * hd);
    }
}

/* y[m][0:out] += LoRA delta of module `mod` for input rows x[m][0:in] (strides ldx, ldy). */
static void lora_apply(const KilnDecodeStep *st, int64_t l, int mod, const float *x, int64_t ldx,
                       int64_t in, float *y, int64_t ldy, int64_t out) {
    const KilnLora *lo = st->lora;
    if (!lo || !lo->a[mod]) return; /* the same answer on every thread: barriers stay paired */
    const int64_t M = st->M, K = lo->K, R = lo->rank, S = lo->nslots;
    const float *A = lo->a[mod] + l * S * R * in, *Bt = lo->bt[mod] + l * S * R * out;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M * K; t++) {
        const int64_t m = t / K, k = t % K;
        const int32_t slot = lo->slot_idx[k * M + m];
        float *tv = lo->t + t * R;
        for (int64_t i = 0; i < R; i++)
            tv[i] = slot < 0 ? 0.0f
                             : dot(A + (slot * R + i) * in, x + m * ldx, in) * lo->scales[k * M + m];
    }
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k++) {
            const int32_t slot = lo->slot_idx[k * M + m];
            if (slot < 0) continue;
            const float *tv = lo->t + (m * K + k) * R;
            float *ym = y + m * ldy;
            for (int64_t i = 0; i < R; i++) {
                const float c = tv[i], *b = Bt + (slot * R + i) * out;
#pragma omp simd
                for (int64_t o = 0; o < out; o++) ym[o] += c * b[o];
            }
        }
}

void kiln_decode_step(const KilnDecodeModel *md, const KilnDecodeStep *st, int nthreads) {
    const int64_t M = st->M, H = md->hidden, I = md->inter, hd = md->head_dim;
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * hd, nattn = md->heads * hd;
    float *h = st->scratch, *tmp = h + M * H, *qkv = tmp + M * H, *attn = qkv + M * nqkv;
    float *gu = attn + M * nattn, *act = gu + M * 2 * I, *scores = act + M * I;
    float *picked = scores + M * md->heads * st->max_ctx; /* [L][hidden] */
    float *x = st->x;
#pragma omp parallel num_threads(nthreads)
    {
        for (int64_t l = 0; l < md->layers; l++) {
            const int64_t *row = md->table + l * md->fields;
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                rms_norm(x + m * H, fptr(row, F_IN_NORM), h + m * H, H, md->eps);
            kiln_gemm_tiles((int)row[F_QKV_Q8], h, M, H, (const uint8_t *)(intptr_t)row[F_QKV],
                            nqkv, qkv);
            const int64_t nq = md->heads * hd, nk = md->kv_heads * hd;
            lora_apply(st, l, 0, h, H, H, qkv, nqkv, nq);
            lora_apply(st, l, 1, h, H, H, qkv + nq, nqkv, nk);
            lora_apply(st, l, 2, h, H, H, qkv + nq + nk, nqkv, nk);
            attention_block(md, st, row, qkv, attn, scores);
            kiln_gemm_tiles((int)row[F_O_Q8], attn, M, nattn, (const uint8_t *)(intptr_t)row[F_O],
                            H, tmp);
            lora_apply(st, l, 3, attn, nattn, nattn, tmp, H, H);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                for (int64_t i = 0; i < H; i++) x[m * H + i] += tmp[m * H + i];
                rms_norm(x + m * H, fptr(row, F_POST_NORM), h + m * H, H, md->eps);
            }
            kiln_gemm_tiles((int)row[F_GU_Q8], h, M, H, (const uint8_t *)(intptr_t)row[F_GU],
                            2 * I, gu);
            lora_apply(st, l, 4, h, H, H, gu, 2 * I, I);
            lora_apply(st, l, 5, h, H, H, gu + I, 2 * I, I);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < M * I; t++) {
                const int64_t m = t / I, i = t % I;
                const float g = gu[m * 2 * I + i];
                act[t] = g / (1.0f + expf(-g)) * gu[m * 2 * I + I + i];
            }
            kiln_gemm_tiles((int)row[F_DOWN_Q8], act, M, I,
                            (const uint8_t *)(intptr_t)row[F_DOWN], H, tmp);
            lora_apply(st, l, 6, act, I, I, tmp, H, H);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < M * H; t++) x[t] += tmp[t];
        }
#pragma omp for schedule(static)
        for (int64_t j = 0; j < st->L; j++)
            rms_norm(x + st->logit_rows[j] * H, md->final_norm, picked + j * H, H, md->eps);
        kiln_gemm_tiles((int)md->head_q8, picked, st->L, H, md->head, md->vocab, st->logits);
    }
}
