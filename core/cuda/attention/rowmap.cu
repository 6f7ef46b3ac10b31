/* rowmap.cu — the CUDA twins of attention/rowmap.c's kernels: the row driver of the manifold maps
 * (ψ, ξ, pseudo-polar, exp0) and the hyperbolic toolkit (expmap0, logmap0, project, ⊕, dist,
 * the Klein conversions).
 *
 * One thread per point (grid-stride): it gathers its row(s) of x (and y) into double scratch,
 * runs the map's row kernel — the very functions the CPU runs (maps_rows.h, hyperbolic_rows.h,
 * PN_HD), chosen by m->kind since a device cannot call the host's fwd_rows — and stores the
 * result in the tensor's dtype. The scratch is global memory, one slot of rows per thread of
 * the grid (the row kernels take arrays of any length D).
 *
 * The first rejected point (row-major, as the CPU reports it): every rejected row takes part in
 * an atomicMin of its index (order-independent, so deterministic), then one thread re-runs the
 * row kernel on that row to get its argument and value, and the launcher downloads the three. */
#include "../cuda.cuh"

#include "../../attention/hyperbolic_rows.h"
#include "../../attention/maps_rows.h"

namespace {

/* the row kernels by kind (rowmap.h's PN_RM_*); 0 for an unknown kind (the launcher refuses it) */
__device__ int rm_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
#define FWD(name) \
    case PN_RM_##name: return name##_fwd(m, x, y, out, bad);
    switch (m->kind) {
        PN_RM_KINDS(FWD)
    default: return 0;
    }
#undef FWD
}

__device__ void rm_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                       double *gy) {
#define BWD(name) \
    case PN_RM_##name: name##_bwd(m, x, y, g, gx, gy); break;
    switch (m->kind) {
        PN_RM_KINDS(BWD)
    default: break;
    }
#undef BWD
}

/* a strided row of n numbers (f32/f64) → double */
__device__ void gather(const pn_cu_arg &a, int64_t off, int64_t st, int64_t n, double *dst) {
    if (a.dt == PN_F32)
        for (int64_t k = 0; k < n; k++) dst[k] = ((const float *)a.p)[off + k * st];
    else
        for (int64_t k = 0; k < n; k++) dst[k] = ((const double *)a.p)[off + k * st];
}

__device__ void scatter(char *p, int dt, int64_t off, int64_t n, const double *src) {
    if (dt == PN_F32)
        for (int64_t k = 0; k < n; k++) ((float *)p)[off + k] = (float)src[k];
    else
        for (int64_t k = 0; k < n; k++) ((double *)p)[off + k] = src[k];
}

/* a point: its x (and y) rows, by linear batch index pt */
struct rows_in {
    pn_cu_shape sh; /* the batch shape */
    pn_cu_arg x, y; /* batch strides */
    int64_t xst, yst;
    int has_y;
};

__device__ void load_point(const rows_in &in, int64_t D, int64_t pt, double *xs, double *ys) {
    gather(in.x, pn_cu_off(in.sh, in.x, pt), in.xst, D, xs);
    if (in.has_y) gather(in.y, pn_cu_off(in.sh, in.y, pt), in.yst, D, ys);
}

/* out (n, Do) contiguous; scratch: 2D + Do doubles per thread of the grid; *bad: the smallest
 * rejected point (ULLONG_MAX when none) */
__global__ void rowmap_fwd_kernel(pn_rowmap m, rows_in in, int64_t n, char *out, double *scratch,
                                  unsigned long long *bad) {
    const int64_t D = m.D, Do = m.Dout > 0 ? m.Dout : 1;
    double *xs = scratch + ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * (2 * D + Do), *ys = xs + D,
           *os = ys + D;
    PN_CU_LOOP(pt, n) {
        load_point(in, D, pt, xs, ys);
        double bv = 0;
        if (rm_fwd(&m, xs, in.has_y ? ys : NULL, os, &bv)) atomicMin(bad, (unsigned long long)pt);
        scatter(out, m.dt, pt * Do, Do, os);
    }
}

/* one thread: the rejected point *bad (if any) again, for its argument and value: res[0] the
 * row (INT64_MAX: none), res[1] the argument (1 x, 2 y), res[2] the value's bits */
__global__ void rowmap_bad_kernel(pn_rowmap m, rows_in in, const unsigned long long *bad, double *scratch,
                                  int64_t *res) {
    const int64_t D = m.D;
    double *xs = scratch, *ys = xs + D, *os = ys + D;
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    res[0] = INT64_MAX, res[1] = 0, res[2] = 0;
    if (*bad == ~0ull) return;
    const int64_t pt = (int64_t)*bad;
    load_point(in, D, pt, xs, ys);
    double bv = 0;
    int r = rm_fwd(&m, xs, in.has_y ? ys : NULL, os, &bv);
    long long bits = 0;
    memcpy(&bits, &bv, sizeof bits);
    res[0] = pt, res[1] = r, res[2] = bits;
}

