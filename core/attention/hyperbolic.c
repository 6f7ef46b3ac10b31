/* hyperbolic.c — the Poincaré-ball toolkit and the Klein conversions (DESIGN §3.1; Gulcehre
 * Eq. 2–3 and Coneheads App. 7.1 for the models, the Poincaré-ball note for the ball maps).
 *
 * Models and conventions (curvature −c, c > 0):
 *   Poincaré ball  ‖p‖ < 1/√c.
 *   Klein ball     ‖k‖ < 1/√c.   Poincaré → Klein k = 2p/(1 + c‖p‖²); Klein → Poincaré
 *                  p = k/(1 + √(1 − c‖k‖²)).
 *   Hyperboloid    −x_d² + ‖x₋‖² = −1/c, x_d > 0, the TIME-LIKE COORDINATE LAST (as the
 *                  pseudopolar map produces it; c = 1 is Gulcehre's unit hyperboloid).
 *                  Hyperboloid → Klein k = x₋/(√c x_d); Klein → hyperboloid
 *                  x = (k, 1/√c)/√(1 − c‖k‖²) (Coneheads Eq. 16–17 at c = 1).
 *   expmap0(v) = tanh(√c‖v‖) v/(√c‖v‖)          logmap0(y) = artanh(√c‖y‖) y/(√c‖y‖)
 *   x ⊕ y = ((1 + 2c x·y + c‖y‖²) x + (1 − c‖x‖²) y) / (1 + 2c x·y + c²‖x‖²‖y‖²)
 *   dist(x, y) = (2/√c) artanh(√c ‖(−x) ⊕ y‖), computed as
 *                (2/√c) artanh(√c ‖x − y‖ / √(1 − 2c x·y + c²‖x‖²‖y‖²)) — the same number
 *                (‖(−x)⊕y‖² = ‖x − y‖²/(1 − 2c x·y + c²‖x‖²‖y‖²)), but exactly 0 at x = y and
 *                without the cancellation of forming (−x)⊕y.
 *
 * Boundary handling — the constants, chosen per dtype (the row maths is in double for both):
 *   EPS   4e-3 (f32), 1e-5 (f64): project keeps ‖x‖ ≤ (1 − EPS)/√c (f32 cannot resolve the
 *         hyperbolic distances of points much closer to the boundary; geoopt's values).
 *   TOL   1e-5 (f32), 1e-12 (f64): a point with 1 ≤ √c‖x‖ ≤ 1 + TOL is ON the boundary up to
 *         rounding (e.g. a float32 tanh that rounded to 1) and is accepted; the clamps below
 *         keep what is computed from it finite. Beyond 1 + TOL the point is not in the ball:
 *         an error naming the op, the argument, the point and √c‖x‖ — never a silent NaN.
 *         Non-finite points are errors too.
 *   AMAX  artanh arguments are clamped to ≤ AMAX = 1 − 1e-7 (f32), 1 − 1e-15 (f64), about
 *         the last representable value below 1: logmap0 and dist saturate (logmap0 ≤ 8.4/√c
 *         in f32, 17.6/√c in f64) instead of reaching inf, monotonically, and their
 *         gradients are 0 past the clamp and ≤ ~1/(2(1 − AMAX)) before it.
 *   ‖x‖ = 0 in expmap0/logmap0: the factors tanh(t)/t and artanh(t)/t are evaluated as their
 *         limits (→ 1) and their derivatives by Taylor series for t < 0.01, so the gradient
 *         at 0 is the identity, not 0/0.
 *   Denominators of ⊕ and dist are evaluated as (1 ± c x·y)² + c²(‖x‖²‖y‖² − (x·y)²), a sum
 *         of non-negatives (the expanded form cancels near the boundary), floored at DBL_MIN.
 *   Klein points are capped at √c‖k‖ ≤ 2r/(1 + r²), r = 1 − EPS (the image of the project
 *         radius), so that 1 − c‖k‖² never reaches 0 (and γ(k) of the Einstein midpoint stays
 *         finite); from_klein floors 1 − c‖k‖² at EPS²/4 for the same reason.
 */
#include "hyperbolic_rows.h"

#include <float.h>
#include <stdio.h>

/* block versions of every row kernel (hyperbolic_rows.h, rowmap.h) */
PN_ROWMAP_ROWS(expmap0)
PN_ROWMAP_ROWS(logmap0)
PN_ROWMAP_ROWS(project)
PN_ROWMAP_ROWS(mobius)
PN_ROWMAP_ROWS(dist)
PN_ROWMAP_ROWS(p2k)
PN_ROWMAP_ROWS(h2k)
PN_ROWMAP_ROWS(k2p)
PN_ROWMAP_ROWS(k2h)

