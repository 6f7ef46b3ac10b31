/* rope.c — rotary position embedding with an optional learned rate (DESIGN §3.2;
 * conformal-sympow), forward and analytic backward.
 *
 * x (…, N, D), D even; positions run along dim −2 (x is (B, H, N, D) in attention). Each pair
 * (x_2i, x_2i+1) (0-based) of row t is rotated by the angle a_ti = μ_t θ_i:
 *   y_2i   = x_2i cos a − x_2i+1 sin a
 *   y_2i+1 = x_2i sin a + x_2i+1 cos a
 * θ_i = base^(−2i/D) unless a θ vector (D/2) is given; μ_t = t (0-based) without a rate,
 * else μ_t = Σ_{s≤t} rate_s, the running sum including t, with rate broadcastable to
 * x's shape without its last dim (e.g. (B, H, N), (B, 1, N) or (N)).
 * Backward: ∂a_ti = g_2i·(−y_2i+1) + g_2i+1·y_2i; g x = the inverse rotation of g;
 * g θ_i = Σ ∂a_ti μ_t; g μ_t = Σ_i ∂a_ti θ_i and g rate_s = Σ_{t≥s} g μ_t, summed over
 * the broadcast dims. Angles and sums in f64 for both dtypes. */
#include "linear.h"

#define OP "rope"

typedef struct {
    int64_t R, N, D;      /* R sequences of N rows of D features */
    int dt;
    const double *theta;  /* (D/2) */
    const pn_tensor *rate; /* or NULL */
    int64_t roff_n;       /* rate stride along N (0 when broadcast) */
    int nlead;            /* dims of x before the N dim */
    int64_t lead[PN_MAX_DIMS], rst[PN_MAX_DIMS]; /* their sizes and the rate's strides there */
} rope_args;

/* μ (N) of sequence r */
static void positions(const rope_args *a, int64_t r, double *mu) {
    if (!a->rate) {
        for (int64_t t = 0; t < a->N; t++) mu[t] = (double)t;
        return;
    }
    int64_t off = 0, rem = r;
    for (int d = a->nlead - 1; d >= 0; d--) {
        off += (rem % a->lead[d]) * a->rst[d];
        rem /= a->lead[d];
    }
    const void *p = pn_ptr(a->rate);
    double acc = 0;
    for (int64_t t = 0; t < a->N; t++) mu[t] = (acc += pn_ld(p, a->rate->dt, off + t * a->roff_n));
}

/* x, y: (R, N, D) contiguous */
static bool rope_forward(const rope_args *a, const void *x, void *y) {
    const int64_t N = a->N, D = a->D, h = D / 2;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (a->R * N * D > PN_PAR_MIN)
    for (int64_t r = 0; r < a->R; r++) {
        double *buf = malloc(sizeof(double) * (size_t)(N + 2 * D));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *mu = buf, *row = buf + N, *out = row + D;
        positions(a, r, mu);
        for (int64_t t = 0; t < N; t++) {
            ld_row(x, a->dt, (r * N + t) * D, D, row);
            for (int64_t i = 0; i < h; i++) {
                const double ang = mu[t] * a->theta[i], c = cos(ang), s = sin(ang);
                rope_rotate(row[2 * i], row[2 * i + 1], c, s, &out[2 * i], &out[2 * i + 1]);
            }
            st_row(y, a->dt, (r * N + t) * D, D, out);
        }
        free(buf);
    }
    return !oom;
}

/* g: (R, N, D). gx (R, N, D) or NULL; gtheta_r (R, D/2) partial sums or NULL; gmu (R, N) ← g rate
 * (the running-sum backward already applied) or NULL */
static bool rope_backward(const rope_args *a, const void *x, const void *g, void *gx, double *gtheta_r, double *grate) {
    const int64_t N = a->N, D = a->D, h = D / 2;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (a->R * N * D > PN_PAR_MIN)
    for (int64_t r = 0; r < a->R; r++) {
        double *buf = malloc(sizeof(double) * (size_t)(2 * N + 3 * D));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *mu = buf, *gmu = mu + N, *row = gmu + N, *gr = row + D, *out = gr + D;
        positions(a, r, mu);
        for (int64_t t = 0; t < N; t++) {
            ld_row(g, a->dt, (r * N + t) * D, D, gr);
            if (gtheta_r || grate) ld_row(x, a->dt, (r * N + t) * D, D, row);
            double gm = 0;
            for (int64_t i = 0; i < h; i++) {
                const double ang = mu[t] * a->theta[i], c = cos(ang), s = sin(ang);
                const bool want = gtheta_r || grate;
                const double ga = rope_pair_bw(want ? row[2 * i] : 0, want ? row[2 * i + 1] : 0, gr[2 * i],
                                               gr[2 * i + 1], c, s, want, &out[2 * i], &out[2 * i + 1]);
                if (want) {
                    if (gtheta_r) gtheta_r[r * h + i] += ga * mu[t];
                    gm += ga * a->theta[i];
                }
            }
            gmu[t] = gm;
            if (gx) st_row(gx, a->dt, (r * N + t) * D, D, out);
        }
        if (grate) { /* μ_t = Σ_{s≤t} rate_s  ⇒  g rate_s = Σ_{t≥s} g μ_t */
            double acc = 0;
            for (int64_t t = N - 1; t >= 0; t--) grate[r * N + t] = (acc += gmu[t]);
        }
        free(buf);
    }
    return !oom;
}

