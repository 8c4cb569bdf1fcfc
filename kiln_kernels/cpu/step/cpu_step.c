/* One forward step of a llama / qwen2 / qwen3 decoder over the paged KV cache, whole, in ONE
 * OpenMP parallel region, for M token rows (single-token decodes, or the rows of short prefill
 * chunks: a row attends to its own sequence's positions 0..pos, and every row's K/V is stored
 * before any row attends): every projection is a tiled quantized product (gemm.c), everything
 * between them (RMSNorm, q/k bias and norm, NEOX rotary, the KV store, attention over the
 * cached context (attention.c), SiLU gate, residuals, final norm, the LM head, LoRA) is done
 * here in float32.
 *
 * It computes what kiln.model's torch path computes for rows that each decode one token
 * (same weights, same order of operations; float sums may round differently), for a batch of
 * M sequences. Per-row work never mixes rows, so a sequence's result does not depend on the
 * rest of the batch. Phases are separated by the implicit barriers of `omp for`.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_step.h"
#include "quant.h"
#include "vmath.h"

int64_t kiln_cpu_step_layout_version(void) { return F_COUNT; }

/* The KV cache's element conversions (vmath.h, inline in the step), exported for their test
 * against torch's (tests/kernels/test_kernels_half.py). */
void kiln_kv_store_row(void *dst, const float *src, int64_t n, int f16) {
    kiln_store_kv(dst, src, n, f16);
}
float kiln_kv_half_value(uint16_t h) { return kiln_half_to_float(h); }

/* Attention parts per query for a step whose longest context is max_ctx. */
static int64_t attend_parts(const KilnCpuStepModel *md, int64_t max_ctx) {
    const int64_t part = kiln_attend_part(md);
    return part == INT64_MAX ? 1 : (max_ctx + part - 1) / part;
}

int64_t kiln_cpu_step_scratch_floats(const KilnCpuStepModel *md, int64_t M, int64_t max_ctx) {
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * md->head_dim;
    return M * (2 * md->hidden + nqkv + md->heads * md->head_dim + 3 * md->inter) +
           M * md->head_dim + /* the rows' rotary cos | sin */
           M * md->heads * max_ctx + M * md->hidden +
           M * md->heads * attend_parts(md, max_ctx) * (md->head_dim + 2);
}

/* Rows of one sequence (a prefill chunk) per attention task: a chunk of up to 8 rows (the
 * prefill cap while others decode) reads the cache once; longer chunks (up to 128 rows per C
 * call, kiln.model.base.C_MAX_ROWS) are spread over the threads. */
#define ROWS_PER_TASK 8

static const float *fptr(const int64_t *row, int f) { return (const float *)(intptr_t)row[f]; }
static const KilnWeight *wptr(const int64_t *row, int f) {
    return (const KilnWeight *)(intptr_t)row[f];
}

static void rms_norm(const float *x, const float *w, float *out, int64_t n, float eps) {
    const float r = 1.0f / sqrtf(kiln_dot(x, x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* A row's rotary table cs [head_dim] = cos | sin of pos * inv_freq[i], i < head_dim / 2: the
 * float32 angle the torch path forms (kiln.model.layers.RotaryEmbedding.cos_sin), its cos and
 * sin by vmath.h's kiln_cos_sin (correctly rounded but for near-midpoint values, the same bits
 * on every build) where torch takes its own vectorised ones (they may round an angle's cos or
 * sin 1 ulp apart: an elementwise rounding, within tests/numerics.py's bound between the
 * paths). */
static void rotary_table(const float *inv_freq, int64_t pos, float *cs, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) kiln_cos_sin((float)pos * inv_freq[i], cs + i, cs + half + i);
}

/* cos | sin of n float32 angles (kiln_cos_sin), for its test against torch's
 * (tests/kernels/test_isa_step.py). */
void kiln_rotary_cos_sin(const float *angle, int64_t n, float *cos_out, float *sin_out) {
    for (int64_t i = 0; i < n; i++) kiln_cos_sin(angle[i], cos_out + i, sin_out + i);
}

/* NEOX rotate_half rotary on one head vector, in place, by a row's table cs (rotary_table). */
static void rotary(float *v, const float *cs, int64_t hd) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half], c = cs[i], s = cs[half + i];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

