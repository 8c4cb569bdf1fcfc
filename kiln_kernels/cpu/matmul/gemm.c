/* Block-quantized weight x float32 activation products for small batches on the CPU.
 *
 * y[m][n] = sum_k x[m][k] * w[n][k], where w is stored in blocks along k (32 weights, or 256
 * for the K-quants) and each 32 weights are dequantized in registers exactly as gguf-py
 * dequantizes them, so the weights are bit-identical to the float32 tensors the model holds
 * (the formats and their arithmetic: quant.h, blocks*.h).
 *
 * Layout: rows in tiles of 4 (N is a multiple of 4), tile g holding rows 4g..4g+3, block by
 * block, so one sequential stream feeds four outputs.
 *
 * Every (m, n) output is accumulated in the same order whatever M is and however tiles are split
 * across threads (one vector accumulator: acc += w[0:16] * x[0:16], then acc += w[16:32] *
 * x[16:32], block by block, then one fixed reduction tree, isa.h's vf_hsum4), so a row's result
 * never depends on the rest of the batch, the blocking or the ISA build (common/isa.h: one
 * algorithm on every build, the same bits).
 * Register blocking (block_pass): up to 8 activation rows x 2 or 4 tile rows per pass (9-12
 * rows: 6 x 4, then the rest x 4), so every dequantized weight vector feeds up to 8 FMAs from
 * registers (measured here, 8 rows in L2: 4.0
 * zmm FMA/ns per core against 3.1 for the previous one-buffer scheme; peak 7.2). From 32 rows
 * (tile_panel) a tile is dequantized once into an L1 panel and 6 rows at a time run against it,
 * in the same per-output order (all of the model's products: 64 rows 84.4 -> 73.7 ms, 512 rows
 * 1,074 -> 800 ms; 16 rows was slower, so the panel starts at 32).
 * Threads: OpenMP over tiles (the process's runtime: torch's, loaded before this library).
 */
#include <stdint.h>
#include <stdlib.h>

#include "blocks.h"

#define PREFETCH 3072 /* bytes ahead in the tile stream (measured: 2-4 KiB is best here) */

/* The FMAs of one 32-weight block for an (MR x RR) register block: acc[i][r] = lo[r] * x0_i +
 * acc, then hi[r] * x1_i + that; x0_i, x1_i = x[i][k..k+16), x[i][k+16..k+32). The order of each
 * output's operations is fixed; only the order in which the outputs are visited depends on the
 * register file: with 32 vf (AVX-512) all rows' weights are unpacked first and each x vector is
 * loaded once for RR FMAs (today's scheme); with 8 vf (AVX2's 16 ymm, NEON, plain) a weight row
 * is unpacked and used at once (its lo and hi take 2 vf, the x vectors come from memory), so
 * the accumulators can have the rest. UNPACK(r, lo, hi) writes row r's weights. */
#if KILN_VREGS >= 32
#define KILN_ROWS_FIRST 0
#else
#define KILN_ROWS_FIRST 1
#endif

#define FMA_BLOCK(MR, RR, xb, K, k, acc, UNPACK)                                              \
    do {                                                                                      \
        if (KILN_ROWS_FIRST) {                                                                \
            _Pragma("GCC unroll 4") for (int r = 0; r < (RR); r++) {                          \
                vf lo_, hi_;                                                                  \
                UNPACK(r, lo_, hi_);                                                          \
                _Pragma("GCC unroll 8") for (int i = 0; i < (MR); i++)                        \
                    acc[i][r] = vf_fma(lo_, vf_load((xb) + i * (K) + (k)), acc[i][r]);        \
                _Pragma("GCC unroll 8") for (int i = 0; i < (MR); i++)                        \
                    acc[i][r] = vf_fma(hi_, vf_load((xb) + i * (K) + (k) + 16), acc[i][r]);   \
            }                                                                                 \
        } else {                                                                              \
            vf lo_[4], hi_[4];                                                                \
            _Pragma("GCC unroll 4") for (int r = 0; r < (RR); r++) UNPACK(r, lo_[r], hi_[r]); \
            _Pragma("GCC unroll 8") for (int i = 0; i < (MR); i++) {                          \
                const vf x0 = vf_load((xb) + i * (K) + (k));                                  \
                _Pragma("GCC unroll 4") for (int r = 0; r < (RR); r++)                        \
                    acc[i][r] = vf_fma(lo_[r], x0, acc[i][r]);                                \
            }                                                                                 \
            _Pragma("GCC unroll 8") for (int i = 0; i < (MR); i++) {                          \
                const vf x1 = vf_load((xb) + i * (K) + (k) + 16);                             \
                _Pragma("GCC unroll 4") for (int r = 0; r < (RR); r++)                        \
                    acc[i][r] = vf_fma(hi_[r], x1, acc[i][r]);                                \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* The MR x RR outputs' sums (vf_hsum4: each the same tree whatever its neighbours) to
 * y[(m0 + i) * N + n0 + r0 + r]. */
static inline __attribute__((always_inline)) void store_sums(int MR, int RR, vf (*acc)[4],
                                                            float *y, int64_t N, int64_t m0,
                                                            int64_t n0) {
    if (RR == 4) {
        for (int i = 0; i < MR; i++)
            vf_hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], y + (m0 + i) * N + n0);
        return;
    }
    float out[32];
    const vf z = vf_zero();
#pragma GCC unroll 8
    for (int t = 0; t < MR * RR; t += 4) {
        vf v[4];
        for (int u = 0; u < 4; u++)
            v[u] = t + u < MR * RR ? acc[(t + u) / RR][(t + u) % RR] : z;
        vf_hsum4(v[0], v[1], v[2], v[3], out + t);
    }
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < RR; r++) y[(m0 + i) * N + n0 + r] = out[i * RR + r];
}

