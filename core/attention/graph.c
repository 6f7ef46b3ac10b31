/* graph.c — fused attention over a CSR neighbourhood (DESIGN §3.1, graph attention):
 * pn_graph_attention, forward and analytic backward; pn_graph_attention_weights, the per-edge
 * weights.
 *
 * Node-major inputs q, k (N, H, D) or (N, D), v (N, H, Dv) or (N, Dv), and the CSR by
 * destination of pn_graph_csr: offsets (N+1), src (E); node i attends to src[e] for e in
 * [offsets[i], offsets[i+1]). Per destination node and head the same score epilogues as
 * the dense driver run over the gathered neighbours (attention.h: one row of pairs), then
 * a segment softmax (or sigmoid / sigmoid_normalized), the Einstein midpoint if asked,
 * attention dropout on the weights when o->train && o->dropout > 0 (inverted: kept weights
 * scaled by 1/(1−p), the mask drawn from the global Philox stream via pn_rand), and the
 * weighted sum of the neighbours' values. Scores include gat (a_l, a_r per head).
 *
 * Masks are the graph: mask / bias / causal / alibi are not options here (leave the edges
 * out). A node without neighbours gets output 0 and zero gradients.
 *
 * Backward, deterministic and race-free: pass 1 runs per destination node (dS, the score's
 * VJP, dQ) and stores per-edge results; pass 2 runs per source node over the transposed
 * CSR (edge ids grouped by source in increasing order, built by a counting sort) and sums
 * dK, dV and the key-term gradients in that fixed order. */
#include "attention.h"
#include "../backend.h"
#include "fastmath.h"

#include <omp.h>

/* the whole driver vectorizes its float selects (fastmath.h, ops/fast_math.h) */
PN_NOTRAP_BEGIN

#define real float
#define SFX(x) x##_f32
#define EPI_FWD fwd32
#define EPI_VJP vjp32
#include "graph_impl.h"
#undef real
#undef SFX
#undef EPI_FWD
#undef EPI_VJP

#define real double
#define SFX(x) x##_f64
#define EPI_FWD fwd64
#define EPI_VJP vjp64
#include "graph_impl.h"
#undef real
#undef SFX
#undef EPI_FWD
#undef EPI_VJP

#define VP(t) ((void *)pn_ptr(t))

static const char *OP = "graph_attention";

/* the graph as plain arrays: off (N+1), src (E), checked */
typedef struct {
    int64_t N, E, maxdeg;
    int64_t *off, *src;
} csr;

static void csr_free(csr *g) {
    free(g->off);
    free(g->src);
    g->off = g->src = NULL;
}

/* the front end's checks of the CSR: dtypes and shapes (its contents are the kernel's) */
static pn_status csr_check(const char *OP, const pn_tensor *offsets, const pn_tensor *src, const pn_tensor *q,
                           int64_t N) {
    if (!offsets || !src) return pn_error(PN_ERR_ARG, "%s: %s is nil", OP, !offsets ? "offsets" : "src");
    if (!pn_is_index(offsets->dt) || !pn_is_index(src->dt))
        return pn_error(PN_ERR_DTYPE, "%s: offsets %s (%s) and src %s (%s) must be i32/i64", OP, pn_shape_str(offsets),
                        pn_dtype_name(offsets->dt), pn_shape_str(src), pn_dtype_name(src->dt));
    if (offsets->nd != 1 || offsets->sizes[0] != N + 1)
        return pn_error(PN_ERR_SHAPE, "%s: offsets %s does not fit q %s: a CSR over %lld nodes has %lld offsets", OP,
                        pn_shape_str(offsets), pn_shape_str(q), (long long)N, (long long)(N + 1));
    if (src->nd != 1) return pn_error(PN_ERR_SHAPE, "%s: src %s must be 1-D", OP, pn_shape_str(src));
    return PN_OK;
}

