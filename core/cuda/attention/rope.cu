/* rope.cu — the CUDA twin of attention/rope.c (rotary embedding with an optional learned rate).
 *
 * x (R, N, D) contiguous: R sequences (x's leading dims) of N rows. θ (D/2) and the positions
 * μ (R, N) go to f64 scratch first (θ given or base^(−2i/D); μ_t = t, or the running sum of the
 * rate along N, one thread per sequence in the CPU's order). Then:
 *   forward     one thread per pair (r, t, i): rope_rotate (linear_math.h, the CPU's)
 *   backward    one thread per row (r, t): g x by rope_pair_bw, g μ_t = Σ_i ∂a_ti θ_i in order;
 *               one thread per i: g θ_i = Σ_r (Σ_t ∂a_ti μ_t) (the CPU's order);
 *               one thread per sequence: g rate = the reverse running sum of g μ.
 * Angles and sums in f64 for both dtypes; no atomics, so deterministic. */
#include "linear.cuh"

namespace {

struct rope_geo {
    int64_t R, N, D;
    const double *th; /* (D/2) */
    const double *mu; /* (R, N) */
};

// th (D/2) ← θ (any stride ts) or base^(−2i/D)
__global__ void rope_thetas(int64_t h, int64_t D, const void *theta, int dt, int64_t ts, double base, double *th) {
    PN_CU_LOOP(i, h) th[i] = theta ? pn_ld(theta, dt, i * ts) : pow(base, -2.0 * (double)i / (double)D);
}

/* the rate's strides over x's leading dims (lead) and along N */
struct rate_view {
    const void *p; /* NULL: μ_t = t */
    int dt, nlead;
    int64_t lead[PN_MAX_DIMS], rst[PN_MAX_DIMS], rn;
};

// mu (R, N) ← positions
__global__ void rope_positions(int64_t R, int64_t N, rate_view rv, double *mu) {
    PN_CU_LOOP(r, R) {
        if (!rv.p) {
            for (int64_t t = 0; t < N; t++) mu[r * N + t] = (double)t;
            continue;
        }
        int64_t off = 0, rem = r;
        for (int d = rv.nlead - 1; d >= 0; d--) {
            off += (rem % rv.lead[d]) * rv.rst[d];
            rem /= rv.lead[d];
        }
        double acc = 0;
        for (int64_t t = 0; t < N; t++) mu[r * N + t] = (acc += pn_ld(rv.p, rv.dt, off + t * rv.rn));
    }
}

// x, out (R, N, D)
template <class T>
__global__ void rope_fwd_k(rope_geo a, const T *x, T *out) {
    const int64_t h = a.D / 2;
    PN_CU_LOOP(it, a.R * a.N * h) {
        const int64_t row = it / h, i = it % h;
        const double ang = a.mu[row] * a.th[i], c = cos(ang), s = sin(ang);
        double y0, y1;
        rope_rotate(x[row * a.D + 2 * i], x[row * a.D + 2 * i + 1], c, s, &y0, &y1);
        out[row * a.D + 2 * i] = (T)y0;
        out[row * a.D + 2 * i + 1] = (T)y1;
    }
}

// g, gx (R, N, D); gmu (R, N) or NULL
template <class T>
__global__ void rope_bwd_rows(rope_geo a, const T *x, const T *g, T *gx, double *gmu) {
    const int64_t h = a.D / 2, D = a.D;
    PN_CU_LOOP(row, a.R * a.N) {
        double gm = 0;
        for (int64_t i = 0; i < h; i++) {
            const double ang = a.mu[row] * a.th[i], c = cos(ang), s = sin(ang);
            const int want = gmu != NULL;
            double gx0, gx1;
            const double ga = rope_pair_bw(want ? (double)x[row * D + 2 * i] : 0, want ? (double)x[row * D + 2 * i + 1] : 0,
                                           g[row * D + 2 * i], g[row * D + 2 * i + 1], c, s, want, &gx0, &gx1);
            gm += ga * a.th[i];
            if (gx) gx[row * D + 2 * i] = (T)gx0, gx[row * D + 2 * i + 1] = (T)gx1;
        }
        if (gmu) gmu[row] = gm;
    }
}

// gth (D/2) ← Σ_r Σ_t ∂a_ti μ_t
template <class T>
__global__ void rope_bwd_theta(rope_geo a, const T *x, const T *g, T *gth) {
    const int64_t D = a.D;
    PN_CU_LOOP(i, a.D / 2) {
        double acc = 0;
        for (int64_t r = 0; r < a.R; r++) {
            double part = 0;
            for (int64_t t = 0; t < a.N; t++) {
                const int64_t row = r * a.N + t;
                const double ang = a.mu[row] * a.th[i], c = cos(ang), s = sin(ang);
                double gx0, gx1;
                const double ga = rope_pair_bw(x[row * D + 2 * i], x[row * D + 2 * i + 1], g[row * D + 2 * i],
                                               g[row * D + 2 * i + 1], c, s, 1, &gx0, &gx1);
                part += ga * a.mu[row];
            }
            acc += part;
        }
        gth[i] = (T)acc;
    }
}

// grate (R, N) ← Σ_{t ≥ s} gmu_t
template <class T>
__global__ void rope_bwd_rate(int64_t R, int64_t N, const double *gmu, T *grate) {
    PN_CU_LOOP(r, R) {
        double acc = 0;
        for (int64_t t = N - 1; t >= 0; t--) grate[r * N + t] = (T)(acc += gmu[r * N + t]);
    }
}

pn_status rope_setup(const char *op, const pn_tensor *x, double base, const pn_tensor *theta, const pn_tensor *rate,
                     lin_scratch &s, rope_geo *a) {
    const int nd = x->nd;
    a->N = x->sizes[nd - 2], a->D = x->sizes[nd - 1];
    a->R = 1;
    rate_view rv = {};
    rv.nlead = nd - 2;
    for (int d = 0; d < nd - 2; d++) a->R *= (rv.lead[d] = x->sizes[d]);
    if (rate) {
        int64_t st[PN_MAX_DIMS];
        pn_broadcast_strides(rate, nd - 1, x->sizes, st);
        for (int d = 0; d < nd - 2; d++) rv.rst[d] = st[d];
        rv.rn = st[nd - 2];
        rv.p = pn_ptr(rate), rv.dt = rate->dt;
    }
    double *th = (double *)lin_alloc(s, a->D / 2, PN_F64), *mu = (double *)lin_alloc(s, a->R * a->N, PN_F64);
    if (!th || !mu) return pn_error(PN_ERR_OOM, "%s: out of device memory for x %s", op, pn_shape_str(x));
    a->th = th, a->mu = mu;
    PN_CU_TRY(op, PN_LAUNCH(rope_thetas, pn_cu_blocks(a->D / 2), PN_CU_THREADS, 0, pn_cu_stream(), a->D / 2, a->D,
                            theta ? (const void *)pn_ptr(theta) : (const void *)NULL, theta ? theta->dt : 0,
                            theta ? theta->strides[0] : 0, base, th));
    PN_CU_TRY(op, PN_LAUNCH(rope_positions, pn_cu_blocks(a->R), PN_CU_THREADS, 0, pn_cu_stream(), a->R, a->N, rv, mu));
    return PN_OK;
}

} // namespace

