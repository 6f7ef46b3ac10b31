/* loss.cu — the CUDA twins of ops/loss.c: the per-row / per-element losses before the reduction
 * (the front end reduces with pn_reduce) and their gradients.
 *
 * Cross entropy: one block per row (grid-stride), the row max, Σ exp(x − max) and Σ x in double
 * by a fixed shared-memory tree; the backward is one thread per element. The elementwise losses'
 * formulas are loss.h's (shared with the CPU). */
#include "../cuda.cuh"
#include "../../ops/loss.h"

enum { CE_MAX_THREADS = 128 };

static int ce_threads(int64_t C) {
    int t = 32;
    while (t < CE_MAX_THREADS && t < C) t *= 2;
    return t;
}

/* target value of row i: t (any stride ts), i32 or i64 */
__device__ static inline int64_t target_at(const void *t, int dt, int64_t ts, int64_t i) { return pn_ldi(t, dt, i * ts); }

/* The factor of row i's local gradient: g[i] (none), g (sum), g/count (mean); g (N) stride gs
 * or 0-dim */
__device__ static inline double gscale(const void *g, int gdt, int64_t gs, int red, double count, int64_t i) {
    if (red == PN_REDUCE_NONE) return pn_ld(g, gdt, i * gs);
    double v = pn_ld(g, gdt, 0);
    return red == PN_REDUCE_MEAN ? v / count : v;
}

// x: (N, C) contiguous T; target: (N) stride ts; L: (N) T; lse: (N) f64
template <class T>
__global__ void ce_fwd_kernel(int64_t N, int64_t C, const T *x, const void *target, int tdt, int64_t ts,
                              int64_t ign, double eps, T *L, double *lse) {
    PN_SHARED(double, ra, CE_MAX_THREADS);
    PN_SHARED(double, rb, CE_MAX_THREADS);
    int tid = threadIdx.x;
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const T *xr = x + i * C;
        /* max, NaN ignored (as the CPU's fmax / compare): a NaN shows in the sum instead */
        double m = -INFINITY;
        for (int64_t j = tid; j < C; j += blockDim.x) m = fmax(m, (double)xr[j]);
        ra[tid] = m;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) ra[tid] = fmax(ra[tid], ra[tid + s]);
            __syncthreads();
        }
        m = ra[0];
        __syncthreads();
        double se = 0, sx = 0;
        for (int64_t j = tid; j < C; j += blockDim.x) {
            se += exp((double)xr[j] - m);
            sx += (double)xr[j];
        }
        ra[tid] = se;
        rb[tid] = sx;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s) {
                ra[tid] += ra[tid + s];
                rb[tid] += rb[tid + s];
            }
            __syncthreads();
        }
        if (tid == 0) {
            double z = m + log(ra[0]);
            lse[i] = z;
            int64_t t = target_at(target, tdt, ts, i);
            double loss = 0;
            if (t != ign) {
                loss = (1 - eps) * (z - (double)xr[t]);
                if (eps > 0) loss += eps * (z - rb[0] / (double)C);
            }
            L[i] = (T)loss;
        }
        __syncthreads(); /* ra, rb are rewritten for the next row */
    }
}

pn_status pn_cuda_cross_entropy_fwd(const pn_tensor *x, const pn_tensor *target, int64_t ignore_index, double eps,
                                    pn_tensor *L, pn_tensor *lse) {
    int64_t N = x->sizes[0], C = x->sizes[1];
    if (!N) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = ce_fwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(N, 1), ce_threads(C), 0, pn_cu_stream(), N, C, (const T *)pn_ptr(x),
                      (const void *)pn_ptr(target), target->dt, target->strides[0], ignore_index, eps,
                      (T *)pn_ptr(L), (double *)pn_ptr(lse));
    });
    return pn_cu_check("cross_entropy", e);
}

// gx (N, C) = s · (softmax − (1−ε)·onehot(t) − ε/C) per row, 0 on ignored rows; f32 in float as the CPU
template <class T>
__global__ void ce_bwd_kernel(int64_t N, int64_t C, const T *x, const void *target, int tdt, int64_t ts,
                              const double *lse, const void *g, int gdt, int64_t gs, int64_t ign, int red,
                              double count, double eps, T *gx) {
    PN_CU_LOOP(p, N * C) {
        int64_t i = p / C, j = p - i * C, t = target_at(target, tdt, ts, i);
        if (t == ign) {
            gx[p] = 0;
            continue;
        }
        double s = gscale(g, gdt, gs, red, count, i);
        if (sizeof(T) == 4) {
            float sf = (float)s, v = sf * (expf((float)x[p] - (float)lse[i]) - (float)(eps / (double)C));
            if (j == t) v -= sf * (float)(1.0 - eps);
            gx[p] = (T)v;
        } else {
            double v = s * (exp((double)x[p] - lse[i]) - eps / (double)C);
            if (j == t) v -= s * (1.0 - eps);
            gx[p] = (T)v;
        }
    }
}

pn_status pn_cuda_cross_entropy_bwd(const pn_tensor *x, const pn_tensor *target, const pn_tensor *lse,
                                    const pn_tensor *g, int64_t ign, int red, double count, double eps,
                                    pn_tensor *gx) {
    int64_t N = x->sizes[0], C = x->sizes[1];
    if (!N || !C) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = ce_bwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(N * C), PN_CU_THREADS, 0, pn_cu_stream(), N, C, (const T *)pn_ptr(x),
                      (const void *)pn_ptr(target), target->dt, target->strides[0], (const double *)pn_ptr(lse),
                      (const void *)pn_ptr(g), g->dt, g->nd ? g->strides[0] : (int64_t)0, ign, red, count, eps,
                      (T *)pn_ptr(gx));
    });
    return pn_cu_check("cross_entropy", e);
}