/* the kernel's: the CSR read into g and its contents checked */
static pn_status csr_load(const char *OP, const pn_tensor *offsets, const pn_tensor *src, const pn_tensor *q, int64_t N,
                          csr *g) {
    memset(g, 0, sizeof *g);
    PN_TRY(csr_check(OP, offsets, src, q, N));
    g->N = N;
    g->E = src->sizes[0];
    g->off = malloc(sizeof(int64_t) * (size_t)(N + 1));
    g->src = malloc(sizeof(int64_t) * (size_t)(g->E + 1));
    if (!g->off || !g->src) {
        csr_free(g);
        return pn_error(PN_ERR_OOM, "%s: out of memory", OP);
    }
    const char *po = pn_ptr(offsets), *ps = pn_ptr(src);
    if (offsets->dt == PN_I64 && offsets->strides[0] == 1)
        memcpy(g->off, po, sizeof(int64_t) * (size_t)(N + 1));
    else
        for (int64_t i = 0; i <= N; i++) g->off[i] = pn_ldi(po, offsets->dt, i * offsets->strides[0]);
    if (src->dt == PN_I64 && src->strides[0] == 1)
        memcpy(g->src, ps, sizeof(int64_t) * (size_t)g->E);
    else if (src->dt == PN_I32 && src->strides[0] == 1)
        for (int64_t e = 0; e < g->E; e++) g->src[e] = ((const int32_t *)ps)[e];
    else
        for (int64_t e = 0; e < g->E; e++) g->src[e] = pn_ldi(ps, src->dt, e * src->strides[0]);
    pn_status s = PN_OK;
    if (g->off[0] != 0 || g->off[N] != g->E)
        s = pn_error(PN_ERR_INDEX, "%s: offsets %s must start at 0 and end at the number of edges %lld (src %s), got %lld "
                     "and %lld", OP, pn_shape_str(offsets), (long long)g->E, pn_shape_str(src), (long long)g->off[0],
                     (long long)g->off[N]);
    for (int64_t i = 0; i < N && !s; i++) {
        int64_t d = g->off[i + 1] - g->off[i];
        if (d < 0)
            s = pn_error(PN_ERR_INDEX, "%s: offsets %s decrease at node %lld", OP, pn_shape_str(offsets), (long long)i);
        else if (d > g->maxdeg)
            g->maxdeg = d;
    }
    int out_of_range = 0; /* one vectorised pass; the first culprit only when there is one */
    for (int64_t e = 0; e < g->E; e++) out_of_range |= (g->src[e] < 0) | (g->src[e] >= N);
    for (int64_t e = 0; e < g->E && !s && out_of_range; e++)
        if (g->src[e] < 0 || g->src[e] >= N)
            s = pn_error(PN_ERR_INDEX, "%s: src %s holds node %lld at edge %lld, outside [0, %lld) for q %s", OP,
                         pn_shape_str(src), (long long)g->src[e], (long long)e, (long long)N, pn_shape_str(q));
    if (s) csr_free(g);
    return s;
}

/* Checks q, k, v, the graph and o (errors name OP, the calling op, which shadows the file's).
 * run = 0 (the front end): the checks only; c holds the setup (the caller frees it). run = 1 (the CPU kernel): also
 * reads the CSR into g and fills c with the node-major inputs (c->nm), the parameters and the terms. */
