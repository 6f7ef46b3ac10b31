/* hyperbolic.c — random hyperbolic graphs (Krioukov et al. 2010; the generator of von Looz,
 * Meyerhenke and Prutkin 2015, which NetworKit's HyperbolicGenerator implements): n points in
 * a hyperbolic disk of radius R, angles uniform, radii of density α·sinh(αr)/(cosh αR − 1);
 * threshold model (T = 0): an edge when the hyperbolic distance is at most `threshold` (R by
 * default); Fermi–Dirac model (0 < T < 1): an edge with probability 1/(1 + e^{(d − R)/(2T)}).
 * The degree distribution is a power law with exponent 2α + 1.
 *
 * Host algorithm (CPU tensors out), like every graph algorithm in core/graph/.
 *
 * Threshold model — angular bands: the disk is cut into rings ("bands") of radial height
 * PN_BAND_H; inside a band the points are sorted by angle. A point u looks for its partners v
 * with (r_v, v) > (r_u, u) (each pair once) in its own band and every band outside it: in a
 * band starting at radius b the partners lie within the angle θ(r_u, b) of u (the widest
 * angle at which a point of that band can still be within the threshold), found by binary
 * search, and each candidate is tested exactly. Never all n² pairs.
 *   cosh d = cosh(r_u − r_v) + 2 sin²(Δφ/2)·sinh r_u·sinh r_v
 * (the form that keeps its precision at large radii; sin²(Δφ/2) from Δφ itself, by a series
 * below 0.1 rad, so neighbours 1e-6 rad apart are decided right).
 * Fermi–Dirac model: every pair is tested (O(n²), parallel), so n is capped at
 * PN_FD_MAX_N; said in the error and in README.
 *
 * Determinism: point i's coordinates come from a counter-based hash of (seed, i); the points
 * are ordered by (band, angle, id), and the edges of the points at positions [c·1024,
 * (c+1)·1024) of that order are found into chunk c's own buffer; the chunks are joined in
 * order — the same edges in the same order at any thread count.
 * Output: edges (2E, 2) i64: the E pairs (u, v) found (grouped by u in band-and-angle order;
 * the Fermi–Dirac model: u in increasing order), then the same pairs reversed; no self-loops,
 * no duplicates. */
#include "../backend.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PV(t) ((void *)pn_ptr(t)) /* typed access to a tensor's data */

#define PN_BAND_H 1.0      /* radial height of a band */
#define PN_CHUNK 1024      /* points per edge buffer (determinism: joined in order) */
#define PN_FD_MAX_N 20000  /* the Fermi–Dirac model tests every pair */

/* ---- counter-based random numbers: uniform in [0, 1) from (seed, i, stream) ---------------- */
static inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double unif(uint64_t seed, uint64_t i, uint64_t stream) {
    return (double)(mix64(mix64(seed ^ 0x5851f42d4c957f2dull) ^ (i * 4 + stream)) >> 11) * 0x1.0p-53;
}

/* 2 sin²(x/2) = 1 − cos x for x in [0, π], accurate for small x */
static inline double one_minus_cos(double x) {
    if (x < 0.1) {
        double h = 0.5 * x, h2 = h * h; /* sin h = h(1 − h²/6 + h⁴/120 − h⁶/5040) */
        double s = h * (1 - h2 / 6 * (1 - h2 / 20 * (1 - h2 / 42)));
        return 2 * s * s;
    }
    return 1 - cos(x);
}

/* angular distance in [0, π] */
static inline double ang_dist(double a, double b) {
    double d = fabs(a - b);
    return d > M_PI ? 2 * M_PI - d : d;
}

/* cosh of the hyperbolic distance of (r1, φ1), (r2, φ2), from e^r and sinh r */
static inline double cosh_dist(double e1, double s1, double e2, double s2, double dphi) {
    double q = e1 / e2;
    return 0.5 * (q + 1 / q) + one_minus_cos(dphi) * s1 * s2;
}

