/* optim.h — the per-element updates of the fused optimisers (torch.optim formulas), compiled by
 * C (ops/optim.c) and by CUDA (cuda/ops/optim.cu) from this one source. Values in double; the
 * caller loads and stores its dtype. */
#ifndef PN_OPS_OPTIM_H
#define PN_OPS_OPTIM_H

#include "../internal.h"
#include "fast_math.h" /* PN_INLINE: inlined into ops/optim.c's vectorised loop */

/* Adam's per-step constants (the bias corrections of step) */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double step_size, bc2_sqrt; /* lr / (1 − β1^t), sqrt(1 − β2^t) */
    int decoupled;              /* AdamW: weight decay on the parameter, not the gradient */
} pn_adam_hp;

static inline pn_adam_hp pn_adam_hp_of(double lr, double beta1, double beta2, double eps, double weight_decay,
                                       int decoupled, int64_t step) {
    pn_adam_hp h;
    h.lr = lr, h.beta1 = beta1, h.beta2 = beta2, h.eps = eps, h.weight_decay = weight_decay;
    h.decoupled = decoupled;
    h.step_size = lr / (1 - pow(beta1, (double)step));
    h.bc2_sqrt = sqrt(1 - pow(beta2, (double)step));
    return h;
}

/* one element: gradient g, parameter *p, moments *m, *v updated in place */
PN_HD PN_INLINE void pn_adam_elem(const pn_adam_hp *h, double g, double *p, double *m, double *v) {
    double pi = *p;
    if (h->decoupled) pi -= h->lr * h->weight_decay * pi;
    else g += h->weight_decay * pi;
    double mi = h->beta1 * *m + (1 - h->beta1) * g, vi = h->beta2 * *v + (1 - h->beta2) * g * g;
    *m = mi;
    *v = vi;
    *p = pi - h->step_size * mi / (sqrt(vi) / h->bc2_sqrt + h->eps);
}

/* one SGD element: gradient g, parameter *p, momentum buffer *b (ignored when has_buf is 0) */
PN_HD static inline void pn_sgd_elem(double g, double *p, double *b, int has_buf, double lr, double momentum,
                                     double dampening, double weight_decay, int nesterov, int first_step) {
    double d = g + weight_decay * *p;
    if (has_buf) {
        double bv = first_step ? d : momentum * *b + (1 - dampening) * d;
        *b = bv;
        d = nesterov ? d + momentum * bv : bv;
    }
    *p = *p - lr * d;
}

#endif /* PN_OPS_OPTIM_H */
