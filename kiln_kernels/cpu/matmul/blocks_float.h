/* Floating-point weights, tiled like the blocks (32 weights of each of 4 rows per tile block,
 * the rows one after another) and widened exactly in registers: IEEE half (F16), bfloat16
 * (BF16, the upper half of a float32) and float32 itself. Included by blocks.h only. */
#ifndef KILN_BLOCKS_FLOAT_H
#define KILN_BLOCKS_FLOAT_H

static inline float w_f16(const uint8_t *blk, int r, int j) { return kiln_half_load(blk + 64 * r + 2 * j); }

static inline float w_bf16(const uint8_t *blk, int r, int j) {
    uint16_t h;
    memcpy(&h, blk + 64 * r + 2 * j, sizeof h);
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float w_f32(const uint8_t *blk, int r, int j) {
    float f;
    memcpy(&f, blk + 128 * r + 4 * j, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) void u_f16(const uint8_t *blk, int r, vf *lo,
                                                       vf *hi) {
    const uint8_t *p = blk + 64 * r;
    *lo = vf_load_f16(p);
    *hi = vf_load_f16(p + 32);
}

static inline __attribute__((always_inline)) void u_bf16(const uint8_t *blk, int r, vf *lo,
                                                        vf *hi) {
    const uint8_t *p = blk + 64 * r;
    *lo = vf_load_bf16(p);
    *hi = vf_load_bf16(p + 32);
}

static inline __attribute__((always_inline)) void u_f32(const uint8_t *blk, int r, vf *lo,
                                                       vf *hi) {
    const float *p = (const float *)(blk + 128 * r);
    *lo = vf_load(p);
    *hi = vf_load(p + 16);
}

#endif
