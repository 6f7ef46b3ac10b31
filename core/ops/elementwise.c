/* elementwise.c — unary maths, binary arithmetic with NumPy broadcasting, comparisons and
 * where. Each forward is next to its backward.
 *
 * Layout of the kernels: every op runs as "rows" of a pn_iter (or one flat row when all
 * operands are contiguous and the same shape — the small-tensor fast path skips pn_iter).
 * A row kernel gets the operands' first-element pointers and their element strides along
 * the row; the output (operand 0) is always a fresh contiguous tensor, so its stride is 1.
 * f32 and f64 kernels are the same source stamped twice (T = float, then T = double) with
 * <tgmath.h> picking expf/exp etc.; the op switch sits outside the loops so simple loops
 * vectorise. Integer dtypes go through a generic int64 path. The per-element formulas
 * (forward and derivative) live in elementwise_math.h, shared with cuda/ops/elementwise.cu. */
#include "../backend.h"

#include <tgmath.h>

#include "elementwise_math.h" /* the per-element formulas, shared with cuda/ops/elementwise.cu */

#define CHUNK 8192 /* elements per parallel work unit along a long row */

/* ---- the driver: rows (and chunks of long rows) of an iterator -------------------------- */
/* p[k]: first element of operand k in this piece; st[k]: its stride (elements) along it. */
typedef void (*row_fn)(const void *ctx, int64_t n, char *const *p, const int64_t *st);

/* One flat row of n elements: what pn_iter_init would produce for contiguous operands
 * (stride 1) and broadcast scalars (stride 0), without its setup cost. */
static void iter_flat(pn_iter *it, int64_t n, int nops, const int64_t *istride) {
    it->nd = 1;
    it->nops = nops;
    it->shape[0] = n;
    for (int k = 0; k < nops; k++) it->strides[k][0] = it->istride[k] = istride[k];
    it->inner = n;
    it->rows = n > 0 ? 1 : 0;
    it->numel = n;
}

static void run(const pn_iter *it, pn_tensor *const *ops, row_fn fn, const void *ctx) {
    int nops = it->nops;
    char *base[PN_ITER_MAX_OPS];
    int64_t es[PN_ITER_MAX_OPS];
    for (int k = 0; k < nops; k++) {
        base[k] = pn_ptr(ops[k]);
        es[k] = (int64_t)pn_elsize(ops[k]->dt);
    }
    if (it->numel <= PN_PAR_MIN) { /* serial: no chunking, no thread wake-up */
        pn_iter_pos pos = PN_ITER_POS_INIT;
        for (int64_t r = 0; r < it->rows; r++) {
            char *p[PN_ITER_MAX_OPS];
            pn_iter_at(it, r, &pos);
            for (int k = 0; k < nops; k++) p[k] = base[k] + pos.off[k] * es[k];
            fn(ctx, it->inner, p, it->istride);
        }
        return;
    }
    int64_t nch = (it->inner + CHUNK - 1) / CHUNK, units = it->rows * nch;
    pn_iter_pos pos = PN_ITER_POS_INIT;
#pragma omp parallel for schedule(static) firstprivate(pos)
    for (int64_t u = 0; u < units; u++) {
        int64_t r = u / nch, c0 = (u % nch) * CHUNK;
        int64_t len = it->inner - c0 < CHUNK ? it->inner - c0 : CHUNK;
        char *p[PN_ITER_MAX_OPS];
        if (r != pos.row) pn_iter_at(it, r, &pos); /* a row's chunks share its offsets */
        for (int k = 0; k < nops; k++) p[k] = base[k] + (pos.off[k] + c0 * it->istride[k]) * es[k];
        fn(ctx, len, p, it->istride);
    }
}

/* A row broadcast (a bias (C) against (R, C)): every input full-shape contiguous, a scalar, or
 * a contiguous suffix of C elements; then R rows of C with unit strides, without pn_iter.
 * Returns false (nothing done) for any other layout. */
