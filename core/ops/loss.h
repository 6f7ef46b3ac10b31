/* loss.h — the elementwise losses' formulas (BCE with logits, MSE) and their derivatives,
 * compiled by C (ops/loss.c) and by CUDA (cuda/ops/loss.cu) from this one source. */
#ifndef PN_OPS_LOSS_H
#define PN_OPS_LOSS_H

#include "../internal.h"

enum { PN_LOSS_BCE, PN_LOSS_MSE }; /* elem_loss_fwd / elem_loss_bwd's kind */

/* stable BCE: max(x, 0) - x·y + log(1 + exp(-|x|)); MSE: (x - y)² */
PN_HD static inline double pn_elem_loss(int kind, double x, double y) {
    if (kind == PN_LOSS_BCE) return fmax(x, 0.0) - x * y + log1p(exp(-fabs(x)));
    return (x - y) * (x - y);
}
/* d loss / d x (wrt 0) and d loss / d y (wrt 1) */
PN_HD static inline double pn_elem_dloss(int kind, int wrt, double x, double y) {
    if (kind == PN_LOSS_BCE) {
        if (wrt == 1) return -x;
        double sg = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
        return sg - y;
    }
    return wrt == 0 ? 2 * (x - y) : -2 * (x - y);
}

#endif /* PN_OPS_LOSS_H */
