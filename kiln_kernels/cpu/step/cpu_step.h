/* The records cpu_step.c and attention.c share: the model and step descriptions (mirrored by
 * ctypes structures in cpu_step.py) and the attention entry point. */
#ifndef KILN_CPU_STEP_H
#define KILN_CPU_STEP_H
#include <stdint.h>

#include "quant.h"

/* Fields of one layer in the layer table (int64 addresses; the four projections are
 * `const KilnWeight *`, quant.h). */
enum {
    F_QKV, F_O, F_GU, F_DOWN,
    F_IN_NORM, F_POST_NORM, F_Q_NORM, F_K_NORM, F_Q_BIAS, F_K_BIAS, F_V_BIAS,
    F_K_CACHE, F_V_CACHE, F_COUNT
};

typedef struct {
    int64_t layers, hidden, inter, heads, kv_heads, head_dim, vocab, block_size, fields;
    float eps, scale;
    const int64_t *table; /* [layers][F_COUNT] */
    const float *final_norm;
    const KilnWeight *head;
    int64_t kv_f16; /* the K/V caches hold IEEE half floats (else float32) */
    /* Element strides of a layer's K/V cache [blocks][block_size][kv_heads][head_dim] (head_dim
     * contiguous; any order of the other three, e.g. KV head before position in a block). */
    int64_t kv_sb, kv_sp, kv_sh;
    const KilnWeight *embed; /* the token embedding [vocab][hidden] (NULL: it comes in x) */
    const float *inv_freq;   /* [head_dim / 2]: the rotary frequencies (kiln.model.layers) */
} KilnCpuStepModel;

/* Element offset of KV head h of cache slot `slot` (= block * block_size + position). */
static inline int64_t kiln_kv_at(const KilnCpuStepModel *md, int64_t slot, int64_t h) {
    return slot / md->block_size * md->kv_sb + slot % md->block_size * md->kv_sp + h * md->kv_sh;
}

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
    const int64_t *ctx_lens;     /* [M]: positions this token attends to (its position + 1) */
    const int32_t *block_tables; /* [M][max_blocks]: the block table of the token's sequence */
    const int64_t *slots;        /* [M]: cache slot of the token */
    const int64_t *seq_first;    /* [M]: first row of the token's sequence in this step (rows
                                  * of one sequence are consecutive, positions increasing) */
    const int64_t *logit_rows;   /* [L]: rows whose logits are wanted */
    float *logits;               /* [L][vocab] */
    float *scratch;              /* kiln_cpu_step_scratch_floats(model, M, max_ctx) floats */
    const KilnLora *lora;        /* NULL: base model only */
    const int64_t *ids;          /* [M]: the rows' token ids, embedded into x here (NULL: x
                                  * holds the embeddings; md->embed needed otherwise) */
} KilnCpuStepRows;

/* Positions per attention task of a long context: a row whose context is longer is attended in
 * parts of this many positions (spread over the threads, then merged); a shorter one in one
 * pass. Fixed, so a row's numbers depend only on its own context length. */
#define ATTEND_PART 512

/* ATTEND_PART, or INT64_MAX where the attention runs in one pass (the scalar path). */
int64_t kiln_attend_part(const KilnCpuStepModel *md);

/* Softmax attention of R consecutive rows of one sequence (m0..m0+R-1) for the G query heads
 * that share KV head kvh, over positions [p0, p1): row r's queries at q + r*ldq (prepared:
 * bias, norm, rotary); a row with ctx <= ATTEND_PART gets its output at out + r*ldo (from the
 * p0 = 0 call), a longer one a record [max, sum, hd sums] per query at part + r*part_row +
 * g*part_head for kiln_attend_merge. `scores` holds R*G*max_ctx floats. (attention.c) */
void kiln_attend_seq(const KilnCpuStepModel *md, const KilnCpuStepRows *st, int64_t m0, int64_t R,
                     int64_t kvh, const float *q, int64_t ldq, int64_t G, const void *kc,
                     const void *vc, float *scores, float *out, int64_t ldo, int64_t p0,
                     int64_t p1, float *part, int64_t part_row, int64_t part_head);

/* One query's output from its nparts consecutive records of hd + 2 floats. (attention.c) */
void kiln_attend_merge(const float *part, int64_t nparts, int64_t hd, float *out);

#endif