static bool run_rows(pn_tensor *out, int nin, pn_tensor *const *ins, pn_tensor *const *ops, row_fn fn,
                     const void *ctx) {
    int64_t n = pn_numel(out), C = -1, st[PN_ITER_MAX_OPS] = {1};
    for (int k = 0; k < nin; k++) {
        if (pn_same_shape(ins[k], out) && pn_is_contiguous(ins[k])) st[k + 1] = 1;
        else if (pn_numel(ins[k]) == 1) st[k + 1] = 0;
        else {
            int64_t c = pn_suffix_numel(ins[k], out);
            if (c <= 1 || (C >= 0 && c != C)) return false;
            C = c;
            st[k + 1] = -1; /* one row of C, repeated */
        }
    }
    if (C <= 0 || n % C) return false;
    const int64_t R = n / C;
    char *base[PN_ITER_MAX_OPS];
    int64_t es[PN_ITER_MAX_OPS], ist[PN_ITER_MAX_OPS];
    for (int k = 0; k <= nin; k++) {
        base[k] = pn_ptr(ops[k]);
        es[k] = (int64_t)pn_elsize(ops[k]->dt);
        ist[k] = st[k] == 0 ? 0 : 1;
    }
    #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < R; r++) {
        char *p[PN_ITER_MAX_OPS];
        for (int k = 0; k <= nin; k++) p[k] = base[k] + (st[k] == 1 ? r * C * es[k] : 0);
        fn(ctx, C, p, ist);
    }
    return true;
}

/* Iterate out (fresh, contiguous, shape = the broadcast shape) with inputs ins[0..nin). */
static void run_over(pn_tensor *out, int nin, pn_tensor *const *ins, row_fn fn, const void *ctx) {
    pn_tensor *ops[PN_ITER_MAX_OPS] = {out};
    int64_t n = pn_numel(out), st[PN_ITER_MAX_OPS] = {1};
    bool flat = true;
    for (int k = 0; k < nin; k++) {
        ops[k + 1] = ins[k];
        if (pn_same_shape(ins[k], out) && pn_is_contiguous(ins[k])) st[k + 1] = 1;
        else if (pn_numel(ins[k]) == 1) st[k + 1] = 0;
        else flat = false;
    }
    pn_iter it;
    if (flat) iter_flat(&it, n, nin + 1, st);
    else if (run_rows(out, nin, ins, ops, fn, ctx)) return;
    else pn_iter_init(&it, out->nd, out->sizes, nin + 1, ops, NULL);
    run(&it, ops, fn, ctx);
}

/* ---- loops ------------------------------------------------------------------------------ */
/* Loops over one piece with out type OT at p[0]; the inputs' strides are tested once so the
 * common unit-stride / broadcast-scalar cases are plain loops the compiler vectorises. */
#define MAP1(OT, IT, EXPR)                                                              \
    do {                                                                                \
        OT *restrict o_ = (OT *)p[0];                                                   \
        const IT *restrict x_ = (const IT *)p[1];                                       \
        int64_t sx_ = st[1];                                                            \
        if (sx_ == 1)                                                                   \
            for (int64_t i = 0; i < n; i++) { IT v = x_[i]; o_[i] = (EXPR); }           \
        else                                                                            \
            for (int64_t i = 0; i < n; i++) { IT v = x_[i * sx_]; o_[i] = (EXPR); }     \
    } while (0)

#define MAP2(OT, IT, EXPR)                                                                   \
    do {                                                                                     \
        OT *restrict o_ = (OT *)p[0];                                                        \
        const IT *restrict x_ = (const IT *)p[1], *restrict y_ = (const IT *)p[2];           \
        int64_t sx_ = st[1], sy_ = st[2];                                                    \
        if (sx_ == 1 && sy_ == 1)                                                            \
            for (int64_t i = 0; i < n; i++) { IT x = x_[i], y = y_[i]; o_[i] = (EXPR); }     \
        else if (sx_ == 1 && sy_ == 0) {                                                     \
            IT y = y_[0];                                                                    \
            for (int64_t i = 0; i < n; i++) { IT x = x_[i]; o_[i] = (EXPR); }               \
        } else if (sx_ == 0 && sy_ == 1) {                                                   \
            IT x = x_[0];                                                                    \
            for (int64_t i = 0; i < n; i++) { IT y = y_[i]; o_[i] = (EXPR); }               \
        } else                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                \
                IT x = x_[i * sx_], y = y_[i * sy_];                                         \
                o_[i] = (EXPR);                                                              \
            }                                                                                \
    } while (0)

