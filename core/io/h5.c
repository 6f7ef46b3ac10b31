/* h5.c — tensors and attributes in HDF5 files (the pn_h5_* functions of penumbra.h).
 *
 * One pn_h5 wraps one open file. Every failure becomes a pn_error message naming the
 * op ("h5 read", "h5 write", …), the file path and the dataset/attribute, e.g.
 *     h5 read: dataset 'foo' not found in /tmp/x.h5
 * HDF5's own error printing is switched off (H5Eset_auto2) on every entry; where HDF5
 * is the only one that knows why something failed, its innermost error description is
 * appended to our message. Every hid_t is closed on every path (goto cleanup).
 *
 * Type mapping on read (file type → our dtype; HDF5 converts in H5Dread/H5Aread):
 *     float ≤ 4 bytes (f16, f32)        → f32      float 8+ bytes → f64
 *     int8, int16, int32, uint16        → i32      int64, uint32, uint64 → i64
 *     uint8                             → u8       enum: by its base integer, but u8 for
 *                                                   a 1-byte enum with no negative member
 *                                                   (h5py's bool)
 * uint64 values above INT64_MAX are clipped by HDF5's conversion (its default overflow
 * rule saturates). Strings, compounds, arrays, … are refused with a message.
 * On write we store little-endian IEEE f32/f64, i32, i64, u8 — what h5py/h5dump expect.
 *
 * Names: "a/b/c" and "/a/b/c" are the same dataset; missing groups are created on
 * write. Listings give full paths without the leading '/', sorted by name, '\n'-joined.
 * Buffer protocol of pn_h5_list, pn_h5_attr_names and pn_h5_attr_string: the return value is the
 * length of the full text (no terminating NUL); at most size-1 bytes plus a NUL are
 * written, so a return value >= size means "call again with a buffer of ret+1 bytes".
 */
#include "internal.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef H5I_INVALID_HID
#define H5I_INVALID_HID (-1)
#endif

struct pn_h5 {
    hid_t file;
    int writable;
    char *path;   /* for messages */
};

/* ---- small helpers ------------------------------------------------------------------ */

/* Entry of every public function: HDF5 must not print to stderr; stale errors go. */
static void h5_quiet(void) {
    /* No HDF5 clean-up at exit: after a write fails (a full disk) a file may not close, and the
     * library's own atexit pass would then crash retrying it. A file we could not close stays
     * as it was at its last successful flush; every other file is closed by its owner. */
    static int no_atexit;
    if (!no_atexit) {
        H5dont_atexit();
        no_atexit = 1;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    H5Eclear2(H5E_DEFAULT);
}

static herr_t detail_cb(unsigned n, const H5E_error2_t *e, void *data) {
    /* walking upward, entry 0 is the most specific error: the one that says why */
    if (n == 0 && e->desc) snprintf((char *)data, 256, "%s", e->desc);
    return 0;
}

/* "; <innermost HDF5 error>" or "" — for failures only HDF5 can explain. */
static const char *h5_detail(void) {
    static _Thread_local char desc[256], out[272];
    desc[0] = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, detail_cb, desc);
    H5Eclear2(H5E_DEFAULT);
    if (!desc[0]) return "";
    snprintf(out, sizeof out, " (%s)", desc);
    return out;
}

static void close_id(hid_t id) {
    if (id < 0) return;
    switch (H5Iget_type(id)) {
    case H5I_FILE: H5Fclose(id); break;
    case H5I_GROUP: H5Gclose(id); break;
    case H5I_DATASET: H5Dclose(id); break;
    case H5I_ATTR: H5Aclose(id); break;
    case H5I_DATATYPE: H5Tclose(id); break;
    case H5I_DATASPACE: H5Sclose(id); break;
    case H5I_GENPROP_LST: H5Pclose(id); break;
    default: H5Idec_ref(id); break;
    }
}

/* growing text buffer for listings */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *s, const char *x, size_t len) {
    if (s->oom) return;
    if (s->n + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + len + 1) cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, x, len);
    s->n += len;
    s->p[s->n] = 0;
}

/* The buffer protocol (see the top): copy what fits, return the full length. */
static int64_t sb_deliver(sbuf *s, char *buf, int64_t size, const char *op, const pn_h5 *f) {
    if (s->oom) {
        free(s->p);
        return pn_error(PN_ERR_OOM, "%s: out of memory listing %s", op, f->path), -1;
    }
    if (buf && size > 0) {
        size_t k = s->n < (size_t)(size - 1) ? s->n : (size_t)(size - 1);
        if (k) memcpy(buf, s->p, k);
        buf[k] = 0;
    }
    int64_t n = (int64_t)s->n;
    free(s->p);
    return n;
}

static pn_status check_file(const char *op, const pn_h5 *f) {
    if (!f) return pn_error(PN_ERR_ARG, "%s: file handle is NULL (closed?)", op);
    if (f->file < 0) return pn_error(PN_ERR_STATE, "%s: %s is closed", op, f->path);
    return PN_OK;
}

static pn_status check_name(const char *op, const pn_h5 *f, const char *what, const char *name) {
    if (!name || !name[0]) return pn_error(PN_ERR_ARG, "%s: empty %s name in %s", op, what, f->path);
    return PN_OK;
}

static pn_status check_writable(const char *op, const pn_h5 *f) {
    if (!f->writable) return pn_error(PN_ERR_IO, "%s: %s is open read-only (mode 'r')", op, f->path);
    return PN_OK;
}

static bool is_root(const char *name) {
    for (const char *c = name; *c; c++)
        if (*c != '/') return false;
    return true;
}

/* What name refers to: H5I_GROUP, H5I_DATASET, another H5I_* for other objects, or
 * H5I_BADID when there is nothing (any missing component, or a dangling soft link). */
static H5I_type_t obj_type(hid_t file, const char *name) {
    if (is_root(name)) return H5I_GROUP;
    /* H5Lexists fails on a path whose parent is missing: check each prefix in turn */
    size_t len = strlen(name);
    char *p = malloc(len + 1);
    if (!p) return H5I_BADID;
    memcpy(p, name, len + 1);
    H5I_type_t type = H5I_BADID;
    for (size_t i = 1; i <= len; i++) {
        if (i < len && p[i] != '/') continue;
        if (p[i - 1] == '/') continue;     /* "a//b", trailing '/' */
        char c = p[i];
        p[i] = 0;
        htri_t ok = H5Lexists(file, p, H5P_DEFAULT);
        if (ok > 0) ok = H5Oexists_by_name(file, p, H5P_DEFAULT);
        p[i] = c;
        if (ok <= 0) goto done;
    }
    hid_t o = H5Oopen(file, name, H5P_DEFAULT);
    if (o >= 0) {
        type = H5Iget_type(o);
        H5Oclose(o);
    }
done:
    free(p);
    H5Eclear2(H5E_DEFAULT);
    return type;
}

