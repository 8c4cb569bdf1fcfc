/* The CPU's ISA, as one layer: the only file of the C kernels that names an instruction set.
 *
 * Every kernel is written once against this vocabulary of 16 logical lanes:
 *   vf  16 float32 lanes        vi  16 int32 lanes        vm  a 16-lane mask
 *   vb  16 bytes (the block formats' packed fields, before they are widened)
 * implemented for AVX-512 (one zmm), AVX2 + FMA + F16C (two ymm), Arm NEON (four q registers)
 * and plain C (arrays, one lane at a time). The lane count is logical, not the register's: lane
 * j of a vf holds the same value on every build, every operation is the same IEEE operation
 * lane by lane (fma is fused everywhere: fmaf in plain C), and every reduction runs one fixed
 * tree (vf_hsum: lane j + lane j+8, then + j+4, + j+2, + j+1). The special functions
 * (vf_exp, vf_log and their one-lane forms) are this layer's own polynomials, never libm. So a
 * row's logits, logprobs and sampled tokens are bit-identical on every build (the C is compiled
 * with -ffp-contract=off, so no build fuses a product the others round).
 *
 * The build is picked by the compiler's target flags (kiln_kernels/cpu/loader.py: from the
 * CPU's flags, or forced lower by KILN_CPU_ISA); KILN_ISA_PLAIN forces the plain build.
 * kiln_isa_name() (gemm.c) names it. Register budget for the kernels' blocking:
 * KILN_VREGS, how many vf fit the register file; KILN_ISA_BITS, a register's width (0: plain C). */
#ifndef KILN_ISA_H
#define KILN_ISA_H
#include <stdint.h>
#include <string.h>
#include <math.h>

#if !defined(KILN_ISA_PLAIN) && defined(__AVX512F__)
#define KILN_ISA_AVX512 1
#define KILN_ISA_NAME "avx512"
#define KILN_ISA_BITS 512
#define KILN_VREGS 32
#include <immintrin.h>
#elif !defined(KILN_ISA_PLAIN) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KILN_ISA_AVX2 1
#define KILN_ISA_NAME "avx2"
#define KILN_ISA_BITS 256
#define KILN_VREGS 8
#include <immintrin.h>
#elif !defined(KILN_ISA_PLAIN) && defined(__aarch64__) && defined(__ARM_NEON)
#define KILN_ISA_NEON 1
#define KILN_ISA_NAME "neon"
#define KILN_ISA_BITS 128
#define KILN_VREGS 8
#include <arm_neon.h>
#else
#ifndef KILN_ISA_PLAIN
#define KILN_ISA_PLAIN 1
#endif
#define KILN_ISA_NAME "plain"
#define KILN_ISA_BITS 0
#define KILN_VREGS 8
#endif

#define KILN_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- types */
#if defined(KILN_ISA_AVX512)
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vm;
typedef __m128i vb;
#elif defined(KILN_ISA_AVX2)
typedef struct { __m256 l, h; } vf;
typedef struct { __m256i l, h; } vi;
typedef struct { __m256 l, h; } vm; /* all-ones lanes */
typedef __m128i vb;
#elif defined(KILN_ISA_NEON)
typedef struct { float32x4_t q[4]; } vf;
typedef struct { int32x4_t q[4]; } vi;
typedef struct { uint32x4_t q[4]; } vm; /* all-ones lanes */
typedef uint8x16_t vb;
#else
typedef struct { float f[16]; } vf;
typedef struct { int32_t i[16]; } vi;
typedef uint32_t vm; /* bit j: lane j */
typedef struct { uint8_t b[16]; } vb;
#endif

/* Scalar helpers every build shares. */
KILN_INLINE float kiln_bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
KILN_INLINE uint32_t kiln_f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
/* a > b ? a : b (x86's max: the second operand where either is NaN) */
KILN_INLINE float kiln_maxf(float a, float b) { return a > b ? a : b; }
/* a * b + c, one rounding, on every build */
KILN_INLINE float kiln_fmaf(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
    return __builtin_fmaf(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}

/* IEEE half <-> float32 one value at a time: exact this way; round to nearest even the other
 * (torch's .to(float16), and F16C's / NEON's conversions). */
KILN_INLINE float kiln_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;
    uint32_t x;
    if (exp == 0x1F) {
        x = sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u); /* NaNs quieted, as F16C and NEON do */
    } else if (exp) {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    } else {
        const float v = (float)mant * 5.9604644775390625e-8f; /* mant * 2^-24, exact */
        return sign ? -v : v;
    }
    return kiln_bits_f(x);
}

KILN_INLINE uint16_t kiln_float_to_half(float f) {
    const uint32_t x = kiln_f_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xFFu;
    uint32_t mant = x & 0x7FFFFFu;
    if (exp == 0xFF) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u | (mant >> 13) : 0u));
    const int32_t e = (int32_t)exp - 112; /* the half's biased exponent */
    if (e >= 0x1F) return (uint16_t)(sign | 0x7C00u);
    uint32_t shift = 13, base = 0;
    if (e <= 0) { /* a half subnormal (or zero): mant * 2^(e - 14) in units of 2^-24 */
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        shift = (uint32_t)(14 - e);
    } else {
        base = (uint32_t)e << 10;
    }
    uint32_t half = base | (mant >> shift);
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++; /* a carry may reach inf: correct */
    return (uint16_t)(sign | half);
}