/* ---- the disk radius for a target average degree --------------------------------------------- */
/* Expected average degree (n − 1)·P(edge), P by the midpoint rule over the radii's quantiles
 * (K × K; for T > 0 also over the angle, K points): the exact model, not its asymptotics, so
 * the mean degree of generated graphs matches the target at small n too. The hubs near the
 * centre make the integrand singular at quantile 0 (the degree of quantile u grows like
 * u^(−1/(2α))), so the quantiles are u = w^p with p = ⌈2/(1 − 1/(2α))⌉ (capped at 24), which
 * makes it smooth in w; a plain midpoint rule in u came out 3.5 % low at α = 1. */
static double radius_at(double u, double alpha, double R) { /* the quantile u of the radius */
    return acosh(1 + u * (cosh(alpha * R) - 1)) / alpha;
}
static double expected_degree(int64_t n, double alpha, double R, double thr, double T) {
    const int K = T > 0 ? 40 : 160;
    double *r = malloc(sizeof(double) * (size_t)K * 4);
    if (!r) return NAN;
    double *e = r + K, *s = e + K, *wt = s + K; /* radii, e^r, sinh r, the weights du/dw */
    double pw = ceil(2 / (1 - 1 / (2 * alpha)));
    pw = pw < 1 ? 1 : (pw > 24 ? 24 : pw);
    for (int i = 0; i < K; i++) {
        double w = (i + 0.5) / K;
        r[i] = radius_at(pow(w, pw), alpha, R);
        wt[i] = pw * pow(w, pw - 1);
        e[i] = exp(r[i]);
        s[i] = sinh(r[i]);
    }
    const double ct = cosh(thr);
    double *row = calloc((size_t)K, sizeof(double)); /* per-row sums, added in order: the same R at any thread count */
    if (!row) {
        free(r);
        return NAN;
    }
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < K; i++) {
        double P = 0;
        for (int j = 0; j < K; j++) {
            if (T <= 0) { /* the angle within which the pair is an edge, over π */
                double q = e[i] / e[j], ch = 0.5 * (q + 1 / q);
                double x = s[i] * s[j] > 0 ? (ct - ch) / (s[i] * s[j]) : (ct >= ch ? 2 : -1);
                double th = x <= 0 ? 0 : (x >= 2 ? M_PI : 2 * asin(sqrt(0.5 * x)));
                P += wt[i] * wt[j] * th / M_PI;
            } else {
                /* over the angle on a log scale (far-out pairs turn from edge to non-edge at
                 * angles ~ e^{−(r1+r2)/2}): midpoint in ln θ from θ0 to π, plus [0, θ0] */
                const int KA = 160;
                const double t0 = 1e-14, step = log(M_PI / t0) / KA;
                double d0 = acosh(fmax(1.0, cosh_dist(e[i], s[i], e[j], s[j], 0)));
                double acc = t0 / (1 + exp((d0 - thr) / (2 * T)));
                for (int a = 0; a < KA; a++) {
                    double th = t0 * exp((a + 0.5) * step);
                    double d = acosh(fmax(1.0, cosh_dist(e[i], s[i], e[j], s[j], th)));
                    acc += th * step / (1 + exp((d - thr) / (2 * T)));
                }
                P += wt[i] * wt[j] * acc / M_PI;
            }
        }
        row[i] = P;
    }
    double P = 0;
    for (int i = 0; i < K; i++) P += row[i];
    free(row);
    free(r);
    return (double)(n - 1) * P / ((double)K * K);
}

/* R with expected average degree k (the threshold equal to R): bisection, the degree falls
 * as R grows. */
