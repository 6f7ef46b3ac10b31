/* reducer.c — data parallelism's gradient buckets (penumbra.h, "the gradients' buckets";
 * penumbra/ddp.lua drives it).
 *
 * The parameters' gradients travel between ranks in flat buffers ("buckets"): one dtype each, at
 * most cap bytes (a larger parameter alone; the first bucket has a cap of its own, small, as
 * DDP's: it is the one that can start early), filled in reverse parameter order — the order a
 * backward finishes them, since the first layers' parameters are reached last. The buckets go
 * out in that fixed order on every rank (a collective must be entered in the same order
 * everywhere), so the sums are the same whatever the timing, and bucketing does not change them
 * (each element is the same sum in whatever bucket it sits).
 *
 * Overlap (DDP's way). pn_reducer_arm installs a leaf watcher in the autograd engine
 * (internal.h pn_leaf_watch): pass 1 of the next pn_backward counts the edges into each
 * parameter, pass 2 says when each is done, so a parameter is final when its edges are all
 * done (or when it has none: no gradient in this backward). A bucket whose parameters are all
 * final is copied (scaled by the rank's weight) and its all-reduce started — when every bucket
 * before it was started, to keep the order — while the backward goes on: on the CPU a
 * non-blocking MPI_Iallreduce moved on by one MPI_Test after every node of the backward
 * (progress()), on CUDA an NCCL all-reduce on a stream beside the compute stream (nccl.cu).
 * pn_reducer_finish starts what is left, waits for all, and writes the sums back.
 *
 * Which parameters have a gradient. The last bucket carries one slot more per parameter: 1 where
 * this rank has a gradient. It is the last to go, so by then every parameter is final. Summed, it
 * says whether any rank has one: a parameter without a gradient on every rank stays without
 * (as in one process); one with a gradient on some ranks only counts zeros for the others. */
#include "dist/dist.h"

#include "backend.h" /* pn_device_name */

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define N_DTYPES (PN_U8 + 1)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    pn_tensor *p;      /* the parameter (retained) */
    int bucket;
    int64_t offset, n; /* its elements in the bucket's buffer */
    int pending;       /* edges into it not yet done in this backward */
    int final;         /* its gradient will not change in this backward */
    int present;       /* it had a gradient when its bucket was filled */
} item;

typedef struct {
    int dtype;
    int64_t total;   /* gradient elements (the last bucket has n_params slots more) */
    pn_tensor *buf;  /* (total [+ n_params],) on the parameters' device */
    int first, count; /* its items: order[first … first + count − 1] */
    int left;        /* items not yet final */
    void *req;       /* its MPI request while in flight (CPU) */
} bucket;

struct pn_reducer {
    int n, nb, dev, size;
    item *it;
    bucket *b;
    int *order;
    /* parameter → item: open addressing on the pointer */
    int hcap;
    pn_tensor **hkey;
    int *hval;
    int armed, next; /* next: the bucket to start next */
    double w;
    pn_leaf_watch watch;
    double stats[4]; /* pn_reducer_stats */
};

static const char *label(const pn_reducer *r, int k) {
    static char buf[96];
    snprintf(buf, sizeof buf, "dist.all_reduce (%lld bytes) of the gradients' bucket %d of %d",
             (long long)(pn_numel(r->b[k].buf) * (int64_t)pn_elsize(r->b[k].dtype)), k + 1, r->nb);
    return buf;
}

static size_t slot_of(const pn_reducer *r, const pn_tensor *p) {
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull) & (size_t)(r->hcap - 1);
}

static int lookup(const pn_reducer *r, const pn_tensor *p) {
    for (size_t h = slot_of(r, p);; h = (h + 1) & (size_t)(r->hcap - 1)) {
        if (r->hkey[h] == p) return r->hval[h];
        if (!r->hkey[h]) return -1;
    }
}

/* a view of bucket k's elements [off, off + n) shaped (nd, shape) */
static pn_tensor *part(pn_tensor *buf, int64_t off, int64_t n, int nd, const int64_t *shape) {
    pn_tensor *a = pn_narrow(buf, 0, off, n);
    pn_tensor *v = a ? pn_view(a, nd, shape) : NULL;
    pn_release(a);
    return v;
}

