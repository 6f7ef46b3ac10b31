/* matmul.c — torch.matmul semantics on OpenBLAS GEMM, forward and backward.
 *
 *   a (K)          · b (K)          → ()              dot product
 *   a (M, K)       @ b (K, N)       → (M, N)
 *   a (K)          @ b (..., K, N)  → (..., N)        a promoted to (1, K), the 1 dropped
 *   a (..., M, K)  @ b (K)          → (..., M)        b promoted to (K, 1), the 1 dropped
 *   a (..., M, K)  @ b (..., K, N)  → (broadcast(...), M, N)
 *
 * No copies where BLAS can read the operand as it is: a matrix whose last two dims are
 * row-major (stride 1 along the columns) is passed as NoTrans, one that is a transposed
 * row-major matrix (stride 1 along the rows, e.g. x:transpose()) as Trans with the
 * matching leading dimension. Only operands with neither layout (stride 0 from expand,
 * or both strides > 1) are copied. When b is shared by every batch and a's batch and row
 * dims collapse into one strided row dim, the whole batch is ONE GEMM (the linear-layer
 * case x (B, T, D) @ W (D, N)).
 *
 * Threads: one pool, ours. OpenBLAS runs single-threaded inside matmul (blas.h says why:
 * its workers spin after each threaded GEMM and steal the cores from the OpenMP loop that
 * follows — a Recursive Transformer step on 8000 nodes ran 1.7× slower with them), and we
 * split the work: the batch across threads when there are several GEMMs, otherwise one
 * GEMM's output rows (or columns) in blocks, one OpenBLAS call per thread. */
#include "../backend.h"
#include "../blas.h"
#include "matmul_plan.h"

#include <limits.h>
#include <omp.h>

/* Below this many multiply-adds a GEMM stays on the calling thread (OpenBLAS's own
 * interface/gemm.c draws the line at the same place: 65536 · 4). */
#define SMALL_GEMM 262144.0

/* One BLAS call: c (m, n) row-major with leading dimension ldc; c = a · b, or c += a · b with acc
 * (beta 1: BLAS then skips its pass that zeroes c). */
static void blas_gemm(int dt, int64_t m, int64_t n, int64_t k, const char *a, pn_gemm_layout la, const char *b,
                      pn_gemm_layout lb, char *c, int64_t ldc, int acc) {
    CBLAS_TRANSPOSE ta = la.trans ? CblasTrans : CblasNoTrans, tb = lb.trans ? CblasTrans : CblasNoTrans;
    if (dt == PN_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f, (const float *)a,
                    (blasint)la.ld, (const float *)b, (blasint)lb.ld, acc ? 1.0f : 0.0f, (float *)c, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0, (const double *)a,
                    (blasint)la.ld, (const double *)b, (blasint)lb.ld, acc ? 1.0 : 0.0, (double *)c, (blasint)ldc);
}

/* Element offset of row i (NoTrans: i·ld; Trans: i) of a's (m, k) view, and of column j of
 * b's (k, n) view (NoTrans: j; Trans: j·ld). */
static int64_t row_off(pn_gemm_layout l, int64_t i) { return l.trans ? i : i * l.ld; }
static int64_t col_off(pn_gemm_layout l, int64_t j) { return l.trans ? j * l.ld : j; }

/* One GEMM: c (m, n) row-major with ldc = n; c = (or +=, acc) a · b. Outside any parallel region and big
 * enough, split into one block of rows (or, for a short wide c, of columns) per thread;
 * blocks are multiples of 16 so each thread's packing stays aligned to the kernels. */
static void gemm1(int dt, int64_t m, int64_t n, int64_t k, const char *a, pn_gemm_layout la, const char *b,
                  pn_gemm_layout lb, char *c, int acc) {
    size_t es = pn_elsize(dt);
    /* any enclosing region, active or not (omp_in_parallel is false in an inactive one, whose
     * nested team libgomp would start and end at every call): stay on this thread */
    int nt = omp_get_level() > 0 ? 1 : omp_get_max_threads();
    double mnk = (double)m * (double)n * (double)k;
    if (nt < 2 || mnk <= SMALL_GEMM || (m < 32 && n < 32)) {
        blas_gemm(dt, m, n, k, a, la, b, lb, c, n, acc);
        return;
    }
    bool by_rows = m >= n || m >= 16 * (int64_t)nt;
    int64_t len = by_rows ? m : n;
    int64_t blk = (len + nt - 1) / nt;
    blk = (blk + 15) / 16 * 16;
    int64_t nblk = (len + blk - 1) / blk;
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t t = 0; t < nblk; t++) {
        int64_t lo = t * blk, cnt = lo + blk <= len ? blk : len - lo;
        if (by_rows)
            blas_gemm(dt, cnt, n, k, a + (size_t)row_off(la, lo) * es, la, b, lb, c + (size_t)(lo * n) * es, n, acc);
        else
            blas_gemm(dt, m, cnt, k, a, la, b + (size_t)col_off(lb, lo) * es, lb, c + (size_t)lo * es, n, acc);
    }
}

