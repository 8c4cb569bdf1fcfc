/* The 32-weight block formats: q4 / q8 (GGML Q4_0, Q4_1, Q8_0 with float32 scales, packed at
 * load) and GGML Q5_0 / Q5_1 kept as the file's blocks. Each function gives the weights of row r
 * of a tile block exactly as gguf-py's dequantize computes them:
 *   q4:   w = d * q + m, q in 0..15 (d * q exact: one rounding, as an FMA);
 *   q8:   w = d * q, q in -128..127 (exact);
 *   Q5_0: w = d * (q - 16), q in 0..31 (exact; block: fp16 d, uint32 qh, 16 bytes qs);
 *   Q5_1: w = d * q + m, q in 0..31 (d * q exact; block: fp16 d, fp16 m, uint32 qh, qs).
 * In qs, the low nibble of byte j is weight j and the high nibble weight j + 16; bit j of qh is
 * weight j's fifth bit. Included by blocks.h only. */
#ifndef KILN_BLOCKS_LEGACY_H
#define KILN_BLOCKS_LEGACY_H

#define Q4_TILE 96  /* float sc[4][2] (d, m), then uint8 qs[4][16] */
#define Q8_TILE 144 /* float d[4], then int8 qs[4][32] */
#define Q5_0_BLOCK 22
#define Q5_1_BLOCK 24

static inline uint32_t kiln_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float w_q4(const uint8_t *blk, int r, int j) {
    const float *sc = (const float *)blk;
    const uint8_t byte = blk[32 + 16 * r + (j & 15)];
    return sc[2 * r] * (float)(j < 16 ? (byte & 0x0F) : (byte >> 4)) + sc[2 * r + 1];
}

static inline float w_q8(const uint8_t *blk, int r, int j) {
    return ((const float *)blk)[r] * (float)(int8_t)blk[16 + 32 * r + j];
}

/* The 5-bit value of weight j of a Q5_0 / Q5_1 block whose qh is at p and qs at p + 4. */
static inline int q5_value(const uint8_t *p, int j) {
    const uint8_t byte = p[4 + (j & 15)];
    return (j < 16 ? (byte & 0x0F) : (byte >> 4)) | (int)((kiln_u32(p) >> j) & 1u) << 4;
}

static inline float w_q5_0(const uint8_t *blk, int r, int j) {
    const uint8_t *p = blk + Q5_0_BLOCK * r;
    return kiln_half_load(p) * (float)(q5_value(p + 2, j) - 16);
}

static inline float w_q5_1(const uint8_t *blk, int r, int j) {
    const uint8_t *p = blk + Q5_1_BLOCK * r;
    return kiln_half_load(p) * (float)q5_value(p + 4, j) + kiln_half_load(p + 2);
}

/* Weights 0..15 and 16..31 of row r: the 16 values d * j + m (j = 0..15, one FMA each, the
 * scalar weight's one rounding) looked up by the low 4 bits of each lane. */
static inline __attribute__((always_inline)) void u_q4(const uint8_t *blk, int r, vf *lo,
                                                      vf *hi) {
    const float *sc = (const float *)blk;
    const vf tab = vf_fma(vf_set1(sc[2 * r]), vf_iota(), vf_set1(sc[2 * r + 1]));
    const vi idx = vi_load_u8(blk + 32 + 16 * r);
    *lo = vf_lookup16(tab, idx);
    *hi = vf_lookup16(tab, vi_srl(idx, 4));
}

static inline __attribute__((always_inline)) void u_q8(const uint8_t *blk, int r, vf *lo,
                                                      vf *hi) {
    const vf vd = vf_set1(((const float *)blk)[r]);
    const uint8_t *q = blk + 16 + 32 * r;
    *lo = vf_mul(vd, vf_from_i(vi_load_i8(q)));
    *hi = vf_mul(vd, vf_from_i(vi_load_i8(q + 16)));
}

/* Q5_0: weights 0..15 and 16..31 (qh at p, qs at p + 4) from two 16-entry tables
 * (lo_tab: q = 0..15, hi_tab: q = 16..31): looked up on the low 4 bits from lo_tab, and from
 * hi_tab in the lanes whose fifth bit (a mask from qh) is set. */
static inline __attribute__((always_inline)) void u_q5(const uint8_t *p, vf lo_tab, vf hi_tab,
                                                      vf *lo, vf *hi) {
    uint16_t ml, mh;
    memcpy(&ml, p, 2);
    memcpy(&mh, p + 2, 2);
    const vi b = vi_load_u8(p + 4);
    const vi bh = vi_srl(b, 4);
    *lo = vf_select(vm_from_bits(ml), vf_lookup16(hi_tab, b), vf_lookup16(lo_tab, b));
    *hi = vf_select(vm_from_bits(mh), vf_lookup16(hi_tab, bh), vf_lookup16(lo_tab, bh));
}

static inline __attribute__((always_inline)) void u_q5_0(const uint8_t *blk, int r,
                                                        const float *s, vf *lo, vf *hi) {
    const vf vd = vf_set1(s[0]); /* kf_prep: d */
    const vf lo_tab = vf_mul(vd, vf_sub(vf_iota(), vf_set1(16.0f)));
    u_q5(blk + Q5_0_BLOCK * r + 2, lo_tab, vf_mul(vd, vf_iota()), lo, hi); /* exact */
}

/* Q5_1 another way: the 5-bit values as floats (the nibbles, 16 or-ed in where qh's bit is
 * set), then d * q + m as one FMA (d * q is exact: gguf-py's one rounding, as the table's). It
 * spends one shuffle-port op a half where the tables spend two vpermps and their products:
 * one-row products 0.324-0.326 -> 0.276-0.278 ms on bench_formats' matrix (AVX-512, one thread,
 * alternated, 2026-12-02); for Q5_0 it was no faster (0.26 ms either way) and 3% slower at
 * M = 8, so Q5_0 keeps its tables. */
static inline __attribute__((always_inline)) void u_q5_1(const uint8_t *blk, int r,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *p = blk + Q5_1_BLOCK * r + 4; /* qh, then qs */
    const vf vd = vf_set1(s[0]), vmn = vf_set1(s[1]); /* kf_prep: d, m */
    uint16_t ml, mh;
    memcpy(&ml, p, 2);
    memcpy(&mh, p + 2, 2);
    const vi b = vi_load_u8(p + 4);
    const vi q0 = vi_and(b, vi_set1(15));
    const vi q1 = vi_srl(b, 4);
    const vi bit = vi_set1(16);
    *lo = vf_fma(vf_from_i(vi_select(vm_from_bits(ml), vi_or(q0, bit), q0)), vd, vmn);
    *hi = vf_fma(vf_from_i(vi_select(vm_from_bits(mh), vi_or(q1, bit), q1)), vd, vmn);
}

#endif
