/* lin_state.cu — the CUDA twin of attention/lin_state.c's step: one position of the recurrent
 * cosine / power state, S and z (f64) updated in place on the device.
 *
 * cosine: one thread per (b, h, e) owns the column S[:, e]: it normalises k and q itself (the
 *         CPU's cos_normalize), adds k̂ v_e and reads out_e = n^{−σ} q̂·S[:, e] in the CPU's order.
 * power:  one block per (b, h): thread 0 forms φ(k) and φ(scale·q) (sympow_apply_raw, the CPU's
 *         function; the table uploaded for the call) into f64 scratch, then the threads decay
 *         and grow the columns of S and the entries of z, and after a barrier each thread reads
 *         its columns' out_e = S[:, e]ᵀφ(q) / z·φ(q) (0 when the denominator is 0).
 * Every sum has one owner and the CPU's order: deterministic. */
#include "linear.cuh"
#include "../../attention/lin_state.h"

namespace {

struct ls_geo {
    int64_t BH, H, D, Dv, Dp;
    int64_t n;     /* positions including this one */
    double scale;
    const void *m; /* cosine: (H) */
    int mdt;
};

// q, k (BH, D), v, out (BH, Dv); S (BH, D, Dv)
template <class T>
__global__ void ls_cosine(ls_geo a, const T *q, const T *k, const T *v, T *out, double *S) {
    const int64_t D = a.D, Dv = a.Dv;
    PN_CU_LOOP(it, a.BH * Dv) {
        const int64_t bh = it / Dv, e = it % Dv;
        double *Sb = S + bh * D * Dv;
        const T *K = k + bh * D, *Q = q + bh * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)K[d] * (double)K[d];
        double r = 1.0 / sqrt(ss + PN_COSINE_EPS);
        const double ve = v[bh * Dv + e];
        for (int64_t d = 0; d < D; d++) Sb[d * Dv + e] += ((double)K[d] * r) * ve;
        ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)Q[d] * (double)Q[d];
        r = 1.0 / sqrt(ss + PN_COSINE_EPS);
        const double c = count_scale(a.n, cos_sigmoid(pn_ld(a.m, a.mdt, bh % a.H)));
        double o = 0;
        for (int64_t d = 0; d < D; d++) o += c * ((double)Q[d] * r) * Sb[d * Dv + e];
        out[bh * Dv + e] = (T)o;
    }
}

// one block per (b, h); S (BH, Dp, Dv), z (BH, Dp); lg (BH) or NULL; scratch (BH, D + 2 Dp)
template <class T>
__global__ void ls_power(ls_geo a, lin_tab tab, const T *q, const T *k, const T *v, const T *lg, T *out, double *S,
                         double *z, double *scratch) {
    const int64_t D = a.D, Dv = a.Dv, Dp = a.Dp;
    for (int64_t bh = blockIdx.x; bh < a.BH; bh += gridDim.x) {
        double *x = scratch + bh * (D + 2 * Dp), *pk = x + D, *pq = pk + Dp;
        double *Sb = S + bh * Dp * Dv, *zb = z + bh * Dp;
        if (threadIdx.x == 0) {
            for (int64_t d = 0; d < D; d++) x[d] = k[bh * D + d];
            lin_phi(tab, x, pk);
            for (int64_t d = 0; d < D; d++) x[d] = a.scale * (double)q[bh * D + d];
            lin_phi(tab, x, pq);
        }
        __syncthreads();
        const double gam = lg ? exp((double)lg[bh]) : 1;
        for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) {
            const double ve = v[bh * Dv + e];
            for (int64_t d = 0; d < Dp; d++) {
                if (lg) Sb[d * Dv + e] *= gam;
                Sb[d * Dv + e] += pk[d] * ve;
            }
        }
        for (int64_t d = threadIdx.x; d < Dp; d += blockDim.x) {
            if (lg) zb[d] *= gam;
            zb[d] += pk[d];
        }
        __syncthreads(); /* z complete before any thread reads it */
        const double den = dotd(pq, zb, Dp);
        for (int64_t e = threadIdx.x; e < Dv; e += blockDim.x) {
            double o = 0;
            for (int64_t d = 0; d < Dp; d++) o += pq[d] * Sb[d * Dv + e];
            out[bh * Dv + e] = (T)(den != 0 ? o / den : 0);
        }
        __syncthreads(); /* the scratch row is rewritten for the next (b, h) of this block */
    }
}

} // namespace

/* q, k (B, H, D), v, out (B, H, Dv), gc (B, H) or NULL, contiguous, on the device with the
 * state's S, z; the step is position s->steps + 1 */
pn_status pn_cuda_lin_state_step(pn_lin_state *s, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                 const pn_tensor *gc, pn_tensor *out) {
    const char *op = s->kind == PN_LIN_POWER ? "power_state.step" : "cosine_state.step";
    ls_geo a;
    a.BH = s->B * s->H, a.H = s->H, a.D = s->D, a.Dv = s->Dv, a.Dp = s->Dp, a.n = s->steps + 1, a.scale = s->scale;
    a.m = s->m ? pn_ptr(s->m) : NULL, a.mdt = s->m ? s->m->dt : 0;
    if (s->S->dev != PN_CUDA || (s->z && s->z->dev != PN_CUDA) || (s->m && s->m->dev != PN_CUDA))
        return pn_error(PN_ERR_DEVICE, "%s: the state's S, z and m must be on cuda", op);
    if (s->kind != PN_LIN_POWER) {
        PN_CU_FLOAT_SWITCH(s->dt, T, {
            auto kn = ls_cosine<T>;
            PN_CU_TRY(op, PN_LAUNCH(kn, pn_cu_blocks(a.BH * a.Dv, 64), 64, 0, pn_cu_stream(), a,
                                    (const T *)pn_ptr(q), (const T *)pn_ptr(k), (const T *)pn_ptr(v), (T *)pn_ptr(out),
                                    (double *)pn_ptr(s->S)));
        });
        return PN_OK;
    }
    lin_scratch sc = {};
    lin_tab tab;
    pn_status st = lin_tab_upload(op, s->tab, sc, &tab);
    double *scr = st ? NULL : (double *)lin_alloc(sc, a.BH * (a.D + 2 * a.Dp), PN_F64);
    if (!st && !scr) st = pn_error(PN_ERR_OOM, "%s: out of device memory", op);
    if (!st)
        PN_CU_FLOAT_SWITCH(s->dt, T, {
            auto kn = ls_power<T>;
            const unsigned nb = (unsigned)(a.BH < 65535 ? a.BH : 65535);
            st = pn_cu_check(op, PN_LAUNCH(kn, nb, 64, 0, pn_cu_stream(), a, tab, (const T *)pn_ptr(q),
                                           (const T *)pn_ptr(k), (const T *)pn_ptr(v),
                                           gc ? (const T *)pn_ptr(gc) : (const T *)NULL, (T *)pn_ptr(out),
                                           (double *)pn_ptr(s->S), (double *)pn_ptr(s->z), scr));
        });
    lin_free(sc);
    return st;
}
