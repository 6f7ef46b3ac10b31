/* registry.c — the score registry (generated from variants.def), the option defaults and
 * the option checks shared by the dense (dense.c) and graph (graph.c) drivers: score,
 * normalize and aggregate codes, per-head parameter resolution (numbers, defaults, 0-dim
 * or (H) tensors), positivity, and the gradient of a parameter tensor. */
#include "attention.h"

#include <stdio.h>

/* the plans, one per row: pn_score_plan_<id> (the score's header, compiled in epilogues.c) */
#define PN_VARIANT(id, flags, map, domain, ...) \
    pn_status pn_score_plan_##id(const char *op, const pn_attn_opts *o, pn_score_plan *plan);
#include "variants.def"

/* each row's parameters: params_<id>[] */
#define PN_P(pid, dflt, pos) {PN_P_##pid, (dflt), (pos)},
#define PN_VARIANT(id, flags, map, domain, ...) static const pn_param_spec params_##id[] = {__VA_ARGS__};
#include "variants.def"

static const pn_score_desc registry[] = {
#define PN_VARIANT(id, flags, map, domain, ...)                                                              \
    {#id, (flags), (map), (domain), params_##id, (int)(sizeof params_##id / sizeof params_##id[0]), \
     pn_score_plan_##id},
#include "variants.def"
};
enum { N_VARIANTS = (int)(sizeof registry / sizeof registry[0]) };

static const char *const param_names[PN_NPARAM] = {
#define PN_PARAM(id, what) #id,
#include "variants.def"
};
static const char *const param_about[PN_NPARAM] = {
#define PN_PARAM(id, what) what,
#include "variants.def"
};

int pn_attention_variant_count(void) { return N_VARIANTS; }
const pn_score_desc *pn_score_get(int i) { return (i >= 0 && i < N_VARIANTS) ? &registry[i] : NULL; }
const char *pn_attention_variant_name(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i].name : NULL; }
int pn_attention_variant_find(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < N_VARIANTS; i++)
        if (strcmp(registry[i].name, name) == 0) return i;
    return -1;
}
unsigned pn_attention_variant_flags(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i].flags : 0u; }
int pn_attention_variant_graph_only(int i) { return (pn_attention_variant_flags(i) & PN_VF_GRAPH_ONLY) != 0; }
const char *pn_attention_variant_map(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i].map : NULL; }
const char *pn_attention_variant_domain(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i].domain : NULL; }
int pn_attention_variant_nparams(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i].nparams : 0; }
int pn_attention_variant_param(int i, int j, double *dflt, int *positive) {
    if (i < 0 || i >= N_VARIANTS || j < 0 || j >= registry[i].nparams) return -1;
    const pn_param_spec *ps = &registry[i].params[j];
    if (dflt) *dflt = ps->dflt;
    if (positive) *positive = ps->positive;
    return ps->id;
}
int pn_attention_param_count(void) { return PN_NPARAM; }
const char *pn_attention_param_name(int id) { return (id >= 0 && id < PN_NPARAM) ? param_names[id] : NULL; }
const char *pn_attention_param_about(int id) { return (id >= 0 && id < PN_NPARAM) ? param_about[id] : NULL; }
int pn_attention_param_find(const char *name) {
    if (!name) return -1;
    for (int p = 0; p < PN_NPARAM; p++)
        if (strcmp(param_names[p], name) == 0) return p;
    return -1;
}

void pn_attn_opts_init(pn_attn_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->score = 0;
    o->normalize = PN_NORM_SOFTMAX;
    o->aggregate = PN_AGG_SUM;
    o->model = PN_MODEL_HYPERBOLOID;
    for (int p = 0; p < PN_ATTN_MAX_PARAMS; p++) o->param[p] = NAN;
}

/* "dot, laplacian, …" for error messages (the public variants) */
static const char *variant_list(void) {
    static _Thread_local char buf[256];
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < N_VARIANTS && used < sizeof buf; i++)
        if (!(registry[i].flags & PN_VF_TEST))
            used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", used ? ", " : "", registry[i].name);
    return buf;
}

pn_tensor *pn_attn_param_tensor(const pn_attn_opts *o, int p) {
    return p >= 0 && p < PN_NPARAM ? o->param_t[p] : NULL;
}

