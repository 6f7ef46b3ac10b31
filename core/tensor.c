/* tensor.c — tensor structs: lifetime, creation, dims/broadcast helpers, the
 * N-operand iterator, copies and casts, in-place updates, element access. */
#include "backend.h"

#include <stdio.h>

const char *pn_version(void) { return "0.1.0"; }

const char *pn_dtype_name(int dt) {
    static const char *names[] = {"f32", "f64", "i32", "i64", "u8"};
    return (dt >= 0 && dt <= PN_U8) ? names[dt] : "?";
}
int pn_dtype_size(int dt) { return (int)pn_elsize(dt); }

/* ---- lifetime ---------------------------------------------------------------- */
void pn_retain(pn_tensor *t) {
    if (t) __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
}

void pn_release(pn_tensor *t) {
    if (!t) return;
    if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    pn_storage_release(t->storage);
    pn_release(t->gradt);
    pn_node_release(t->fn);
    free(t);
    pn_count_tensor(-1);
}

/* ---- shape helpers -------------------------------------------------------------- */
int64_t pn_shape_numel(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}
int64_t pn_numel(const pn_tensor *t) { return pn_shape_numel(t->nd, t->sizes); }

pn_status pn_check_shape(const char *op, int nd, const int64_t *shape, int dtype) {
    if (nd < 0 || nd > PN_MAX_DIMS)
        return pn_error(PN_ERR_ARG, "%s: %d dims requested, at most %d supported", op, nd, PN_MAX_DIMS);
    /* Π max(size, 1) · element size must fit in int64: then every stride, offset, element and
     * byte count of a tensor of this shape does (size-0 dims count as 1 for the strides) */
    int64_t span = dtype >= PN_F32 && dtype <= PN_U8 ? (int64_t)pn_elsize(dtype) : 8;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0)
            return pn_error(PN_ERR_ARG, "%s: negative size %lld at dim %d in shape %s", op, (long long)shape[i], i + 1,
                            pn_dims_str(nd, shape));
        if (__builtin_mul_overflow(span, shape[i] > 0 ? shape[i] : 1, &span))
            return pn_error(PN_ERR_ARG, "%s: shape %s is too large (more than 2^63 bytes of %s)", op,
                            pn_dims_str(nd, shape), dtype >= PN_F32 && dtype <= PN_U8 ? pn_dtype_name(dtype) : "data");
    }
    return PN_OK;
}

void pn_contiguous_strides(int nd, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int pn_is_contiguous(const pn_tensor *t) {
    for (int i = 0; i < t->nd; i++)
        if (t->sizes[i] == 0) return 1; /* no element to be out of place (pn_contiguous_strides' strides, or any) */
    int64_t s = 1;
    for (int i = t->nd - 1; i >= 0; i--) {
        if (t->sizes[i] != 1 && t->strides[i] != s) return 0;
        s *= t->sizes[i];
    }
    return 1;
}

bool pn_same_shape(const pn_tensor *a, const pn_tensor *b) {
    if (a->nd != b->nd) return false;
    for (int i = 0; i < a->nd; i++)
        if (a->sizes[i] != b->sizes[i]) return false;
    return true;
}

pn_status pn_wrap_dim(const char *op, int dim, int nd, int *out) {
    int lo = nd ? -nd : -1, hi = nd ? nd - 1 : 0;
    if (dim < lo || dim > hi)
        return pn_error(PN_ERR_INDEX, "%s: dim %d out of range for a tensor with %d dims", op, PN_POS(dim), nd);
    *out = dim < 0 ? dim + (nd ? nd : 1) : dim;
    return PN_OK;
}

pn_status pn_broadcast_shape(const char *op, int nda, const int64_t *sa, int ndb, const int64_t *sb,
                             int *nd_out, int64_t *out) {
    int nd = nda > ndb ? nda : ndb;
    for (int i = 0; i < nd; i++) {
        int ia = nda - nd + i, ib = ndb - nd + i;
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return pn_error(PN_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)",
                            op, pn_dims_str(nda, sa), pn_dims_str(ndb, sb), i + 1, (long long)da, (long long)db);
        out[i] = da == 1 ? db : da;
    }
    *nd_out = nd;
    return PN_OK;
}

