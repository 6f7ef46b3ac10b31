/* error.c — thread-local error message (pn_last_error) and shape formatting. */
#include "internal.h"

#include <stdio.h>

static _Thread_local char err_buf[1024];
static _Thread_local pn_status err_code;

const char *pn_last_error(void) { return err_buf; }
void pn_clear_error(void) { err_buf[0] = 0; err_code = PN_OK; }

static void set_error(pn_status code, const char *fmt, va_list ap) {
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    err_code = code;
}

pn_status pn_error(pn_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(code, fmt, ap);
    va_end(ap);
    return code;
}

void *pn_error_null(pn_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(code, fmt, ap);
    va_end(ap);
    return NULL;
}

/* A ring of buffers so one message can show several shapes. */
#define RING 8
static _Thread_local char ring[RING][8 * 24];
static _Thread_local int ring_i;

const char *pn_dims_str(int nd, const int64_t *shape) {
    char *b = ring[ring_i++ % RING];
    size_t cap = sizeof ring[0], n = 0;
    n += (size_t)snprintf(b + n, cap - n, "[");
    for (int i = 0; i < nd && n < cap; i++)
        n += (size_t)snprintf(b + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(b + n, cap - n, "]");
    return b;
}

const char *pn_shape_str(const pn_tensor *t) {
    if (!t) return "(nil)";
    return pn_dims_str(t->nd, t->sizes);
}

const char *pn_pos_str(int nd, const int64_t *shape, int64_t p) {
    int64_t c[PN_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        c[d] = (shape[d] ? p % shape[d] : 0) + 1;
        p = shape[d] ? p / shape[d] : 0;
    }
    return pn_dims_str(nd, c);
}