/* Our dtype → (file type, memory type). */
static hid_t file_type_of(int dt) {
    switch (dt) {
    case PN_F32: return H5T_IEEE_F32LE;
    case PN_F64: return H5T_IEEE_F64LE;
    case PN_I32: return H5T_STD_I32LE;
    case PN_I64: return H5T_STD_I64LE;
    default: return H5T_STD_U8LE;
    }
}
static hid_t mem_type_of(int dt) {
    switch (dt) {
    case PN_F32: return H5T_NATIVE_FLOAT;
    case PN_F64: return H5T_NATIVE_DOUBLE;
    case PN_I32: return H5T_NATIVE_INT32;
    case PN_I64: return H5T_NATIVE_INT64;
    default: return H5T_NATIVE_UINT8;
    }
}

/* File type → our dtype (see the table at the top); -1 when not numeric. */
static int dtype_of_type(hid_t type) {
    switch (H5Tget_class(type)) {
    case H5T_FLOAT: return H5Tget_size(type) <= 4 ? PN_F32 : PN_F64;
    case H5T_INTEGER: {
        size_t sz = H5Tget_size(type);
        int is_signed = H5Tget_sign(type) == H5T_SGN_2;
        if (sz == 1) return is_signed ? PN_I32 : PN_U8;
        if (sz == 2) return PN_I32;
        if (sz == 4) return is_signed ? PN_I32 : PN_I64;
        return PN_I64;
    }
    case H5T_ENUM: {
        /* by its base integer, except that a one-byte enum without negative members
         * (h5py's bool {FALSE, TRUE}, small label sets) becomes u8 like our masks */
        hid_t base = H5Tget_super(type);
        if (base < 0) return -1;
        int dt = dtype_of_type(base);
        if (H5Tget_size(base) == 1 && H5Tget_sign(base) == H5T_SGN_2) {
            int nm = H5Tget_nmembers(type), nonneg = nm >= 0;
            for (int i = 0; i < nm && nonneg; i++) {
                int8_t v = -1;
                nonneg = H5Tget_member_value(type, (unsigned)i, &v) >= 0 && v >= 0;
            }
            if (nonneg) dt = PN_U8;
        }
        H5Tclose(base);
        return dt;
    }
    default: return -1;
    }
}

static const char *class_name(H5T_class_t c) {
    switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
    }
}

/* A tensor's data as one row-major block: the tensor's own memory when contiguous, else
 * a malloc'd copy (*owned set). NULL + error on OOM. */
static const void *contiguous_data(const pn_tensor *t, void **owned, const char *op) {
    *owned = NULL;
    if (pn_is_contiguous(t) && t->dev == PN_CPU) return pn_ptr(t); /* else pn_to_buffer copies (downloads) */
    size_t nbytes = (size_t)pn_numel(t) * pn_elsize(t->dt);
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) return pn_error_null(PN_ERR_OOM, "%s: out of memory copying %s %s", op, pn_dtype_name(t->dt),
                                 pn_shape_str(t));
    if (pn_to_buffer(t, p, nbytes) != PN_OK) {
        free(p);
        return NULL;
    }
    *owned = p;
    return p;
}

static pn_status check_tensor(const char *op, const pn_h5 *f, const char *name, const pn_tensor *t) {
    if (!t) return pn_error(PN_ERR_ARG, "%s: tensor for '%s' in %s is NULL", op, name, f->path);
    if (t->dev != PN_CPU && t->dev != PN_CUDA)
        return pn_error(PN_ERR_DEVICE, "%s: tensor for '%s' in %s is on an unknown device %d", op, name, f->path,
                        t->dev);
    if (t->dt < PN_F32 || t->dt > PN_U8)
        return pn_error(PN_ERR_DTYPE, "%s: tensor for '%s' in %s has unknown dtype %d", op, name, f->path, t->dt);
    return PN_OK;
}

/* Dataspace for a tensor: scalar for 0-dim, simple otherwise (0-size dims allowed). */
static hid_t space_of(const pn_tensor *t) {
    if (t->nd == 0) return H5Screate(H5S_SCALAR);
    hsize_t dims[PN_MAX_DIMS];
    for (int i = 0; i < t->nd; i++) dims[i] = (hsize_t)t->sizes[i];
    return H5Screate_simple(t->nd, dims, NULL);
}

/* Shape of a dataspace; PN_OK or an error naming op/what/path. */
static pn_status shape_of_space(hid_t space, int *nd, int64_t *shape, const char *op, const char *what,
                                const pn_h5 *f) {
    H5S_class_t cls = H5Sget_simple_extent_type(space);
    if (cls == H5S_SCALAR) {
        *nd = 0;
        return PN_OK;
    }
    if (cls != H5S_SIMPLE)
        return pn_error(PN_ERR_IO, "%s: %s in %s has an empty (null) dataspace", op, what, f->path);
    int n = H5Sget_simple_extent_ndims(space);
    if (n < 0) return pn_error(PN_ERR_IO, "%s: cannot read the shape of %s in %s%s", op, what, f->path, h5_detail());
    if (n > PN_MAX_DIMS)
        return pn_error(PN_ERR_SHAPE, "%s: %s in %s has %d dims; at most %d are supported", op, what, f->path, n,
                        PN_MAX_DIMS);
    hsize_t dims[PN_MAX_DIMS];
    H5Sget_simple_extent_dims(space, dims, NULL);
    for (int i = 0; i < n; i++) shape[i] = (int64_t)dims[i];
    *nd = n;
    return PN_OK;
}

/* Chunk shape for a compressed dataset: the whole array, halved dim by dim (outermost
 * first, round robin) until a chunk holds at most 1 MiB — large enough for gzip to work
 * well, small enough that reading a slice does not inflate the whole file. */
static void guess_chunk(int nd, const hsize_t *dims, size_t es, hsize_t *chunk) {
    const hsize_t target = 1u << 20;
    for (int i = 0; i < nd; i++) chunk[i] = dims[i];
    for (int d = 0;; d = (d + 1) % nd) {
        hsize_t bytes = es;
        for (int i = 0; i < nd; i++) bytes *= chunk[i];
        if (bytes <= target) break;
        if (chunk[d] > 1) chunk[d] = (chunk[d] + 1) / 2;
    }
}

/* Reads n elements of a numeric dataset or attribute (obj) into out (dtype dt, contiguous).
 * HDF5 converts numeric classes itself; enums are read raw and widened from their base
 * integer here, because HDF5 will not convert an enum to an integer. */