int64_t pn_suffix_numel(const pn_tensor *t, const pn_tensor *big) {
    if (t->nd > big->nd || !pn_is_contiguous(t)) return -1;
    int64_t C = 1;
    int k = 0;
    for (; k < t->nd && t->sizes[t->nd - 1 - k] == big->sizes[big->nd - 1 - k]; k++) C *= t->sizes[t->nd - 1 - k];
    for (; k < t->nd; k++)
        if (t->sizes[t->nd - 1 - k] != 1) return -1;
    return C;
}

void pn_broadcast_strides(const pn_tensor *t, int nd, const int64_t *shape, int64_t *strides) {
    for (int i = 0; i < nd; i++) {
        int it = t->nd - nd + i;
        strides[i] = (it >= 0 && t->sizes[it] == shape[i] && shape[i] != 1) ? t->strides[it] : 0;
    }
}

pn_status pn_check_float(const char *op, const char *arg, const pn_tensor *t) {
    if (!t) return pn_error(PN_ERR_ARG, "%s: %s is nil", op, arg);
    if (!pn_is_float(t->dt))
        return pn_error(PN_ERR_DTYPE, "%s: %s %s has dtype %s, expected f32 or f64", op, arg,
                        pn_shape_str(t), pn_dtype_name(t->dt));
    return PN_OK;
}

pn_status pn_check_cpu(const char *op, const char *arg, const pn_tensor *t) {
    if (!t) return pn_error(PN_ERR_ARG, "%s: %s is nil", op, arg);
    if (t->dev != PN_CPU)
        return pn_error(PN_ERR_DEVICE, "%s: %s %s is on cuda; this op runs on the cpu", op, arg, pn_shape_str(t));
    return PN_OK;
}

/* ---- iteration ------------------------------------------------------------------- */
void pn_iter_init(pn_iter *it, int nd, const int64_t *shape, int nops, pn_tensor *const *ops,
                  const int64_t (*strides_override)[PN_MAX_DIMS]) {
    int64_t st[PN_ITER_MAX_OPS][PN_MAX_DIMS];
    for (int k = 0; k < nops; k++) {
        if (strides_override) memcpy(st[k], strides_override[k], sizeof st[k]);
        else pn_broadcast_strides(ops[k], nd, shape, st[k]);
    }
    it->nops = nops;
    it->numel = pn_shape_numel(nd, shape);
    /* drop size-1 dims, then merge neighbours that are contiguous for every operand */
    int m = 0;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == 1) continue;
        if (m > 0) {
            bool merge = true;
            for (int k = 0; k < nops; k++)
                if (it->strides[k][m - 1] != st[k][i] * shape[i]) { merge = false; break; }
            if (merge) {
                it->shape[m - 1] *= shape[i];
                for (int k = 0; k < nops; k++) it->strides[k][m - 1] = st[k][i];
                continue;
            }
        }
        it->shape[m] = shape[i];
        for (int k = 0; k < nops; k++) it->strides[k][m] = st[k][i];
        m++;
    }
    if (m == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
        m = 1;
    }
    it->nd = m;
    it->inner = it->shape[m - 1];
    for (int k = 0; k < nops; k++) it->istride[k] = it->strides[k][m - 1];
    it->rows = it->numel == 0 ? 0 : it->numel / (it->inner ? it->inner : 1);
}

void pn_iter_row(const pn_iter *it, int64_t row, int64_t *off) {
    for (int k = 0; k < it->nops; k++) off[k] = 0;
    for (int d = it->nd - 2; d >= 0; d--) {
        int64_t i = row % it->shape[d];
        row /= it->shape[d];
        for (int k = 0; k < it->nops; k++) off[k] += i * it->strides[k][d];
    }
}

void pn_iter_seek(const pn_iter *it, int64_t row, pn_iter_pos *p) {
    p->row = row;
    for (int k = 0; k < it->nops; k++) p->off[k] = 0;
    for (int d = it->nd - 2; d >= 0; d--) {
        int64_t i = row % it->shape[d];
        row /= it->shape[d];
        p->idx[d] = i;
        for (int k = 0; k < it->nops; k++) p->off[k] += i * it->strides[k][d];
    }
}