/* bucket k ← w · this rank's gradients (zeros where none); the last also its presence slots */
static pn_status fill(pn_reducer *r, int k) {
    bucket *b = &r->b[k];
    pn_status st = PN_OK;
    for (int j = 0; j < b->count && !st; j++) {
        item *m = &r->it[r->order[b->first + j]];
        pn_tensor *v = part(b->buf, m->offset, m->n, m->p->nd, m->p->sizes);
        if (!v) return PN_ERR_OOM;
        m->present = m->p->gradt != NULL;
        st = m->present ? pn_copy_(v, m->p->gradt) : pn_fill_(v, 0.0);
        pn_release(v);
    }
    if (!st && r->w != 1.0) {
        pn_tensor *g = pn_narrow(b->buf, 0, 0, b->total);
        st = g ? pn_scale_(g, r->w) : PN_ERR_OOM;
        pn_release(g);
    }
    if (!st && k == r->nb - 1) { /* every item is final by now: each one's presence */
        pn_tensor *h = pn_zeros(1, (int64_t[]){r->n}, b->dtype, PN_CPU);
        if (!h) return PN_ERR_OOM;
        for (int i = 0; i < r->n; i++) pn_st(pn_ptr(h), h->dt, i, r->it[i].present);
        pn_tensor *v = pn_narrow(b->buf, 0, b->total, r->n);
        st = v ? pn_copy_(v, h) : PN_ERR_OOM;
        pn_release(v);
        pn_release(h);
    }
    return st;
}

static pn_status start(pn_reducer *r, int k) {
    bucket *b = &r->b[k];
    PN_TRY(fill(r, k));
    r->stats[0] += 1;
    r->stats[1] += r->armed == 2; /* while the backward runs */
    r->stats[3] += (double)pn_numel(b->buf) * (double)pn_elsize(b->dtype);
    if (r->size == 1) return PN_OK;
    if (r->dev == PN_CPU) return pn_mpi_all_reduce_start(label(r, k), pn_ptr(b->buf), pn_numel(b->buf), b->dtype, PN_SUM,
                                                         &b->req);
    return pn_nccl_all_reduce_start(label(r, k), pn_ptr(b->buf), pn_numel(b->buf), b->dtype, PN_SUM);
}

/* start every bucket whose turn it is and whose items are all final */
static pn_status start_ready(pn_reducer *r) {
    while (r->next < r->nb && r->b[r->next].left == 0) PN_TRY(start(r, r->next++));
    return PN_OK;
}

static void make_final(pn_reducer *r, item *m) {
    if (m->final) return;
    m->final = 1;
    r->b[m->bucket].left--;
}

/* ---- the watcher (internal.h) ----------------------------------------------------------- */
static void on_edge(void *ctx, pn_tensor *leaf) {
    pn_reducer *r = ctx;
    int i = lookup(r, leaf);
    if (i >= 0) r->it[i].pending++;
}

static pn_status on_counted(void *ctx) {
    pn_reducer *r = ctx;
    r->armed = 2;
    for (int i = 0; i < r->n; i++)
        if (r->it[i].pending == 0) make_final(r, &r->it[i]); /* not reached: nothing comes */
    return start_ready(r);
}

static pn_status on_done(void *ctx, pn_tensor *leaf) {
    pn_reducer *r = ctx;
    int i = lookup(r, leaf);
    if (i < 0 || --r->it[i].pending > 0) return PN_OK;
    make_final(r, &r->it[i]);
    return start_ready(r);
}

/* one MPI_Test on the oldest bucket in flight moves them all on (libnbc's progress is global) */
static pn_status on_progress(void *ctx) {
    pn_reducer *r = ctx;
    if (r->dev != PN_CPU) return PN_OK; /* NCCL moves on by itself */
    for (int k = 0; k < r->next; k++)
        if (r->b[k].req) return pn_mpi_test(label(r, k), &r->b[k].req);
    return PN_OK;
}

