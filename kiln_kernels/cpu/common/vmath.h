/* Vector math shared by the C kernels, inline where it is used: dot products, SiLU, the
 * softmax's exp sums, the KV cache's row store and the rotary table's cos / sin. Written once on
 * the ISA layer (isa.h): each function runs one fixed order of operations on 16 logical lanes,
 * so it gives the same bits on every build. Each function is small and sits in the inner loops
 * of the step, so every file that includes this one gets its own inlined copy. */
#ifndef KILN_VMATH_H
#define KILN_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

/* sum a[i] * b[i]: 16 lanes fma-accumulated from zero in order (the tail zero-filled), then
 * vf_hsum's tree. One fixed order for every n, on every build. */
static inline float kiln_dot(const float *a, const float *b, int64_t n) {
    vf acc = vf_zero();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = vf_fma(vf_load(a + i), vf_load(b + i), acc);
    if (i < n) acc = vf_fma(vf_load_n(a + i, n - i), vf_load_n(b + i, n - i), acc);
    return vf_hsum(acc);
}

/* out[i] = silu(g[i]) * u[i] = g[i] / (1 + e^-g[i]) * u[i] (the layer's e^x). */
static inline void kiln_silu_mul(const float *g, const float *u, float *out, int64_t n) {
    const vf one = vf_set1(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const vf x = vf_load(g + i);
        const vf e = vf_exp(vf_sub(vf_zero(), x));
        vf_store(out + i, vf_mul(vf_div(x, vf_add(one, e)), vf_load(u + i)));
    }
    if (i < n) {
        const vf x = vf_load_n(g + i, n - i);
        const vf e = vf_exp(vf_sub(vf_zero(), x));
        vf_store_n(out + i, vf_mul(vf_div(x, vf_add(one, e)), vf_load_n(u + i, n - i)), n - i);
    }
}

/* scores[p] = exp(scores[p] - top) for p < len (the layer's e^x); returns their sum: 16 lanes
 * added in order (the tail's unused lanes zero), then vf_hsum's tree. */
static inline float kiln_exp_shift_sum(float *scores, int64_t len, float top) {
    vf acc = vf_zero();
    const vf vt = vf_set1(top);
    int64_t p = 0;
    for (; p + 16 <= len; p += 16) {
        const vf e = vf_exp(vf_sub(vf_load(scores + p), vt));
        vf_store(scores + p, e);
        acc = vf_add(acc, e);
    }
    if (p < len) {
        const vf e = vf_maskz(vm_first(len - p), vf_exp(vf_sub(vf_load_n(scores + p, len - p), vt)));
        vf_store_n(scores + p, e, len - p);
        acc = vf_add(acc, e);
    }
    return vf_hsum(acc);
}

/* n floats into a KV cache row: float32 (f16 = 0) or IEEE half (f16 = 1, rounded to nearest
 * even). */
static inline void kiln_store_kv(void *dst, const float *src, int64_t n, int f16) {
    if (!f16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) vf_store_f16(h + i, vf_load(src + i));
    if (i < n) {
        uint16_t t[16];
        vf_store_f16(t, vf_load_n(src + i, n - i));
        memcpy(h + i, t, (size_t)(n - i) * sizeof(uint16_t));
    }
}

/* cos x and sin x of a float32 x, each rounded to float32 once from a double evaluation: x
 * reduced by pi/2 in double (k = x * 2/pi to nearest, r = x - k pi/2 with pi/2 in three parts,
 * each step one fma: r within a few double ulps of the true one for |x| < 2^30), then Taylor
 * polynomials in r^2 on |r| <= pi/4 (truncation < 1e-16 relative), so the float results are
 * the correctly rounded cos and sin but for values within ~1e-15 of a rounding midpoint (none
 * in 3M random angles up to 131072, against float64 cos / sin). Only IEEE double
 * operations and fma (__builtin_fma: correctly rounded, in hardware or libm's), no libm
 * cos/sin, so the same bits on every build. */
static inline void kiln_cos_sin(float x, float *c_out, float *s_out) {
    const double PIO2_1 = 1.5707963267948966;                  /* pi/2 in double */
    const double PIO2_2 = 6.1232339957367658e-17;              /* pi/2 - PIO2_1 */
    const double PIO2_3 = -1.4973849048591698e-33;             /* the next part */
    const double TWO_OVER_PI = 0.6366197723675814;
    const double SHIFTER = 6755399441055744.0;                 /* 1.5 * 2^52: round to integer */
    const double xd = (double)x;
    const double k = (xd * TWO_OVER_PI + SHIFTER) - SHIFTER; /* |x| < 2^50 */
    double r = __builtin_fma(-k, PIO2_1, xd);
    r = __builtin_fma(-k, PIO2_2, r);
    r = __builtin_fma(-k, PIO2_3, r);
    const int64_t q = (int64_t)k & 3;
    const double r2 = r * r;
    /* sin r = r (1 - r^2/3! + ... - r^14/15!); cos r = 1 - r^2/2! + ... + r^16/16! */
    double sp = -1.0 / 1307674368000.0;                      /* -1/15! */
    sp = __builtin_fma(sp, r2, 1.0 / 6227020800.0);          /* 1/13! */
    sp = __builtin_fma(sp, r2, -1.0 / 39916800.0);           /* -1/11! */
    sp = __builtin_fma(sp, r2, 1.0 / 362880.0);              /* 1/9! */
    sp = __builtin_fma(sp, r2, -1.0 / 5040.0);               /* -1/7! */
    sp = __builtin_fma(sp, r2, 1.0 / 120.0);                 /* 1/5! */
    sp = __builtin_fma(sp, r2, -1.0 / 6.0);                  /* -1/3! */
    const double s = __builtin_fma(sp * r2, r, r);
    double cp = 1.0 / 20922789888000.0;                      /* 1/16! */
    cp = __builtin_fma(cp, r2, -1.0 / 87178291200.0);        /* -1/14! */
    cp = __builtin_fma(cp, r2, 1.0 / 479001600.0);           /* 1/12! */
    cp = __builtin_fma(cp, r2, -1.0 / 3628800.0);            /* -1/10! */
    cp = __builtin_fma(cp, r2, 1.0 / 40320.0);               /* 1/8! */
    cp = __builtin_fma(cp, r2, -1.0 / 720.0);                /* -1/6! */
    cp = __builtin_fma(cp, r2, 1.0 / 24.0);                  /* 1/4! */
    cp = __builtin_fma(cp, r2, -0.5);                        /* -1/2! */
    const double c = __builtin_fma(cp, r2, 1.0);
    /* x = k pi/2 + r: quadrant q of (cos, sin) = (c, s), (-s, c), (-c, -s), (s, -c) */
    const double cq = q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
    const double sq = q == 0 ? s : q == 1 ? c : q == 2 ? -s : -c;
    *c_out = (float)cq;
    *s_out = (float)sq;
}

#endif