/* Bias, per-head norm and rotary of one q or k head vector, in place. */
static void prepare_head(float *v, const float *bias, const float *norm, const float *cs,
                         int64_t hd, float eps) {
    if (bias)
        for (int64_t i = 0; i < hd; i++) v[i] += bias[i];
    if (norm) rms_norm(v, norm, v, hd, eps);
    rotary(v, cs, hd);
}

static void attention_block(const KilnCpuStepModel *md, const KilnCpuStepRows *st,
                            const int64_t *row, const float *rope, float *qkv, float *attn,
                            float *scores, float *parts) {
    const int64_t M = st->M, hd = md->head_dim, nh = md->heads, nkv = md->kv_heads;
    const int64_t nqkv = (nh + 2 * nkv) * hd, G = nh / nkv;
    char *kc = (char *)(intptr_t)row[F_K_CACHE], *vc = (char *)(intptr_t)row[F_V_CACHE];
    const int f16 = md->kv_f16 != 0;
    const int64_t esize = f16 ? 2 : 4;
    const float *kb = fptr(row, F_K_BIAS), *vb = fptr(row, F_V_BIAS), *qb = fptr(row, F_Q_BIAS);
    /* K and V of the new tokens into the cache; the G query heads of each KV head prepared. */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M * nkv; t++) {
        const int64_t m = t / nkv, h = t % nkv;
        const float *cs = rope + m * hd;
        float *k = qkv + m * nqkv + (nh + h) * hd, *v = k + nkv * hd;
        prepare_head(k, kb ? kb + h * hd : 0, fptr(row, F_K_NORM), cs, hd, md->eps);
        if (vb)
            for (int64_t i = 0; i < hd; i++) v[i] += vb[h * hd + i];
        const int64_t slot = st->slots[m];
        kiln_store_kv(kc + kiln_kv_at(md, slot, h) * esize, k, hd, f16);
        kiln_store_kv(vc + kiln_kv_at(md, slot, h) * esize, v, hd, f16);
        for (int64_t qh = h * G; qh < (h + 1) * G; qh++)
            prepare_head(qkv + m * nqkv + qh * hd, qb ? qb + qh * hd : 0, fptr(row, F_Q_NORM),
                         cs, hd, md->eps);
    }
    /* Tasks: (up to ROWS_PER_TASK rows of one sequence, KV head, part of the context); the
     * rows read each cached K/V row of the part once (GQA: head h reads KV head h / G). */
    const int64_t np = attend_parts(md, st->max_ctx), psz = kiln_attend_part(md);
    const int64_t rec = hd + 2, prow = nh * np * rec;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < M * nkv * np; t++) {
        const int64_t j = t % np, m = t / np / nkv, kvh = t / np % nkv;
        const int64_t first = st->seq_first[m];
        if ((m - first) % ROWS_PER_TASK) continue;
        int64_t R = 1;
        while (R < ROWS_PER_TASK && m + R < M && st->seq_first[m + R] == first) R++;
        kiln_attend_seq(md, st, m, R, kvh, qkv + m * nqkv + kvh * G * hd, nqkv, G, kc, vc,
                        scores + (m * nkv + kvh * R) * G * st->max_ctx,
                        attn + m * nh * hd + kvh * G * hd, nh * hd, j * psz,
                        j == np - 1 ? INT64_MAX : (j + 1) * psz,
                        parts + m * prow + (kvh * G * np + j) * rec, prow, np * rec);
    }
    if (np == 1) return;
    /* Rows longer than one part: merge their parts. */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < M * nh; t++) {
        const int64_t m = t / nh, h = t % nh, len = st->ctx_lens[m];
        if (len > psz)
            kiln_attend_merge(parts + m * prow + h * np * rec, (len + psz - 1) / psz, hd,
                              attn + m * nh * hd + h * hd);
    }
}

