/* attention.h — private: the score descriptor shared by the fused attention drivers
 * (dense.c: FlashAttention-style tiles; graph.c: CSR neighbourhoods) and the score
 * epilogues (dot.h, laplacian.h, cone.h, hyperdist.h, gat.h, sqdist.h). DESIGN §3.1, §3.3.
 *
 * Every score is s = f(G, row terms of q, column terms of k, parameters) where
 *   G      a dot product over some coordinates of q and k, computed by a GEMM:
 *          PN_GEMM_ALL (all D coordinates), PN_GEMM_HEAD (all but the last: q₋·k₋), or
 *          PN_GEMM_NONE (the score does not use one: gat);
 *   terms  two numbers per query row (q0, q1) and per key (k0, k1), each of a kind:
 *          PN_TERM_NORM2 ‖x_g‖² over the GEMM coordinates, PN_TERM_LAST x_d (the last
 *          coordinate, the height in the half-space), PN_TERM_PROJ a·x with a = a_l[h]
 *          (queries) or a_r[h] (keys) over all coordinates (gat).
 * So ‖q−k‖² = q0 + k0 − 2G, ⟨q,k⟩_M = G − q1·k1, and so on: the epilogue sees only
 * numbers, never coordinates. The backward is then, for ds = ∂L/∂s,
 *   dq_i = Σ_j ds_ij·f_G·k_g,j  +  Σ_m (Σ_j ds_ij·f_qm)·∂q_m/∂q_i
 *   dk_j = Σ_i ds_ij·f_G·q_g,i  +  Σ_m (Σ_i ds_ij·f_km)·∂k_m/∂k_j
 * with the first sums as GEMMs (dQ += (dS∘f_G)·K, dK += (dS∘f_G)ᵀ·Q) and the second as
 * per-row / per-column sums that the drivers turn into 2·x_g (NORM2), e_d (LAST), a (PROJ).
 *
 * An epilogue handles a BLOCK of rows: some queries against the same n keys, with the terms
 * as arrays. The dense driver calls it once per tile, the graph driver once per destination
 * node (one row) over its gathered neighbours — the same code for both. Each function exists
 * for float and double: the score's header core/attention/<name>.h holds its maths once, in
 * terms of `real`, and epilogues.c compiles it for both (epi_impl.h).
 *
 * Adding a score: its variants.def row (parameters with defaults and positivity, domain,
 * default map, flags), core/attention/<name>.h after laplacian.h's pattern — the typed part
 * with EPI(<name>_fwd) and EPI(<name>_vjp), and the plan pn_score_plan_<name> (GEMM mode, term
 * kinds, manifold requirements, the parameters read, the four epilogues) — and its include
 * line in epi_impl.h. The dense and graph drivers, the Lua names and descriptions
 * (pn.attention_variants) and the specs pick it up. */
#ifndef PN_ATTENTION_H
#define PN_ATTENTION_H

#include "../internal.h"

enum { PN_GEMM_NONE = 0, PN_GEMM_ALL = 1, PN_GEMM_HEAD = 2 };
enum { PN_TERM_NONE = 0, PN_TERM_NORM2 = 1, PN_TERM_LAST = 2, PN_TERM_PROJ = 3 };

/* Parameters: one global id per name in variants.def (PN_P_<name>), the index into
 * pn_attn_opts.param / param_t and pn_score_params.v. The learnable ones (given as tensors)
 * get gradients through dparam[PN_P_*]. */
enum {
#define PN_PARAM(id, what) PN_P_##id,
#include "variants.def"
    PN_NPARAM
};
#define PN_PBIT(p) (1u << (p))
_Static_assert(PN_NPARAM <= PN_ATTN_MAX_PARAMS, "variants.def: more parameters than pn_attn_opts holds");
_Static_assert(PN_NPARAM <= 32, "PN_PBIT masks are 32 bits");

/* Requirements on the inputs, checked by the drivers on the terms (so the check sees
 * exactly the numbers the epilogue will): the last coordinate must be > 0 (half-space,
 * cones, the hyperboloid's upper sheet), or κ‖x‖² < 1 (Poincaré ball; NORM2 over all). */
enum { PN_REQ_LAST_POS = 1u, PN_REQ_BALL = 2u };

