/* lin_state.c — recurrent inference states for cosine and power attention (DESIGN §3.2):
 * one position at a time, memory constant in sequence length, no autograd.
 *
 * cosine (Cottention Eq. 8): S ← S + k̂ vᵀ, n ← n + 1, out = n^{−σ(m_h)} q̂ᵀ S
 * power (sympow, gated):     S ← γ S + φ(k) vᵀ, z ← γ z + φ(k), γ = exp(log_gate) (1 without),
 *                            out = Sᵀφ(scale·q) / z·φ(scale·q)   (0 when the denominator is 0)
 * The key of step t enters the state before its query reads it, so step t returns row t of
 * the causal parallel form (cosine.c, power.c) fed with the same rows. S is (B, H, D', Dv)
 * and z (B, H, D') with D' = D (cosine) or C(D+p−1, p) (power), kept in f64 for both dtypes
 * (long sequences accumulate without drift); inputs and outputs use the state's dtype.
 * S and z are f64 tensors on the state's device (cosine: m's; power: the cpu until its first
 * step, then q's: its creator takes no tensor), updated by that device's lin_state_step kernel. */
#include "linear.h"

#include "lin_state.h"

enum { KIND_COSINE = PN_LIN_COSINE, KIND_POWER = PN_LIN_POWER };

static const char *state_name(const pn_lin_state *s) { return s->kind == KIND_POWER ? "power_state" : "cosine_state"; }

void pn_lin_state_free(pn_lin_state *s) {
    if (!s) return;
    pn_release(s->m);
    pn_sympow_table_free(s->tab);
    pn_release(s->S);
    pn_release(s->z);
    free(s);
}

static pn_status check_dims(const char *op, int64_t B, int64_t H, int64_t D, int64_t Dv, int dtype) {
    if (B < 1 || H < 1 || D < 1 || Dv < 1)
        return pn_error(PN_ERR_ARG, "%s: batch %lld, heads %lld, dim %lld and dim_v %lld must all be >= 1", op,
                        (long long)B, (long long)H, (long long)D, (long long)Dv);
    if (dtype != PN_F32 && dtype != PN_F64)
        return pn_error(PN_ERR_DTYPE, "%s: dtype %s, expected f32 or f64", op, pn_dtype_name(dtype));
    return PN_OK;
}

/* S (and z) zeroed tensors on device dev (counted in pn_live_bytes) */
static pn_lin_state *alloc_state(const char *op, pn_lin_state *s, bool with_z, int dev) {
    const int64_t n = s->B * s->H * s->Dp;
    if (n > INT64_MAX / 8 / s->Dv) {
        pn_lin_state_free(s);
        return pn_error_null(PN_ERR_ARG, "%s: state of %lld x %lld elements is too large", op, (long long)n,
                             (long long)s->Dv);
    }
    s->S = pn_zeros(4, (int64_t[]){s->B, s->H, s->Dp, s->Dv}, PN_F64, dev);
    if (s->S && with_z) s->z = pn_zeros(3, (int64_t[]){s->B, s->H, s->Dp}, PN_F64, dev);
    if (!s->S || (with_z && !s->z)) {
        pn_lin_state_free(s);
        return NULL; /* pn_zeros set the error */
    }
    return s;
}

pn_lin_state *pn_cosine_state_new(int64_t B, int64_t H, int64_t D, int64_t Dv, pn_tensor *m, int dtype) {
    const char *op = "cosine_state";
    if (check_dims(op, B, H, D, Dv, dtype)) return NULL;
    if (!m) return pn_error_null(PN_ERR_ARG, "%s: m (one stabiliser per head, shape [%lld]) is required", op, (long long)H);
    if (pn_check_float(op, "m", m)) return NULL;
    if (m->nd != 1 || m->sizes[0] != H)
        return pn_error_null(PN_ERR_SHAPE, "%s: m %s must have shape [%lld] (one per head)", op, pn_shape_str(m),
                             (long long)H);
    pn_lin_state *s = calloc(1, sizeof *s);
    if (!s) return pn_error_null(PN_ERR_OOM, "%s: out of memory", op);
    s->m = pn_contig_copy(m); /* a constant of the state: a copy without history */
    if (!s->m) {
        free(s);
        return NULL;
    }
    s->kind = KIND_COSINE, s->dt = dtype, s->B = B, s->H = H, s->D = D, s->Dv = Dv, s->Dp = D;
    return alloc_state(op, s, false, m->dev);
}

