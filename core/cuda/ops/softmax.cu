/* softmax.cu — the CUDA twin of ops/softmax.c's kernel: softmax and log_softmax over the R
 * elements of each of the O·I lines of a contiguous (O, R, I) block, forward and backward.
 *
 * Same maths as the CPU's lines: m = max (a NaN is skipped here and poisons the sum instead, so
 * the whole line comes out NaN; a line of all -inf gives NaN), e = exp(x − m) in T, Σ e in
 * double; softmax y = e · (T)(1/Σ), log_softmax y = x − (m + (T)log Σ). Backward: softmax
 * gx = y (g − (T)Σ g y), log_softmax gx = g − exp(y) (T)Σ g, the sums in double. f32 uses the
 * device's expf where the CPU uses its vectorised pn_fast_expf_nonpos (both within a few ulp;
 * the CPU's is +0 below e^-80).
 *
 * Layout: a block per line when lines are contiguous (I = 1) or too few to fill the device —
 * its threads stride over the line and combine through block_reduce.cuh (fixed order:
 * deterministic); otherwise a thread per line, adjacent threads on adjacent lines (coalesced),
 * each walking its line in order as the CPU's (R, I) slabs do. */
#include "../cuda.cuh"

#include "block_reduce.cuh"

/* a: x (forward) or y (backward), g: the incoming gradient or NULL (forward); out: y or gx.
 * All (O, R, I) contiguous; line j = (o, i) starts at o·R·I + i, stride I. A block per line. */
template <class T>
__global__ void softmax_lines_kernel(const T *a, const T *g, T *out, int64_t R, int64_t I, int64_t nlines, int logsm) {
    PN_SHARED(T, smax, PN_CU_MAX_WARPS);
    PN_SHARED(double, ssum, PN_CU_MAX_WARPS);
    for (int64_t j = blockIdx.x; j < nlines; j += gridDim.x) {
        int64_t base = (j / I) * R * I + j % I;
        const T *x = a + base;
        T *y = out + base;
        if (!g) { /* forward: x → y */
            T m = -INFINITY;
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x) m = pn_cu_max_op()(m, x[r * I]);
            m = pn_cu_block_reduce(m, smax, pn_cu_max_op());
            double s = 0;
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
                T e = exp(x[r * I] - m);
                if (!logsm) y[r * I] = e;
                s += e;
            }
            s = pn_cu_block_reduce(s, ssum, pn_cu_sum_op());
            if (logsm) {
                T lz = m + (T)log(s);
                for (int64_t r = threadIdx.x; r < R; r += blockDim.x) y[r * I] = x[r * I] - lz;
            } else {
                T inv = (T)(1.0 / s);
                for (int64_t r = threadIdx.x; r < R; r += blockDim.x) y[r * I] *= inv; /* this thread's own e */
            }
        } else { /* backward: a = y, g → gx */
            const T *gl = g + base;
            double s = 0;
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x)
                s += logsm ? (double)gl[r * I] : (double)gl[r * I] * x[r * I];
            T av = (T)pn_cu_block_reduce(s, ssum, pn_cu_sum_op());
            for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
                T yv = x[r * I], gv = gl[r * I];
                y[r * I] = logsm ? gv - exp(yv) * av : yv * (gv - av);
            }
        }
    }
}

/* The same, a thread per line (many lines along a dim other than the last). */
template <class T>
__global__ void softmax_cols_kernel(const T *a, const T *g, T *out, int64_t R, int64_t I, int64_t nlines, int logsm) {
    PN_CU_LOOP(j, nlines) {
        int64_t base = (j / I) * R * I + j % I;
        const T *x = a + base;
        T *y = out + base;
        if (!g) {
            T m = -INFINITY;
            for (int64_t r = 0; r < R; r++) m = x[r * I] > m ? x[r * I] : m;
            double s = 0;
            for (int64_t r = 0; r < R; r++) {
                T e = exp(x[r * I] - m);
                if (!logsm) y[r * I] = e;
                s += e;
            }
            if (logsm) {
                T lz = m + (T)log(s);
                for (int64_t r = 0; r < R; r++) y[r * I] = x[r * I] - lz;
            } else {
                T inv = (T)(1.0 / s);
                for (int64_t r = 0; r < R; r++) y[r * I] *= inv;
            }
        } else {
            const T *gl = g + base;
            double s = 0;
            for (int64_t r = 0; r < R; r++) s += logsm ? (double)gl[r * I] : (double)gl[r * I] * x[r * I];
            T av = (T)s;
            for (int64_t r = 0; r < R; r++) {
                T yv = x[r * I], gv = gl[r * I];
                y[r * I] = logsm ? gv - exp(yv) * av : yv * (gv - av);
            }
        }
    }
}

template <class T>
static cudaError_t softmax_launch(const pn_tensor *a, const pn_tensor *b, pn_tensor *out, int64_t R, int64_t I,
                                  int64_t nlines, int logsm) {
    const T *pa = (const T *)pn_ptr(a), *pg = b ? (const T *)pn_ptr(b) : NULL;
    T *po = (T *)pn_ptr(out);
    if (I == 1 || (nlines < 1024 && R > 32)) {
        auto k = softmax_lines_kernel<T>;
        return PN_LAUNCH(k, pn_cu_blocks(nlines, 1), pn_cu_line_threads(R), 0, pn_cu_stream(), pa, pg, po, R, I,
                         nlines, logsm);
    }
    auto k = softmax_cols_kernel<T>;
    return PN_LAUNCH(k, pn_cu_blocks(nlines), PN_CU_THREADS, 0, pn_cu_stream(), pa, pg, po, R, I, nlines, logsm);
}

pn_status pn_cuda_softmax_lines(const pn_tensor *a, const pn_tensor *b, pn_tensor *out, int64_t O, int64_t R,
                                int64_t I, int logsm) {
    int64_t nlines = O * I;
    if (!nlines || !R) return PN_OK;
    const char *op = logsm ? "log_softmax" : "softmax";
    if (a->dt == PN_F32) return pn_cu_check(op, softmax_launch<float>(a, b, out, R, I, nlines, logsm));
    return pn_cu_check(op, softmax_launch<double>(a, b, out, R, I, nlines, logsm));
}