/* a variants.def default meaning 1/√D of the inputs (dot's scale) */
#define PN_DEFAULT_RSQRT_D NAN

/* Parameters of one head, resolved to numbers (defaults filled in, tensors read). */
typedef struct {
    double v[PN_NPARAM];  /* by PN_P_*: NaN where the score has no such parameter */
    int model, squared;
    unsigned learn; /* PN_PBIT(PN_P_*) of the parameters given as tensors that require grad:
                       only these need dparam (the VJPs skip the others' maths) */
    double aux[4]; /* per-head constants the score derives once (plan.prepare), e.g. 1/(2 sinh r) */
} pn_score_params;

/* A block of pairs: `rows` queries against the same n keys (a dense tile: rows = its query
 * rows; a graph neighbourhood: rows = 1). Per-key work (say √(r² − k_d²)) is done once per
 * block, then every row sweeps the keys.
 *   G      (rows, ld)  GEMM values q_g·k_g,j, row i at G + i·ld (unused for PN_GEMM_NONE)
 *   q0, q1 (rows)      the queries' row terms (NULL when the kind is NONE)
 *   k0, k1 (n)         the keys' column terms (NULL when the kind is NONE)
 *   s      (rows, ld)  out: the scores (may alias G) */
typedef void (*pn_epi_fwd_f32)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const float *G,
                               const float *q0, const float *q1, const float *k0, const float *k1, float *s);
typedef void (*pn_epi_fwd_f64)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const double *G,
                               const double *q0, const double *q1, const double *k0, const double *k1, double *s);
/* The vector-Jacobian product of a block, recomputing what it needs from the same inputs.
 *   ds     (rows, ld)  ∂L/∂s; a pair with ds == 0 (masked, underflowed) contributes nothing,
 *                      so partials that are infinite there never turn into NaN
 *   dG     (rows, ld)  out: ds·∂s/∂G (may alias ds)
 *   dq     (rows, 2)   += Σ_j ds_ij·∂s/∂q0_i, ∂s/∂q1_i (double accumulators)
 *   dk0, dk1 (n)       += Σ_i ds_ij·∂s/∂k0_j, ∂s/∂k1_j (NULL when the kind is NONE)
 *   dparam [PN_NPARAM] += Σ ds·∂s/∂param (double accumulators) */
typedef void (*pn_epi_vjp_f32)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const float *G,
                               const float *q0, const float *q1, const float *k0, const float *k1, const float *ds,
                               float *dG, double *dq, float *dk0, float *dk1, double *dparam);
typedef void (*pn_epi_vjp_f64)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const double *G,
                               const double *q0, const double *q1, const double *k0, const double *k1,
                               const double *ds, double *dG, double *dq, double *dk0, double *dk1, double *dparam);

/* Optional pair (NULL for most scores; the dense backward only): a forward epilogue that also
 * stores per-pair values its VJP would otherwise recompute, and the VJP that reads them back.
 * The backward recomputes the scores right before the VJP on the same block, so what the
 * forward evaluated (square roots, say) need not be evaluated twice.
 *   save  (PN_EPI_NSAVE, rows, ld)  written by fwd_save, read by vjp_saved (same block) */
#define PN_EPI_NSAVE 2
typedef void (*pn_epi_fwds_f32)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const float *G,
                                const float *q0, const float *q1, const float *k0, const float *k1, float *s,
                                float *save);
typedef void (*pn_epi_fwds_f64)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const double *G,
                                const double *q0, const double *q1, const double *k0, const double *k1, double *s,
                                double *save);
typedef void (*pn_epi_vjps_f32)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const float *G,
                                const float *q0, const float *q1, const float *k0, const float *k1, const float *ds,
                                float *dG, double *dq, float *dk0, float *dk1, double *dparam, const float *save);
typedef void (*pn_epi_vjps_f64)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const double *G,
                                const double *q0, const double *q1, const double *k0, const double *k1,
                                const double *ds, double *dG, double *dq, double *dk0, double *dk1, double *dparam,
                                const double *save);

