/* elementwise.cu — the CUDA twins of ops/elementwise.c: binary arithmetic, its gradients,
 * unary maths and their gradients, comparisons and where; NumPy broadcasting over any strides.
 *
 * The per-element formulas are ops/elementwise_math.h's X-macro lists (the CPU stamps the same
 * lists into its vectorised loops), so both devices compute the same expressions; f32 runs in
 * float with the device's float maths (expf, powf …), as the CPU's f32 path does with libm's.
 *
 * Layout: one thread per output element (grid-stride). The launcher merges the dims that are
 * contiguous for every operand (and drops size-1 dims), so the common contiguous or
 * broadcast-scalar case is one flat dim, served by each kernel's FLAT instance (an offset is one
 * multiply); other layouts walk pn_cu_off. */
#include "../cuda.cuh"

#include "../../ops/elementwise_math.h"

/* ---- launch plan: the output's shape with every operand's strides, dims merged ----------- */
enum { EW_MAX_OPS = 4 };
typedef struct {
    pn_cu_shape sh;
    pn_cu_arg arg[EW_MAX_OPS]; /* arg[0]: the output */
    int64_t n;
} ew_plan;

/* ops[0] is the output (its shape is the iteration shape); the others broadcast to it. */
static void ew_plan_make(ew_plan *pl, int nops, const pn_tensor *const *ops) {
    const pn_tensor *out = ops[0];
    int64_t st[EW_MAX_OPS][PN_MAX_DIMS];
    for (int k = 0; k < nops; k++) pn_broadcast_strides(ops[k], out->nd, out->sizes, st[k]);
    /* keep the dims of size > 1, merging d into the kept dim before it when every operand
     * steps over d exactly as one longer dim would */
    int nd = 0;
    int64_t size[PN_MAX_DIMS], mst[EW_MAX_OPS][PN_MAX_DIMS];
    for (int d = 0; d < out->nd; d++) {
        int64_t s = out->sizes[d];
        if (s == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++) merge = mst[k][nd - 1] == st[k][d] * s;
        if (merge) {
            size[nd - 1] *= s;
            for (int k = 0; k < nops; k++) mst[k][nd - 1] = st[k][d];
        } else {
            size[nd] = s;
            for (int k = 0; k < nops; k++) mst[k][nd] = st[k][d];
            nd++;
        }
    }
    pl->sh.nd = nd;
    for (int d = 0; d < PN_MAX_DIMS; d++) pl->sh.size[d] = d < nd ? size[d] : 1;
    for (int k = 0; k < nops; k++) {
        pl->arg[k].p = pn_ptr(ops[k]);
        pl->arg[k].dt = ops[k]->dt;
        for (int d = 0; d < PN_MAX_DIMS; d++) pl->arg[k].stride[d] = d < nd ? mst[k][d] : 0;
    }
    pl->n = pn_numel(out);
}

/* ---- per-element functions: the shared lists, stamped for T -------------------------------- */
#define EW_CASE(OP, EXPR) \
    case OP: return (EXPR);

template <class T> __device__ __forceinline__ T ew_binary(int op, T x, T y) {
    switch (op) { PN_BINARY_OPS(EW_CASE) }
    return x;
}
template <class T> __device__ __forceinline__ T ew_binary_grad(int code, T gv, T x, T y) {
    switch (code) { PN_BINARY_GRADS(EW_CASE) }
    return gv;
}
template <class T> __device__ __forceinline__ T ew_unary(int op, T v, T a, T b) {
    switch (op) { PN_UNARY_OPS(EW_CASE) }
    return v;
}
template <class T> __device__ __forceinline__ T ew_unary_grad(int op, T gv, T x, T y, T a, T b) {
    switch (op) { PN_UNARY_GRADS(EW_CASE) }
    return gv;
}
template <class T> __device__ __forceinline__ bool ew_compare(int op, T x, T y) {
    switch (op) { PN_COMPARE_OPS(EW_CASE) }
    return false;
}
#undef EW_CASE

/* ---- kernels ------------------------------------------------------------------------------ */
/* Offset of element i in operand a. FLAT: the plan merged every dim into one (or none), so it
 * is one multiply — the contiguous and broadcast-scalar cases, without pn_cu_off's divisions. */
template <bool FLAT> __device__ __forceinline__ int64_t ew_off(const pn_cu_shape &sh, const pn_cu_arg &a, int64_t i) {
    return FLAT ? i * a.stride[0] : pn_cu_off(sh, a, i);
}