static pn_status read_numeric(hid_t obj, int is_attr, hid_t ftype, pn_tensor *out, const char *op,
                              const char *what, const pn_h5 *f) {
    int64_t n = pn_numel(out);
    if (n == 0) return PN_OK;
    herr_t rc;
    if (H5Tget_class(ftype) == H5T_INTEGER && H5Tget_size(ftype) == 8 && H5Tget_sign(ftype) != H5T_SGN_2) {
        /* u64 → i64: read as u64 and refuse what i64 cannot hold (HDF5 would clip it silently) */
        rc = is_attr ? H5Aread(obj, H5T_NATIVE_UINT64, pn_ptr(out))
                     : H5Dread(obj, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, pn_ptr(out));
        if (rc < 0) return pn_error(PN_ERR_IO, "%s: cannot read %s in %s%s", op, what, f->path, h5_detail());
        const uint64_t *u = (const uint64_t *)pn_ptr(out);
        for (int64_t i = 0; i < n; i++)
            if (u[i] > (uint64_t)INT64_MAX)
                return pn_error(PN_ERR_IO, "%s: %s in %s is unsigned 64-bit and element %lld (from 1, row-major) is "
                                "%llu, beyond the i64 that penumbra holds", op, what, f->path, (long long)i + 1,
                                (unsigned long long)u[i]);
        return PN_OK;
    }
    if (H5Tget_class(ftype) != H5T_ENUM) {
        hid_t mt = mem_type_of(out->dt);
        rc = is_attr ? H5Aread(obj, mt, pn_ptr(out)) : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, pn_ptr(out));
        if (rc < 0) return pn_error(PN_ERR_IO, "%s: cannot read %s in %s%s", op, what, f->path, h5_detail());
        return PN_OK;
    }
    pn_status st = PN_OK;
    hid_t mt = H5Tget_native_type(ftype, H5T_DIR_ASCEND), base = H5I_INVALID_HID;
    void *raw = NULL;
    if (mt < 0 || (base = H5Tget_super(mt)) < 0) {
        st = pn_error(PN_ERR_IO, "%s: cannot read the enum type of %s in %s%s", op, what, f->path, h5_detail());
        goto cleanup;
    }
    size_t es = H5Tget_size(mt);
    int is_signed = H5Tget_sign(base) == H5T_SGN_2;
    raw = malloc((size_t)n * es);
    if (!raw) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory reading %s in %s", op, what, f->path);
        goto cleanup;
    }
    rc = is_attr ? H5Aread(obj, mt, raw) : H5Dread(obj, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw);
    if (rc < 0) {
        st = pn_error(PN_ERR_IO, "%s: cannot read %s in %s%s", op, what, f->path, h5_detail());
        goto cleanup;
    }
    void *dst = pn_ptr(out);
    for (int64_t i = 0; i < n; i++) {
        const char *e = (const char *)raw + (size_t)i * es;
        int64_t v = 0;
        switch (es) {
        case 1: v = is_signed ? *(const int8_t *)e : *(const uint8_t *)e; break;
        case 2: v = is_signed ? *(const int16_t *)e : *(const uint16_t *)e; break;
        case 4: v = is_signed ? *(const int32_t *)e : (int64_t) * (const uint32_t *)e; break;
        default: memcpy(&v, e, sizeof v); break;
        }
        if (out->dt == PN_I64) ((int64_t *)dst)[i] = v;
        else pn_st(dst, out->dt, i, (double)v);
    }
cleanup:
    free(raw);
    close_id(base);
    close_id(mt);
    return st;
}

/* ---- open / close / flush ------------------------------------------------------------ */

static int hdf5_signature(const char *path) {
#if H5_VERSION_GE(1, 12, 0)
    return (int)H5Fis_accessible(path, H5P_DEFAULT);
#else
    return (int)H5Fis_hdf5(path);
#endif
}

/* Why path cannot be created for writing, from the file system (errno text), or NULL. */
static const char *why_not_writable(const char *path) {
    if (access(path, F_OK) == 0) return access(path, W_OK) == 0 ? NULL : strerror(errno);
    size_t len = strlen(path);
    char *dir = malloc(len + 2);
    if (!dir) return NULL;
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    const char *why = NULL;
    if (access(dir, F_OK) != 0) why = "directory does not exist";
    else if (access(dir, W_OK) != 0) why = strerror(errno);
    free(dir);
    return why;
}

pn_h5 *pn_h5_open(const char *path, const char *mode) {
    h5_quiet();
    if (!path || !path[0]) return pn_error_null(PN_ERR_ARG, "h5 open: empty path");
    if (!mode || (strcmp(mode, "r") && strcmp(mode, "w") && strcmp(mode, "a")))
        return pn_error_null(PN_ERR_ARG, "h5 open: %s: mode '%s' is not one of 'r', 'w', 'a'", path,
                             mode ? mode : "(null)");
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (exists && S_ISDIR(sb.st_mode)) return pn_error_null(PN_ERR_IO, "h5 open: %s is a directory", path);
    if (mode[0] == 'r' && !exists) return pn_error_null(PN_ERR_IO, "h5 open: %s: no such file", path);
    if (mode[0] == 'r' && access(path, R_OK) != 0)
        return pn_error_null(PN_ERR_IO, "h5 open: %s: %s", path, strerror(errno));
    if (mode[0] != 'w' && exists && hdf5_signature(path) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return pn_error_null(PN_ERR_IO, "h5 open: %s is not an HDF5 file", path);
    }

    pn_h5 *f = calloc(1, sizeof *f);
    char *p = f ? malloc(strlen(path) + 1) : NULL;
    if (!p) {
        free(f);
        return pn_error_null(PN_ERR_OOM, "h5 open: %s: out of memory", path);
    }
    strcpy(p, path);
    f->path = p;
    f->writable = mode[0] != 'r';

    /* STRONG close: closing the file also closes anything we might still hold in it */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl >= 0) H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    hid_t acc = fapl >= 0 ? fapl : H5P_DEFAULT;
    if (mode[0] == 'r') f->file = H5Fopen(path, H5F_ACC_RDONLY, acc);
    else if (mode[0] == 'a' && exists) f->file = H5Fopen(path, H5F_ACC_RDWR, acc);
    else f->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, acc);
    close_id(fapl);

    if (f->file < 0) {
        const char *why = f->writable ? why_not_writable(path) : NULL;
        if (why) pn_error(PN_ERR_IO, "h5 open: cannot %s %s: %s", exists ? "write" : "create", path, why);
        else pn_error(PN_ERR_IO, "h5 open: cannot open %s with mode '%s'%s", path, mode, h5_detail());
        free(f->path);
        free(f);
        return NULL;
    }
    return f;
}

void pn_h5_close(pn_h5 *f) {
    if (!f) return;
    h5_quiet();
    if (f->file >= 0) H5Fclose(f->file);
    H5Eclear2(H5E_DEFAULT);
    free(f->path);
    free(f);
}