static pn_status solve_radius(const char *op, int64_t n, double k, double alpha, double T, double *R) {
    /* the bracket: around the asymptotic radius 2 ln(2nξ²/(πk)), ξ = α/(α − ½) (Gugelmann et
     * al.), widened until it holds the root; then bisection to 1e-9 */
    const double xi = alpha / (alpha - 0.5);
    double guess = 2 * log(2 * (double)n * xi * xi / (M_PI * k));
    double lo = fmax(1e-3, guess - 4), hi = fmax(guess + 4, lo + 8);
    for (int w = 0; w < 8 && expected_degree(n, alpha, lo, lo, T) < k; w++) lo = fmax(1e-3, lo - 8);
    if (expected_degree(n, alpha, lo, lo, T) < k)
        return pn_error(PN_ERR_ARG, "%s: average degree %g is out of reach for n = %lld (a disk of any radius gives "
                        "less); use a smaller degree", op, k, (long long)n);
    for (int w = 0; w < 8 && expected_degree(n, alpha, hi, hi, T) > k; w++) hi += 8;
    while (hi - lo > 1e-9) {
        double mid = 0.5 * (lo + hi);
        if (expected_degree(n, alpha, mid, mid, T) > k) lo = mid;
        else hi = mid;
    }
    *R = 0.5 * (lo + hi);
    return PN_OK;
}

/* ---- points and bands -------------------------------------------------------------------------- */
typedef struct {
    double phi, r, e, ie, s; /* angle, radius, e^r, e^-r, sinh r */
    int64_t id;
} pt;

static inline int pt_before(const pt *x, const pt *y) { return x->phi < y->phi || (x->phi == y->phi && x->id < y->id); }

/* Sort one band's m points by (angle, id) in linear expected time: the angles are uniform,
 * so a counting pass into m angular buckets leaves about one point per bucket, and an
 * insertion sort finishes the few inversions inside buckets. (qsort of the 48-byte records
 * was 14 % of the generator at n = 10⁶, and serial in the outermost band, which holds most
 * points.) tmp: m records; cnt: m + 1 counters. */
static void sort_band(pt *a, int64_t m, pt *tmp, int64_t *cnt) {
    if (m < 2) return;
    const double scale = (double)m / (2 * M_PI);
    memset(cnt, 0, sizeof(int64_t) * (size_t)(m + 1));
    for (int64_t i = 0; i < m; i++) {
        int64_t b = (int64_t)(a[i].phi * scale);
        cnt[(b < m ? b : m - 1) + 1]++;
    }
    for (int64_t b = 0; b < m; b++) cnt[b + 1] += cnt[b];
    for (int64_t i = 0; i < m; i++) {
        int64_t b = (int64_t)(a[i].phi * scale);
        tmp[cnt[b < m ? b : m - 1]++] = a[i];
    }
    for (int64_t i = 0; i < m; i++) {
        pt x = tmp[i];
        int64_t j = i;
        while (j > 0 && pt_before(&x, &a[j - 1])) a[j] = a[j - 1], j--;
        a[j] = x;
    }
}

typedef struct {
    int64_t *e; /* pairs (u, v) */
    int64_t n, cap;
} ebuf;

static int push(ebuf *b, int64_t u, int64_t v) {
    if (b->n == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 256;
        int64_t *p = realloc(b->e, sizeof(int64_t) * 2 * (size_t)cap);
        if (!p) return -1;
        b->e = p, b->cap = cap;
    }
    b->e[2 * b->n] = u, b->e[2 * b->n + 1] = v;
    b->n++;
    return 0;
}

/* (r_v, v) > (r_u, u): each pair is found by exactly one of its points */
static inline int later(const pt *u, const pt *v) { return v->r > u->r || (v->r == u->r && v->id > u->id); }

