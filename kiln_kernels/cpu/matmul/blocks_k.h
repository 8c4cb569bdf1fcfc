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
    *d = kiln_half(p) * (float)sc;
    *m = kiln_half(p + 2) * (float)mn;
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
    const float d = kiln_half(p + 208) * (float)(int8_t)p[192 + e / 16];
    return d * (float)((lo | hi << 4) - 32);
}

/* The 2-bit field of weight e (0..255) of a Q2_K / Q3_K super-block's qs. */
static inline int k_q2(const uint8_t *qs, int e) {
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) & 3))) & 3;
}

static inline float w_q2_k(const uint8_t *blk, int r, int e) {
    const uint8_t *p = blk + Q2_K_BLOCK * r;
    const int sm = p[e / 16];
    const float d = kiln_half(p + 80) * (float)(sm & 0x0F);
    const float m = kiln_half(p + 82) * (float)(sm >> 4);
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
    const float d = kiln_half(p + 108) * (float)k_scale3(p + 96, e / 16);
    const int q = k_q2(p + 32, e) | ((p[e % 32] >> (e / 32)) & 1) << 2;
    return d * (float)(q - 4);
}

/* A super-block's float scales, once per row (then broadcast from memory by the sub-blocks):
 * Q4_K / Q5_K s[j] = d * sc_j, s[8 + j] = -(dmin * m_j); Q6_K s[i] = d * sc_i (i < 16). */
static inline __attribute__((always_inline)) void k_prep(int q6, const uint8_t *p, float *s) {
    if (q6) {
        const float d = kiln_half(p + 208);
        for (int i = 0; i < 16; i++) s[i] = d * (float)(int8_t)p[192 + i];
        return;
    }
    const float d = kiln_half(p), dmin = kiln_half(p + 2);
#if defined(__AVX512F__)
    /* k_scale_min for all 8 sub-blocks at once, 4 bytes a word: a = bytes 0..3, b = 4..7,
     * c = 8..11 of the packed scales */
    uint32_t a, b, c;
    memcpy(&a, p + 4, 4);
    memcpy(&b, p + 8, 4);
    memcpy(&c, p + 12, 4);
    const uint64_t sc = (uint64_t)(a & 0x3F3F3F3Fu) |
                        (uint64_t)((c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (uint64_t)(b & 0x3F3F3F3Fu) |
                        (uint64_t)(((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u)) << 32;
    const __m256 fsc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 fmn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(d), fsc));
    /* -(dmin * m): the product is exact, so negating dmin first gives the same bits */
    _mm256_storeu_ps(s + 8, _mm256_mul_ps(_mm256_set1_ps(-dmin), fmn));
#else
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(p + 4, j, &sc, &mn);
        s[j] = d * (float)sc;
        s[8 + j] = -(dmin * (float)mn);
    }
#endif
}

/* Q2_K: s[g] = d * sc_g, s[16 + g] = -(dmin * m_g) (exact, so negating dmin first is the same);
 * Q3_K: s[g] = d * (sc_g - 32). */
static inline __attribute__((always_inline)) void k_prep23(int q3, const uint8_t *p, float *s) {
#if defined(__AVX512F__)
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
        const __m128i sc = _mm_set_epi64x( /* the 16 scales, 6 bits, before the -32 */(long long)(((lo >> 4) & m4) | hb << 4),
                                          (long long)((lo & m4) | ha << 4));
        const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(sc), _mm512_set1_epi32(32));
        _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_set1_ps(kiln_half(p + 108)),
                                          _mm512_cvtepi32_ps(v)));
        return;
    }
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512 fsc = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x0F)));
    const __m512 fmn = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_set1_ps(kiln_half(p + 80)), fsc));
    _mm512_storeu_ps(s + 16, _mm512_mul_ps(_mm512_set1_ps(-kiln_half(p + 82)), fmn));
#else
    if (q3) {
        const float d = kiln_half(p + 108);
        for (int g = 0; g < 16; g++) s[g] = d * (float)k_scale3(p + 96, g);
        return;
    }
    const float d = kiln_half(p + 80), dmin = -kiln_half(p + 82);
    for (int g = 0; g < 16; g++) {
        s[g] = d * (float)(p[g] & 0x0F);
        s[16 + g] = dmin * (float)(p[g] >> 4);
    }
#endif
}

#if defined(__AVX512F__)
/* Sub-block j of row r (its scales s from k_prep): weights 0..15 into lo, 16..31 into hi. */
static inline __attribute__((always_inline)) void u_q4_k(const uint8_t *blk, int r, int j,
                                                        const float *s, __m512 *lo, __m512 *hi) {
    const uint8_t *q = blk + Q4_K_BLOCK * r + 16 + 32 * (j / 2);
    const __m512 tab = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), kiln_iota(), _mm512_set1_ps(s[8 + j]));
    __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
    if (j & 1) {
        a = _mm512_srli_epi32(a, 4);
        b = _mm512_srli_epi32(b, 4);
    }
    *lo = _mm512_permutexvar_ps(a, tab); /* vpermps reads the low 4 bits */
    *hi = _mm512_permutexvar_ps(b, tab);
}