/* ---- creation ------------------------------------------------------------------- */
pn_tensor *pn_tensor_view_of(pn_storage *s, int nd, const int64_t *shape, const int64_t *strides,
                             int64_t offset, int dtype) {
    if (pn_check_shape("view", nd, shape, dtype)) return NULL; /* every view's geometry, once */
    pn_tensor *t = calloc(1, sizeof *t);
    if (!t) return pn_error_null(PN_ERR_OOM, "tensor: out of memory");
    pn_count_tensor(1);
    t->nd = nd;
    for (int i = 0; i < nd; i++) {
        t->sizes[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    t->dt = dtype;
    t->dev = s->dev;
    t->refcount = 1;
    t->storage = s;
    pn_storage_retain(s);
    return t;
}

static pn_status check_new(const char *op, int nd, const int64_t *shape, int dtype, int device) {
    if (dtype < PN_F32 || dtype > PN_U8) return pn_error(PN_ERR_DTYPE, "%s: unknown dtype %d", op, dtype);
    PN_TRY(pn_check_shape(op, nd, shape, dtype));
    const pn_kernels *k;
    return pn_backend_for(op, device, &k); /* the error says why the device is missing */
}

static pn_tensor *new_tensor(const char *op, int nd, const int64_t *shape, int dtype, int device) {
    if (check_new(op, nd, shape, dtype, device)) return NULL;
    int64_t n = pn_shape_numel(nd, shape);
    pn_storage *s = pn_storage_new((size_t)n * pn_elsize(dtype), device);
    if (!s) return NULL;
    int64_t st[PN_MAX_DIMS];
    pn_contiguous_strides(nd, shape, st);
    pn_tensor *t = pn_tensor_view_of(s, nd, shape, st, 0, dtype);
    pn_storage_release(s);
    return t;
}

pn_tensor *pn_empty(int nd, const int64_t *shape, int dtype, int device) {
    return new_tensor("empty", nd, shape, dtype, device);
}

pn_tensor *pn_empty_like(const pn_tensor *x) { return pn_empty(x->nd, x->sizes, x->dt, x->dev); }

pn_tensor *pn_contig_copy(const pn_tensor *x) {
    pn_tensor *c = pn_empty_like(x);
    if (c && pn_copy_(c, (pn_tensor *)x) != PN_OK) {
        pn_release(c);
        return NULL;
    }
    return c;
}

pn_tensor *pn_contig(pn_tensor *x) {
    if (!x) return NULL;
    if (pn_is_contiguous(x)) {
        pn_retain(x);
        return x;
    }
    return pn_contig_copy(x);
}

/* a fresh tensor filled with v by its device's fill kernel */
static pn_tensor *new_filled(const char *op, int nd, const int64_t *shape, double v, int dtype, int device) {
    pn_tensor *t = new_tensor(op, nd, shape, dtype, device);
    const pn_kernels *k;
    if (t && (pn_backend_for(op, device, &k) || PN_KCALL(op, k, fill, t, v))) {
        pn_release(t);
        return NULL;
    }
    return t;
}

pn_tensor *pn_zeros(int nd, const int64_t *shape, int dtype, int device) {
    return new_filled("zeros", nd, shape, 0, dtype, device);
}

pn_tensor *pn_full(int nd, const int64_t *shape, double value, int dtype, int device) {
    return new_filled("full", nd, shape, value, dtype, device);
}

pn_tensor *pn_arange(double start, double end, double step, int dtype, int device) {
    if (step == 0 || !isfinite(step) || !isfinite(start) || !isfinite(end))
        return pn_error_null(PN_ERR_ARG, "arange: start %g, end %g, step %g must be finite with step != 0",
                             start, end, step);
    double span = (end - start) / step;
    int64_t n = span > 0 ? (int64_t)ceil(span - 1e-12) : 0;
    pn_tensor *t = pn_empty(1, &n, dtype, device);
    const pn_kernels *k;
    if (t && (pn_backend_for("arange", device, &k) || PN_KCALL("arange", k, arange, t, start, step))) {
        pn_release(t);
        return NULL;
    }
    return t;
}

pn_status pn_cpu_arange(pn_tensor *out, double start, double step) {
    void *p = pn_ptr(out);
    const int64_t n = pn_numel(out);
    for (int64_t i = 0; i < n; i++) pn_st(p, out->dt, i, start + (double)i * step);
    return PN_OK;
}

pn_tensor *pn_from_buffer(int nd, const int64_t *shape, int dtype, const void *data) {
    pn_tensor *t = pn_empty(nd, shape, dtype, PN_CPU);
    if (!t) return NULL;
    if (!data) {
        pn_release(t);
        return pn_error_null(PN_ERR_ARG, "from_buffer: data is NULL for shape %s", pn_dims_str(nd, shape));
    }
    memcpy(t->storage->data, data, (size_t)pn_numel(t) * pn_elsize(dtype));
    return t;
}

void *pn_data_ptr(const pn_tensor *t) { return pn_ptr(t); }

/* ---- copies ------------------------------------------------------------------------ */
/* dst[...] = cast(src[...]) with src broadcast to dst's shape. No autograd. */
pn_status pn_cpu_copy(pn_tensor *dst, const pn_tensor *src) {
    pn_iter it;
    pn_iter_init(&it, dst->nd, dst->sizes, 2, (pn_tensor *const[]){dst, (pn_tensor *)src}, NULL);
    char *d = pn_ptr(dst);
    const char *s = pn_ptr(src);
    int dt = dst->dt, st = src->dt;
    size_t es = pn_elsize(dt);
    pn_iter_pos pos = PN_ITER_POS_INIT;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static) firstprivate(pos)
    for (int64_t r = 0; r < it.rows; r++) {
        pn_iter_at(&it, r, &pos);
        const int64_t *off = pos.off;
        if (dt == st && it.istride[0] == 1 && it.istride[1] == 1) {
            pn_copy_run(d + off[0] * es, s + off[1] * es, (size_t)it.inner * es);
        } else if (dt == PN_F32 && st == PN_F32) {
            float *o = (float *)d + off[0];
            const float *x = (const float *)s + off[1];
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] = x[i * it.istride[1]];
        } else if (dt == PN_F64 && st == PN_F64) {
            double *o = (double *)d + off[0];
            const double *x = (const double *)s + off[1];
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] = x[i * it.istride[1]];
        } else {
            for (int64_t i = 0; i < it.inner; i++)
                pn_st(d, dt, off[0] + i * it.istride[0], pn_ld(s, st, off[1] + i * it.istride[1]));
        }
    }
    return PN_OK;
}

