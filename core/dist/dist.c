/* dist.c — pn_dist_*: several processes (ranks) working on one job (penumbra.h, "several
 * processes"). Argument checks, the single-process path and the agreement between ranks live
 * here; the communication itself is an engine's (dist.h: mpi.c for host tensors, nccl.cu for device tensors).
 *
 * A collective must be entered by every rank, so no rank may return early on its own: each
 * checks its arguments, then all exchange a signature (its verdict, dtype, shape, op or root)
 * and every rank gives the same answer — the data moves only when all agree, and otherwise
 * each rank returns an error naming the rank at fault instead of hanging in MPI.
 *
 * A wait in a collective ends with an error when a rank is gone, a stop signal arrived, the
 * timeout passed or MPI failed (mpi.c); then the ranks cannot exchange any more, and the buffers
 * of the call that gave up are kept (never freed: MPI may still write into them). */
#include "dist/dist.h"
#include "backend.h" /* pn_device_name */

#include <errno.h>
#include <stdio.h>

enum { ST_NONE = 0, ST_SINGLE = 1, ST_MPI = 2 };
static int state = ST_NONE;
static int g_rank = 0, g_size = 1;
static pn_status init_failed;  /* a failed MPI start is not retried: the same error again */
static char init_msg[1024];

int pn_dist_built(void) { return pn_mpi_built(); }
int pn_dist_nccl_built(void) { return pn_nccl_built(); }

/* ---- the timeout of a wait in a collective ------------------------------------------- */
#define TIMEOUT_DEFAULT_S 300.0
static double g_timeout = TIMEOUT_DEFAULT_S;
static int timeout_chosen; /* pn_dist_set_timeout was called: the environment no longer applies */

static int bad_seconds(double s) { return !(s >= 0) || isinf(s); }

/* PENUMBRA_DIST_TIMEOUT, read at the first pn_dist_init (not cached when wrong: every call says so) */
static pn_status read_timeout_env(void) {
    const char *e = getenv("PENUMBRA_DIST_TIMEOUT");
    if (timeout_chosen || !e) return PN_OK;
    char *end = NULL;
    errno = 0;
    double s = strtod(e, &end);
    while (end && (*end == ' ' || *end == '\t')) end++;
    if (end == e || !end || *end || errno || bad_seconds(s))
        return pn_error(PN_ERR_ARG, "dist.init: PENUMBRA_DIST_TIMEOUT='%s' is not a number of seconds >= 0 (how long "
                        "a rank waits in a collective for the others; 0: forever)", e);
    g_timeout = s;
    return PN_OK;
}

pn_status pn_dist_set_timeout(double seconds) {
    if (bad_seconds(seconds))
        return pn_error(PN_ERR_ARG, "dist.set_timeout: seconds must be a finite number >= 0 (0: wait forever), got %g",
                        seconds);
    g_timeout = seconds;
    timeout_chosen = 1;
    return PN_OK;
}

double pn_dist_timeout(void) { return g_timeout; }
int pn_dist_failure(void) { return pn_mpi_failure(); }
int pn_dist_lost_rank(void) { return pn_mpi_lost_rank(); }

/* Open MPI (OMPI_COMM_WORLD_SIZE; PMIX_RANK from its PMIx server) and MPICH-style launchers
 * (PMI_RANK) announce themselves in the environment of the processes they start. */
int pn_dist_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

pn_status pn_dist_init(void) {
    if (state != ST_NONE) return PN_OK;
    if (init_failed) return pn_error(init_failed, "%s", init_msg);
    PN_TRY(read_timeout_env());
    if (!pn_dist_launched()) {
        state = ST_SINGLE;
        g_rank = 0;
        g_size = 1;
        return PN_OK;
    }
    int rank = 0, size = 1;
    pn_status st = pn_mpi_init(&rank, &size);
    if (st) {
        init_failed = st;
        snprintf(init_msg, sizeof init_msg, "%s", pn_last_error());
        return st;
    }
    state = ST_MPI;
    g_rank = rank;
    g_size = size;
    return PN_OK;
}