/* The i-th GEMM of a batch: c's i-th (m, n) block = a's · b's (batch strides sa, sb over bshape) */
static void batch_gemm(int dt, int bnd, const int64_t *bshape, const int64_t *sa, const int64_t *sb, int64_t i,
                       int64_t m, int64_t n, int64_t k, const char *pa, pn_gemm_layout la, const char *pb,
                       pn_gemm_layout lb, char *pc, int acc) {
    const size_t es = pn_elsize(dt);
    int64_t oa, ob;
    pn_matmul_batch_offsets(bnd, bshape, sa, sb, i, &oa, &ob);
    gemm1(dt, m, n, k, pa + (size_t)oa * es, la, pb + (size_t)ob * es, lb, pc + (size_t)(i * m * n) * es, acc);
}

/* A contiguous copy made without autograd (the op records its own node). */
static pn_tensor *plain_copy(pn_tensor *x) {
    pn_tensor *c = pn_empty_like(x);
    if (c && pn_copy_(c, x)) {
        pn_release(c);
        return NULL;
    }
    return c;
}

/* CPU kernel: c (batch..., m, n) contiguous = (or += with acc) a (batch..., m, k) @ b (batch..., k, n).
 * a, b: views whose batch strides (sa, sb; 0 where broadcast) are given over bshape. */
pn_status pn_cpu_matmul(int bnd, const int64_t *bshape, int64_t m, int64_t n, int64_t k, const pn_tensor *a,
                        const int64_t *sa, int64_t a_sm, int64_t a_sk, const pn_tensor *b, const int64_t *sb,
                        int64_t b_sk, int64_t b_sn, pn_tensor *c, int acc) {
    const int dt = c->dt;
    int64_t nbatch = pn_shape_numel(bnd, bshape);
    char *pc = pn_ptr(c);
    size_t es = pn_elsize(dt);
    if (nbatch == 0 || m == 0 || n == 0) return PN_OK;
    if (k == 0) { /* empty sum */
        if (!acc) memset(pc, 0, (size_t)(nbatch * m * n) * es);
        return PN_OK;
    }
    pn_gemm_layout la = pn_gemm_layout_of(m, k, a_sm, a_sk), lb = pn_gemm_layout_of(k, n, b_sk, b_sn);
    const char *pa = pn_ptr(a), *pb = pn_ptr(b);

    /* b shared by every batch and a's rows evenly strided: one tall GEMM */
    int64_t rs = pn_matmul_tall_stride(bnd, bshape, nbatch, sa, sb, m, k, a_sm, a_sk);
    if (rs >= 0 && nbatch * m <= INT_MAX) {
        pn_gemm_layout tall = {0, rs, true};
        PN_BLAS_SERIAL_BEGIN;
        gemm1(dt, nbatch * m, n, k, pa, tall, pb, lb, pc, acc);
        PN_BLAS_SERIAL_END;
        return PN_OK;
    }

    /* several GEMMs: the batch across threads (each GEMM then serial); fewer GEMMs than
     * threads: one after another, each split inside gemm1 — outside any region, since gemm1
     * stays serial inside one (an inactive `omp parallel if (0)` included). */
    double mnk = (double)m * (double)n * (double)k;
    bool par = nbatch >= pn_num_threads() && mnk * (double)nbatch > PN_PAR_MIN;
    PN_BLAS_SERIAL_BEGIN;
    if (par) {
        #pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nbatch; i++)
            batch_gemm(dt, bnd, bshape, sa, sb, i, m, n, k, pa, la, pb, lb, pc, acc);
    } else {
        for (int64_t i = 0; i < nbatch; i++)
            batch_gemm(dt, bnd, bshape, sa, sb, i, m, n, k, pa, la, pb, lb, pc, acc);
    }
    PN_BLAS_SERIAL_END;
    return PN_OK;
}