void pn_attn_param_inputs(const pn_attn_opts *o, pn_tensor **ins, int *n, int slot[PN_NPARAM]) {
    for (int p = 0; p < PN_NPARAM; p++) {
        slot[p] = -1;
        if (o->param_t[p]) {
            slot[p] = *n;
            ins[(*n)++] = o->param_t[p];
        }
    }
}

/* the row's spec of parameter p, or NULL when the score has no such parameter */
static const pn_param_spec *param_spec(const pn_score_desc *d, int p) {
    for (int j = 0; j < d->nparams; j++)
        if (d->params[j].id == p) return &d->params[j];
    return NULL;
}

pn_status pn_attn_setup_init(const char *op, const pn_attn_opts *o, int dt, int64_t H, int64_t D, int graph,
                             pn_attn_setup *st) {
    memset(st, 0, sizeof *st);
    if (!o) return pn_error(PN_ERR_ARG, "%s: options are nil (fill them with pn_attn_opts_init)", op);
    const pn_score_desc *desc = pn_score_get(o->score);
    if (!desc) return pn_error(PN_ERR_ARG, "%s: unknown score index %d (valid: %s)", op, o->score, variant_list());
    if ((desc->flags & PN_VF_GRAPH_ONLY) && !graph)
        return pn_error(PN_ERR_ARG, "%s: score '%s' needs a graph; use graph_attention", op, desc->name);
    if (o->normalize < PN_NORM_SOFTMAX || o->normalize > PN_NORM_SIGMOID_NORMALIZED)
        return pn_error(PN_ERR_ARG, "%s: unknown normalize code %d (valid: softmax, sigmoid, sigmoid_normalized)", op,
                        o->normalize);
    if (o->aggregate != PN_AGG_SUM && o->aggregate != PN_AGG_EINSTEIN)
        return pn_error(PN_ERR_ARG, "%s: unknown aggregate code %d (valid: sum, einstein)", op, o->aggregate);
    PN_TRY(desc->plan(op, o, &st->plan));
    if (!st->plan.note) st->plan.note = "";
    st->desc = desc;
    st->H = H;
    st->normalize = o->normalize;
    st->einstein = o->aggregate == PN_AGG_EINSTEIN;
    /* the Einstein midpoint always divides by Σ α γ, for sigmoid weights too (DESIGN §3.1) */
    st->normalized = o->normalize != PN_NORM_SIGMOID || st->einstein;

    /* the Einstein midpoint reads the curvature too (> 0, default 1): an aggregation's
     * parameter, whatever the score */
    unsigned used = st->plan.params | (st->einstein ? PN_PBIT(PN_P_curvature) : 0u);
    for (int p = 0; p < PN_NPARAM; p++) {
        pn_tensor *t = pn_attn_param_tensor(o, p);
        /* a number given for a parameter the score does not read is an error too, not ignored */
        if (!t && !isnan(o->param[p]) && !(used & PN_PBIT(p)))
            return pn_error(PN_ERR_ARG, "%s: %s = %g is given but score '%s'%s%s has no parameter %s", op,
                            param_names[p], o->param[p], desc->name, st->plan.note,
                            st->einstein ? " with einstein aggregation" : "", param_names[p]);
        if (!t) continue;
        if (!(used & PN_PBIT(p)))
            return pn_error(PN_ERR_ARG, "%s: %s %s is given but score '%s'%s%s has no parameter %s", op,
                            param_names[p], pn_shape_str(t), desc->name, st->plan.note,
                            st->einstein ? " with einstein aggregation" : "", param_names[p]);
        if (t->dt != dt)
            return pn_error(PN_ERR_DTYPE, "%s: %s %s has dtype %s, expected %s like q", op, param_names[p],
                            pn_shape_str(t), pn_dtype_name(t->dt), pn_dtype_name(dt));
        bool ok = t->nd == 0 || (t->nd == 1 && (t->sizes[0] == 1 || t->sizes[0] == H));
        if (!ok)
            return pn_error(PN_ERR_SHAPE, "%s: %s %s must be 0-dim, (1) or one per head (%lld)", op,
                            param_names[p], pn_shape_str(t), (long long)H);
    }
    (void)D;
    return PN_OK;
}