/* backward pieces: gradient g (gv), then two more inputs (x, y) */
#define MAP3(T, EXPR)                                                                          \
    do {                                                                                       \
        T *restrict o_ = (T *)p[0];                                                            \
        const T *restrict g_ = (const T *)p[1], *restrict x_ = (const T *)p[2],                \
                          *restrict y_ = (const T *)p[3];                                      \
        int64_t sg_ = st[1], sx_ = st[2], sy_ = st[3];                                         \
        if (sg_ == 1 && sx_ == 1 && sy_ == 1)                                                  \
            for (int64_t i = 0; i < n; i++) { T gv = g_[i], x = x_[i], y = y_[i]; (void)x; (void)y; o_[i] = (EXPR); } \
        else                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                  \
                T gv = g_[i * sg_], x = x_[i * sx_], y = y_[i * sy_];                          \
                (void)x; (void)y; o_[i] = (EXPR);                                                                \
            }                                                                                  \
    } while (0)

/* ======================================================================================= */
/* ---- binary ------------------------------------------------------------------------------ */
static const char *binary_names[PN_BINARY_COUNT] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};

#define BIN_CASE(OP, EXPR) case OP: MAP2(T, T, EXPR); break;
#define T float
static void binary_f32(int op, int64_t n, char *const *p, const int64_t *st) {
    switch (op) { PN_BINARY_OPS(BIN_CASE) }
}
#undef T
#define T double
static void binary_f64(int op, int64_t n, char *const *p, const int64_t *st) {
    switch (op) { PN_BINARY_OPS(BIN_CASE) }
}
#undef T

typedef struct {
    int op, dt;
} op_ctx;

static void binary_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    const op_ctx *c = ctx;
    if (c->dt == PN_F32) { binary_f32(c->op, n, p, st); return; }
    if (c->dt == PN_F64) { binary_f64(c->op, n, p, st); return; }
    for (int64_t i = 0; i < n; i++) /* integers: add sub mul maximum minimum, exact in int64 */
        pn_ew_st_int(p[0], c->dt, i,
                     pn_ew_binary_int(c->op, pn_ew_ld_int(p[1], c->dt, i * st[1]), pn_ew_ld_int(p[2], c->dt, i * st[2])));
}

#define BGRAD_CASE(CODE, EXPR) case CODE: MAP3(T, EXPR); break;
#define T float
static void binary_grad_f32(int code, int64_t n, char *const *p, const int64_t *st) {
    switch (code) { PN_BINARY_GRADS(BGRAD_CASE) }
}
#undef T
#define T double
static void binary_grad_f64(int code, int64_t n, char *const *p, const int64_t *st) {
    switch (code) { PN_BINARY_GRADS(BGRAD_CASE) }
}
#undef T

static void binary_grad_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    const op_ctx *c = ctx; /* op holds the code op*2+side */
    if (c->dt == PN_F32) binary_grad_f32(c->op, n, p, st);
    else binary_grad_f64(c->op, n, p, st);
}

/* gradient wrt input `side`, at the full (broadcast) shape of g, then summed to the input */
static pn_tensor *binary_side_grad(pn_node *nd, int op, int side, pn_tensor *g) {
    pn_tensor *a = nd->saved[0], *b = nd->saved[1];
    pn_tensor *full;
    if (op == PN_ADD || op == PN_SUB) {
        pn_tensor *r = pn_grad_to_input(nd, side, g);
        if (!r || op == PN_ADD || side == 0) return r;
        full = pn_unary(PN_NEG, r, 0, 0);
        pn_release(r);
        return full;
    }
    full = pn_empty_like(g);
    const pn_kernels *k;
    if (!full || pn_backend_for(binary_names[op], g->dev, &k) ||
        PN_KCALL(binary_names[op], k, binary_grad, op * 2 + side, full, g, a, b)) {
        pn_release(full);
        return NULL;
    }
    pn_tensor *r = pn_grad_to_input(nd, side, full);
    pn_release(full);
    return r;
}