/* ---------------------------------------------------------------- vf basics */
#if defined(KILN_ISA_AVX512)
KILN_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
KILN_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
KILN_INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
KILN_INLINE void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
KILN_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
KILN_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
KILN_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
KILN_INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
KILN_INLINE vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
KILN_INLINE vf vf_fnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
KILN_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
KILN_INLINE vf vf_round(vf a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
KILN_INLINE vf vf_from_i(vi a) { return _mm512_cvtepi32_ps(a); }
/* truncated toward zero */
KILN_INLINE vi vi_from_f(vf a) { return _mm512_cvttps_epi32(a); }
KILN_INLINE vi vf_bits(vf a) { return _mm512_castps_si512(a); }
KILN_INLINE vf vi_bits(vi a) { return _mm512_castsi512_ps(a); }
KILN_INLINE vm vf_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
KILN_INLINE vm vf_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
KILN_INLINE vm vf_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
KILN_INLINE vm vf_unord(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
KILN_INLINE vf vf_select(vm m, vf a, vf b) { return _mm512_mask_mov_ps(b, m, a); }
KILN_INLINE vf vf_maskz(vm m, vf a) { return _mm512_maskz_mov_ps(m, a); }
KILN_INLINE vm vm_first(int64_t n) {
    return (__mmask16)(n >= 16 ? 0xFFFFu : n <= 0 ? 0u : (1u << n) - 1u);
}
KILN_INLINE unsigned vm_bits(vm m) { return (unsigned)m; }
KILN_INLINE vm vm_and(vm a, vm b) { return (vm)(a & b); }
/* lanes < n from p, zeros above (nothing read past p + n) */
KILN_INLINE vf vf_load_n(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(vm_first(n), p); }
KILN_INLINE void vf_store_n(float *p, vf v, int64_t n) { _mm512_mask_storeu_ps(p, vm_first(n), v); }
#elif defined(KILN_ISA_AVX2)
#define KILN_2(op, a, b) { op((a).l, (b).l), op((a).h, (b).h) }
KILN_INLINE vf vf_zero(void) { vf r = { _mm256_setzero_ps(), _mm256_setzero_ps() }; return r; }
KILN_INLINE vf vf_set1(float x) { vf r = { _mm256_set1_ps(x), _mm256_set1_ps(x) }; return r; }
KILN_INLINE vf vf_load(const float *p) { vf r = { _mm256_loadu_ps(p), _mm256_loadu_ps(p + 8) }; return r; }
KILN_INLINE void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v.l); _mm256_storeu_ps(p + 8, v.h); }
KILN_INLINE vf vf_add(vf a, vf b) { vf r = KILN_2(_mm256_add_ps, a, b); return r; }
KILN_INLINE vf vf_sub(vf a, vf b) { vf r = KILN_2(_mm256_sub_ps, a, b); return r; }
KILN_INLINE vf vf_mul(vf a, vf b) { vf r = KILN_2(_mm256_mul_ps, a, b); return r; }
KILN_INLINE vf vf_div(vf a, vf b) { vf r = KILN_2(_mm256_div_ps, a, b); return r; }
KILN_INLINE vf vf_max(vf a, vf b) { vf r = KILN_2(_mm256_max_ps, a, b); return r; }
KILN_INLINE vf vf_fma(vf a, vf b, vf c) {
    vf r = { _mm256_fmadd_ps(a.l, b.l, c.l), _mm256_fmadd_ps(a.h, b.h, c.h) }; return r;
}
KILN_INLINE vf vf_fnma(vf a, vf b, vf c) {
    vf r = { _mm256_fnmadd_ps(a.l, b.l, c.l), _mm256_fnmadd_ps(a.h, b.h, c.h) }; return r;
}
KILN_INLINE vf vf_round(vf a) {
    vf r = { _mm256_round_ps(a.l, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
             _mm256_round_ps(a.h, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) };
    return r;
}
KILN_INLINE vf vf_from_i(vi a) { vf r = { _mm256_cvtepi32_ps(a.l), _mm256_cvtepi32_ps(a.h) }; return r; }
KILN_INLINE vi vi_from_f(vf a) { vi r = { _mm256_cvttps_epi32(a.l), _mm256_cvttps_epi32(a.h) }; return r; }
KILN_INLINE vi vf_bits(vf a) { vi r = { _mm256_castps_si256(a.l), _mm256_castps_si256(a.h) }; return r; }
KILN_INLINE vf vi_bits(vi a) { vf r = { _mm256_castsi256_ps(a.l), _mm256_castsi256_ps(a.h) }; return r; }
KILN_INLINE vm vf_cmp_(vf a, vf b, const int p) {
    vm r = { _mm256_cmp_ps(a.l, b.l, p), _mm256_cmp_ps(a.h, b.h, p) }; return r;
}
#define vf_gt(a, b) vf_cmp_((a), (b), _CMP_GT_OQ)
#define vf_ge(a, b) vf_cmp_((a), (b), _CMP_GE_OQ)
#define vf_eq(a, b) vf_cmp_((a), (b), _CMP_EQ_OQ)
#define vf_unord(a, b) vf_cmp_((a), (b), _CMP_UNORD_Q)
KILN_INLINE vf vf_select(vm m, vf a, vf b) {
    vf r = { _mm256_blendv_ps(b.l, a.l, m.l), _mm256_blendv_ps(b.h, a.h, m.h) }; return r;
}
KILN_INLINE vf vf_maskz(vm m, vf a) { vf r = KILN_2(_mm256_and_ps, m, a); return r; }
KILN_INLINE vm vm_first(int64_t n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int32_t c = (int32_t)(n > 16 ? 16 : n < 0 ? 0 : n);
    const __m256i lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(c), iota);
    const __m256i hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(c - 8), iota);
    vm r = { _mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi) };
    return r;
}
KILN_INLINE unsigned vm_bits(vm m) {
    return (unsigned)_mm256_movemask_ps(m.l) | (unsigned)_mm256_movemask_ps(m.h) << 8;
}
KILN_INLINE vm vm_and(vm a, vm b) { vm r = KILN_2(_mm256_and_ps, a, b); return r; }
/* A whole vector (n >= 16, the common case) takes the plain load or store: vmaskmovps costs
 * more (a slow store on AMD's cores, no store forwarding on Intel's: the attention's masked
 * stores of 16 scores, read back by the softmax, were 19% of its time on AVX2). */
KILN_INLINE vf vf_load_n(const float *p, int64_t n) {
    if (n >= 16) return vf_load(p);
    const vm m = vm_first(n);
    vf r = { _mm256_maskload_ps(p, _mm256_castps_si256(m.l)),
             _mm256_maskload_ps(p + 8, _mm256_castps_si256(m.h)) };
    return r;
}
KILN_INLINE void vf_store_n(float *p, vf v, int64_t n) {
    if (n >= 16) {
        vf_store(p, v);
        return;
    }
    const vm m = vm_first(n);
    _mm256_maskstore_ps(p, _mm256_castps_si256(m.l), v.l);
    _mm256_maskstore_ps(p + 8, _mm256_castps_si256(m.h), v.h);
}
#elif defined(KILN_ISA_NEON)
#define KILN_4(op, a, b) { { op((a).q[0], (b).q[0]), op((a).q[1], (b).q[1]), \
                              op((a).q[2], (b).q[2]), op((a).q[3], (b).q[3]) } }