/* gx, gy (n, D) contiguous or NULL; g: gout's rows (Dg numbers, stride gst); scratch 4D + Dg */
__global__ void rowmap_bwd_kernel(pn_rowmap m, rows_in in, pn_cu_arg g, int64_t gst, int64_t n, char *gx, char *gy,
                                  double *scratch) {
    const int64_t D = m.D, Dg = m.Dout > 0 ? m.Dout : 1;
    double *xs = scratch + ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * (4 * D + Dg), *ys = xs + D,
           *gxs = ys + D, *gys = gxs + D, *gs = gys + D;
    PN_CU_LOOP(pt, n) {
        load_point(in, D, pt, xs, ys);
        gather(g, pn_cu_off(in.sh, g, pt), gst, Dg, gs);
        rm_bwd(&m, xs, in.has_y ? ys : NULL, gs, gxs, gys);
        if (gx) scatter(gx, m.dt, pt * D, D, gxs);
        if (gy) scatter(gy, m.dt, pt * D, D, gys);
    }
}

/* ---- host side ---------------------------------------------------------------------------------- */
/* rowmap.c's batch_strides: t's leading dims (all but the last) at the batch shape, right-aligned,
 * 0 where t has size 1 or lacks the dim */
void batch_strides(const pn_tensor *t, int nd, const int64_t *shape, int64_t *st) {
    int tnd = t->nd - 1;
    for (int i = 0; i < PN_MAX_DIMS; i++) st[i] = 0;
    for (int i = 0; i < nd; i++) {
        int j = tnd - nd + i;
        st[i] = (j >= 0 && t->sizes[j] == shape[i] && shape[i] != 1) ? t->strides[j] : 0;
    }
}

pn_status batch_shape(const pn_rowmap *m, const pn_tensor *x, const pn_tensor *y, int *nd, int64_t *shape) {
    if (!y) {
        *nd = x->nd - 1;
        memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)*nd);
        return PN_OK;
    }
    if (pn_broadcast_shape(m->op, x->nd - 1, x->sizes, y->nd - 1, y->sizes, nd, shape))
        return pn_error(PN_ERR_SHAPE, "%s: x %s and y %s: the leading dims do not broadcast", m->op, pn_shape_str(x),
                        pn_shape_str(y));
    return PN_OK;
}

pn_cu_arg arg_with(const pn_tensor *t, const int64_t *st) {
    pn_cu_arg a;
    a.p = pn_ptr(t);
    a.dt = t->dt;
    for (int i = 0; i < PN_MAX_DIMS; i++) a.stride[i] = st[i];
    return a;
}

/* the map as the device sees it: host pointers cleared (never read there) */
pn_rowmap device_map(const pn_rowmap *m) {
    pn_rowmap d = *m;
    d.op = d.bad_fmt = NULL;
    d.arg[0] = d.arg[1] = NULL;
    d.fwd_rows = NULL;
    d.bwd_rows = NULL;
    return d;
}

rows_in rows_of(int bnd, const int64_t *bshape, const pn_tensor *x, const pn_tensor *y) {
    rows_in in;
    in.sh = pn_cu_shape_of(bnd, bshape);
    int64_t st[PN_MAX_DIMS];
    batch_strides(x, bnd, bshape, st);
    in.x = arg_with(x, st);
    in.xst = x->strides[x->nd - 1];
    in.has_y = y != NULL;
    if (y) {
        batch_strides(y, bnd, bshape, st);
        in.y = arg_with(y, st);
        in.yst = y->strides[y->nd - 1];
    } else {
        in.y = in.x;
        in.yst = 0;
    }
    return in;
}

enum { RM_THREADS = 128 };
/* blocks for n points when each thread holds W doubles of scratch: enough to cover n, capped so
 * the scratch stays within 32 MiB (the grid-stride loop does the rest) */
unsigned rm_blocks(int64_t n, int64_t W) {
    int64_t cap = (4 << 20) / (W * RM_THREADS);
    if (cap < 1) cap = 1;
    int64_t b = pn_cu_blocks(n, RM_THREADS);
    return (unsigned)(b < cap ? b : cap);
}

pn_status check_kind(const pn_rowmap *m) {
    if (m->kind <= PN_RM_none || m->kind >= PN_RM_end)
        return pn_error(PN_ERR_ARG, "%s: this map has no CUDA row kernel (kind %d)", m->op, m->kind);
    return PN_OK;
}

} // namespace