/* Distance scores (plan.diff = 1; NORM2 terms in slot 0): the expansion ‖q‖² + ‖k‖² − 2q·k
 * cancels for close points — in f32 the squared distance of points 1e-3 apart keeps one or two
 * digits, and 1/Δ in the gradient multiplies that error. So the drivers hand these epilogues
 * G = −½‖q_g − k_g‖² itself: the dense driver forms it from its GEMM and the norms where the
 * expansion keeps its precision (‖q−k‖² ≥ PN_DIFF_NEAR·(‖q‖² + ‖k‖²)) and from the
 * coordinates' differences below that; the graph driver always from the differences. The
 * VJP then gives dG = ∂L/∂G and, in d.q0 / d.k0, only what depends on the norms directly (the
 * Poincaré ball's conformal factors): the drivers apply ∂G/∂q = k − q themselves — for near
 * pairs from the differences too, so a close pair's large ∂L/∂G never meets a cancellation. */
#define PN_DIFF_NEAR (1.0 / 1024)

/* Scores that precompute per-key values do it in chunks of this many keys (stack buffers). */
#define PN_EPI_CHUNK 256

/* What a score needs for given options (hyperbolic picks its model here). */
typedef struct {
    int gemm;                   /* PN_GEMM_* */
    int diff;                   /* 1: a distance score — its G is −½‖q_g − k_g‖² (see below) */
    int qterm[2], kterm[2];     /* PN_TERM_* of the row / column term slots */
    unsigned req;               /* PN_REQ_* */
    const char *note;           /* "" or what the options chose, for messages: " (halfspace)" */
    unsigned params;            /* PN_PBIT(PN_P_*) the score reads (its variants.def row says which must be > 0) */
    void (*prepare)(pn_score_params *p); /* or NULL: fill p->aux from the resolved numbers */
    pn_epi_fwd_f32 fwd32;
    pn_epi_vjp_f32 vjp32;
    pn_epi_fwd_f64 fwd64;
    pn_epi_vjp_f64 vjp64;
    /* optional, all four or none: see pn_epi_fwds_f32 */
    pn_epi_fwds_f32 fwds32;
    pn_epi_vjps_f32 vjps32;
    pn_epi_fwds_f64 fwds64;
    pn_epi_vjps_f64 vjps64;
} pn_score_plan;

/* One parameter of a variant (a PN_P entry of its variants.def row). */
typedef struct {
    int id;                     /* PN_P_* */
    double dflt;                /* PN_DEFAULT_RSQRT_D: 1/√D */
    int positive;               /* must be > 0 */
} pn_param_spec;

/* A variants.def row. */
typedef struct {
    const char *name;           /* the Lua score= name */
    unsigned flags;             /* PN_VF_* (penumbra.h) */
    const char *map, *domain;   /* default manifold map, where q and k must lie */
    const pn_param_spec *params;
    int nparams;
    /* fill *plan for options o (o->model etc.); error naming op on a bad option.
     * pn_score_plan_<name>, defined in <name>.h (epilogues.c). */
    pn_status (*plan)(const char *op, const pn_attn_opts *o, pn_score_plan *plan);
} pn_score_desc;

/* The registry (registry.c, generated from variants.def). NULL when i is out of range. */
const pn_score_desc *pn_score_get(int i);

/* ---- shared by dense.c and graph.c (registry.c) ---------------------------------------- */

/* The options after checking: the score, its plan, per-head parameters. */
typedef struct {
    const pn_score_desc *desc;
    pn_score_plan plan;
    int64_t H;                  /* heads the parameters are resolved for */
    pn_score_params *hp;        /* (H) per-head parameters (malloc'd) */
    int normalize, einstein;    /* normalized: the weights are divided by their row sum */
    int normalized;
} pn_attn_setup;

/* Check the options for op (score, normalize, aggregate, parameter tensors of dtype dt
 * broadcastable to (H), positivity) and resolve per-head parameters. D: feature dim (dot's
 * default scale). graph != 0 allows graph-only scores. */
pn_status pn_attn_setup_init(const char *op, const pn_attn_opts *o, int dt, int64_t H, int64_t D, int graph,
                             pn_attn_setup *st);
void pn_attn_setup_free(pn_attn_setup *st);
/* The learnable parameter tensor for PN_P_* p in o, or NULL. */
pn_tensor *pn_attn_param_tensor(const pn_attn_opts *o, int p);
/* Append o's parameter tensors to the autograd inputs ins[*n…] (room for PN_NPARAM more);
 * slot[p] gets the input index of parameter p, or -1. No positions to keep in sync. */