pn_status pn_attn_setup_resolve(const char *op, const pn_attn_opts *o, int64_t D, pn_attn_setup *st) {
    const pn_score_desc *desc = st->desc;
    const int64_t H = st->H;
    unsigned used = st->plan.params | (st->einstein ? PN_PBIT(PN_P_curvature) : 0u);
    unsigned positive = st->einstein ? PN_PBIT(PN_P_curvature) : 0u;
    double dflt[PN_NPARAM];
    for (int p = 0; p < PN_NPARAM; p++) {
        const pn_param_spec *ps = param_spec(desc, p);
        dflt[p] = ps ? ps->dflt : NAN;
        if (ps && ps->positive) positive |= PN_PBIT(p);
    }
    /* a default of 1/√D (PN_DEFAULT_RSQRT_D) is NaN in the row; einstein's κ defaults to 1 */
    if (st->einstein && isnan(dflt[PN_P_curvature])) dflt[PN_P_curvature] = 1.0;
    free(st->hp);
    st->hp = malloc(sizeof *st->hp * (size_t)(H > 0 ? H : 1));
    if (!st->hp) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    for (int64_t h = 0; h < H; h++) {
        pn_score_params *sp = &st->hp[h];
        memset(sp, 0, sizeof *sp);
        sp->model = o->model;
        sp->squared = o->squared != 0;
        for (int p = 0; p < PN_NPARAM; p++) {
            double *f = &sp->v[p];
            pn_tensor *t = pn_attn_param_tensor(o, p);
            *f = dflt[p];
            if (t && t->dev != PN_CPU)
                return pn_error(PN_ERR_DEVICE, "%s: %s %s is on cuda; the cpu kernel reads it", op, param_names[p],
                                pn_shape_str(t));
            if (t) {
                /* read where the kernel runs (this is the CPU's): 0-dim, (1) or (H) */
                int64_t i = (t->nd == 1 && t->sizes[0] == H) ? h : 0;
                *f = pn_ld(pn_ptr(t), t->dt, i * (t->nd ? t->strides[0] : 0));
                if (pn_requires_grad(t)) sp->learn |= PN_PBIT(p);
            } else if (!isnan(o->param[p])) {
                *f = o->param[p];
            }
            /* checked: what the score reads, and what its row declares when given (curvature for
             * the hyperboloid model, say, is still a curvature) */
            const bool given = t || !isnan(o->param[p]);
            if (!(used & PN_PBIT(p)) && !(given && param_spec(desc, p))) continue;
            if (isnan(*f) && !given) *f = 1.0 / sqrt((double)(D > 0 ? D : 1));
            if ((positive & PN_PBIT(p)) && !(*f > 0))
                return pn_error(PN_ERR_ARG, "%s: %s must be > 0 for score '%s'%s, got %g%s", op, param_names[p],
                                desc->name, p == PN_P_curvature && st->einstein ? " / einstein aggregation" : "",
                                *f, H > 1 ? " (some head)" : "");
            if (!isfinite(*f))
                return pn_error(PN_ERR_ARG, "%s: %s for score '%s' is not finite (%g)", op, param_names[p],
                                desc->name, *f);
        }
        if (st->plan.prepare) st->plan.prepare(sp);
    }
    return PN_OK;
}

void pn_attn_setup_free(pn_attn_setup *st) {
    free(st->hp);
    st->hp = NULL;
}

void pn_attn_param_grad_into(pn_tensor *out, const double *g, int64_t H) {
    char *p = pn_ptr(out);
    if (out->nd == 1 && out->sizes[0] == H && H > 1) {
        for (int64_t h = 0; h < H; h++) pn_st(p, out->dt, h * out->strides[0], pn_ld(p, out->dt, h * out->strides[0]) + g[h]);
    } else {
        double s = 0;
        for (int64_t h = 0; h < H; h++) s += g[h];
        pn_st(p, out->dt, 0, pn_ld(p, out->dt, 0) + s);
    }
}

void pn_attn_opts_retain(pn_attn_opts *o) {
    pn_tensor *ts[] = {o->mask, o->bias, o->a_l, o->a_r};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) pn_retain(ts[i]);
    for (int p = 0; p < PN_NPARAM; p++) pn_retain(o->param_t[p]);
}
void pn_attn_opts_release(pn_attn_opts *o) {
    pn_tensor *ts[] = {o->mask, o->bias, o->a_l, o->a_r};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) pn_release(ts[i]);
    for (int p = 0; p < PN_NPARAM; p++) pn_release(o->param_t[p]);
}
