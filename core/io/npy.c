/* npy.c — NumPy .npy files (format versions 1.0, 2.0 and 3.0; numpy/lib/format.py documents
 * them): pn_npy_load and pn_npy_save of penumbra.h.
 *
 * A file is the magic "\x93NUMPY", a major and a minor version byte, the header length
 * (u16 little-endian in 1.0, u32 in 2.0/3.0), then the header — a Python dict literal such
 * as {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with spaces and a
 * '\n' — then the raw elements, C order unless fortran_order.
 *
 * Type mapping on load (descr kind+size → our dtype; either byte order, '|' and '=' too):
 *     f2, f4 → f32      f8 → f64
 *     i1, i2, i4, u2 → i32      i8, u4 → i64      u8 → i64 when every value fits, else an error
 *     u1 → u8           b1 (bool) → u8 (0/1)
 * Anything else (complex, strings, objects, structured records, datetimes, f16/f12) is an
 * error naming the descr and the dtypes this reader takes. Fortran-order arrays are
 * reordered into C order. Truncated files, trailing bytes after the data, a bad magic or a
 * header that does not parse are errors naming the file and what is wrong with it.
 * Save writes format 1.0, little-endian, C order ('<f4', '<f8', '<i4', '<i8', '|u1'), the
 * header padded so the data starts at a multiple of 64 bytes, as numpy does. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define OP_LOAD "load_npy"
#define OP_SAVE "save_npy"

/* ---- header parsing ----------------------------------------------------------------------- */
typedef struct {
    char kind;  /* 'f', 'i', 'u', 'b' (others refused) */
    int size;   /* bytes per element */
    bool swap;  /* stored in the other byte order than this machine's */
    char descr[24];
    bool fortran;
    int nd;
    int64_t shape[PN_MAX_DIMS];
} npy_header;