pn_status pn_h5_flush(pn_h5 *f) {
    h5_quiet();
    PN_TRY(check_file("h5 flush", f));
    if (!f->writable) return PN_OK;
    if (H5Fflush(f->file, H5F_SCOPE_GLOBAL) < 0)
        return pn_error(PN_ERR_IO, "h5 flush: cannot flush %s%s", f->path, h5_detail());
    return PN_OK;
}

/* ---- datasets ------------------------------------------------------------------------- */

/* 1 when the dataset ds can take t in place: same stored type, same shape, same filters. */
static int same_layout(hid_t ds, const pn_tensor *t, int gzip_level) {
    int ok = 0;
    hid_t ft = H5Dget_type(ds), sp = H5Dget_space(ds), dcpl = H5Dget_create_plist(ds);
    if (ft < 0 || sp < 0 || dcpl < 0) goto done;
    if (H5Tequal(ft, file_type_of(t->dt)) <= 0) goto done;
    H5S_class_t cls = H5Sget_simple_extent_type(sp);
    if (t->nd == 0) {
        if (cls != H5S_SCALAR) goto done;
    } else {
        hsize_t dims[PN_MAX_DIMS], maxd[PN_MAX_DIMS];
        if (cls != H5S_SIMPLE || H5Sget_simple_extent_ndims(sp) != t->nd) goto done;
        H5Sget_simple_extent_dims(sp, dims, maxd);
        for (int i = 0; i < t->nd; i++)
            if (dims[i] != (hsize_t)t->sizes[i]) goto done;
    }
    int nf = H5Pget_nfilters(dcpl);
    int want_gzip = gzip_level > 0 && t->nd > 0 && pn_numel(t) > 0;
    if (!want_gzip) {
        ok = nf == 0;
        goto done;
    }
    for (int i = 0; i < nf; i++) {
        unsigned flags, cd[4];
        size_t ncd = 4;
        if (H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, 0, NULL, NULL) == H5Z_FILTER_DEFLATE)
            ok = ncd >= 1 && cd[0] == (unsigned)gzip_level;
    }
done:
    close_id(dcpl);
    close_id(sp);
    close_id(ft);
    H5Eclear2(H5E_DEFAULT);
    return ok;
}

/* Fails when some proper prefix of name exists and is not a group. */
static pn_status check_parents(const char *op, const pn_h5 *f, const char *name) {
    size_t len = strlen(name);
    char *p = malloc(len + 1);
    if (!p) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    memcpy(p, name, len + 1);
    pn_status st = PN_OK;
    for (size_t i = 1; i < len; i++) {
        if (p[i] != '/' || p[i - 1] == '/') continue;
        p[i] = 0;
        H5I_type_t ty = obj_type(f->file, p);
        if (ty == H5I_BADID) break;   /* missing: created from here on */
        if (ty != H5I_GROUP) {
            st = pn_error(PN_ERR_IO, "%s: cannot create '%s' in %s: '%s' is a dataset, not a group", op, name,
                          f->path, p);
            break;
        }
        p[i] = '/';
    }
    free(p);
    return st;
}

