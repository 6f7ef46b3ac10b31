/* fastmath.h — private: branch-free float sqrt/exp/log/acosh that GCC vectorizes, and
 * type-generic wrappers (pn_sqrt, pn_exp, pn_log, pn_acosh1p) that pick them for float and
 * libm for double. Used by the attention epilogues and drivers, on the CPU and (PN_HD, C++
 * overloads instead of _Generic) in the CUDA kernels.
 *
 * Why: the build has neither -fno-math-errno nor -ffast-math, so every libm call in a
 * loop (sqrtf sets errno, expf is an out-of-line call) stops GCC from vectorizing it, and
 * the epilogues run once per (query, key) pair. These versions use only arithmetic and
 * integer bit tricks; inside PN_NOTRAP_BEGIN … PN_NOTRAP_END (ops/fast_math.h: no FP traps are
 * ever enabled in penumbra, so selects may be computed both ways) the loops if-convert and
 * vectorize. The includers open that region around their loops themselves: a pragma here
 * would change the options of every file that includes this header. exp is ops/fast_math.h's
 * pn_fast_expf, the one copy every f32 kernel uses.
 * Accuracy (against double over the normal floats, spec/fastmath_spec.lua): sqrt and 1/sqrt
 * ≤ 9e-7 relative, acosh(1 + t) ≤ 1.2e-6, exp ≈ 1.4 ulp, log ≤ 2e-7 absolute + relative. The
 * f64 path keeps libm: f64 must match the naive references to 1e-10. */
#ifndef PN_FASTMATH_H
#define PN_FASTMATH_H

#include "../ops/fast_math.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* these helpers inline into the includers' no-trapping-math regions: same options, so GCC
 * inlines and vectorizes them there */
PN_NOTRAP_BEGIN