void pn_attn_param_inputs(const pn_attn_opts *o, pn_tensor **ins, int *n, int slot[PN_NPARAM]);
/* Per-head numbers for st->hp from o: defaults, numbers, and the parameter tensors read here
 * (the CPU kernel reads them where it runs; the checks of pn_attn_setup_init saw only their
 * shapes). Errors name op: a parameter that must be > 0 or is not finite. */
pn_status pn_attn_setup_resolve(const char *op, const pn_attn_opts *o, int64_t D, pn_attn_setup *st);
/* out (a parameter's shape: 0-dim, (1) or (H); the CPU kernel's) += the per-head sums g[H] */
void pn_attn_param_grad_into(pn_tensor *out, const double *g, int64_t H);
/* Retain every tensor in o (for a saved copy) / release them. */
void pn_attn_opts_retain(pn_attn_opts *o);
void pn_attn_opts_release(pn_attn_opts *o);

/* ---- one call of a driver: inputs checked, their layouts taken, terms computed ---------------- */
#define PN_TQ 64          /* query rows per tile (the backward: pn_attn_bwd_tq's) */
#define PN_TQ_BWD_MAX 128 /* the backward's tallest query tile */
#define PN_TK 256          /* keys per tile */
#define PN_MAX_SPLITS 64  /* backward: most copies of dK/dV per head (see dense.c) */

/* Query rows per tile of the dense CPU backward for Nq queries: 128 where the tile's five
 * products gain from reading each K and V tile for twice the rows (Nq >= 512 and a core's L2
 * of at least 2 MiB, where the tile's score buffers still fit: 0.86-0.97x the backward's time
 * on one thread of an Emerald Rapids Xeon), else PN_TQ. PENUMBRA_ATTN_BWD_TQ=64|128 forces one (the specs
 * run both); any other value sets the error and returns 0. */
int64_t pn_attn_bwd_tq(const char *op, int64_t Nq);

/* Where the rows of a dense operand lie: the element strides of its batch, head and row dims in
 * its (B, H, N, X) view (X's is 1). The CPU kernel reads q, k, v (and the output gradient) and
 * writes the output and the gradients through them, so heads split from a projection — a
 * (B, N, H, D) buffer seen as (B, H, N, D) — need no copy in or out (dense.c, kernel_input). */
typedef struct {
    int64_t b, h, n;
} pn_attn_lay;

typedef struct {
    const char *op;
    int dt;
    int nd;                       /* q's dims as given (2, 3, 4), for messages and shapes */
    int graph;                    /* node-major input (graph.c): messages index [node, head] */
    int nm;                       /* node-major layout (graph.c, B = 1): q, k, v are (N, H, X) and every
                                   * (BH, N) array below (terms, g, qbad, kbad) is (N, H) — row r of
                                   * head h at pn_attn_row(c, h, r, N) = r·H + h; else h·N + r */
    int64_t B, H, BH, Nq, Nk, D, Dv, Dg;
    int64_t off;                  /* causal: query i sees keys j <= i + off, off = Nk − Nq */
    int causal;
    pn_attn_setup st;
    const pn_attn_opts *opts;     /* the options (borrowed for the call): parameters are read in pn_attn_prepare */
    const uint8_t *mask;          /* u8, canonical strides ms (b, h, i, j), 0 where broadcast */
    int64_t ms[4];
    const void *bias;             /* q's dtype, canonical strides bs */
    int64_t bs[4];
    double *alibi;                /* (H) ALiBi slopes, or NULL */
    const void *q, *k, *v;        /* (BH, Nq, D), (BH, Nk, D), (BH, Nk, Dv): rows where lq, lk, lv say
                                   * (dense: dense.c's dense_lay; the gradients dq, dk, dv have the same layouts), or
                                   * node-major (nm) */
    pn_attn_lay lq, lk, lv;       /* dense: the layouts of q, k, v (pn_attn_at) */
    pn_attn_lay lo;               /* dense forward: the layout of out (BH, Nq, Dv) */
    const void *a_l, *a_r;        /* contiguous (H, D) for PROJ terms, or NULL */
    void *qt[2], *kt[2];          /* (BH, Nq), (BH, Nk) terms; NULL where the kind is NONE */
    void *g;                      /* (BH, Nk) Lorentz factors γ(v_j) for einstein, or NULL */
    uint8_t *qbad, *kbad;         /* (BH, Nq), (BH, Nk): 1 for a row with a NaN or ±inf coordinate;
                                   * NULL when every row is finite. Such a row's scores are NaN
                                   * (NaN in, NaN out), see pn_attn_prepare */
    pn_tensor *own[5];            /* references held for q, k, v, a_l, a_r */
} pn_attn_call;

