/* registry.c — the score registry (generated from variants.def), the option defaults and
 * the option checks shared by the dense (dense.c) and graph (graph.c) drivers: score,
 * normalize and aggregate codes, per-head parameter resolution (numbers, defaults, 0-dim
 * or (H) tensors), positivity, and the gradient of a parameter tensor. */
#include "attention.h"

#include <stdio.h>

#define PN_VARIANT(id) extern const pn_score_desc pn_score_##id;
#include "variants.def"

static const pn_score_desc *const registry[] = {
#define PN_VARIANT(id) &pn_score_##id,
#include "variants.def"
};
static const char *const names[] = {
#define PN_VARIANT(id) #id,
#include "variants.def"
};
enum { N_VARIANTS = (int)(sizeof registry / sizeof registry[0]) };

int pn_attention_variant_count(void) { return N_VARIANTS; }
const char *pn_attention_variant_name(int i) { return (i >= 0 && i < N_VARIANTS) ? names[i] : NULL; }
int pn_attention_variant_find(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < N_VARIANTS; i++)
        if (strcmp(names[i], name) == 0) return i;
    return -1;
}
int pn_attention_variant_graph_only(int i) {
    return (i >= 0 && i < N_VARIANTS) ? (registry[i]->flags & PN_VARIANT_FLAG_GRAPH_ONLY) != 0 : 0;
}
const pn_score_desc *pn_score_get(int i) { return (i >= 0 && i < N_VARIANTS) ? registry[i] : NULL; }

void pn_attn_opts_init(pn_attn_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->score = 0;
    o->normalize = PN_NORM_SOFTMAX;
    o->aggregate = PN_AGG_SUM;
    o->model = PN_MODEL_HYPERBOLOID;
    o->scale = o->gamma = o->r = o->beta = o->c = o->curvature = o->slope = NAN;
}