static pn_status binary_bw(pn_node *nd, pn_tensor *g, pn_tensor **gin) {
    int op = (int)nd->iv[0];
    for (int side = 0; side < 2; side++) {
        if (!pn_ag_input_needs(nd, side)) continue;
        gin[side] = binary_side_grad(nd, op, side, g);
        if (!gin[side]) return PN_ERR_SHAPE;
    }
    return PN_OK;
}

/* CPU kernels (kernels.def): out fresh and contiguous at the broadcast shape, the inputs
 * broadcast to it with any strides */
pn_status pn_cpu_binary(int op, pn_tensor *out, const pn_tensor *a, const pn_tensor *b) {
    op_ctx c = {op, a->dt};
    run_over(out, 2, (pn_tensor *const[]){(pn_tensor *)a, (pn_tensor *)b}, binary_row, &c);
    return PN_OK;
}

pn_status pn_cpu_binary_grad(int code, pn_tensor *gfull, const pn_tensor *g, const pn_tensor *a, const pn_tensor *b) {
    op_ctx c = {code, g->dt};
    run_over(gfull, 3, (pn_tensor *const[]){(pn_tensor *)g, (pn_tensor *)a, (pn_tensor *)b}, binary_grad_row, &c);
    return PN_OK;
}

/* Checks shared by binary, compare and where: nil, one device (its kernel table in *k), same
 * dtype; the broadcast shape. */
static pn_status check_pair(const char *op, pn_tensor *a, pn_tensor *b, int *nd, int64_t *shape, int *dev,
                            const pn_kernels **k) {
    if (!a || !b) return pn_error(PN_ERR_ARG, "%s: %s is nil", op, !a ? "a" : "b");
    PN_TRY(pn_kernels_for(op, 2, (const pn_tensor *const[]){a, b}, (const char *const[]){"a", "b"}, dev, k));
    if (a->dt != b->dt)
        return pn_error(PN_ERR_DTYPE, "%s: a %s %s and b %s %s have different dtypes; convert one with :to()", op,
                        pn_dtype_name(a->dt), pn_shape_str(a), pn_dtype_name(b->dt), pn_shape_str(b));
    if (pn_same_shape(a, b)) { /* fast: no broadcast to compute */
        *nd = a->nd;
        memcpy(shape, a->sizes, sizeof(int64_t) * (size_t)a->nd);
        return PN_OK;
    }
    return pn_broadcast_shape(op, a->nd, a->sizes, b->nd, b->sizes, nd, shape);
}