/* θ (D/2): theta's values or base^(−2i/D) */
static void thetas(const pn_tensor *theta, double base, int64_t D, double *out) {
    for (int64_t i = 0; i < D / 2; i++)
        out[i] = theta ? pn_ld(pn_ptr(theta), theta->dt, i * theta->strides[0]) : pow(base, -2.0 * (double)i / (double)D);
}

static void fill_args(rope_args *a, const pn_tensor *x, const pn_tensor *rate, const double *th) {
    const int nd = x->nd;
    a->N = x->sizes[nd - 2], a->D = x->sizes[nd - 1], a->dt = x->dt, a->theta = th, a->rate = rate;
    a->nlead = nd - 2;
    a->R = 1;
    for (int d = 0; d < nd - 2; d++) a->R *= (a->lead[d] = x->sizes[d]);
    if (rate) {
        int64_t st[PN_MAX_DIMS];
        pn_broadcast_strides(rate, nd - 1, x->sizes, st);
        memcpy(a->rst, st, sizeof(int64_t) * (size_t)(nd - 2));
        a->roff_n = st[nd - 2];
    }
}

/* CPU kernels: x, out, g, gx (…, N, D) contiguous; theta (D/2) any stride or NULL (then
 * base^(−2i/D)); rate broadcast to (…, N) or NULL; the backward writes each of gx, gth (D/2,
 * contiguous), grate ((…, N) contiguous, x's leading shape) not NULL */
pn_status pn_cpu_rope_fwd(const pn_tensor *x, double base, const pn_tensor *theta, const pn_tensor *rate,
                          pn_tensor *out) {
    const int64_t D = x->sizes[x->nd - 1];
    double *th = malloc(sizeof(double) * (size_t)(D / 2 + 1));
    if (!th) return pn_error(PN_ERR_OOM, OP ": out of memory");
    thetas(theta, base, D, th);
    rope_args a;
    fill_args(&a, x, rate, th);
    bool ok = rope_forward(&a, pn_ptr(x), pn_ptr(out));
    free(th);
    if (!ok) return pn_error(PN_ERR_OOM, OP ": out of memory for x %s", pn_shape_str(x));
    return PN_OK;
}

pn_status pn_cpu_rope_bwd(const pn_tensor *x, double base, const pn_tensor *theta, const pn_tensor *rate,
                          const pn_tensor *g, pn_tensor *gx, pn_tensor *gth, pn_tensor *grate_full) {
    const int64_t D = x->sizes[x->nd - 1];
    rope_args a;
    double *th = malloc(sizeof(double) * (size_t)(D / 2 + 1)), *gth_r = NULL, *grate = NULL;
    pn_status st = PN_OK;
    if (!th) goto oom;
    thetas(theta, base, D, th);
    fill_args(&a, x, rate, th);
    if (gth && !(gth_r = calloc((size_t)(a.R * (D / 2) + 1), sizeof(double)))) goto oom;
    if (grate_full && !(grate = malloc(sizeof(double) * (size_t)(a.R * a.N + 1)))) goto oom;
    if (!rope_backward(&a, pn_ptr(x), pn_ptr(g), gx ? pn_ptr(gx) : NULL, gth_r, grate)) goto oom;
    if (gth_r) { /* fixed-order sum over sequences: deterministic */
        for (int64_t i = 0; i < D / 2; i++) {
            double acc = 0;
            for (int64_t r = 0; r < a.R; r++) acc += gth_r[r * (D / 2) + i];
            pn_st(pn_ptr(gth), gth->dt, i, acc);
        }
    }
    if (grate) st_row(pn_ptr(grate_full), grate_full->dt, 0, a.R * a.N, grate);
    goto done;
oom:
    st = pn_error(PN_ERR_OOM, OP ": backward out of memory for x %s", pn_shape_str(x));
done:
    free(th), free(gth_r), free(grate);
    return st;
}

/* saved: x (contiguous), theta and rate when given (slots in iv[0], iv[1], −1 when absent);
 * sc[0] = base */