pn_status pn_h5_write(pn_h5 *f, const char *name, const pn_tensor *t, int gzip_level) {
    static const char *op = "h5 write";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "dataset", name));
    PN_TRY(check_writable(op, f));
    PN_TRY(check_tensor(op, f, name, t));
    if (gzip_level < 0 || gzip_level > 9)
        return pn_error(PN_ERR_ARG, "h5 write: gzip level %d for '%s' in %s is not in 0..9", gzip_level, name,
                        f->path);
    if (is_root(name)) return pn_error(PN_ERR_ARG, "h5 write: '%s' is the root group of %s, not a dataset name", name, f->path);
    if (gzip_level > 0 && H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0)
        return pn_error(PN_ERR_IO, "h5 write: gzip requested for '%s' in %s but this libhdf5 has no deflate filter",
                        name, f->path);
    PN_TRY(check_parents(op, f, name));

    pn_status st = PN_OK;
    hid_t ds = H5I_INVALID_HID, space = H5I_INVALID_HID, dcpl = H5I_INVALID_HID, lcpl = H5I_INVALID_HID;
    void *owned = NULL;
    int64_t n = pn_numel(t);

    H5I_type_t existing = obj_type(f->file, name);
    if (existing != H5I_BADID && existing != H5I_DATASET)
        return pn_error(PN_ERR_IO, "h5 write: '%s' in %s is a group, not a dataset", name, f->path);
    if (existing == H5I_DATASET) {
        /* Same layout: overwrite in place, so rewriting a checkpoint does not grow the file.
         * Otherwise unlink and recreate (HDF5 cannot shrink a file; h5repack reclaims). */
        ds = H5Dopen2(f->file, name, H5P_DEFAULT);
        if (ds >= 0 && !same_layout(ds, t, gzip_level)) {
            close_id(ds);
            ds = H5I_INVALID_HID;
            if (H5Ldelete(f->file, name, H5P_DEFAULT) < 0) {
                st = pn_error(PN_ERR_IO, "h5 write: cannot replace dataset '%s' in %s%s", name, f->path, h5_detail());
                goto cleanup;
            }
        }
    }

    if (ds < 0) {
        space = space_of(t);
        dcpl = H5Pcreate(H5P_DATASET_CREATE);
        lcpl = H5Pcreate(H5P_LINK_CREATE);
        if (space < 0 || dcpl < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) {
            st = pn_error(PN_ERR_IO, "h5 write: cannot set up dataset '%s' %s in %s%s", name, pn_shape_str(t),
                          f->path, h5_detail());
            goto cleanup;
        }
        /* chunking needs >= 1 dim and no zero-size dim: scalars and empty tensors stay plain */
        if (gzip_level > 0 && t->nd > 0 && n > 0) {
            hsize_t dims[PN_MAX_DIMS], chunk[PN_MAX_DIMS];
            for (int i = 0; i < t->nd; i++) dims[i] = (hsize_t)t->sizes[i];
            guess_chunk(t->nd, dims, pn_elsize(t->dt), chunk);
            if (H5Pset_chunk(dcpl, t->nd, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
                H5Pset_deflate(dcpl, (unsigned)gzip_level) < 0) {
                st = pn_error(PN_ERR_IO, "h5 write: cannot set gzip %d for '%s' %s in %s%s", gzip_level, name,
                              pn_shape_str(t), f->path, h5_detail());
                goto cleanup;
            }
        }
        ds = H5Dcreate2(f->file, name, file_type_of(t->dt), space, lcpl, dcpl, H5P_DEFAULT);
        if (ds < 0) {
            st = pn_error(PN_ERR_IO, "h5 write: cannot create dataset '%s' %s in %s%s", name, pn_shape_str(t),
                          f->path, h5_detail());
            goto cleanup;
        }
    }

    if (n > 0) {
        const void *data = contiguous_data(t, &owned, op);
        if (!data) {
            st = PN_ERR_OOM;
            goto cleanup;
        }
        if (H5Dwrite(ds, mem_type_of(t->dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
            st = pn_error(PN_ERR_IO, "h5 write: cannot write dataset '%s' %s in %s%s", name, pn_shape_str(t),
                          f->path, h5_detail());
            goto cleanup;
        }
    }

cleanup:
    free(owned);
    close_id(lcpl);
    close_id(dcpl);
    close_id(space);
    close_id(ds);
    return st;
}

pn_tensor *pn_h5_read(pn_h5 *f, const char *name) {
    static const char *op = "h5 read";
    h5_quiet();
    if (check_file(op, f) || check_name(op, f, "dataset", name)) return NULL;
    H5I_type_t ty = obj_type(f->file, name);
    if (ty == H5I_BADID) return pn_error_null(PN_ERR_IO, "h5 read: dataset '%s' not found in %s", name, f->path);
    if (ty != H5I_DATASET)
        return pn_error_null(PN_ERR_IO, "h5 read: '%s' in %s is a %s, not a dataset", name, f->path,
                             ty == H5I_GROUP ? "group" : "named datatype");

    pn_tensor *out = NULL;
    char what[300];
    snprintf(what, sizeof what, "dataset '%s'", name);
    hid_t ds = H5Dopen2(f->file, name, H5P_DEFAULT), ft = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    if (ds < 0 || (ft = H5Dget_type(ds)) < 0 || (sp = H5Dget_space(ds)) < 0) {
        pn_error(PN_ERR_IO, "h5 read: cannot open dataset '%s' in %s%s", name, f->path, h5_detail());
        goto cleanup;
    }
    int dt = dtype_of_type(ft);
    if (dt < 0) {
        pn_error(PN_ERR_DTYPE, "h5 read: dataset '%s' in %s holds %s data, not numbers", name, f->path,
                 class_name(H5Tget_class(ft)));
        goto cleanup;
    }
    int nd;
    int64_t shape[PN_MAX_DIMS];
    if (shape_of_space(sp, &nd, shape, op, what, f) != PN_OK) goto cleanup;
    out = pn_empty(nd, shape, dt, PN_CPU);
    if (!out) goto cleanup;
    if (read_numeric(ds, 0, ft, out, op, what, f) != PN_OK) {
        pn_release(out);
        out = NULL;
    }
cleanup:
    close_id(sp);
    close_id(ft);
    close_id(ds);
    return out;
}

int pn_h5_exists(pn_h5 *f, const char *name) {
    h5_quiet();
    if (check_file("h5 exists", f)) return -1;
    if (!name) return pn_error(PN_ERR_ARG, "h5 exists: NULL name in %s", f->path), -1;
    if (!name[0]) return 0;
    return obj_type(f->file, name) != H5I_BADID;
}

/* ---- listing --------------------------------------------------------------------------- */

typedef struct {
    sbuf *sb;
    const char *prefix;   /* group path without leading/trailing '/', "" for the root */
    hid_t base;           /* the group being visited */
} list_ctx;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    list_ctx *c = data;
    if (info->type != H5L_TYPE_HARD) return 0;   /* soft/external links are not followed */
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    if (o < 0) return 0;
    int is_ds = H5Iget_type(o) == H5I_DATASET;
    H5Oclose(o);
    if (!is_ds) return 0;
    if (c->sb->n) sb_add(c->sb, "\n", 1);
    if (c->prefix[0]) {
        sb_add(c->sb, c->prefix, strlen(c->prefix));
        sb_add(c->sb, "/", 1);
    }
    sb_add(c->sb, name, strlen(name));
    return c->sb->oom ? -1 : 0;
}

int64_t pn_h5_list(pn_h5 *f, const char *group, char *buf, int64_t size) {
    static const char *op = "h5 list";
    h5_quiet();
    if (check_file(op, f)) return -1;
    if (!group || !group[0]) group = "/";
    H5I_type_t ty = obj_type(f->file, group);
    if (ty == H5I_BADID) return pn_error(PN_ERR_IO, "h5 list: group '%s' not found in %s", group, f->path), -1;
    if (ty != H5I_GROUP) return pn_error(PN_ERR_IO, "h5 list: '%s' in %s is not a group", group, f->path), -1;

    /* prefix: the group path trimmed of slashes */
    while (*group == '/') group++;
    size_t plen = strlen(group);
    while (plen && group[plen - 1] == '/') plen--;
    char *prefix = malloc(plen + 1);
    hid_t g = H5Gopen2(f->file, plen ? group : "/", H5P_DEFAULT);
    if (!prefix || g < 0) {
        free(prefix);
        close_id(g);
        return pn_error(PN_ERR_IO, "h5 list: cannot open group '%s' in %s%s", group, f->path, h5_detail()), -1;
    }
    memcpy(prefix, group, plen);
    prefix[plen] = 0;
    sbuf sb = {0};
    sb_add(&sb, "", 0);
    list_ctx c = {&sb, prefix, g};
    herr_t rc = H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, list_cb, &c);
    close_id(g);
    free(prefix);
    if (rc < 0 && !sb.oom) {
        free(sb.p);
        return pn_error(PN_ERR_IO, "h5 list: cannot walk group '%s' in %s%s", group, f->path, h5_detail()), -1;
    }
    return sb_deliver(&sb, buf, size, op, f);
}

/* ---- attributes ------------------------------------------------------------------------ */

/* Opens object obj (group or dataset; "/" the root). Error names op. */
static hid_t open_obj(const char *op, const pn_h5 *f, const char *obj) {
    if (obj_type(f->file, obj) == H5I_BADID)
        return pn_error(PN_ERR_IO, "%s: object '%s' not found in %s", op, obj, f->path), H5I_INVALID_HID;
    hid_t o = H5Oopen(f->file, obj, H5P_DEFAULT);
    if (o < 0) pn_error(PN_ERR_IO, "%s: cannot open object '%s' in %s%s", op, obj, f->path, h5_detail());
    return o;
}

/* Opens attribute attr of obj; *o gets the object (caller closes both). */
static hid_t open_attr(const char *op, const pn_h5 *f, const char *obj, const char *attr, hid_t *o) {
    *o = open_obj(op, f, obj);
    if (*o < 0) return H5I_INVALID_HID;
    htri_t ex = H5Aexists(*o, attr);
    if (ex <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return pn_error(PN_ERR_IO, "%s: attribute '%s' of '%s' not found in %s", op, attr, obj, f->path),
               H5I_INVALID_HID;
    }
    hid_t a = H5Aopen(*o, attr, H5P_DEFAULT);
    if (a < 0)
        pn_error(PN_ERR_IO, "%s: cannot open attribute '%s' of '%s' in %s%s", op, attr, obj, f->path, h5_detail());
    return a;
}