int pn_dist_active(void) { return state == ST_MPI && g_size > 1; }
int pn_dist_rank(void) { return pn_dist_init() ? -1 : g_rank; }
int pn_dist_size(void) { return pn_dist_init() ? -1 : g_size; }

pn_status pn_dist_barrier(void) {
    PN_TRY(pn_dist_init());
    return g_size > 1 ? pn_mpi_barrier("dist.barrier") : PN_OK;
}

/* ---- the agreement ------------------------------------------------------------------ */
enum { SIG_STATUS, SIG_ARG, SIG_DT, SIG_DEV, SIG_ND, SIG_DIMS, SIG_N = SIG_DIMS + PN_MAX_DIMS };

/* Small all-reduces ride on the agreement: each rank's record has room for INLINE_BYTES of its
 * values after the signature (up to INLINE_MAX_RANKS ranks, so that the all-gather stays small),
 * and when everyone agrees and the values fit, each rank reduces the records itself, in rank order
 * (the same result on every rank) — one collective instead of two, which keeps the latency of the
 * small ones (a header, a metric) at what the blocking calls gave before the waits became
 * non-blocking (mpi.c). The room is the same on every rank (it depends on the size alone), so
 * the all-gather's counts always match. */
#define INLINE_BYTES 128
#define INLINE_MAX_RANKS 16
static size_t record_n(void) { return SIG_N + (g_size <= INLINE_MAX_RANKS ? INLINE_BYTES / sizeof(int64_t) : 0); }

/* local: this rank's verdict on its own arguments (its message set when not PN_OK); arg: the
 * op or root every rank must pass alike (argname NULL: none). Returns PN_OK on every rank, or
 * an error on every rank: a rank that refused its arguments keeps its own message, the others
 * name it. data (bytes long, may be NULL): this rank's values, carried when they fit — then on
 * success *carried is every rank's record (the caller frees it; rank r's values start at
 * element r · record_n() + SIG_N), else NULL. label: the call, as the engine's messages name it. */
static pn_status agree(const char *op, const char *argname, pn_status local, int64_t arg, const pn_tensor *t,
                       const void *data, size_t bytes, int64_t **carried, const char *label) {
    if (carried) *carried = NULL;
    if (g_size == 1) return local;
    size_t rec = record_n();
    int fits = data && bytes <= (rec - SIG_N) * sizeof(int64_t);
    /* this rank's record after everyone's, in one block: kept if the exchange gives up */
    int64_t *all = malloc(((size_t)g_size + 1) * rec * sizeof *all);
    if (!all) return pn_error(PN_ERR_OOM, "%s: out of memory for %d ranks' signatures", op, g_size);
    int64_t *mine = all + (size_t)g_size * rec;
    memset(mine, 0, rec * sizeof *mine);
    mine[SIG_STATUS] = local;
    mine[SIG_ARG] = arg;
    if (t && !local) {
        mine[SIG_DT] = t->dt;
        mine[SIG_DEV] = t->dev;
        mine[SIG_ND] = t->nd;
        for (int d = 0; d < t->nd; d++) mine[SIG_DIMS + d] = t->sizes[d];
    }
    if (fits && !local) memcpy(mine + SIG_N, data, bytes);
    pn_status st = pn_mpi_all_gather(label, mine, all, (int64_t)rec, PN_I64);
    if (st || local) {
        if (!pn_mpi_failure()) free(all);
        return st ? st : local;
    }
    for (int r = 0; r < g_size && !st; r++) {
        const int64_t *s = all + (size_t)r * rec, *s0 = all;
        if (s[SIG_STATUS] != PN_OK) {
            st = pn_error((pn_status)s[SIG_STATUS],
                          "%s: rank %d refused its arguments (its own message says why); no rank went on", op, r);
        } else if (argname && s[SIG_ARG] != s0[SIG_ARG]) {
            st = pn_error(PN_ERR_ARG, "%s: rank %d passed %s %lld but rank 0 passed %lld; every rank must pass the same",
                          op, r, argname, (long long)s[SIG_ARG], (long long)s0[SIG_ARG]);
        } else if (s[SIG_DEV] != s0[SIG_DEV]) {
            st = pn_error(PN_ERR_DEVICE, "%s: rank %d passed a %s tensor but rank 0 a %s one; every rank must pass "
                          "t on the same kind of device", op, r, pn_device_name((int)s[SIG_DEV]),
                          pn_device_name((int)s0[SIG_DEV]));
        } else if (s[SIG_DT] != s0[SIG_DT] || s[SIG_ND] != s0[SIG_ND] ||
                   memcmp(s + SIG_DIMS, s0 + SIG_DIMS, PN_MAX_DIMS * sizeof *s) != 0) {
            st = pn_error(PN_ERR_SHAPE, "%s: rank %d passed t %s %s but rank 0 passed %s %s; every rank must pass "
                          "the same shape and dtype", op, r, pn_dims_str((int)s[SIG_ND], s + SIG_DIMS),
                          pn_dtype_name((int)s[SIG_DT]), pn_dims_str((int)s0[SIG_ND], s0 + SIG_DIMS),
                          pn_dtype_name((int)s0[SIG_DT]));
        }
    }
    /* agreed shapes and dtypes: every rank's bytes are alike, so every rank decides alike */
    if (!st && fits && carried) {
        *carried = all;
        return PN_OK;
    }
    free(all);
    return st;
}

