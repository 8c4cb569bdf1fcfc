/* Shared declarations of the CPU quantized kernels (gemm.c, cpu_step.c): the weight formats, the
 * tiled layout, a weight made of row-wise parts, and the products. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H
#include <stdint.h>

/* Weight formats (kiln_kernels.quant.formats mirrors these ids). Every format is tiled 4 rows at
 * a time: tile g holds rows 4g..4g+3, block by block along k (QK weights a block), so one
 * sequential stream feeds four outputs.
 *   KF_Q4, KF_Q8: GGML Q4_0/Q4_1 and Q8_0 with their fp16 scales widened to float32 (gemm.c);
 *   every other format keeps the file's blocks as they are: a tile block is the 4 rows' GGML
 *   blocks one after another (KF_Q5_0 ... KF_IQ4_XS; blocks_legacy.h, blocks_k.h,
 *   blocks_float.h, blocks_iq.h). */
enum {
    KF_Q4 = 0, KF_Q8 = 1, KF_Q5_0 = 2, KF_Q5_1 = 3, KF_Q4_K = 4, KF_Q5_K = 5, KF_Q6_K = 6,
    KF_F16 = 7, KF_BF16 = 8, KF_F32 = 9, KF_Q2_K = 10, KF_Q3_K = 11, KF_IQ4_NL = 12,
    KF_IQ4_XS = 13, KF_COUNT = 14
};

/* A weight [N][K] as up to KILN_MAX_PARTS row-wise parts, each in its own format (a fused
 * q/k/v or gate/up projection whose parts the file stores in different types). */
#define KILN_MAX_PARTS 4
typedef struct {
    int64_t parts, K;
    int64_t fmt[KILN_MAX_PARTS];
    int64_t rows[KILN_MAX_PARTS]; /* multiples of 4 */
    const uint8_t *data[KILN_MAX_PARTS];
} KilnWeight;

/* y[M][N] = x[M][K] @ w.T for a tiled weight of format fmt. Contains an orphaned `omp for`:
 * call it from every thread of a parallel region (or outside one). */
void kiln_gemm_tiles(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y);

/* The same for a weight of parts (y [M][sum of rows]): one `omp for` over all their tiles. */
void kiln_gemm_weight(const KilnWeight *w, const float *x, int64_t M, float *y);

/* Row `id` of a weight of parts as float32 out [K]: the values the products use (an embedding
 * lookup on the blocks); `id` must be inside [0, sum of rows). */
void kiln_weight_row(const KilnWeight *w, int64_t id, float *out);

#endif
