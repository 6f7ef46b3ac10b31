/* fast_math.h — THE vectorisable expf of the f32 kernels (softmax.c, loss.c, reduce.c and the
 * fused attention through attention/fastmath.h), and the scoped no-trapping-math region the
 * loops around it need.
 *
 * libm's expf is a call per element, so loops around it never vectorise; this one is
 * plain arithmetic (Cephes' polynomial, max relative error ≈ 1.4 ulp over the normal range,
 * exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN). Underflow is gradual: results below
 * FLT_MIN are the denormals libm gives (2^n is applied as two factors), 0 only below
 * x = -104 — so a softmax weight e^(s − max) that is tiny but nonzero stays nonzero
 * wherever it is computed (the attention drivers used a second copy that flushed at -87.3).
 *
 * Why the optimize switch: GCC if-converts float compares/selects (max, clamps) into vector
 * blends only without -ftrapping-math, which we never rely on (no FP exception traps
 * anywhere). Two scopes, never a file-wide pragma (it would leak into every includer):
 *  - PN_VEC_FN on one function (GCC attribute);
 *  - PN_NOTRAP_BEGIN … PN_NOTRAP_END around a region of functions (push/pop of the
 *    options), for files whose typed bodies are included (dense_impl.h, the epilogues).
 * Other compilers ignore both and compute the same results, just unvectorised. Put one of
 * them on every function that inlines pn_fast_expf. */
#ifndef PN_FAST_MATH_H
#define PN_FAST_MATH_H

#include "../internal.h" /* PN_HD: __host__ __device__ under nvcc (CUDA kernels call it too) */

#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define PN_VEC_FN __attribute__((optimize("no-trapping-math")))
/* … and no FMA contraction in its AVX2 / AVX-512 clones: the results stay bit for bit the
 * baseline build's on every CPU (sums that reach parameters' gradients) */
#define PN_VEC_EXACT_FN __attribute__((optimize("no-trapping-math", "fp-contract=off")))
#define PN_NOTRAP_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"no-trapping-math\")")
#define PN_NOTRAP_END _Pragma("GCC pop_options")
#else
#define PN_VEC_FN
#define PN_VEC_EXACT_FN
#define PN_NOTRAP_BEGIN
#define PN_NOTRAP_END
#endif

/* PN_VEC: the hot row functions (the attention drivers', softmax's and cross entropy's rows)
 * are compiled three times — for x86-64-v4 (AVX-512),
 * x86-64-v3 (AVX2 + FMA) and the baseline — and the loader picks one for the CPU (GCC
 * function multiversioning): the build itself targets the baseline (SSE2). Their float sums
 * vectorize through `#pragma omp simd reduction(...)`, which allows the reassociation that
 * plain C forbids (sums change in the last bits with the vector width). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(PN_NO_CLONES)
#define PN_VEC __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PN_VEC
#endif

/* for helpers of PN_VEC functions: inlined, so they are compiled with the caller's target */
#if defined(__GNUC__)
#define PN_INLINE static inline __attribute__((always_inline))
#else
#define PN_INLINE static inline
#endif

/* e^r for |r| <= ln 2 / 2: Cephes' polynomial, shared by both exps below */
PN_HD PN_VEC_FN static inline float pn_expf_poly(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

PN_HD PN_VEC_FN static inline float pn_fast_expf(float x) {
    /* exp(x) = 2^n · e^r with n = round(x / ln 2), |r| <= ln 2 / 2 */
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    const float shift = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + shift) - shift;
    float r = xc - n * 0.693359375f; /* ln 2 in two parts, so r keeps its low bits */
    r = r - n * -2.12194440e-4f;
    float p = pn_expf_poly(r);
    /* 2^n as two factors: n ranges over [-150, 129], beyond one float's normal exponents */
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    union { int32_t i; float f; } s1 = {(n1 + 127) * (1 << 23)}, s2 = {(n2 + 127) * (1 << 23)};
    float y = p * s1.f * s2.f;
    y = x < -104.0f ? 0.0f : y;
    return x != x ? x : y;
}

/* exp(x) for x <= 0 — a softmax's e^(s − max), e^(s − logsumexp), e^(log-softmax): the attention
 * drivers', softmax.c's, the cross entropy's and logsumexp's, so all of them flush alike — equal to
 * pn_fast_expf bit for bit for x >= PN_EXP_FLUSH (checked over every float <= 0;
 * spec/fixtures/fastmath_check.c samples them), NaN included, and +0 below it, in about half its
 * instructions (the softmax loops of the attention forward spent a fifth of the dot's time in
 * exp): no upper clamp and no NaN select (NaN flows through the arithmetic), and 2^n from the
 * rounding sum's own bits — its shift 1.5·2^23 + 192 (even, so ties round as pn_fast_expf's)
 * leaves n + 192 in the low mantissa bits, which shifted into the exponent field are 2^(n + 65),
 * normal for every n in [-150, 62]; the exact product p·2^(n + 65) times 2^-65 then rounds once,
 * as pn_fast_expf's second factor does. Exact up to x = 43 (n = 62); +inf gives NaN.
 * Why the flush: below e^-87 the weights were subnormal, and on x86 every multiply that makes or
 * reads a subnormal takes a microcode assist (13× an ordinary exp here; P·V and the backward's
 * P·(dP − D) read them again). Cone and hyperbolic scores of unit-scale inputs spread over
 * hundreds of units, so most of their weights fell there: umbral attention ran 4–5× slower than
 * with the flush (N = 2048, D = 64, one thread). A weight below e^-80 ≈ 1.8e-35 of the row's
 * largest is 27 orders of magnitude under an f32 sum's precision, and the margin keeps the
 * backward's P·(dP − D) normal for |dP − D| down to 1e-3. The GPU's ex2.approx.ftz flushes too. */
#define PN_EXP_FLUSH (-80.0f)
PN_HD PN_VEC_FN static inline float pn_fast_expf_nonpos(float x) {
    float xc = x < PN_EXP_FLUSH ? -104.0f : x; /* NaN passes; e^-104 comes out +0 below */
    const float shift = 12583104.0f;      /* 1.5 · 2^23 + 192 */
    float t = xc * 1.44269504088896341f + shift;
    float n = t - shift;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    union { float f; uint32_t u; } b = {t};
    b.u <<= 23; /* 2^(n + 65) */
    /* no select on the result: for xc = -104 it is already +0 (2^-150 · e^r rounds to 0, an
     * underflow to zero, which takes no assist) — the exhaustive check covers every x below */
    return pn_expf_poly(r) * b.f * 2.71050543e-20f; /* 2^-65 */
}

#endif /* PN_FAST_MATH_H */