/* ---- public entry points ---------------------------------------------------------------------------------- */
/* checks shared by every toolkit op; fills the constants of the header comment */
static pn_status setup(pn_rowmap *m, const char *op, pn_tensor *x, pn_tensor *y, double c) {
    PN_TRY(pn_rowmap_check(op, x, y));
    if (!(c > 0) || isinf(c))
        return pn_error(PN_ERR_ARG, "%s: x %s: curvature argument c = %g must be a finite number > 0 (the space has "
                        "curvature -c)", op, pn_shape_str(x), c);
    if (x->sizes[x->nd - 1] < 1)
        return pn_error(PN_ERR_SHAPE, "%s: x %s has no coordinates in the last dim", op, pn_shape_str(x));
    bool f32 = x->dt == PN_F32;
    double eps = f32 ? 4e-3 : 1e-5, r = 1.0 - eps;
    *m = (pn_rowmap){.op = op, .arg = {"x", "y"}, .nin = y ? 2 : 1};
    m->D = m->Dout = x->sizes[x->nd - 1];
    m->sc[C_] = c;
    m->sc[SQC] = sqrt(c);
    m->sc[EPS] = eps;
    m->sc[TOL] = f32 ? 1e-5 : 1e-12;
    m->sc[KMIN] = eps * eps / 4;
    m->sc[KMAX] = 2 * r / (1 + r * r);
    m->sc[AMAX] = f32 ? 1.0 - 1e-7 : 1.0 - 1e-15;
    return PN_OK;
}

#define BALL_FMT "sqrt(c)*|point| = %%g with c = %g: outside the Poincare ball or not finite (needs < 1; hyper.project " \
    "moves points inside)"

pn_tensor *pn_hyp_expmap0(pn_tensor *x, double c) {
    pn_rowmap m;
    if (setup(&m, "hyper.expmap0", x, NULL, c)) return NULL;
    PN_ROWMAP_USE(m, expmap0);
    m.bad_fmt = "|v| = %g: a tangent vector must be finite";
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_logmap0(pn_tensor *x, double c) {
    pn_rowmap m;
    char fmt[200];
    if (setup(&m, "hyper.logmap0", x, NULL, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    PN_ROWMAP_USE(m, logmap0);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_project(pn_tensor *x, double c) {
    pn_rowmap m;
    if (setup(&m, "hyper.project", x, NULL, c)) return NULL;
    PN_ROWMAP_USE(m, project);
    m.bad_fmt = "|x| = %g: a point to project must be finite";
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_mobius_add(pn_tensor *x, pn_tensor *y, double c) {
    pn_rowmap m;
    char fmt[200];
    if (!y) return pn_error_null(PN_ERR_ARG, "hyper.mobius_add: y is nil");
    if (setup(&m, "hyper.mobius_add", x, y, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    PN_ROWMAP_USE(m, mobius);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, y);
}

pn_tensor *pn_hyp_dist(pn_tensor *x, pn_tensor *y, double c) {
    pn_rowmap m;
    char fmt[200];
    if (!y) return pn_error_null(PN_ERR_ARG, "hyper.dist: y is nil");
    if (setup(&m, "hyper.dist", x, y, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    m.Dout = 0;
    PN_ROWMAP_USE(m, dist);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, y);
}

static const char *model_name(int model) {
    switch (model) {
    case PN_MODEL_HYPERBOLOID: return "hyperboloid";
    case PN_MODEL_HALFSPACE: return "halfspace";
    case PN_MODEL_POINCARE: return "poincare";
    case PN_MODEL_KLEIN: return "klein";
    default: return "unknown";
    }
}

pn_tensor *pn_hyp_to_klein(pn_tensor *x, int from_model, double c) {
    pn_rowmap m;
    char fmt[200];
    const char *op = "hyper.to_klein";
    if (setup(&m, op, x, NULL, c)) return NULL;
    if (from_model == PN_MODEL_POINCARE) {
        snprintf(fmt, sizeof fmt, BALL_FMT, c);
        PN_ROWMAP_USE(m, p2k);
    } else if (from_model == PN_MODEL_HYPERBOLOID) {
        if (m.D < 2)
            return pn_error_null(PN_ERR_SHAPE, "%s: x %s: a hyperboloid point needs at least 2 coordinates "
                                 "(space-like ones, then the time-like one last)", op, pn_shape_str(x));
        snprintf(fmt, sizeof fmt, "|x_-|/x_d = %%g: not on the upper sheet of the hyperboloid (needs "
                 "0 <= |x_-| < x_d, time-like coordinate last)");
        m.Dout = m.D - 1;
        PN_ROWMAP_USE(m, h2k);
    } else {
        return pn_error_null(PN_ERR_ARG, "%s: x %s: from model %d (%s) is not supported; use hyperboloid or poincare",
                             op, pn_shape_str(x), from_model, model_name(from_model));
    }
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_from_klein(pn_tensor *x, int to_model, double c) {
    pn_rowmap m;
    char fmt[200];
    const char *op = "hyper.from_klein";
    if (setup(&m, op, x, NULL, c)) return NULL;
    snprintf(fmt, sizeof fmt, "sqrt(c)*|k| = %%g with c = %g: outside the Klein ball (needs < 1)", c);
    if (to_model == PN_MODEL_POINCARE) {
        PN_ROWMAP_USE(m, k2p);
    } else if (to_model == PN_MODEL_HYPERBOLOID) {
        m.Dout = m.D + 1;
        PN_ROWMAP_USE(m, k2h);
    } else {
        return pn_error_null(PN_ERR_ARG, "%s: x %s: to model %d (%s) is not supported; use hyperboloid or poincare",
                             op, pn_shape_str(x), to_model, model_name(to_model));
    }
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}
