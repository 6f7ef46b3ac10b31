/* sparse_matmul.c — a (M, K) · b (K, N) where a is stored dense but mostly zero, such as
 * bag-of-words node features after dropout. A dense GEMM spends M·K·N multiply-adds on
 * them; here each call finds a's nonzeros (one pass over a) and does nnz·N, forward and
 * backward. Deterministic: every output row (forward, dA) and every row of dB is written
 * by one thread, summing in index order. */
#include "../backend.h"

/* CSR view of the nonzeros of a contiguous (M, K) matrix */
typedef struct {
    int64_t *row;   /* (M+1) offsets */
    int64_t *col;   /* (nnz) column of each nonzero */
    double *val;    /* (nnz) its value */
} csr;

static void csr_free(csr *c) {
    free(c->row);
    free(c->col);
    free(c->val);
}

/* Two parallel passes over a's rows (count, then fill) with an exclusive scan between. The
 * fill tests f32 rows SKIP elements at a time: bag-of-words rows are ~99 % zeros, and a branch
 * per element made the fill most of the CSR's cost (Cora: 3.9 M elements a call). */
enum { SKIP = 16 };
static pn_status csr_of(const pn_tensor *a, int64_t M, int64_t K, csr *c) {
    memset(c, 0, sizeof *c);
    const char *p = pn_ptr(a);
    bool f32 = a->dt == PN_F32;
    c->row = malloc(sizeof(int64_t) * (size_t)(M + 1));
    if (!c->row) return pn_error(PN_ERR_OOM, "matmul_sparse_lhs: out of memory");
    c->row[0] = 0;
    #pragma omp parallel for if (M * K > PN_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        int64_t nz = 0;
        if (f32) {
            const float *r = (const float *)p + i * K;
            for (int64_t k = 0; k < K; k++) nz += r[k] != 0;
        } else {
            const double *r = (const double *)p + i * K;
            for (int64_t k = 0; k < K; k++) nz += r[k] != 0;
        }
        c->row[i + 1] = nz;
    }
    for (int64_t i = 0; i < M; i++) c->row[i + 1] += c->row[i];
    int64_t nnz = c->row[M];
    c->col = malloc(sizeof(int64_t) * (size_t)(nnz ? nnz : 1));
    c->val = malloc(sizeof(double) * (size_t)(nnz ? nnz : 1));
    if (!c->col || !c->val) {
        csr_free(c);
        return pn_error(PN_ERR_OOM, "matmul_sparse_lhs: out of memory for %lld nonzeros", (long long)nnz);
    }
    #pragma omp parallel for if (M * K > PN_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        int64_t t = c->row[i], k = 0;
        if (f32) { /* runs of SKIP zeros (±0: the bits without the sign) skipped without a branch each */
            const uint32_t *u = (const uint32_t *)p + i * K;
            for (; k + SKIP <= K; k += SKIP) {
                uint32_t any = 0;
                for (int j = 0; j < SKIP; j++) any |= u[k + j] << 1;
                if (!any) continue;
                for (int j = 0; j < SKIP; j++) {
                    float v = ((const float *)p)[i * K + k + j];
                    if (v != 0) {
                        c->col[t] = k + j;
                        c->val[t++] = v;
                    }
                }
            }
        }
        for (; k < K; k++) {
            double v = f32 ? ((const float *)p)[i * K + k] : ((const double *)p)[i * K + k];
            if (v != 0) {
                c->col[t] = k;
                c->val[t++] = v;
            }
        }
    }
    return PN_OK;
}

/* CPU kernels (kernels.def). The plan is the CSR of a's nonzeros, made by the forward and kept
 * for the backward (freed with spmm_free). */
pn_status pn_cpu_spmm_free(void *plan) {
    if (plan) {
        csr_free((csr *)plan);
        free(plan);
    }
    return PN_OK;
}

/* the node's extra: the plan and the device whose spmm_free releases it */
typedef struct {
    int dev;
    void *plan;
} kept_plan;

static void plan_free_extra(void *e) {
    kept_plan *k = e;
    (void)PN_KCALL("matmul_sparse_lhs", pn_backend(k->dev), spmm_free, k->plan);
    free(k);
}

/* out (M, N) = csr(a) · b, b contiguous (K, N) */
static void spmm(const csr *c, int64_t M, int64_t N, const pn_tensor *b, pn_tensor *out) {
    const char *pb = pn_ptr(b);
    char *po = pn_ptr(out);
    bool f32 = b->dt == PN_F32;
    #pragma omp parallel for if (c->row[M] * N > PN_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < M; i++) {
        if (f32) {
            float *o = (float *)po + i * N;
            for (int64_t j = 0; j < N; j++) o[j] = 0;
            for (int64_t t = c->row[i]; t < c->row[i + 1]; t++) {
                const float *brow = (const float *)pb + c->col[t] * N;
                float v = (float)c->val[t];
                for (int64_t j = 0; j < N; j++) o[j] += v * brow[j];
            }
        } else {
            double *o = (double *)po + i * N;
            for (int64_t j = 0; j < N; j++) o[j] = 0;
            for (int64_t t = c->row[i]; t < c->row[i + 1]; t++) {
                const double *brow = (const double *)pb + c->col[t] * N;
                double v = c->val[t];
                for (int64_t j = 0; j < N; j++) o[j] += v * brow[j];
            }
        }
    }
}