/* out = a op b; T the float type (the integer dtypes: binary_int_kernel, in int64) */
template <class T, bool F>
__global__ void binary_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg a, pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        T x = ((const T *)a.p)[ew_off<F>(sh, a, i)], y = ((const T *)b.p)[ew_off<F>(sh, b, i)];
        ((T *)o.p)[ew_off<F>(sh, o, i)] = ew_binary<T>(op, x, y);
    }
}
template <bool F>
__global__ void binary_int_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg a, pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        int64_t x = pn_ew_ld_int(a.p, a.dt, ew_off<F>(sh, a, i)), y = pn_ew_ld_int(b.p, b.dt, ew_off<F>(sh, b, i));
        pn_ew_st_int(o.p, o.dt, ew_off<F>(sh, o, i), pn_ew_binary_int(op, x, y));
    }
}

/* gfull = ∂(a op b)/∂(side) · g at the full shape; code = op·2 + side */
template <class T, bool F>
__global__ void binary_grad_kernel(int code, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg g, pn_cu_arg a,
                                   pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        T gv = ((const T *)g.p)[ew_off<F>(sh, g, i)];
        T x = ((const T *)a.p)[ew_off<F>(sh, a, i)], y = ((const T *)b.p)[ew_off<F>(sh, b, i)];
        ((T *)o.p)[ew_off<F>(sh, o, i)] = ew_binary_grad<T>(code, gv, x, y);
    }
}

template <class T, bool F>
__global__ void unary_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg x, T a, T b) {
    PN_CU_LOOP(i, n) {
        T v = ((const T *)x.p)[ew_off<F>(sh, x, i)];
        ((T *)o.p)[ew_off<F>(sh, o, i)] = ew_unary<T>(op, v, a, b);
    }
}
template <bool F>
__global__ void unary_int_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg x, double a, double b) {
    PN_CU_LOOP(i, n) {
        int64_t v = pn_ew_ld_int(x.p, x.dt, ew_off<F>(sh, x, i));
        pn_ew_st_int(o.p, o.dt, ew_off<F>(sh, o, i), pn_ew_unary_int(op, v, a, b));
    }
}

/* gx = g · f'(x) from the input x and/or the output y (either may be g itself) */
template <class T, bool F>
__global__ void unary_grad_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg g, pn_cu_arg x,
                                  pn_cu_arg y, T a, T b) {
    PN_CU_LOOP(i, n) {
        T gv = ((const T *)g.p)[ew_off<F>(sh, g, i)];
        T xv = ((const T *)x.p)[ew_off<F>(sh, x, i)], yv = ((const T *)y.p)[ew_off<F>(sh, y, i)];
        ((T *)o.p)[ew_off<F>(sh, o, i)] = ew_unary_grad<T>(op, gv, xv, yv, a, b);
    }
}

/* out (u8) = a cmp b */
template <class T, bool F>
__global__ void compare_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg a, pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        T x = ((const T *)a.p)[ew_off<F>(sh, a, i)], y = ((const T *)b.p)[ew_off<F>(sh, b, i)];
        ((uint8_t *)o.p)[ew_off<F>(sh, o, i)] = (uint8_t)ew_compare<T>(op, x, y);
    }
}
template <bool F>
__global__ void compare_int_kernel(int op, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg a, pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        int64_t x = pn_ew_ld_int(a.p, a.dt, ew_off<F>(sh, a, i)), y = pn_ew_ld_int(b.p, b.dt, ew_off<F>(sh, b, i));
        ((uint8_t *)o.p)[ew_off<F>(sh, o, i)] = (uint8_t)pn_ew_compare_int(op, x, y);
    }
}

/* out = cond ? a : b; selection copies bits, so W is an unsigned type of the element's size */
template <class W, bool F>
__global__ void where_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg c, pn_cu_arg a, pn_cu_arg b) {
    PN_CU_LOOP(i, n) {
        bool take_a = ((const uint8_t *)c.p)[ew_off<F>(sh, c, i)] != 0;
        ((W *)o.p)[ew_off<F>(sh, o, i)] = take_a ? ((const W *)a.p)[ew_off<F>(sh, a, i)]
                                                 : ((const W *)b.p)[ew_off<F>(sh, b, i)];
    }
}

/* ---- launchers (kernels.def) ---------------------------------------------------------------- */
/* kf: the kernel's flat instance, kg: its general one; the plan picks */
template <class K, class... A> static cudaError_t ew_go(K kf, K kg, const ew_plan &pl, A... args) {
    auto k = pl.sh.nd <= 1 ? kf : kg;
    return PN_LAUNCH(k, pn_cu_blocks(pl.n), PN_CU_THREADS, 0, pn_cu_stream(), args...);
}
#define EW_ARGS2 pl.sh, pl.n, pl.arg[0], pl.arg[1]
#define EW_ARGS3 EW_ARGS2, pl.arg[2]
#define EW_ARGS4 EW_ARGS3, pl.arg[3]