static const char *default_obj(const char *obj) { return obj && obj[0] ? obj : "/"; }

/* 0 missing, 1 string, 2 numeric, 3 present but of another type (compound, …); -1 error. */
int pn_h5_attr_kind(pn_h5 *f, const char *obj, const char *attr) {
    static const char *op = "h5 attr";
    h5_quiet();
    if (check_file(op, f) || check_name(op, f, "attribute", attr)) return -1;
    obj = default_obj(obj);
    hid_t o = open_obj(op, f, obj);
    if (o < 0) return -1;
    int kind = 0;
    htri_t ex = H5Aexists(o, attr);
    if (ex < 0) {
        kind = -1;
        pn_error(PN_ERR_IO, "h5 attr: cannot look up attribute '%s' of '%s' in %s%s", attr, obj, f->path,
                 h5_detail());
    } else if (ex > 0) {
        hid_t a = H5Aopen(o, attr, H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
        if (t < 0) {
            kind = -1;
            pn_error(PN_ERR_IO, "h5 attr: cannot open attribute '%s' of '%s' in %s%s", attr, obj, f->path,
                     h5_detail());
        } else {
            kind = H5Tget_class(t) == H5T_STRING ? 1 : dtype_of_type(t) >= 0 ? 2 : 3;
        }
        close_id(t);
        close_id(a);
    }
    close_id(o);
    return kind;
}

static herr_t attr_name_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data) {
    sbuf *sb = data;
    if (sb->n) sb_add(sb, "\n", 1);
    sb_add(sb, name, strlen(name));
    return sb->oom ? -1 : 0;
}

int64_t pn_h5_attr_names(pn_h5 *f, const char *obj, char *buf, int64_t size) {
    static const char *op = "h5 attr names";
    h5_quiet();
    if (check_file(op, f)) return -1;
    obj = default_obj(obj);
    hid_t o = open_obj(op, f, obj);
    if (o < 0) return -1;
    sbuf sb = {0};
    sb_add(&sb, "", 0);
    hsize_t idx = 0;
    herr_t rc = H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_name_cb, &sb);
    close_id(o);
    if (rc < 0 && !sb.oom) {
        free(sb.p);
        return pn_error(PN_ERR_IO, "h5 attr names: cannot list attributes of '%s' in %s%s", obj, f->path,
                        h5_detail()), -1;
    }
    return sb_deliver(&sb, buf, size, op, f);
}

/* String attribute: fixed-length (NULLTERM/NULLPAD: up to the first NUL; SPACEPAD: trailing
 * spaces dropped) or variable-length. An array of strings comes back '\n'-joined. */
int64_t pn_h5_attr_string(pn_h5 *f, const char *obj, const char *attr, char *buf, int64_t size) {
    static const char *op = "h5 attr";
    h5_quiet();
    if (check_file(op, f) || check_name(op, f, "attribute", attr)) return -1;
    obj = default_obj(obj);
    int64_t result = -1;
    hid_t o, ft = H5I_INVALID_HID, sp = H5I_INVALID_HID, mt = H5I_INVALID_HID;
    hid_t a = open_attr(op, f, obj, attr, &o);
    char *fixed = NULL, **vl = NULL;
    hssize_t n = 0;
    sbuf sb = {0};
    if (a < 0) goto cleanup;
    if ((ft = H5Aget_type(a)) < 0 || (sp = H5Aget_space(a)) < 0 || (n = H5Sget_simple_extent_npoints(sp)) < 0) {
        pn_error(PN_ERR_IO, "h5 attr: cannot read attribute '%s' of '%s' in %s%s", attr, obj, f->path, h5_detail());
        goto cleanup;
    }
    if (H5Tget_class(ft) != H5T_STRING) {
        pn_error(PN_ERR_DTYPE, "h5 attr: attribute '%s' of '%s' in %s is %s, not a string", attr, obj, f->path,
                 class_name(H5Tget_class(ft)));
        goto cleanup;
    }
    sb_add(&sb, "", 0);
    htri_t is_vl = H5Tis_variable_str(ft);
    mt = H5Tcopy(H5T_C_S1);
    if (mt < 0 || H5Tset_cset(mt, H5Tget_cset(ft)) < 0) goto h5fail;
    if (is_vl > 0) {
        if (H5Tset_size(mt, H5T_VARIABLE) < 0) goto h5fail;
        vl = calloc((size_t)(n ? n : 1), sizeof *vl);
        if (!vl) goto oom;
        if (H5Aread(a, mt, vl) < 0) goto h5fail;
        for (hssize_t i = 0; i < n; i++) {
            if (i) sb_add(&sb, "\n", 1);
            if (vl[i]) sb_add(&sb, vl[i], strlen(vl[i]));
        }
    } else {
        size_t es = H5Tget_size(ft);
        H5T_str_t pad = H5Tget_strpad(ft);
        if (H5Tset_size(mt, es) < 0 || H5Tset_strpad(mt, pad) < 0) goto h5fail;
        fixed = malloc((size_t)(n ? n : 1) * es + 1);
        if (!fixed) goto oom;
        if (n && H5Aread(a, mt, fixed) < 0) goto h5fail;
        for (hssize_t i = 0; i < n; i++) {
            const char *s = fixed + (size_t)i * es;
            size_t len = 0;
            while (len < es && s[len]) len++;
            if (pad == H5T_STR_SPACEPAD)
                while (len && s[len - 1] == ' ') len--;
            if (i) sb_add(&sb, "\n", 1);
            sb_add(&sb, s, len);
        }
    }
    result = sb_deliver(&sb, buf, size, op, f);
    sb.p = NULL;
    goto cleanup;
h5fail:
    pn_error(PN_ERR_IO, "h5 attr: cannot read string attribute '%s' of '%s' in %s%s", attr, obj, f->path,
             h5_detail());
    goto cleanup;
oom:
    pn_error(PN_ERR_OOM, "h5 attr: out of memory reading attribute '%s' of '%s' in %s", attr, obj, f->path);
cleanup:
    if (vl) {
#if H5_VERSION_GE(1, 12, 0)
        H5Treclaim(mt, sp, H5P_DEFAULT, vl);
#else
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, vl);
#endif
        free(vl);
    }
    free(fixed);
    free(sb.p);
    close_id(mt);
    close_id(sp);
    close_id(ft);
    close_id(a);
    close_id(o);
    return result;
}

