/* fast_math.h — a vectorisable expf for the f32 kernels of softmax.c and loss.c.
 *
 * libm's expf is a call per element, so loops around it never vectorise; this one is
 * plain arithmetic (Cephes' polynomial, max relative error ≈ 1.4 ulp over the float range,
 * exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN, results below FLT_MIN are denormal or 0).
 *
 * PN_VEC_FN marks a function whose loops should vectorise although they contain float
 * compares/selects (max, clamps): GCC if-converts those only without -ftrapping-math,
 * which we never rely on (no FP exception traps anywhere). Other compilers ignore it
 * and still compute the same results, just unvectorised. Put it on every function that
 * inlines pn_fast_expf. */
#ifndef PN_FAST_MATH_H
#define PN_FAST_MATH_H

#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__)
#define PN_VEC_FN __attribute__((optimize("no-trapping-math")))
#else
#define PN_VEC_FN
#endif

PN_VEC_FN static inline float pn_fast_expf(float x) {
    /* exp(x) = 2^n · e^r with n = round(x / ln 2), |r| <= ln 2 / 2 */
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    const float shift = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + shift) - shift;
    float r = xc - n * 0.693359375f; /* ln 2 in two parts, so r keeps its low bits */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n as two factors: n ranges over [-150, 129], beyond one float's normal exponents */
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    union { int32_t i; float f; } s1 = {(n1 + 127) * (1 << 23)}, s2 = {(n2 + 127) * (1 << 23)};
    float y = p * s1.f * s2.f;
    y = x < -104.0f ? 0.0f : y;
    return x != x ? x : y;
}

#endif /* PN_FAST_MATH_H */
