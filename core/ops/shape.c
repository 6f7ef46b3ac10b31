/* shape.c — joining ops: cat (along an existing dim) and stack (along a new dim).
 * Backward hands each input its slice of the gradient (a narrow/select view of g, no
 * copy). Errors name the position (from 1, as in the Lua list) of the offending tensor. */
#include "../backend.h"

/* Common checks: n >= 1 tensors on one device, one dtype; returns PN_OK. The copies go through
 * pn_copy_ (the copy kernel of that device). */
static pn_status check_list(const char *op, int n, pn_tensor **ts) {
    if (n < 1 || !ts) return pn_error(PN_ERR_ARG, "%s: expected a non-empty list of tensors, got %d", op, n);
    for (int i = 0; i < n; i++) {
        if (!ts[i]) return pn_error(PN_ERR_ARG, "%s: tensor %d of the list is nil", op, i + 1);
        if (ts[i]->dev != ts[0]->dev)
            return pn_error(PN_ERR_DEVICE, "%s: tensor %d %s is on %s, tensor 1 %s on %s", op, i + 1,
                            pn_shape_str(ts[i]), pn_device_name(ts[i]->dev), pn_shape_str(ts[0]),
                            pn_device_name(ts[0]->dev));
        if (ts[i]->dt != ts[0]->dt)
            return pn_error(PN_ERR_DTYPE, "%s: tensor %d %s has dtype %s, tensor 1 %s has %s", op, i + 1,
                            pn_shape_str(ts[i]), pn_dtype_name(ts[i]->dt), pn_shape_str(ts[0]),
                            pn_dtype_name(ts[0]->dt));
    }
    return PN_OK;
}

/* Copy src into the slice [start, start+len) of out along d (no autograd). */
static pn_status copy_into(pn_tensor *out, int d, int64_t start, int64_t len, const pn_tensor *src) {
    int64_t sh[PN_MAX_DIMS];
    memcpy(sh, out->sizes, sizeof sh);
    sh[d] = len;
    pn_tensor *slice = pn_tensor_view_of(out->storage, out->nd, sh, out->strides, out->offset + start * out->strides[d],
                                         out->dt);
    if (!slice) return PN_ERR_OOM;
    pn_status s = pn_copy_(slice, src);
    pn_release(slice);
    return s;
}

static void free_extra(void *p) { free(p); }

/* Record a node over all n inputs; extra = the n sizes along the joined dim. */
static pn_tensor *record(pn_tensor *out, const char *name, pn_backward_fn bw, int n, pn_tensor **ts, int d,
                         int64_t *lens) {
    if (!pn_ag_needed(n, ts)) {
        free(lens);
        return out;
    }
    pn_node *node = pn_ag_record(out, name, bw, n, ts);
    if (!node) {
        free(lens);
        pn_release(out);
        return NULL;
    }
    node->iv[0] = d;
    node->extra = lens;
    node->free_extra = free_extra;
    return out;
}

/* ---- cat ---------------------------------------------------------------------------------------- */
/* iv[0] = dim, extra = sizes along it. gin[i] = g narrowed to input i's slice. */
static pn_status cat_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    const int64_t *lens = n->extra;
    int d = (int)n->iv[0];
    int64_t start = 0;
    for (int i = 0; i < n->n_in; i++) {
        if (pn_ag_input_needs(n, i) && !(gin[i] = pn_narrow(g, d, start, lens[i]))) return PN_ERR_SHAPE;
        start += lens[i];
    }
    return PN_OK;
}

pn_tensor *pn_cat(int n, pn_tensor **ts, int dim) {
    if (check_list("cat", n, ts)) return NULL;
    int nd = ts[0]->nd, d;
    if (nd == 0) return pn_error_null(PN_ERR_SHAPE, "cat: tensor 0 is 0-dim; cat needs at least 1 dim (use stack)");
    if (pn_wrap_dim("cat", dim, nd, &d)) return NULL;
    int64_t shape[PN_MAX_DIMS];
    memcpy(shape, ts[0]->sizes, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        bool ok = ts[i]->nd == nd;
        for (int k = 0; ok && k < nd; k++) ok = k == d || ts[i]->sizes[k] == ts[0]->sizes[k];
        if (!ok)
            return pn_error_null(PN_ERR_SHAPE, "cat: tensor %d %s does not match tensor 1 %s outside dim %d",
                                 i + 1, pn_shape_str(ts[i]), pn_shape_str(ts[0]), d + 1);
        if (__builtin_add_overflow(shape[d], ts[i]->sizes[d], &shape[d]))
            return pn_error_null(PN_ERR_ARG, "cat: the sizes along dim %d overflow (tensor %d %s)", d + 1, i + 1,
                                 pn_shape_str(ts[i]));
    }
    int64_t *lens = malloc(sizeof *lens * (size_t)n);
    if (!lens) return pn_error_null(PN_ERR_OOM, "cat: out of memory");
    pn_tensor *out = pn_empty(nd, shape, ts[0]->dt, ts[0]->dev);
    if (!out) {
        free(lens);
        return NULL;
    }
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        lens[i] = ts[i]->sizes[d];
        if (copy_into(out, d, start, lens[i], ts[i])) {
            free(lens);
            pn_release(out);
            return NULL;
        }
        start += lens[i];
    }
    return record(out, "cat", cat_bw, n, ts, d, lens);
}

/* ---- stack -------------------------------------------------------------------------------------- */
/* iv[0] = the new dim. gin[i] = g selected at i along it. */
static pn_status stack_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    int d = (int)n->iv[0];
    for (int i = 0; i < n->n_in; i++)
        if (pn_ag_input_needs(n, i) && !(gin[i] = pn_select(g, d, i))) return PN_ERR_SHAPE;
    return PN_OK;
}

pn_tensor *pn_stack(int n, pn_tensor **ts, int dim) {
    if (check_list("stack", n, ts)) return NULL;
    int nd = ts[0]->nd, d;
    if (nd + 1 > PN_MAX_DIMS)
        return pn_error_null(PN_ERR_SHAPE, "stack: tensors %s already have %d dims", pn_shape_str(ts[0]), nd);
    if (pn_wrap_dim("stack", dim, nd + 1, &d)) return NULL;
    for (int i = 1; i < n; i++)
        if (!pn_same_shape(ts[i], ts[0]))
            return pn_error_null(PN_ERR_SHAPE, "stack: tensor %d %s does not match tensor 1 %s", i + 1,
                                 pn_shape_str(ts[i]), pn_shape_str(ts[0]));
    int64_t shape[PN_MAX_DIMS];
    for (int k = 0, j = 0; k < nd + 1; k++) shape[k] = k == d ? n : ts[0]->sizes[j++];
    pn_tensor *out = pn_empty(nd + 1, shape, ts[0]->dt, ts[0]->dev);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) {
        /* the slice i along d, viewed with the inputs' shape (dim d dropped) */
        int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
        for (int k = 0, j = 0; k < nd + 1; k++)
            if (k != d) {
                sh[j] = out->sizes[k];
                st[j++] = out->strides[k];
            }
        pn_tensor *slice = pn_tensor_view_of(out->storage, nd, sh, st, out->offset + i * out->strides[d], out->dt);
        pn_status s = slice ? pn_copy_(slice, ts[i]) : PN_ERR_OOM;
        pn_release(slice);
        if (s) {
            pn_release(out);
            return NULL;
        }
    }
    return record(out, "stack", stack_bw, n, ts, d, NULL);
}
