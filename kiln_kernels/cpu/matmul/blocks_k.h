/* The K-quant formats, kept as the file's 256-weight super-blocks: GGML Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K. A tile
 * block is the 4 rows' super-blocks one after another; sub-block j (0..7) is weights
 * 32j..32j+31 of the super-block. The weights are exactly gguf-py's:
 *   Q4_K (144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, qs[128]):
 *     w = (d * sc_j) * q - (dmin * m_j), q in 0..15 = nibble (j & 1) of qs[32 (j / 2) + i].
 *     d * sc_j and dmin * m_j are exact (11 x 6 bits), so is (d * sc_j) * q (21 bits): one
 *     rounding, the subtraction, as an FMA.
 *   Q5_K (176 bytes: d, dmin, scales, qh[32], qs[128]): the same with a fifth bit, bit j of
 *     qh[i] (q in 0..31, 22 bits: still exact).
 *   Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], fp16 d): w = (d * sc) * (q - 32), sc the
 *     scale of the weight's 16, q = 4 bits of ql and 2 of qh; exact (at most 11 + 7 + 5 bits).
 *   Q2_K (84 bytes: scales[16] (low nibble scale, high nibble min of each 16 weights), qs[64],
 *     fp16 d, fp16 dmin): w = (d * sc) * q - (dmin * m), q in 0..3 = bits 2s..2s+1 of
 *     qs[32 h + i] for weight 128 h + 32 s + i; d * sc, dmin * m and (d * sc) * q are exact
 *     (11 + 4 + 2 bits): one rounding, the subtraction, as an FMA.
 *   Q3_K (110 bytes: hmask[32], qs[64], 12 bytes of 6-bit signed scales, fp16 d):
 *     w = (d * (sc - 32)) * (q - 4), q = 2 bits of qs as in Q2_K | bit s' of hmask[i] << 2 for
 *     weight 32 s' + i; exact (11 + 6 + 3 bits).
 * Included by blocks.h only. */
#ifndef KILN_BLOCKS_K_H
#define KILN_BLOCKS_K_H

#define Q4_K_BLOCK 144
#define Q5_K_BLOCK 176
#define Q6_K_BLOCK 210
#define Q2_K_BLOCK 84
#define Q3_K_BLOCK 110

/* Scale and min (6 bits each) of sub-block j from the 12 packed bytes s. */
static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* (d * sc_j, dmin * m_j) of a Q4_K / Q5_K super-block (both exact in float32). */
static inline void k_dm(const uint8_t *p, int j, float *d, float *m) {
    int sc, mn;
    k_scale_min(p + 4, j, &sc, &mn);
    *d = kiln_half_load(p) * (float)sc;
    *m = kiln_half_load(p + 2) * (float)mn;
}

static inline float w_q4_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q4_K_BLOCK * r;
    const int j = e / 32, i = e % 32;
    float d, m;
    k_dm(p, j, &d, &m);
    const int q = (p[16 + 32 * (j / 2) + i] >> (4 * (j & 1))) & 0x0F;
    return d * (float)q - m;
}

static inline float w_q5_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q5_K_BLOCK * r;
    const int j = e / 32, i = e % 32;
    float d, m;
    k_dm(p, j, &d, &m);
    const int q = ((p[48 + 32 * (j / 2) + i] >> (4 * (j & 1))) & 0x0F) |
                  ((p[16 + i] >> j) & 1) << 4;
    return d * (float)q - m;
}

static inline float w_q6_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q6_K_BLOCK * r;
    const int j = e / 32, i = e % 32;
    const int lo = (p[64 * (j / 4) + 32 * (j & 1) + i] >> (4 * ((j >> 1) & 1))) & 0x0F;
    const int hi = (p[128 + 32 * (j / 4) + i] >> (2 * (j & 3))) & 3;
    const float d = kiln_half_load(p + 208) * (float)(int8_t)p[192 + e / 16];
    return d * (float)((lo | hi << 4) - 32);
}

/* The 2-bit field of weight e (0..255) of a Q2_K / Q3_K super-block's qs. */
static inline int k_q2(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) & 3))) & 3;
}

static inline float w_q2_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q2_K_BLOCK * r;
    const int sm = p[e / 16];
    const float d = kiln_half_load(p + 80) * (float)(sm & 0x0F);
    const float m = kiln_half_load(p + 82) * (float)(sm >> 4);
    return d * (float)k_q2(p + 16, e) - m;
}