pn_tensor *pn_binary(int op, pn_tensor *a, pn_tensor *b) {
    if (op < 0 || op >= PN_BINARY_COUNT) return pn_error_null(PN_ERR_ARG, "binary: unknown op %d", op);
    const char *name = binary_names[op];
    int nd, dev;
    int64_t shape[PN_MAX_DIMS];
    const pn_kernels *k;
    if (check_pair(name, a, b, &nd, shape, &dev, &k)) return NULL;
    if (!pn_is_float(a->dt) && (op == PN_DIV || op == PN_POW))
        return pn_error_null(PN_ERR_DTYPE, "%s: a %s %s and b %s %s: integer dtypes are not supported; use f32/f64",
                             name, pn_dtype_name(a->dt), pn_shape_str(a), pn_dtype_name(b->dt), pn_shape_str(b));
    pn_tensor *out = pn_empty(nd, shape, a->dt, dev);
    if (!out) return NULL;
    if (PN_KCALL(name, k, binary, op, out, a, b)) {
        pn_release(out);
        return NULL;
    }
    pn_tensor *ins[2] = {a, b};
    if (pn_ag_needed(2, ins)) {
        pn_node *n = pn_ag_record(out, name, binary_bw, 2, ins);
        if (!n) {
            pn_release(out);
            return NULL;
        }
        n->iv[0] = op;
        if (op != PN_ADD && op != PN_SUB && (pn_ag_save(n, a) || pn_ag_save(n, b))) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}

/* ======================================================================================= */
/* ---- unary ------------------------------------------------------------------------------- */
static const char *unary_names[PN_UNARY_COUNT] = {
    "neg", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh",
    "sigmoid", "logsigmoid", "relu", "elu", "leaky_relu", "gelu", "softplus",
    "sinh", "cosh", "asinh", "acosh", "atanh", "clamp", "pow"};

const char *pn_unary_name(int op) { return (op >= 0 && op < PN_UNARY_COUNT) ? unary_names[op] : "?"; }

enum { OP_SQUARE = PN_EW_SQUARE }; /* pow_scalar with exponent 2: a plain multiply */

#define UN_CASE(OP, EXPR) case OP: MAP1(T, T, EXPR); break;
#define UGRAD_CASE(OP, EXPR) case OP: MAP3(T, EXPR); break;
#define T float
static void unary_f32(int op, int64_t n, char *const *p, const int64_t *st, T a, T b) {
    switch (op) { PN_UNARY_OPS(UN_CASE) }
}
static void unary_grad_f32(int op, int64_t n, char *const *p, const int64_t *st, T a, T b) {
    switch (op) { PN_UNARY_GRADS(UGRAD_CASE) }
}
#undef T
#define T double
static void unary_f64(int op, int64_t n, char *const *p, const int64_t *st, T a, T b) {
    switch (op) { PN_UNARY_OPS(UN_CASE) }
}
static void unary_grad_f64(int op, int64_t n, char *const *p, const int64_t *st, T a, T b) {
    switch (op) { PN_UNARY_GRADS(UGRAD_CASE) }
}
#undef T

typedef struct {
    int op, dt;
    double a, b;
} unary_ctx;

static void unary_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    const unary_ctx *c = ctx;
    if (c->dt == PN_F32) { unary_f32(c->op, n, p, st, (float)c->a, (float)c->b); return; }
    if (c->dt == PN_F64) { unary_f64(c->op, n, p, st, c->a, c->b); return; }
    for (int64_t i = 0; i < n; i++) /* integers: neg abs relu clamp */
        pn_ew_st_int(p[0], c->dt, i, pn_ew_unary_int(c->op, pn_ew_ld_int(p[1], c->dt, i * st[1]), c->a, c->b));
}

static void unary_grad_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    const unary_ctx *c = ctx;
    if (c->dt == PN_F32) unary_grad_f32(c->op, n, p, st, (float)c->a, (float)c->b);
    else unary_grad_f64(c->op, n, p, st, c->a, c->b);
}

/* What each backward reads: the input x, the output y, or both. Saving only those keeps
 * activations from living longer than they must. y is saved as a detached view of the
 * output: the output itself would make a reference cycle output → node → output. */
static bool unary_needs_x(int op) {
    return !(op == PN_NEG || op == PN_EXP || op == PN_SQRT || op == PN_RSQRT || op == PN_TANH || op == PN_SIGMOID);
}
static bool unary_needs_y(int op) {
    return op == PN_EXP || op == PN_SQRT || op == PN_RSQRT || op == PN_TANH || op == PN_SIGMOID || op == PN_ELU;
}

static pn_status unary_bw(pn_node *nd, pn_tensor *g, pn_tensor **gin) {
    int op = (int)nd->iv[0], s = 0;
    pn_tensor *x = unary_needs_x(op) ? nd->saved[s++] : g; /* g stands in for what is not read */
    pn_tensor *y = unary_needs_y(op) ? nd->saved[s++] : g;
    pn_tensor *gx = pn_empty_like(g);
    if (!gx) return PN_ERR_OOM;
    const pn_kernels *k;
    pn_status st = pn_backend_for(nd->name, g->dev, &k);
    if (!st) st = PN_KCALL(nd->name, k, unary_grad, op, gx, g, x, y, nd->sc[0], nd->sc[1]);
    if (st) {
        pn_release(gx);
        return st;
    }
    gin[0] = gx;
    return PN_OK;
}

/* CPU kernels: out / gx fresh and contiguous, x's shape; op a PN_UNARY op or OP_SQUARE */
pn_status pn_cpu_unary(int op, pn_tensor *out, const pn_tensor *x, double a, double b) {
    unary_ctx c = {op, x->dt, a, b};
    run_over(out, 1, (pn_tensor *const[]){(pn_tensor *)x}, unary_row, &c);
    return PN_OK;
}