/* The value text after 'key': in the dict, or NULL. */
static const char *dict_value(const char *h, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(h, pat);
    if (!p) {
        snprintf(pat, sizeof pat, "\"%s\"", key);
        p = strstr(h, pat);
    }
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

static pn_status parse_header(const char *path, const char *h, npy_header *o) {
    memset(o, 0, sizeof *o);
    const char *d = dict_value(h, "descr");
    if (!d) return pn_error(PN_ERR_IO, "%s: %s: the header has no 'descr' (header: %s)", OP_LOAD, path, h);
    if (*d != '\'' && *d != '"')
        return pn_error(PN_ERR_DTYPE, "%s: %s: descr %.40s is a structured (record) dtype; this reader takes plain "
                        "arrays of f2/f4/f8, i1/i2/i4/i8, u1/u2/u4/u8 and b1", OP_LOAD, path, d);
    char q = *d++;
    char descr[24];
    int n = 0;
    while (d[n] && d[n] != q && n < (int)sizeof descr - 1) {
        descr[n] = d[n];
        n++;
    }
    descr[n] = 0;
    if (d[n] != q) return pn_error(PN_ERR_IO, "%s: %s: the descr in the header is not a closed string", OP_LOAD, path);
    const char *t = descr;
    const uint16_t one = 1;
    const bool host_big = *(const unsigned char *)&one == 0;
    bool big = host_big; /* '|' (one byte) and '=' (native) never swap */
    if (*t == '<' || *t == '>' || *t == '|' || *t == '=') {
        if (*t == '<') big = false;
        if (*t == '>') big = true;
        t++;
    }
    char kind = *t;
    char *end = NULL;
    long size = (kind && t[1]) ? strtol(t + 1, &end, 10) : 0;
    bool ok = end && *end == 0 &&
              ((kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
               (kind == 'i' && (size == 1 || size == 2 || size == 4 || size == 8)) ||
               (kind == 'u' && (size == 1 || size == 2 || size == 4 || size == 8)) || (kind == 'b' && size == 1));
    if (!ok)
        return pn_error(PN_ERR_DTYPE, "%s: %s: dtype '%s' is not supported; this reader takes f2/f4/f8, i1/i2/i4/i8, "
                        "u1/u2/u4/u8 and b1 (bool), either byte order", OP_LOAD, path, descr);
    o->kind = kind;
    o->size = (int)size;
    o->swap = size > 1 && big != host_big;
    memcpy(o->descr, descr, sizeof o->descr);

    const char *f = dict_value(h, "fortran_order");
    if (!f || (strncmp(f, "True", 4) && strncmp(f, "False", 5)))
        return pn_error(PN_ERR_IO, "%s: %s: the header has no fortran_order True/False (header: %s)", OP_LOAD, path, h);
    o->fortran = f[0] == 'T';

    const char *s = dict_value(h, "shape");
    if (!s || *s != '(') return pn_error(PN_ERR_IO, "%s: %s: the header has no shape tuple (header: %s)", OP_LOAD, path, h);
    s++;
    for (;;) {
        while (*s == ' ' || *s == ',') s++;
        if (*s == ')') break;
        if (*s < '0' || *s > '9')
            return pn_error(PN_ERR_IO, "%s: %s: the shape in the header does not parse (header: %s)", OP_LOAD, path, h);
        if (o->nd == PN_MAX_DIMS)
            return pn_error(PN_ERR_SHAPE, "%s: %s: the array has more than %d dims", OP_LOAD, path, PN_MAX_DIMS);
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || v < 0)
            return pn_error(PN_ERR_IO, "%s: %s: dim %d of the shape is out of range (header: %s)", OP_LOAD, path,
                            o->nd + 1, h);
        o->shape[o->nd++] = v;
        s = end;
        while (*s == 'L') s++; /* Python 2 longs */
    }
    return PN_OK;
}

/* "(3, 4)", "(5,)", "()": Python's tuple text, as in the header */
static void shape_text(int nd, const int64_t *shape, char *buf, size_t size) {
    int k = snprintf(buf, size, "(");
    for (int d = 0; d < nd && k < (int)size; d++)
        k += snprintf(buf + k, size - (size_t)k, "%lld%s", (long long)shape[d], nd == 1 ? "," : (d + 1 < nd ? ", " : ""));
    if (k < (int)size) snprintf(buf + k, size - (size_t)k, ")");
}

/* ---- element conversion --------------------------------------------------------------------- */
static void swap_bytes(unsigned char *p, int size) {
    for (int i = 0; i < size / 2; i++) {
        unsigned char t = p[i];
        p[i] = p[size - 1 - i];
        p[size - 1 - i] = t;
    }
}

/* IEEE half → float (subnormals, inf, NaN kept) */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, bits;
    if (e == 0x1f) bits = sign | 0x7f800000u | (m << 13);
    else if (e != 0) bits = sign | ((e + 112) << 23) | (m << 13);
    else if (m == 0) bits = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int out_dtype(const npy_header *h) {
    switch (h->kind) {
    case 'f': return h->size == 8 ? PN_F64 : PN_F32;
    case 'b': return PN_U8;
    case 'u': return h->size == 1 ? PN_U8 : (h->size == 2 ? PN_I32 : PN_I64);
    default: return h->size == 8 ? PN_I64 : PN_I32;
    }
}

/* n raw elements (src, file layout) → dst of the output dtype; *bad = index of the first
 * u8 (uint64) value above INT64_MAX, or -1 */
static void convert(const npy_header *h, const unsigned char *src, int64_t n, void *dst, int64_t *bad) {
    *bad = -1;
    unsigned char e[8];
    for (int64_t i = 0; i < n; i++) {
        memcpy(e, src + (size_t)i * (size_t)h->size, (size_t)h->size);
        if (h->swap) swap_bytes(e, h->size);
        switch (h->kind) {
        case 'f':
            if (h->size == 2) {
                uint16_t v;
                memcpy(&v, e, 2);
                ((float *)dst)[i] = half_to_float(v);
            } else if (h->size == 4) memcpy((float *)dst + i, e, 4);
            else memcpy((double *)dst + i, e, 8);
            break;
        case 'b': ((uint8_t *)dst)[i] = e[0] != 0; break;
        case 'u':
            if (h->size == 1) ((uint8_t *)dst)[i] = e[0];
            else if (h->size == 2) {
                uint16_t v;
                memcpy(&v, e, 2);
                ((int32_t *)dst)[i] = v;
            } else if (h->size == 4) {
                uint32_t v;
                memcpy(&v, e, 4);
                ((int64_t *)dst)[i] = v;
            } else {
                uint64_t v;
                memcpy(&v, e, 8);
                if (v > (uint64_t)INT64_MAX && *bad < 0) *bad = i;
                ((int64_t *)dst)[i] = (int64_t)(v & (uint64_t)INT64_MAX);
            }
            break;
        default:
            if (h->size == 1) ((int32_t *)dst)[i] = (int8_t)e[0];
            else if (h->size == 2) {
                int16_t v;
                memcpy(&v, e, 2);
                ((int32_t *)dst)[i] = v;
            } else if (h->size == 4) memcpy((int32_t *)dst + i, e, 4);
            else memcpy((int64_t *)dst + i, e, 8);
        }
    }
}

/* Fortran order (first index fastest) → C order, es bytes per element */
static void fortran_to_c(int nd, const int64_t *shape, const char *src, char *dst, size_t es, int64_t n) {
    int64_t idx[PN_MAX_DIMS] = {0}, fst[PN_MAX_DIMS];
    int64_t acc = 1;
    for (int d = 0; d < nd; d++) {
        fst[d] = acc;
        acc *= shape[d];
    }
    int64_t off = 0; /* source offset of idx */
    for (int64_t i = 0; i < n; i++) {
        memcpy(dst + (size_t)i * es, src + (size_t)off * es, es);
        for (int d = nd - 1; d >= 0; d--) { /* C-order odometer */
            off += fst[d];
            if (++idx[d] < shape[d]) break;
            off -= fst[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/* ---- load ----------------------------------------------------------------------------------- */
pn_tensor *pn_npy_load(const char *path) {
    if (!path) return pn_error_null(PN_ERR_ARG, "%s: path is nil", OP_LOAD);
    FILE *fp = fopen(path, "rb");
    if (!fp) return pn_error_null(PN_ERR_IO, "%s: cannot open %s: %s", OP_LOAD, path, strerror(errno));
    pn_tensor *out = NULL;
    char *header = NULL;
    unsigned char *raw = NULL;
    void *conv = NULL;
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, fp);
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6)) {
        pn_error(PN_ERR_IO, "%s: %s is not a .npy file (no \\x93NUMPY magic%s)", OP_LOAD, path,
                 got < 10 ? "; the file is shorter than the magic" : "");
        goto done;
    }
    int major = pre[6];
    uint64_t hlen;
    long hstart;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | ((uint64_t)pre[9] << 8);
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, fp) < 2) {
            pn_error(PN_ERR_IO, "%s: %s is truncated inside the header length", OP_LOAD, path);
            goto done;
        }
        hlen = (uint64_t)pre[8] | ((uint64_t)pre[9] << 8) | ((uint64_t)pre[10] << 16) | ((uint64_t)pre[11] << 24);
        hstart = 12;
    } else {
        pn_error(PN_ERR_IO, "%s: %s: format version %d.%d is not one this reader knows (1.0, 2.0, 3.0)", OP_LOAD, path,
                 major, pre[7]);
        goto done;
    }
    if (hlen > (1u << 24)) {
        pn_error(PN_ERR_IO, "%s: %s: a header of %llu bytes is not a .npy header", OP_LOAD, path,
                 (unsigned long long)hlen);
        goto done;
    }
    header = malloc((size_t)hlen + 1);
    if (!header) {
        pn_error(PN_ERR_OOM, "%s: out of memory for the header of %s", OP_LOAD, path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, fp) < hlen) {
        pn_error(PN_ERR_IO, "%s: %s is truncated inside its %llu-byte header", OP_LOAD, path, (unsigned long long)hlen);
        goto done;
    }
    header[hlen] = 0;
    for (uint64_t i = 0; i < hlen; i++)
        if (header[i] == 0) header[i] = ' ';
    npy_header h;
    if (parse_header(path, header, &h)) goto done;
    if (pn_check_shape(OP_LOAD, h.nd, h.shape, out_dtype(&h))) goto done;
    int64_t n = pn_shape_numel(h.nd, h.shape);
    size_t nbytes = (size_t)n * (size_t)h.size; /* pn_check_shape bounded n · 8 */

    /* the data must be exactly what the header promises */
    if (fseek(fp, 0, SEEK_END)) {
        pn_error(PN_ERR_IO, "%s: cannot seek in %s: %s", OP_LOAD, path, strerror(errno));
        goto done;
    }
    long fsize = ftell(fp);
    long dstart = hstart + (long)hlen;
    if (fsize < 0 || fseek(fp, dstart, SEEK_SET)) {
        pn_error(PN_ERR_IO, "%s: cannot seek in %s: %s", OP_LOAD, path, strerror(errno));
        goto done;
    }
    uint64_t have = fsize > dstart ? (uint64_t)(fsize - dstart) : 0;
    if (have < nbytes) {
        char sh[24 * PN_MAX_DIMS + 4];
        shape_text(h.nd, h.shape, sh, sizeof sh);
        pn_error(PN_ERR_IO, "%s: %s is truncated: shape %s of '%s' needs %llu data bytes, the file has %llu", OP_LOAD,
                 path, sh, h.descr, (unsigned long long)nbytes, (unsigned long long)have);
        goto done;
    }
    if (have > nbytes) {
        pn_error(PN_ERR_IO, "%s: %s has %llu bytes after the %llu data bytes of its array (not a single .npy array)",
                 OP_LOAD, path, (unsigned long long)(have - nbytes), (unsigned long long)nbytes);
        goto done;
    }
    int dt = out_dtype(&h);
    size_t es = pn_elsize(dt);
    raw = malloc(nbytes ? nbytes : 1);
    conv = malloc(n ? (size_t)n * es : 1);
    if (!raw || !conv) {
        pn_error(PN_ERR_OOM, "%s: out of memory reading %s (%llu bytes)", OP_LOAD, path, (unsigned long long)nbytes);
        goto done;
    }
    if (fread(raw, 1, nbytes, fp) < nbytes) {
        pn_error(PN_ERR_IO, "%s: reading %s failed: %s", OP_LOAD, path, ferror(fp) ? strerror(errno) : "short read");
        goto done;
    }
    int64_t bad;
    convert(&h, raw, n, conv, &bad);
    if (bad >= 0) {
        pn_error(PN_ERR_DTYPE, "%s: %s: uint64 element %lld (C order, from 1) is above 2^63 - 1 and does not fit i64",
                 OP_LOAD, path, (long long)bad + 1);
        goto done;
    }
    if (h.fortran && h.nd > 1) {
        /* conv holds the elements in Fortran order: reorder through raw (large enough: es <= 8
         * and raw has n·size bytes only when size = es, so allocate when it is smaller) */
        void *c = (size_t)h.size >= es ? (void *)raw : malloc((size_t)n * es);
        if (!c) {
            pn_error(PN_ERR_OOM, "%s: out of memory reordering %s", OP_LOAD, path);
            goto done;
        }
        fortran_to_c(h.nd, h.shape, conv, c, es, n);
        out = pn_from_buffer(h.nd, h.shape, dt, c);
        if (c != raw) free(c);
    } else {
        out = pn_from_buffer(h.nd, h.shape, dt, conv);
    }