/* ---- backward --------------------------------------------------------------------------- */
/* a2, b2 below are the operands after 1-D promotion: a (K) → (1, K), b (K) → (K, 1); g2 is
 * the gradient with the dropped dims put back, so every case is the N-D one:
 *   dA2 = g2 @ b2ᵀ  summed over the batch dims a2 was broadcast along,
 *   dB2 = a2ᵀ @ g2  likewise; when b2 is one matrix shared by the whole batch, the batch
 *   is folded into the contraction instead ((B·M, K)ᵀ @ (B·M, N)), which sums it for free. */
static pn_tensor *promote(pn_tensor *x, int dim) { return pn_unsqueeze(x, dim); }

static pn_status matmul_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *a = n->saved[0], *b = n->saved[1];
    bool a1 = a->nd == 1, b1 = b->nd == 1;
    pn_tensor *a2 = NULL, *b2 = NULL, *g2 = NULL, *t = NULL, *prod = NULL, *red = NULL;
    pn_status st = PN_ERR_OOM;
    a2 = a1 ? promote(a, 0) : (pn_retain(a), a);
    b2 = b1 ? promote(b, 1) : (pn_retain(b), b);
    if (!a2 || !b2) goto cleanup;
    pn_retain(g);
    g2 = g;
    if (a1) {
        t = pn_unsqueeze(g2, g2->nd - (b1 ? 0 : 1)); /* (…, N) → (…, 1, N); () → (1) */
        pn_release(g2);
        g2 = t;
        t = NULL;
        if (!g2) goto cleanup;
    }
    if (b1) {
        t = pn_unsqueeze(g2, g2->nd); /* (…, M) → (…, M, 1) */
        pn_release(g2);
        g2 = t;
        t = NULL;
        if (!g2) goto cleanup;
    }
    if (pn_ag_input_needs(n, 0)) {
        t = pn_transpose(b2, -1, -2);
        prod = t ? pn_matmul(g2, t) : NULL;
        red = prod ? pn_sum_to_shape(prod, a2->nd, a2->sizes) : NULL;
        gin[0] = red ? pn_reshape(red, a->nd, a->sizes) : NULL;
        pn_release(t);
        pn_release(prod);
        pn_release(red);
        t = prod = red = NULL;
        if (!gin[0]) goto cleanup;
    }
    if (pn_ag_input_needs(n, 1)) {
        if (b2->nd == 2 && g2->nd > 2) {
            int64_t ka[2] = {-1, a2->sizes[a2->nd - 1]}, kg[2] = {-1, g2->sizes[g2->nd - 1]};
            pn_tensor *ar = pn_reshape(a2, 2, ka), *gr = pn_reshape(g2, 2, kg);
            t = ar ? pn_transpose(ar, 0, 1) : NULL;
            red = (t && gr) ? pn_matmul(t, gr) : NULL;
            pn_release(ar);
            pn_release(gr);
        } else {
            t = pn_transpose(a2, -1, -2);
            prod = t ? pn_matmul(t, g2) : NULL;
            red = prod ? pn_sum_to_shape(prod, b2->nd, b2->sizes) : NULL;
        }
        gin[1] = red ? pn_reshape(red, b->nd, b->sizes) : NULL;
        if (!gin[1]) goto cleanup;
    }
    st = PN_OK;
cleanup:
    pn_release(a2);
    pn_release(b2);
    pn_release(g2);
    pn_release(t);
    pn_release(prod);
    pn_release(red);
    return st;
}

/* ---- forward ---------------------------------------------------------------------------- */
/* out = a @ b, or with addend (broadcast to the product's shape) out = addend + a @ b: the
 * addend is written into out first and the GEMM adds onto it (pn_linear's bias). Checks,
 * the product's shape, operands BLAS cannot read copied; records no autograd. */
