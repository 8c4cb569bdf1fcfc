/* Vector math shared by the C step's files: dot products, SiLU and the softmax's exp sums
 * (exp16, vmath.h, on AVX-512; libm elsewhere). */
#include <math.h>
#include <stdint.h>

#include "vmath.h"

float kiln_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i]. */
void kiln_silu_mul(const float *g, const float *u, float *out, int64_t n) {
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
float kiln_exp_shift_sum(float *scores, int64_t len, float top) {
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
