/* GGML's non-linear 4-bit formats, kept as the file's blocks: each 4-bit index picks one of 16
 * fixed values (kiln_iq4_values, llama.cpp's kvalues_iq4nl) times the block's scale.
 *   IQ4_NL (32 weights, 18 bytes): fp16 d, then 16 bytes qs; w = d * value[q];
 *   IQ4_XS (256 weights, 136 bytes): fp16 d, uint16 scales_h, 4 bytes scales_l, 128 bytes qs;
 *     sub-block b (32 weights) has the 6-bit scale ls = low nibble b of scales_l (byte b / 2,
 *     high nibble for odd b) | bits 2b..2b+1 of scales_h << 4, and w = (d * (ls - 32)) * value[q].
 * In each 32 weights' 16 qs bytes the low nibble of byte j is weight j, the high weight j + 16.
 * Every product is exact in float32 (d: 11 significant bits, ls - 32: 6, a value: 7), so the
 * weights are gguf-py's, bit for bit, whatever the order. Included by blocks.h only. */
#ifndef KILN_BLOCKS_IQ_H
#define KILN_BLOCKS_IQ_H

#define IQ4_NL_BLOCK 18
#define IQ4_XS_BLOCK 136

static const float kiln_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

static inline float iq4_value(const uint8_t *qs, int j) {
    const uint8_t byte = qs[j & 15];
    return kiln_iq4_values[j < 16 ? (byte & 0x0F) : (byte >> 4)];
}

/* d * (ls - 32) of sub-block b of the IQ4_XS block at p. */
static inline float iq4_xs_scale(const uint8_t *p, int b) {
    uint16_t h;
    memcpy(&h, p + 2, sizeof h);
    const int ls = ((p[4 + b / 2] >> (4 * (b & 1))) & 0x0F) | (((h >> (2 * b)) & 3) << 4);
    return kiln_half_load(p) * (float)(ls - 32);
}

static inline float w_iq4_nl(const uint8_t *blk, int r, int j) {
    const uint8_t *p = blk + IQ4_NL_BLOCK * r;
    return kiln_half_load(p) * iq4_value(p + 2, j);
}

static inline float w_iq4_xs(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + IQ4_XS_BLOCK * r;
    return iq4_xs_scale(p, e / 32) * iq4_value(p + 8 + 16 * (e / 32), e % 32);
}

/* The 32 weights whose indices are the 16 bytes at qs, scale d: looked up on the low 4 bits of
 * each lane of the table d * value (16 exact products). */
static inline __attribute__((always_inline)) void u_iq4(const uint8_t *qs, float d, vf *lo,
                                                       vf *hi) {
    const vf tab = vf_mul(vf_set1(d), vf_load(kiln_iq4_values));
    const vi idx = vi_load_u8(qs);
    *lo = vf_lookup16(tab, idx);
    *hi = vf_lookup16(tab, vi_srl(idx, 4));
}

#endif
