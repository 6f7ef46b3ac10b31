/* maps.c — maps from Euclidean activations onto hyperbolic models (DESIGN §3.1), applied to
 * q and k before a distance/cone score. x (…, D): x₋ = x[0..D-2], x_d = x[D-1].
 *
 *   psi          Coneheads Eq. 10 (umbral):    (x₋·e^{x_d}, e^{x_d})         → half-space
 *   xi           Coneheads Eq. 11 (penumbral): (x₋·h σ(x_d), h σ(x_d))      → half-space below height h
 *   pseudopolar  Gulcehre §4.1: (sinh(x_d)·x₋/‖x₋‖, cosh(x_d))             → unit hyperboloid,
 *                time-like coordinate LAST (−y_d² + ‖y₋‖² = −1)
 *   exp0         Coneheads Eq. 9, the half-space exponential map at O = (0,…,0,1)
 *
 * Names follow the paper. The authors' released code swaps ψ and ξ and divides x_d by d
 * before its exponential map; here that division is only the scale_last option of exp0.
 *
 * Each map is a pair of row kernels (rowmap.h; written once in maps_rows.h, PN_HD, for the CPU
 * and the CUDA driver): forward and vector-Jacobian product, in double for both dtypes. */
#include "maps_rows.h"

#include <float.h>
#include <stdio.h>

/* block versions of every row kernel (maps_rows.h, rowmap.h) */
PN_ROWMAP_ROWS(psi)
PN_ROWMAP_ROWS(xi)
PN_ROWMAP_ROWS(pp)
PN_ROWMAP_ROWS(exp0)

/* ---- public entry points ---------------------------------------------------------------------------------- */
static pn_status check_map(const char *op, pn_tensor *x) {
    PN_TRY(pn_rowmap_check(op, x, NULL));
    if (x->sizes[x->nd - 1] < 2)
        return pn_error(PN_ERR_SHAPE, "%s: x %s needs at least 2 coordinates in the last dim (x₋ and the height x_d)",
                        op, pn_shape_str(x));
    return PN_OK;
}

static pn_tensor *run_map(const char *op, pn_tensor *x, int kind, pn_rows_fwd fr, pn_rows_bwd br, double s0, double s1,
                          int64_t i0) {
    pn_rowmap m = {.op = op, .arg = {"x", "y"}, .nin = 1, .kind = kind, .fwd_rows = fr, .bwd_rows = br, .bad_fmt = "%g"};
    m.D = m.Dout = x->sizes[x->nd - 1];
    m.sc[0] = s0;
    m.sc[1] = s1;
    m.iv[0] = i0;
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_map_psi(pn_tensor *x) {
    if (check_map("maps.psi", x)) return NULL;
    return run_map("maps.psi", x, PN_RM_psi, psi_fwd_rows, psi_bwd_rows, 0, x->dt == PN_F32 ? FLT_MIN : DBL_MIN, 0);
}

pn_tensor *pn_map_xi(pn_tensor *x, double h) {
    if (check_map("maps.xi", x)) return NULL;
    if (!(h > 0) || isinf(h))
        return pn_error_null(PN_ERR_ARG, "maps.xi: x %s: h = %g must be a positive finite height", pn_shape_str(x), h);
    return run_map("maps.xi", x, PN_RM_xi, xi_fwd_rows, xi_bwd_rows, h, x->dt == PN_F32 ? FLT_MIN : DBL_MIN, 0);
}

pn_tensor *pn_map_pseudopolar(pn_tensor *x) {
    if (check_map("maps.pseudopolar", x)) return NULL;
    return run_map("maps.pseudopolar", x, PN_RM_pp, pp_fwd_rows, pp_bwd_rows, x->dt == PN_F32 ? 1e-6 : 1e-12, 0, 0);
}

pn_tensor *pn_map_exp0(pn_tensor *x, double h, int scale_last) {
    if (check_map("maps.exp0", x)) return NULL;
    if (h == h && !(h > 0))
        return pn_error_null(PN_ERR_ARG, "maps.exp0: x %s: h = %g must be a positive height (NaN for none)",
                             pn_shape_str(x), h);
    return run_map("maps.exp0", x, PN_RM_exp0, exp0_fwd_rows, exp0_bwd_rows, h, x->dt == PN_F32 ? 30.0 : 300.0, scale_last != 0);
}