pn_lin_state *pn_power_state_new(int64_t B, int64_t H, int64_t D, int64_t Dv, int p, double scale, int dtype) {
    const char *op = "power_state";
    if (check_dims(op, B, H, D, Dv, dtype)) return NULL;
    if (p < 2 || p % 2 || p > PN_SYMPOW_MAX_P)
        return pn_error_null(PN_ERR_ARG, "%s: p = %d must be even and in [2, %d]", op, p, PN_SYMPOW_MAX_P);
    if (isnan(scale)) scale = 1;
    if (!isfinite(scale)) return pn_error_null(PN_ERR_ARG, "%s: scale %g is not finite", op, scale);
    pn_sympow_table *tab = pn_sympow_table_new(op, D, p);
    if (!tab) return NULL;
    pn_lin_state *s = calloc(1, sizeof *s);
    if (!s) {
        pn_sympow_table_free(tab);
        return pn_error_null(PN_ERR_OOM, "%s: out of memory", op);
    }
    s->kind = KIND_POWER, s->dt = dtype, s->p = p, s->scale = scale, s->tab = tab;
    s->B = B, s->H = H, s->D = D, s->Dv = Dv, s->Dp = tab->Dp;
    return alloc_state(op, s, true, PN_CPU);
}

void pn_lin_state_reset(pn_lin_state *s) {
    if (!s) return;
    (void)pn_fill_(s->S, 0); /* cannot fail: S and z were filled at creation by the same kernel */
    if (s->z) (void)pn_fill_(s->z, 0);
    s->steps = 0;
}

/* Beam search keeps, repeats and drops rows of the batch between steps: S and z become their
 * rows idx (1-D i32/i64, 0-based, each in [0, B)), and the batch size becomes len(idx). */
pn_status pn_lin_state_reorder(pn_lin_state *s, pn_tensor *idx) {
    if (!s) return pn_error(PN_ERR_ARG, "lin_state_reorder: state is nil (freed?)");
    const char *op = state_name(s);
    if (!idx) return pn_error(PN_ERR_ARG, "%s.reorder: idx is nil", op);
    if (idx->nd != 1 || (idx->dt != PN_I64 && idx->dt != PN_I32) || idx->sizes[0] < 1)
        return pn_error(PN_ERR_SHAPE, "%s.reorder: idx %s %s must be a non-empty 1-D i64 or i32 tensor", op,
                        pn_dtype_name(idx->dt), pn_shape_str(idx));
    pn_tensor *S = pn_index_select(s->S, 0, idx); /* checks every index against B */
    if (!S) return PN_ERR_ARG;
    pn_tensor *z = NULL;
    if (s->z && !(z = pn_index_select(s->z, 0, idx))) {
        pn_release(S);
        return PN_ERR_ARG;
    }
    pn_release(s->S), pn_release(s->z);
    s->S = S, s->z = z, s->B = idx->sizes[0];
    return PN_OK;
}

int64_t pn_lin_state_bytes(const pn_lin_state *s) {
    if (!s) return 0;
    int64_t n = (int64_t)sizeof *s + pn_numel(s->S) * (int64_t)sizeof(double);
    if (s->z) n += pn_numel(s->z) * (int64_t)sizeof(double);
    if (s->m) n += pn_numel(s->m) * (int64_t)pn_elsize(s->m->dt);
    if (s->tab) n += (int64_t)sizeof *s->tab + s->tab->Dp * (int64_t)(s->tab->p * sizeof(int32_t) + sizeof(double));
    return n;
}

/* t must be (B, H, n) in the state's dtype, on the state's device */
static pn_status check_row(const pn_lin_state *s, const char *arg, const pn_tensor *t, int64_t n) {
    const char *op = state_name(s);
    if (!t) return pn_error(PN_ERR_ARG, "%s.step: %s is nil", op, arg);
    if (t->dev != s->S->dev)
        return pn_error(PN_ERR_DEVICE, "%s.step: %s %s is on %s but the state is on %s", op, arg, pn_shape_str(t),
                        pn_device_name(t->dev), pn_device_name(s->S->dev));
    if (t->dt != s->dt)
        return pn_error(PN_ERR_DTYPE, "%s.step: %s %s %s must have the state's dtype %s", op, arg, pn_dtype_name(t->dt),
                        pn_shape_str(t), pn_dtype_name(s->dt));
    int64_t want[3] = {s->B, s->H, n};
    int nd = n ? 3 : 2;
    if (t->nd != nd || memcmp(t->sizes, want, sizeof(int64_t) * (size_t)nd))
        return pn_error(PN_ERR_SHAPE, "%s.step: %s %s must have shape %s", op, arg, pn_shape_str(t),
                        pn_dims_str(nd, want));
    return PN_OK;
}

/* A power state's creator takes no tensor, so it starts on the cpu; at its first step (none
 * seen since creation or reset) it moves to the device of q, where that is another one: S and z
 * are zeros then, made there by that device's kernels (pn_zeros). */
static pn_status adopt_device(pn_lin_state *s, const pn_tensor *q) {
    if (s->kind != KIND_POWER || s->steps || !q || q->dev == s->S->dev) return PN_OK;
    pn_tensor *S = pn_zeros(s->S->nd, s->S->sizes, PN_F64, q->dev);
    pn_tensor *z = S ? pn_zeros(s->z->nd, s->z->sizes, PN_F64, q->dev) : NULL;
    if (!S || !z) {
        pn_release(S);
        return PN_ERR_OOM; /* pn_zeros set the error */
    }
    pn_release(s->S), pn_release(s->z);
    s->S = S, s->z = z;
    return PN_OK;
}