static pn_tensor *matmul_fwd(pn_tensor *a, pn_tensor *b, pn_tensor *addend) {
    int dev;
    const pn_kernels *kt;
    if (!a || !b) return pn_error_null(PN_ERR_ARG, "matmul: %s is nil", a ? "b" : "a");
    if (pn_kernels_for("matmul", 2, (const pn_tensor *const[]){a, b}, (const char *const[]){"a", "b"}, &dev, &kt))
        return NULL;
    if (!pn_is_float(a->dt) || a->dt != b->dt)
        return pn_error_null(PN_ERR_DTYPE, "matmul: a %s %s and b %s %s: need the same float dtype (f32 or f64)",
                             pn_dtype_name(a->dt), pn_shape_str(a), pn_dtype_name(b->dt), pn_shape_str(b));
    if (a->nd == 0 || b->nd == 0)
        return pn_error_null(PN_ERR_SHAPE, "matmul: a %s and b %s: both need at least 1 dim", pn_shape_str(a),
                             pn_shape_str(b));
    /* promoted views: a2 (…, m, k), b2 (…, k, n) described by sizes/strides, no tensors */
    int64_t m = a->nd == 1 ? 1 : a->sizes[a->nd - 2], ka = a->sizes[a->nd - 1];
    int64_t a_sm = a->nd == 1 ? 0 : a->strides[a->nd - 2], a_sk = a->strides[a->nd - 1];
    int64_t kb = b->nd == 1 ? b->sizes[0] : b->sizes[b->nd - 2], n = b->nd == 1 ? 1 : b->sizes[b->nd - 1];
    int64_t b_sk = b->nd == 1 ? b->strides[0] : b->strides[b->nd - 2], b_sn = b->nd == 1 ? 0 : b->strides[b->nd - 1];
    if (ka != kb)
        return pn_error_null(PN_ERR_SHAPE, "matmul: a %s and b %s: inner dims %lld and %lld differ", pn_shape_str(a),
                             pn_shape_str(b), (long long)ka, (long long)kb);
    int and_ = a->nd > 2 ? a->nd - 2 : 0, bnd_ = b->nd > 2 ? b->nd - 2 : 0;
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    if (pn_broadcast_shape("matmul", and_, a->sizes, bnd_, b->sizes, &bnd, bshape))
        return pn_error_null(PN_ERR_SHAPE, "matmul: a %s and b %s: batch dims %s and %s cannot be broadcast",
                             pn_shape_str(a), pn_shape_str(b), pn_dims_str(and_, a->sizes), pn_dims_str(bnd_, b->sizes));
    for (int i = 0; i < 3; i++) {
        int64_t v = i == 0 ? m : i == 1 ? n : ka;
        if (v > INT_MAX)
            return pn_error_null(PN_ERR_ARG, "matmul: a %s and b %s: a dim of %lld exceeds the BLAS int range",
                                 pn_shape_str(a), pn_shape_str(b), (long long)v);
    }
    /* output shape: batch, then m unless a was 1-D, then n unless b was 1-D */
    int ond = bnd;
    int64_t oshape[PN_MAX_DIMS];
    memcpy(oshape, bshape, sizeof(int64_t) * (size_t)bnd);
    if (a->nd > 1) oshape[ond++] = m;
    if (b->nd > 1) oshape[ond++] = n;

    /* operands BLAS cannot read as they are get one contiguous copy */
    pn_tensor *ac = a, *bc = b;
    pn_retain(a);
    pn_retain(b);
    if (!pn_gemm_layout_of(m, ka, a_sm, a_sk).ok) {
        pn_release(ac);
        if (!(ac = plain_copy(a))) {
            pn_release(bc);
            return NULL;
        }
        a_sm = a->nd == 1 ? 0 : ka;
        a_sk = 1;
    }
    if (!pn_gemm_layout_of(kb, n, b_sk, b_sn).ok) {
        pn_release(bc);
        if (!(bc = plain_copy(b))) {
            pn_release(ac);
            return NULL;
        }
        b_sk = b->nd == 1 ? 1 : n;
        b_sn = 1;
    }
    int64_t sa[PN_MAX_DIMS], sb[PN_MAX_DIMS];
    {   /* batch strides of each operand over bshape (0 where broadcast or missing) */
        pn_tensor va = *ac, vb = *bc;
        va.nd = and_;
        vb.nd = bnd_;
        pn_broadcast_strides(&va, bnd, bshape, sa);
        pn_broadcast_strides(&vb, bnd, bshape, sb);
    }
    pn_tensor *out = pn_empty(ond, oshape, a->dt, dev);
    pn_status st = out ? PN_OK : PN_ERR_OOM;
    if (!st && addend) st = pn_copy_(out, addend);
    if (!st)
        st = PN_KCALL("matmul", kt, matmul, bnd, bshape, m, n, ka, ac, sa, a_sm, a_sk, bc, sb, b_sk, b_sn, out,
                      addend != NULL);
    pn_release(ac);
    pn_release(bc);
    if (st) {
        pn_release(out);
        return NULL;
    }
    return out;
}

