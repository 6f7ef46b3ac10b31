/* views.c — strided views that share storage (view, reshape, permute, transpose,
 * narrow, select, squeeze, unsqueeze, expand) plus contiguous, clone and dtype casts.
 * Each forward is next to its backward. */
#include "../backend.h"

/* A view of x with new geometry, recorded with backward bw. */
static pn_tensor *make_view(pn_tensor *x, int nd, const int64_t *shape, const int64_t *strides, int64_t offset,
                            const char *name, pn_backward_fn bw) {
    pn_tensor *out = pn_tensor_view_of(x->storage, nd, shape, strides, offset, x->dt);
    if (!out) return NULL;
    if (pn_ag_needed(1, &x) && !pn_ag_record(out, name, bw, 1, &x)) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* ---- view / reshape ---------------------------------------------------------------------- */
static pn_status reshape_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    gin[0] = pn_reshape(g, (int)n->in[0].nd, n->in[0].shape);
    return gin[0] ? PN_OK : PN_ERR_SHAPE;
}

/* Resolve one -1 and check the element count. */
static pn_status infer_shape(const char *op, const pn_tensor *x, int nd, const int64_t *shape, int64_t *out) {
    if (nd < 0 || nd > PN_MAX_DIMS) return pn_error(PN_ERR_ARG, "%s: %d dims requested", op, nd);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) return pn_error(PN_ERR_ARG, "%s: only one dim can be -1 in %s", op, pn_dims_str(nd, shape));
            infer = i;
        } else if (shape[i] < 0) {
            return pn_error(PN_ERR_ARG, "%s: negative size in %s", op, pn_dims_str(nd, shape));
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            return pn_error(PN_ERR_ARG, "%s: shape %s is too large (its element count overflows)", op,
                            pn_dims_str(nd, shape));
        }
        out[i] = shape[i];
    }
    int64_t n = pn_numel(x);
    if (infer >= 0) {
        if (known == 0 || n % known)
            return pn_error(PN_ERR_SHAPE, "%s: cannot view %s (%lld elements) as %s", op, pn_shape_str(x),
                            (long long)n, pn_dims_str(nd, shape));
        out[infer] = n / known;
    } else if (known != n) {
        return pn_error(PN_ERR_SHAPE, "%s: cannot view %s (%lld elements) as %s (%lld elements)", op, pn_shape_str(x),
                        (long long)n, pn_dims_str(nd, shape), (long long)known);
    }
    return PN_OK;
}