KILN_INLINE vf vf_zero(void) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vdupq_n_f32(0.0f); return r; }
KILN_INLINE vf vf_set1(float x) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vdupq_n_f32(x); return r; }
KILN_INLINE vf vf_load(const float *p) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vld1q_f32(p + 4 * k); return r; }
KILN_INLINE void vf_store(float *p, vf v) { for (int k = 0; k < 4; k++) vst1q_f32(p + 4 * k, v.q[k]); }
KILN_INLINE vf vf_add(vf a, vf b) { vf r = KILN_4(vaddq_f32, a, b); return r; }
KILN_INLINE vf vf_sub(vf a, vf b) { vf r = KILN_4(vsubq_f32, a, b); return r; }
KILN_INLINE vf vf_mul(vf a, vf b) { vf r = KILN_4(vmulq_f32, a, b); return r; }
KILN_INLINE vf vf_div(vf a, vf b) { vf r = KILN_4(vdivq_f32, a, b); return r; }
KILN_INLINE vf vf_max(vf a, vf b) {
    vf r; for (int k = 0; k < 4; k++) r.q[k] = vbslq_f32(vcgtq_f32(a.q[k], b.q[k]), a.q[k], b.q[k]);
    return r;
}
KILN_INLINE vf vf_fma(vf a, vf b, vf c) {
    vf r; for (int k = 0; k < 4; k++) r.q[k] = vfmaq_f32(c.q[k], a.q[k], b.q[k]); return r;
}
KILN_INLINE vf vf_fnma(vf a, vf b, vf c) {
    vf r; for (int k = 0; k < 4; k++) r.q[k] = vfmsq_f32(c.q[k], a.q[k], b.q[k]); return r;
}
KILN_INLINE vf vf_round(vf a) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vrndnq_f32(a.q[k]); return r; }
KILN_INLINE vf vf_from_i(vi a) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vcvtq_f32_s32(a.q[k]); return r; }
KILN_INLINE vi vi_from_f(vf a) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vcvtq_s32_f32(a.q[k]); return r; }
KILN_INLINE vi vf_bits(vf a) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vreinterpretq_s32_f32(a.q[k]); return r; }
KILN_INLINE vf vi_bits(vi a) { vf r; for (int k = 0; k < 4; k++) r.q[k] = vreinterpretq_f32_s32(a.q[k]); return r; }
KILN_INLINE vm vf_gt(vf a, vf b) { vm r = KILN_4(vcgtq_f32, a, b); return r; }
KILN_INLINE vm vf_ge(vf a, vf b) { vm r = KILN_4(vcgeq_f32, a, b); return r; }
KILN_INLINE vm vf_eq(vf a, vf b) { vm r = KILN_4(vceqq_f32, a, b); return r; }
KILN_INLINE vm vf_unord(vf a, vf b) {
    vm r;
    for (int k = 0; k < 4; k++)
        r.q[k] = vmvnq_u32(vandq_u32(vceqq_f32(a.q[k], a.q[k]), vceqq_f32(b.q[k], b.q[k])));
    return r;
}
KILN_INLINE vf vf_select(vm m, vf a, vf b) {
    vf r; for (int k = 0; k < 4; k++) r.q[k] = vbslq_f32(m.q[k], a.q[k], b.q[k]); return r;
}
KILN_INLINE vf vf_maskz(vm m, vf a) {
    vf r;
    for (int k = 0; k < 4; k++)
        r.q[k] = vreinterpretq_f32_u32(vandq_u32(m.q[k], vreinterpretq_u32_f32(a.q[k])));
    return r;
}
KILN_INLINE vm vm_first(int64_t n) {
    static const int32_t iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const int32x4_t c = vdupq_n_s32((int32_t)(n > 16 ? 16 : n < 0 ? 0 : n));
    vm r; for (int k = 0; k < 4; k++) r.q[k] = vcgtq_s32(c, vld1q_s32(iota + 4 * k));
    return r;
}
KILN_INLINE unsigned vm_bits(vm m) {
    static const uint32_t w[4] = {1, 2, 4, 8};
    const uint32x4_t wv = vld1q_u32(w);
    unsigned b = 0;
    for (int k = 0; k < 4; k++) b |= vaddvq_u32(vandq_u32(m.q[k], wv)) << (4 * k);
    return b;
}
KILN_INLINE vm vm_and(vm a, vm b) { vm r = KILN_4(vandq_u32, a, b); return r; }
KILN_INLINE vf vf_load_n(const float *p, int64_t n) {
    float t[16] = {0};
    if (n > 16) n = 16;
    if (n > 0) memcpy(t, p, (size_t)n * 4);
    return vf_load(t);
}
KILN_INLINE void vf_store_n(float *p, vf v, int64_t n) {
    float t[16];
    vf_store(t, v);
    if (n > 16) n = 16;
    if (n > 0) memcpy(p, t, (size_t)n * 4);
}
#else
#define KILN_L(expr) for (int j = 0; j < 16; j++) expr
KILN_INLINE vf vf_zero(void) { vf r; KILN_L(r.f[j] = 0.0f); return r; }
KILN_INLINE vf vf_set1(float x) { vf r; KILN_L(r.f[j] = x); return r; }
KILN_INLINE vf vf_load(const float *p) { vf r; memcpy(r.f, p, 64); return r; }
KILN_INLINE void vf_store(float *p, vf v) { memcpy(p, v.f, 64); }
KILN_INLINE vf vf_add(vf a, vf b) { vf r; KILN_L(r.f[j] = a.f[j] + b.f[j]); return r; }
KILN_INLINE vf vf_sub(vf a, vf b) { vf r; KILN_L(r.f[j] = a.f[j] - b.f[j]); return r; }
KILN_INLINE vf vf_mul(vf a, vf b) { vf r; KILN_L(r.f[j] = a.f[j] * b.f[j]); return r; }
KILN_INLINE vf vf_div(vf a, vf b) { vf r; KILN_L(r.f[j] = a.f[j] / b.f[j]); return r; }
KILN_INLINE vf vf_max(vf a, vf b) { vf r; KILN_L(r.f[j] = kiln_maxf(a.f[j], b.f[j])); return r; }
KILN_INLINE vf vf_fma(vf a, vf b, vf c) { vf r; KILN_L(r.f[j] = kiln_fmaf(a.f[j], b.f[j], c.f[j])); return r; }
KILN_INLINE vf vf_fnma(vf a, vf b, vf c) { vf r; KILN_L(r.f[j] = kiln_fmaf(-a.f[j], b.f[j], c.f[j])); return r; }
KILN_INLINE vf vf_round(vf a) { vf r; KILN_L(r.f[j] = rintf(a.f[j])); return r; }
KILN_INLINE vf vf_from_i(vi a) { vf r; KILN_L(r.f[j] = (float)a.i[j]); return r; }
KILN_INLINE vi vi_from_f(vf a) { vi r; KILN_L(r.i[j] = (int32_t)a.f[j]); return r; }
KILN_INLINE vi vf_bits(vf a) { vi r; memcpy(r.i, a.f, 64); return r; }
KILN_INLINE vf vi_bits(vi a) { vf r; memcpy(r.f, a.i, 64); return r; }
KILN_INLINE vm vf_gt(vf a, vf b) { vm m = 0; KILN_L(m |= (vm)(a.f[j] > b.f[j]) << j); return m; }
KILN_INLINE vm vf_ge(vf a, vf b) { vm m = 0; KILN_L(m |= (vm)(a.f[j] >= b.f[j]) << j); return m; }
KILN_INLINE vm vf_eq(vf a, vf b) { vm m = 0; KILN_L(m |= (vm)(a.f[j] == b.f[j]) << j); return m; }
KILN_INLINE vm vf_unord(vf a, vf b) {
    vm m = 0; KILN_L(m |= (vm)(a.f[j] != a.f[j] || b.f[j] != b.f[j]) << j); return m;
}
KILN_INLINE vf vf_select(vm m, vf a, vf b) { vf r; KILN_L(r.f[j] = (m >> j) & 1 ? a.f[j] : b.f[j]); return r; }
KILN_INLINE vf vf_maskz(vm m, vf a) { vf r; KILN_L(r.f[j] = (m >> j) & 1 ? a.f[j] : 0.0f); return r; }
KILN_INLINE vm vm_first(int64_t n) { return n >= 16 ? 0xFFFFu : n <= 0 ? 0u : (1u << n) - 1u; }
KILN_INLINE unsigned vm_bits(vm m) { return m; }
KILN_INLINE vm vm_and(vm a, vm b) { return a & b; }
KILN_INLINE vf vf_load_n(const float *p, int64_t n) {
    vf r = vf_zero();
    for (int64_t j = 0; j < n && j < 16; j++) r.f[j] = p[j];
    return r;
}
KILN_INLINE void vf_store_n(float *p, vf v, int64_t n) {
    for (int64_t j = 0; j < n && j < 16; j++) p[j] = v.f[j];
}
#endif

/* lane j = j */
KILN_INLINE vf vf_iota(void) {
    static const float iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return vf_load(iota);
}