pn_status pn_copy_(pn_tensor *dst, const pn_tensor *src) {
    if (!dst || !src) return pn_error(PN_ERR_ARG, "copy_: nil tensor");
    if (dst->dev != src->dev) { /* across devices: move src over first (not recorded) */
        int mode = pn_set_grad_enabled(0);
        pn_tensor *moved = pn_to_device((pn_tensor *)src, dst->dev);
        pn_set_grad_enabled(mode);
        if (!moved) return PN_ERR_DEVICE;
        pn_status st = pn_copy_(dst, moved);
        pn_release(moved);
        return st;
    }
    int nd, dev;
    const pn_kernels *k;
    PN_TRY(pn_kernels_for("copy_", 2, (const pn_tensor *const[]){dst, src}, (const char *const[]){"dst", "src"}, &dev,
                          &k));
    int64_t shape[PN_MAX_DIMS];
    PN_TRY(pn_broadcast_shape("copy_", dst->nd, dst->sizes, src->nd, src->sizes, &nd, shape));
    if (nd != dst->nd || pn_shape_numel(nd, shape) != pn_numel(dst))
        return pn_error(PN_ERR_SHAPE, "copy_: src %s does not broadcast to dst %s", pn_shape_str(src),
                        pn_shape_str(dst));
    pn_bump_version(dst);
    return PN_KCALL("copy_", k, copy, dst, src);
}

/* LuaJIT keeps its own values in the NaN space (NaN-boxing): a NaN whose payload bits are not
 * the canonical ones — the device's all-ones fill pattern, a payload carried through arithmetic
 * from a NaN input — read through the FFI can come out as nil or worse. So every NaN that
 * leaves the core for the host reader is the canonical one (the value is a NaN either way). */
