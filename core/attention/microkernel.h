/* microkernel.h — the register-blocked f32 GEMM block of the CPU attention drivers (issue 16).
 *
 * One operation serves every product of a fused attention tile:
 *
 *   C[i][c] (i < mr, c < ncols rounded up to nr)  = or +=  Σ_{k < K} A[i·rs + k·cs] · B(k, c)
 *
 * A is read in place with any row / column stride (its values are broadcast one at a time, so
 * Q rows, P rows and Pᵀ all work without packing); B is packed in panels of nr columns,
 * B(k, c) = Bp[(c / nr)·bstride + k·nr + c % nr] (pn_mk_pack_rows / pn_mk_pack_cols below),
 * which the drivers do once per head (K, V) or once per tile (dO, Q). The mr × nr block of C
 * lives in registers through the whole k loop — the scores of a tile never leave L1 between
 * their GEMM, the score's epilogue and the online softmax (dense_impl.h), and P·V is the next
 * call on the same buffer. C must be at least ceil(ncols / nr)·nr wide (the drivers' buffers
 * are padded); rows ≥ mr are neither read from A nor written.
 *
 * A call covers at most nb columns (nb / nr panels, the drivers' step), any mr ≤ .mr rows.
 *
 * Implementations (microkernel.c, one body in microkernel_impl.h compiled per instruction set):
 *   avx512  16-wide (AVX-512F), MR 6 × 2 panels of NR 32 (one panel for an odd count's tail)
 *   avx2    8-wide (AVX2 + FMA), MR 6 × NR 16
 *   portable  plain C (GCC/Clang's generic 4-float vector, no target flags), MR 4 × NR 8
 * chosen at the first call: the best the CPU has, or PENUMBRA_CPU_KERNEL=auto|avx512|avx2|
 * portable, or pn_set_cpu_kernel() (penumbra.h). The drivers run the same maths on every one;
 * the specs compare each against portable at sizes that hit every edge of the blocks. */
#ifndef PN_MICROKERNEL_H
#define PN_MICROKERNEL_H

#include "../internal.h"

typedef void (*pn_mk_gemm_fn)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, int64_t cs,
                              const float *Bp, int64_t bstride, float *C, int64_t ldc, int accumulate);

/* The distance scores' form of the product (K = the coordinates, cs = 1): C (mr, ncols) =
 * −½‖a_i − b_c‖², expanded as a_i·b_c − ½rn[i] − ½cn[c] in the registers from the squared
 * norms rn (mr) and cn (ncols rounded up to nr, 0 in the padding); returns nonzero when some
 * pair has ‖a − b‖² < lim·(rn + cn) — where the expansion cancelled and the caller recomputes
 * from the differences (attention.h, PN_DIFF_NEAR). Padding columns never count. */
typedef int64_t (*pn_mk_dist_fn)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, const float *Bp,
                                 int64_t bstride, const float *rn, const float *cn, float lim, float *C, int64_t ldc);

typedef struct {
    const char *name;
    int mr, nr;          /* register block: rows of A / C, columns of a B panel */
    int nb;              /* columns one call takes at most: the block's panels (a multiple of nr) */
    pn_mk_gemm_fn gemm;  /* see above; mr ≤ .mr rows and ncols ≤ .nb columns per call */
    pn_mk_dist_fn dist;
} pn_microkernel;

/* The kernel in use (chosen at the first call; see above). NULL with pn_last_error set when
 * PENUMBRA_CPU_KERNEL names an unknown kernel or one this CPU cannot run. */
const pn_microkernel *pn_mk_get(void);

/* Pack rows: X (n, ·) with row stride ldx, its first K columns → panels of nr rows,
 * Bp[(j / nr)·K·nr + k·nr + j % nr] = X[j][k] (B(k, j) = X[j][k]: C = A·Xᵀ); rows n … up to a
 * multiple of nr are 0. Bp holds ceil(n / nr)·nr·K floats. */
void pn_mk_pack_rows(int64_t n, int64_t K, const float *X, int64_t ldx, int nr, float *Bp);
/* Pack columns: X (K, ncols) with row stride ldx → panels of nr columns with panel stride
 * bstride (≥ K·nr), Bp[(c / nr)·bstride + k·nr + c % nr] = X[k][c] (C = A·X); columns ncols …
 * up to a multiple of nr are 0. */
void pn_mk_pack_cols(int64_t K, int64_t ncols, const float *X, int64_t ldx, int nr, int64_t bstride, float *Bp);

/* x rounded up to a multiple of m */
static inline int64_t pn_mk_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

#endif