static pn_status rope_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0];
    pn_tensor *theta = n->iv[0] >= 0 ? n->saved[n->iv[0]] : NULL, *rate = n->iv[1] >= 0 ? n->saved[n->iv[1]] : NULL;
    const int nd = x->nd;
    pn_tensor *gc = pn_contig(g), *gx = NULL, *gth = NULL, *grfull = NULL;
    pn_status st = PN_OK;
    if (!gc) goto oom;
    if (pn_ag_input_needs(n, 0) && !(gx = pn_empty_like(x))) goto oom;
    if (theta && pn_ag_input_needs(n, 1) && !(gth = pn_empty(1, theta->sizes, theta->dt, theta->dev))) goto oom;
    if (rate && pn_ag_input_needs(n, 2) && !(grfull = pn_empty(nd - 1, x->sizes, rate->dt, rate->dev))) goto oom;
    if ((st = PN_KCALL_ON(OP, x, rope_bwd, x, n->sc[0], theta, rate, gc, gx, gth, grfull)) != PN_OK) goto cleanup;
    if (grfull && !(gin[2] = pn_grad_to_input(n, 2, grfull))) { /* summed down to rate's shape */
        st = PN_ERR_SHAPE;
        goto cleanup;
    }
    gin[0] = gx, gin[1] = gth;
    gx = gth = NULL;
    goto cleanup;
oom:
    st = pn_error(PN_ERR_OOM, OP ": backward out of memory for x %s", pn_shape_str(x));
cleanup:
    pn_release(gc), pn_release(gx), pn_release(gth), pn_release(grfull);
    return st;
}

pn_tensor *pn_rope(pn_tensor *x, double base, pn_tensor *theta, pn_tensor *rate) {
    if (!x) return pn_error_null(PN_ERR_ARG, OP ": x is nil");
    int dev;
    const pn_kernels *kt;
    if (pn_kernels_for(OP, 3, (const pn_tensor *const[]){x, theta, rate}, (const char *const[]){"x", "theta", "rate"},
                       &dev, &kt) ||
        pn_check_float(OP, "x", x))
        return NULL;
    const int nd = x->nd;
    if (nd < 2) return pn_error_null(PN_ERR_SHAPE, OP ": x %s must be (…, N, D) with at least 2 dims", pn_shape_str(x));
    const int64_t D = x->sizes[nd - 1];
    if (D % 2 || D == 0)
        return pn_error_null(PN_ERR_SHAPE, OP ": the last dim D = %lld of x %s must be even and > 0 (pairs of features)",
                             (long long)D, pn_shape_str(x));
    if (theta) {
        if (theta->dt != x->dt)
            return pn_error_null(PN_ERR_DTYPE, OP ": theta %s %s must have the dtype of x (%s)", pn_dtype_name(theta->dt),
                                 pn_shape_str(theta), pn_dtype_name(x->dt));
        if (theta->nd != 1 || theta->sizes[0] != D / 2)
            return pn_error_null(PN_ERR_SHAPE, OP ": theta %s must have shape [%lld] (D/2) for x %s", pn_shape_str(theta),
                                 (long long)(D / 2), pn_shape_str(x));
    } else if (!(base > 0) || !isfinite(base)) {
        return pn_error_null(PN_ERR_ARG, OP ": base %g must be a positive number", base);
    }
    if (rate) {
        if (rate->dt != x->dt)
            return pn_error_null(PN_ERR_DTYPE, OP ": rate %s %s must have the dtype of x (%s)", pn_dtype_name(rate->dt),
                                 pn_shape_str(rate), pn_dtype_name(x->dt));
        bool ok = rate->nd <= nd - 1;
        for (int d = 0; ok && d < rate->nd; d++) {
            int64_t want = x->sizes[nd - 1 - rate->nd + d];
            ok = rate->sizes[d] == want || rate->sizes[d] == 1;
        }
        if (!ok)
            return pn_error_null(PN_ERR_SHAPE, OP ": rate %s does not broadcast to %s (x %s without its last dim)",
                                 pn_shape_str(rate), pn_dims_str(nd - 1, x->sizes), pn_shape_str(x));
    }

    pn_tensor *xc = pn_contig(x);
    pn_tensor *out = xc ? pn_empty_like(x) : NULL;
    if (!out || PN_KCALL(OP, kt, rope_fwd, xc, base, theta, rate, out)) goto fail;
    pn_tensor *ins[3] = {x, theta, rate};
    if (pn_ag_needed(3, ins)) {
        pn_node *n = pn_ag_record(out, OP, rope_bw, 3, ins);
        if (!n) goto fail;
        int slot = 0;
        if (pn_ag_save(n, xc)) goto fail;
        n->iv[0] = n->iv[1] = -1;
        if (theta && pn_ag_save(n, theta)) goto fail;
        if (theta) n->iv[0] = ++slot;
        if (rate && pn_ag_save(n, rate)) goto fail;
        if (rate) n->iv[1] = ++slot;
        n->sc[0] = base;
    }
    pn_release(xc);
    return out;
fail:
    pn_release(out);
    pn_release(xc);
    return NULL;
}
