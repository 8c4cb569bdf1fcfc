/* Every weight format of the products (ids in quant.h): its tile geometry, the scalar weight
 * (row lookups) and the in-register unpack (isa.h's 16 lanes, every build), which give the same
 * float32 values: gguf-py's, bit for bit (each format's arithmetic is exact but for at most one
 * rounding, done alike by both). Included by gemm.c. */
#ifndef KILN_BLOCKS_H
#define KILN_BLOCKS_H
#include <stdint.h>
#include <string.h>

#include "quant.h"
#include "isa.h" /* the ISA layer: the only file that names an instruction set */

#include "blocks_legacy.h"
#include "blocks_k.h"
#include "blocks_float.h"
#include "blocks_iq.h"

/* Weights per block along k (32, or 256 for the K-quants). */
static inline __attribute__((always_inline)) int kf_qk(int fmt) {
    return fmt == KF_Q4_K || fmt == KF_Q5_K || fmt == KF_Q6_K || fmt == KF_Q2_K ||
                   fmt == KF_Q3_K || fmt == KF_IQ4_XS ? 256 : 32;
}

/* Bytes of one tile block (4 rows). */
static inline __attribute__((always_inline)) int64_t kf_tile(int fmt) {
    switch (fmt) {
    case KF_Q4: return Q4_TILE;
    case KF_Q8: return Q8_TILE;
    case KF_Q5_0: return 4 * Q5_0_BLOCK;
    case KF_Q5_1: return 4 * Q5_1_BLOCK;
    case KF_Q4_K: return 4 * Q4_K_BLOCK;
    case KF_Q5_K: return 4 * Q5_K_BLOCK;
    case KF_Q6_K: return 4 * Q6_K_BLOCK;
    case KF_Q2_K: return 4 * Q2_K_BLOCK;
    case KF_Q3_K: return 4 * Q3_K_BLOCK;
    case KF_IQ4_NL: return 4 * IQ4_NL_BLOCK;
    case KF_IQ4_XS: return 4 * IQ4_XS_BLOCK;
    case KF_F16: case KF_BF16: return 4 * 64;
    default: return 4 * 128; /* KF_F32 */
    }
}

/* Weight e (0 .. qk-1) of row r of tile block blk. */
static inline float kf_weight(int fmt, const uint8_t *blk, int r, int e) {
    switch (fmt) {
    case KF_Q4: return w_q4(blk, r, e);
    case KF_Q8: return w_q8(blk, r, e);
    case KF_Q5_0: return w_q5_0(blk, r, e);
    case KF_Q5_1: return w_q5_1(blk, r, e);
    case KF_Q4_K: return w_q4_k(blk, r, e);
    case KF_Q5_K: return w_q5_k(blk, r, e);
    case KF_Q6_K: return w_q6_k(blk, r, e);
    case KF_Q2_K: return w_q2_k(blk, r, e);
    case KF_Q3_K: return w_q3_k(blk, r, e);
    case KF_IQ4_NL: return w_iq4_nl(blk, r, e);
    case KF_IQ4_XS: return w_iq4_xs(blk, r, e);
    case KF_F16: return w_f16(blk, r, e);
    case KF_BF16: return w_bf16(blk, r, e);
    default: return w_f32(blk, r, e);
    }
}

/* The float scales of rows r0..r0+RR-1 of a tile block, written to s[r] (up to 32 floats a row) and
 * read back by kf_unpack as broadcasts from memory (load-port work; the conversions and the
 * register broadcasts they replace all compete for the shuffle port): K-quants per row
 * (k_prep, k_prep23: 32 floats a row for Q2_K); Q5_0 / Q5_1 d (and m) of the rows' blocks converted together;
 * IQ4_NL d, IQ4_XS the 8 sub-blocks' d * (ls - 32). */
static inline __attribute__((always_inline)) void kf_prep(int fmt, const uint8_t *blk, int r0,
                                                         int RR, float (*s)[32]) {
    for (int r = 0; r < RR; r++) {
        if (fmt == KF_Q4_K) k_prep(0, blk + Q4_K_BLOCK * (r0 + r), s[r]);
        if (fmt == KF_Q5_K) k_prep(0, blk + Q5_K_BLOCK * (r0 + r), s[r]);
        if (fmt == KF_Q6_K) k_prep(1, blk + Q6_K_BLOCK * (r0 + r), s[r]);
        if (fmt == KF_Q2_K) k_prep23(0, blk + Q2_K_BLOCK * (r0 + r), s[r]);
        if (fmt == KF_Q3_K) k_prep23(1, blk + Q3_K_BLOCK * (r0 + r), s[r]);
        if (fmt == KF_IQ4_NL) s[r][0] = kiln_half_load(blk + IQ4_NL_BLOCK * (r0 + r));
        if (fmt == KF_IQ4_XS)
            for (int b = 0; b < 8; b++) s[r][b] = iq4_xs_scale(blk + IQ4_XS_BLOCK * (r0 + r), b);
    }
    if (fmt == KF_Q5_0 || fmt == KF_Q5_1) {
        /* the rows' fp16 fields gathered in integer registers, then one conversion (a vector
         * load over several narrow stores would stall on store forwarding) */
        const int bs = fmt == KF_Q5_0 ? Q5_0_BLOCK : Q5_1_BLOCK, per = fmt == KF_Q5_0 ? 1 : 2;
        uint64_t lanes[2] = {0, 0};
        for (int r = 0; r < RR; r++)
            for (int i = 0; i < per; i++) {
                uint16_t h;
                memcpy(&h, blk + bs * (r0 + r) + 2 * i, 2);
                const int at = per * r + i;
                lanes[at / 4] |= (uint64_t)h << (16 * (at % 4));
            }
        float f[16];
        vf_store(f, vf_from_f16x8(vb_from_u64(lanes[0], lanes[1])));
        for (int r = 0; r < RR; r++) {
            s[r][0] = f[per * r];
            s[r][1] = f[per * r + per - 1];
        }
    }
}

/* Weights 32j..32j+15 (lo) and 32j+16..32j+31 (hi) of row r of tile block blk (s: that row's
 * kf_prep scales). */
static inline __attribute__((always_inline)) void kf_unpack(int fmt, const uint8_t *blk, int r,
                                                           int j, const float *s, vf *lo,
                                                           vf *hi) {
    switch (fmt) {
    case KF_Q4: u_q4(blk, r, lo, hi); break;
    case KF_Q8: u_q8(blk, r, lo, hi); break;
    case KF_Q5_0: u_q5_0(blk, r, s, lo, hi); break;
    case KF_Q5_1: u_q5_1(blk, r, s, lo, hi); break;
    case KF_Q4_K: u_q4_k(blk, r, j, s, lo, hi); break;
    case KF_Q5_K: u_q5_k(blk, r, j, s, lo, hi); break;
    case KF_Q6_K: u_q6_k(blk, r, j, s, lo, hi); break;
    case KF_Q2_K: u_q2_k(blk, r, j, s, lo, hi); break;
    case KF_Q3_K: u_q3_k(blk, r, j, s, lo, hi); break;
    case KF_IQ4_NL: u_iq4(blk + IQ4_NL_BLOCK * r + 2, s[0], lo, hi); break;
    case KF_IQ4_XS: u_iq4(blk + IQ4_XS_BLOCK * r + 8 + 16 * j, s[j], lo, hi); break;
    case KF_F16: u_f16(blk, r, lo, hi); break;
    case KF_BF16: u_bf16(blk, r, lo, hi); break;
    default: u_f32(blk, r, lo, hi); break;
    }
}
#endif