/* ---- the public calls ------------------------------------------------------------------- */
void pn_reducer_free(pn_reducer *r) {
    if (!r) return;
    if (r->watch.ctx == r) pn_ag_watch(NULL); /* armed and never finished */
    /* after a failed exchange MPI may still write into the buffers and requests: kept (dist.c) */
    int keep = pn_dist_failure() != PN_DIST_OK;
    for (int k = 0; k < r->nb && r->b; k++)
        if (!keep) {
            pn_release(r->b[k].buf);
            free(r->b[k].req);
        }
    for (int i = 0; i < r->n && r->it; i++) pn_release(r->it[i].p);
    if (!keep) free(r->b);
    free(r->it);
    free(r->order);
    free(r->hkey);
    free(r->hval);
    free(r);
}

pn_reducer *pn_reducer_new(pn_tensor *const *params, int n, double first_cap_bytes, double cap_bytes) {
    const char *op = "ddp.reducer";
    if (pn_dist_init()) return NULL;
    if (!params || n < 1) return pn_error_null(PN_ERR_ARG, "%s: needs at least one parameter, got %d", op, n);
    if (!(cap_bytes >= 1) || !(first_cap_bytes >= 1))
        return pn_error_null(PN_ERR_ARG, "%s: the bucket caps must be >= 1 byte, got %g (first) and %g", op,
                             first_cap_bytes, cap_bytes);
    for (int i = 0; i < n; i++) {
        if (!params[i]) return pn_error_null(PN_ERR_ARG, "%s: parameter %d is nil", op, i + 1);
        if (params[i]->fn)
            return pn_error_null(PN_ERR_ARG, "%s: parameter %d %s is not a leaf (it came out of an op)", op, i + 1,
                                 pn_shape_str(params[i]));
        if (!pn_is_float(params[i]->dt))
            return pn_error_null(PN_ERR_DTYPE, "%s: parameter %d is %s; gradients need f32 or f64", op, i + 1,
                                 pn_dtype_name(params[i]->dt));
        if (params[i]->dev != params[0]->dev)
            return pn_error_null(PN_ERR_DEVICE, "%s: parameter %d is on %s but parameter 1 on %s; the buckets live on "
                                 "one device", op, i + 1, pn_device_name(params[i]->dev),
                                 pn_device_name(params[0]->dev));
    }
    if (params[0]->dev != PN_CPU && !pn_nccl_built())
        return pn_error_null(PN_ERR_DEVICE, "%s: the parameters are on %s, and this libpenumbra has no NCCL engine",
                             op, pn_device_name(params[0]->dev));
    pn_reducer *r = calloc(1, sizeof *r);
    if (!r) return pn_error_null(PN_ERR_OOM, "%s: out of memory", op);
    r->n = n;
    r->dev = params[0]->dev;
    r->size = pn_dist_size();
    r->hcap = 16;
    while (r->hcap < 2 * n) r->hcap *= 2;
    r->it = calloc((size_t)n, sizeof *r->it);
    r->b = calloc((size_t)n, sizeof *r->b); /* at most one bucket per parameter */
    r->order = calloc((size_t)n, sizeof *r->order);
    r->hkey = calloc((size_t)r->hcap, sizeof *r->hkey);
    r->hval = calloc((size_t)r->hcap, sizeof *r->hval);
    if (!r->it || !r->b || !r->order || !r->hkey || !r->hval) {
        pn_reducer_free(r);
        return pn_error_null(PN_ERR_OOM, "%s: out of memory", op);
    }
    /* the layout: reverse parameter order, a bucket open per dtype until the next would pass cap */
    int open[N_DTYPES];
    double open_bytes[N_DTYPES];
    for (int d = 0; d < N_DTYPES; d++) open[d] = -1;
    for (int i = n - 1; i >= 0; i--) {
        pn_tensor *p = params[i];
        pn_retain(p);
        item *m = &r->it[i];
        m->p = p;
        m->n = pn_numel(p);
        double bytes = (double)m->n * (double)pn_elsize(p->dt);
        int k = open[p->dt];
        if (k < 0 || open_bytes[p->dt] + bytes > (k == 0 ? first_cap_bytes : cap_bytes)) {
            k = open[p->dt] = r->nb++;
            open_bytes[p->dt] = 0;
            r->b[k].dtype = p->dt;
        }
        open_bytes[p->dt] += bytes;
        m->bucket = k;
        m->offset = r->b[k].total;
        r->b[k].total += m->n;
        r->b[k].count++;
        for (size_t h = slot_of(r, p);; h = (h + 1) & (size_t)(r->hcap - 1)) {
            if (r->hkey[h] == p) {
                pn_reducer_free(r);
                return pn_error_null(PN_ERR_ARG, "%s: parameter %d is given twice", op, i + 1);
            }
            if (!r->hkey[h]) {
                r->hkey[h] = p;
                r->hval[h] = i;
                break;
            }
        }
    }
    for (int k = 0, at = 0; k < r->nb; k++) {
        r->b[k].first = at;
        at += r->b[k].count;
        r->b[k].count = 0;
    }
    for (int i = n - 1; i >= 0; i--) {
        bucket *b = &r->b[r->it[i].bucket];
        r->order[b->first + b->count++] = i;
    }
    for (int k = 0; k < r->nb; k++) {
        int64_t len = r->b[k].total + (k == r->nb - 1 ? n : 0);
        r->b[k].buf = pn_zeros(1, &len, r->b[k].dtype, r->dev);
        if (!r->b[k].buf) {
            pn_reducer_free(r);
            return NULL;
        }
    }
    /* every rank the same layout: the buckets' sizes and dtypes agreed (dist.c names a rank that differs) */
    pn_tensor *sig = pn_zeros(1, (int64_t[]){2 * (int64_t)r->nb + 1}, PN_I64, PN_CPU);
    pn_status st = sig ? PN_OK : PN_ERR_OOM;
    if (!st) {
        int64_t *s = (int64_t *)pn_ptr(sig);
        s[0] = r->nb;
        for (int k = 0; k < r->nb; k++) s[1 + 2 * k] = r->b[k].total, s[2 + 2 * k] = r->b[k].dtype;
    }
    pn_tensor *all = st ? NULL : pn_dist_all_gather(sig);
    if (!st && !all) st = PN_ERR_STATE;
    for (int q = 1; all && q < r->size && !st; q++)
        if (memcmp(pn_ptr(all), pn_ptr(all) + (size_t)q * pn_numel(sig) * 8, (size_t)pn_numel(sig) * 8) != 0)
            st = pn_error(PN_ERR_SHAPE, "%s: rank %d's parameters differ from rank 0's (their count, shapes or dtypes); "
                          "every rank must build the same model", op, q);
    pn_release(all);
    pn_release(sig);
    if (st) {
        pn_reducer_free(r);
        return NULL;
    }
    r->watch = (pn_leaf_watch){on_edge, on_counted, on_done, on_progress, NULL};
    return r;
}