done:
    fclose(fp);
    free(header);
    free(raw);
    free(conv);
    return out;
}

/* ---- save ----------------------------------------------------------------------------------- */
pn_status pn_npy_save(const char *path, const pn_tensor *t) {
    if (!path || !t) return pn_error(PN_ERR_ARG, "%s: %s is nil", OP_SAVE, !path ? "path" : "tensor");
    static const char *descr[] = {[PN_F32] = "<f4", [PN_F64] = "<f8", [PN_I32] = "<i4", [PN_I64] = "<i8",
                                  [PN_U8] = "|u1"};
    char shape[24 * PN_MAX_DIMS + 4];
    shape_text(t->nd, t->sizes, shape, sizeof shape);
    char header[64 * 16];
    int hl = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr[t->dt],
                      shape);
    int total = 10 + hl + 1; /* magic, version, u16 length, header, '\n' */
    int pad = (64 - total % 64) % 64;
    memset(header + hl, ' ', (size_t)pad);
    header[hl + pad] = '\n';
    hl += pad + 1;
    size_t nbytes = (size_t)pn_numel(t) * pn_elsize(t->dt);
    void *buf = malloc(nbytes ? nbytes : 1);
    if (!buf) return pn_error(PN_ERR_OOM, "%s: out of memory for %s", OP_SAVE, pn_shape_str(t));
    pn_status st = pn_to_buffer(t, buf, nbytes);
    if (st) {
        free(buf);
        return st;
    }
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        free(buf);
        return pn_error(PN_ERR_IO, "%s: cannot create %s: %s", OP_SAVE, path, strerror(errno));
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    bool ok = fwrite(pre, 1, 10, fp) == 10 && fwrite(header, 1, (size_t)hl, fp) == (size_t)hl &&
              fwrite(buf, 1, nbytes, fp) == nbytes;
    int err = errno;
    ok = (fclose(fp) == 0) && ok;
    free(buf);
    if (!ok) {
        remove(path);
        return pn_error(PN_ERR_IO, "%s: writing %s failed: %s (the partial file was removed)", OP_SAVE, path,
                        strerror(err ? err : errno));
    }
    return PN_OK;
}