static void canonical_nans(void *p, int dt, int64_t n) {
    if (dt == PN_F64) {
        double *d = p;
        for (int64_t i = 0; i < n; i++)
            if (d[i] != d[i]) d[i] = NAN;
    } else if (dt == PN_F32) {
        float *f = p;
        for (int64_t i = 0; i < n; i++)
            if (f[i] != f[i]) f[i] = NAN;
    }
}

/* A CPU copy of the device tensor t (not recorded), for the host reads below: NULL + error. */
static pn_tensor *host_copy(const pn_tensor *t) {
    int mode = pn_set_grad_enabled(0);
    pn_tensor *h = pn_to_device((pn_tensor *)t, PN_CPU);
    pn_set_grad_enabled(mode);
    return h;
}

pn_status pn_to_buffer(const pn_tensor *t, void *dst, size_t nbytes) {
    size_t need = (size_t)pn_numel(t) * pn_elsize(t->dt);
    if (nbytes < need)
        return pn_error(PN_ERR_ARG, "to_buffer: buffer of %zu bytes is too small for %s %s (%zu bytes)", nbytes,
                        pn_dtype_name(t->dt), pn_shape_str(t), need);
    if (t->dev != PN_CPU) { /* download, then the host path */
        pn_tensor *h = host_copy(t);
        if (!h) return PN_ERR_DEVICE;
        pn_status st = pn_to_buffer(h, dst, nbytes);
        pn_release(h);
        return st;
    }
    if (pn_is_contiguous(t)) {
        memcpy(dst, pn_ptr(t), need);
        canonical_nans(dst, t->dt, pn_numel(t));
        return PN_OK;
    }
    /* wrap dst as a contiguous tensor over borrowed memory and copy into it */
    pn_storage s = {.data = dst, .nbytes = need, .refcount = 2, .dev = PN_CPU};
    int64_t st[PN_MAX_DIMS];
    pn_contiguous_strides(t->nd, t->sizes, st);
    pn_tensor tmp = {.nd = t->nd, .dt = t->dt, .storage = &s, .refcount = 1};
    memcpy(tmp.sizes, t->sizes, sizeof tmp.sizes);
    memcpy(tmp.strides, st, sizeof st);
    pn_status rc = pn_cpu_copy(&tmp, t);
    canonical_nans(dst, t->dt, pn_numel(t));
    return rc;
}

/* ---- in-place, no autograd ------------------------------------------------------------ */
pn_status pn_fill_(pn_tensor *t, double v) {
    if (!t) return pn_error(PN_ERR_ARG, "fill_: nil tensor");
    const pn_kernels *k;
    PN_TRY(pn_backend_for("fill_", t->dev, &k));
    pn_bump_version(t);
    return PN_KCALL("fill_", k, fill, t, v);
}

pn_status pn_cpu_fill(pn_tensor *t, double v) {
    if (v == 0 && pn_is_contiguous(t) && !signbit(v)) { /* all-zero bits for every dtype */
        memset(pn_ptr(t), 0, (size_t)pn_numel(t) * pn_elsize(t->dt));
        return PN_OK;
    }
    pn_iter it;
    pn_iter_init(&it, t->nd, t->sizes, 1, &t, NULL);
    char *d = pn_ptr(t);
    int dt = t->dt;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        if (dt == PN_F32) {
            float *o = (float *)d + off[0], fv = (float)v;
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] = fv;
        } else {
            for (int64_t i = 0; i < it.inner; i++) pn_st(d, dt, off[0] + i * it.istride[0], v);
        }
    }
    return PN_OK;
}

pn_status pn_axpy_(pn_tensor *y, double alpha, const pn_tensor *x) {
    if (!y || !x) return pn_error(PN_ERR_ARG, "axpy_: nil tensor");
    if (!pn_same_shape(x, y) || x->dt != y->dt)
        return pn_error(PN_ERR_SHAPE, "axpy_: y %s %s and x %s %s must match", pn_dtype_name(y->dt), pn_shape_str(y),
                        pn_dtype_name(x->dt), pn_shape_str(x));
    int dev;
    const pn_kernels *k;
    PN_TRY(pn_kernels_for("axpy_", 2, (const pn_tensor *const[]){y, x}, (const char *const[]){"y", "x"}, &dev, &k));
    pn_bump_version(y);
    return PN_KCALL("axpy_", k, axpy, y, alpha, x);
}

