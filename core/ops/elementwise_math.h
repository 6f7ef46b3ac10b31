/* elementwise_math.h — THE per-element formulas of the elementwise ops (forward and
 * derivative), shared by the CPU kernels (ops/elementwise.c) and their CUDA twins
 * (cuda/ops/elementwise.cu), so the maths is written once.
 *
 * The float formulas are X-macro lists of expressions, stamped by each side into its own
 * loops: the CPU into unit-stride loops the compiler vectorises (one switch outside each
 * loop), the device into a per-element switch. An expression names:
 *     T        the element type (float or double)
 *     x, y     binary: the operands; backward (unary): the input x and the output y
 *     v        unary forward: the input
 *     a, b     unary: the op's scalars, typed T (clamp's min/max, elu's alpha, pow's exponent …)
 *     gv       backward: the incoming gradient
 * Math calls are type generic: <tgmath.h> in C (the includer includes it first), the float and
 * double overloads in C++/CUDA. The integer dtypes (i32, i64, u8) go through int64 helpers.
 *
 * A C file includes this after <tgmath.h>; a .cu file after cuda.cuh (PN_HD: __host__
 * __device__ under nvcc). */
#ifndef PN_ELEMENTWISE_MATH_H
#define PN_ELEMENTWISE_MATH_H

#include "../internal.h"

enum { PN_EW_SQUARE = PN_UNARY_COUNT }; /* pow_scalar with exponent 2: a plain multiply */

/* ---- helpers ------------------------------------------------------------------------------ */
/* σ(v) without overflow for either sign */
PN_HD static inline float pn_sigmoid_f32(float v) {
    float e = expf(-fabsf(v)), r = 1.0f / (1.0f + e);
    return v >= 0 ? r : e * r;
}
PN_HD static inline double pn_sigmoid_f64(double v) {
    double e = exp(-fabs(v)), r = 1.0 / (1.0 + e);
    return v >= 0 ? r : e * r;
}
#ifdef __cplusplus
PN_HD static inline float pn_sigmoid(float v) { return pn_sigmoid_f32(v); }
PN_HD static inline double pn_sigmoid(double v) { return pn_sigmoid_f64(v); }
#define PN_SIGMOID(v) pn_sigmoid(v)
#else
#define PN_SIGMOID(v) _Generic((v), float: pn_sigmoid_f32, default: pn_sigmoid_f64)(v)
#endif
/* log(1 + e^v) without overflow: max(v, 0) + log1p(e^-|v|) */
#define PN_SOFTPLUS(v) (fmax((v), (T)0) + log1p(exp(-fabs(v))))

#define PN_SQRT1_2 0.70710678118654752440
#define PN_INV_SQRT_2PI 0.39894228040143267794

/* ---- binary ------------------------------------------------------------------------------- */
/* maximum/minimum propagate NaN from either side (torch semantics) */
#define PN_BINARY_OPS(X)                               \
    X(PN_ADD, x + y)                                   \
    X(PN_SUB, x - y)                                   \
    X(PN_MUL, x * y)                                   \
    X(PN_DIV, x / y)                                   \
    X(PN_POW, pow(x, y))                               \
    X(PN_MAXIMUM, (x > y || x != x) ? x : y)           \
    X(PN_MINIMUM, (x < y || x != x) ? x : y)

/* d out / d a (code op·2) and d out / d b (op·2 + 1), times the incoming gradient gv.
 * pow: torch's conventions — no gradient to the base where the exponent is 0, none to the
 * exponent where the base is 0 and the exponent >= 0. maximum/minimum: ties split evenly.
 * (add and sub never come here: their gradients are g itself, summed to each input.) */
#define PN_BINARY_GRADS(X)                                                                \
    X(PN_MUL * 2, gv * y)                                                                 \
    X(PN_MUL * 2 + 1, gv * x)                                                             \
    X(PN_DIV * 2, gv / y)                                                                 \
    X(PN_DIV * 2 + 1, -gv * x / (y * y))                                                  \
    X(PN_POW * 2, y == 0 ? (T)0 : gv * y * pow(x, y - 1))                                 \
    X(PN_POW * 2 + 1, (x == 0 && y >= 0) ? (T)0 : gv * pow(x, y) * log(x))                \
    X(PN_MAXIMUM * 2, x > y ? gv : (x == y ? gv * (T)0.5 : (T)0))                         \
    X(PN_MAXIMUM * 2 + 1, y > x ? gv : (x == y ? gv * (T)0.5 : (T)0))                     \
    X(PN_MINIMUM * 2, x < y ? gv : (x == y ? gv * (T)0.5 : (T)0))                         \
    X(PN_MINIMUM * 2 + 1, y < x ? gv : (x == y ? gv * (T)0.5 : (T)0))