pn_status pn_cpu_unary_grad(int op, pn_tensor *gx, const pn_tensor *g, const pn_tensor *x, const pn_tensor *y,
                            double a, double b) {
    unary_ctx c = {op, g->dt, a, b};
    run_over(gx, 3, (pn_tensor *const[]){(pn_tensor *)g, (pn_tensor *)x, (pn_tensor *)y}, unary_grad_row, &c);
    return PN_OK;
}

pn_tensor *pn_unary(int op, pn_tensor *x, double a, double b) {
    if (op < 0 || op >= PN_UNARY_COUNT) return pn_error_null(PN_ERR_ARG, "unary: unknown op %d", op);
    const char *name = unary_names[op];
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", name);
    const pn_kernels *k;
    if (pn_backend_for(name, x->dev, &k)) return NULL;
    bool int_ok = op == PN_NEG || op == PN_ABS || op == PN_RELU || op == PN_CLAMP;
    if (!int_ok && pn_check_float(name, "x", x)) return NULL;
    if (op == PN_CLAMP && a > b)
        return pn_error_null(PN_ERR_ARG, "clamp: x %s: min %g is greater than max %g", pn_shape_str(x), a, b);
    int kop = (op == PN_POW_SCALAR && a == 2) ? OP_SQUARE : op;
    pn_tensor *out = pn_empty_like(x);
    if (!out) return NULL;
    if (PN_KCALL(name, k, unary, kop, out, x, a, b)) {
        pn_release(out);
        return NULL;
    }
    if (pn_ag_needed(1, &x)) {
        pn_node *n = pn_ag_record(out, name, unary_bw, 1, &x);
        pn_tensor *y = (n && unary_needs_y(kop)) ? pn_detach(out) : NULL;
        if (!n || (unary_needs_y(kop) && !y)) {
            pn_release(out);
            return NULL;
        }
        n->iv[0] = kop;
        n->sc[0] = a;
        n->sc[1] = b;
        pn_status st = unary_needs_x(kop) ? pn_ag_save(n, x) : PN_OK;
        if (y) {
            if (!st) st = pn_ag_save(n, y);
            pn_release(y);
        }
        if (st) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}

/* ======================================================================================= */
/* ---- comparisons → u8 ------------------------------------------------------------------- */
static const char *compare_names[] = {"eq", "ne", "lt", "le", "gt", "ge"};

#define CMP_CASE(OP, EXPR) case OP: MAP2(uint8_t, T, (uint8_t)(EXPR)); break;
#define T float
static void compare_f32(int op, int64_t n, char *const *p, const int64_t *st) {
    switch (op) { PN_COMPARE_OPS(CMP_CASE) }
}
#undef T
#define T double
static void compare_f64(int op, int64_t n, char *const *p, const int64_t *st) {
    switch (op) { PN_COMPARE_OPS(CMP_CASE) }
}
#undef T

static void compare_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    const op_ctx *c = ctx;
    if (c->dt == PN_F32) { compare_f32(c->op, n, p, st); return; }
    if (c->dt == PN_F64) { compare_f64(c->op, n, p, st); return; }
    uint8_t *o = (uint8_t *)p[0];
    for (int64_t i = 0; i < n; i++)
        o[i] = pn_ew_compare_int(c->op, pn_ew_ld_int(p[1], c->dt, i * st[1]), pn_ew_ld_int(p[2], c->dt, i * st[2]));
}

pn_tensor *pn_compare(int op, pn_tensor *a, pn_tensor *b) {
    if (op < PN_EQ || op > PN_GE) return pn_error_null(PN_ERR_ARG, "compare: unknown op %d", op);
    int nd, dev;
    int64_t shape[PN_MAX_DIMS];
    const pn_kernels *k;
    if (check_pair(compare_names[op], a, b, &nd, shape, &dev, &k)) return NULL;
    pn_tensor *out = pn_empty(nd, shape, PN_U8, dev);
    if (out && PN_KCALL(compare_names[op], k, compare, op, out, a, b)) {
        pn_release(out);
        return NULL;
    }
    return out; /* not differentiable: never recorded */
}

pn_status pn_cpu_compare(int op, pn_tensor *out, const pn_tensor *a, const pn_tensor *b) {
    op_ctx c = {op, a->dt};
    run_over(out, 2, (pn_tensor *const[]){(pn_tensor *)a, (pn_tensor *)b}, compare_row, &c);
    return PN_OK;
}

