/* reduce.cu — the CUDA twins of ops/reduce.c's kernels: reduce (sum, mean, max, min,
 * logsumexp, prod and the p-norms), arg_reduce (argmax/argmin) and reduce_map (the backward
 * passes' pointwise maps).
 *
 * The front end hands over a contiguous (O, R, I) block and O·I outputs. The semantics are
 * ops/reduce_math.h's, shared with the CPU: the accumulator (float inputs in double), its
 * merge of partial results, the finish, the maps. Two layouts:
 *  - a block per output ("lines"): when I = 1 (each line contiguous) or the outputs are too few
 *    to fill the device; its threads stride over r and combine in a fixed order
 *    (block_reduce.cuh), so the result is deterministic;
 *  - a thread per output ("columns"): I > 1 with many outputs; adjacent threads read adjacent
 *    elements, each walks r in order exactly as the CPU's I > 1 loop does.
 * logsumexp over a line takes two passes (max, then Σ exp(x − max)) like the CPU's runs, so a
 * NaN anywhere gives NaN even when another part holds +inf. */
#include "../cuda.cuh"

#include "../../ops/elementwise_math.h" /* pn_ew_ld_int / pn_ew_st_int */
#include "../../ops/reduce_math.h"
#include "block_reduce.cuh"

/* ---- combiners ------------------------------------------------------------------------------ */
__device__ __forceinline__ pn_acc pn_cu_shfl_xor(pn_acc v, int m) {
    return pn_acc_make(pn_cu_shfl_xor(v.a, m), pn_cu_shfl_xor(v.b, m));
}
struct acc_merge_op {
    int k;
    __device__ pn_acc operator()(pn_acc u, pn_acc v) const { return pn_acc_merge(k, u, v); }
};
/* max that keeps a NaN (logsumexp's first pass: NaN anywhere makes the result NaN) */
struct nan_max_op {
    __device__ double operator()(double a, double b) const { return (isnan(a) || isnan(b)) ? NAN : (b > a ? b : a); }
};
/* the integer accumulator: wrapping sums and products (as uint64), or the extreme */
struct int_acc_op {
    int k;
    __device__ long long operator()(long long a, long long b) const {
        switch (k) {
        case K_SUM: return (long long)((unsigned long long)a + (unsigned long long)b);
        case K_PROD: return (long long)((unsigned long long)a * (unsigned long long)b);
        case K_MAX: return b > a ? b : a;
        default: return b < a ? b : a;
        }
    }
};
__device__ __forceinline__ long long int_acc_init(int k) {
    return k == K_PROD ? 1 : k == K_MAX ? (long long)INT64_MIN : k == K_MIN ? (long long)INT64_MAX : 0;
}

/* ---- reduce: float ------------------------------------------------------------------------ */
/* x: (O, R, I) contiguous T; out: (O·I) of dtype odt. A block per output j = (o, i). */
template <class T>
__global__ void reduce_lines_kernel(int k, double p, const T *x, int64_t R, int64_t I, int64_t nout, void *out, int odt) {
    PN_SHARED(pn_acc, sacc, PN_CU_MAX_WARPS);
    PN_SHARED(double, sd, PN_CU_MAX_WARPS);
    for (int64_t j = blockIdx.x; j < nout; j += gridDim.x) {
        const T *line = x + (j / I) * R * I + j % I; /* its R elements at stride I */
        double res;
        if (k == K_LSE) {
            double m = -INFINITY;
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x) m = nan_max_op()(m, (double)line[r * I]);
            m = pn_cu_block_reduce(m, sd, nan_max_op());
            if (isnan(m) || m == -INFINITY || m == INFINITY) { /* NaN; empty or all -inf; +inf */
                res = m;
            } else {
                double s = 0;
                for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += exp((double)line[r * I] - m);
                s = pn_cu_block_reduce(s, sd, pn_cu_sum_op());
                res = m + log(s);
            }
        } else {
            pn_acc s = pn_acc_init(k);
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x) pn_acc_add(k, p, &s, (double)line[r * I]);
            acc_merge_op op = {k};
            s = pn_cu_block_reduce(s, sacc, op);
            res = pn_acc_final(k, s, R, p);
        }
        if (threadIdx.x == 0) pn_st(out, odt, j, res);
    }
}

/* A thread per output, r in order (the CPU's I > 1 loop). */
template <class T>
__global__ void reduce_cols_kernel(int k, double p, const T *x, int64_t R, int64_t I, int64_t nout, void *out, int odt) {
    PN_CU_LOOP(j, nout) {
        const T *col = x + (j / I) * R * I + j % I;
        pn_acc s = pn_acc_init(k);
        for (int64_t r = 0; r < R; r++) pn_acc_add(k, p, &s, (double)col[r * I]);
        pn_st(out, odt, j, pn_acc_final(k, s, R, p));
    }
}

