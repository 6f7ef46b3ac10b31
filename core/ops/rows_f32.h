/* rows_f32.h — the f32 row reductions that softmax.c, loss.c and norm.c share: a row's max in
 * 16 lanes, and its sums (of x, of e^(x − m), of x·y, of layer norm's centred squares and
 * gradient terms) in eight double accumulators in a fixed order — vectorisable and
 * deterministic. One copy, so softmax, log_softmax and the cross entropy's logsumexp of a row see
 * the same max and the same sum, and every row sum adds in the same order.
 *
 * Inlined (PN_INLINE, or a macro) into callers that carry PN_VEC_FN (and PN_VEC): GCC does not
 * inline a function whose optimize attribute differs from its caller's, and out of line these
 * loops keep trapping math, do not vectorise, and call pn_fast_expf once per element. */
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

/* the eight lanes of PN_SUM8 / PN_SUM8_2 combined pairwise, in one fixed order */
PN_INLINE double pn_sum8_lanes(const double s[8]) {
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* OUT = Σ_{i < n} TERM, TERM a double expression of the index i (declared by the macro): eight
 * double lanes, lane l taking i ≡ l (mod 8) below the last multiple of 8 and lane 0 the tail,
 * added as ((0+1)+(2+3))+((4+5)+(6+7)). One dependent chain of double adds would take four
 * cycles an element; the lanes vectorise, and the order does not depend on the ISA or the
 * thread count. A macro, not a function taking a callback: the term must inline into the loop. */
#define PN_SUM8(OUT, n, i, TERM)                                                                                \
    do {                                                                                                       \
        double s8_[8] = {0};                                                                                   \
        int64_t b8_ = 0;                                                                                       \
        for (; b8_ + 8 <= (n); b8_ += 8)                                                                       \
            for (int l8_ = 0; l8_ < 8; l8_++) {                                                                \
                const int64_t i = b8_ + l8_;                                                                   \
                s8_[l8_] += (TERM);                                                                            \
            }                                                                                                  \
        for (; b8_ < (n); b8_++) {                                                                             \
            const int64_t i = b8_;                                                                             \
            s8_[0] += (TERM);                                                                                  \
        }                                                                                                      \
        (OUT) = pn_sum8_lanes(s8_);                                                                            \
    } while (0)

/* OUT1 = Σ T1, OUT2 = Σ T2 in one pass over i: each exactly as PN_SUM8 would sum it (the same
 * lanes, the same order), for a row whose two sums share their loads (layer norm's backward) */
#define PN_SUM8_2(OUT1, OUT2, n, i, T1, T2)                                                                     \
    do {                                                                                                       \
        double s8a_[8] = {0}, s8b_[8] = {0};                                                                   \
        int64_t b8_ = 0;                                                                                       \
        for (; b8_ + 8 <= (n); b8_ += 8)                                                                       \
            for (int l8_ = 0; l8_ < 8; l8_++) {                                                                \
                const int64_t i = b8_ + l8_;                                                                   \
                s8a_[l8_] += (T1);                                                                             \
                s8b_[l8_] += (T2);                                                                             \
            }                                                                                                  \
        for (; b8_ < (n); b8_++) {                                                                             \
            const int64_t i = b8_;                                                                             \
            s8a_[0] += (T1);                                                                                   \
            s8b_[0] += (T2);                                                                                   \
        }                                                                                                      \
        (OUT1) = pn_sum8_lanes(s8a_);                                                                          \
        (OUT2) = pn_sum8_lanes(s8b_);                                                                          \
    } while (0)

/* Σ x (ex false) or Σ e^(x − m) (ex true; a constant at each call site) */
PN_VEC_FN PN_INLINE double pn_row_sum8_f32(const float *x, int64_t n, bool ex, float m) {
    double s;
    PN_SUM8(s, n, i, ex ? pn_fast_expf_nonpos(x[i] - m) : x[i]);
    return s;
}

/* Σ x·y, the products in double */
PN_VEC_FN PN_INLINE double pn_row_dot8_f32(const float *x, const float *y, int64_t n) {
    double s;
    PN_SUM8(s, n, i, (double)x[i] * y[i]);
    return s;
}

#endif