/* first index in band [0, m) with phi >= x */
static int64_t lower(const pt *band, int64_t m, double x) {
    int64_t lo = 0, hi = m;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (band[mid].phi < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* threshold model: the pairs of point u (its own record p) into b */
static int threshold_pairs(const pt *p, const pt *pts, const int64_t *bstart, int nb, int ub, double ct, ebuf *b) {
    for (int k = ub; k < nb; k++) {
        const pt *band = pts + bstart[k];
        const int64_t m = bstart[k + 1] - bstart[k];
        if (m == 0) continue;
        /* the widest angle at which a partner in this band can be within the threshold. The
         * partners have r_v >= b = max(band's lower edge, r_u), and for r_v >= r_u
         *   2 sin²(θ/2) = (cosh thr − cosh(r_v − r_u))/(sinh r_u sinh r_v)
         * falls as r_v grows, so its value at b bounds the band (widened by a hair against
         * rounding; every candidate is then tested exactly) */
        const double rb = fmax(k * PN_BAND_H, p->r);
        double th;
        if (rb <= 0 || p->s <= 0) {
            th = M_PI;
        } else {
            double q = exp(rb) / p->e, ch = 0.5 * (q + 1 / q);
            double x = (ct - ch) / (p->s * sinh(rb));
            if (x < 0) break; /* no point of this band, nor of any outer one, is close enough */
            th = x >= 2 ? M_PI : 2 * asin(sqrt(0.5 * x)) * (1 + 1e-9) + 1e-12;
        }
        /* candidates with angle in [φ − θ, φ + θ], wrapping around 2π */
        double lo = p->phi - th, hi = p->phi + th;
        int64_t ranges[2][2];
        int nr = 0;
        if (th >= M_PI) {
            ranges[nr][0] = 0, ranges[nr][1] = m, nr++;
        } else {
            if (lo < 0) {
                ranges[nr][0] = lower(band, m, lo + 2 * M_PI), ranges[nr][1] = m, nr++;
                lo = 0;
            }
            if (hi > 2 * M_PI) {
                ranges[nr][0] = 0, ranges[nr][1] = lower(band, m, hi - 2 * M_PI), nr++;
                hi = 2 * M_PI;
            }
            ranges[nr][0] = lower(band, m, lo), ranges[nr][1] = lower(band, m, hi), nr++;
            /* hi itself: lower() stops before equal angles; take them too */
            while (ranges[nr - 1][1] < m && band[ranges[nr - 1][1]].phi <= hi) ranges[nr - 1][1]++;
        }
        for (int g = 0; g < nr; g++)
            for (int64_t i = ranges[g][0]; i < ranges[g][1]; i++) {
                const pt *v = band + i;
                if (!later(p, v)) continue;
                /* cosh d = cosh(r_u − r_v) + (1 − cos Δφ) sinh r_u sinh r_v (cosh_dist, without its division) */
                const double cd = 0.5 * (p->e * v->ie + p->ie * v->e) + one_minus_cos(ang_dist(p->phi, v->phi)) * p->s * v->s;
                if (cd <= ct && push(b, p->id, v->id)) return -1;
            }
    }
    return 0;
}

pn_status pn_graph_hyperbolic(const pn_hypgen_opts *o, pn_tensor **edges, pn_tensor **r_out, pn_tensor **phi_out,
                              double *R_out) {
    const char *op = "graph.hyperbolic";
    if (!o || !edges || !r_out || !phi_out || !R_out) return pn_error(PN_ERR_ARG, "%s: NULL argument", op);
    *edges = *r_out = *phi_out = NULL;
    const int64_t n = o->n;
    const double alpha = o->alpha, T = o->T;
    if (n < 2) return pn_error(PN_ERR_ARG, "%s: n = %lld must be >= 2", op, (long long)n);
    if (!(alpha > 0.5) || !isfinite(alpha))
        return pn_error(PN_ERR_ARG, "%s: alpha = %g must be > 0.5 and finite (exponent = 2·alpha + 1 = %g must be > 2)",
                        op, alpha, 2 * alpha + 1);
    if (!(T >= 0 && T < 1)) return pn_error(PN_ERR_ARG, "%s: T = %g must be in [0, 1) (0: threshold model)", op, T);
    if (T > 0 && n > PN_FD_MAX_N)
        return pn_error(PN_ERR_ARG, "%s: the Fermi-Dirac model (T = %g > 0) tests every pair here and takes n <= %d, "
                        "got n = %lld; use T = 0 for larger graphs", op, T, PN_FD_MAX_N, (long long)n);
    double R = o->R;
    if (isnan(R)) {
        if (!(o->degree > 0) || !(o->degree < (double)(n - 1)))
            return pn_error(PN_ERR_ARG, "%s: degree = %g must be in (0, n - 1) = (0, %lld)", op, o->degree,
                            (long long)(n - 1));
        PN_TRY(solve_radius(op, n, o->degree, alpha, T, &R));
    } else if (!(R > 0) || !isfinite(R)) {
        return pn_error(PN_ERR_ARG, "%s: R = %g must be > 0 and finite", op, R);
    }
    const double thr = isnan(o->threshold) ? R : o->threshold;
    if (!(thr >= 0) || !isfinite(thr)) return pn_error(PN_ERR_ARG, "%s: threshold = %g must be >= 0 and finite", op, thr);
    if (alpha * R > 700)
        return pn_error(PN_ERR_ARG, "%s: alpha·R = %g overflows cosh (R = %g); use a smaller R", op, alpha * R, R);

    pn_status st = PN_OK;
    pn_tensor *rt = pn_empty(1, &n, PN_F64, PN_CPU), *pt_ = rt ? pn_empty(1, &n, PN_F64, PN_CPU) : NULL;
    pt *pts = malloc(sizeof(pt) * (size_t)n);
    const int nb = (int)ceil(R / PN_BAND_H) + 1;
    int64_t *bstart = calloc((size_t)nb + 2, sizeof(int64_t));
    const int64_t nchunks = (n + PN_CHUNK - 1) / PN_CHUNK;
    ebuf *bufs = calloc((size_t)nchunks, sizeof(ebuf));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)n); /* point id → its index in pts */
    pt *tmp = malloc(sizeof(pt) * (size_t)n);            /* the band sort's scratch */
    int64_t *cnt = malloc(sizeof(int64_t) * (size_t)(n + nb + 1));
    if (!rt || !pt_ || !pts || !bstart || !bufs || !pos || !tmp || !cnt) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory for n = %lld", op, (long long)n);
        goto done;
    }
    double *rv = PV(rt), *fv = PV(pt_);
    const double cA = cosh(alpha * R) - 1;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        double u = unif(o->seed, (uint64_t)i, 0);
        double r = acosh(1 + u * cA) / alpha;
        r = r < R ? r : R;
        rv[i] = r;
        fv[i] = 2 * M_PI * unif(o->seed, (uint64_t)i, 1);
    }
    /* bands: counting sort by band, then by angle inside each band */
    for (int64_t i = 0; i < n; i++) {
        int k = (int)(rv[i] / PN_BAND_H);
        bstart[(k < nb ? k : nb - 1) + 1]++;
    }
    for (int k = 0; k < nb; k++) bstart[k + 1] += bstart[k];
    {
        int64_t *fill = malloc(sizeof(int64_t) * (size_t)(nb + 1));
        if (!fill) {
            st = pn_error(PN_ERR_OOM, "%s: out of memory", op);
            goto done;
        }
        memcpy(fill, bstart, sizeof(int64_t) * (size_t)(nb + 1));
        for (int64_t i = 0; i < n; i++) {
            int k = (int)(rv[i] / PN_BAND_H);
            k = k < nb ? k : nb - 1;
            pt *p = &pts[fill[k]++];
            p->phi = fv[i], p->r = rv[i], p->id = i;
        }
        free(fill);
    }
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) pts[i].e = exp(pts[i].r), pts[i].ie = exp(-pts[i].r), pts[i].s = sinh(pts[i].r);
    /* outermost (largest) bands first, so one thread takes the big one while others share the rest */
    #pragma omp parallel for schedule(dynamic, 1)
    for (int k = nb - 1; k >= 0; k--)
        sort_band(pts + bstart[k], bstart[k + 1] - bstart[k], tmp + bstart[k], cnt + bstart[k] + k);
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) pos[pts[i].id] = i;

    int oom = 0;
    if (T <= 0) {
        const double ct = cosh(thr);
        /* points in band-and-angle order: consecutive points search neighbouring stretches of
         * the same bands, which stay in cache (in id order each point's search was a cold miss:
         * 1.7× slower at n = 10⁶) */
        #pragma omp parallel for schedule(dynamic, 1)
        for (int64_t c = 0; c < nchunks; c++) {
            for (int64_t i = c * PN_CHUNK; i < n && i < (c + 1) * PN_CHUNK && !oom; i++) {
                const pt *p = &pts[i];
                int ub = (int)(p->r / PN_BAND_H);
                ub = ub < nb ? ub : nb - 1;
                if (threshold_pairs(p, pts, bstart, nb, ub, ct, &bufs[c])) {
                    #pragma omp atomic write
                    oom = 1;
                }
            }
        }
    } else {
        /* Fermi–Dirac: each pair (u < v) with probability p(d), decided by the hash of the pair */
        #pragma omp parallel for schedule(dynamic, 1)
        for (int64_t c = 0; c < nchunks; c++) {
            for (int64_t u = c * PN_CHUNK; u < n && u < (c + 1) * PN_CHUNK && !oom; u++) {
                const pt *p = &pts[pos[u]];
                for (int64_t v = u + 1; v < n; v++) {
                    const pt *w = &pts[pos[v]];
                    double d = acosh(fmax(1.0, cosh_dist(p->e, p->s, w->e, w->s, ang_dist(p->phi, w->phi))));
                    double pr = 1 / (1 + exp((d - thr) / (2 * T)));
                    if (unif(o->seed ^ 0xfd00fd00fd00fd00ull, (uint64_t)u * (uint64_t)n + (uint64_t)v, 2) < pr &&
                        push(&bufs[c], u, v)) {
                        #pragma omp atomic write
                        oom = 1;
                        break;
                    }
                }
            }
        }
    }
    if (oom) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory for the edges", op);
        goto done;
    }
    int64_t E = 0;
    for (int64_t c = 0; c < nchunks; c++) E += bufs[c].n;
    int64_t eshape[2] = {2 * E, 2};
    if ((st = pn_check_shape(op, 2, eshape, PN_I64))) goto done;
    pn_tensor *et = pn_empty(2, eshape, PN_I64, PN_CPU);
    if (!et) {
        st = PN_ERR_OOM;
        goto done;
    }
    int64_t *ev = PV(et);
    int64_t at = 0;
    for (int64_t c = 0; c < nchunks; c++) {
        memcpy(ev + 2 * at, bufs[c].e, sizeof(int64_t) * 2 * (size_t)bufs[c].n);
        at += bufs[c].n;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < E; i++) ev[2 * (E + i)] = ev[2 * i + 1], ev[2 * (E + i) + 1] = ev[2 * i];
    *edges = et;
    *r_out = rt, *phi_out = pt_;
    rt = pt_ = NULL;
    *R_out = R;
done:
    for (int64_t c = 0; bufs && c < nchunks; c++) free(bufs[c].e);
    free(bufs);
    free(pts);
    free(bstart);
    free(pos);
    free(tmp);
    free(cnt);
    pn_release(rt);
    pn_release(pt_);
    return st;
}

double pn_graph_hyperbolic_degree(int64_t n, double alpha, double R, double threshold, double T) {
    if (n < 2 || !(alpha > 0.5) || !(R > 0) || !(T >= 0 && T < 1)) return NAN;
    return expected_degree(n, alpha, R, isnan(threshold) ? R : threshold, T);
}