/* ---- reduce: integers (i32, i64, u8): exact int64, sums wrapping like the CPU's ------------ */
__global__ void reduce_int_lines_kernel(int k, const char *x, int dt, int64_t R, int64_t I, int64_t nout, void *out,
                                        int odt) {
    PN_SHARED(long long, sv, PN_CU_MAX_WARPS);
    int_acc_op op = {k};
    for (int64_t j = blockIdx.x; j < nout; j += gridDim.x) {
        int64_t base = (j / I) * R * I + j % I;
        long long s = int_acc_init(k);
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s = op(s, (long long)pn_ew_ld_int(x, dt, base + r * I));
        s = pn_cu_block_reduce(s, sv, op);
        if (threadIdx.x == 0) pn_ew_st_int(out, odt, j, (int64_t)s);
    }
}

__global__ void reduce_int_cols_kernel(int k, const char *x, int dt, int64_t R, int64_t I, int64_t nout, void *out,
                                       int odt) {
    int_acc_op op = {k};
    PN_CU_LOOP(j, nout) {
        int64_t base = (j / I) * R * I + j % I;
        long long s = int_acc_init(k);
        for (int64_t r = 0; r < R; r++) s = op(s, (long long)pn_ew_ld_int(x, dt, base + r * I));
        pn_ew_st_int(out, odt, j, (int64_t)s);
    }
}

/* a block per output, or a thread per output (see the top) */
static bool use_lines(int64_t nout, int64_t R, int64_t I) { return I == 1 || (nout < 1024 && R > 32); }

pn_status pn_cuda_reduce(int kind, double p, const pn_tensor *src, int64_t O, int64_t R, int64_t I, pn_tensor *dst) {
    int64_t nout = O * I;
    if (!nout) return PN_OK;
    const char *x = pn_ptr(src);
    void *out = pn_ptr(dst);
    int dt = src->dt, odt = dst->dt;
    bool lines = use_lines(nout, R, I);
    unsigned grid = lines ? pn_cu_blocks(nout, 1) : pn_cu_blocks(nout);
    int threads = lines ? pn_cu_line_threads(R) : PN_CU_THREADS;
    cudaError_t e;
    if (dt == PN_F32 && lines) {
        auto k = reduce_lines_kernel<float>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), kind, p, (const float *)x, R, I, nout, out, odt);
    } else if (dt == PN_F32) {
        auto k = reduce_cols_kernel<float>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), kind, p, (const float *)x, R, I, nout, out, odt);
    } else if (dt == PN_F64 && lines) {
        auto k = reduce_lines_kernel<double>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), kind, p, (const double *)x, R, I, nout, out, odt);
    } else if (dt == PN_F64) {
        auto k = reduce_cols_kernel<double>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), kind, p, (const double *)x, R, I, nout, out, odt);
    } else if (lines) {
        e = PN_LAUNCH(reduce_int_lines_kernel, grid, threads, 0, pn_cu_stream(), kind, x, dt, R, I, nout, out, odt);
    } else {
        e = PN_LAUNCH(reduce_int_cols_kernel, grid, threads, 0, pn_cu_stream(), kind, x, dt, R, I, nout, out, odt);
    }
    return pn_cu_check("reduce", e);
}

/* ---- arg_reduce: the first extreme's r, a NaN winning (its first) ---------------------------- */
/* a candidate: value v at position r (r < 0: none yet). V: double for floats, long long for ints */
template <class V> struct arg_cand {
    V v;
    long long r;
};
template <class V> __device__ __forceinline__ bool arg_isnan(V v) { return v != v; }

template <class V> struct arg_op {
    int is_max;
    /* u holds positions before v's within a thread; across threads the lower r wins a tie */
    __device__ arg_cand<V> operator()(arg_cand<V> u, arg_cand<V> v) const {
        if (u.r < 0) return v;
        if (v.r < 0) return u;
        bool un = arg_isnan(u.v), vn = arg_isnan(v.v);
        if (un || vn) return (un && vn) ? (u.r < v.r ? u : v) : (un ? u : v);
        if (is_max ? v.v > u.v : v.v < u.v) return v;
        if (is_max ? u.v > v.v : u.v < v.v) return u;
        return u.r < v.r ? u : v;
    }
};
template <class V> __device__ __forceinline__ arg_cand<V> pn_cu_shfl_xor(arg_cand<V> c, int m) {
    arg_cand<V> o;
    o.v = pn_cu_shfl_xor(c.v, m);
    o.r = pn_cu_shfl_xor(c.r, m);
    return o;
}