static pn_status check_tensor(const char *op, const pn_tensor *t) {
    if (!t) return pn_error(PN_ERR_ARG, "%s: t is nil", op);
    if (t->dev != PN_CPU && !pn_nccl_built())
        return pn_error(PN_ERR_DEVICE, "%s: t %s is a cuda tensor, and this libpenumbra was built without NCCL (the "
                        "engine of device tensors: the CUDA toolkit's libnccl); move it with t:to('cpu')", op,
                        pn_shape_str(t));
    return PN_OK;
}

/* After an all-reduce max / min of floats on the device: NCCL does not promise that a NaN wins,
 * so the NaN positions (any rank's) are all-reduced too and put back — NaN in, NaN out. */
static pn_status restore_nan(const char *lb, pn_tensor *c, pn_tensor *nan_here) {
    pn_status st = pn_nccl_all_reduce(lb, pn_ptr(nan_here), pn_numel(nan_here), PN_U8, PN_MAX);
    if (st) return st;
    int prev = pn_set_grad_enabled(0);
    pn_tensor *nan = pn_full(0, NULL, NAN, c->dt, c->dev), *w = nan ? pn_where(nan_here, nan, c) : NULL;
    st = w ? pn_copy_(c, w) : PN_ERR_OOM;
    pn_release(w);
    pn_release(nan);
    pn_set_grad_enabled(prev);
    return st;
}

#ifndef PN_HAVE_NCCL
int pn_nccl_built(void) { return 0; }
static pn_status no_nccl(const char *op) {
    return pn_error(PN_ERR_DEVICE, "%s: this libpenumbra has no NCCL engine for device tensors", op);
}
pn_status pn_nccl_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) { return no_nccl(op); }
pn_status pn_nccl_broadcast(const char *op, void *p, int64_t n, int dtype, int root) { return no_nccl(op); }
pn_status pn_nccl_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) { return no_nccl(op); }
pn_status pn_nccl_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red) { return no_nccl(op); }
pn_status pn_nccl_wait_started(const char *op) { return no_nccl(op); }
#endif

/* ---- the collectives ----------------------------------------------------------------- */
/* what the engine's messages call a collective: "dist.all_reduce (24 bytes)", t's bytes on
 * this rank (a gone rank, a timeout or a signal is reported against the call, bytes included) */