/* ---------------------------------------------------------------- vi */
#if defined(KILN_ISA_AVX512)
KILN_INLINE vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
KILN_INLINE vi vi_load(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
KILN_INLINE void vi_store(int32_t *p, vi v) { _mm512_storeu_si512((void *)p, v); }
KILN_INLINE vi vi_load_n(const int32_t *p, int64_t n) { return _mm512_maskz_loadu_epi32(vm_first(n), p); }
KILN_INLINE vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
KILN_INLINE vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
KILN_INLINE vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
KILN_INLINE vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
KILN_INLINE vi vi_xor(vi a, vi b) { return _mm512_xor_si512(a, b); }
KILN_INLINE vi vi_mullo(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
#define vi_srl(a, n) _mm512_srli_epi32((a), (n))
#define vi_sll(a, n) _mm512_slli_epi32((a), (n))
#define vi_sra(a, n) _mm512_srai_epi32((a), (n))
#define vi_rol(a, n) _mm512_rol_epi32((a), (n))
KILN_INLINE vm vi_eq(vi a, vi b) { return _mm512_cmpeq_epi32_mask(a, b); }
KILN_INLINE vm vi_test(vi a, vi b) { return _mm512_test_epi32_mask(a, b); }
KILN_INLINE vi vi_select(vm m, vi a, vi b) { return _mm512_mask_mov_epi32(b, m, a); }
#elif defined(KILN_ISA_AVX2)
KILN_INLINE vi vi_set1(int32_t x) { vi r = { _mm256_set1_epi32(x), _mm256_set1_epi32(x) }; return r; }
KILN_INLINE vi vi_load(const int32_t *p) {
    vi r = { _mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 8)) };
    return r;
}
KILN_INLINE void vi_store(int32_t *p, vi v) {
    _mm256_storeu_si256((__m256i *)p, v.l);
    _mm256_storeu_si256((__m256i *)(p + 8), v.h);
}
KILN_INLINE vi vi_load_n(const int32_t *p, int64_t n) {
    const vm m = vm_first(n);
    vi r = { _mm256_maskload_epi32(p, _mm256_castps_si256(m.l)),
             _mm256_maskload_epi32(p + 8, _mm256_castps_si256(m.h)) };
    return r;
}
KILN_INLINE vi vi_add(vi a, vi b) { vi r = KILN_2(_mm256_add_epi32, a, b); return r; }
KILN_INLINE vi vi_sub(vi a, vi b) { vi r = KILN_2(_mm256_sub_epi32, a, b); return r; }
KILN_INLINE vi vi_and(vi a, vi b) { vi r = KILN_2(_mm256_and_si256, a, b); return r; }
KILN_INLINE vi vi_or(vi a, vi b) { vi r = KILN_2(_mm256_or_si256, a, b); return r; }
KILN_INLINE vi vi_xor(vi a, vi b) { vi r = KILN_2(_mm256_xor_si256, a, b); return r; }
KILN_INLINE vi vi_mullo(vi a, vi b) { vi r = KILN_2(_mm256_mullo_epi32, a, b); return r; }
KILN_INLINE vi vi_srl(vi a, const int n) { vi r = { _mm256_srli_epi32(a.l, n), _mm256_srli_epi32(a.h, n) }; return r; }
KILN_INLINE vi vi_sll(vi a, const int n) { vi r = { _mm256_slli_epi32(a.l, n), _mm256_slli_epi32(a.h, n) }; return r; }
KILN_INLINE vi vi_sra(vi a, const int n) { vi r = { _mm256_srai_epi32(a.l, n), _mm256_srai_epi32(a.h, n) }; return r; }
KILN_INLINE vi vi_rol(vi a, const int n) { return vi_or(vi_sll(a, n), vi_srl(a, 32 - n)); }
KILN_INLINE vm vi_eq(vi a, vi b) {
    vm r = { _mm256_castsi256_ps(_mm256_cmpeq_epi32(a.l, b.l)),
             _mm256_castsi256_ps(_mm256_cmpeq_epi32(a.h, b.h)) };
    return r;
}
KILN_INLINE vm vi_test(vi a, vi b) {
    const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi32(-1);
    vm r = { _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(a.l, b.l), z), ones)),
             _mm256_castsi256_ps(_mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(a.h, b.h), z), ones)) };
    return r;
}
KILN_INLINE vi vi_select(vm m, vi a, vi b) { return vf_bits(vf_select(m, vi_bits(a), vi_bits(b))); }
#elif defined(KILN_ISA_NEON)
KILN_INLINE vi vi_set1(int32_t x) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vdupq_n_s32(x); return r; }
KILN_INLINE vi vi_load(const int32_t *p) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vld1q_s32(p + 4 * k); return r; }
KILN_INLINE void vi_store(int32_t *p, vi v) { for (int k = 0; k < 4; k++) vst1q_s32(p + 4 * k, v.q[k]); }
KILN_INLINE vi vi_load_n(const int32_t *p, int64_t n) {
    int32_t t[16] = {0};
    if (n > 16) n = 16;
    if (n > 0) memcpy(t, p, (size_t)n * 4);
    return vi_load(t);
}
KILN_INLINE vi vi_add(vi a, vi b) { vi r = KILN_4(vaddq_s32, a, b); return r; }
KILN_INLINE vi vi_sub(vi a, vi b) { vi r = KILN_4(vsubq_s32, a, b); return r; }
KILN_INLINE vi vi_and(vi a, vi b) { vi r = KILN_4(vandq_s32, a, b); return r; }
KILN_INLINE vi vi_or(vi a, vi b) { vi r = KILN_4(vorrq_s32, a, b); return r; }
KILN_INLINE vi vi_xor(vi a, vi b) { vi r = KILN_4(veorq_s32, a, b); return r; }
KILN_INLINE vi vi_mullo(vi a, vi b) { vi r = KILN_4(vmulq_s32, a, b); return r; }
KILN_INLINE vi vi_srl(vi a, const int n) {
    vi r;
    for (int k = 0; k < 4; k++)
        r.q[k] = vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a.q[k]), vdupq_n_s32(-n)));
    return r;
}
KILN_INLINE vi vi_sll(vi a, const int n) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vshlq_s32(a.q[k], vdupq_n_s32(n)); return r; }
KILN_INLINE vi vi_sra(vi a, const int n) { vi r; for (int k = 0; k < 4; k++) r.q[k] = vshlq_s32(a.q[k], vdupq_n_s32(-n)); return r; }
KILN_INLINE vi vi_rol(vi a, const int n) { return vi_or(vi_sll(a, n), vi_srl(a, 32 - n)); }
KILN_INLINE vm vi_eq(vi a, vi b) { vm r = KILN_4(vceqq_s32, a, b); return r; }
KILN_INLINE vm vi_test(vi a, vi b) { vm r = KILN_4(vtstq_s32, a, b); return r; }
KILN_INLINE vi vi_select(vm m, vi a, vi b) {
    vi r; for (int k = 0; k < 4; k++) r.q[k] = vbslq_s32(m.q[k], a.q[k], b.q[k]); return r;
}
#else
KILN_INLINE vi vi_set1(int32_t x) { vi r; KILN_L(r.i[j] = x); return r; }
KILN_INLINE vi vi_load(const int32_t *p) { vi r; memcpy(r.i, p, 64); return r; }
KILN_INLINE void vi_store(int32_t *p, vi v) { memcpy(p, v.i, 64); }
KILN_INLINE vi vi_load_n(const int32_t *p, int64_t n) {
    vi r = vi_set1(0);
    for (int64_t j = 0; j < n && j < 16; j++) r.i[j] = p[j];
    return r;
}
#define KILN_U(x) ((uint32_t)(x))
KILN_INLINE vi vi_add(vi a, vi b) { vi r; KILN_L(r.i[j] = (int32_t)(KILN_U(a.i[j]) + KILN_U(b.i[j]))); return r; }
KILN_INLINE vi vi_sub(vi a, vi b) { vi r; KILN_L(r.i[j] = (int32_t)(KILN_U(a.i[j]) - KILN_U(b.i[j]))); return r; }
KILN_INLINE vi vi_and(vi a, vi b) { vi r; KILN_L(r.i[j] = a.i[j] & b.i[j]); return r; }
KILN_INLINE vi vi_or(vi a, vi b) { vi r; KILN_L(r.i[j] = a.i[j] | b.i[j]); return r; }
KILN_INLINE vi vi_xor(vi a, vi b) { vi r; KILN_L(r.i[j] = a.i[j] ^ b.i[j]); return r; }
KILN_INLINE vi vi_mullo(vi a, vi b) { vi r; KILN_L(r.i[j] = (int32_t)(KILN_U(a.i[j]) * KILN_U(b.i[j]))); return r; }
KILN_INLINE vi vi_srl(vi a, int n) { vi r; KILN_L(r.i[j] = (int32_t)(KILN_U(a.i[j]) >> n)); return r; }
KILN_INLINE vi vi_sll(vi a, int n) { vi r; KILN_L(r.i[j] = (int32_t)(KILN_U(a.i[j]) << n)); return r; }
KILN_INLINE vi vi_sra(vi a, int n) { vi r; KILN_L(r.i[j] = a.i[j] >> n); return r; }
KILN_INLINE vi vi_rol(vi a, int n) {
    vi r; KILN_L(r.i[j] = (int32_t)((KILN_U(a.i[j]) << n) | (KILN_U(a.i[j]) >> (32 - n)))); return r;
}
KILN_INLINE vm vi_eq(vi a, vi b) { vm m = 0; KILN_L(m |= (vm)(a.i[j] == b.i[j]) << j); return m; }
KILN_INLINE vm vi_test(vi a, vi b) { vm m = 0; KILN_L(m |= (vm)((a.i[j] & b.i[j]) != 0) << j); return m; }
KILN_INLINE vi vi_select(vm m, vi a, vi b) { vi r; KILN_L(r.i[j] = (m >> j) & 1 ? a.i[j] : b.i[j]); return r; }
#endif

