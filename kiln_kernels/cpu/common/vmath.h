/* Vector math shared by the C kernels, inline where it is used: dot products, e^x and ln x in 16
 * lanes (AVX-512; libm elsewhere), SiLU, the softmax's exp sums, IEEE half conversions and the
 * KV cache's row store. Each function is small and sits in the inner loops of the step and the
 * sampler, so every file that includes this one gets its own inlined copy. */
#ifndef KILN_VMATH_H
#define KILN_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

#if defined(__AVX512F__)
#include <immintrin.h>
/* e^x for 16 lanes: x = n ln2 + r (|r| <= ln2 / 2), e^r by a degree-6 polynomial, times 2^n
 * (scalef). Relative error ~2e-7 for x <= 88 (the softmax range x <= 0 included); -inf gives 0,
 * x > 88.7 gives +inf. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* ln x for 16 positive normal lanes: x = 2^e m, m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(t),
 * t = (m - 1) / (m + 1), |t| < 0.172, by its series to t^9 (relative error < 1e-9 + rounding). */
static inline __m512 log16(__m512 x) {
    __m512 e = _mm512_getexp_ps(x);
    __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
    const __mmask16 hi = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, hi, m, _mm512_set1_ps(0.5f));
    e = _mm512_mask_add_ps(e, hi, e, _mm512_set1_ps(1.0f));
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
    const __m512 t2 = _mm512_mul_ps(t, t);
    __m512 p = _mm512_set1_ps(1.0f / 9);
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 7));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 5));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(1.0f / 3));
    p = _mm512_fmadd_ps(p, t2, one);
    const __m512 lnm = _mm512_mul_ps(_mm512_add_ps(t, t), p);
    return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693147182f),
                           _mm512_fmadd_ps(e, _mm512_set1_ps(-1.90465421e-9f), lnm));
}
#endif

/* sum a[i] * b[i] (vectorized; one fixed order per n). */
static inline float kiln_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i]. */
static inline void kiln_silu_mul(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)),
                                                _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* scores[p] = exp(scores[p] - top) for p < len; returns their sum. */
static inline float kiln_exp_shift_sum(float *scores, int64_t len, float top) {
    int64_t p = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    const __m512 vt = _mm512_set1_ps(top);
    for (; p + 16 <= len; p += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + p), vt));
        _mm512_storeu_ps(scores + p, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (p < len) {
        const __mmask16 k = (__mmask16)((1u << (len - p)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, scores + p), vt));
        _mm512_mask_storeu_ps(scores + p, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
        p = len;
    }
    sum = _mm512_reduce_add_ps(acc);
#endif
    for (; p < len; p++) {
        scores[p] = expf(scores[p] - top);
        sum += scores[p];
    }
    return sum;
}

/* n floats into a KV cache row: float32 (f16 = 0) or IEEE half (f16 = 1). */
static inline void kiln_store_kv(void *dst, const float *src, int64_t n, int f16) {
    if (!f16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) h[i] = kiln_float_to_half(src[i]);
}

#endif