pn_status pn_cuda_rowmap_fwd(const pn_rowmap *mp, const pn_tensor *x, const pn_tensor *y, pn_tensor *out,
                             int64_t *bad_row, int *bad_arg, double *bad_val) {
    *bad_row = INT64_MAX, *bad_arg = 0, *bad_val = 0;
    PN_TRY(check_kind(mp));
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    PN_TRY(batch_shape(mp, x, y, &bnd, bshape));
    const int64_t n = pn_shape_numel(bnd, bshape), D = mp->D, Do = mp->Dout > 0 ? mp->Dout : 1;
    if (n == 0) return PN_OK;
    const int64_t W = 2 * D + Do;
    const unsigned blocks = rm_blocks(n, W);
    const int64_t sshape[1] = {(int64_t)blocks * RM_THREADS * W}, bshape1[1] = {4};
    pn_tensor *scratch = pn_empty(1, sshape, PN_F64, PN_CUDA);
    pn_tensor *bad = scratch ? pn_empty(1, bshape1, PN_I64, PN_CUDA) : NULL; /* [0] the atomic min, [1..3] res */
    if (!bad) {
        pn_release(scratch);
        return PN_ERR_OOM;
    }
    pn_rowmap m = device_map(mp);
    rows_in in = rows_of(bnd, bshape, x, y);
    unsigned long long *pbad = (unsigned long long *)pn_ptr(bad);
    int64_t res[3];
    pn_status st = pn_cu_check(mp->op, cudaMemsetAsync(pbad, 0xff, sizeof(unsigned long long), pn_cu_stream()));
    if (!st)
        st = pn_cu_check(mp->op, PN_LAUNCH(rowmap_fwd_kernel, blocks, RM_THREADS, 0, pn_cu_stream(), m, in, n,
                                           (char *)pn_ptr(out), (double *)pn_ptr(scratch), pbad));
    if (!st)
        st = pn_cu_check(mp->op, PN_LAUNCH(rowmap_bad_kernel, 1, 1, 0, pn_cu_stream(), m, in,
                                           (const unsigned long long *)pbad, (double *)pn_ptr(scratch),
                                           (int64_t *)pn_ptr(bad) + 1));
    if (!st) st = pn_cuda_download(res, (int64_t *)pn_ptr(bad) + 1, sizeof res);
    pn_release(scratch);
    pn_release(bad);
    if (st) return st;
    if (res[0] != INT64_MAX) {
        *bad_row = res[0];
        *bad_arg = (int)res[1];
        memcpy(bad_val, &res[2], sizeof(double));
    }
    return PN_OK;
}

pn_status pn_cuda_rowmap_bwd(const pn_rowmap *mp, const pn_tensor *x, const pn_tensor *y, const pn_tensor *gout,
                             pn_tensor *gx, pn_tensor *gy) {
    PN_TRY(check_kind(mp));
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    PN_TRY(batch_shape(mp, x, y, &bnd, bshape));
    const int64_t n = pn_shape_numel(bnd, bshape), D = mp->D, Dg = mp->Dout > 0 ? mp->Dout : 1;
    if (n == 0 || (!gx && !gy)) return PN_OK;
    /* gout has the output's shape: the batch dims, then Dout unless the last dim was dropped
     * (then a trailing point dim is pretended, as rowmap.c does, so batch_strides skips it) */
    int64_t gs[PN_MAX_DIMS];
    pn_tensor gview = *gout;
    if (mp->Dout == 0) gview.nd = gout->nd + 1;
    batch_strides(&gview, bnd, bshape, gs);
    const int64_t gst = mp->Dout > 0 ? gout->strides[gout->nd - 1] : 0;
    const int64_t W = 4 * D + Dg;
    const unsigned blocks = rm_blocks(n, W);
    const int64_t sshape[1] = {(int64_t)blocks * RM_THREADS * W};
    pn_tensor *scratch = pn_empty(1, sshape, PN_F64, PN_CUDA);
    if (!scratch) return PN_ERR_OOM;
    pn_rowmap m = device_map(mp);
    pn_status st = pn_cu_check(mp->op, PN_LAUNCH(rowmap_bwd_kernel, blocks, RM_THREADS, 0, pn_cu_stream(), m,
                                                 rows_of(bnd, bshape, x, y), arg_with(gout, gs), gst, n,
                                                 gx ? (char *)pn_ptr(gx) : (char *)NULL,
                                                 gy ? (char *)pn_ptr(gy) : (char *)NULL, (double *)pn_ptr(scratch)));
    pn_release(scratch);
    return st;
}
