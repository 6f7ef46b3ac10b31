/* sparse_matmul.cu — the CUDA twins of ops/sparse_matmul.c: a (M, K) mostly-zero dense lhs
 * times b (K, N), forward over a's nonzeros and dB = aᵀ·g over the same nonzeros.
 *
 * The plan: a's nonzeros as a CSR by row (the forward) and the same nonzeros as a CSR by column
 * (the backward's dB rows), both on the device. They are built ON THE HOST from a downloaded
 * copy of a: it happens once per forward, and the op exists for a fixed, mostly-zero feature
 * matrix (bag-of-words node features), so one M·K download per forward is cheap next to a
 * device-side stream compaction, and the nonzeros come out in the CPU kernel's order.
 *
 * Deterministic and race-free: every output row (forward) and every row of dB (backward) is
 * summed by one thread per output column, in increasing index order — the CPU's order. */
#include "../cuda.cuh"

#include <stdlib.h>
#include <vector>

namespace {

struct plan {
    int64_t M, K, nnz;
    pn_tensor *row, *col, *val;    /* by row: (M+1) offsets, (nnz) column, value (a's dtype) */
    pn_tensor *trow, *tcol, *tval; /* by column: (K+1) offsets, (nnz) row, value */
};

void plan_free(plan *p) {
    if (!p) return;
    pn_release(p->row), pn_release(p->col), pn_release(p->val);
    pn_release(p->trow), pn_release(p->tcol), pn_release(p->tval);
    free(p);
}

/* a device tensor (n) of dt holding the host array h (n·es bytes), or NULL with the error set */
pn_tensor *upload(const void *h, int64_t n, int dt) {
    int64_t sh[1] = {n > 0 ? n : 1};
    pn_tensor *t = pn_empty(1, sh, dt, PN_CUDA);
    if (t && n > 0 && pn_cuda_upload(pn_ptr(t), h, (size_t)n * pn_elsize(dt))) {
        pn_release(t);
        return NULL;
    }
    return t;
}

/* out (M, N) = csr(a) · b; one thread per output element, its row's nonzeros in order */
template <typename T>
__global__ void spmm_kernel(int64_t M, int64_t N, const int64_t *row, const int64_t *col, const T *val, const T *b,
                            T *out) {
    PN_CU_LOOP(x, M * N) {
        int64_t i = x / N, j = x - i * N;
        T acc = 0;
        for (int64_t t = row[i]; t < row[i + 1]; t++) acc += val[t] * b[col[t] * N + j];
        out[x] = acc;
    }
}

/* db (K, N) += aᵀ·g: row k of db sums a[i, k]·g[i, :] over the nonzeros of column k, i ascending
 * (the CPU kernel's order: it walks rows i in order and adds into db[col]) */
template <typename T>
__global__ void spmm_bwd_kernel(int64_t K, int64_t N, const int64_t *trow, const int64_t *tcol, const T *tval,
                                const T *g, T *db) {
    PN_CU_LOOP(x, K * N) {
        int64_t k = x / N, j = x - k * N;
        T acc = db[x];
        for (int64_t t = trow[k]; t < trow[k + 1]; t++) acc += tval[t] * g[tcol[t] * N + j];
        db[x] = acc;
    }
}

} // namespace

pn_status pn_cuda_spmm_free(void *p) {
    plan_free((plan *)p);
    return PN_OK;
}

pn_status pn_cuda_spmm_fwd(const pn_tensor *a, const pn_tensor *b, pn_tensor *out, void **plan_out) {
    static const char *op = "matmul_sparse_lhs";
    const int64_t M = a->sizes[0], K = a->sizes[1], N = b->sizes[1];
    const int dt = a->dt;
    const size_t es = pn_elsize(dt);
    /* a, downloaded once (contiguous (M, K), the front end's copy) */
    std::vector<unsigned char> host((size_t)(M * K) * es + 1);
    if (M * K > 0) PN_TRY(pn_cuda_download(host.data(), pn_ptr(a), (size_t)(M * K) * es));
    const float *af = (const float *)host.data();
    const double *ad = (const double *)host.data();
    auto at = [&](int64_t x) { return dt == PN_F32 ? (double)af[x] : ad[x]; };
    std::vector<int64_t> row((size_t)M + 1, 0), trow((size_t)K + 1, 0);
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            if (at(i * K + k) != 0) row[(size_t)i + 1]++, trow[(size_t)k + 1]++;
    for (int64_t i = 0; i < M; i++) row[(size_t)i + 1] += row[(size_t)i];
    for (int64_t k = 0; k < K; k++) trow[(size_t)k + 1] += trow[(size_t)k];
    const int64_t nnz = row[(size_t)M];
    std::vector<int64_t> col((size_t)nnz + 1), tcol((size_t)nnz + 1), fill(trow.begin(), trow.end() - 1);
    std::vector<unsigned char> val((size_t)nnz * es + 1), tval((size_t)nnz * es + 1);
    for (int64_t i = 0, t = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) {
            double v = at(i * K + k);
            if (v == 0) continue;
            int64_t u = fill[(size_t)k]++; /* column k's next slot: rows arrive in increasing order */
            col[(size_t)t] = k;
            tcol[(size_t)u] = i;
            pn_st(val.data(), dt, t, v);
            pn_st(tval.data(), dt, u, v);
            t++;
        }
    plan *p = (plan *)calloc(1, sizeof(plan));
    if (!p) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    p->M = M, p->K = K, p->nnz = nnz;
    if (!(p->row = upload(row.data(), M + 1, PN_I64)) || !(p->col = upload(col.data(), nnz, PN_I64)) ||
        !(p->val = upload(val.data(), nnz, dt)) || !(p->trow = upload(trow.data(), K + 1, PN_I64)) ||
        !(p->tcol = upload(tcol.data(), nnz, PN_I64)) || !(p->tval = upload(tval.data(), nnz, dt))) {
        plan_free(p);
        return PN_ERR_OOM;
    }
    if (M * N > 0) {
        pn_status st;
        PN_CU_FLOAT_SWITCH(dt, T, {
            auto k = spmm_kernel<T>;
            st = pn_cu_check(op, PN_LAUNCH(k, pn_cu_blocks(M * N), PN_CU_THREADS, 0, pn_cu_stream(), M, N,
                                           (const int64_t *)pn_ptr(p->row), (const int64_t *)pn_ptr(p->col),
                                           (const T *)pn_ptr(p->val), (const T *)pn_ptr(b), (T *)pn_ptr(out)));
        });
        if (st) {
            plan_free(p);
            return st;
        }
    }
    *plan_out = p;
    return PN_OK;
}

pn_status pn_cuda_spmm_bwd_b(const void *pp, const pn_tensor *g, pn_tensor *db) {
    const plan *p = (const plan *)pp;
    const int64_t K = p->K, N = g->sizes[1];
    if (K * N == 0) return PN_OK;
    pn_status st;
    PN_CU_FLOAT_SWITCH(db->dt, T, {
        auto k = spmm_bwd_kernel<T>;
        st = pn_cu_check("matmul_sparse_lhs", PN_LAUNCH(k, pn_cu_blocks(K * N), PN_CU_THREADS, 0, pn_cu_stream(), K,
                                                        N, (const int64_t *)pn_ptr(p->trow),
                                                        (const int64_t *)pn_ptr(p->tcol), (const T *)pn_ptr(p->tval),
                                                        (const T *)pn_ptr(g), (T *)pn_ptr(db)));
    });
    return st;
}