pn_status pn_cpu_axpy(pn_tensor *y, double alpha, const pn_tensor *x) {
    pn_iter it;
    pn_iter_init(&it, y->nd, y->sizes, 2, (pn_tensor *const[]){y, (pn_tensor *)x}, NULL);
    char *d = pn_ptr(y);
    const char *s = pn_ptr(x);
    int dt = y->dt;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        if (dt == PN_F32) {
            float *o = (float *)d + off[0], a = (float)alpha;
            const float *p = (const float *)s + off[1];
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] += a * p[i * it.istride[1]];
        } else if (dt == PN_F64) {
            double *o = (double *)d + off[0];
            const double *p = (const double *)s + off[1];
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] += alpha * p[i * it.istride[1]];
        } else {
            for (int64_t i = 0; i < it.inner; i++) {
                int64_t a = off[0] + i * it.istride[0];
                pn_st(d, dt, a, pn_ld(d, dt, a) + alpha * pn_ld(s, dt, off[1] + i * it.istride[1]));
            }
        }
    }
    return PN_OK;
}

pn_status pn_scale_(pn_tensor *y, double alpha) {
    if (!y) return pn_error(PN_ERR_ARG, "scale_: nil tensor");
    const pn_kernels *k;
    PN_TRY(pn_backend_for("scale_", y->dev, &k));
    pn_bump_version(y);
    return PN_KCALL("scale_", k, scale, y, alpha);
}

pn_status pn_cpu_scale(pn_tensor *y, double alpha) {
    pn_iter it;
    pn_iter_init(&it, y->nd, y->sizes, 1, &y, NULL);
    char *d = pn_ptr(y);
    int dt = y->dt;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        if (dt == PN_F32) {
            float *o = (float *)d + off[0], a = (float)alpha;
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] *= a;
        } else if (dt == PN_F64) {
            double *o = (double *)d + off[0];
            for (int64_t i = 0; i < it.inner; i++) o[i * it.istride[0]] *= alpha;
        } else for (int64_t i = 0; i < it.inner; i++) {
            int64_t a = off[0] + i * it.istride[0];
            pn_st(d, dt, a, pn_ld(d, dt, a) * alpha);
        }
    }
    return PN_OK;
}

/* ---- element access ---------------------------------------------------------------------- */
pn_status pn_item(const pn_tensor *t, double *out) {
    if (!t) return pn_error(PN_ERR_ARG, "item: nil tensor");
    if (pn_numel(t) != 1)
        return pn_error(PN_ERR_SHAPE, "item: tensor %s has %lld elements, expected 1", pn_shape_str(t),
                        (long long)pn_numel(t));
    if (t->dev != PN_CPU) return pn_get(t, (const int64_t[PN_MAX_DIMS]){0}, out);
    *out = pn_ld(pn_ptr(t), t->dt, 0);
    if (*out != *out) *out = NAN;
    return PN_OK;
}

pn_status pn_get(const pn_tensor *t, const int64_t *index, double *out) {
    if (!t) return pn_error(PN_ERR_ARG, "get: nil tensor");
    int64_t off = 0;
    for (int i = 0; i < t->nd; i++) {
        if (index[i] < 0 || index[i] >= t->sizes[i])
            return pn_error(PN_ERR_INDEX, "get: index %lld out of range for dim %d of %s", (long long)PN_POS(index[i]), i + 1,
                            pn_shape_str(t));
        off += index[i] * t->strides[i];
    }
    if (t->dev != PN_CPU) { /* download the one element */
        const pn_kernels *k;
        uint64_t word = 0;
        size_t es = pn_elsize(t->dt);
        PN_TRY(pn_backend_for("get", t->dev, &k));
        PN_TRY(PN_KCALL("get", k, download, &word, pn_ptr(t) + off * (int64_t)es, es));
        *out = pn_ld(&word, t->dt, 0);
        if (*out != *out) *out = NAN; /* canonical (see canonical_nans) */
        return PN_OK;
    }
    *out = pn_ld(pn_ptr(t), t->dt, off);
    if (*out != *out) *out = NAN;
    return PN_OK;
}