int pn_reducer_buckets(const pn_reducer *r) { return r ? r->nb : 0; }

void pn_reducer_stats(const pn_reducer *r, double *out4) {
    for (int i = 0; i < 4; i++) out4[i] = r ? r->stats[i] : 0;
}

pn_status pn_reducer_arm(pn_reducer *r, double weight) {
    if (!r) return pn_error(PN_ERR_ARG, "ddp.arm: nil reducer");
    if (r->armed) return pn_error(PN_ERR_STATE, "ddp.arm: the reducer is armed already (a backward ran without finish)");
    if (!isfinite(weight)) return pn_error(PN_ERR_ARG, "ddp.arm: weight must be finite, got %g", weight);
    r->w = weight;
    r->next = 0;
    for (int i = 0; i < r->n; i++) r->it[i].pending = r->it[i].final = r->it[i].present = 0;
    for (int k = 0; k < r->nb; k++) r->b[k].left = r->b[k].count;
    r->armed = 1;
    r->watch.ctx = r;
    pn_ag_watch(&r->watch);
    return PN_OK;
}

pn_status pn_reducer_finish(pn_reducer *r) {
    if (!r) return pn_error(PN_ERR_ARG, "ddp.finish: nil reducer");
    if (!r->armed) return pn_error(PN_ERR_STATE, "ddp.finish: the reducer is not armed");
    pn_ag_watch(NULL);
    r->watch.ctx = NULL;
    r->armed = 1; /* what starts now starts after the backward */
    int mode = pn_set_grad_enabled(0);
    pn_status st = PN_OK;
    while (!st && r->next < r->nb) st = start(r, r->next++);
    double t0 = now_s();
    if (!st && r->size > 1) {
        if (r->dev == PN_CPU) {
            for (int k = 0; k < r->nb && !st; k++)
                st = pn_mpi_wait(label(r, k), &r->b[k].req, (size_t)pn_numel(r->b[k].buf) * pn_elsize(r->b[k].dtype));
        } else {
            st = pn_nccl_wait_started(label(r, r->nb - 1));
        }
    }
    r->stats[2] += now_s() - t0;
    /* the sums back into .grad, where any rank had a gradient */
    pn_tensor *pres = NULL;
    if (!st) {
        bucket *last = &r->b[r->nb - 1];
        pn_tensor *v = pn_narrow(last->buf, 0, last->total, r->n);
        pres = v ? pn_to_device(v, PN_CPU) : NULL;
        pn_release(v);
        if (!pres) st = PN_ERR_OOM;
    }
    for (int i = 0; i < r->n && !st; i++) {
        item *m = &r->it[i];
        if (!(pn_ld(pn_ptr(pres), pres->dt, i) > 0)) continue;
        pn_tensor *v = part(r->b[m->bucket].buf, m->offset, m->n, m->p->nd, m->p->sizes);
        if (!v) st = PN_ERR_OOM;
        else if (m->p->gradt) st = pn_copy_(m->p->gradt, v);
        else {
            pn_tensor *g = pn_contig_copy(v);
            st = g ? pn_set_grad(m->p, g) : PN_ERR_OOM;
            pn_release(g);
        }
        pn_release(v);
    }
    pn_release(pres);
    pn_set_grad_enabled(mode);
    r->armed = 0;
    return st;
}