static const char *label(const char *name, const pn_tensor *t) {
    static char buf[96];
    if (!t) return name;
    snprintf(buf, sizeof buf, "%s (%lld bytes)", name, (long long)(pn_numel(t) * (int64_t)pn_elsize(t->dt)));
    return buf;
}

/* a buffer MPI may still write into (a collective gave up on it): one reference more, never
 * dropped, so its storage outlives whatever the caller frees */
static void keep_if_abandoned(pn_tensor *buf) {
    if (pn_mpi_failure()) pn_retain(buf);
}

pn_status pn_dist_all_reduce(pn_tensor *t, int op) {
    const char *name = "dist.all_reduce";
    PN_TRY(pn_dist_init());
    pn_status local = check_tensor(name, t);
    if (!local && op != PN_SUM && op != PN_MEAN && op != PN_MAX && op != PN_MIN)
        local = pn_error(PN_ERR_ARG, "%s: unknown op %d (sum, mean, max, min)", name, op);
    if (!local && op == PN_MEAN && !pn_is_float(t->dt))
        local = pn_error(PN_ERR_DTYPE, "%s: mean of a %s tensor: mean needs f32 or f64 (all_reduce 'sum' and divide)",
                         name, pn_dtype_name(t->dt));
    /* a strided t: reduce a contiguous copy, then write it back */
    pn_tensor *c = NULL;
    if (!local && g_size > 1 && !(c = pn_contig(t))) local = PN_ERR_OOM;
    int64_t n = c ? pn_numel(c) : 0;
    size_t es = c ? pn_elsize(c->dt) : 0;
    int red = op == PN_MEAN ? PN_SUM : op;
    const int dev = c && c->dev != PN_CPU;
    /* a float max / min on the device: where this rank has NaN, before NCCL (restore_nan) */
    pn_tensor *nan_here = NULL;
    if (!local && dev && g_size > 1 && pn_is_float(t->dt) && (red == PN_MAX || red == PN_MIN) &&
        !(nan_here = pn_compare(PN_NE, c, c)))
        local = PN_ERR_OOM;
    int64_t *carried = NULL;
    const char *lb = label(name, local ? NULL : t);
    /* device values do not ride on the (host) agreement */
    pn_status st = agree(name, "op", local, op, t, c && !dev ? pn_ptr(c) : NULL, (size_t)n * es, &carried, lb);
    if (st || g_size == 1) {
        if (c) pn_release(c);
        pn_release(nan_here);
        return st;
    }
    if (dev) {
        st = pn_nccl_all_reduce(lb, pn_ptr(c), n, c->dt, red);
        if (!st && nan_here) st = restore_nan(lb, c, nan_here);
        if (!st && op == PN_MEAN) st = pn_scale_(c, 1.0 / g_size);
    } else if (carried) { /* small: every rank's values came with the agreement; reduced here in rank order */
        size_t rec = record_n();
        memcpy(pn_ptr(c), carried + SIG_N, (size_t)n * es);
        for (int r = 1; r < g_size && !st; r++)
            st = pn_mpi_reduce_local(lb, carried + (size_t)r * rec + SIG_N, pn_ptr(c), n, c->dt, red);
        free(carried);
    } else {
        st = pn_mpi_all_reduce(lb, pn_ptr(c), n, c->dt, red);
    }
    if (!st && op == PN_MEAN && !dev) {
        if (c->dt == PN_F32) {
            float *p = (float *)pn_ptr(c);
            for (int64_t i = 0; i < n; i++) p[i] /= (float)g_size;
        } else {
            double *p = (double *)pn_ptr(c);
            for (int64_t i = 0; i < n; i++) p[i] /= (double)g_size;
        }
    }
    if (!st) {
        if (c != t) st = pn_copy_(t, c);
        else pn_bump_version(t);
    }
    keep_if_abandoned(c);
    pn_release(c);
    pn_release(nan_here);
    return st;
}