/* element e of src as V */
template <class V> __device__ __forceinline__ V arg_ld(const char *x, int dt, int64_t e);
template <> __device__ __forceinline__ double arg_ld<double>(const char *x, int dt, int64_t e) { return pn_ld(x, dt, e); }
template <> __device__ __forceinline__ long long arg_ld<long long>(const char *x, int dt, int64_t e) {
    return (long long)pn_ew_ld_int(x, dt, e);
}

/* src: (O, R, I) contiguous; dst (O·I) i64. A block per output. */
template <class V>
__global__ void arg_lines_kernel(int is_max, const char *x, int dt, int64_t R, int64_t I, int64_t nout, int64_t *dst) {
    PN_SHARED(arg_cand<V>, sh, PN_CU_MAX_WARPS);
    arg_op<V> op = {is_max};
    for (int64_t j = blockIdx.x; j < nout; j += gridDim.x) {
        int64_t base = (j / I) * R * I + j % I;
        arg_cand<V> c;
        c.v = 0;
        c.r = -1;
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
            arg_cand<V> n;
            n.v = arg_ld<V>(x, dt, base + r * I);
            n.r = r;
            c = op(c, n);
        }
        c = pn_cu_block_reduce(c, sh, op);
        if (threadIdx.x == 0) dst[j] = c.r < 0 ? 0 : c.r;
    }
}

/* A thread per output, r in order (the CPU's loop) */
template <class V>
__global__ void arg_cols_kernel(int is_max, const char *x, int dt, int64_t R, int64_t I, int64_t nout, int64_t *dst) {
    arg_op<V> op = {is_max};
    PN_CU_LOOP(j, nout) {
        int64_t base = (j / I) * R * I + j % I;
        arg_cand<V> c;
        c.v = 0;
        c.r = -1;
        for (int64_t r = 0; r < R; r++) {
            arg_cand<V> n;
            n.v = arg_ld<V>(x, dt, base + r * I);
            n.r = r;
            c = op(c, n);
        }
        dst[j] = c.r < 0 ? 0 : c.r;
    }
}

pn_status pn_cuda_arg_reduce(int is_max, const pn_tensor *src, int64_t O, int64_t R, int64_t I, pn_tensor *dst) {
    int64_t nout = O * I;
    if (!nout) return PN_OK;
    const char *x = pn_ptr(src);
    int64_t *out = (int64_t *)pn_ptr(dst);
    int dt = src->dt;
    bool lines = use_lines(nout, R, I);
    unsigned grid = lines ? pn_cu_blocks(nout, 1) : pn_cu_blocks(nout);
    int threads = lines ? pn_cu_line_threads(R) : PN_CU_THREADS;
    cudaError_t e;
    if (pn_is_float(dt)) { /* f32 values are exact as double */
        auto k = lines ? arg_lines_kernel<double> : arg_cols_kernel<double>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), is_max, x, dt, R, I, nout, out);
    } else { /* integers: exact for all of int64 */
        auto k = lines ? arg_lines_kernel<long long> : arg_cols_kernel<long long>;
        e = PN_LAUNCH(k, grid, threads, 0, pn_cu_stream(), is_max, x, dt, R, I, nout, out);
    }
    return pn_cu_check("argmax", e);
}

/* ---- reduce_map: out = f(a, b, c) over out's shape, a b c broadcast ------------------------- */
__global__ void reduce_map_kernel(int fn, double prm, pn_cu_shape sh, int64_t n, pn_cu_arg o, pn_cu_arg a, pn_cu_arg b,
                                  pn_cu_arg c) {
    const double pv[1] = {prm};
    PN_CU_LOOP(i, n) {
        double va = pn_ld(a.p, a.dt, pn_cu_off(sh, a, i)), vb = pn_ld(b.p, b.dt, pn_cu_off(sh, b, i));
        double vc = pn_ld(c.p, c.dt, pn_cu_off(sh, c, i));
        pn_st(o.p, o.dt, pn_cu_off(sh, o, i), pn_reduce_map_apply(fn, va, vb, vc, pv));
    }
}

pn_status pn_cuda_reduce_map(int fn, double prm, pn_tensor *out, const pn_tensor *a, const pn_tensor *b,
                             const pn_tensor *c) {
    int64_t n = pn_numel(out);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(out->nd, out->sizes);
    return pn_cu_check("reduce backward",
                       PN_LAUNCH(reduce_map_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), fn, prm, sh, n,
                                 pn_cu_arg_of(out, sh), pn_cu_arg_of(a, sh), pn_cu_arg_of(b, sh),
                                 pn_cu_arg_of(c ? c : a, sh)));
}