/* Strides for viewing x as shape without copying, if possible (torch's computeStride). */
static bool view_strides(const pn_tensor *x, int nd, const int64_t *shape, int64_t *st) {
    if (pn_numel(x) == 0 || pn_is_contiguous(x)) {
        pn_contiguous_strides(nd, shape, st);
        return true;
    }
    /* walk x's dims from the innermost, in chunks that are contiguous among themselves;
     * each chunk must map onto whole dims of the new shape */
    int view_d = nd - 1;
    int64_t base = x->strides[x->nd - 1]; /* stride of the chunk's innermost dim */
    int64_t tensor_numel = 1, view_numel = 1;
    for (int d = x->nd - 1; d >= 0; d--) {
        tensor_numel *= x->sizes[d];
        if (d == 0 || (x->sizes[d - 1] != 1 && x->strides[d - 1] != tensor_numel * base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                st[view_d] = view_numel * base;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (d > 0) {
                base = x->strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

pn_tensor *pn_view(pn_tensor *x, int nd, const int64_t *shape) {
    if (!x) return pn_error_null(PN_ERR_ARG, "view: nil tensor");
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    if (infer_shape("view", x, nd, shape, sh)) return NULL;
    if (!view_strides(x, nd, sh, st))
        return pn_error_null(PN_ERR_SHAPE, "view: tensor %s with strides %s cannot be viewed as %s without a copy; "
                             "use reshape", pn_shape_str(x), pn_dims_str(x->nd, x->strides), pn_dims_str(nd, sh));
    return make_view(x, nd, sh, st, x->offset, "view", reshape_bw);
}

pn_tensor *pn_reshape(pn_tensor *x, int nd, const int64_t *shape) {
    if (!x) return pn_error_null(PN_ERR_ARG, "reshape: nil tensor");
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    if (infer_shape("reshape", x, nd, shape, sh)) return NULL;
    if (view_strides(x, nd, sh, st)) return make_view(x, nd, sh, st, x->offset, "reshape", reshape_bw);
    pn_tensor *c = pn_contiguous(x);
    if (!c) return NULL;
    pn_tensor *out = pn_view(c, nd, sh);
    pn_release(c);
    return out;
}

/* ---- permute / transpose ---------------------------------------------------------------------- */
static pn_status permute_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    int nd = (int)n->in[0].nd;
    int64_t inv[PN_MAX_DIMS];
    for (int i = 0; i < nd; i++) inv[n->iv[i]] = i;
    gin[0] = pn_permute(g, nd, inv);
    return gin[0] ? PN_OK : PN_ERR_SHAPE;
}

pn_tensor *pn_permute(pn_tensor *x, int nd, const int64_t *perm) {
    if (!x) return pn_error_null(PN_ERR_ARG, "permute: nil tensor");
    if (nd != x->nd)
        return pn_error_null(PN_ERR_SHAPE, "permute: %d dims given for a tensor %s with %d dims", nd, pn_shape_str(x),
                             x->nd);
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS], p[PN_MAX_DIMS];
    bool seen[PN_MAX_DIMS] = {0};
    for (int i = 0; i < nd; i++) {
        int d;
        if (pn_wrap_dim("permute", (int)perm[i], nd, &d)) return NULL;
        if (seen[d]) return pn_error_null(PN_ERR_ARG, "permute: dim %d repeated in %s", d + 1, pn_dims_str(nd, perm));
        seen[d] = true;
        p[i] = d;
        sh[i] = x->sizes[d];
        st[i] = x->strides[d];
    }
    pn_tensor *out = make_view(x, nd, sh, st, x->offset, "permute", permute_bw);
    if (out && out->fn) memcpy(out->fn->iv, p, sizeof(int64_t) * (size_t)nd);
    return out;
}

pn_tensor *pn_transpose(pn_tensor *x, int d0, int d1) {
    if (!x) return pn_error_null(PN_ERR_ARG, "transpose: nil tensor");
    int a, b;
    if (pn_wrap_dim("transpose", d0, x->nd, &a) || pn_wrap_dim("transpose", d1, x->nd, &b)) return NULL;
    int64_t p[PN_MAX_DIMS];
    for (int i = 0; i < x->nd; i++) p[i] = i;
    if (x->nd == 0) return pn_permute(x, 0, p);
    p[a] = b;
    p[b] = a;
    return pn_permute(x, x->nd, p);
}

/* ---- narrow / select ----------------------------------------------------------------------------- */
/* gradient of a slice: zeros of the input's shape with g written into the slice */
static pn_status narrow_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *z = pn_zeros((int)n->in[0].nd, n->in[0].shape, g->dt, g->dev);
    if (!z) return PN_ERR_OOM;
    pn_tensor *slice = pn_narrow(z, (int)n->iv[0], n->iv[1], n->iv[2]);
    pn_status s = slice ? pn_copy_(slice, g) : PN_ERR_SHAPE; /* g broadcasts over the selected dim */
    pn_release(slice);
    if (s) {
        pn_release(z);
        return s;
    }
    gin[0] = z;
    return PN_OK;
}

pn_tensor *pn_narrow(pn_tensor *x, int dim, int64_t start, int64_t length) {
    if (!x) return pn_error_null(PN_ERR_ARG, "narrow: nil tensor");
    int d;
    if (pn_wrap_dim("narrow", dim, x->nd, &d)) return NULL;
    if (x->nd == 0) return pn_error_null(PN_ERR_SHAPE, "narrow: cannot slice a 0-dim tensor");
    if (start < 0) start += x->sizes[d];
    if (start < 0 || length < 0 || start > x->sizes[d] || length > x->sizes[d] - start) /* no overflow */
        return pn_error_null(PN_ERR_INDEX, "narrow: start %lld, length %lld out of bounds for dim %d of %s",
                             (long long)PN_POS(start), (long long)length, d + 1, pn_shape_str(x));
    int64_t sh[PN_MAX_DIMS];
    memcpy(sh, x->sizes, sizeof sh);
    sh[d] = length;
    pn_tensor *out = make_view(x, x->nd, sh, x->strides, x->offset + start * x->strides[d], "narrow", narrow_bw);
    if (out && out->fn) {
        out->fn->iv[0] = d;
        out->fn->iv[1] = start;
        out->fn->iv[2] = length;
    }
    return out;
}

pn_tensor *pn_select(pn_tensor *x, int dim, int64_t index) {
    if (!x) return pn_error_null(PN_ERR_ARG, "select: nil tensor");
    int d;
    if (pn_wrap_dim("select", dim, x->nd, &d)) return NULL;
    if (x->nd == 0) return pn_error_null(PN_ERR_SHAPE, "select: cannot index a 0-dim tensor");
    int64_t i = index < 0 ? index + x->sizes[d] : index;
    if (i < 0 || i >= x->sizes[d])
        return pn_error_null(PN_ERR_INDEX, "select: index %lld out of range for dim %d of %s", (long long)PN_POS(index), d + 1,
                             pn_shape_str(x));
    pn_tensor *nar = pn_narrow(x, d, i, 1);
    if (!nar) return NULL;
    pn_tensor *out = pn_squeeze(nar, d);
    pn_release(nar);
    return out;
}

/* ---- squeeze / unsqueeze ------------------------------------------------------------------------- */
pn_tensor *pn_squeeze(pn_tensor *x, int dim) {
    if (!x) return pn_error_null(PN_ERR_ARG, "squeeze: nil tensor");
    int d = -1;
    if (dim != PN_ALL_DIMS && pn_wrap_dim("squeeze", dim, x->nd, &d)) return NULL;
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->nd; i++) {
        bool drop = x->sizes[i] == 1 && (dim == PN_ALL_DIMS || i == d);
        if (drop) continue;
        sh[nd] = x->sizes[i];
        st[nd++] = x->strides[i];
    }
    return make_view(x, nd, sh, st, x->offset, "squeeze", reshape_bw);
}

pn_tensor *pn_unsqueeze(pn_tensor *x, int dim) {
    if (!x) return pn_error_null(PN_ERR_ARG, "unsqueeze: nil tensor");
    if (x->nd >= PN_MAX_DIMS) return pn_error_null(PN_ERR_SHAPE, "unsqueeze: %s already has %d dims", pn_shape_str(x), x->nd);
    int d;
    if (pn_wrap_dim("unsqueeze", dim, x->nd + 1, &d)) return NULL;
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    for (int i = 0, j = 0; i < x->nd + 1; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = (j < x->nd) ? x->strides[j] * x->sizes[j] : 1;
        } else {
            sh[i] = x->sizes[j];
            st[i] = x->strides[j];
            j++;
        }
    }
    return make_view(x, x->nd + 1, sh, st, x->offset, "unsqueeze", reshape_bw);
}