static pn_status graph_call_init(const char *OP, pn_attn_call *c, const pn_tensor *q_, const pn_tensor *k_,
                                 const pn_tensor *v_, const pn_tensor *offsets, const pn_tensor *src,
                                 const pn_attn_opts *o, csr *g, int run) {
    pn_tensor *q = (pn_tensor *)q_, *k = (pn_tensor *)k_, *v = (pn_tensor *)v_; /* read, never written */
    memset(c, 0, sizeof *c);
    memset(g, 0, sizeof *g);
    c->op = OP;
    c->graph = 1;
    if (!q || !k || !v) return pn_error(PN_ERR_ARG, "%s: %s is nil", OP, !q ? "q" : (!k ? "k" : "v"));
    if (!o) return pn_error(PN_ERR_ARG, "%s: options are nil (fill them with pn_attn_opts_init)", OP);
    PN_TRY(pn_check_float(OP, "q", q));
    if (k->dt != q->dt || v->dt != q->dt)
        return pn_error(PN_ERR_DTYPE, "%s: q %s %s, k %s %s and v %s %s must have the same float dtype", OP,
                        pn_dtype_name(q->dt), pn_shape_str(q), pn_dtype_name(k->dt), pn_shape_str(k),
                        pn_dtype_name(v->dt), pn_shape_str(v));
    if ((q->nd != 2 && q->nd != 3) || k->nd != q->nd || v->nd != q->nd)
        return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s, v %s must all be node-major (N, H, D) or all (N, D)", OP,
                        pn_shape_str(q), pn_shape_str(k), pn_shape_str(v));
    if (k->sizes[0] != q->sizes[0] || v->sizes[0] != q->sizes[0])
        return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s, v %s have different numbers of nodes", OP, pn_shape_str(q),
                        pn_shape_str(k), pn_shape_str(v));
    if (q->nd == 3 && (k->sizes[1] != q->sizes[1] || v->sizes[1] != q->sizes[1]))
        return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s, v %s have different numbers of heads", OP, pn_shape_str(q),
                        pn_shape_str(k), pn_shape_str(v));
    if (k->sizes[q->nd - 1] != q->sizes[q->nd - 1])
        return pn_error(PN_ERR_SHAPE, "%s: q %s and k %s differ in the last dim", OP, pn_shape_str(q), pn_shape_str(k));
    if (o->mask || o->bias || o->causal || o->alibi)
        return pn_error(PN_ERR_ARG, "%s: %s is not an option of graph attention: the graph is the mask (leave the "
                        "edges out)", OP, o->mask ? "mask" : (o->bias ? "bias" : (o->causal ? "causal" : "alibi")));
    if (o->train && o->dropout != 0 && !(o->dropout > 0 && o->dropout < 1))
        return pn_error(PN_ERR_ARG, "%s: dropout must be in [0, 1), got %g", OP, o->dropout);
    const int64_t N = q->sizes[0];
    c->dt = q->dt;
    c->nd = q->nd;
    c->B = 1;
    c->H = q->nd == 3 ? q->sizes[1] : 1;
    c->BH = c->H;
    c->Nq = c->Nk = N;
    c->D = q->sizes[q->nd - 1];
    c->Dv = v->sizes[v->nd - 1];
    if (c->D < 1) return pn_error(PN_ERR_SHAPE, "%s: q %s has no features", OP, pn_shape_str(q));
    PN_TRY(run ? csr_load(OP, offsets, src, q, N, g) : csr_check(OP, offsets, src, q, N));
    pn_status s = pn_attn_setup_init(OP, o, q->dt, c->H, c->D, 1, &c->st);
    c->opts = o;
    if (s) {
        csr_free(g);
        return s;
    }
    /* gat's projections: (H, D) of q's dtype */
    const pn_score_plan *pl = &c->st.plan;
    bool proj = pl->qterm[0] == PN_TERM_PROJ || pl->qterm[1] == PN_TERM_PROJ;
    if (proj) {
        pn_tensor *as[2] = {o->a_l, o->a_r};
        const char *an[2] = {"a_l", "a_r"};
        for (int i = 0; i < 2 && !s; i++) {
            pn_tensor *a = as[i];
            if (a->dt != q->dt) s = pn_error(PN_ERR_DTYPE, "%s: %s %s has dtype %s, expected %s like q", OP, an[i],
                                               pn_shape_str(a), pn_dtype_name(a->dt), pn_dtype_name(q->dt));
            else if (!((a->nd == 2 && a->sizes[0] == c->H && a->sizes[1] == c->D) ||
                       (a->nd == 1 && c->H == 1 && a->sizes[0] == c->D)))
                s = pn_error(PN_ERR_SHAPE, "%s: %s %s must be (H, D) = (%lld, %lld) for q %s", OP, an[i],
                             pn_shape_str(a), (long long)c->H, (long long)c->D, pn_shape_str(q));
            else if (run && !(c->own[3 + i] = pn_contig(a)))
                s = PN_ERR_OOM;
        }
        if (!s && run) {
            c->a_l = pn_ptr(c->own[3]);
            c->a_r = pn_ptr(c->own[4]);
        }
    }
    if (!s && !run) return PN_OK; /* the caller frees c (it may read the plan first) */
    /* node-major as given (contiguous copies only where they are not): the kernels read every
     * head of a node's row at once (graph_impl.h) */
    c->nm = 1;
    pn_tensor *ins[3] = {q, k, v};
    for (int i = 0; i < 3 && !s; i++)
        if (!(c->own[i] = pn_contig(ins[i]))) s = PN_ERR_OOM;
    if (!s) {
        c->q = pn_ptr(c->own[0]);
        c->k = pn_ptr(c->own[1]);
        c->v = pn_ptr(c->own[2]);
        s = pn_attn_prepare(c, pn_shape_str(q), pn_shape_str(k), pn_shape_str(v));
    }
    if (s) {
        pn_attn_call_free(c);
        csr_free(g);
    }
    return s;
}