pn_tensor *pn_h5_attr_tensor(pn_h5 *f, const char *obj, const char *attr) {
    static const char *op = "h5 attr";
    h5_quiet();
    if (check_file(op, f) || check_name(op, f, "attribute", attr)) return NULL;
    obj = default_obj(obj);
    pn_tensor *out = NULL;
    hid_t o, ft = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    hid_t a = open_attr(op, f, obj, attr, &o);
    char what[600];
    snprintf(what, sizeof what, "attribute '%s' of '%s'", attr, obj);
    if (a < 0) goto cleanup;
    if ((ft = H5Aget_type(a)) < 0 || (sp = H5Aget_space(a)) < 0) {
        pn_error(PN_ERR_IO, "h5 attr: cannot read %s in %s%s", what, f->path, h5_detail());
        goto cleanup;
    }
    int dt = dtype_of_type(ft);
    if (dt < 0) {
        pn_error(PN_ERR_DTYPE, "h5 attr: %s in %s is %s, not numeric", what, f->path, class_name(H5Tget_class(ft)));
        goto cleanup;
    }
    int nd;
    int64_t shape[PN_MAX_DIMS];
    if (shape_of_space(sp, &nd, shape, op, what, f) != PN_OK) goto cleanup;
    out = pn_empty(nd, shape, dt, PN_CPU);
    if (out && read_numeric(a, 1, ft, out, op, what, f) != PN_OK) {
        pn_release(out);
        out = NULL;
    }
cleanup:
    close_id(sp);
    close_id(ft);
    close_id(a);
    close_id(o);
    return out;
}

/* Object for set_attr: opened, or created as a group (with its parents) when missing,
 * so run files can write "/summary" attributes without a separate mkdir. */
static hid_t open_or_create_obj(const char *op, const pn_h5 *f, const char *obj) {
    if (obj_type(f->file, obj) != H5I_BADID) return open_obj(op, f, obj);
    if (check_parents(op, f, obj) != PN_OK) return H5I_INVALID_HID;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    hid_t g = H5I_INVALID_HID;
    if (lcpl >= 0 && H5Pset_create_intermediate_group(lcpl, 1) >= 0)
        g = H5Gcreate2(f->file, obj, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    close_id(lcpl);
    if (g < 0) pn_error(PN_ERR_IO, "%s: cannot create group '%s' in %s%s", op, obj, f->path, h5_detail());
    return g;
}

/* Creates attribute attr on o (replacing one of the same name) and writes data. */
static pn_status put_attr(const char *op, const pn_h5 *f, const char *obj, const char *attr, hid_t o, hid_t ftype,
                          hid_t space, hid_t mtype, const void *data) {
    htri_t ex = H5Aexists(o, attr);
    if (ex > 0 && H5Adelete(o, attr) < 0)
        return pn_error(PN_ERR_IO, "%s: cannot replace attribute '%s' of '%s' in %s%s", op, attr, obj, f->path,
                        h5_detail());
    hid_t a = H5Acreate2(o, attr, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0)
        return pn_error(PN_ERR_IO, "%s: cannot create attribute '%s' of '%s' in %s%s", op, attr, obj, f->path,
                        h5_detail());
    pn_status st = PN_OK;
    if (data && H5Awrite(a, mtype, data) < 0)
        st = pn_error(PN_ERR_IO, "%s: cannot write attribute '%s' of '%s' in %s%s", op, attr, obj, f->path,
                      h5_detail());
    H5Aclose(a);
    return st;
}

/* Stored as a scalar fixed-length NULLPAD string (like the dataset files; h5py reads it as
 * bytes, h5dump prints it), UTF-8 when it has non-ASCII bytes. */
pn_status pn_h5_set_attr_string(pn_h5 *f, const char *obj, const char *attr, const char *value) {
    static const char *op = "h5 set_attr";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "attribute", attr));
    PN_TRY(check_writable(op, f));
    obj = default_obj(obj);
    if (!value) return pn_error(PN_ERR_ARG, "h5 set_attr: NULL string for attribute '%s' of '%s' in %s", attr, obj,
                                f->path);
    size_t len = strlen(value);
    int ascii = 1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)value[i] >= 0x80) ascii = 0;
    pn_status st = PN_OK;
    hid_t o = open_or_create_obj(op, f, obj);
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
    if (o < 0) {
        st = PN_ERR_IO;
        goto cleanup;
    }
    /* an HDF5 string type has size >= 1: "" is stored as one NUL byte */
    char nul = 0;
    if (t < 0 || sp < 0 || H5Tset_size(t, len ? len : 1) < 0 || H5Tset_strpad(t, H5T_STR_NULLPAD) < 0 ||
        H5Tset_cset(t, ascii ? H5T_CSET_ASCII : H5T_CSET_UTF8) < 0) {
        st = pn_error(PN_ERR_IO, "h5 set_attr: cannot make a string type for '%s' of '%s' in %s%s", attr, obj,
                      f->path, h5_detail());
        goto cleanup;
    }
    st = put_attr(op, f, obj, attr, o, t, sp, t, len ? value : &nul);
cleanup:
    close_id(sp);
    close_id(t);
    close_id(o);
    return st;
}

pn_status pn_h5_set_attr_tensor(pn_h5 *f, const char *obj, const char *attr, const pn_tensor *t) {
    static const char *op = "h5 set_attr";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "attribute", attr));
    PN_TRY(check_writable(op, f));
    obj = default_obj(obj);
    PN_TRY(check_tensor(op, f, attr, t));
    pn_status st = PN_OK;
    void *owned = NULL;
    hid_t sp = H5I_INVALID_HID;
    hid_t o = open_or_create_obj(op, f, obj);
    if (o < 0) return PN_ERR_IO;
    sp = space_of(t);
    if (sp < 0) {
        st = pn_error(PN_ERR_IO, "h5 set_attr: cannot make a dataspace %s for '%s' of '%s' in %s%s", pn_shape_str(t),
                      attr, obj, f->path, h5_detail());
        goto cleanup;
    }
    const void *data = NULL;
    if (pn_numel(t) > 0 && !(data = contiguous_data(t, &owned, op))) {
        st = PN_ERR_OOM;
        goto cleanup;
    }
    st = put_attr(op, f, obj, attr, o, file_type_of(t->dt), sp, mem_type_of(t->dt), data);
cleanup:
    free(owned);
    close_id(sp);
    close_id(o);
    return st;
}