// L (N) = −logp[i, t_i] (0 on ignored rows); logp (N, C) strides (s0, s1)
__global__ void nll_fwd_kernel(int64_t N, const char *logp, int ldt, int64_t s0, int64_t s1, const void *target,
                               int tdt, int64_t ts, int64_t ign, void *L, int Ldt) {
    PN_CU_LOOP(i, N) {
        int64_t t = target_at(target, tdt, ts, i);
        double v = t == ign ? 0.0 : -pn_ld(logp, ldt, i * s0 + t * s1);
        pn_st(L, Ldt, i, v);
    }
}

pn_status pn_cuda_nll_fwd(const pn_tensor *logp, const pn_tensor *target, int64_t ignore_index, pn_tensor *L) {
    int64_t N = L->sizes[0];
    if (!N) return PN_OK;
    return pn_cu_check("nll_loss", PN_LAUNCH(nll_fwd_kernel, pn_cu_blocks(N), PN_CU_THREADS, 0, pn_cu_stream(), N,
                                             (const char *)pn_ptr(logp), logp->dt, logp->strides[0],
                                             logp->strides[1], (const void *)pn_ptr(target), target->dt,
                                             target->strides[0], ignore_index, (void *)pn_ptr(L), L->dt));
}

// gx (N, C) zeroed: −scale at (i, t_i)
__global__ void nll_bwd_kernel(int64_t N, int64_t C, const void *target, int tdt, int64_t ts, const void *g, int gdt,
                               int64_t gs, int64_t ign, int red, double count, void *gx, int gxdt) {
    PN_CU_LOOP(i, N) {
        int64_t t = target_at(target, tdt, ts, i);
        if (t == ign) continue;
        pn_st(gx, gxdt, i * C + t, -gscale(g, gdt, gs, red, count, i));
    }
}

pn_status pn_cuda_nll_bwd(const pn_tensor *target, const pn_tensor *g, int64_t ignore_index, int reduction,
                          double count, pn_tensor *gx) {
    int64_t N = gx->sizes[0], C = gx->sizes[1];
    if (!N || !C) return PN_OK;
    return pn_cu_check("nll_loss", PN_LAUNCH(nll_bwd_kernel, pn_cu_blocks(N), PN_CU_THREADS, 0, pn_cu_stream(), N, C,
                                             (const void *)pn_ptr(target), target->dt, target->strides[0],
                                             (const void *)pn_ptr(g), g->dt, g->nd ? g->strides[0] : (int64_t)0,
                                             ignore_index, reduction, count, (void *)pn_ptr(gx), gx->dt));
}

// L = loss(x, y) elementwise over x's shape; any strides
template <class T>
__global__ void elem_loss_fwd_kernel(int kind, pn_cu_shape sh, int64_t n, pn_cu_arg L, pn_cu_arg x, pn_cu_arg y) {
    PN_CU_LOOP(i, n) {
        double xv = ((const T *)x.p)[pn_cu_off(sh, x, i)], yv = ((const T *)y.p)[pn_cu_off(sh, y, i)];
        ((T *)L.p)[pn_cu_off(sh, L, i)] = (T)pn_elem_loss(kind, xv, yv);
    }
}

pn_status pn_cuda_elem_loss_fwd(int kind, const pn_tensor *x, const pn_tensor *y, pn_tensor *L) {
    int64_t n = pn_numel(x);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(x->nd, x->sizes);
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = elem_loss_fwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), kind, sh, n, pn_cu_arg_of(L, sh),
                      pn_cu_arg_of(x, sh), pn_cu_arg_of(y, sh));
    });
    return pn_cu_check(kind == PN_LOSS_BCE ? "bce_with_logits" : "mse_loss", e);
}

// o = g · scale · dloss/d(x or y); g x-shaped or 0-dim (broadcast: stride 0)
template <class T>
__global__ void elem_loss_bwd_kernel(int kind, int wrt, double scale, pn_cu_shape sh, int64_t n, pn_cu_arg o,
                                     pn_cu_arg x, pn_cu_arg y, pn_cu_arg g) {
    PN_CU_LOOP(i, n) {
        double xv = ((const T *)x.p)[pn_cu_off(sh, x, i)], yv = ((const T *)y.p)[pn_cu_off(sh, y, i)];
        double gv = ((const T *)g.p)[pn_cu_off(sh, g, i)];
        ((T *)o.p)[pn_cu_off(sh, o, i)] = (T)(gv * scale * pn_elem_dloss(kind, wrt, xv, yv));
    }
}

pn_status pn_cuda_elem_loss_bwd(int kind, int wrt, double scale, const pn_tensor *x, const pn_tensor *y,
                                const pn_tensor *g, pn_tensor *o) {
    int64_t n = pn_numel(x);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(x->nd, x->sizes);
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = elem_loss_bwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), kind, wrt, scale, sh, n,
                      pn_cu_arg_of(o, sh), pn_cu_arg_of(x, sh), pn_cu_arg_of(y, sh), pn_cu_arg_of(g, sh));
    });
    return pn_cu_check(kind == PN_LOSS_BCE ? "bce_with_logits" : "mse_loss", e);
}