/* out (M, N) = a · b from a's plan; a, b contiguous */
pn_status pn_cpu_spmm_fwd(const pn_tensor *a, const pn_tensor *b, pn_tensor *out, void **plan) {
    int64_t M = a->sizes[0], K = a->sizes[1], N = b->sizes[1];
    csr *c = malloc(sizeof *c);
    if (!c) return pn_error(PN_ERR_OOM, "matmul_sparse_lhs: out of memory");
    if (csr_of(a, M, K, c)) {
        free(c);
        return PN_ERR_OOM;
    }
    spmm(c, M, N, b, out);
    *plan = c;
    return PN_OK;
}

/* db (K, N) zeroed += aᵀ·g over a's nonzeros (the plan); g contiguous (M, N) */
pn_status pn_cpu_spmm_bwd_b(const void *plan, const pn_tensor *g, pn_tensor *db) {
    const csr c = *(const csr *)plan;
    int64_t M = g->sizes[0], N = g->sizes[1];
    /* dB[k, :] += a[i, k]·g[i, :]: serial over the nonzeros keeps the sum order fixed;
     * nnz·N is small next to the dense GEMM it replaces */
    const char *pg = pn_ptr(g);
    char *pd = pn_ptr(db);
    bool f32 = db->dt == PN_F32;
    for (int64_t i = 0; i < M; i++)
        for (int64_t t = c.row[i]; t < c.row[i + 1]; t++) {
            if (f32) {
                float *d = (float *)pd + c.col[t] * N, v = (float)c.val[t];
                const float *gr = (const float *)pg + i * N;
                for (int64_t j = 0; j < N; j++) d[j] += v * gr[j];
            } else {
                double *d = (double *)pd + c.col[t] * N, v = c.val[t];
                const double *gr = (const double *)pg + i * N;
                for (int64_t j = 0; j < N; j++) d[j] += v * gr[j];
            }
        }
    return PN_OK;
}

/* saved[0] = b (contiguous); extra = the plan (a's nonzeros) from the forward; iv[0..1] = M, K.
 * dA = g·bᵀ (dense), dB = aᵀ·g (over a's nonzeros) */
static pn_status sparse_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *b = n->saved[0];
    int64_t K = n->iv[1], N = b->sizes[1];
    if (pn_ag_input_needs(n, 0)) {
        pn_tensor *bt = pn_transpose(b, 0, 1);
        gin[0] = bt ? pn_matmul(g, bt) : NULL;
        pn_release(bt);
        if (!gin[0]) return PN_ERR_OOM;
    }
    if (pn_ag_input_needs(n, 1)) {
        pn_tensor *gc = pn_contiguous(g);
        pn_tensor *db = gc ? pn_zeros(2, (int64_t[]){K, N}, b->dt, b->dev) : NULL;
        pn_status st = db ? PN_KCALL_ON("matmul_sparse_lhs", db, spmm_bwd_b, ((kept_plan *)n->extra)->plan, gc, db) : PN_ERR_OOM;
        if ((st = pn_bw_result(st, gc, db, &gin[1])) != PN_OK) return st;
    }
    return PN_OK;
}

pn_tensor *pn_matmul_sparse_lhs(pn_tensor *a, pn_tensor *b) {
    static const char *op = "matmul_sparse_lhs";
    int dev;
    const pn_kernels *kt;
    if (!a || !b) return pn_error_null(PN_ERR_ARG, "%s: %s is nil", op, a ? "b" : "a");
    if (pn_check_float(op, "a", a) || pn_check_float(op, "b", b) ||
        pn_kernels_for(op, 2, (const pn_tensor *const[]){a, b}, (const char *const[]){"a", "b"}, &dev, &kt))
        return NULL;
    if (a->nd != 2 || b->nd != 2 || a->sizes[1] != b->sizes[0])
        return pn_error_null(PN_ERR_SHAPE, "%s: a %s and b %s must be (M, K) and (K, N)", op, pn_shape_str(a),
                             pn_shape_str(b));
    if (a->dt != b->dt)
        return pn_error_null(PN_ERR_DTYPE, "%s: a is %s, b is %s", op, pn_dtype_name(a->dt), pn_dtype_name(b->dt));
    int64_t M = a->sizes[0], K = a->sizes[1], N = b->sizes[1];
    pn_tensor *ac = pn_contiguous(a), *bc = ac ? pn_contiguous(b) : NULL;
    pn_tensor *out = bc ? pn_empty(2, (int64_t[]){M, N}, a->dt, dev) : NULL;
    void *plan = NULL;
    if (!out || PN_KCALL(op, kt, spmm_fwd, ac, bc, out, &plan)) {
        pn_release(ac);
        pn_release(bc);
        pn_release(out);
        return NULL;
    }
    pn_tensor *ins[2] = {a, b};
    pn_node *n = pn_ag_needed(2, ins) ? pn_ag_record(out, op, sparse_bw, 2, ins) : NULL;
    kept_plan *kp = n ? malloc(sizeof *kp) : NULL;
    if (n && kp) { /* the backward reuses the forward's plan; the node frees it */
        *kp = (kept_plan){dev, plan};
        n->extra = kp;
        n->free_extra = plan_free_extra;
        n->iv[0] = M;
        n->iv[1] = K;
        if (pn_ag_save(n, bc)) {
            pn_release(out);
            out = NULL;
        }
    } else {
        (void)PN_KCALL(op, kt, spmm_free, plan);
        if (pn_ag_needed(2, ins)) { /* recording failed */
            pn_release(out);
            out = pn_error_null(PN_ERR_OOM, "%s: out of memory recording the autograd node", op);
        }
    }
    pn_release(ac);
    pn_release(bc);
    return out;
}