/* y[m][0:out] += LoRA delta of module `mod` for input rows x[m][0:in] (strides ldx, ldy). */
static void lora_apply(const KilnCpuStepRows *st, int64_t l, int mod, const float *x, int64_t ldx,
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
        const float scale = lo->scales[k * M + m];
        for (int64_t i = 0; i < R; i++)
            tv[i] = slot < 0 ? 0.0f : kiln_dot(A + (slot * R + i) * in, x + m * ldx, in) * scale;
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

/* Returns -1, or the first row whose token id is outside the embedding (0 when the step has ids
 * and the model no embedding); nothing is run then. */
int64_t kiln_cpu_step(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int nthreads) {
    const int64_t M = st->M, H = md->hidden, I = md->inter, hd = md->head_dim;
    int64_t vocab_in = 0; /* the embedding's rows */
    if (st->ids) {
        if (!md->embed) return 0;
        for (int64_t p = 0; p < md->embed->parts; p++) vocab_in += md->embed->rows[p];
        for (int64_t m = 0; m < M; m++)
            if (st->ids[m] < 0 || st->ids[m] >= vocab_in) return m;
    }
    const int64_t nqkv = (md->heads + 2 * md->kv_heads) * hd, nattn = md->heads * hd;
    float *h = st->scratch, *tmp = h + M * H, *qkv = tmp + M * H, *attn = qkv + M * nqkv;
    float *gu = attn + M * nattn, *act = gu + M * 2 * I, *scores = act + M * I;
    float *picked = scores + M * md->heads * st->max_ctx; /* [L][hidden] */
    float *parts = picked + M * H; /* [M][heads][parts][head_dim + 2] */
    float *rope = parts + M * md->heads * attend_parts(md, st->max_ctx) * (hd + 2); /* [M][hd] */
    float *x = st->x;
#pragma omp parallel num_threads(nthreads)
    {
        /* The embedding (each row's weights exactly as the products read them:
         * kiln_dequant_rows' values) and the rotary tables first, before denormals are
         * flushed. */
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            if (st->ids) kiln_weight_row(md->embed, st->ids[m], x + m * H);
            rotary_table(md->inv_freq, st->ctx_lens[m] - 1, rope + m * hd, hd);
        }
        /* Flush denormals to zero on every thread for the step (restored at its end): peaked
         * softmax weights underflow, and each denormal operand costs a microcode assist (a
         * peaked 130-position attention task measured 38 us against 2 us). Values this small
         * (< 1.2e-38) do not move any float32 result that is not itself that small; every
         * build flushes alike (isa.h). */
        const uint64_t fp_saved = kiln_fp_flush_enter();
        for (int64_t l = 0; l < md->layers; l++) {
            const int64_t *row = md->table + l * md->fields;
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                rms_norm(x + m * H, fptr(row, F_IN_NORM), h + m * H, H, md->eps);
            kiln_gemm_weight(wptr(row, F_QKV), h, M, qkv);
            const int64_t nq = md->heads * hd, nk = md->kv_heads * hd;
            lora_apply(st, l, 0, h, H, H, qkv, nqkv, nq);
            lora_apply(st, l, 1, h, H, H, qkv + nq, nqkv, nk);
            lora_apply(st, l, 2, h, H, H, qkv + nq + nk, nqkv, nk);
            attention_block(md, st, row, rope, qkv, attn, scores, parts);
            kiln_gemm_weight(wptr(row, F_O), attn, M, tmp);
            lora_apply(st, l, 3, attn, nattn, nattn, tmp, H, H);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                for (int64_t i = 0; i < H; i++) x[m * H + i] += tmp[m * H + i];
                rms_norm(x + m * H, fptr(row, F_POST_NORM), h + m * H, H, md->eps);
            }
            kiln_gemm_weight(wptr(row, F_GU), h, M, gu);
            lora_apply(st, l, 4, h, H, H, gu, 2 * I, I);
            lora_apply(st, l, 5, h, H, H, gu + I, 2 * I, I);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                kiln_silu_mul(gu + m * 2 * I, gu + m * 2 * I + I, act + m * I, I);
            kiln_gemm_weight(wptr(row, F_DOWN), act, M, tmp);
            lora_apply(st, l, 6, act, I, I, tmp, H, H);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < M * H; t++) x[t] += tmp[t];
        }
#pragma omp for schedule(static)
        for (int64_t j = 0; j < st->L; j++)
            rms_norm(x + st->logit_rows[j] * H, md->final_norm, picked + j * H, H, md->eps);
        kiln_gemm_weight(md->head, picked, st->L, st->logits);
        kiln_fp_flush_leave(fp_saved);
    }
    return -1;
}