/* ======================================================================================= */
/* ---- where ------------------------------------------------------------------------------ */
/* Selection copies bits, so one kernel per element size serves every dtype. */
#define WHERE_LOOP(W)                                                                        \
    do {                                                                                     \
        W *restrict o_ = (W *)p[0];                                                          \
        const uint8_t *restrict c_ = (const uint8_t *)p[1];                                  \
        const W *restrict a_ = (const W *)p[2], *restrict b_ = (const W *)p[3];              \
        if (st[1] == 1 && st[2] == 1 && st[3] == 1)                                          \
            for (int64_t i = 0; i < n; i++) o_[i] = c_[i] ? a_[i] : b_[i];                   \
        else                                                                                 \
            for (int64_t i = 0; i < n; i++)                                                  \
                o_[i] = c_[i * st[1]] ? a_[i * st[2]] : b_[i * st[3]];                       \
    } while (0)

static void where_row(const void *ctx, int64_t n, char *const *p, const int64_t *st) {
    switch (*(const int *)ctx) {
    case 8: WHERE_LOOP(uint64_t); break;
    case 4: WHERE_LOOP(uint32_t); break;
    default: WHERE_LOOP(uint8_t); break;
    }
}

/* gradient to a: g where cond, else 0; to b: the opposite; then summed to each shape */
static pn_status where_bw(pn_node *nd, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *zero = pn_zeros(0, NULL, g->dt, g->dev);
    if (!zero) return PN_ERR_OOM;
    pn_status s = PN_OK;
    for (int i = 1; i <= 2 && s == PN_OK; i++) {
        if (!pn_ag_input_needs(nd, i)) continue;
        pn_tensor *full = i == 1 ? pn_where(nd->saved[0], g, zero) : pn_where(nd->saved[0], zero, g);
        gin[i] = full ? pn_grad_to_input(nd, i, full) : NULL;
        pn_release(full);
        if (!gin[i]) s = PN_ERR_SHAPE;
    }
    pn_release(zero);
    return s;
}

pn_status pn_cpu_where(pn_tensor *out, const pn_tensor *cond, const pn_tensor *a, const pn_tensor *b) {
    int es = (int)pn_elsize(a->dt);
    run_over(out, 3, (pn_tensor *const[]){(pn_tensor *)cond, (pn_tensor *)a, (pn_tensor *)b}, where_row, &es);
    return PN_OK;
}

pn_tensor *pn_where(pn_tensor *cond, pn_tensor *a, pn_tensor *b) {
    int nd, nd2, dev;
    int64_t shape[PN_MAX_DIMS], shape2[PN_MAX_DIMS];
    const pn_kernels *k;
    if (!cond) return pn_error_null(PN_ERR_ARG, "where: cond is nil");
    if (pn_kernels_for("where", 3, (const pn_tensor *const[]){cond, a, b}, (const char *const[]){"cond", "a", "b"}, &dev,
                       &k))
        return NULL;
    if (check_pair("where", a, b, &nd, shape, &dev, &k)) return NULL;
    if (cond->dt != PN_U8)
        return pn_error_null(PN_ERR_DTYPE, "where: cond %s has dtype %s, expected u8 (a comparison result)",
                             pn_shape_str(cond), pn_dtype_name(cond->dt));
    if (pn_broadcast_shape("where", cond->nd, cond->sizes, nd, shape, &nd2, shape2)) {
        return pn_error_null(PN_ERR_SHAPE, "where: cond %s, a %s and b %s cannot be broadcast together",
                             pn_shape_str(cond), pn_shape_str(a), pn_shape_str(b));
    }
    pn_tensor *out = pn_empty(nd2, shape2, a->dt, dev);
    if (!out) return NULL;
    if (PN_KCALL("where", k, where, out, cond, a, b)) {
        pn_release(out);
        return NULL;
    }
    pn_tensor *ins[3] = {cond, a, b};
    if (pn_ag_needed(3, ins)) {
        pn_node *n = pn_ag_record(out, "where", where_bw, 3, ins);
        if (!n) {
            pn_release(out);
            return NULL;
        }
        if (pn_ag_save(n, cond)) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}