/* lane j = j */
KILN_INLINE vi vi_iota(void) {
    static const int32_t iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return vi_load(iota);
}

/* ---------------------------------------------------------------- vb: 16 bytes */
#if defined(KILN_ISA_AVX512) || defined(KILN_ISA_AVX2)
KILN_INLINE vb vb_load(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
KILN_INLINE vb vb_set1(uint8_t x) { return _mm_set1_epi8((char)x); }
/* bytes 0..7 = lo's, 8..15 = hi's (little-endian) */
KILN_INLINE vb vb_from_u64(uint64_t lo, uint64_t hi) { return _mm_set_epi64x((long long)hi, (long long)lo); }
KILN_INLINE vb vb_and(vb a, vb b) { return _mm_and_si128(a, b); }
KILN_INLINE vb vb_or(vb a, vb b) { return _mm_or_si128(a, b); }
KILN_INLINE vb vb_sub8(vb a, vb b) { return _mm_sub_epi8(a, b); }
/* the bytes as 8 little-endian uint16 lanes, shifted (bits cross from the higher byte) */
#define vb_srl16(a, n) _mm_srli_epi16((a), (n))
#define vb_sll16(a, n) _mm_slli_epi16((a), (n))
#elif defined(KILN_ISA_NEON)
KILN_INLINE vb vb_load(const uint8_t *p) { return vld1q_u8(p); }
KILN_INLINE vb vb_set1(uint8_t x) { return vdupq_n_u8(x); }
KILN_INLINE vb vb_from_u64(uint64_t lo, uint64_t hi) {
    return vreinterpretq_u8_u64(vcombine_u64(vcreate_u64(lo), vcreate_u64(hi)));
}
KILN_INLINE vb vb_and(vb a, vb b) { return vandq_u8(a, b); }
KILN_INLINE vb vb_or(vb a, vb b) { return vorrq_u8(a, b); }
KILN_INLINE vb vb_sub8(vb a, vb b) { return vsubq_u8(a, b); }
KILN_INLINE vb vb_srl16(vb a, const int n) {
    return vreinterpretq_u8_u16(vshlq_u16(vreinterpretq_u16_u8(a), vdupq_n_s16((int16_t)-n)));
}
KILN_INLINE vb vb_sll16(vb a, const int n) {
    return vreinterpretq_u8_u16(vshlq_u16(vreinterpretq_u16_u8(a), vdupq_n_s16((int16_t)n)));
}
#else
KILN_INLINE vb vb_load(const uint8_t *p) { vb r; memcpy(r.b, p, 16); return r; }
KILN_INLINE vb vb_set1(uint8_t x) { vb r; memset(r.b, x, 16); return r; }
KILN_INLINE vb vb_from_u64(uint64_t lo, uint64_t hi) {
    vb r;
    for (int j = 0; j < 8; j++) r.b[j] = (uint8_t)(lo >> (8 * j)), r.b[8 + j] = (uint8_t)(hi >> (8 * j));
    return r;
}
KILN_INLINE vb vb_and(vb a, vb b) { vb r; KILN_L(r.b[j] = a.b[j] & b.b[j]); return r; }
KILN_INLINE vb vb_or(vb a, vb b) { vb r; KILN_L(r.b[j] = a.b[j] | b.b[j]); return r; }
KILN_INLINE vb vb_sub8(vb a, vb b) { vb r; KILN_L(r.b[j] = (uint8_t)(a.b[j] - b.b[j])); return r; }
KILN_INLINE vb vb_srl16(vb a, int n) {
    vb r;
    for (int j = 0; j < 16; j += 2) {
        const uint16_t u = (uint16_t)((a.b[j] | a.b[j + 1] << 8) >> n);
        r.b[j] = (uint8_t)u, r.b[j + 1] = (uint8_t)(u >> 8);
    }
    return r;
}
KILN_INLINE vb vb_sll16(vb a, int n) {
    vb r;
    for (int j = 0; j < 16; j += 2) {
        const uint16_t u = (uint16_t)((a.b[j] | a.b[j + 1] << 8) << n);
        r.b[j] = (uint8_t)u, r.b[j + 1] = (uint8_t)(u >> 8);
    }
    return r;
}
#endif

/* ---------------------------------------------------------------- widening */
#if defined(KILN_ISA_AVX512)
KILN_INLINE vi vi_from_u8(vb b) { return _mm512_cvtepu8_epi32(b); }
KILN_INLINE vi vi_from_i8(vb b) { return _mm512_cvtepi8_epi32(b); }
/* 16 uint16 at p, zero-extended */
KILN_INLINE vi vi_load_u16(const void *p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
/* 16 IEEE halves at p, widened exactly */
KILN_INLINE vf vf_load_f16(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* 16 lanes as IEEE halves at p, rounded to nearest even */
KILN_INLINE void vf_store_f16(void *p, vf v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(KILN_ISA_AVX2)
KILN_INLINE vi vi_from_u8(vb b) { vi r = { _mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)) }; return r; }
KILN_INLINE vi vi_from_i8(vb b) { vi r = { _mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)) }; return r; }
KILN_INLINE vi vi_load_u16(const void *p) {
    vi r = { _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)),
             _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const char *)p + 16))) };
    return r;
}
KILN_INLINE vf vf_load_f16(const void *p) {
    vf r = { _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const char *)p + 16))) };
    return r;
}
KILN_INLINE void vf_store_f16(void *p, vf v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v.l, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)((char *)p + 16), _mm256_cvtps_ph(v.h, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(KILN_ISA_NEON)
KILN_INLINE vi vi_from_u8(vb b) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
    vi r = { { vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo))), vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(lo))),
               vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi))), vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(hi))) } };
    return r;
}
KILN_INLINE vi vi_from_i8(vb b) {
    const int8x16_t s = vreinterpretq_s8_u8(b);
    const int16x8_t lo = vmovl_s8(vget_low_s8(s)), hi = vmovl_s8(vget_high_s8(s));
    vi r = { { vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)),
               vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi)) } };
    return r;
}
KILN_INLINE vi vi_load_u16(const void *p) {
    const uint16_t *h = (const uint16_t *)p;
    vi r;
    for (int k = 0; k < 4; k++) r.q[k] = vreinterpretq_s32_u32(vmovl_u16(vld1_u16(h + 4 * k)));
    return r;
}
KILN_INLINE vf vf_load_f16(const void *p) {
    const uint16_t *h = (const uint16_t *)p;
    vf r;
    for (int k = 0; k < 4; k++) r.q[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + 4 * k)));
    return r;
}
KILN_INLINE void vf_store_f16(void *p, vf v) {
    uint16_t *h = (uint16_t *)p;
    for (int k = 0; k < 4; k++) vst1_u16(h + 4 * k, vreinterpret_u16_f16(vcvt_f16_f32(v.q[k])));
}
#else
KILN_INLINE vi vi_from_u8(vb b) { vi r; KILN_L(r.i[j] = b.b[j]); return r; }
KILN_INLINE vi vi_from_i8(vb b) { vi r; KILN_L(r.i[j] = (int8_t)b.b[j]); return r; }
KILN_INLINE vi vi_load_u16(const void *p) {
    uint16_t h[16];
    memcpy(h, p, 32);
    vi r; KILN_L(r.i[j] = h[j]); return r;
}
KILN_INLINE vf vf_load_f16(const void *p) {
    uint16_t h[16];
    memcpy(h, p, 32);
    vf r; KILN_L(r.f[j] = kiln_half_to_float(h[j])); return r;
}
KILN_INLINE void vf_store_f16(void *p, vf v) {
    uint16_t h[16];
    KILN_L(h[j] = kiln_float_to_half(v.f[j]));
    memcpy(p, h, 32);
}
#endif
/* 16 bytes at p, widened */
KILN_INLINE vi vi_load_u8(const uint8_t *p) { return vi_from_u8(vb_load(p)); }
KILN_INLINE vi vi_load_i8(const uint8_t *p) { return vi_from_i8(vb_load(p)); }
/* 16 bfloat16 at p: the upper halves of float32, exact */
KILN_INLINE vf vf_load_bf16(const void *p) { return vi_bits(vi_sll(vi_load_u16(p), 16)); }