/* the dims of a dense call (dense.c and its CUDA twin): q (…, Nq, D), k (…, Nk, D), v (…, Nk, Dv)
 * or NULL (the weights: Dv = 0) with the batch dims (B, H, ·, ·), (B, ·, ·) or (·, ·) already
 * checked; off = Nk − Nq (causal: query i sees keys j <= i + off) */
typedef struct {
    int64_t B, H, BH, Nq, Nk, D, Dv, off;
    int causal;
} pn_attn_dims;

static inline pn_attn_dims pn_attn_dense_dims(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                              const pn_attn_opts *o) {
    const int nd = q->nd;
    pn_attn_dims d;
    d.B = nd == 4 ? q->sizes[0] : (nd == 3 ? q->sizes[0] : 1);
    d.H = nd == 4 ? q->sizes[1] : 1;
    d.BH = d.B * d.H;
    d.Nq = q->sizes[nd - 2];
    d.Nk = k->sizes[nd - 2];
    d.D = q->sizes[nd - 1];
    d.Dv = v ? v->sizes[nd - 1] : 0;
    d.off = d.Nk - d.Nq;
    d.causal = o->causal != 0;
    return d;
}

/* the index of row r (of N) of head bh in the per-row arrays; times D, its offset in q / k / v */
static inline int64_t pn_attn_row(const pn_attn_call *c, int64_t bh, int64_t r, int64_t N) {
    return c->nm ? r * c->BH + bh : bh * N + r;
}

/* the element offset of row r of head bh (b = bh / H, h = bh % H) in a dense operand of layout l */
static inline int64_t pn_attn_at(const pn_attn_call *c, pn_attn_lay l, int64_t bh, int64_t r) {
    return (bh / c->H) * l.b + (bh % c->H) * l.h + r * l.n;
}

/* the same for q, k or v (layout l, X coordinates a row) in either arrangement: node-major rows
 * (graph.c) at pn_attn_row·X, dense rows where l says */
static inline int64_t pn_attn_xat(const pn_attn_call *c, pn_attn_lay l, int64_t bh, int64_t r, int64_t N, int64_t X) {
    return c->nm ? pn_attn_row(c, bh, r, N) * X : pn_attn_at(c, l, bh, r);
}

/* Given c->{op, dt, nd, graph, nm, B, H, BH, Nq, Nk, D, Dv, q, k, v, a_l, a_r, st, opts} (setup done):
 * the per-head parameters (read here, where the kernel runs), Dg, terms, manifold checks (errors name op, the argument and its shape from qs/ks/vs),
 * Lorentz factors for einstein, ALiBi slopes. */
pn_status pn_attn_prepare(pn_attn_call *c, const char *qs, const char *ks, const char *vs);
void pn_attn_call_free(pn_attn_call *c);
/* term backward: dq (BH, Nq, D) / dk (BH, Nk, D) of dtype c->dt += from the term gradients
 * dqt[2] (BH, Nq), dkt[2] (BH, Nk) (NULL entries skipped); da_l, da_r (H, D) += (or NULL) */
void pn_attn_terms_backward(const pn_attn_call *c, double *const dqt[2], double *const dkt[2], void *dq, void *dk,
                            double *da_l, double *da_r);
/* einstein: dv (BH, Nk, Dv) += from dg (BH, Nk) = ∂L/∂γ(v_j); dcurv (H) += */
void pn_attn_lorentz_backward(const pn_attn_call *c, const double *dg, void *dv, double *dcurv);

#endif /* PN_ATTENTION_H */