/* ---- expand ---------------------------------------------------------------------------------------- */
static pn_status expand_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    gin[0] = pn_grad_to_input(n, 0, g);
    return gin[0] ? PN_OK : PN_ERR_SHAPE;
}

pn_tensor *pn_expand(pn_tensor *x, int nd, const int64_t *shape) {
    if (!x) return pn_error_null(PN_ERR_ARG, "expand: nil tensor");
    if (nd < x->nd || nd > PN_MAX_DIMS)
        return pn_error_null(PN_ERR_SHAPE, "expand: cannot expand %s to %s (fewer dims)", pn_shape_str(x),
                             pn_dims_str(nd, shape));
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int j = x->nd - nd + i;
        int64_t xs = j >= 0 ? x->sizes[j] : 1;
        sh[i] = shape[i] == -1 ? xs : shape[i];
        if (j >= 0 && xs == sh[i]) st[i] = x->strides[j];
        else if (xs == 1 && sh[i] >= 0) st[i] = 0;
        else
            return pn_error_null(PN_ERR_SHAPE, "expand: cannot expand %s to %s (dim %d: %lld vs %lld)",
                                 pn_shape_str(x), pn_dims_str(nd, shape), i + 1, (long long)xs, (long long)shape[i]);
    }
    if (pn_check_shape("expand", nd, sh, x->dt)) return NULL;
    return make_view(x, nd, sh, st, x->offset, "expand", expand_bw);
}

/* ---- contiguous / clone / cast --------------------------------------------------------------------- */
static pn_status identity_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    (void)n;
    pn_retain(g);
    gin[0] = g;
    return PN_OK;
}

pn_tensor *pn_clone(pn_tensor *x) {
    if (!x) return pn_error_null(PN_ERR_ARG, "clone: nil tensor");
    pn_tensor *out = pn_empty_like(x);
    if (!out) return NULL;
    pn_copy_(out, x);
    if (pn_ag_needed(1, &x) && !pn_ag_record(out, "clone", identity_bw, 1, &x)) {
        pn_release(out);
        return NULL;
    }
    return out;
}

pn_tensor *pn_contiguous(pn_tensor *x) {
    if (!x) return pn_error_null(PN_ERR_ARG, "contiguous: nil tensor");
    if (pn_is_contiguous(x)) {
        pn_retain(x);
        return x;
    }
    return pn_clone(x);
}

static pn_status cast_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    gin[0] = pn_to_dtype(g, n->in[0].dtype);
    return gin[0] ? PN_OK : PN_ERR_DTYPE;
}

/* A float cast to an integer dtype truncates toward zero, as C and PyTorch do. A NaN, an
 * infinity or a value whose truncation the dtype cannot hold has no integer (C leaves the
 * conversion undefined; x86 gives INT64_MIN for NaN): an error naming the first such position,
 * never a made-up number. Scanned serially on the host (a device tensor is copied down first). */