/* ---------------------------------------------------------------- table lookups */
/* lane j = tab[idx[j] & 15] */
KILN_INLINE vf vf_lookup16(vf tab, vi idx) {
#if defined(KILN_ISA_AVX512)
    return _mm512_permutexvar_ps(idx, tab);
#elif defined(KILN_ISA_AVX2)
    /* each half: from the table's lanes 0..7 and 8..15, picked by bit 3 */
    const __m256i b3 = _mm256_set1_epi32(8);
    const __m256 sl = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(idx.l, b3), 28));
    const __m256 sh = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(idx.h, b3), 28));
    vf r = { _mm256_blendv_ps(_mm256_permutevar8x32_ps(tab.l, idx.l),
                              _mm256_permutevar8x32_ps(tab.h, idx.l), sl),
             _mm256_blendv_ps(_mm256_permutevar8x32_ps(tab.l, idx.h),
                              _mm256_permutevar8x32_ps(tab.h, idx.h), sh) };
    return r;
#elif defined(KILN_ISA_NEON)
    /* byte table lookup: lane j's 4 bytes are tab bytes 4 (idx & 15) .. + 3 */
    const uint8x16x4_t t = { { vreinterpretq_u8_f32(tab.q[0]), vreinterpretq_u8_f32(tab.q[1]),
                              vreinterpretq_u8_f32(tab.q[2]), vreinterpretq_u8_f32(tab.q[3]) } };
    const uint32x4_t off = vreinterpretq_u32_u8(vcombine_u8(vcreate_u8(0x0302010003020100ull),
                                                            vcreate_u8(0x0302010003020100ull)));
    vf r;
    for (int k = 0; k < 4; k++) {
        const uint32x4_t i = vandq_u32(vreinterpretq_u32_s32(idx.q[k]), vdupq_n_u32(15));
        const uint32x4_t bytes = vaddq_u32(vmulq_n_u32(i, 0x04040404u), off);
        r.q[k] = vreinterpretq_f32_u8(vqtbl4q_u8(t, vreinterpretq_u8_u32(bytes)));
    }
    return r;
#else
    vf r; KILN_L(r.f[j] = tab.f[idx.i[j] & 15]); return r;
#endif
}

/* lane j = (lo | hi)[idx[j] & 31]: a 32-entry table */
KILN_INLINE vf vf_lookup32(vf lo, vf hi, vi idx) {
#if defined(KILN_ISA_AVX512)
    return _mm512_permutex2var_ps(lo, idx, hi);
#elif defined(KILN_ISA_PLAIN)
    vf r; KILN_L(r.f[j] = (idx.i[j] & 16) ? hi.f[idx.i[j] & 15] : lo.f[idx.i[j] & 15]); return r;
#else
    return vf_select(vi_test(idx, vi_set1(16)), vf_lookup16(hi, idx), vf_lookup16(lo, idx));
#endif
}

/* ---------------------------------------------------------------- reductions */
/* The sum of the 16 lanes by the one tree: t_j = v_j + v_{j+8}, u_j = t_j + t_{j+4},
 * w_j = u_j + u_{j+2}, w_0 + w_1. */
KILN_INLINE float vf_hsum(vf v) {
#if defined(KILN_ISA_AVX512)
    return _mm512_reduce_add_ps(v); /* GCC's and clang's: halves, the same tree */
#elif defined(KILN_ISA_AVX2)
    const __m256 t = _mm256_add_ps(v.l, v.h);
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
#elif defined(KILN_ISA_NEON)
    const float32x4_t u = vaddq_f32(vaddq_f32(v.q[0], v.q[2]), vaddq_f32(v.q[1], v.q[3]));
    const float32x2_t w = vadd_f32(vget_low_f32(u), vget_high_f32(u));
    return vget_lane_f32(w, 0) + vget_lane_f32(w, 1);
#else
    float t[8], u[4], w[2];
    for (int j = 0; j < 8; j++) t[j] = v.f[j] + v.f[j + 8];
    for (int j = 0; j < 4; j++) u[j] = t[j] + t[j + 4];
    for (int j = 0; j < 2; j++) w[j] = u[j] + u[j + 2];
    return w[0] + w[1];
#endif
}

/* The largest lane (max is exact: any order; lanes compared with kiln_maxf). */
KILN_INLINE float vf_hmax(vf v) {
    float t[16];
    vf_store(t, v);
    float m = t[0];
    for (int j = 1; j < 16; j++) m = kiln_maxf(t[j], m);
    return m;
}

/* out[0..3] = vf_hsum of a, b, c, d (the same tree each). */
KILN_INLINE void vf_hsum4(vf a, vf b, vf c, vf d, float *out) {
#if defined(KILN_ISA_AVX512)
    /* ab = [a j+(j+8) for j < 8 | b likewise] */
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    /* v = [a, b, c, d] 4 lanes each: + (j+4), + (j+2), + (j+1) */
    __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, v)));
#elif defined(KILN_ISA_AVX2)
    const __m256 ta = _mm256_add_ps(a.l, a.h), tb = _mm256_add_ps(b.l, b.h);
    const __m256 tc = _mm256_add_ps(c.l, c.h), td = _mm256_add_ps(d.l, d.h);
    /* u: [a 0..3 | b 0..3], [c | d] */
    const __m256 uab = _mm256_add_ps(_mm256_permute2f128_ps(ta, tb, 0x20), _mm256_permute2f128_ps(ta, tb, 0x31));
    const __m256 ucd = _mm256_add_ps(_mm256_permute2f128_ps(tc, td, 0x20), _mm256_permute2f128_ps(tc, td, 0x31));
    /* w: per 128-bit lane [x0+x2, x1+x3, y0+y2, y1+y3] with x = a|b, y = c|d */
    const __m256 w = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(uab), _mm256_castps_pd(ucd))),
                                   _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(uab), _mm256_castps_pd(ucd))));
    /* s: per lane [x, y] sums: lane 0 = [a, c], lane 1 = [b, d] */
    const __m256 s = _mm256_add_ps(w, _mm256_permute_ps(w, 0xB1));
    const __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
    /* lo = [a, a', c, c'] (sums at 0 and 2), hi = [b, b', d, d'] */
    _mm_storeu_ps(out, _mm_unpacklo_ps(_mm_shuffle_ps(lo, lo, 0x08), _mm_shuffle_ps(hi, hi, 0x08)));
