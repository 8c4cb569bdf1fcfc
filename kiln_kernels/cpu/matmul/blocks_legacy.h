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

/* Weights 0..15 and 16..31 of row r: d * q + m for q = the low 4 bits of each lane (one FMA,
 * the scalar weight's one rounding: vf_affine16, a table lookup where that is cheaper). */
static inline __attribute__((always_inline)) void u_q4(const uint8_t *blk, int r, vf *lo,
                                                      vf *hi) {
    const float *sc = (const float *)blk;
    const vi idx = vi_load_u8(blk + 32 + 16 * r);
    *lo = vf_affine16(sc[2 * r], sc[2 * r + 1], idx);
    *hi = vf_affine16(sc[2 * r], sc[2 * r + 1], vi_srl(idx, 4));
}

static inline __attribute__((always_inline)) void u_q8(const uint8_t *blk, int r, vf *lo,
                                                      vf *hi) {
    const vf vd = vf_set1(((const float *)blk)[r]);
    const uint8_t *q = blk + 16 + 32 * r;
    *lo = vf_mul(vd, vf_from_i(vi_load_i8(q)));
    *hi = vf_mul(vd, vf_from_i(vi_load_i8(q + 16)));
}

/* Q5_0 / Q5_1: w = d * (q - 16) (exact) or d * q + m (d * q exact: one rounding, an FMA's). Two
 * ways to the same bits, picked by the register file (a speed choice, as the blocking):
 * with 32 vf (AVX-512, where a lookup is one permute and a mask one kmov) Q5_0 looks up two
 * 16-entry tables and selects by qh's bits, Q5_1 converts the 5-bit values and does the FMA
 * (one-row products 0.324-0.326 -> 0.276-0.278 ms against Q5_1's tables; for Q5_0 it was no
 * faster and 3% slower at M = 8, bench_formats, 2026-12-02); with 8 vf (AVX2, NEON, plain) the
 * fifth bits are spread to bytes in integer registers and or-ed into the 16 bytes before they
 * are widened, then vf_affine32's FMA (AVX2, one row: Q5_0 0.95 -> 0.44 ms, Q5_1 0.59 ->
 * 0.46 ms against the masks; on AVX-512 that way was 0.27 -> 0.40 ms). */
#if KILN_VREGS >= 32
/* weights 0..15 and 16..31 (qh at p, qs at p + 4) from lo_tab (q = 0..15) and hi_tab
 * (q = 16..31): looked up on the low 4 bits, hi_tab's where the fifth bit is set */
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

static inline __attribute__((always_inline)) void u_q5_1(const uint8_t *blk, int r,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *p = blk + Q5_1_BLOCK * r + 4; /* qh, then qs */
    const vf vd = vf_set1(s[0]), vmn = vf_set1(s[1]); /* kf_prep: d, m */
    uint16_t ml, mh;
    memcpy(&ml, p, 2);
    memcpy(&mh, p + 2, 2);
    const vi b = vi_load_u8(p + 4);
    const vi q0 = vi_and(b, vi_set1(15)), q1 = vi_srl(b, 4), bit = vi_set1(16);
    *lo = vf_fma(vf_from_i(vi_select(vm_from_bits(ml), vi_or(q0, bit), q0)), vd, vmn);
    *hi = vf_fma(vf_from_i(vi_select(vm_from_bits(mh), vi_or(q1, bit), q1)), vd, vmn);
}
#else
/* 0x10 in byte j where bit j of the byte b is set (each byte keeps its own bit of b's copy,
 * carried up to bit 7, shifted to bit 4) */
static inline uint64_t q5_spread(uint32_t b) {
    const uint64_t x = ((uint64_t)(b & 0xFFu) * 0x0101010101010101ull) & 0x8040201008040201ull;
    return ((x + 0x7F7F7F7F7F7F7F7Full) & 0x8080808080808080ull) >> 3;
}

/* the 5-bit values (qh at p, qs at p + 4) of weights 0..15 (*lo) and 16..31 (*hi) */
static inline __attribute__((always_inline)) void q5_values(const uint8_t *p, vi *lo, vi *hi) {
    const uint32_t qh = kiln_u32(p);
    const vb qs = vb_load(p + 4), nib = vb_set1(0x0F);
    *lo = vi_from_u8(vb_or(vb_and(qs, nib), vb_from_u64(q5_spread(qh), q5_spread(qh >> 8))));
    *hi = vi_from_u8(vb_or(vb_and(vb_srl16(qs, 4), nib),
                           vb_from_u64(q5_spread(qh >> 16), q5_spread(qh >> 24))));
}

/* d * q - 16 d: both terms exact, so the one rounding gives the exact d * (q - 16) */
static inline __attribute__((always_inline)) void u_q5_0(const uint8_t *blk, int r,
                                                        const float *s, vf *lo, vf *hi) {
    vi a, b;
    q5_values(blk + Q5_0_BLOCK * r + 2, &a, &b);
    const float d = s[0]; /* kf_prep: d */
    *lo = vf_affine32(d, -16.0f * d, a);
    *hi = vf_affine32(d, -16.0f * d, b);
}

static inline __attribute__((always_inline)) void u_q5_1(const uint8_t *blk, int r,
                                                        const float *s, vf *lo, vf *hi) {
    vi a, b;
    q5_values(blk + Q5_1_BLOCK * r + 4, &a, &b);
    *lo = vf_affine32(s[0], s[1], a); /* kf_prep: d, m */
    *hi = vf_affine32(s[0], s[1], b);
}
#endif

#endif
