/* matmul_plan.h — how a matmul's operands are handed to a GEMM, shared by the CPU kernel
 * (ops/matmul.c, OpenBLAS) and its CUDA twin (cuda/ops/matmul.cu, cuBLAS): which BLAS layout
 * reads a strided matrix as it is, when a whole broadcast batch folds into one tall GEMM,
 * and each batch's element offsets. Host code only (plain C, also compiled as C++). */
#ifndef PN_MATMUL_PLAN_H
#define PN_MATMUL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

/* How BLAS reads a (rows, cols) row-major view with element strides (srow, scol): trans 0 =
 * row-major with leading dimension ld (NoTrans), 1 = transposed row-major (column-major,
 * Trans) with ld; ok false when neither holds (the front end copies such an operand). */
typedef struct {
    int trans;
    int64_t ld;
    bool ok;
} pn_gemm_layout;

static inline pn_gemm_layout pn_gemm_layout_of(int64_t rows, int64_t cols, int64_t srow, int64_t scol) {
    pn_gemm_layout l = {0, 0, false};
    int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    /* a size-1 dim may carry any stride: it is never stepped along */
    if (scol == 1 || cols <= 1) {
        int64_t ld = rows <= 1 ? c1 : srow;
        if (ld >= c1) {
            l.trans = 0, l.ld = ld, l.ok = true;
            return l;
        }
    }
    if (srow == 1 || rows <= 1) {
        int64_t ld = cols <= 1 ? r1 : scol;
        if (ld >= r1) l.trans = 1, l.ld = ld, l.ok = true;
    }
    return l;
}

/* Row stride when a's batch dims (bshape, batch strides sa) and its row dim (m, srow)
 * form one evenly strided run of rows; -1 otherwise. */
static inline int64_t pn_matmul_merged_row_stride(int bnd, const int64_t *bshape, const int64_t *sa, int64_t m,
                                                  int64_t srow) {
    int64_t base = -1, span = 1; /* stride of the innermost non-trivial dim, rows covered so far */
    if (m > 1) {
        base = srow;
        span = m;
    }
    for (int d = bnd - 1; d >= 0; d--) {
        if (bshape[d] == 1) continue;
        if (base < 0) base = sa[d];
        else if (sa[d] != base * span) return -1;
        span *= bshape[d];
    }
    return base < 0 ? 0 : base;
}

/* The whole batch as ONE tall GEMM (nbatch·m rows, leading dimension the result): when b is
 * shared by every batch (sb 0 wherever bshape > 1) and a's rows — row-major, stride 1 along k —
 * are evenly strided across the batch. -1 when it does not apply (one batch, b varies, a's
 * rows are not one run, or a stride below max(k, 1)). The caller still checks nbatch·m fits
 * its BLAS's int. */
static inline int64_t pn_matmul_tall_stride(int bnd, const int64_t *bshape, int64_t nbatch, const int64_t *sa,
                                            const int64_t *sb, int64_t m, int64_t k, int64_t a_sm, int64_t a_sk) {
    for (int d = 0; d < bnd; d++)
        if (bshape[d] > 1 && sb[d] != 0) return -1;
    if (nbatch <= 1 || (a_sk != 1 && k != 1)) return -1;
    int64_t rs = pn_matmul_merged_row_stride(bnd, bshape, sa, m, a_sm);
    return rs >= (k > 1 ? k : 1) ? rs : -1;
}

/* The element offsets of flat batch i (row-major over bshape) in a and b. */
static inline void pn_matmul_batch_offsets(int bnd, const int64_t *bshape, const int64_t *sa, const int64_t *sb,
                                           int64_t i, int64_t *oa, int64_t *ob) {
    int64_t a = 0, b = 0, r = i;
    for (int d = bnd - 1; d >= 0; d--) {
        int64_t j = r % bshape[d];
        r /= bshape[d];
        a += j * sa[d];
        b += j * sb[d];
    }
    *oa = a, *ob = b;
}

#endif /* PN_MATMUL_PLAN_H */