PN_HD static inline float pn_bits_to_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
PN_HD static inline uint32_t pn_f_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* 1/√x for a normal, positive, finite x (no special cases: the callers know): the bit-trick
 * seed and two Newton steps whose constants (and the seed's) were fitted for the smallest
 * worst-case error after the second step (a minimax fit, as Moroz et al. 2018 do for one step):
 * 8.4e-7 relative over every normal float (checked exhaustively; spec/fastmath_spec.lua), where the
 * textbook constants 0x5f3759df, ½, 3/2 need a third step to get below 4.7e-6. Every
 * distance-family score takes one or two per pair, so a step is worth ~10 % of an epilogue. */
PN_HD static inline float pn_rsqrtf_core(float x) {
    float y = pn_bits_to_f(0x5f375600u - (pn_f_to_bits(x) >> 1));
    float h = 0.5004079f * x;
    y = y * (1.5010125f - h * y * y);
    return y * (1.5004084f - h * y * y);
}

/* 1/√x for x > 0. x <= 0, +inf and subnormal x (below FLT_MIN ≈ 1.2e-38, where the bit
 * trick fails; as a squared distance: points closer than 1e-19) give 0. The epilogues use
 * it for √x = x·(1/√x) and 1/√x together (a distance and the 1/(2Δ) of its derivative from
 * one evaluation). */
PN_HD static inline float pn_rsqrtf_fast(float x) {
    int ok = x >= 1.17549435e-38f && x <= 3.40282347e38f;
#if defined(__CUDA_ARCH__) /* the GPU (nvcc's device pass; not the interpreter): its special-function
                              unit's 1/√, one instruction within 2 ulp */
    return ok ? rsqrtf(x) : 0.0f;
#else
    /* not `ok ? x : 1`: GCC folds that select into the final one and runs the steps on x
     * itself, and a negative x seeds a tiny y whose products underflow — subnormal results,
     * each a ~100-cycle microcode assist (70× slower measured on a Xeon). |x| seeds a normal y
     * for every x but the subnormals and zero. */
    float y = pn_rsqrtf_core(fabsf(x));
    return ok ? y : 0.0f;
#endif
}

/* sqrt for x >= 0 (x <= 0 and subnormal x → 0, +inf → +inf) */
PN_HD static inline float pn_sqrtf_fast(float x) {
    float s = x * pn_rsqrtf_fast(x);
    return x > 3.40282347e38f ? x : s;
}

/* log(m·2^e) = log1p(f) + e·ln 2 for the reduced f = m − 1, |f| < 0.415 (Cephes logf's
 * polynomial; ln 2 in two parts so e·ln 2 adds no rounding) — shared by log and log1p. A
 * degree-6 minimax P (two FMAs fewer, 3.3e-8 before rounding) measured 6 % faster in the
 * hyperbolic epilogue, but its other rounding moved the NMT 2-rank/1-process loss agreement
 * (ddp_spec, Adam over 54 steps) from 3e-8 to 1.1e-5, over that spec's 1e-5. */
PN_HD static inline float pn_logf_poly(float f, float e) {
    float z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    float y = f * z * p;
    y += e * -2.12194440e-4f;
    y += -0.5f * z;
    return f + y + e * 0.693359375f;
}

/* x = m·2^e with m in [√½, √2), for a normal, positive, finite x: the exponent is read from the
 * bits less √½'s, so m lands in the range with no compare-and-halve (four integer operations) */
typedef struct { float m, e; } pn_logf_parts;
PN_HD static inline pn_logf_parts pn_logf_reduce(float x) {
    uint32_t b = pn_f_to_bits(x);
    int32_t k = (int32_t)(b - 0x3f3504f3u) >> 23; /* arithmetic shift: floor */
    pn_logf_parts r = {pn_bits_to_f(b - ((uint32_t)k << 23)), (float)k};
    return r;
}

/* log for a normal, positive, finite x: polynomial in m − 1 */
PN_HD static inline float pn_logf_core(float x) {
    pn_logf_parts r = pn_logf_reduce(x);
    return pn_logf_poly(r.m - 1.0f, r.e);
}

/* log(2^k·(1 + v)) for v >= 0 with 1 + v finite (NaN stays NaN) and a small whole k (a float:
 * a select of 0 or 1 adds to the exponent with one masked add, an int took three). Below
 * 1 + v = √2 the reduction would read f = (1 + v) − 1, which lost v's low digits in the
 * rounding of 1 + v; there f is v itself (m = 1 + v exactly), so small v keep their relative
 * precision with no series and no second branch. Above √2 the rounding costs <= 2^-24
 * against log >= 0.34. k joins the exponent, whose ln 2 is added exactly. */
PN_HD static inline float pn_log1pf_core(float v, float k) {
    float x = 1.0f + v;
    pn_logf_parts r = pn_logf_reduce(x);
    float f = x >= 1.41421356f ? r.m - 1.0f : v; /* NaN: the comparison fails, v carries it */
    return pn_logf_poly(f, r.e + k);
}

/* log for x > 0: x <= 0 → -inf, +inf → +inf; subnormal inputs are scaled by 2^64 first */
PN_HD static inline float pn_logf_fast(float x) {
    int tiny = x < 1.1754944e-38f;
    float xs = tiny ? x * 1.8446744e19f : x; /* 2^64 */
    float y = pn_logf_core(xs > 0.0f && xs <= 3.40282347e38f ? xs : 1.0f) - (tiny ? 44.361419555836f : 0.0f); /* 64·ln 2 */
    y = x > 0.0f ? y : -INFINITY;
    return x > 3.40282347e38f ? x : y;
}

/* acosh(1 + t) for t >= 0 (t < 0 and t below the smallest normal → 0, NaN stays NaN),
 * accurate for small t, where 1 + t would round away the digits of t (points close together,
 * the distance scores): log1p(t + s), s = √(t(t + 2)), through pn_log1pf_core, which keeps
 * small arguments' digits itself (s ≈ √(2t) dominates t + s there, so one 1/√ sets the
 * precision). Past t = 4095, log(2(1 + t)) (the same to float resolution) keeps t(t + 2)
 * from overflowing. Every select is on one comparison (a select on a && of two does not
 * vectorize) and no special case costs a second evaluation: this runs once per pair in the
 * hyperbolic scores. */
PN_HD static inline float pn_acosh1pf_fast(float t) {
    float tt = t < 1.17549435e-38f ? 0.0f : t; /* NaN passes */
    int big = tt > 4095.0f;                    /* +inf too: 1 + inf reads as 2^128, near acosh(FLT_MAX) */
    float w = tt * (tt + 2.0f);                /* 0 or normal below 4096 (+inf or NaN only where big) */
    /* w = 0: the seed of 0 is finite and 0·y = 0. |w|: GCC computes w from t before the clamp
     * and masks afterwards, and a negative w would seed subnormal Newton products (microcode
     * assists, pn_rsqrtf_fast) */
    float sq = w * pn_rsqrtf_core(fabsf(w));
    return pn_log1pf_core(big ? tt : tt + sq, big ? 1.0f : 0.0f);
}
PN_HD static inline double pn_acosh1p_d(double t) { return t != t ? t : (t > 0 ? log1p(t + sqrt(t * (t + 2))) : 0.0); }

/* not exported from libpenumbra (the epilogues are reached through the registry only) */
#if defined(__GNUC__)
#define PN_HIDDEN __attribute__((visibility("hidden")))
#else
#define PN_HIDDEN
#endif

PN_HD static inline double pn_rsqrt_d(double x) { return x > 0 && x < INFINITY ? 1.0 / sqrt(x) : 0.0; }

PN_NOTRAP_END

#ifdef __cplusplus /* the CUDA kernels (core/cuda/attention/): the same choice by overloading */
PN_HD static inline float pn_sqrt(float x) { return pn_sqrtf_fast(x); }
PN_HD static inline double pn_sqrt(double x) { return sqrt(x); }
PN_HD static inline float pn_rsqrt(float x) { return pn_rsqrtf_fast(x); }
PN_HD static inline double pn_rsqrt(double x) { return pn_rsqrt_d(x); }
PN_HD static inline float pn_exp(float x) { return pn_fast_expf(x); }
PN_HD static inline double pn_exp(double x) { return exp(x); }
PN_HD static inline float pn_exp_nonpos(float x) { return pn_fast_expf_nonpos(x); }
PN_HD static inline double pn_exp_nonpos(double x) { return exp(x); }
PN_HD static inline float pn_log(float x) { return pn_logf_fast(x); }
PN_HD static inline double pn_log(double x) { return log(x); }
PN_HD static inline float pn_acosh1p(float x) { return pn_acosh1pf_fast(x); }
PN_HD static inline double pn_acosh1p(double x) { return pn_acosh1p_d(x); }
#else
#define pn_sqrt(x) _Generic((x), float: pn_sqrtf_fast, default: sqrt)(x)
#define pn_rsqrt(x) _Generic((x), float: pn_rsqrtf_fast, default: pn_rsqrt_d)(x)
#define pn_exp(x) _Generic((x), float: pn_fast_expf, default: exp)(x)
#define pn_exp_nonpos(x) _Generic((x), float: pn_fast_expf_nonpos, default: exp)(x) /* x <= 0: a softmax's */
#define pn_log(x) _Generic((x), float: pn_logf_fast, default: log)(x)
#define pn_acosh1p(x) _Generic((x), float: pn_acosh1pf_fast, default: pn_acosh1p_d)(x)
#endif

#endif /* PN_FASTMATH_H */