/* x, out (…, N, D) contiguous; theta (D/2) any stride or NULL; rate broadcast to (…, N) or NULL */
pn_status pn_cuda_rope_fwd(const pn_tensor *x, double base, const pn_tensor *theta, const pn_tensor *rate,
                           pn_tensor *out) {
    const char *op = "rope";
    if (pn_numel(x) == 0) return PN_OK;
    lin_scratch s = {};
    rope_geo a;
    pn_status st = rope_setup(op, x, base, theta, rate, s, &a);
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto kn = rope_fwd_k<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(a.R * a.N * (a.D / 2)), PN_CU_THREADS, 0, pn_cu_stream(),
                                           a, (const T *)pn_ptr(x), (T *)pn_ptr(out)));
        });
    lin_free(s);
    return st;
}

/* the backward writes each of gx, gth (D/2 contiguous), grate ((…, N) contiguous) not NULL */
pn_status pn_cuda_rope_bwd(const pn_tensor *x, double base, const pn_tensor *theta, const pn_tensor *rate,
                           const pn_tensor *g, pn_tensor *gx, pn_tensor *gth, pn_tensor *grate) {
    const char *op = "rope";
    lin_scratch s = {};
    rope_geo a;
    pn_status st = rope_setup(op, x, base, theta, rate, s, &a);
    double *gmu = NULL;
    if (!st && grate && !(gmu = (double *)lin_alloc(s, a.R * a.N, PN_F64)))
        st = pn_error(PN_ERR_OOM, "%s: backward out of device memory for x %s", op, pn_shape_str(x));
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            const T *xp = (const T *)pn_ptr(x), *gp = (const T *)pn_ptr(g);
            auto kr = rope_bwd_rows<T>;
            if (gx || gmu)
                st = pn_cu_check(op, PN_LAUNCH(kr, pn_cu_blocks(a.R * a.N), PN_CU_THREADS, 0, pn_cu_stream(), a, xp,
                                               gp, gx ? (T *)pn_ptr(gx) : (T *)NULL, gmu));
            auto kt = rope_bwd_theta<T>;
            if (!st && gth)
                st = pn_cu_check(op, PN_LAUNCH(kt, pn_cu_blocks(a.D / 2), PN_CU_THREADS, 0, pn_cu_stream(), a, xp, gp,
                                               (T *)pn_ptr(gth)));
            auto kg = rope_bwd_rate<T>;
            if (!st && gmu)
                st = pn_cu_check(op, PN_LAUNCH(kg, pn_cu_blocks(a.R), PN_CU_THREADS, 0, pn_cu_stream(), a.R, a.N,
                                               (const double *)gmu, (T *)pn_ptr(grate)));
        });
    lin_free(s);
    return st;
}