#else
    out[0] = vf_hsum(a), out[1] = vf_hsum(b), out[2] = vf_hsum(c), out[3] = vf_hsum(d);
#endif
}

/* lane o = vf_hsum(v[o]) for 16 vectors (the same tree each). */
KILN_INLINE vf vf_hsum16(const vf *v) {
#if defined(KILN_ISA_AVX512)
    /* t: [t(v2i) | t(v2i+1)] 8 lanes each */
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    /* u: 128-bit lane L = u(v(4i + L)) */
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    /* w: lane L = [w0, w1 of v(8i + L), w0, w1 of v(8i + 4 + L)] */
    for (int i = 0; i < 2; i++) {
        const __m512d x = _mm512_castps_pd(u[2 * i]), y = _mm512_castps_pd(u[2 * i + 1]);
        w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* s: lane L = [v(L), v(4 + L), v(8 + L), v(12 + L)] */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, s);
#elif defined(KILN_ISA_AVX2)
    /* In registers (four vf_hsum4 through memory stalled on store forwarding: 16-byte stores
     * read back by 32-byte loads), the same tree: per 8 vectors a..h, t = l + h, then
     * u_i = t_i + t_(i+4) in 128-bit halves of pairs, w_i = u_i + u_(i+2) with 64-bit unpacks,
     * s = w_0 + w_1 with shuffles: [a c e g | b d f h], put in order by one permute. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256 half[2];
    for (int e = 0; e < 2; e++) {
        const vf *x = v + 8 * e;
        __m256 u[4], w[2];
        for (int i = 0; i < 4; i++) {
            const __m256 ta = _mm256_add_ps(x[2 * i].l, x[2 * i].h);
            const __m256 tb = _mm256_add_ps(x[2 * i + 1].l, x[2 * i + 1].h);
            u[i] = _mm256_add_ps(_mm256_permute2f128_ps(ta, tb, 0x20),
                                 _mm256_permute2f128_ps(ta, tb, 0x31));
        }
        for (int i = 0; i < 2; i++) {
            const __m256d p = _mm256_castps_pd(u[2 * i]), q = _mm256_castps_pd(u[2 * i + 1]);
            w[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(p, q)),
                                 _mm256_castpd_ps(_mm256_unpackhi_pd(p, q)));
        }
        const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], 0x88),
                                         _mm256_shuffle_ps(w[0], w[1], 0xDD));
        half[e] = _mm256_permutevar8x32_ps(sum, order);
    }
    vf r = { half[0], half[1] };
    return r;
#else
    float out[16];
    for (int o = 0; o < 16; o += 4) vf_hsum4(v[o], v[o + 1], v[o + 2], v[o + 3], out + o);
    return vf_load(out);
#endif
}

/* ---------------------------------------------------------------- gathers and compress */
/* lane j = m_j ? base[idx_j] : fallback_j */
KILN_INLINE vf vf_gather(const float *base, vi idx, vm m, vf fallback) {
#if defined(KILN_ISA_AVX512)
    return _mm512_mask_i32gather_ps(fallback, m, idx, base, 4);
#else
    int32_t i[16];
    float f[16];
    vi_store(i, idx);
    vf_store(f, fallback);
    const unsigned bits = vm_bits(m);
    for (int j = 0; j < 16; j++)
        if ((bits >> j) & 1) f[j] = base[i[j]];
    return vf_load(f);
#endif
}

/* The lanes of m, in order, to dst; returns how many. */
KILN_INLINE int vf_compress_store(float *dst, vm m, vf v) {
#if defined(KILN_ISA_AVX512)
    _mm512_mask_compressstoreu_ps(dst, m, v);
    return __builtin_popcount((unsigned)m);
#else
    float f[16];
    vf_store(f, v);
    int n = 0;
    for (unsigned bits = vm_bits(m); bits; bits &= bits - 1) dst[n++] = f[__builtin_ctz(bits)];
    return n;
#endif
}

KILN_INLINE int vi_compress_store(int32_t *dst, vm m, vi v) {
#if defined(KILN_ISA_AVX512)
    _mm512_mask_compressstoreu_epi32(dst, m, v);
    return __builtin_popcount((unsigned)m);
#else
    int32_t f[16];
    vi_store(f, v);
    int n = 0;
    for (unsigned bits = vm_bits(m); bits; bits &= bits - 1) dst[n++] = f[__builtin_ctz(bits)];
    return n;
#endif
}

/* ---------------------------------------------------------------- e^x and ln x */
#define KILN_LOG2E 1.44269504f
#define KILN_LN2_HI 0.693145752f
#define KILN_LN2_LO 1.42860677e-6f

/* p * 2^n for integer-valued n (p in [0.5, 2]; the results e^x needs: normal or +inf), one
 * rounding as AVX-512's scalef. */
KILN_INLINE vf vf_scale2(vf p, vf n) {
#if defined(KILN_ISA_AVX512)
    return _mm512_scalef_ps(p, n);
#else
    /* n clamped to [-252, 254] (beyond it the result is +inf / 0 either way), split in two
     * powers of two: the first product is exact, the second rounds once */
    const vf c = vf_max(vf_set1(-252.0f), vf_select(vf_gt(n, vf_set1(254.0f)), vf_set1(254.0f), n));
    const vi k = vi_from_f(c), h = vi_sra(k, 1), bias = vi_set1(127);
    return vf_mul(vf_mul(p, vi_bits(vi_sll(vi_add(h, bias), 23))),
                  vi_bits(vi_sll(vi_add(vi_sub(k, h), bias), 23)));
#endif
}

/* e^x for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by a degree-6 polynomial, times 2^n.
 * Relative error ~2e-7 for x <= 88 (the softmax range x <= 0 included); x below -87 is taken
 * as -87 (e^-87 > 0: a kept token's weight never vanishes), x > 88.7 gives +inf. */
KILN_INLINE vf vf_exp(vf x) {
    x = vf_max(x, vf_set1(-87.0f));
    const vf n = vf_round(vf_mul(x, vf_set1(KILN_LOG2E)));
    vf r = vf_fnma(n, vf_set1(KILN_LN2_HI), x);
    r = vf_fnma(n, vf_set1(KILN_LN2_LO), r);
    vf p = vf_set1(1.0f / 720);
    p = vf_fma(p, r, vf_set1(1.0f / 120));
    p = vf_fma(p, r, vf_set1(1.0f / 24));
    p = vf_fma(p, r, vf_set1(1.0f / 6));
    p = vf_fma(p, r, vf_set1(0.5f));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_fma(p, r, vf_set1(1.0f));
    return vf_scale2(p, n);
}

/* ln x for 16 positive normal lanes: x = 2^e m, m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t),
 * t = (m - 1) / (m + 1), |t| < 0.172, by its series to t^9 (relative error < 1e-9 + rounding). */
KILN_INLINE vf vf_log(vf x) {
    const vi bits = vf_bits(x);
    vf e = vf_from_i(vi_sub(vi_and(vi_srl(bits, 23), vi_set1(0xFF)), vi_set1(127)));
    vf m = vi_bits(vi_or(vi_and(bits, vi_set1(0x007FFFFF)), vi_set1(0x3F800000)));
    const vm hi = vf_gt(m, vf_set1(1.41421356f));
    m = vf_select(hi, vf_mul(m, vf_set1(0.5f)), m);
    e = vf_select(hi, vf_add(e, vf_set1(1.0f)), e);
    const vf one = vf_set1(1.0f);
    const vf t = vf_div(vf_sub(m, one), vf_add(m, one));
    const vf t2 = vf_mul(t, t);
    vf p = vf_set1(1.0f / 9);
    p = vf_fma(p, t2, vf_set1(1.0f / 7));
    p = vf_fma(p, t2, vf_set1(1.0f / 5));
    p = vf_fma(p, t2, vf_set1(1.0f / 3));
    p = vf_fma(p, t2, one);
    const vf lnm = vf_mul(vf_add(t, t), p);
    return vf_fma(e, vf_set1(0.693147182f), vf_fma(e, vf_set1(-1.90465421e-9f), lnm));
}

/* One lane of vf_exp / vf_log: the same operations, so the same bits. */
KILN_INLINE float kiln_exp(float x) {
    x = kiln_maxf(x, -87.0f);
    const float n = rintf(x * KILN_LOG2E);
    float r = kiln_fmaf(-n, KILN_LN2_HI, x);
    r = kiln_fmaf(-n, KILN_LN2_LO, r);
    float p = 1.0f / 720;
    p = kiln_fmaf(p, r, 1.0f / 120);
    p = kiln_fmaf(p, r, 1.0f / 24);
    p = kiln_fmaf(p, r, 1.0f / 6);
    p = kiln_fmaf(p, r, 0.5f);
    p = kiln_fmaf(p, r, 1.0f);
    p = kiln_fmaf(p, r, 1.0f);
    const float c = n > 254.0f ? 254.0f : kiln_maxf(n, -252.0f);
    const int32_t k = (int32_t)c, h = k >> 1;
    return p * kiln_bits_f((uint32_t)(h + 127) << 23) * kiln_bits_f((uint32_t)(k - h + 127) << 23);
}

KILN_INLINE float kiln_log(float x) {
    const uint32_t bits = kiln_f_bits(x);
    float e = (float)((int32_t)((bits >> 23) & 0xFF) - 127);
    float m = kiln_bits_f((bits & 0x007FFFFFu) | 0x3F800000u);
    if (m > 1.41421356f) m = m * 0.5f, e = e + 1.0f;
    const float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float p = 1.0f / 9;
    p = kiln_fmaf(p, t2, 1.0f / 7);
    p = kiln_fmaf(p, t2, 1.0f / 5);
    p = kiln_fmaf(p, t2, 1.0f / 3);
    p = kiln_fmaf(p, t2, 1.0f);
    const float lnm = (t + t) * p;
    return kiln_fmaf(e, 0.693147182f, kiln_fmaf(e, -1.90465421e-9f, lnm));
}

/* ---------------------------------------------------------------- memory and FP state */
/* Prefetch the cache line at p. An asm statement, not __builtin_prefetch: GCC 12 at -O1 and
 * above deletes a loop whose body is only __builtin_prefetch. */
KILN_INLINE void kiln_prefetch(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#elif defined(__aarch64__)
    __asm__ volatile("prfm pldl1keep, %0" : : "Q"(*(const char *)p));
#else
    (void)p;
#endif
}

/* Denormals flushed to zero (inputs and results) for the C step, restored after: peaked softmax
 * weights underflow, and each denormal operand costs a microcode assist on x86 (a peaked
 * 130-position attention task measured 38 us against 2 us). Values this small (< 1.2e-38) do not
 * move any float32 result that is not itself that small. Every build flushes alike. */
KILN_INLINE uint64_t kiln_fp_flush_enter(void) {
#if defined(__x86_64__) || defined(__i386__)
    uint32_t csr;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    const uint32_t on = csr | 0x8040u; /* FTZ | DAZ */
    __asm__ volatile("ldmxcsr %0" : : "m"(on));
    return csr;
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    const uint64_t on = fpcr | (1ull << 24); /* FZ */
    __asm__ volatile("msr fpcr, %0" : : "r"(on));
    return fpcr;
#else
    return 0;
#endif
}

KILN_INLINE void kiln_fp_flush_leave(uint64_t saved) {
#if defined(__x86_64__) || defined(__i386__)
    const uint32_t csr = (uint32_t)saved;
    __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(saved));
#else
    (void)saved;
#endif
}