/* "dot, laplacian, …" for error messages */
static const char *variant_list(void) {
    static _Thread_local char buf[256];
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < N_VARIANTS && used < sizeof buf; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

const char *const pn_attn_param_names[PN_NPARAM] = {"gamma", "r", "beta", "c", "curvature"};

pn_tensor *pn_attn_param_tensor(const pn_attn_opts *o, int p) {
    switch (p) {
    case PN_P_GAMMA: return o->gamma_t;
    case PN_P_R: return o->r_t;
    case PN_P_BETA: return o->beta_t;
    case PN_P_C: return o->c_t;
    default: return o->curvature_t;
    }
}

static double *param_field(pn_score_params *sp, int p) {
    switch (p) {
    case PN_P_GAMMA: return &sp->gamma;
    case PN_P_R: return &sp->r;
    case PN_P_BETA: return &sp->beta;
    case PN_P_C: return &sp->c;
    default: return &sp->curvature;
    }
}
static double opt_value(const pn_attn_opts *o, int p) {
    switch (p) {
    case PN_P_GAMMA: return o->gamma;
    case PN_P_R: return o->r;
    case PN_P_BETA: return o->beta;
    case PN_P_C: return o->c;
    default: return o->curvature;
    }
}

pn_status pn_attn_setup_init(const char *op, const pn_attn_opts *o, int dt, int64_t H, int64_t D, int graph,
                             pn_attn_setup *st) {
    memset(st, 0, sizeof *st);
    if (!o) return pn_error(PN_ERR_ARG, "%s: options are nil (fill them with pn_attn_opts_init)", op);
    const pn_score_desc *desc = pn_score_get(o->score);
    if (!desc) return pn_error(PN_ERR_ARG, "%s: unknown score index %d (valid: %s)", op, o->score, variant_list());
    if ((desc->flags & PN_VARIANT_FLAG_GRAPH_ONLY) && !graph)
        return pn_error(PN_ERR_ARG, "%s: score '%s' needs a graph; use graph_attention", op, desc->name);
    if (o->normalize < PN_NORM_SOFTMAX || o->normalize > PN_NORM_SIGMOID_NORMALIZED)
        return pn_error(PN_ERR_ARG, "%s: unknown normalize code %d (valid: softmax, sigmoid, sigmoid_normalized)", op,
                        o->normalize);
    if (o->aggregate != PN_AGG_SUM && o->aggregate != PN_AGG_EINSTEIN)
        return pn_error(PN_ERR_ARG, "%s: unknown aggregate code %d (valid: sum, einstein)", op, o->aggregate);
    PN_TRY(desc->plan(op, o, &st->plan));
    st->desc = desc;
    st->H = H;
    st->normalize = o->normalize;
    st->einstein = o->aggregate == PN_AGG_EINSTEIN;
    /* the Einstein midpoint always divides by Σ α γ, for sigmoid weights too (DESIGN §3.1) */
    st->normalized = o->normalize != PN_NORM_SIGMOID || st->einstein;

    unsigned used = st->plan.params | (st->einstein ? PN_PBIT(PN_P_CURV) : 0u);
    unsigned positive = st->plan.positive | (st->einstein ? PN_PBIT(PN_P_CURV) : 0u);
    for (int p = 0; p < PN_NPARAM; p++) {
        pn_tensor *t = pn_attn_param_tensor(o, p);
        if (!t) continue;
        if (!(used & PN_PBIT(p)))
            return pn_error(PN_ERR_ARG, "%s: %s_t is given but score '%s'%s has no parameter %s", op,
                            pn_attn_param_names[p], desc->name, st->einstein ? " with einstein aggregation" : "",
                            pn_attn_param_names[p]);
        if (t->dev != PN_CPU)
            return pn_error(PN_ERR_DEVICE, "%s: %s_t %s is on cuda; this op runs on the cpu", op,
                            pn_attn_param_names[p], pn_shape_str(t));
        if (t->dt != dt)
            return pn_error(PN_ERR_DTYPE, "%s: %s_t %s has dtype %s, expected %s like q", op, pn_attn_param_names[p],
                            pn_shape_str(t), pn_dtype_name(t->dt), pn_dtype_name(dt));
        bool ok = t->nd == 0 || (t->nd == 1 && (t->sizes[0] == 1 || t->sizes[0] == H));
        if (!ok)
            return pn_error(PN_ERR_SHAPE, "%s: %s_t %s must be 0-dim, (1) or one per head (%lld)", op,
                            pn_attn_param_names[p], pn_shape_str(t), (long long)H);
    }

    st->hp = malloc(sizeof *st->hp * (size_t)(H > 0 ? H : 1));
    if (!st->hp) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    for (int64_t h = 0; h < H; h++) {
        pn_score_params *sp = &st->hp[h];
        *sp = desc->defaults;
        sp->model = o->model;
        sp->squared = o->squared != 0;
        if (!isnan(o->scale)) sp->scale = o->scale;
        if (isnan(sp->scale)) sp->scale = 1.0 / sqrt((double)(D > 0 ? D : 1));
        if (!isnan(o->slope)) sp->slope = o->slope;
        if (isnan(sp->curvature)) sp->curvature = 1.0; /* the Einstein midpoint's default */
        for (int p = 0; p < PN_NPARAM; p++) {
            double *f = param_field(sp, p);
            pn_tensor *t = pn_attn_param_tensor(o, p);
            if (t) {
                int64_t i = (t->nd == 1 && t->sizes[0] == H) ? h : 0;
                *f = pn_ld(pn_ptr(t), t->dt, i * (t->nd ? t->strides[0] : 0));
                if (pn_requires_grad(t)) sp->learn |= PN_PBIT(p);
            } else if (!isnan(opt_value(o, p))) {
                *f = opt_value(o, p);
            }
            if ((positive & PN_PBIT(p)) && !(*f > 0)) {
                pn_status s = pn_error(PN_ERR_ARG, "%s: %s must be > 0 for score '%s'%s, got %g%s", op,
                                       pn_attn_param_names[p], desc->name,
                                       p == PN_P_CURV && st->einstein ? " / einstein aggregation" : "", *f,
                                       H > 1 ? " (some head)" : "");
                pn_attn_setup_free(st);
                return s;
            }
            if ((used & PN_PBIT(p)) && !isfinite(*f)) {
                pn_status s = pn_error(PN_ERR_ARG, "%s: %s for score '%s' is not finite (%g)", op,
                                       pn_attn_param_names[p], desc->name, *f);
                pn_attn_setup_free(st);
                return s;
            }
        }
        if (st->plan.prepare) st->plan.prepare(sp);
    }
    return PN_OK;
}

void pn_attn_setup_free(pn_attn_setup *st) {
    free(st->hp);
    st->hp = NULL;
}

pn_tensor *pn_attn_param_grad(const pn_tensor *t, const double *g, int64_t H) {
    pn_tensor *out = pn_zeros(t->nd, t->sizes, t->dt, t->dev);
    if (!out) return NULL;
    char *p = pn_ptr(out);
    if (t->nd == 1 && t->sizes[0] == H && H > 1) {
        for (int64_t h = 0; h < H; h++) pn_st(p, out->dt, h, g[h]);
    } else {
        double s = 0;
        for (int64_t h = 0; h < H; h++) s += g[h];
        pn_st(p, out->dt, 0, s);
    }
    return out;
}

void pn_attn_opts_retain(pn_attn_opts *o) {
    pn_tensor *ts[] = {o->gamma_t, o->r_t, o->beta_t, o->c_t, o->curvature_t, o->mask, o->bias, o->a_l, o->a_r};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) pn_retain(ts[i]);
}
void pn_attn_opts_release(pn_attn_opts *o) {
    pn_tensor *ts[] = {o->gamma_t, o->r_t, o->beta_t, o->c_t, o->curvature_t, o->mask, o->bias, o->a_l, o->a_r};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) pn_release(ts[i]);
}
