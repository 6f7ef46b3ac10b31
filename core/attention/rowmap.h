/* rowmap.h — private to core/attention/: the driver behind the manifold maps (maps.c) and
 * the hyperbolic toolkit (hyperbolic.c).
 *
 * Every one of those ops maps points, one point per row of the last dim: x (…, D) → (…, Dout),
 * or (…, D) × (…, D) → (…, Dout) for the two-point ops (the leading dims broadcast, NumPy
 * style). A map is a pair of row kernels written once in double precision:
 *   fwd(x, y) → out            (one row; returns nonzero to reject the row, see below)
 *   bwd(x, y, gout) → gx, gy   (the vector-Jacobian product of the same row)
 * The driver packs blocks of rows into double scratch (any strides, f32 or f64; a contiguous
 * input is one flat conversion, or read in place when f64), runs the block kernel once per
 * block (PN_ROWMAP_ROWS wraps the row kernel in the row loop), stores the result in the
 * tensor's dtype, records the autograd node and runs the backward over the same rows. Doing the maths per row in double is what lets the kernels
 * use the stable rewrites and clamps of the papers' formulas (see each kernel) without a
 * chain of tensor ops, each of which would round to f32 and could overflow on its own.
 *
 * Rejecting a row (a point that cannot lie on the manifold): <name>_fwd returns 1 (x) or 2 (y)
 * and writes the offending number to *bad; the driver reports the first such row as
 * "<op>: <arg> <shape>, point <i>: <why>" with why = bad_fmt formatted with that number. */
#ifndef PN_ATTENTION_ROWMAP_H
#define PN_ATTENTION_ROWMAP_H

#include "../backend.h"

typedef struct pn_rowmap pn_rowmap;
/* The row kernels there are (maps_rows.h: psi … exp0; hyperbolic_rows.h: expmap0 … k2h), one id
 * each: pn_rowmap.kind = PN_RM_<name>. X(name) once per kernel, in id order. */
#define PN_RM_KINDS(X)                                                                         \
    X(psi) X(xi) X(pp) X(exp0)                                                                 \
    X(expmap0) X(logmap0) X(project) X(mobius) X(dist) X(p2k) X(h2k) X(k2p) X(k2h)
#define PN_RM_ID(name) PN_RM_##name,
enum { PN_RM_none = 0, PN_RM_KINDS(PN_RM_ID) PN_RM_end /* one past the last */ };
#undef PN_RM_ID
/* A map's row kernels, static functions of its file:
 *   int  <name>_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad)
 *        x, y: (D) rows (y NULL for one-input maps); out: (Dout) or (1) when Dout == 0
 *   void <name>_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g,
 *                   double *gx, double *gy)
 *        g: (Dout) or (1); gx, gy: (D) — both always written (gy ignored for one-input maps)
 * The driver calls them only through the block kernels below. */
/* The same kernels over n consecutive packed rows (x, y: (n, D); out: (n, Dout|1); g: (n, Dout|1);
 * gx, gy: (n, D)), generated from the row kernels by PN_ROWMAP_ROWS so the maths stays written
 * once: one indirect call per block of rows instead of one per row, and the row kernel inlined.
 * fwd_rows returns the index of the first rejected row of the block (its fwd code in *rej and
 * value in *bad), or -1; every row's output is written either way. */
typedef int64_t (*pn_rows_fwd)(const pn_rowmap *m, int64_t n, const double *x, const double *y, double *out,
                               int *rej, double *bad);
typedef void (*pn_rows_bwd)(const pn_rowmap *m, int64_t n, const double *x, const double *y, const double *g,
                            double *gx, double *gy);

struct pn_rowmap {
    const char *op;        /* name in error messages and grad_fn, e.g. "hyper.dist" */
    const char *arg[2];    /* argument names for messages: {"x", "y"} */
    int nin;               /* 1 or 2 inputs */
    int64_t D;             /* input row length (the last dim of every input) */
    int64_t Dout;          /* output row length; 0: one number per row and the last dim is dropped */
    int dt;                /* dtype of the inputs (set by pn_rowmap_apply) */
    double sc[8];          /* kernel parameters (curvature, clamps, …) */
    int64_t iv[2];
    int kind;              /* PN_RM_<name> of the row kernels (set by PN_ROWMAP_USE): what a device
                              launcher switches on, since it cannot call fwd_rows / bwd_rows */
    pn_rows_fwd fwd_rows;  /* PN_ROWMAP_ROWS(name): name##_fwd_rows, set by PN_ROWMAP_USE */
    pn_rows_bwd bwd_rows;  /* name##_bwd_rows */
    const char *bad_fmt;   /* printf format with one %g: why a rejected row cannot be mapped */
};