pn_status pn_reducer_sync(pn_reducer *r, double weight) {
    PN_TRY(pn_reducer_arm(r, weight));
    return pn_reducer_finish(r);
}

pn_status pn_reducer_broadcast(pn_reducer *r, int root) {
    if (!r) return pn_error(PN_ERR_ARG, "ddp.broadcast: nil reducer");
    if (r->armed) return pn_error(PN_ERR_STATE, "ddp.broadcast: the reducer is armed (a backward is being reduced)");
    if (root < 0 || root >= r->size)
        return pn_error(PN_ERR_ARG, "ddp.broadcast: root %d is not a rank (0 … %d)", root, r->size - 1);
    if (r->size == 1) return PN_OK;
    int mode = pn_set_grad_enabled(0), me = pn_dist_rank();
    pn_status st = PN_OK;
    for (int k = 0; k < r->nb && !st; k++) {
        bucket *b = &r->b[k];
        for (int j = 0; j < b->count && !st && me == root; j++) {
            item *m = &r->it[r->order[b->first + j]];
            pn_tensor *v = part(b->buf, m->offset, m->n, m->p->nd, m->p->sizes);
            st = v ? pn_copy_(v, m->p) : PN_ERR_OOM;
            pn_release(v);
        }
        if (st) break;
        const char *lb = label(r, k);
        st = r->dev == PN_CPU ? pn_mpi_broadcast(lb, pn_ptr(b->buf), pn_numel(b->buf), b->dtype, root)
                              : pn_nccl_broadcast(lb, pn_ptr(b->buf), pn_numel(b->buf), b->dtype, root);
        for (int j = 0; j < b->count && !st && me != root; j++) {
            item *m = &r->it[r->order[b->first + j]];
            pn_tensor *v = part(b->buf, m->offset, m->n, m->p->nd, m->p->sizes);
            st = v ? pn_copy_(m->p, v) : PN_ERR_OOM;
            pn_release(v);
        }
    }
    pn_set_grad_enabled(mode);
    return st;
}