/* ---- extendable datasets, delete, move ------------------------------------------------ */
pn_status pn_h5_append(pn_h5 *f, const char *name, const pn_tensor *t) {
    static const char *op = "h5 append";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "dataset", name));
    PN_TRY(check_writable(op, f));
    PN_TRY(check_tensor(op, f, name, t));
    if (t->nd < 1)
        return pn_error(PN_ERR_SHAPE, "h5 append: '%s' in %s: the appended tensor needs at least 1 dim, got %s", name,
                        f->path, pn_shape_str(t));
    PN_TRY(check_parents(op, f, name));
    pn_status st = PN_OK;
    hid_t ds = H5I_INVALID_HID, space = H5I_INVALID_HID, mspace = H5I_INVALID_HID, dcpl = H5I_INVALID_HID,
          lcpl = H5I_INVALID_HID;
    void *owned = NULL;
    hsize_t dims[PN_MAX_DIMS], maxd[PN_MAX_DIMS], start[PN_MAX_DIMS] = {0}, cnt[PN_MAX_DIMS];
    int nd = t->nd;
    for (int i = 0; i < nd; i++) cnt[i] = (hsize_t)t->sizes[i];

    H5I_type_t existing = obj_type(f->file, name);
    if (existing != H5I_BADID && existing != H5I_DATASET)
        return pn_error(PN_ERR_IO, "h5 append: '%s' in %s is a group, not a dataset", name, f->path);
    if (existing == H5I_BADID) {
        /* create empty along dim 0, unlimited, chunked by 1024 rows */
        for (int i = 0; i < nd; i++) {
            dims[i] = i == 0 ? 0 : cnt[i];
            maxd[i] = i == 0 ? H5S_UNLIMITED : cnt[i];
        }
        hsize_t chunk[PN_MAX_DIMS];
        size_t row = pn_elsize(t->dt);
        for (int i = 1; i < nd; i++) { chunk[i] = cnt[i] ? cnt[i] : 1; row *= (size_t)chunk[i]; }
        chunk[0] = row >= 65536 ? 1 : 65536 / row;
        space = H5Screate_simple(nd, dims, maxd);
        dcpl = H5Pcreate(H5P_DATASET_CREATE);
        lcpl = H5Pcreate(H5P_LINK_CREATE);
        if (space < 0 || dcpl < 0 || lcpl < 0 || H5Pset_chunk(dcpl, nd, chunk) < 0 ||
            H5Pset_create_intermediate_group(lcpl, 1) < 0) {
            st = pn_error(PN_ERR_IO, "h5 append: cannot set up '%s' in %s%s", name, f->path, h5_detail());
            goto cleanup;
        }
        ds = H5Dcreate2(f->file, name, file_type_of(t->dt), space, lcpl, dcpl, H5P_DEFAULT);
        close_id(space);
        space = H5I_INVALID_HID;
    } else {
        ds = H5Dopen2(f->file, name, H5P_DEFAULT);
    }
    if (ds < 0) {
        st = pn_error(PN_ERR_IO, "h5 append: cannot open '%s' in %s%s", name, f->path, h5_detail());
        goto cleanup;
    }
    /* the existing dataset must be extendable with matching trailing dims and dtype */
    space = H5Dget_space(ds);
    hid_t ftype = H5Dget_type(ds);
    int fdt = ftype >= 0 ? dtype_of_type(ftype) : -1;
    close_id(ftype);
    int fnd = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    if (fnd != nd || H5Sget_simple_extent_dims(space, dims, maxd) < 0) {
        st = pn_error(PN_ERR_SHAPE, "h5 append: '%s' in %s has %d dims, the appended tensor %s has %d", name, f->path,
                      fnd, pn_shape_str(t), nd);
        goto cleanup;
    }
    if (maxd[0] != H5S_UNLIMITED) {
        st = pn_error(PN_ERR_IO, "h5 append: '%s' in %s was not created extendable (write it with append)", name,
                      f->path);
        goto cleanup;
    }
    for (int i = 1; i < nd; i++)
        if (dims[i] != cnt[i]) {
            st = pn_error(PN_ERR_SHAPE, "h5 append: '%s' in %s has rows of dim %d size %llu, the appended tensor is %s",
                          name, f->path, i + 1, (unsigned long long)dims[i], pn_shape_str(t));
            goto cleanup;
        }
    if (fdt != t->dt) {
        st = pn_error(PN_ERR_DTYPE, "h5 append: '%s' in %s holds %s, the appended tensor is %s", name, f->path,
                      pn_dtype_name(fdt), pn_dtype_name(t->dt));
        goto cleanup;
    }
    start[0] = dims[0];
    dims[0] += cnt[0];
    close_id(space);
    space = H5I_INVALID_HID;
    if (H5Dset_extent(ds, dims) < 0 || (space = H5Dget_space(ds)) < 0 ||
        H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, cnt, NULL) < 0 ||
        (mspace = H5Screate_simple(nd, cnt, NULL)) < 0) {
        st = pn_error(PN_ERR_IO, "h5 append: cannot extend '%s' in %s%s", name, f->path, h5_detail());
        goto cleanup;
    }
    if (pn_numel(t) > 0) {
        const void *data = contiguous_data(t, &owned, op);
        if (!data) {
            st = PN_ERR_OOM;
            goto cleanup;
        }
        if (H5Dwrite(ds, mem_type_of(t->dt), mspace, space, H5P_DEFAULT, data) < 0)
            st = pn_error(PN_ERR_IO, "h5 append: cannot write '%s' in %s%s", name, f->path, h5_detail());
    }
cleanup:
    free(owned);
    close_id(mspace);
    close_id(lcpl);
    close_id(dcpl);
    close_id(space);
    close_id(ds);
    return st;
}

pn_status pn_h5_delete(pn_h5 *f, const char *name) {
    static const char *op = "h5 delete";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "object", name));
    PN_TRY(check_writable(op, f));
    if (is_root(name)) return pn_error(PN_ERR_ARG, "h5 delete: cannot delete the root group of %s", f->path);
    if (obj_type(f->file, name) == H5I_BADID)
        return pn_error(PN_ERR_IO, "h5 delete: '%s' not found in %s", name, f->path);
    if (H5Ldelete(f->file, name, H5P_DEFAULT) < 0)
        return pn_error(PN_ERR_IO, "h5 delete: cannot delete '%s' in %s%s", name, f->path, h5_detail());
    return PN_OK;
}

pn_status pn_h5_move(pn_h5 *f, const char *from, const char *to) {
    static const char *op = "h5 move";
    h5_quiet();
    PN_TRY(check_file(op, f));
    PN_TRY(check_name(op, f, "source", from));
    PN_TRY(check_name(op, f, "destination", to));
    PN_TRY(check_writable(op, f));
    if (obj_type(f->file, from) == H5I_BADID)
        return pn_error(PN_ERR_IO, "h5 move: '%s' not found in %s", from, f->path);
    if (obj_type(f->file, to) != H5I_BADID)
        return pn_error(PN_ERR_IO, "h5 move: destination '%s' already exists in %s", to, f->path);
    PN_TRY(check_parents(op, f, to));
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    herr_t r = lcpl >= 0 ? H5Pset_create_intermediate_group(lcpl, 1) : -1;
    if (r >= 0) r = H5Lmove(f->file, from, f->file, to, lcpl, H5P_DEFAULT);
    close_id(lcpl);
    if (r < 0) return pn_error(PN_ERR_IO, "h5 move: cannot move '%s' to '%s' in %s%s", from, to, f->path, h5_detail());
    return PN_OK;
}