/* Defines name##_fwd_rows and name##_bwd_rows from the row kernels name##_fwd, name##_bwd.
 * PN_FLATTEN inlines the row kernel (and its inline helpers) into the row loop; the loop is
 * instantiated again for D = 3 and D = 4 (the head dims of the hyperbolic models) on a copy of
 * the map whose D is a constant, so the kernels' loops over coordinates unroll. Same maths,
 * same order of operations in every instance. */
#if defined(__GNUC__)
#define PN_FLATTEN __attribute__((flatten))
#else
#define PN_FLATTEN
#endif
/* a map's block kernels (and its kind) into a pn_rowmap */
#define PN_ROWMAP_USE(m, name) ((m).kind = PN_RM_##name, (m).fwd_rows = name##_fwd_rows, (m).bwd_rows = name##_bwd_rows)

#define PN_ROWMAP_ROWS(name)                                                                                     \
    static inline int64_t name##_fwd_loop(const pn_rowmap *m, int64_t D, int64_t Do, int64_t n, const double *x, \
                                          const double *y, double *out, int *rej, double *bad) {                 \
        int64_t first = -1;                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                                        \
            double bv = 0;                                                                                       \
            int r = name##_fwd(m, x + i * D, y ? y + i * D : NULL, out + i * Do, &bv);                           \
            if (r && first < 0) first = i, *rej = r, *bad = bv;                                                  \
        }                                                                                                        \
        return first;                                                                                            \
    }                                                                                                            \
    static PN_FLATTEN int64_t name##_fwd_rows(const pn_rowmap *m, int64_t n, const double *x, const double *y,   \
                                              double *out, int *rej, double *bad) {                              \
        const int64_t Do = m->Dout > 0 ? m->Dout : 1;                                                            \
        if (m->D == 3 || m->D == 4) {                                                                            \
            pn_rowmap k = *m;                                                                                    \
            if (m->D == 3) {                                                                                     \
                k.D = 3;                                                                                         \
                return name##_fwd_loop(&k, 3, Do, n, x, y, out, rej, bad);                                       \
            }                                                                                                    \
            k.D = 4;                                                                                             \
            return name##_fwd_loop(&k, 4, Do, n, x, y, out, rej, bad);                                           \
        }                                                                                                        \
        return name##_fwd_loop(m, m->D, Do, n, x, y, out, rej, bad);                                             \
    }                                                                                                            \
    static inline void name##_bwd_loop(const pn_rowmap *m, int64_t D, int64_t Dg, int64_t n, const double *x,    \
                                       const double *y, const double *g, double *gx, double *gy) {               \
        for (int64_t i = 0; i < n; i++)                                                                          \
            name##_bwd(m, x + i * D, y ? y + i * D : NULL, g + i * Dg, gx + i * D, gy + i * D);                  \
    }                                                                                                            \
    static PN_FLATTEN void name##_bwd_rows(const pn_rowmap *m, int64_t n, const double *x, const double *y,      \
                                           const double *g, double *gx, double *gy) {                            \
        const int64_t Dg = m->Dout > 0 ? m->Dout : 1;                                                            \
        if (m->D == 3 || m->D == 4) {                                                                            \
            pn_rowmap k = *m;                                                                                    \
            if (m->D == 3) {                                                                                     \
                k.D = 3;                                                                                         \
                name##_bwd_loop(&k, 3, Dg, n, x, y, g, gx, gy);                                                  \
                return;                                                                                          \
            }                                                                                                    \
            k.D = 4;                                                                                             \
            name##_bwd_loop(&k, 4, Dg, n, x, y, g, gx, gy);                                                      \
            return;                                                                                              \
        }                                                                                                        \
        name##_bwd_loop(m, m->D, Dg, n, x, y, g, gx, gy);                                                        \
    }

/* Generic checks shared by every map: x (and y) non-nil, f32/f64, cpu, at least 1 dim, and
 * for two inputs the same dtype and the same last dim. */
pn_status pn_rowmap_check(const char *op, pn_tensor *x, pn_tensor *y);

/* Runs the map (m->D, m->Dout, parameters filled in by the caller) and records autograd.
 * y is NULL when m->nin == 1. New reference, or NULL with the error set. */
pn_tensor *pn_rowmap_apply(const pn_rowmap *m, pn_tensor *x, pn_tensor *y);

/* a·b of two rows (‖a‖² when b == a), in double */
PN_HD static inline double pn_row_dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ‖v‖ without overflow or underflow of the squares (f64 inputs may be huge or tiny);
 * NaN/inf propagate */
PN_HD static inline double pn_row_norm(const double *v, int64_t n) {
    double s = pn_row_dot(v, v, n);
    if ((s > 1e-280 && s < 1e280) || s == 0 || s != s) return sqrt(s);
    double a = 0;
    for (int64_t i = 0; i < n; i++) a = fmax(a, fabs(v[i]));
    if (isinf(a)) return a;
    double t = 0;
    for (int64_t i = 0; i < n; i++) t += (v[i] / a) * (v[i] / a);
    return a * sqrt(t);
}

#endif /* PN_ATTENTION_ROWMAP_H */