pn_tensor *pn_lin_state_step(pn_lin_state *s, pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *log_gate) {
    if (!s) return pn_error_null(PN_ERR_ARG, "lin_state_step: state is nil (freed?)");
    const char *op = state_name(s);
    if (adopt_device(s, q)) return NULL;
    if (check_row(s, "q", q, s->D) || check_row(s, "k", k, s->D) || check_row(s, "v", v, s->Dv)) return NULL;
    if (log_gate && s->kind == KIND_COSINE)
        return pn_error_null(PN_ERR_ARG, "%s.step: cosine attention has no gates; log_gate must be nil", op);
    if (log_gate && check_row(s, "log_gate", log_gate, 0)) return NULL;

    pn_tensor *qc = pn_contig(q), *kc = pn_contig(k), *vc = pn_contig(v);
    pn_tensor *gc = log_gate ? pn_contig(log_gate) : NULL;
    int64_t shape[3] = {s->B, s->H, s->Dv};
    pn_tensor *out = (qc && kc && vc && (gc || !log_gate)) ? pn_empty(3, shape, s->dt, s->S->dev) : NULL;
    if (out && PN_KCALL_ON(op, out, lin_state_step, s, qc, kc, vc, gc, out)) {
        pn_release(out);
        out = NULL; /* the state may be partly updated: reset it before reuse */
    }
    if (out) s->steps++;
    pn_release(qc), pn_release(kc), pn_release(vc), pn_release(gc);
    return out;
}

/* CPU kernel: q, k (B, H, D), v, out (B, H, Dv), gc (B, H) log gates or NULL, contiguous; S, z
 * of the state updated in place; the step is position s->steps + 1 */
pn_status pn_cpu_lin_state_step(pn_lin_state *s, const pn_tensor *qc, const pn_tensor *kc, const pn_tensor *vc,
                                const pn_tensor *gc, pn_tensor *out) {
    const char *op = state_name(s);
    const int64_t BH = s->B * s->H, D = s->D, Dv = s->Dv, Dp = s->Dp;
    const int64_t n = s->steps + 1; /* positions including this one */
    int oom = 0;
    #pragma omp parallel if (BH * Dp * Dv > PN_PAR_MIN)
    {
        double *buf = malloc(sizeof(double) * (size_t)(2 * D + 2 * Dv + Dp));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            double *x = buf, *xs = x + D, *vr = xs + D, *o = vr + Dv, *ph = o + Dv;
            double *S = (double *)pn_ptr(s->S) + bh * Dp * Dv;
            ld_row(pn_ptr(vc), s->dt, bh * Dv, Dv, vr);
            ld_row(pn_ptr(kc), s->dt, bh * D, D, x);
            if (s->kind == KIND_COSINE) {
                cos_normalize(x, ph, D);
                for (int64_t d = 0; d < D; d++)
                    for (int64_t e = 0; e < Dv; e++) S[d * Dv + e] += ph[d] * vr[e];
                ld_row(pn_ptr(qc), s->dt, bh * D, D, x);
                cos_normalize(x, ph, D);
                const double sig = cos_sigmoid(pn_ld(pn_ptr(s->m), s->m->dt, bh % s->H));
                const double c = count_scale(n, sig);
                for (int64_t e = 0; e < Dv; e++) o[e] = 0;
                for (int64_t d = 0; d < D; d++)
                    for (int64_t e = 0; e < Dv; e++) o[e] += c * ph[d] * S[d * Dv + e];
            } else {
                double *z = (double *)pn_ptr(s->z) + bh * Dp;
                if (gc) {
                    const double gam = exp(pn_ld(pn_ptr(gc), s->dt, bh));
                    for (int64_t i = 0; i < Dp * Dv; i++) S[i] *= gam;
                    for (int64_t i = 0; i < Dp; i++) z[i] *= gam;
                }
                pn_sympow_apply(s->tab, x, ph);
                for (int64_t d = 0; d < Dp; d++) {
                    z[d] += ph[d];
                    for (int64_t e = 0; e < Dv; e++) S[d * Dv + e] += ph[d] * vr[e];
                }
                ld_row(pn_ptr(qc), s->dt, bh * D, D, x);
                for (int64_t d = 0; d < D; d++) xs[d] = s->scale * x[d];
                pn_sympow_apply(s->tab, xs, ph);
                double den = dotd(ph, z, Dp);
                for (int64_t e = 0; e < Dv; e++) o[e] = 0;
                for (int64_t d = 0; d < Dp; d++)
                    for (int64_t e = 0; e < Dv; e++) o[e] += ph[d] * S[d * Dv + e];
                for (int64_t e = 0; e < Dv; e++) o[e] = den != 0 ? o[e] / den : 0;
            }
            st_row(pn_ptr(out), s->dt, bh * Dv, Dv, o);
        }
        free(buf);
    }
    if (oom) return pn_error(PN_ERR_OOM, "%s.step: out of memory", op);
    return PN_OK;
}
