/* lin_state.h — the recurrent linear-attention state (lin_state.c), seen by its device kernels
 * (lin_state.c's CPU one, core/cuda/attention/lin_state.cu). Private. */
#ifndef PN_ATTENTION_LIN_STATE_H
#define PN_ATTENTION_LIN_STATE_H

#include "linear_math.h"

enum { PN_LIN_COSINE = 0, PN_LIN_POWER = 1 };

struct pn_lin_state {
    int kind;                /* PN_LIN_COSINE, PN_LIN_POWER */
    int dt, p;
    int64_t B, H, D, Dv, Dp; /* Dp: the feature dim of the state (D or C(D+p−1, p)) */
    double scale;            /* power: multiplies q·k */
    pn_tensor *m;            /* cosine: (H) the stabilisers, contiguous, on the state's device */
    pn_sympow_table *tab;    /* power: φᵖ (host) */
    pn_tensor *S;            /* (B, H, Dp, Dv) f64, on the state's device */
    pn_tensor *z;            /* (B, H, Dp) f64, power */
    int64_t steps;           /* positions seen */
};

#endif /* PN_ATTENTION_LIN_STATE_H */
