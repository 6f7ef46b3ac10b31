/* autograd.c — define-by-run reverse mode (DESIGN §2).
 *
 * A recorded op creates a pn_node {backward, saved tensors, scalar args, edges to its
 * inputs}. An edge holds the input's producer node (non-leaf) or the input itself when
 * it is a leaf requiring grad. pn_backward counts, for every node reachable from the
 * root, how many consumers will send it a gradient, then runs nodes once all of their
 * consumers are done (a topological order without recursion). Leaf gradients
 * accumulate (+=); a node's incoming gradients are summed before it runs. After
 * backward the nodes drop their saved tensors and edges unless retain_graph. */
#include "backend.h"

#include <stdio.h>

static _Thread_local int grad_mode = 1;

int pn_grad_enabled(void) { return grad_mode; }
int pn_set_grad_enabled(int on) {
    int prev = grad_mode;
    grad_mode = on != 0;
    return prev;
}

int pn_requires_grad(const pn_tensor *t) { return t && (t->req_grad || t->fn != NULL); }

bool pn_ag_needed(int n, pn_tensor *const *ins) {
    if (!grad_mode) return false;
    for (int i = 0; i < n; i++)
        if (ins[i] && (ins[i]->req_grad || ins[i]->fn)) return true;
    return false;
}

static void node_retain(pn_node *n) { __atomic_add_fetch(&n->refcount, 1, __ATOMIC_RELAXED); }

/* Drop what the node holds for backward (saved tensors, edges, extra). */
static void node_drop_state(pn_node *n) {
    for (int i = 0; i < PN_NODE_SAVED; i++) {
        pn_release(n->saved[i]);
        n->saved[i] = NULL;
    }
    for (int i = 0; i < n->n_in; i++) {
        pn_node_release(n->in[i].node);
        pn_release(n->in[i].leaf);
        n->in[i].node = NULL;
        n->in[i].leaf = NULL;
    }
    if (n->extra && n->free_extra) n->free_extra(n->extra);
    n->extra = NULL;
    pn_release(n->gacc);
    n->gacc = NULL;
    n->released = 1;
}

/* Iterative release: a long chain of nodes must not recurse once per node. */
void pn_node_release(pn_node *n) {
    pn_node *stack_small[64];
    pn_node **stack = stack_small;
    int64_t cap = 64, top = 0;
    if (!n) return;
    stack[top++] = n;
    while (top > 0) {
        pn_node *c = stack[--top];
        if (__atomic_sub_fetch(&c->refcount, 1, __ATOMIC_ACQ_REL) != 0) continue;
        for (int i = 0; i < c->n_in; i++) {
            if (c->in[i].node) {
                if (top == cap) {
                    pn_node **bigger = malloc(sizeof *bigger * (size_t)cap * 2);
                    if (!bigger) { /* cannot grow: fall back to recursion for this one */
                        pn_node_release(c->in[i].node);
                        c->in[i].node = NULL;
                        continue;
                    }
                    memcpy(bigger, stack, sizeof *stack * (size_t)cap);
                    if (stack != stack_small) free(stack);
                    stack = bigger;
                    cap *= 2;
                }
                stack[top++] = c->in[i].node;
                c->in[i].node = NULL;
            }
        }
        node_drop_state(c);
        free(c->in);
        free(c);
        pn_count_node(-1);
    }
    if (stack != stack_small) free(stack);
}

pn_node *pn_ag_record(pn_tensor *out, const char *name, pn_backward_fn bw, int n, pn_tensor *const *ins) {
    pn_node *node = calloc(1, sizeof *node);
    pn_edge *edges = calloc((size_t)(n > 0 ? n : 1), sizeof *edges);
    if (!node || !edges) {
        free(node);
        free(edges);
        return pn_error_null(PN_ERR_OOM, "%s: out of memory recording the autograd node", name);
    }
    pn_count_node(1);
    node->name = name;
    node->backward = bw;
    node->n_in = n;
    node->in = edges;
    node->refcount = 1; /* held by out */
    for (int i = 0; i < n; i++) {
        pn_tensor *t = ins[i];
        if (!t) continue;
        edges[i].nd = t->nd;
        memcpy(edges[i].shape, t->sizes, sizeof t->sizes);
        edges[i].dtype = t->dt;
        if (t->fn) {
            edges[i].node = t->fn;
            node_retain(t->fn);
        } else if (t->req_grad) {
            edges[i].leaf = t;
            pn_retain(t);
        }
    }
    pn_node_release(out->fn);
    out->fn = node;
    return node;
}

