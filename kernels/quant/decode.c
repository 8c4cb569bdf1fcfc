/* One decode step of a llama / qwen2 / qwen3 decoder over the paged KV cache, whole, in ONE
 * OpenMP parallel region: every projection is a tiled quantized product (gemm.c), everything
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

typedef struct {
    int64_t M, max_blocks, max_ctx;
    float *x;                    /* [M][hidden]: the token embeddings in, clobbered */
    const float *cos, *sin;      /* [M][head_dim] */
    const int64_t *seq_lens;     /* [M]: context length including the new token */
    const int32_t *block_tables; /* [M][max_blocks] */
    const int64_t *slots;        /* [M]: cache slot of the new token */
    float *logits;               /* [M][vocab] */
    float *scratch;              /* kiln_decode_scratch_floats(model, M, max_ctx) floats */
} KilnDecodeStep;

int64_t kiln_decode_layout_version(void) { return F_COUNT; }

int64_t kiln_decode_scratch_floats(const KilnDecodeModel *md, int64_t M, int64_t max_ctx) {
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * md->head_dim;
    return M * (2 * md->hidden + nqkv + md->heads * md->head_dim + 3 * md->inter) +
           M * md->heads * max_ctx;
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

static int64_t slot_of(const KilnDecodeModel *md, const KilnDecodeStep *st, int64_t m,
                       int64_t pos) {
    const int32_t *bt = st->block_tables + m * st->max_blocks;
    return (int64_t)bt[pos / md->block_size] * md->block_size + pos % md->block_size;
}

/* Softmax attention of one query head over the sequence's cached context. */
static void attend(const KilnDecodeModel *md, const KilnDecodeStep *st, int64_t m,
                   const float *q, const float *kc, const float *vc, int64_t kvh, float *scores,
                   float *out) {
    const int64_t hd = md->head_dim, nkv = md->kv_heads, len = st->seq_lens[m];
    float mx = -INFINITY;
    for (int64_t p = 0; p < len; p++) {
        const float *k = kc + (slot_of(md, st, m, p) * nkv + kvh) * hd;
        scores[p] = dot(q, k, hd) * md->scale;
        if (scores[p] > mx) mx = scores[p];
    }
    float total = 0.0f;
    for (int64_t p = 0; p < len; p++) {
        scores[p] = expf(scores[p] - mx);
        total += scores[p];
    }
    for (int64_t i = 0; i < hd; i++) out[i] = 0.0f;
    for (int64_t p = 0; p < len; p++) {
        const float *v = vc + (slot_of(md, st, m, p) * nkv + kvh) * hd;
        const float w = scores[p] / total;
#pragma omp simd
        for (int64_t i = 0; i < hd; i++) out[i] += w * v[i];
    }
}

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
    /* Each query head over its context (GQA: head h reads KV head h / (nh / nkv)). */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M * nh; t++) {
        const int64_t m = t / nh, h = t % nh;
        float *q = qkv + m * nqkv + h * hd;
        prepare_head(q, qb ? qb + h * hd : 0, fptr(row, F_Q_NORM), st->cos + m * hd,
                     st->sin + m * hd, hd, md->eps);
        attend(md, st, m, q, kc, vc, h / (nh / nkv), scores + t * st->max_ctx,
               attn + m * nh * hd + h * hd);
    }
}

void kiln_decode_step(const KilnDecodeModel *md, const KilnDecodeStep *st, int nthreads) {
    const int64_t M = st->M, H = md->hidden, I = md->inter, hd = md->head_dim;
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * hd, nattn = md->heads * hd;
    float *h = st->scratch, *tmp = h + M * H, *qkv = tmp + M * H, *attn = qkv + M * nqkv;
    float *gu = attn + M * nattn, *act = gu + M * 2 * I, *scores = act + M * I;
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
            attention_block(md, st, row, qkv, attn, scores);
            kiln_gemm_tiles((int)row[F_O_Q8], attn, M, nattn, (const uint8_t *)(intptr_t)row[F_O],
                            H, tmp);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                for (int64_t i = 0; i < H; i++) x[m * H + i] += tmp[m * H + i];
                rms_norm(x + m * H, fptr(row, F_POST_NORM), h + m * H, H, md->eps);
            }
            kiln_gemm_tiles((int)row[F_GU_Q8], h, M, H, (const uint8_t *)(intptr_t)row[F_GU],
                            2 * I, gu);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < M * I; t++) {
                const int64_t m = t / I, i = t % I;
                const float g = gu[m * 2 * I + i];
                act[t] = g / (1.0f + expf(-g)) * gu[m * 2 * I + I + i];
            }
            kiln_gemm_tiles((int)row[F_DOWN_Q8], act, M, I,
                            (const uint8_t *)(intptr_t)row[F_DOWN], H, tmp);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < M * H; t++) x[t] += tmp[t];
        }
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) rms_norm(x + m * H, md->final_norm, h + m * H, H, md->eps);
        kiln_gemm_tiles((int)md->head_q8, h, M, H, md->head, md->vocab, st->logits);
    }
}