/* Q3_K: the signed 6-bit scale g (0..15) of the 12 packed bytes s. */
static inline int k_scale3(const uint8_t *s, int g) {
    const int lo = (g < 8 ? s[g] : s[g - 8] >> 4) & 0x0F;
    const int hi = (s[8 + (g & 3)] >> (2 * (g / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static inline float w_q3_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q3_K_BLOCK * r;
    const float d = kiln_half_load(p + 108) * (float)k_scale3(p + 96, e / 16);
    const int q = k_q2(p + 32, e) | ((p[e % 32] >> (e / 32)) & 1) << 2;
    return d * (float)(q - 4);
}

/* A super-block's float scales, once per row (then broadcast from memory by the sub-blocks):
 * Q4_K / Q5_K s[j] = d * sc_j, s[8 + j] = -(dmin * m_j); Q6_K s[i] = d * sc_i (i < 16). */
static inline __attribute__((always_inline)) void k_prep(int q6, const uint8_t *p, float *s) {
    if (q6) {
        vf_store(s, vf_mul(vf_set1(kiln_half_load(p + 208)), vf_from_i(vi_load_i8(p + 192))));
        return;
    }
    const float d = kiln_half_load(p), dmin = kiln_half_load(p + 2);
    /* k_scale_min for all 8 sub-blocks at once, 4 bytes a word: a = bytes 0..3, b = 4..7,
     * c = 8..11 of the packed scales; the 8 scales, then the 8 mins, in 16 lanes */
    uint32_t a, b, c;
    memcpy(&a, p + 4, 4);
    memcpy(&b, p + 8, 4);
    memcpy(&c, p + 12, 4);
    const uint64_t sc = (uint64_t)(a & 0x3F3F3F3Fu) |
                        (uint64_t)((c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (uint64_t)(b & 0x3F3F3F3Fu) |
                        (uint64_t)(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u)) << 32;
    /* -(dmin * m): the product is exact, so negating dmin first gives the same bits */
    const vf dd = vf_select(vm_first(8), vf_set1(d), vf_set1(-dmin));
    vf_store(s, vf_mul(dd, vf_from_i(vi_from_u8(vb_from_u64(sc, mn)))));
}

/* Q2_K: s[g] = d * sc_g, s[16 + g] = -(dmin * m_g) (exact, so negating dmin first is the same);
 * Q3_K: s[g] = d * (sc_g - 32). */
static inline __attribute__((always_inline)) void k_prep23(int q3, const uint8_t *p, float *s) {
    if (q3) {
        /* k_scale3 for all 16 at once: low nibbles of bytes 0..7, then their high nibbles;
         * bits 2(g/4)..2(g/4)+1 of byte 8 + (g & 3) above them */
        uint64_t lo;
        uint32_t hi;
        memcpy(&lo, p + 96, 8);
        memcpy(&hi, p + 104, 4);
        const uint64_t m2 = 0x03030303u, m4 = 0x0F0F0F0F0F0F0F0Full;
        const uint64_t ha = (hi & m2) | ((hi >> 2) & m2) << 32;
        const uint64_t hb = ((hi >> 4) & m2) | ((hi >> 6) & m2) << 32;
        /* the 16 scales, 6 bits, before the -32 */
        const vb sc = vb_from_u64((lo & m4) | ha << 4, ((lo >> 4) & m4) | hb << 4);
        const vi v = vi_sub(vi_from_u8(sc), vi_set1(32));
        vf_store(s, vf_mul(vf_set1(kiln_half_load(p + 108)), vf_from_i(v)));
        return;
    }
    const vi v = vi_load_u8(p);
    const vf fsc = vf_from_i(vi_and(v, vi_set1(0x0F)));
    const vf fmn = vf_from_i(vi_srl(v, 4));
    vf_store(s, vf_mul(vf_set1(kiln_half_load(p + 80)), fsc));
    vf_store(s + 16, vf_mul(vf_set1(-kiln_half_load(p + 82)), fmn));
}

/* Sub-block j of row r (its scales s from k_prep): weights 0..15 into lo, 16..31 into hi. */
static inline __attribute__((always_inline)) void u_q4_k(const uint8_t *blk, int r, int j,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *q = blk + Q4_K_BLOCK * r + 16 + 32 * (j / 2);
    vi a = vi_load_u8(q);
    vi b = vi_load_u8(q + 16);
    if (j & 1) {
        a = vi_srl(a, 4);
        b = vi_srl(b, 4);
    }
    *lo = vf_affine16(s[j], s[8 + j], a); /* (d * sc) * q - dmin * m: the low 4 bits */
    *hi = vf_affine16(s[j], s[8 + j], b);
}

static inline __attribute__((always_inline)) void u_q5_k(const uint8_t *blk, int r, int j,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *p = blk + Q5_K_BLOCK * r;
    const uint8_t *q = p + 48 + 32 * (j / 2);
    /* The 5-bit index (nibble | bit j of qh << 4) is formed on the 16 bytes before they are
     * widened: one widening and one vf_affine32 per 16 weights (it had widened qh too and
     * tested it in 32-bit lanes: M = 1 products 0.178 -> 0.147 ms, bench.bench_formats). A
     * 16-bit shift moves the bits within each byte; what crosses from the other byte is masked
     * off. */
    const vb nib = vb_set1(0x0F), five = vb_set1(0x10);
    for (int h = 0; h < 2; h++) {
        vb v = vb_load(q + 16 * h);
        if (j & 1) v = vb_srl16(v, 4);
        const vb qh = vb_load(p + 16 + 16 * h);
        const vb b = j >= 4 ? vb_srl16(qh, j - 4) : vb_sll16(qh, 4 - j);
        v = vb_or(vb_and(v, nib), vb_and(b, five));
        const vf w = vf_affine32(s[j], s[8 + j], vi_from_u8(v)); /* (d * sc) * q - dmin * m */
        if (h) *hi = w; else *lo = w;
    }
}

/* Q6_K: w = (d * sc) * (q - 32), q = the 4 low bits | 2 high bits << 4: d * sc is exact, so the
 * one product is gguf-py's one rounding. q - 32 is formed on the 16 bytes (a 16-bit shift moves
 * the bits within each byte; what crosses from the other byte is masked off), then widened
 * signed and converted: one widening per 16 weights where two 16-entry tables had taken two
 * widenings and two lookups. */
static inline __attribute__((always_inline)) void u_q6_k(const uint8_t *blk, int r, int j,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *p = blk + Q6_K_BLOCK * r;
    const uint8_t *ql = p + 64 * (j / 4) + 32 * (j & 1), *qh = p + 128 + 32 * (j / 4);
    const vb nib = vb_set1(0x0F), two = vb_set1(0x03);
    for (int h = 0; h < 2; h++) {
        vb a = vb_load(ql + 16 * h);
        if ((j >> 1) & 1) a = vb_srl16(a, 4);
        vb b = vb_load(qh + 16 * h);
        if (j & 3) b = vb_srl16(b, 2 * (j & 3));
        const vb q = vb_sub8(vb_or(vb_and(a, nib), vb_sll16(vb_and(b, two), 4)), vb_set1(32));
        const vf w = vf_mul(vf_set1(s[2 * j + h]), vf_from_i(vi_from_i8(q)));
        if (h) *hi = w; else *lo = w;
    }
}

/* Q2_K: the 16 weights of group 2j + h are (d * sc) * q - dmin * m for q = 2 bits of qs
 * (one FMA, vf_affine16: the same single rounding as the scalar weight). */
static inline __attribute__((always_inline)) void u_q2_k(const uint8_t *blk, int r, int j,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *q = blk + Q2_K_BLOCK * r + 16 + 32 * (j / 4);
    const vi three = vi_set1(3);
    for (int h = 0; h < 2; h++) {
        vi v = vi_load_u8(q + 16 * h);
        if (j & 3) v = vi_srl(v, 2 * (j & 3));
        const vf w = vf_affine16(s[2 * j + h], s[16 + 2 * j + h], vi_and(v, three));
        if (h) *hi = w; else *lo = w;
    }
}

/* Q3_K: index q = 2 bits of qs | the hmask bit << 2 (0..7), w = (d * sc) * (q - 4) =
 * (d * sc) * q - 4 (d * sc), every term exact. Two ways to the same bits, picked by the register
 * file (a speed choice, as the blocking): with 32 vf (AVX-512) the 2-bit fields are widened and
 * the hmask bit or-ed in under a mask, then a table lookup; with 8 vf q is formed on the 16 bytes
 * before they are widened (the 16-bit shifts' crossing bits masked off), one widening per 16
 * weights (AVX2, one row: 0.75 -> 0.37 ms; on AVX-512 0.28 -> 0.34 ms, so not there). */
static inline __attribute__((always_inline)) void u_q3_k(const uint8_t *blk, int r, int j,
                                                        const float *s, vf *lo, vf *hi) {
    const uint8_t *p = blk + Q3_K_BLOCK * r;
    const uint8_t *q = p + 32 + 32 * (j / 4);
#if KILN_VREGS >= 32
    const vi three = vi_set1(3), four = vi_set1(4);
    const vi bit = vi_set1(1 << j);
    const vf centred = vf_sub(vf_iota(), vf_set1(4.0f));
    for (int h = 0; h < 2; h++) {
        const vf tab = vf_mul(vf_set1(s[2 * j + h]), centred);
        vi v = vi_load_u8(q + 16 * h);
        if (j & 3) v = vi_srl(v, 2 * (j & 3));
        v = vi_and(v, three);
        v = vi_select(vi_test(vi_load_u8(p + 16 * h), bit), vi_or(v, four), v);
        const vf w = vf_lookup16(tab, v);
        if (h) *hi = w; else *lo = w;
    }
#else
    const vb three = vb_set1(3), four = vb_set1(4);
    for (int h = 0; h < 2; h++) {
        vb v = vb_load(q + 16 * h);
        if (j & 3) v = vb_srl16(v, 2 * (j & 3));
        const vb m = vb_load(p + 16 * h);
        const vb b = j >= 2 ? vb_srl16(m, j - 2) : j == 1 ? vb_sll16(m, 1) : vb_sll16(m, 2);
        const vi idx = vi_from_u8(vb_or(vb_and(v, three), vb_and(b, four)));
        const vf w = vf_affine16(s[2 * j + h], -4.0f * s[2 * j + h], idx);
        if (h) *hi = w; else *lo = w;
    }
#endif
}

#endif