pn_status pn_cuda_binary(int op, pn_tensor *out, const pn_tensor *a, const pn_tensor *b) {
    if (!pn_numel(out)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {out, a, b};
    ew_plan_make(&pl, 3, ops);
    cudaError_t e;
    if (a->dt == PN_F32) e = ew_go(binary_kernel<float, true>, binary_kernel<float, false>, pl, op, EW_ARGS3);
    else if (a->dt == PN_F64) e = ew_go(binary_kernel<double, true>, binary_kernel<double, false>, pl, op, EW_ARGS3);
    else e = ew_go(binary_int_kernel<true>, binary_int_kernel<false>, pl, op, EW_ARGS3);
    return pn_cu_check("binary", e);
}

pn_status pn_cuda_binary_grad(int code, pn_tensor *gfull, const pn_tensor *g, const pn_tensor *a, const pn_tensor *b) {
    if (!pn_numel(gfull)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {gfull, g, a, b};
    ew_plan_make(&pl, 4, ops);
    cudaError_t e;
    if (g->dt == PN_F32) e = ew_go(binary_grad_kernel<float, true>, binary_grad_kernel<float, false>, pl, code, EW_ARGS4);
    else e = ew_go(binary_grad_kernel<double, true>, binary_grad_kernel<double, false>, pl, code, EW_ARGS4);
    return pn_cu_check("binary backward", e);
}

pn_status pn_cuda_unary(int op, pn_tensor *out, const pn_tensor *x, double a, double b) {
    if (!pn_numel(out)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {out, x};
    ew_plan_make(&pl, 2, ops);
    cudaError_t e;
    if (x->dt == PN_F32) /* the scalars typed T, as the CPU's f32 loops have them */
        e = ew_go(unary_kernel<float, true>, unary_kernel<float, false>, pl, op, EW_ARGS2, (float)a, (float)b);
    else if (x->dt == PN_F64) e = ew_go(unary_kernel<double, true>, unary_kernel<double, false>, pl, op, EW_ARGS2, a, b);
    else e = ew_go(unary_int_kernel<true>, unary_int_kernel<false>, pl, op, EW_ARGS2, a, b);
    return pn_cu_check("unary", e);
}

pn_status pn_cuda_unary_grad(int op, pn_tensor *gx, const pn_tensor *g, const pn_tensor *x, const pn_tensor *y,
                             double a, double b) {
    if (!pn_numel(gx)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {gx, g, x, y};
    ew_plan_make(&pl, 4, ops);
    cudaError_t e;
    if (g->dt == PN_F32)
        e = ew_go(unary_grad_kernel<float, true>, unary_grad_kernel<float, false>, pl, op, EW_ARGS4, (float)a,
                  (float)b);
    else e = ew_go(unary_grad_kernel<double, true>, unary_grad_kernel<double, false>, pl, op, EW_ARGS4, a, b);
    return pn_cu_check("unary backward", e);
}

pn_status pn_cuda_compare(int op, pn_tensor *out, const pn_tensor *a, const pn_tensor *b) {
    if (!pn_numel(out)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {out, a, b};
    ew_plan_make(&pl, 3, ops);
    cudaError_t e;
    if (a->dt == PN_F32) e = ew_go(compare_kernel<float, true>, compare_kernel<float, false>, pl, op, EW_ARGS3);
    else if (a->dt == PN_F64) e = ew_go(compare_kernel<double, true>, compare_kernel<double, false>, pl, op, EW_ARGS3);
    else e = ew_go(compare_int_kernel<true>, compare_int_kernel<false>, pl, op, EW_ARGS3);
    return pn_cu_check("compare", e);
}

pn_status pn_cuda_where(pn_tensor *out, const pn_tensor *cond, const pn_tensor *a, const pn_tensor *b) {
    if (!pn_numel(out)) return PN_OK;
    ew_plan pl;
    const pn_tensor *ops[] = {out, cond, a, b};
    ew_plan_make(&pl, 4, ops);
    cudaError_t e;
    switch (pn_elsize(a->dt)) {
    case 8: e = ew_go(where_kernel<uint64_t, true>, where_kernel<uint64_t, false>, pl, EW_ARGS4); break;
    case 4: e = ew_go(where_kernel<uint32_t, true>, where_kernel<uint32_t, false>, pl, EW_ARGS4); break;
    default: e = ew_go(where_kernel<uint8_t, true>, where_kernel<uint8_t, false>, pl, EW_ARGS4); break;
    }
    return pn_cu_check("where", e);
}