pn_tensor *pn_matmul(pn_tensor *a, pn_tensor *b) {
    pn_tensor *out = matmul_fwd(a, b, NULL);
    if (!out) return NULL;
    pn_tensor *ins[2] = {a, b};
    if (pn_ag_needed(2, ins)) {
        pn_node *node = pn_ag_record(out, "matmul", matmul_bw, 2, ins);
        if (!node) {
            pn_release(out);
            return NULL;
        }
        if (pn_ag_save(node, a) || pn_ag_save(node, b)) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}

/* ---- linear: x @ wᵀ + b ------------------------------------------------------------------ */
/* saved: [0] x, [1] w. g (…, out) → dx = g @ w (…, in), dw = g₂ᵀ @ x₂ over the rows of every
 * leading dim (out, in), db = g summed down to (out). */
static pn_status linear_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0], *w = n->saved[1];
    const int64_t out_f = w->sizes[0], in_f = w->sizes[1];
    if (pn_ag_input_needs(n, 0) && !(gin[0] = pn_matmul(g, w))) return PN_ERR_OOM;
    if (pn_ag_input_needs(n, 1)) {
        int64_t sg[2] = {-1, out_f}, sx[2] = {-1, in_f};
        pn_tensor *g2 = pn_reshape(g, 2, sg), *x2 = pn_reshape(x, 2, sx);
        pn_tensor *g2t = g2 ? pn_transpose(g2, 0, 1) : NULL;
        gin[1] = g2t && x2 ? pn_matmul(g2t, x2) : NULL;
        pn_release(g2);
        pn_release(x2);
        pn_release(g2t);
        if (!gin[1]) return PN_ERR_OOM;
    }
    if (n->n_in > 2 && pn_ag_input_needs(n, 2) && !(gin[2] = pn_sum_to_shape(g, 1, &out_f))) return PN_ERR_OOM;
    return PN_OK;
}

pn_tensor *pn_linear(pn_tensor *x, pn_tensor *w, pn_tensor *b) {
    const char *op = "linear";
    if (!x || !w) return pn_error_null(PN_ERR_ARG, "linear: %s is nil", x ? "w" : "x");
    int dev;
    const pn_kernels *kt;
    if (pn_kernels_for(op, b ? 3 : 2, (const pn_tensor *const[]){x, w, b}, (const char *const[]){"x", "w", "b"}, &dev,
                       &kt))
        return NULL;
    if (!pn_is_float(x->dt) || w->dt != x->dt || (b && b->dt != x->dt))
        return pn_error_null(PN_ERR_DTYPE, "linear: x %s %s, w %s %s%s%s%s%s: need the same float dtype (f32 or f64)",
                             pn_dtype_name(x->dt), pn_shape_str(x), pn_dtype_name(w->dt), pn_shape_str(w),
                             b ? ", b " : "", b ? pn_dtype_name(b->dt) : "", b ? " " : "", b ? pn_shape_str(b) : "");
    if (x->nd < 1)
        return pn_error_null(PN_ERR_SHAPE, "linear: x %s must have at least 1 dim (…, in)", pn_shape_str(x));
    if (w->nd != 2 || x->sizes[x->nd - 1] != w->sizes[1])
        return pn_error_null(PN_ERR_SHAPE, "linear: x %s and w %s: w must be (out, in) with in = x's last dim",
                             pn_shape_str(x), pn_shape_str(w));
    if (b && (b->nd != 1 || b->sizes[0] != w->sizes[0]))
        return pn_error_null(PN_ERR_SHAPE, "linear: b %s must be (out) = (%lld) for w %s", pn_shape_str(b),
                             (long long)w->sizes[0], pn_shape_str(w));
    /* the product on detached views, so that only the linear node below is recorded */
    pn_tensor *xd = pn_detach(x), *wd = pn_detach(w), *bd = b ? pn_detach(b) : NULL;
    pn_tensor *wt = wd ? pn_transpose(wd, 0, 1) : NULL;
    pn_tensor *out = xd && wt && (!b || bd) ? matmul_fwd(xd, wt, bd) : NULL;
    pn_release(xd);
    pn_release(wd);
    pn_release(bd);
    pn_release(wt);
    if (!out) return NULL;
    pn_tensor *ins[3] = {x, w, b};
    const int nin = b ? 3 : 2;
    if (pn_ag_needed(nin, ins)) {
        pn_node *node = pn_ag_record(out, op, linear_bw, nin, ins);
        if (!node || pn_ag_save(node, x) || pn_ag_save(node, w)) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}