/* A (MR x RR) register block: activation rows [m0, m0 + MR) against tile rows [r0, r0 + RR),
 * over all K. Every output (m, n) is one accumulator: acc += lo * x[0:16]; acc += hi * x[16:32],
 * 32 weights at a time, then one reduction, whatever MR/RR/M are. */
static inline __attribute__((always_inline)) void block_pass(
        int fmt, int MR, int RR, const float *x, int64_t K, int64_t m0, int r0,
        const uint8_t *tile, float *y, int64_t N, int64_t n0) {
    vf acc[8][4];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < RR; r++) acc[i][r] = vf_zero();
    const int64_t subs = kf_qk(fmt) / 32, tb = kf_tile(fmt), per32 = tb / subs;
    const float *xb = x + m0 * K;
    float s[4][32]; /* kf_prep: each row's float scales of the (super-)block */
    for (int64_t sb = 0; sb < K / (32 * subs); sb++) {
        const uint8_t *blk = tile + sb * tb;
        kf_prep(fmt, blk, r0, RR, s);
#pragma GCC unroll 8
        for (int j = 0; j < subs; j++) { /* unrolled: the sub-block's offsets are constants */
            const int64_t b = sb * subs + j;
            for (int64_t o = 0; o < per32; o += 64) kiln_prefetch(tile + b * per32 + PREFETCH + o);
#define UNPACK_TILE(r, lo, hi) kf_unpack(fmt, blk, r0 + (r), j, s[r], &(lo), &(hi))
            FMA_BLOCK(MR, RR, xb, K, b * 32, acc, UNPACK_TILE);
#undef UNPACK_TILE
        }
    }
    store_sums(MR, RR, acc, y, N, m0, n0 + r0);
}

#define PASS(MR, RR)                                                                        \
    for (int r0 = 0; r0 < 4; r0 += RR)                                                      \
        block_pass(fmt, MR, RR, x, K, m0, r0, tile, y, N, n0)

/* Many rows (M >= PANEL_MIN): the tile's 4 weight rows are dequantized once into an L1 panel
 * (the same values kf_unpack gives), then PANEL_MR rows (x PANEL_RR weight rows) at a time run
 * against it with every output's operations in block_pass's order (lo then hi FMA per block,
 * then vf_hsum4), so each output has the same bits as on the register-blocked path: a row never
 * depends on M. */
#define PANEL_MIN 32
#if KILN_VREGS >= 32
#define PANEL_MR 6
#define PANEL_RR 4
#else
#define PANEL_MR 4
#define PANEL_RR 1
#endif

static float *panel_buffer(int64_t floats) {
    static __thread float *buf;
    static __thread int64_t cap;
    if (cap < floats) {
        free(buf);
        buf = aligned_alloc(64, (size_t)((floats * 4 + 63) / 64 * 64));
        cap = buf ? floats : 0;
    }
    return buf;
}

static inline __attribute__((always_inline)) void panel_pass(int MR, int RR, const float *x,
                                                            int64_t K, int64_t m0, int r0,
                                                            const float *panel, float *y,
                                                            int64_t N, int64_t n0) {
    vf acc[PANEL_MR][4];
    for (int i = 0; i < MR; i++)
        for (int r = 0; r < RR; r++) acc[i][r] = vf_zero();
    const float *xb = x + m0 * K;
    for (int64_t k = 0; k < K; k += 32) {
#define UNPACK_PANEL(r, lo, hi)                                                               \
        ((lo) = vf_load(panel + (r0 + (r)) * K + k), (hi) = vf_load(panel + (r0 + (r)) * K + k + 16))
        FMA_BLOCK(MR, RR, xb, K, k, acc, UNPACK_PANEL);
#undef UNPACK_PANEL
    }
    store_sums(MR, RR, acc, y, N, m0, n0 + r0);
}

