/* error.c — thread-local error message (pn_last_error) and shape formatting. */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[1024];
static _Thread_local pn_status err_code;

const char *pn_last_error(void) { return err_buf; }
void pn_clear_error(void) { err_buf[0] = 0; err_code = PN_OK; }

/* glibc prints a NaN with its sign bit set as "-nan" (0/0 on x86 has it), which reads as a
 * different value; the sign of a NaN means nothing, so every message says "nan". Only a
 * standalone "-nan" is changed (not one inside a word, such as a path "x-nan.h5"). */
static void unsign_nan(char *s) {
    for (char *p = s; (p = strstr(p, "-nan")) != NULL;) {
        int starts = p == s || !isalnum((unsigned char)p[-1]);
        int ends = !isalnum((unsigned char)p[4]) && p[4] != '_';
        if (starts && ends) memmove(p, p + 1, strlen(p + 1) + 1);
        else p += 4;
    }
}

static void set_error(pn_status code, const char *fmt, va_list ap) {
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    unsign_nan(err_buf);
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