/* ---- forward ------------------------------------------------------------------------------------- */
typedef struct {
    pn_attn_opts o;                 /* a copy; its tensors retained */
    pn_tensor *q, *k, *v;           /* detached inputs */
    pn_tensor *offsets, *src;
    pn_tensor *out, *stat, *drop;   /* detached output, (H, N) statistics, (E, H) dropout mask or NULL */
    int slot[PN_NPARAM], a_slot;    /* autograd input index of each parameter tensor and of a_l (a_r next), or -1 */
} graph_saved;

static void graph_saved_free(void *p) {
    graph_saved *sv = p;
    pn_attn_opts_release(&sv->o);
    pn_tensor *ts[] = {sv->q, sv->k, sv->v, sv->offsets, sv->src, sv->out, sv->stat, sv->drop};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) pn_release(ts[i]);
    free(sv);
}

static pn_status graph_bw(pn_node *n, pn_tensor *gout, pn_tensor **gin);

/* Records out = op(q, k, v, g, o) for autograd when an input needs it (v = NULL: the weights,
 * out = w); takes *stat and *drop (set to NULL) when it does. proj: gat's a_l, a_r are inputs. */
static pn_status graph_record(const char *op, pn_tensor *out, pn_tensor **stat, pn_tensor **drop, pn_tensor *q,
                              pn_tensor *k, pn_tensor *v, pn_tensor *offsets, pn_tensor *src, const pn_attn_opts *o,
                              bool proj) {
    /* autograd inputs: q, k, v, the parameter tensors given (slots in sv->slot), a_l, a_r */
    pn_tensor *ins[3 + PN_NPARAM + 2] = {q, k, v};
    int nin = 3, slot[PN_NPARAM], a_slot = -1;
    pn_attn_param_inputs(o, ins, &nin, slot);
    if (proj) a_slot = nin, ins[nin++] = o->a_l, ins[nin++] = o->a_r;
    if (!pn_ag_needed(nin, ins)) return PN_OK;
    graph_saved *sv = calloc(1, sizeof *sv);
    pn_node *nd = sv ? pn_ag_record(out, op, graph_bw, nin, ins) : NULL;
    if (!nd) {
        free(sv);
        return sv ? PN_ERR_OOM : pn_error(PN_ERR_OOM, "%s: out of memory", op);
    }
    sv->o = *o;
    pn_attn_opts_retain(&sv->o);
    memcpy(sv->slot, slot, sizeof slot);
    sv->a_slot = a_slot;
    sv->q = pn_detach(q), sv->k = pn_detach(k), sv->v = v ? pn_detach(v) : NULL;
    sv->offsets = offsets, sv->src = src;
    pn_retain(offsets), pn_retain(src);
    sv->out = pn_detach(out);
    sv->stat = *stat, *stat = NULL;
    sv->drop = *drop, *drop = NULL;
    nd->extra = sv;
    nd->free_extra = graph_saved_free;
    return !sv->q || !sv->k || (v && !sv->v) || !sv->out ? PN_ERR_OOM : PN_OK;
}

/* The front end's device step: every tensor of the call on one device, and its kernels. */
static pn_status graph_device(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                              const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o, int *dev,
                              const pn_kernels **kt) {
    const pn_tensor *ts[7 + PN_NPARAM] = {q, k, v, offsets, src, o->a_l, o->a_r};
    const char *names[7 + PN_NPARAM] = {"q", "k", "v", "offsets", "src", "a_l", "a_r"};
    int n = 7;
    for (int p = 0; p < PN_NPARAM; p++)
        if (o->param_t[p]) ts[n] = o->param_t[p], names[n++] = pn_attention_param_name(p);
    return pn_kernels_for(op, n, ts, names, dev, kt);
}