/* Returns 0 when no panel could be allocated (the caller then takes the register path). */
static inline __attribute__((always_inline)) int tile_panel(int fmt, const float *x, int64_t M,
                                                           int64_t K, const uint8_t *tile,
                                                           float *y, int64_t N, int64_t n0) {
    float *panel = panel_buffer(4 * K);
    if (!panel) return 0;
    const int64_t subs = kf_qk(fmt) / 32, tb = kf_tile(fmt);
    float s[4][32];
    for (int64_t b = 0; b < K / 32; b++)
        for (int r = 0; r < 4; r++) {
            vf lo, hi;
            if (b % subs == 0 && r == 0) kf_prep(fmt, tile + (b / subs) * tb, 0, 4, s);
            kf_unpack(fmt, tile + (b / subs) * tb, r, (int)(b % subs), s[r], &lo, &hi);
            vf_store(panel + r * K + 32 * b, lo);
            vf_store(panel + r * K + 32 * b + 16, hi);
        }
    /* Rows outer, weight rows inner: a pass's PANEL_MR rows of x stay in L1 for the tile's
     * 4 / PANEL_RR passes (rows inner streamed all of the part's x from L2 once per pass: the
     * 8-vf builds' (4, 1) passes were bound by it; AVX2, the default model's layer products at
     * M = 85-128: 1.24-1.35x faster). Each output is still one pass's: the same bits. */
    for (int64_t m0 = 0; m0 < M; m0 += PANEL_MR)
        for (int r0 = 0; r0 < 4; r0 += PANEL_RR) {
            switch (M - m0 >= PANEL_MR ? PANEL_MR : M - m0) {
#if PANEL_MR > 4
            case 6: panel_pass(6, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
            case 5: panel_pass(5, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
#endif
            case 4: panel_pass(4, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
            case 3: panel_pass(3, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
            case 2: panel_pass(2, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
            default: panel_pass(1, PANEL_RR, x, K, m0, r0, panel, y, N, n0); break;
            }
        }
    return 1;
}

#if KILN_VREGS >= 32
/* 32 vf (AVX-512): up to 8 activation rows x 2 or 4 tile rows per pass. */
static inline __attribute__((always_inline)) void tile_all(int fmt, const float *x, int64_t M,
                                                          int64_t K, const uint8_t *tile,
                                                          float *y, int64_t N, int64_t n0) {
    if (M >= PANEL_MIN && tile_panel(fmt, x, M, K, tile, y, N, n0)) return;
    int64_t m0 = 0;
    if (M > 8 && M <= 12) {
        /* 9-12 rows: (6, 4) and then (3-6, 4) against (8, 2) and then (1-4, x) (both
         * dequantize each weight row twice): all of the model's products 0.84-0.97x. */
        PASS(6, 4);
        m0 = 6;
    } else {
        for (; m0 + 8 <= M; m0 += 8) PASS(8, 2);
    }
    switch (M - m0) {
    case 7: PASS(7, 2); break;
    case 6: PASS(6, 4); break; /* (6, 4) / (5, 4): each weight row dequantized once per tile */
    case 5: PASS(5, 4); break; /* (5 and 6 rows against (x, 2) passes: 0.86 / 0.90 the step) */
    case 4: PASS(4, 4); break;
    case 3: PASS(3, 4); break;
    case 2: PASS(2, 4); break;
    case 1: PASS(1, 4); break;
    default: break;
    }
}
#else
/* 8 vf (AVX2's 16 ymm, NEON's 32 q, plain): 4 accumulators (8 ymm) a pass, a weight row
 * unpacked and used at once (KILN_ROWS_FIRST). Measured on AVX2 (bench_formats' matrix, one
 * thread, alternated): 8 rows as (4, 1) x 2 against (2, 2) x 4 (1.1-1.6x slower), (8, 1) (spills,
 * 0.96-1.2x), (6, 1) + (2, 2) and (5, 1) + (3, 1) (within noise, 0.95-1.1x); one row
 * rows-first against all 4 rows unpacked first: 0.20 against 0.24 ms (Q4_0). */
static inline __attribute__((always_inline)) void tile_all(int fmt, const float *x, int64_t M,
                                                          int64_t K, const uint8_t *tile,
                                                          float *y, int64_t N, int64_t n0) {
    if (M >= PANEL_MIN && tile_panel(fmt, x, M, K, tile, y, N, n0)) return;
    int64_t m0 = 0;
    for (; m0 + 4 <= M; m0 += 4) PASS(4, 1);
    switch (M - m0) {
    case 3: PASS(3, 1); break;
    case 2: PASS(2, 2); break;
    case 1: PASS(1, 4); break;
    default: break;
    }
}
#endif

/* The width of the ISA layer's registers in bits (512 AVX-512, 256 AVX2, 128 NEON, 0 plain C). */
int kiln_quant_simd(void) { return KILN_ISA_BITS; }

/* The ISA layer's build (common/isa.h): "avx512", "avx2", "neon" or "plain". */
const char *kiln_isa_name(void) { return KILN_ISA_NAME; }

/* Row id of tiled weights w ([N/4][K/qk][tile]) as float32 out [K]: the values the products
 * use. */
static void tiled_row(int fmt, const uint8_t *w, int64_t K, int64_t id, float *out) {
    const int64_t qk = kf_qk(fmt), tb = kf_tile(fmt), nb = K / qk, g = id / 4;
    const int r = (int)(id % 4);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (g * nb + b) * tb;
        for (int e = 0; e < qk; e++) out[qk * b + e] = kf_weight(fmt, blk, r, e);
    }
}

/* Rows ids[0..n) of tiled weights w ([N/4][K/qk][tile]) as float32 out [n][K]. Returns the
 * first index of an id outside [0, N), or -1 when all are inside (nothing is written past a bad
 * id). */
int64_t kiln_dequant_rows(int fmt, const uint8_t *w, int64_t N, int64_t K, const int64_t *ids,
                          int64_t n, float *out) {
    for (int64_t t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= N) return t;
        tiled_row(fmt, w, K, ids[t], out + t * K);
    }
    return -1;
}

void kiln_weight_row(const KilnWeight *w, int64_t id, float *out) {
    int64_t p = 0;
    while (id >= w->rows[p]) id -= w->rows[p++];
    tiled_row((int)w->fmt[p], w->data[p], w->K, id, out);
}

/* One tile of any format (each case its own specialization of the passes). */
static void tile_any(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *tile,
                     float *y, int64_t N, int64_t n0) {
    switch (fmt) {
#define CASE(F) case F: tile_all(F, x, M, K, tile, y, N, n0); break;
    CASE(KF_Q4) CASE(KF_Q8) CASE(KF_Q5_0) CASE(KF_Q5_1) CASE(KF_Q4_K) CASE(KF_Q5_K)
    CASE(KF_Q6_K) CASE(KF_F16) CASE(KF_BF16) CASE(KF_F32) CASE(KF_Q2_K)
    CASE(KF_Q3_K) CASE(KF_IQ4_NL) CASE(KF_IQ4_XS)
#undef CASE
    default: break;
    }
}

/* x float32 [M][K], w tiles [N/4][K/qk][tile], y float32 [M][N]. */
/* Many rows (a prefill) are taken ROWS_L2_BYTES of x at a time, every tile against those rows
 * before the next ones: each tile's passes stream its rows of x (once per weight row on 8-vf
 * builds), which then come from L2 rather than L3 or memory (the whole of x is megabytes at a
 * 512-token chunk). A row's outputs do not change: each output's operations are the same
 * whichever rows share its pass (the panel and register paths give the same bits), and a last
 * part under PANEL_MIN rows joins the one before it. */
#define ROWS_L2_BYTES (192 * 1024)

static int64_t rows_per_part(int64_t M, int64_t K) {
    int64_t rows = ROWS_L2_BYTES / (4 * K);
    if (rows < 2 * PANEL_MIN) rows = 2 * PANEL_MIN;
    return M < rows + PANEL_MIN ? M : rows;
}

void kiln_gemm_tiles(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y) {
    const int64_t stride = (K / kf_qk(fmt)) * kf_tile(fmt);
    for (int64_t m0 = 0; m0 < M;) {
        const int64_t rows = rows_per_part(M - m0, K);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < N / 4; g++)
            tile_any(fmt, x + m0 * K, rows, K, w + g * stride, y + m0 * N, N, 4 * g);
        m0 += rows;
    }
}

void kiln_gemm_weight(const KilnWeight *w, const float *x, int64_t M, float *y) {
    int64_t N = 0;
    for (int64_t p = 0; p < w->parts; p++) N += w->rows[p];
    for (int64_t m0 = 0; m0 < M;) { /* rows a part at a time, as kiln_gemm_tiles */
        const int64_t rows = rows_per_part(M - m0, w->K);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < N / 4; g++) {
            int64_t p = 0, first = 0; /* the part holding tile g, and its first tile */
            while (g - first >= w->rows[p] / 4) first += w->rows[p++] / 4;
            const int fmt = (int)w->fmt[p];
            const int64_t stride = (w->K / kf_qk(fmt)) * kf_tile(fmt);
            tile_any(fmt, x + m0 * w->K, rows, w->K, w->data[p] + (g - first) * stride,
                     y + m0 * N, N, 4 * g);
        }
        m0 += rows;
    }
}

/* One product on `nthreads` threads (its own parallel region). */
void kiln_quant_gemm(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     float *y, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    kiln_gemm_tiles(fmt, x, M, K, w, N, y);
}
