/* rows_f32.h — the f32 row reductions that softmax.c and loss.c share: a row's max in 16
 * lanes, and its sum (of x, of e^(x − m), of x·y) in eight double accumulators in a fixed
 * order — vectorisable and deterministic. One copy, so softmax, log_softmax and the cross
 * entropy's logsumexp of a row see the same max and the same sum.
 *
 * Inlined (PN_INLINE) into callers that carry PN_VEC_FN (and PN_VEC): GCC does not inline a
 * function whose optimize attribute differs from its caller's, and out of line these loops
 * keep trapping math, do not vectorise, and call pn_fast_expf once per element. */
#ifndef PN_ROWS_F32_H
#define PN_ROWS_F32_H

#include "fast_math.h"

#include <math.h>
#include <stdbool.h>

/* max of x (n): one running max would be a chain of n dependent compares (scalar maxss, ~4
 * cycles each: a third of beam search's log-probabilities over 8000 words, half of the cross
 * entropy's forward). A max does not depend on the order, and a NaN never raises a lane, as it
 * never raised the one max (the callers' sums carry the NaN). -inf for n = 0. */
PN_VEC_FN PN_INLINE float pn_row_max_f32(const float *x, int64_t n) {
    float ml[16], m = -INFINITY;
    for (int j = 0; j < 16; j++) ml[j] = -INFINITY;
    int64_t r = 0;
    for (; r + 16 <= n; r += 16)
        for (int j = 0; j < 16; j++) ml[j] = x[r + j] > ml[j] ? x[r + j] : ml[j];
    for (; r < n; r++) m = x[r] > m ? x[r] : m;
    for (int j = 0; j < 16; j++) m = ml[j] > m ? ml[j] : m;
    return m;
}

/* Σ x (ex false) or Σ e^(x − m) (ex true; a constant at each call site) */
PN_VEC_FN PN_INLINE double pn_row_sum8_f32(const float *x, int64_t n, bool ex, float m) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += ex ? pn_fast_expf(x[i + j] - m) : x[i + j];
    for (; i < n; i++) a[0] += ex ? pn_fast_expf(x[i] - m) : x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Σ x·y, the products in double */
PN_VEC_FN PN_INLINE double pn_row_dot8_f32(const float *x, const float *y, int64_t n) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += (double)x[i + j] * y[i + j];
    for (; i < n; i++) a[0] += (double)x[i] * y[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

#endif