static pn_status check_int_cast(pn_tensor *x, int dtype) {
    if (!pn_is_float(x->dt) || pn_is_float(dtype) || pn_numel(x) == 0) return PN_OK;
    /* the open interval (lo, hi) of values whose truncation fits; -0x1.0000000000001p63 is the
     * double just below -2^63, so every double above it truncates to >= INT64_MIN */
    const double lo = dtype == PN_I32 ? -2147483649.0 : dtype == PN_I64 ? -0x1.0000000000001p63 : -1.0;
    const double hi = dtype == PN_I32 ? 2147483648.0 : dtype == PN_I64 ? 0x1p63 : 256.0;
    pn_tensor *h = x;
    if (x->dev != PN_CPU) {
        int mode = pn_set_grad_enabled(0);
        h = pn_to_device(x, PN_CPU);
        pn_set_grad_enabled(mode);
        if (!h) return PN_ERR_DEVICE;
    }
    pn_iter it;
    pn_iter_init(&it, h->nd, h->sizes, 1, (pn_tensor *const[]){h}, NULL);
    const char *p = pn_ptr(h);
    int64_t bad = -1;
    double v = 0;
    for (int64_t r = 0; r < it.rows && bad < 0; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            v = pn_ld(p, h->dt, off[0] + i * it.istride[0]);
            if (!(v > lo && v < hi)) {
                bad = r * it.inner + i;
                break;
            }
        }
    }
    if (h != x) pn_release(h);
    if (bad < 0) return PN_OK;
    return pn_error(PN_ERR_ARG, "to_dtype: x %s %s holds %.17g at %s, which %s cannot hold (a cast truncates toward "
                    "zero; NaN, infinities and values out of the range of %s have no integer)", pn_shape_str(x),
                    pn_dtype_name(x->dt), v, pn_pos_str(x->nd, x->sizes, bad), pn_dtype_name(dtype),
                    pn_dtype_name(dtype));
}

pn_tensor *pn_to_dtype(pn_tensor *x, int dtype) {
    if (!x) return pn_error_null(PN_ERR_ARG, "to_dtype: nil tensor");
    if (dtype < PN_F32 || dtype > PN_U8) return pn_error_null(PN_ERR_DTYPE, "to_dtype: unknown dtype %d", dtype);
    if (dtype == x->dt) {
        pn_retain(x);
        return x;
    }
    if (check_int_cast(x, dtype)) return NULL;
    pn_tensor *out = pn_empty(x->nd, x->sizes, dtype, x->dev);
    if (!out) return NULL;
    pn_copy_(out, x);
    /* only float → float casts carry gradients */
    if (pn_is_float(dtype) && pn_ag_needed(1, &x) && !pn_ag_record(out, "to_dtype", cast_bw, 1, &x)) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* ---- devices ------------------------------------------------------------------------------ */
static pn_status to_device_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    gin[0] = pn_to_device(g, (int)n->iv[0]);
    return gin[0] ? PN_OK : PN_ERR_DEVICE;
}

/* The bytes of x (made contiguous on its own device first) copied to device: the device's
 * upload kernel when the copy goes to it, its download kernel when it comes back. */
pn_tensor *pn_to_device(pn_tensor *x, int device) {
    if (!x) return pn_error_null(PN_ERR_ARG, "to_device: nil tensor");
    if (device == x->dev) {
        pn_retain(x);
        return x;
    }
    const pn_kernels *from, *to;
    if (pn_backend_for("to_device", x->dev, &from) || pn_backend_for("to_device", device, &to)) return NULL;
    pn_tensor *c = NULL, *out = pn_empty(x->nd, x->sizes, x->dt, device);
    pn_status st = out ? PN_OK : PN_ERR_OOM;
    if (!st) st = (c = pn_contig(x)) ? PN_OK : PN_ERR_OOM;
    size_t nbytes = (size_t)pn_numel(x) * pn_elsize(x->dt);
    if (!st && nbytes) {
        if (device == PN_CPU) st = PN_KCALL("to_device", from, download, pn_ptr(out), pn_ptr(c), nbytes);
        else st = PN_KCALL("to_device", to, upload, pn_ptr(out), pn_ptr(c), nbytes);
    }
    pn_release(c);
    if (!st && pn_is_float(x->dt) && pn_ag_needed(1, &x)) {
        pn_node *n = pn_ag_record(out, "to_device", to_device_bw, 1, &x);
        if (n) n->iv[0] = x->dev;
        else st = PN_ERR_OOM;
    }
    if (st) {
        pn_release(out);
        return NULL;
    }
    return out;
}