/* ---- matmul: masks from bits, one half, eight halves (matmul/blocks*.h) */
/* lane j set where bit j of b is */
KILN_INLINE vm vm_from_bits(unsigned b) {
#if defined(KILN_ISA_AVX512)
    return (__mmask16)b;
#elif defined(KILN_ISA_AVX2)
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i lo = _mm256_set1_epi32((int32_t)(b & 0xFFu)), hi = _mm256_set1_epi32((int32_t)((b >> 8) & 0xFFu));
    vm r = { _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(lo, bit), bit)),
             _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(hi, bit), bit)) };
    return r;
#elif defined(KILN_ISA_NEON)
    static const int32_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
    const int32x4_t v = vdupq_n_s32((int32_t)(b & 0xFFFFu));
    vm r; for (int k = 0; k < 4; k++) r.q[k] = vtstq_s32(v, vld1q_s32(bit + 4 * k));
    return r;
#else
    return (vm)(b & 0xFFFFu);
#endif
}

/* The IEEE half at p (any alignment) as float32: exact, the same bits as kiln_half_to_float. */
KILN_INLINE float kiln_half_load(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(KILN_ISA_AVX512) || defined(KILN_ISA_AVX2)
    return _cvtsh_ss(h);
#elif defined(KILN_ISA_NEON)
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
#else
    return kiln_half_to_float(h);
#endif
}

/* lanes 0..7 = the 8 IEEE halves in b (little-endian), widened exactly; lanes 8..15 = 0 */
KILN_INLINE vf vf_from_f16x8(vb b) {
#if defined(KILN_ISA_AVX512)
    return _mm512_zextps256_ps512(_mm256_cvtph_ps(b));
#elif defined(KILN_ISA_AVX2)
    vf r = { _mm256_cvtph_ps(b), _mm256_setzero_ps() }; return r;
#elif defined(KILN_ISA_NEON)
    const uint16x8_t h = vreinterpretq_u16_u8(b);
    vf r = { { vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h))),
               vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h))), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f) } };
    return r;
#else
    vf r;
    KILN_L(r.f[j] = j < 8 ? kiln_half_to_float((uint16_t)(b.b[2 * j] | b.b[2 * j + 1] << 8)) : 0.0f);
    return r;
#endif
}

/* lane j = d * (idx_j & 15) + m, one rounding (a 16-entry table of an affine map: one
 * permute of the table on AVX-512, the arithmetic elsewhere; the same fma either way) */
KILN_INLINE vf vf_affine16(float d, float m, vi idx) {
#if defined(KILN_ISA_AVX512)
    return _mm512_permutexvar_ps(idx, _mm512_fmadd_ps(_mm512_set1_ps(d), vf_iota(), _mm512_set1_ps(m)));
#else
    return vf_fma(vf_set1(d), vf_from_i(vi_and(idx, vi_set1(15))), vf_set1(m));
#endif
}

/* lane j = d * (idx_j & 31) + m, one rounding (a 32-entry table of an affine map) */
KILN_INLINE vf vf_affine32(float d, float m, vi idx) {
#if defined(KILN_ISA_AVX512)
    const __m512 vd = _mm512_set1_ps(d), vmn = _mm512_set1_ps(m), io = vf_iota();
    return _mm512_permutex2var_ps(_mm512_fmadd_ps(vd, io, vmn), idx,
                                  _mm512_fmadd_ps(vd, _mm512_add_ps(io, _mm512_set1_ps(16.0f)), vmn));
#else
    return vf_fma(vf_set1(d), vf_from_i(vi_and(idx, vi_set1(31))), vf_set1(m));
#endif
}

#endif