pn_status pn_dist_broadcast(pn_tensor *t, int root) {
    const char *name = "dist.broadcast";
    PN_TRY(pn_dist_init());
    pn_status local = check_tensor(name, t);
    if (!local && (root < 0 || root >= g_size))
        local = pn_error(PN_ERR_INDEX, "%s: root %d is out of range for %d rank%s (ranks count from 0: 0 … %d)", name,
                         root, g_size, g_size == 1 ? "" : "s", g_size - 1);
    const char *lb = label(name, local ? NULL : t);
    PN_TRY(agree(name, "root", local, root, t, NULL, 0, NULL, lb));
    if (g_size == 1) return PN_OK;
    pn_tensor *c = pn_contig(t);
    if (!c) return PN_ERR_OOM;
    pn_status st = c->dev != PN_CPU ? pn_nccl_broadcast(lb, pn_ptr(c), pn_numel(c), c->dt, root)
                                     : pn_mpi_broadcast(lb, pn_ptr(c), pn_numel(c), c->dt, root);
    if (!st && g_rank != root) {
        if (c != t) st = pn_copy_(t, c);
        else pn_bump_version(t);
    }
    keep_if_abandoned(c);
    pn_release(c);
    return st;
}

pn_tensor *pn_dist_all_gather(pn_tensor *t) {
    const char *name = "dist.all_gather";
    if (pn_dist_init()) return NULL;
    pn_status local = check_tensor(name, t);
    int64_t shape[PN_MAX_DIMS] = { g_size };
    if (!local && t->nd + 1 > PN_MAX_DIMS)
        local = pn_error(PN_ERR_SHAPE, "%s: t %s has %d dims; the result's new first dim would make %d (at most %d)",
                         name, pn_shape_str(t), t->nd, t->nd + 1, PN_MAX_DIMS);
    if (!local) {
        memcpy(shape + 1, t->sizes, (size_t)t->nd * sizeof *shape);
        local = pn_check_shape(name, t->nd + 1, shape, t->dt);
    }
    const char *lb = label(name, local ? NULL : t);
    if (agree(name, NULL, local, 0, t, NULL, 0, NULL, lb)) return NULL;
    pn_tensor *c = pn_contig(t), *out = c ? pn_empty(t->nd + 1, shape, t->dt, t->dev) : NULL;
    pn_status st = out ? PN_OK : PN_ERR_OOM;
    int64_t n = c ? pn_numel(c) : 0;
    if (!st && g_size == 1) {
        pn_tensor *o0 = pn_select(out, 0, 0);
        st = o0 ? pn_copy_(o0, c) : PN_ERR_OOM;
        pn_release(o0);
    } else if (!st) {
        st = t->dev != PN_CPU ? pn_nccl_all_gather(lb, pn_ptr(c), pn_ptr(out), n, c->dt)
                              : pn_mpi_all_gather(lb, pn_ptr(c), pn_ptr(out), n, c->dt);
    }
    if (st && c && out) {
        keep_if_abandoned(c);
        keep_if_abandoned(out);
    }
    if (c) pn_release(c);
    if (st && out) {
        pn_release(out);
        out = NULL;
    }
    return out;
}

pn_status pn_dist_abort(const char *msg, int code) {
    if (!pn_dist_active())
        return pn_error(PN_ERR_STATE, "dist.abort: not running over MPI with several ranks (a single process "
                        "raises an error instead)");
    if (!msg || *msg) { /* "": the caller has said why already (cli.lua, ranks that failed together) */
        fprintf(stderr, "penumbra: rank %d of %d: %s\n", g_rank, g_size, msg ? msg : "aborted");
        fflush(stderr);
    }
    pn_mpi_abort(code ? code : 1);
    return PN_ERR_STATE; /* not reached */
}
