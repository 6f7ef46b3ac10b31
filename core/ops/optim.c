/* optim.c — fused optimiser updates. One pass over each parameter instead of the half
 * dozen temporaries the same update costs when composed from ops; not recorded by
 * autograd (optimisers run outside the graph). Formulas follow torch.optim. */
#include "../backend.h"
#include "optim.h" /* and fast_math.h: PN_VEC */

static pn_status check_same(const char *op, const char *an, const pn_tensor *a, const char *bn, const pn_tensor *b) {
    if (!a || !b) return pn_error(PN_ERR_ARG, "%s: %s or %s is nil", op, an, bn);
    if (!pn_same_shape(a, b) || a->dt != b->dt)
        return pn_error(PN_ERR_SHAPE, "%s: %s %s %s and %s %s %s must match", op, an, pn_dtype_name(a->dt),
                        pn_shape_str(a), bn, pn_dtype_name(b->dt), pn_shape_str(b));
    if (!pn_is_float(a->dt)) return pn_error(PN_ERR_DTYPE, "%s: %s must be f32 or f64", op, an);
    if (!pn_is_contiguous(a) || !pn_is_contiguous(b))
        return pn_error(PN_ERR_ARG, "%s: %s and %s must be contiguous", op, an, bn);
    return PN_OK;
}

/* The f32 update of n elements, compiled per instruction set (PN_VEC) so that it vectorises
 * (4 or 8 doubles a vector): the plain loop stayed scalar, its sqrt kept for errno (this file
 * is compiled with -fno-math-errno: CMakeLists.txt) and its branch on decoupled inside. The
 * same double arithmetic per element, optim.h's. */
PN_INLINE void adam_loop_f32(float *restrict P, float *restrict M, float *restrict V, const float *restrict G,
                             int64_t n, pn_adam_hp h, const int decoupled) {
    h.decoupled = decoupled; /* a constant in each loop: no branch left in it to stop the vectoriser */
    for (int64_t i = 0; i < n; i++) {
        double pi = P[i], mi = M[i], vi = V[i];
        pn_adam_elem(&h, G[i], &pi, &mi, &vi);
        M[i] = (float)mi;
        V[i] = (float)vi;
        P[i] = (float)pi;
    }
}
PN_VEC_FN PN_VEC static void adam_block_f32(float *restrict P, float *restrict M, float *restrict V,
                                            const float *restrict G, int64_t n, const pn_adam_hp *hp) {
    if (hp->decoupled) adam_loop_f32(P, M, V, G, n, *hp, 1);
    else adam_loop_f32(P, M, V, G, n, *hp, 0);
}
#define ADAM_BLOCK 8192 /* elements a call: a few pages of each of the four arrays */

pn_status pn_adam_step_(pn_tensor *p, const pn_tensor *g, pn_tensor *m, pn_tensor *v, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int decoupled, int64_t step) {
    PN_TRY(check_same("adam_step", "param", p, "grad", g));
    PN_TRY(check_same("adam_step", "param", p, "exp_avg", m));
    PN_TRY(check_same("adam_step", "param", p, "exp_avg_sq", v));
    if (step < 1) return pn_error(PN_ERR_ARG, "adam_step: step %lld must be >= 1", (long long)step);
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1))
        return pn_error(PN_ERR_ARG, "adam_step: betas (%g, %g) must lie in [0, 1)", beta1, beta2);
    int dev;
    const pn_kernels *k;
    PN_TRY(pn_kernels_for("adam_step", 4, (const pn_tensor *const[]){p, g, m, v},
                          (const char *const[]){"param", "grad", "exp_avg", "exp_avg_sq"}, &dev, &k));
    pn_bump_version(p), pn_bump_version(m), pn_bump_version(v);
    return PN_KCALL("adam_step", k, adam_step, p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step);
}

/* CPU kernel: all contiguous, one shape and float dtype */
pn_status pn_cpu_adam_step(pn_tensor *p, const pn_tensor *g, pn_tensor *m, pn_tensor *v, double lr, double beta1,
                           double beta2, double eps, double weight_decay, int decoupled, int64_t step) {
    int64_t n = pn_numel(p);
    pn_adam_hp h = pn_adam_hp_of(lr, beta1, beta2, eps, weight_decay, decoupled, step);
    if (p->dt == PN_F32) {
        float *P = (float *)pn_ptr(p), *M = (float *)pn_ptr(m), *V = (float *)pn_ptr(v);
        const float *G = (const float *)pn_ptr(g);
        const int64_t nb = (n + ADAM_BLOCK - 1) / ADAM_BLOCK;
        #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t lo = b * ADAM_BLOCK, len = n - lo < ADAM_BLOCK ? n - lo : ADAM_BLOCK;
            adam_block_f32(P + lo, M + lo, V + lo, G + lo, len, &h);
        }
    } else {
        double *P = (double *)pn_ptr(p), *M = (double *)pn_ptr(m), *V = (double *)pn_ptr(v);
        const double *G = (const double *)pn_ptr(g);
        #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) pn_adam_elem(&h, G[i], &P[i], &M[i], &V[i]);
    }
    return PN_OK;
}

#define SGD_BODY(T)                                                                   \
    do {                                                                              \
        T *P = (T *)pn_ptr(p), *Bf = buf ? (T *)pn_ptr(buf) : NULL;                   \
        const T *G = (const T *)pn_ptr(g);                                            \
        _Pragma("omp parallel for if (n > PN_PAR_MIN) schedule(static)")              \
        for (int64_t i = 0; i < n; i++) {                                             \
            double pi = P[i], bi = Bf ? (double)Bf[i] : 0;                            \
            pn_sgd_elem(G[i], &pi, &bi, Bf != NULL, lr, momentum, dampening, weight_decay, nesterov, first_step); \
            if (Bf) Bf[i] = (T)bi;                                                    \
            P[i] = (T)pi;                                                             \
        }                                                                             \
    } while (0)

pn_status pn_sgd_step_(pn_tensor *p, const pn_tensor *g, pn_tensor *buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov, int first_step) {
    PN_TRY(check_same("sgd_step", "param", p, "grad", g));
    if (buf) PN_TRY(check_same("sgd_step", "param", p, "momentum_buffer", buf));
    if (momentum != 0 && !buf) return pn_error(PN_ERR_ARG, "sgd_step: momentum %g needs a momentum buffer", momentum);
    if (nesterov && (momentum <= 0 || dampening != 0))
        return pn_error(PN_ERR_ARG, "sgd_step: nesterov needs momentum > 0 and dampening 0");
    int dev;
    const pn_kernels *k;
    PN_TRY(pn_kernels_for("sgd_step", 3, (const pn_tensor *const[]){p, g, buf},
                          (const char *const[]){"param", "grad", "momentum_buffer"}, &dev, &k));
    pn_bump_version(p);
    if (buf) pn_bump_version(buf);
    return PN_KCALL("sgd_step", k, sgd_step, p, g, buf, lr, momentum, dampening, weight_decay, nesterov, first_step);
}

/* CPU kernel: all contiguous, one shape and float dtype; buf NULL without momentum */
pn_status pn_cpu_sgd_step(pn_tensor *p, const pn_tensor *g, pn_tensor *buf, double lr, double momentum,
                          double dampening, double weight_decay, int nesterov, int first_step) {
    int64_t n = pn_numel(p);
    if (p->dt == PN_F32) SGD_BODY(float);
    else SGD_BODY(double);
    return PN_OK;
}