pn_status pn_ag_save(pn_node *n, pn_tensor *t) {
    for (int i = 0; i < PN_NODE_SAVED; i++) {
        if (!n->saved[i]) {
            n->saved[i] = t;
            n->saved_version[i] = t->storage->version;
            pn_retain(t);
            return PN_OK;
        }
    }
    return pn_error(PN_ERR_STATE, "%s: autograd node has no room for saved tensor %d (PN_NODE_SAVED = %d)",
                    n->name, PN_NODE_SAVED + 1, PN_NODE_SAVED);
}

pn_tensor *pn_grad_to_input(pn_node *n, int i, pn_tensor *g) {
    return pn_sum_to_shape(g, (int)n->in[i].nd, n->in[i].shape);
}

/* g summed over the dims in which it was broadcast from shape, by the sum_to kernel of g's
 * device. */
pn_tensor *pn_sum_to_shape(pn_tensor *g, int nd, const int64_t *shape) {
    if (g->nd == nd && memcmp(g->sizes, shape, sizeof(int64_t) * (size_t)nd) == 0) {
        pn_retain(g);
        return g;
    }
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    if (pn_broadcast_shape("sum_to_shape", g->nd, g->sizes, nd, shape, &bnd, bshape)) return NULL;
    if (bnd != g->nd || pn_shape_numel(bnd, bshape) != pn_numel(g))
        return pn_error_null(PN_ERR_SHAPE, "sum_to_shape: %s does not reduce to %s", pn_shape_str(g),
                             pn_dims_str(nd, shape));
    const pn_kernels *k;
    if (pn_backend_for("sum_to_shape", g->dev, &k)) return NULL;
    pn_tensor *out = pn_empty(nd, shape, g->dt, g->dev);
    if (!out) return NULL;
    if (PN_KCALL("sum_to_shape", k, sum_to, out, g)) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* ---- leaf flags and gradients --------------------------------------------------------------- */
pn_status pn_set_requires_grad(pn_tensor *t, int flag) {
    if (!t) return pn_error(PN_ERR_ARG, "requires_grad_: nil tensor");
    if (t->fn)
        return pn_error(PN_ERR_STATE, "requires_grad_: tensor %s is the result of %s, not a leaf; use detach() first",
                        pn_shape_str(t), t->fn->name);
    if (flag && !pn_is_float(t->dt))
        return pn_error(PN_ERR_DTYPE, "requires_grad_: only f32/f64 tensors can require grad, got %s %s",
                        pn_dtype_name(t->dt), pn_shape_str(t));
    t->req_grad = flag != 0;
    return PN_OK;
}

pn_tensor *pn_grad(pn_tensor *t) {
    if (!t || !t->gradt) return NULL;
    pn_retain(t->gradt);
    return t->gradt;
}

pn_status pn_set_grad(pn_tensor *t, pn_tensor *g) {
    if (!t) return pn_error(PN_ERR_ARG, "set_grad: nil tensor");
    if (g && (!pn_same_shape(t, g) || g->dt != t->dt))
        return pn_error(PN_ERR_SHAPE, "set_grad: grad %s %s does not match tensor %s %s", pn_dtype_name(g->dt),
                        pn_shape_str(g), pn_dtype_name(t->dt), pn_shape_str(t));
    if (g) pn_retain(g);
    pn_release(t->gradt);
    t->gradt = g;
    return PN_OK;
}

const char *pn_grad_fn_name(const pn_tensor *t) { return (t && t->fn) ? t->fn->name : ""; }

pn_tensor *pn_detach(pn_tensor *t) {
    if (!t) return pn_error_null(PN_ERR_ARG, "detach: nil tensor");
    return pn_tensor_view_of(t->storage, t->nd, t->sizes, t->strides, t->offset, t->dt);
}

/* ---- backward ---------------------------------------------------------------------------------- */
/* A tensor only its holder can see: no other reference, no view of its storage, no history. */
static bool held_alone(const pn_tensor *t) {
    return __atomic_load_n(&t->refcount, __ATOMIC_ACQUIRE) == 1 &&
           __atomic_load_n(&t->storage->refcount, __ATOMIC_ACQUIRE) == 1 && !t->fn;
}

/* Add g into *slot. The first gradient is kept as is (shared, read-only). A second one is
 * added in place when the slot is the only holder of the first (by then the op that made it
 * has let go: a residual stream's gradient, fanned in from four consumers, costs no copy);
 * otherwise it produces a fresh sum, so no tensor that someone else holds is ever written. */
static pn_status accumulate(pn_tensor **slot, pn_tensor *g) {
    if (!*slot) {
        pn_retain(g);
        *slot = g;
        return PN_OK;
    }
    const pn_kernels *k;
    PN_TRY(pn_backend_for("backward", g->dev, &k));
    pn_tensor *a = *slot;
    if (a != g && held_alone(a) && pn_is_contiguous(a) && a->dt == g->dt && a->dev == g->dev && pn_same_shape(a, g))
        return PN_KCALL("backward", k, accumulate, a, g);
    /* a fresh contiguous copy of the first, then += the second on their device */
    pn_tensor *s = pn_contig_copy(*slot);
    if (!s) return PN_ERR_OOM;
    pn_status st = PN_KCALL("backward", k, accumulate, s, g);
    if (st) {
        pn_release(s);
        return st;
    }
    pn_release(*slot);
    *slot = s;
    return PN_OK;
}

/* Leaf .grad: += into a tensor the leaf owns alone. */
static pn_status accumulate_leaf(pn_tensor *leaf, pn_tensor *g) {
    if (!pn_same_shape(leaf, g))
        return pn_error(PN_ERR_SHAPE, "backward: gradient %s for leaf %s has the wrong shape", pn_shape_str(g),
                        pn_shape_str(leaf));
    if (!leaf->gradt) {
        /* a gradient nobody else holds becomes .grad as is (no copy, no second buffer) */
        if (g->refcount == 1 && g->storage->refcount == 1 && pn_is_contiguous(g) && g->dt == leaf->dt &&
            g->offset == 0 && !g->fn) {
            pn_retain(g);
            leaf->gradt = g;
            return PN_OK;
        }
        pn_tensor *c = pn_empty_like(leaf);
        if (!c) return PN_ERR_OOM;
        PN_TRY(pn_copy_(c, g));
        leaf->gradt = c;
        return PN_OK;
    }
    if (leaf->gradt->dt != g->dt)
        return pn_error(PN_ERR_DTYPE, "backward: gradient dtype %s for leaf of dtype %s", pn_dtype_name(g->dt),
                        pn_dtype_name(leaf->gradt->dt));
    const pn_kernels *k;
    PN_TRY(pn_backend_for("backward", g->dev, &k));
    return PN_KCALL("backward", k, accumulate, leaf->gradt, g);
}

typedef struct {
    pn_node **v;
    int64_t n, cap;
} node_vec;

static pn_status vec_push(node_vec *s, pn_node *n) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 256;
        pn_node **v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return pn_error(PN_ERR_OOM, "backward: out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = n;
    return PN_OK;
}

static uint32_t next_mark = 1;

static const pn_leaf_watch *g_watch; /* internal.h */
void pn_ag_watch(const pn_leaf_watch *w) { g_watch = w; }

pn_status pn_backward(pn_tensor *root, pn_tensor *grad, int retain) {
    if (!root) return pn_error(PN_ERR_ARG, "backward: nil tensor");
    if (!pn_requires_grad(root))
        return pn_error(PN_ERR_STATE, "backward: tensor %s does not require grad (no leaf in its history asked for one)",
                        pn_shape_str(root));
    pn_tensor *g0 = NULL;
    if (grad) {
        if (!pn_same_shape(grad, root) || grad->dt != root->dt)
            return pn_error(PN_ERR_SHAPE, "backward: grad %s %s does not match tensor %s %s", pn_dtype_name(grad->dt),
                            pn_shape_str(grad), pn_dtype_name(root->dt), pn_shape_str(root));
        pn_retain(grad);
        g0 = grad;
    } else {
        if (pn_numel(root) != 1)
            return pn_error(PN_ERR_SHAPE, "backward: tensor %s has %lld elements; pass a gradient for non-scalars",
                            pn_shape_str(root), (long long)pn_numel(root));
        g0 = pn_full(root->nd, root->sizes, 1.0, root->dt, root->dev);
        if (!g0) return PN_ERR_OOM;
    }
    if (!root->fn) { /* a leaf: its gradient is the seed */
        pn_status s = accumulate_leaf(root, g0);
        pn_release(g0);
        return s;
    }
    if (root->fn->released) {
        pn_release(g0);
        return pn_error(PN_ERR_STATE, "backward: the graph of %s was freed by an earlier backward; "
                        "pass retain_graph=true the first time", root->fn->name);
    }

    pn_status st = PN_OK;
    int prev_mode = pn_set_grad_enabled(0);
    uint32_t mark = __atomic_add_fetch(&next_mark, 1, __ATOMIC_RELAXED);
    node_vec all = {0}, ready = {0};
    const pn_leaf_watch *w = g_watch;

    /* pass 1: reach every node, count consumers */
    root->fn->deps = 0;
    root->fn->mark = mark;
    if ((st = vec_push(&all, root->fn))) goto done;
    node_retain(root->fn); /* every node in `all` is held until the end: dropping edges frees parents */
    for (int64_t k = 0; k < all.n; k++) {
        pn_node *n = all.v[k];
        for (int i = 0; i < n->n_in; i++) {
            pn_node *p = n->in[i].node;
            if (!p) {
                if (w && n->in[i].leaf) w->edge(w->ctx, n->in[i].leaf);
                continue;
            }
            if (p->released) {
                st = pn_error(PN_ERR_STATE, "backward: the graph through %s was freed by an earlier backward; "
                              "pass retain_graph=true the first time", p->name);
                goto done;
            }
            if (p->mark != mark) {
                p->mark = mark;
                p->deps = 0;
                if ((st = vec_push(&all, p))) goto done;
                node_retain(p);
            }
            p->deps++;
        }
    }

    if (w && (st = w->counted(w->ctx))) goto done;

    /* pass 2: run nodes whose consumers are all done */
    root->fn->gacc = g0;
    g0 = NULL;
    if ((st = vec_push(&ready, root->fn))) goto done;
    while (ready.n > 0) {
        pn_node *n = ready.v[--ready.n];
        pn_tensor *gout = n->gacc;
        n->gacc = NULL;
        pn_tensor *gin_small[8] = {0};
        pn_tensor **gin = n->n_in <= 8 ? gin_small : calloc((size_t)n->n_in, sizeof *gin);
        if (!gin) {
            pn_release(gout);
            st = pn_error(PN_ERR_OOM, "backward: out of memory");
            goto done;
        }
        for (int i = 0; gout && i < PN_NODE_SAVED; i++) {
            const pn_tensor *sv = n->saved[i];
            if (sv && sv->storage->version != n->saved_version[i]) {
                pn_release(gout);
                if (gin != gin_small) free(gin);
                st = pn_error(PN_ERR_STATE, "backward of %s: a tensor it saved (%s %s) was modified in place after "
                              "the forward (copy_, fill_, an optimiser step…); its gradient would be wrong. Modify "
                              "a clone, or run backward before the update", n->name, pn_dtype_name(sv->dt),
                              pn_shape_str(sv));
                goto done;
            }
        }
        if (gout) {
            st = n->backward(n, gout, gin);
            if (st != PN_OK) {
                /* keep the op's message, add where it happened */
                char msg[768];
                snprintf(msg, sizeof msg, "%s", pn_last_error());
                pn_error(st, "backward of %s: %s", n->name, msg);
            }
        }
        for (int i = 0; i < n->n_in && st == PN_OK; i++) {
            pn_edge *e = &n->in[i];
            if (e->node) {
                if (gin[i]) st = accumulate(&e->node->gacc, gin[i]);
                if (--e->node->deps == 0 && st == PN_OK) st = vec_push(&ready, e->node);
            } else if (e->leaf) {
                if (gin[i]) st = accumulate_leaf(e->leaf, gin[i]);
                if (w && st == PN_OK) st = w->done(w->ctx, e->leaf);
            }
        }
        for (int i = 0; i < n->n_in; i++) pn_release(gin[i]);
        if (gin != gin_small) free(gin);
        pn_release(gout);
        if (w && st == PN_OK) st = w->progress(w->ctx);
        if (st != PN_OK) goto done;
    }

done:
    for (int64_t k = 0; k < all.n; k++) {
        pn_release(all.v[k]->gacc);
        all.v[k]->gacc = NULL;
        if (!retain) node_drop_state(all.v[k]);
    }
    for (int64_t k = 0; k < all.n; k++) pn_node_release(all.v[k]);
    pn_release(g0);
    free(all.v);
    free(ready.v);
    pn_set_grad_enabled(prev_mode);
    return st;
}