pn_tensor *pn_graph_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *offsets, pn_tensor *src,
                              const pn_attn_opts *o) {
    pn_attn_call c;
    csr g;
    if (graph_call_init(OP, &c, q, k, v, offsets, src, o, &g, 0)) return NULL;
    /* gat's projections a_l, a_r are inputs (PROJ terms) */
    const bool proj = c.st.plan.qterm[0] == PN_TERM_PROJ || c.st.plan.qterm[1] == PN_TERM_PROJ;
    pn_attn_call_free(&c);
    int dev;
    const pn_kernels *kt;
    if (graph_device(OP, q, k, v, offsets, src, o, &dev, &kt)) return NULL;
    const int64_t N = q->sizes[0], H = q->nd == 3 ? q->sizes[1] : 1, E = src->sizes[0], Dv = v->sizes[v->nd - 1];
    pn_tensor *out = NULL, *stat = NULL, *drop = NULL;
    int64_t oshape[3] = {N, H, Dv};
    if (q->nd == 2) oshape[1] = Dv;
    out = pn_empty(q->nd, oshape, q->dt, dev);
    stat = out ? pn_empty(2, (const int64_t[]){H, N}, q->dt, dev) : NULL;
    if (!stat) goto fail;
    /* the dropout draws u ~ U[0,1) (Philox, on the device); the kernel turns them into the mask */
    if (o->train && o->dropout > 0 && E > 0 && !(drop = pn_rand(2, (const int64_t[]){E, H}, q->dt, dev))) goto fail;
    if (PN_KCALL(OP, kt, attention_graph_fwd, q, k, v, offsets, src, o, out, stat, drop)) goto fail;
    if (graph_record(OP, out, &stat, &drop, q, k, v, offsets, src, o, proj)) goto fail;
    pn_release(stat);
    pn_release(drop);
    return out;
fail:
    pn_release(out);
    pn_release(stat);
    pn_release(drop);
    return NULL;
}

/* drop (E, H) or NULL: uniform draws in, the inverted-dropout mask (u >= p) / (1 − p) out */
pn_status pn_cpu_attention_graph_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                     const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o,
                                     pn_tensor *out, pn_tensor *stat, pn_tensor *drop) {
    pn_attn_call c;
    csr g;
    PN_TRY(graph_call_init(OP, &c, q, k, v, offsets, src, o, &g, 1));
    if (drop) {
        const double p = o->dropout, keep = 1.0 / (1.0 - p);
        char *pd = pn_ptr(drop);
        for (int64_t i = 0; i < g.E * c.H; i++) pn_st(pd, q->dt, i, pn_ld(pd, q->dt, i) >= p ? keep : 0.0);
    }
    pn_status s = PN_OK;
    if (c.Nq > 0)
        s = c.dt == PN_F32 ? gforward_f32(&c, g.off, g.src, g.maxdeg, drop ? VP(drop) : NULL, VP(out), VP(stat), NULL)
                           : gforward_f64(&c, g.off, g.src, g.maxdeg, drop ? VP(drop) : NULL, VP(out), VP(stat), NULL);
    pn_attn_call_free(&c);
    csr_free(&g);
    return s;
}

/* Per-edge weights (E, H), or (E) for (N, D) inputs: row e is the weight node i gives src[e]
 * for e in [offsets[i], offsets[i+1]); no dropout, recorded for autograd (q, k, the score's
 * parameters, a_l, a_r). These are the attention weights α: aggregate is ignored, since
 * einstein's Lorentz factors belong to the values, which this op does not take — and the
 * scores only read q and k, so k stands in for the unused v. */