static inline __attribute__((always_inline)) void u_q5_k(const uint8_t *blk, int r, int j,
                                                        const float *s, __m512 *lo, __m512 *hi) {
    const uint8_t *p = blk + Q5_K_BLOCK * r;
    const __m512 vd = _mm512_set1_ps(s[j]), vm = _mm512_set1_ps(s[8 + j]);
    const __m512 lo_tab = _mm512_fmadd_ps(vd, kiln_iota(), vm);
    const __m512 hi_tab = _mm512_fmadd_ps(vd, _mm512_add_ps(kiln_iota(), _mm512_set1_ps(16.0f)),
                                          vm);
    const uint8_t *q = p + 48 + 32 * (j / 2);
    /* The 5-bit index (nibble | bit j of qh << 4) is formed on the 16 bytes before they are
     * widened: one widening and one two-table permute per 16 weights (it had widened qh too and
     * tested it in 32-bit lanes: M = 1 products 0.178 -> 0.147 ms, bench.bench_formats). A
     * 16-bit shift moves the bits within each byte; what crosses from the other byte is masked
     * off. */
    const __m128i nib = _mm_set1_epi8(0x0F), five = _mm_set1_epi8(0x10);
    for (int h = 0; h < 2; h++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * h));
        if (j & 1) v = _mm_srli_epi16(v, 4);
        const __m128i qh = _mm_loadu_si128((const __m128i *)(p + 16 + 16 * h));
        const __m128i b = j >= 4 ? _mm_srli_epi16(qh, j - 4) : _mm_slli_epi16(qh, 4 - j);
        v = _mm_or_si128(_mm_and_si128(v, nib), _mm_and_si128(b, five));
        const __m512 w = _mm512_permutex2var_ps(lo_tab, _mm512_cvtepu8_epi32(v), hi_tab);
        if (h) *hi = w; else *lo = w;
    }
}

/* Q6_K: w = (d * sc) * (q - 32), q = the 4 low bits | 2 high bits << 4: d * sc is exact, so the
 * one product is gguf-py's one rounding. q - 32 is formed on the 16 bytes (a 16-bit shift moves
 * the bits within each byte; what crosses from the other byte is masked off), then widened
 * signed and converted: one widening per 16 weights where two 16-entry tables had taken two
 * widenings and two permutes. */
static inline __attribute__((always_inline)) void u_q6_k(const uint8_t *blk, int r, int j,
                                                        const float *s, __m512 *lo, __m512 *hi) {
    const uint8_t *p = blk + Q6_K_BLOCK * r;
    const uint8_t *ql = p + 64 * (j / 4) + 32 * (j & 1), *qh = p + 128 + 32 * (j / 4);
    const __m128i nib = _mm_set1_epi8(0x0F), two = _mm_set1_epi8(0x03);
    for (int h = 0; h < 2; h++) {
        __m128i a = _mm_loadu_si128((const __m128i *)(ql + 16 * h));
        if ((j >> 1) & 1) a = _mm_srli_epi16(a, 4);
        __m128i b = _mm_loadu_si128((const __m128i *)(qh + 16 * h));
        if (j & 3) b = _mm_srli_epi16(b, 2 * (j & 3));
        const __m128i q = _mm_sub_epi8(
            _mm_or_si128(_mm_and_si128(a, nib), _mm_slli_epi16(_mm_and_si128(b, two), 4)),
            _mm_set1_epi8(32));
        const __m512 w = _mm512_mul_ps(_mm512_set1_ps(s[2 * j + h]),
                                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
        if (h) *hi = w; else *lo = w;
    }
}

/* Q2_K: the 16 weights of group 2j + h are (d * sc) * q - dmin * m for q = 2 bits of qs
 * (one FMA per table entry, the same single rounding as the scalar weight). */
static inline __attribute__((always_inline)) void u_q2_k(const uint8_t *blk, int r, int j,
                                                        const float *s, __m512 *lo, __m512 *hi) {
    const uint8_t *q = blk + Q2_K_BLOCK * r + 16 + 32 * (j / 4);
    const __m512i three = _mm512_set1_epi32(3);
    for (int h = 0; h < 2; h++) {
        const __m512 tab = _mm512_fmadd_ps(_mm512_set1_ps(s[2 * j + h]), kiln_iota(),
                                           _mm512_set1_ps(s[16 + 2 * j + h]));
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
        if (j & 3) v = _mm512_srli_epi32(v, 2 * (j & 3));
        const __m512 w = _mm512_permutexvar_ps(_mm512_and_si512(v, three), tab);
        if (h) *hi = w; else *lo = w;
    }
}

/* Q3_K: index q = 2 bits of qs | the hmask bit << 2 (0..7), w = (d * sc) * (q - 4). */
static inline __attribute__((always_inline)) void u_q3_k(const uint8_t *blk, int r, int j,
                                                        const float *s, __m512 *lo, __m512 *hi) {
    const uint8_t *p = blk + Q3_K_BLOCK * r;
    const uint8_t *q = p + 32 + 32 * (j / 4);
    const __m512i three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4);
    const __m512i bit = _mm512_set1_epi32(1 << j);
    const __m512 centred = _mm512_sub_ps(kiln_iota(), _mm512_set1_ps(4.0f));
    for (int h = 0; h < 2; h++) {
        const __m512 tab = _mm512_mul_ps(_mm512_set1_ps(s[2 * j + h]), centred);
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
        if (j & 3) v = _mm512_srli_epi32(v, 2 * (j & 3));
        v = _mm512_and_si512(v, three);
        const __m512i m = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
        v = _mm512_mask_or_epi32(v, _mm512_test_epi32_mask(m, bit), v, four);
        const __m512 w = _mm512_permutexvar_ps(v, tab);
        if (h) *hi = w; else *lo = w;
    }
}
#endif

#endif