/* ---- unary -------------------------------------------------------------------------------- */
#define PN_UNARY_OPS(X)                                               \
    X(PN_NEG, -v)                                                     \
    X(PN_ABS, fabs(v))                                                \
    X(PN_EXP, exp(v))                                                 \
    X(PN_LOG, log(v))                                                 \
    X(PN_LOG1P, log1p(v))                                             \
    X(PN_SQRT, sqrt(v))                                               \
    X(PN_RSQRT, (T)1 / sqrt(v))                                       \
    X(PN_SIN, sin(v))                                                 \
    X(PN_COS, cos(v))                                                 \
    X(PN_TANH, tanh(v))                                               \
    X(PN_SIGMOID, PN_SIGMOID(v))                                      \
    X(PN_LOGSIGMOID, -(T)PN_SOFTPLUS(-v))                             \
    X(PN_RELU, v < 0 ? (T)0 : v)                                      \
    X(PN_ELU, v > 0 ? v : a * expm1(v))                               \
    X(PN_LEAKY_RELU, v > 0 ? v : a * v)                               \
    X(PN_GELU, (T)0.5 * v * ((T)1 + erf(v * (T)PN_SQRT1_2)))          \
    X(PN_SOFTPLUS, (T)PN_SOFTPLUS(v))                                 \
    X(PN_SINH, sinh(v))                                               \
    X(PN_COSH, cosh(v))                                               \
    X(PN_ASINH, asinh(v))                                             \
    X(PN_ACOSH, acosh(v))                                             \
    X(PN_ATANH, atanh(v))                                             \
    X(PN_CLAMP, v < a ? a : (v > b ? b : v))                          \
    X(PN_POW_SCALAR, pow(v, a))                                       \
    X(PN_EW_SQUARE, v * v)

/* backward: gv the incoming gradient, x the input, y the output. abs and relu have
 * gradient 0 at 0; clamp passes it where min <= x <= max. */
#define PN_UNARY_GRADS(X)                                                               \
    X(PN_NEG, -gv)                                                                      \
    X(PN_ABS, x > 0 ? gv : (x < 0 ? -gv : (T)0))                                        \
    X(PN_EXP, gv * y)                                                                   \
    X(PN_LOG, gv / x)                                                                   \
    X(PN_LOG1P, gv / ((T)1 + x))                                                        \
    X(PN_SQRT, gv * (T)0.5 / y)                                                         \
    X(PN_RSQRT, gv * (T)-0.5 * y * y * y)                                               \
    X(PN_SIN, gv * cos(x))                                                              \
    X(PN_COS, -gv * sin(x))                                                             \
    X(PN_TANH, gv * ((T)1 - y * y))                                                     \
    X(PN_SIGMOID, gv * y * ((T)1 - y))                                                  \
    X(PN_LOGSIGMOID, gv * PN_SIGMOID(-x))                                               \
    X(PN_RELU, x > 0 ? gv : (T)0)                                                       \
    X(PN_ELU, x > 0 ? gv : gv * (y + a))                                                \
    X(PN_LEAKY_RELU, x > 0 ? gv : gv * a)                                               \
    X(PN_GELU, gv * ((T)0.5 * ((T)1 + erf(x * (T)PN_SQRT1_2)) +                         \
                     x * (T)PN_INV_SQRT_2PI * exp((T)-0.5 * x * x)))                    \
    X(PN_SOFTPLUS, gv * PN_SIGMOID(x))                                                  \
    X(PN_SINH, gv * cosh(x))                                                            \
    X(PN_COSH, gv * sinh(x))                                                            \
    X(PN_ASINH, gv / sqrt(x * x + (T)1))                                                \
    X(PN_ACOSH, gv / sqrt((x - (T)1) * (x + (T)1)))                                     \
    X(PN_ATANH, gv / ((T)1 - x * x))                                                    \
    X(PN_CLAMP, (x >= a && x <= b) ? gv : (T)0)                                         \
    X(PN_POW_SCALAR, a == 0 ? (T)0 : gv * a * pow(x, a - (T)1))                         \
    X(PN_EW_SQUARE, gv * (T)2 * x)

/* ---- comparisons (→ u8) ------------------------------------------------------------------- */
#define PN_COMPARE_OPS(X) \
    X(PN_EQ, x == y)      \
    X(PN_NE, x != y)      \
    X(PN_LT, x < y)       \
    X(PN_LE, x <= y)      \
    X(PN_GT, x > y)       \
    X(PN_GE, x >= y)

/* ---- integer dtypes (i32, i64, u8) as int64 ------------------------------------------------ */
PN_HD static inline int64_t pn_ew_ld_int(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PN_I32: return ((const int32_t *)p)[i];
    case PN_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}
PN_HD static inline void pn_ew_st_int(void *p, int dt, int64_t i, int64_t v) {
    switch (dt) {
    case PN_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PN_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}
/* integers: add sub mul maximum minimum, exact in int64 (div and pow are refused) */
PN_HD static inline int64_t pn_ew_binary_int(int op, int64_t x, int64_t y) {
    switch (op) {
    case PN_ADD: return x + y;
    case PN_SUB: return x - y;
    case PN_MUL: return x * y;
    case PN_MAXIMUM: return x > y ? x : y;
    default: return x < y ? x : y;
    }
}
/* integers: neg abs relu clamp (bounds rounded inwards); other ops are refused */
PN_HD static inline int64_t pn_ew_unary_int(int op, int64_t v, double a, double b) {
    switch (op) {
    case PN_NEG: return -v;
    case PN_ABS: return v < 0 ? -v : v;
    case PN_RELU: return v < 0 ? 0 : v;
    case PN_CLAMP: return (double)v < a ? (int64_t)ceil(a) : ((double)v > b ? (int64_t)floor(b) : v);
    default: return v;
    }
}
PN_HD static inline bool pn_ew_compare_int(int op, int64_t x, int64_t y) {
    switch (op) {
    case PN_EQ: return x == y;
    case PN_NE: return x != y;
    case PN_LT: return x < y;
    case PN_LE: return x <= y;
    case PN_GT: return x > y;
    default: return x >= y;
    }
}

#endif /* PN_ELEMENTWISE_MATH_H */