pn_tensor *pn_graph_attention_weights(pn_tensor *q, pn_tensor *k, pn_tensor *offsets, pn_tensor *src,
                                      const pn_attn_opts *o) {
    const char *op = "graph_attention_weights";
    pn_attn_call c;
    csr g;
    pn_attn_opts os;
    if (o) {
        os = *o;
        os.aggregate = PN_AGG_SUM;
        os.train = 0;
    }
    if (graph_call_init(op, &c, q, k, k, offsets, src, o ? &os : NULL, &g, 0)) return NULL;
    const bool proj = c.st.plan.qterm[0] == PN_TERM_PROJ || c.st.plan.qterm[1] == PN_TERM_PROJ;
    pn_attn_call_free(&c);
    int dev;
    const pn_kernels *kt;
    if (graph_device(op, q, k, NULL, offsets, src, &os, &dev, &kt)) return NULL;
    const int64_t E = src->sizes[0], N = q->sizes[0], H = q->nd == 3 ? q->sizes[1] : 1;
    pn_tensor *w = q->nd == 3 ? pn_empty(2, (const int64_t[]){E, H}, q->dt, dev)
                              : pn_empty(1, (const int64_t[]){E}, q->dt, dev);
    pn_tensor *stat = w ? pn_empty(2, (const int64_t[]){H, N}, q->dt, dev) : NULL, *drop = NULL;
    if (!stat || PN_KCALL(op, kt, attention_graph_weights, q, k, offsets, src, &os, w, stat) ||
        graph_record(op, w, &stat, &drop, q, k, NULL, offsets, src, &os, proj)) {
        pn_release(w);
        w = NULL;
    }
    pn_release(stat);
    return w;
}

pn_status pn_cpu_attention_graph_weights(const pn_tensor *q, const pn_tensor *k, const pn_tensor *offsets,
                                         const pn_tensor *src, const pn_attn_opts *o, pn_tensor *w, pn_tensor *stat) {
    pn_attn_call c;
    csr g;
    PN_TRY(graph_call_init("graph_attention_weights", &c, q, k, k, offsets, src, o, &g, 1));
    pn_status s = PN_OK;
    if (c.Nq > 0)
        s = c.dt == PN_F32 ? gforward_f32(&c, g.off, g.src, g.maxdeg, NULL, NULL, VP(stat), VP(w))
                           : gforward_f64(&c, g.off, g.src, g.maxdeg, NULL, NULL, VP(stat), VP(w));
    pn_attn_call_free(&c);
    csr_free(&g);
    return s;
}

/* ---- backward ---------------------------------------------------------------------------------------- */
/* The front end allocates the gradients it hands back (zeros, on the inputs' device) and calls
 * the kernel, which fills them. */
static pn_status graph_bw(pn_node *n, pn_tensor *gout, pn_tensor **gin) {
    graph_saved *sv = n->extra;
    const char *op = sv->v ? OP : "graph_attention_weights"; /* no v: the weights' backward */
    pn_attn_opts o = sv->o;
    o.train = 0; /* the saved mask is reused; nothing new is drawn */
    int dev;
    const pn_kernels *kt;
    PN_TRY(graph_device(op, sv->q, sv->k, sv->v, sv->offsets, sv->src, &o, &dev, &kt));
    const int dt = sv->q->dt;
    pn_tensor *dq = pn_zeros(sv->q->nd, sv->q->sizes, dt, dev);
    pn_tensor *dk = pn_zeros(sv->k->nd, sv->k->sizes, dt, dev);
    pn_tensor *dv = sv->v ? pn_zeros(sv->v->nd, sv->v->sizes, dt, dev) : NULL;
    pn_tensor *da[2] = {NULL, NULL}, *dparam[PN_ATTN_MAX_PARAMS] = {NULL};
    bool oom = !dq || !dk || (sv->v && !dv);
    for (int i = 0; i < 2 && sv->a_slot >= 0; i++) {
        const pn_tensor *a = i ? o.a_r : o.a_l;
        if (pn_ag_input_needs(n, sv->a_slot + i)) oom |= !(da[i] = pn_zeros(a->nd, a->sizes, dt, dev));
    }
    for (int p = 0; p < PN_NPARAM; p++) {
        const pn_tensor *t = o.param_t[p];
        if (t && sv->slot[p] >= 0 && pn_ag_input_needs(n, sv->slot[p]))
            oom |= !(dparam[p] = pn_zeros(t->nd, t->sizes, t->dt, dev));
    }
    pn_status st = oom ? PN_ERR_OOM : PN_OK;
    if (!st)
        st = PN_KCALL(op, kt, attention_graph_bwd, sv->q, sv->k, sv->v, sv->offsets, sv->src, &o, sv->out, sv->stat,
                      sv->drop, gout, dq, dk, dv, dparam, da[0], da[1]);
    if (!st) {
        if (pn_ag_input_needs(n, 0)) gin[0] = dq, dq = NULL;
        if (pn_ag_input_needs(n, 1)) gin[1] = dk, dk = NULL;
        if (dv && pn_ag_input_needs(n, 2)) gin[2] = dv, dv = NULL;
        for (int p = 0; p < PN_NPARAM; p++)
            if (dparam[p]) gin[sv->slot[p]] = dparam[p], dparam[p] = NULL;
        for (int i = 0; i < 2; i++)
            if (da[i]) gin[sv->a_slot + i] = da[i], da[i] = NULL;
    }
    pn_release(dq), pn_release(dk), pn_release(dv), pn_release(da[0]), pn_release(da[1]);
    for (int p = 0; p < PN_NPARAM; p++) pn_release(dparam[p]);
    return st;
}

/* dq, dk, dv (the inputs' node-major shapes), dparam[p] (parameter p's shape, or NULL) and
 * da_l, da_r ((H, D), or NULL) are zeros: the kernel writes the gradients into them. */
pn_status pn_cpu_attention_graph_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                     const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o,
                                     const pn_tensor *out_, const pn_tensor *stat_, const pn_tensor *drop_,
                                     const pn_tensor *gout, pn_tensor *dq_t, pn_tensor *dk_t, pn_tensor *dv_t,
                                     pn_tensor *const *dparam_t, pn_tensor *da_l_t, pn_tensor *da_r_t) {
    /* no v: the weights' backward (gout = dw (E, H) | (E)); k stands in for v as in the forward */
    const char *op = v ? OP : "graph_attention_weights";
    pn_attn_call c;
    csr g;
    PN_TRY(graph_call_init(op, &c, q, k, v ? v : k, offsets, src, o, &g, 1));
    const int dt = c.dt;
    const size_t es = pn_elsize(dt);
    const int64_t N = c.Nq, H = c.H, E = g.E, NH = N * H + 1, EH = E * H + 1;
    pn_status st = PN_OK;
    pn_tensor *gc = pn_contig((pn_tensor *)gout);
    /* the gradients go straight into the front end's zeros, node-major like the kernels' */
    if (!pn_is_contiguous(dq_t) || !pn_is_contiguous(dk_t) || (dv_t && !pn_is_contiguous(dv_t))) {
        pn_attn_call_free(&c);
        csr_free(&g);
        return pn_error(PN_ERR_ARG, "%s: the gradients handed to the CPU kernel must be contiguous", op);
    }
    void *dq = pn_ptr(dq_t), *dk = pn_ptr(dk_t), *dv = dv_t ? pn_ptr(dv_t) : NULL;
    double *dqt[2] = {NULL, NULL}, *dkt[2] = {NULL, NULL}, *dg = NULL, *da_l = NULL, *da_r = NULL;
    /* per (node, head) parameter gradients: only when a parameter is learnable (the VJPs
     * write them for those alone); per-edge arrays: every entry is written by pass 1 */
    unsigned learn = 0;
    for (int64_t h = 0; h < H; h++) learn |= c.st.hp[h].learn;
    double *dparam = learn ? calloc((size_t)(NH * PN_NPARAM), sizeof(double)) : NULL;
    void *eG = malloc((size_t)EH * es), *ew = malloc((size_t)EH * es), *ek[2] = {NULL, NULL}, *edg = NULL;
    int64_t *roff = calloc((size_t)(N + 2), sizeof(int64_t)), *rev = malloc(sizeof(int64_t) * (size_t)EH);
    int64_t *dst = malloc(sizeof(int64_t) * (size_t)EH);
    bool oom = !gc || (learn && !dparam) || !eG || !ew || !roff || !rev || !dst;
    const pn_score_plan *pl = &c.st.plan;
    for (int m = 0; m < 2; m++) {
        if (pl->qterm[m] != PN_TERM_NONE) oom |= !(dqt[m] = calloc((size_t)NH, sizeof(double)));
        if (pl->kterm[m] != PN_TERM_NONE) {
            oom |= !(dkt[m] = calloc((size_t)NH, sizeof(double)));
            oom |= !(ek[m] = malloc((size_t)EH * es));
        }
    }
    if (c.st.einstein) {
        oom |= !(dg = calloc((size_t)NH, sizeof(double)));
        oom |= !(edg = malloc((size_t)EH * es));
    }
    if (c.a_l) {
        oom |= !(da_l = calloc((size_t)(H * c.D), sizeof(double)));
        oom |= !(da_r = calloc((size_t)(H * c.D), sizeof(double)));
    }
    if (oom) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
        goto done;
    }
    /* transposed CSR: edges grouped by source, increasing edge id within a group */
    for (int64_t i = 0; i < N; i++)
        for (int64_t e = g.off[i]; e < g.off[i + 1]; e++) dst[e] = i;
    for (int64_t e = 0; e < E; e++) roff[g.src[e] + 1]++;
    for (int64_t j = 0; j < N; j++) roff[j + 1] += roff[j];
    {
        int64_t *fill = malloc(sizeof(int64_t) * (size_t)(N + 1));
        if (!fill) {
            st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
            goto done;
        }
        memcpy(fill, roff, sizeof(int64_t) * (size_t)(N + 1));
        for (int64_t e = 0; e < E; e++) rev[fill[g.src[e]]++] = e;
        free(fill);
    }
    if (dt == PN_F32) {
        gbw_args_f32 a = {.dout = VP(gc), .out = VP(out_), .stat = VP(stat_), .drop = drop_ ? VP(drop_) : NULL,
                          .weights = v == NULL,
                          .dq = dq, .dqt = {dqt[0], dqt[1]}, .dparam = dparam, .eG = eG, .ek = {ek[0], ek[1]}, .ew = ew,
                          .edg = edg};
        st = gbackward1_f32(&c, g.off, g.src, g.maxdeg, &a);
        if (!st) gbackward2_f32(&c, roff, rev, dst, &a, dk, dv, dkt, dg);
    } else {
        gbw_args_f64 a = {.dout = VP(gc), .out = VP(out_), .stat = VP(stat_), .drop = drop_ ? VP(drop_) : NULL,
                          .weights = v == NULL,
                          .dq = dq, .dqt = {dqt[0], dqt[1]}, .dparam = dparam, .eG = eG, .ek = {ek[0], ek[1]}, .ew = ew,
                          .edg = edg};
        st = gbackward1_f64(&c, g.off, g.src, g.maxdeg, &a);
        if (!st) gbackward2_f64(&c, roff, rev, dst, &a, dk, dv, dkt, dg);
    }
    if (st) goto done;
    double gp[PN_NPARAM * 64 + 1];
    double *gph = H > 64 ? calloc((size_t)(PN_NPARAM * H), sizeof(double)) : NULL;
    if (H > 64 && !gph) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
        goto done;
    }
    double *gpar = gph ? gph : gp;
    memset(gpar, 0, sizeof(double) * (size_t)(PN_NPARAM * H));
    pn_attn_terms_backward(&c, dqt, dkt, dq, dk, da_l, da_r);
    if (dg) pn_attn_lorentz_backward(&c, dg, dv, gpar + PN_P_curvature * H);
    for (int64_t i = 0; i < N && dparam; i++)
        for (int64_t h = 0; h < H; h++)
            for (int p = 0; p < PN_NPARAM; p++) gpar[p * H + h] += dparam[(i * H + h) * PN_NPARAM + p];

    for (int p = 0; p < PN_NPARAM; p++)
        if (dparam_t[p]) pn_attn_param_grad_into(dparam_t[p], gpar + p * H, H);
    pn_tensor *da_t[2] = {da_l_t, da_r_t};
    for (int i = 0; i < 2 && c.a_l; i++) {
        if (!da_t[i]) continue;
        const double *src_ = i ? da_r : da_l;
        for (int64_t x = 0; x < H * c.D; x++) pn_st(pn_ptr(da_t[i]), dt, x, src_[x]);
    }
    free(gph);
done:
    pn_release(gc);
    free(dparam), free(eG), free(ew), free(edg), free(roff), free(rev), free(dst);
    free(dqt[0]), free(dqt[1]), free(dkt[0]), free(dkt[1]), free(ek[0]), free(ek[1]), free(dg), free(da_l), free(da_r);
    pn_attn_call_free(&c);
    csr_free(&g);
    return st;
}

PN_NOTRAP_END
