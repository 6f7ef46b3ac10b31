/* bleu.c — corpus BLEU and chrF exactly as sacreBLEU 2.x computes them with its defaults
 * (`sacrebleu REF -i HYP`, BLEU().corpus_score / CHRF().corpus_score): pn_bleu, pn_chrf and
 * pn_bleu_tokenize_13a of penumbra.h.
 *
 * BLEU (sacrebleu/metrics/bleu.py): cased, tokenizer '13a', n-grams of order 1..4, 'exp'
 * smoothing, no effective order.
 *   1. Each segment is right-stripped (Python's str.rstrip: Unicode whitespace), then the 13a
 *      rules (tokenizers/tokenizer_13a.py): every "<skipped>" removed, every "-\n" removed, every
 *      "\n" made a space; when the line holds '&': "&quot;" → '"', "&amp;" → '&', "&lt;" → '<',
 *      "&gt;" → '>' (four passes in this order, each over the whole line, like str.replace);
 *      then the line is wrapped in spaces and the four regexes of tokenizer_re.py are applied
 *      one after the other with re.sub's semantics (scan left to right, non-overlapping):
 *        R1  [{-~[-` -&(-+:-@/]   → " \1 "      (ASCII punctuation except ' , - .)
 *        R2  ([^0-9])([.,])       → "\1 \2 "    (period/comma unless preceded by a digit)
 *        R3  ([.,])([^0-9])       → " \1 \2"    (period/comma unless followed by a digit)
 *        R4  ([0-9])(-)           → "\1 \2 "    (dash after a digit)
 *      and finally ' '.join(line.split()): split on Python's whitespace (the ASCII \t\n\v\f\r,
 *      \x1c-\x1f and space, plus U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F,
 *      U+205F, U+3000). The rules run on UTF-8 bytes: every class they test is ASCII, and a
 *      multi-byte character can only take part as the [^0-9] of R2 (its last byte precedes
 *      the match's '.') or of R3 (its first byte follows it), which gives the same text as
 *      matching it as one code point.
 *   2. Per segment: hypothesis n-gram counts clipped by the maximum count of that n-gram in any
 *      reference; the reference length is the closest to the hypothesis length (ties: the
 *      shorter). Corpus sums: counts[n], totals[n], sys_len, ref_len.
 *   3. bp = 1 when sys_len >= ref_len, else exp(1 − ref_len/sys_len) (0 when sys_len = 0);
 *      no matched n-gram at all → score 0 and precisions 0; otherwise p_n = 100·c_n/t_n, and a
 *      zero c_n gives p_n = 100/(2^k·t_n) for the k-th such order; an order with t_n = 0 stops
 *      the loop (its and the following p_n stay 0, log 0 counted as −9999999999);
 *      score = bp·exp((Σ log p_n)/4), summed left to right as Python 3.11's sum() does.
 *
 * chrF (sacrebleu/metrics/chrf.py, defaults = chrF2): character n-grams of order 1..6 over the
 * segment with every whitespace character removed (''.join(line.split())), characters being
 * Unicode code points; no word n-grams; beta 2; eps_smoothing False, i.e. the statistics
 * (hyp, ref, match) per order are summed over the corpus and the score averages precision and
 * recall over the orders where both hyp and ref counts are nonzero:
 *   P = mean(match/hyp), R = mean(match/ref), chrF = 100·(1+β²)·P·R/(β²·P + R) (0 when P+R = 0).
 * A segment order whose reference has no n-gram counts no hypothesis n-grams either. With
 * several references, each segment takes the statistics of the first reference with the
 * highest segment-level chrF.
 *
 * Inputs are validated before anything is allocated: the counts must agree, no string may be
 * NULL, every string must be valid UTF-8 (Python's strict decoder: no overlong forms, no
 * surrogates, nothing above U+10FFFF). Sizes are checked for overflow wherever they are
 * multiplied or grown. */
#include "internal.h"

#include <stdio.h>

#define OP_BLEU "bleu"
#define OP_CHRF "chrf"
#define OP_TOK "bleu tokenize"
#define BORDER PN_BLEU_MAX_ORDER  /* 4 */
#define CORDER PN_CHRF_CHAR_ORDER /* 6 */
#define CHRF_BETA 2

/* ---- checked sizes and growth ------------------------------------------------------------ */
static bool add_sz(size_t a, size_t b, size_t *o) { return !__builtin_add_overflow(a, b, o); }
static bool mul_sz(size_t a, size_t b, size_t *o) { return !__builtin_mul_overflow(a, b, o); }

/* Makes *p hold at least `need` elements of `elsize` bytes (realloc; *cap in elements). */
static pn_status grow(const char *op, void **p, size_t *cap, size_t need, size_t elsize) {
    if (need <= *cap) return PN_OK;
    size_t c = *cap < 64 ? 64 : *cap, bytes;
    while (c < need)
        if (!mul_sz(c, 2, &c)) return pn_error(PN_ERR_ARG, "%s: size overflow growing a buffer to %zu elements", op, need);
    if (!mul_sz(c, elsize, &bytes))
        return pn_error(PN_ERR_ARG, "%s: size overflow: %zu elements of %zu bytes", op, c, elsize);
    void *q = realloc(*p, bytes);
    if (!q) return pn_error(PN_ERR_OOM, "%s: out of memory allocating %zu bytes", op, bytes);
    *p = q;
    *cap = c;
    return PN_OK;
}

/* *p reallocated to count elements of elsize bytes */
static pn_status resize(const char *op, void **p, size_t count, size_t elsize) {
    size_t bytes;
    if (!mul_sz(count, elsize, &bytes))
        return pn_error(PN_ERR_ARG, "%s: size overflow: %zu elements of %zu bytes", op, count, elsize);
    void *q = realloc(*p, bytes);
    if (!q) return pn_error(PN_ERR_OOM, "%s: out of memory allocating %zu bytes", op, bytes);
    *p = q;
    return PN_OK;
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytes_t;

/* empties b and makes room for `factor`·n + `extra` bytes */
static pn_status bytes_room(const char *op, bytes_t *b, size_t n, size_t factor, size_t extra) {
    size_t need;
    if (!mul_sz(n, factor, &need) || !add_sz(need, extra, &need))
        return pn_error(PN_ERR_ARG, "%s: size overflow: a line of %zu bytes", op, n);
    b->n = 0;
    return grow(op, (void **)&b->p, &b->cap, need, 1);
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */
/* The offset of the first byte that Python's strict UTF-8 decoder refuses, or SIZE_MAX. */
static size_t utf8_bad(const unsigned char *s) {
    size_t i = 0;
    for (;;) {
        unsigned c = s[i];
        if (c == 0) return SIZE_MAX;
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned lo = 0x80, hi = 0xBF;
        int more;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F; /* no surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F; /* nothing above U+10FFFF */
        } else
            return i;
        for (int k = 1; k <= more; k++) {
            unsigned d = s[i + (size_t)k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return i + (size_t)k;
        }
        i += (size_t)more + 1;
    }
}

/* length of the (valid) UTF-8 sequence starting with lead byte c */
static inline size_t u8len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static inline uint32_t u8dec(const unsigned char *p, size_t len) {
    switch (len) {
    case 1: return p[0];
    case 2: return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default: return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    }
}

/* Python's str.isspace() for one code point (what str.split() and str.rstrip() use) */
static inline bool py_space(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- the 13a tokenizer ----------------------------------------------------------------------- */
typedef struct {
    bytes_t a, b;
} tokbufs;

/* str.replace(pat, rep) of src into dst (rep no longer than pat, so n bytes suffice) */
static pn_status replace_all(const char *op, const unsigned char *s, size_t n, const char *pat, const char *rep,
                             bytes_t *dst) {
    PN_TRY(bytes_room(op, dst, n, 1, 1));
    size_t pl = strlen(pat), rl = strlen(rep), i = 0;
    unsigned char *o = dst->p;
    while (i < n) {
        if (s[i] == (unsigned char)pat[0] && n - i >= pl && memcmp(s + i, pat, pl) == 0) {
            memcpy(o, rep, rl);
            o += rl;
            i += pl;
        } else
            *o++ = s[i++];
    }
    dst->n = (size_t)(o - dst->p);
    return PN_OK;
}

static inline bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline bool is_pc(unsigned char c) { return c == '.' || c == ','; }
/* R1's class: {|}~ [\]^_` space!"#$%& ()*+ :;<=>?@ / */
static inline bool r1_class(unsigned char c) {
    return (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) || (c >= 0x28 && c <= 0x2B) ||
           (c >= 0x3A && c <= 0x40) || c == 0x2F;
}

/* re.sub of a two-character pattern (x)(y) with x in class A, y in class B: scanning left to
 * right, a match emits the replacement and resumes after it, otherwise one byte is copied. */
enum { RULE2, RULE3, RULE4 };
static void regex_pass(int rule, const unsigned char *s, size_t n, bytes_t *dst) {
    unsigned char *o = dst->p;
    size_t i = 0;
    while (i < n) {
        if (i + 1 < n) {
            unsigned char x = s[i], y = s[i + 1];
            bool m = rule == RULE2 ? (!is_digit(x) && is_pc(y)) : rule == RULE3 ? (is_pc(x) && !is_digit(y))
                                                                                  : (is_digit(x) && y == '-');
            if (m) {
                if (rule == RULE3) { /* " \1 \2" */
                    *o++ = ' ', *o++ = x, *o++ = ' ', *o++ = y;
                } else { /* "\1 \2 " */
                    *o++ = x, *o++ = ' ', *o++ = y, *o++ = ' ';
                }
                i += 2;
                continue;
            }
        }
        *o++ = s[i++];
    }
    dst->n = (size_t)(o - dst->p);
}

/* The 13a tokenisation of one (valid UTF-8) line: the tokens joined by single spaces, in
 * *out (pointing into t), *out_n bytes. */
static pn_status tok13a(const char *op, const char *line, tokbufs *t, const unsigned char **out, size_t *out_n) {
    const unsigned char *s = (const unsigned char *)line;
    /* rstrip */
    size_t n = 0, i = 0;
    while (s[i]) {
        size_t l = u8len(s[i]);
        if (!py_space(u8dec(s + i, l))) n = i + l;
        i += l;
    }
    /* "<skipped>" → "" */
    PN_TRY(replace_all(op, s, n, "<skipped>", "", &t->a));
    /* "-\n" → "", then "\n" → " " (one pass gives the same text: the second replace only sees
     * the newlines the first left) */
    PN_TRY(bytes_room(op, &t->b, t->a.n, 1, 1));
    {
        const unsigned char *p = t->a.p;
        unsigned char *o = t->b.p;
        size_t m = t->a.n, k = 0;
        while (k < m) {
            if (p[k] == '-' && k + 1 < m && p[k + 1] == '\n') k += 2;
            else if (p[k] == '\n') *o++ = ' ', k++;
            else *o++ = p[k++];
        }
        t->b.n = (size_t)(o - t->b.p);
    }
    bytes_t *cur = &t->b, *oth = &t->a, *sw;
    if (memchr(cur->p, '&', cur->n)) {
        static const char *const esc[4][2] = { { "&quot;", "\"" }, { "&amp;", "&" }, { "&lt;", "<" }, { "&gt;", ">" } };
        for (int e = 0; e < 4; e++) {
            PN_TRY(replace_all(op, cur->p, cur->n, esc[e][0], esc[e][1], oth));
            sw = cur, cur = oth, oth = sw;
        }
    }
    /* f' {line} ' and R1 (each byte at most 3) */
    PN_TRY(bytes_room(op, oth, cur->n, 3, 8));
    {
        unsigned char *o = oth->p;
        *o++ = ' ', *o++ = ' ', *o++ = ' '; /* the leading ' ' is itself in R1's class */
        for (size_t k = 0; k < cur->n; k++) {
            unsigned char c = cur->p[k];
            if (r1_class(c)) *o++ = ' ', *o++ = c, *o++ = ' ';
            else *o++ = c;
        }
        *o++ = ' ', *o++ = ' ', *o++ = ' ';
        oth->n = (size_t)(o - oth->p);
        sw = cur, cur = oth, oth = sw;
    }
    /* R2, R3, R4: every match turns two bytes into four */
    for (int r = RULE2; r <= RULE4; r++) {
        PN_TRY(bytes_room(op, oth, cur->n, 2, 1));
        regex_pass(r, cur->p, cur->n, oth);
        sw = cur, cur = oth, oth = sw;
    }
    /* ' '.join(line.split()) */
    PN_TRY(bytes_room(op, oth, cur->n, 1, 1));
    {
        unsigned char *o = oth->p;
        const unsigned char *p = cur->p;
        size_t m = cur->n, k = 0;
        bool gap = false;
        while (k < m) {
            size_t l = u8len(p[k]);
            if (py_space(u8dec(p + k, l))) gap = true;
            else {
                if (gap && o > oth->p) *o++ = ' ';
                gap = false;
                memcpy(o, p + k, l);
                o += l;
            }
            k += l;
        }
        oth->n = (size_t)(o - oth->p);
    }
    *out = oth->p;
    *out_n = oth->n;
    return PN_OK;
}

/* ---- token interning: byte strings → ids 1, 2, … ------------------------------------------- */
typedef struct {
    bytes_t arena;
    size_t *off;     /* per id − 1 */
    uint32_t *len;
    uint64_t *hash;
    size_t count, cap_e;
    uint32_t *slot;  /* id, 0 = empty */
    size_t cap_s;    /* power of two */
} interner;

static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return mix64(h ^ n);
}

static pn_status intern_rehash(const char *op, interner *in, size_t cap) {
    size_t bytes;
    if (!mul_sz(cap, sizeof(uint32_t), &bytes)) return pn_error(PN_ERR_ARG, "%s: size overflow in the token table", op);
    uint32_t *s = calloc(cap, sizeof(uint32_t));
    if (!s) return pn_error(PN_ERR_OOM, "%s: out of memory allocating %zu bytes", op, bytes);
    for (size_t e = 0; e < in->count; e++) {
        size_t j = in->hash[e] & (cap - 1);
        while (s[j]) j = (j + 1) & (cap - 1);
        s[j] = (uint32_t)(e + 1);
    }
    free(in->slot);
    in->slot = s;
    in->cap_s = cap;
    return PN_OK;
}

static pn_status intern(const char *op, interner *in, const unsigned char *p, size_t n, uint32_t *id) {
    if (n > UINT32_MAX) return pn_error(PN_ERR_ARG, "%s: a token of %zu bytes is too long", op, n);
    uint64_t h = hash_bytes(p, n);
    if (in->cap_s) {
        size_t j = h & (in->cap_s - 1);
        while (in->slot[j]) {
            size_t e = in->slot[j] - 1;
            if (in->hash[e] == h && in->len[e] == n && memcmp(in->arena.p + in->off[e], p, n) == 0) {
                *id = (uint32_t)(e + 1);
                return PN_OK;
            }
            j = (j + 1) & (in->cap_s - 1);
        }
    }
    if (in->count >= UINT32_MAX - 1) return pn_error(PN_ERR_ARG, "%s: more than %u distinct tokens", op, UINT32_MAX - 1);
    size_t need = in->count + 1, cap = in->cap_e;
    PN_TRY(grow(op, (void **)&in->off, &cap, need, sizeof(size_t)));
    cap = in->cap_e;
    PN_TRY(grow(op, (void **)&in->len, &cap, need, sizeof(uint32_t)));
    cap = in->cap_e;
    PN_TRY(grow(op, (void **)&in->hash, &cap, need, sizeof(uint64_t)));
    in->cap_e = cap;
    size_t an;
    if (!add_sz(in->arena.n, n, &an)) return pn_error(PN_ERR_ARG, "%s: size overflow in the token arena", op);
    PN_TRY(grow(op, (void **)&in->arena.p, &in->arena.cap, an, 1));
    memcpy(in->arena.p + in->arena.n, p, n);
    size_t e = in->count++;
    in->off[e] = in->arena.n;
    in->len[e] = (uint32_t)n;
    in->hash[e] = h;
    in->arena.n = an;
    size_t twice;
    if (!mul_sz(in->count, 2, &twice)) return pn_error(PN_ERR_ARG, "%s: size overflow in the token table", op);
    if (twice > in->cap_s) {
        size_t c = in->cap_s ? in->cap_s : 1024;
        while (c < twice)
            if (!mul_sz(c, 2, &c)) return pn_error(PN_ERR_ARG, "%s: size overflow in the token table", op);
        PN_TRY(intern_rehash(op, in, c)); /* inserts e too */
    } else {
        size_t j = h & (in->cap_s - 1);
        while (in->slot[j]) j = (j + 1) & (in->cap_s - 1);
        in->slot[j] = (uint32_t)(e + 1);
    }
    *id = (uint32_t)(e + 1);
    return PN_OK;
}

static void intern_free(interner *in) {
    free(in->arena.p);
    free(in->off);
    free(in->len);
    free(in->hash);
    free(in->slot);
}

/* ---- n-gram counting: keys of kw words (order, item 1 … item order, zeros) ----------------- */
enum { V_REF, V_CUR, V_HYP, NV };
typedef struct {
    int kw;
    size_t count, cap_e;
    uint32_t *key;   /* cap_e · kw */
    int64_t *val;    /* cap_e · NV */
    size_t *where;   /* the slot of each entry */
    size_t *slot;    /* entry + 1, 0 = empty */
    size_t cap_s;    /* power of two */
} ngtab;

static uint64_t hash_key(const uint32_t *k, int kw) {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < kw; i++) h = (h ^ k[i]) * 0x100000001b3ull;
    return mix64(h);
}

static void tab_clear(ngtab *t) {
    for (size_t e = 0; e < t->count; e++) t->slot[t->where[e]] = 0;
    t->count = 0;
}

static pn_status tab_rehash(const char *op, ngtab *t, size_t cap) {
    size_t bytes;
    if (!mul_sz(cap, sizeof(size_t), &bytes)) return pn_error(PN_ERR_ARG, "%s: size overflow in the n-gram table", op);
    size_t *s = calloc(cap, sizeof(size_t));
    if (!s) return pn_error(PN_ERR_OOM, "%s: out of memory allocating %zu bytes", op, bytes);
    for (size_t e = 0; e < t->count; e++) {
        size_t j = hash_key(t->key + e * (size_t)t->kw, t->kw) & (cap - 1);
        while (s[j]) j = (j + 1) & (cap - 1);
        s[j] = e + 1;
        t->where[e] = j;
    }
    free(t->slot);
    t->slot = s;
    t->cap_s = cap;
    return PN_OK;
}

/* The entry of key k (added with zero values when new). */
static pn_status tab_get(const char *op, ngtab *t, const uint32_t *k, size_t *entry) {
    const int kw = t->kw;
    const uint64_t h = hash_key(k, kw);
    if (t->cap_s) {
        size_t j = h & (t->cap_s - 1);
        while (t->slot[j]) {
            size_t e = t->slot[j] - 1;
            if (memcmp(t->key + e * (size_t)kw, k, sizeof(uint32_t) * (size_t)kw) == 0) {
                *entry = e;
                return PN_OK;
            }
            j = (j + 1) & (t->cap_s - 1);
        }
    }
    if (t->count == t->cap_e) {
        size_t c = t->cap_e < 64 ? 64 : t->cap_e;
        if (t->cap_e >= 64 && !mul_sz(c, 2, &c)) return pn_error(PN_ERR_ARG, "%s: size overflow in the n-gram table", op);
        PN_TRY(resize(op, (void **)&t->key, c, (size_t)kw * sizeof(uint32_t)));
        PN_TRY(resize(op, (void **)&t->val, c, NV * sizeof(int64_t)));
        PN_TRY(resize(op, (void **)&t->where, c, sizeof(size_t)));
        t->cap_e = c;
    }
    size_t e = t->count++;
    memcpy(t->key + e * (size_t)kw, k, sizeof(uint32_t) * (size_t)kw);
    memset(t->val + e * NV, 0, sizeof(int64_t) * NV);
    size_t twice;
    if (!mul_sz(t->count, 2, &twice)) return pn_error(PN_ERR_ARG, "%s: size overflow in the n-gram table", op);
    if (twice > t->cap_s) {
        size_t c = t->cap_s ? t->cap_s : 1024;
        while (c < twice)
            if (!mul_sz(c, 2, &c)) return pn_error(PN_ERR_ARG, "%s: size overflow in the n-gram table", op);
        PN_TRY(tab_rehash(op, t, c)); /* places e too */
    } else {
        size_t j = h & (t->cap_s - 1);
        while (t->slot[j]) j = (j + 1) & (t->cap_s - 1);
        t->slot[j] = e + 1;
        t->where[e] = j;
    }
    *entry = e;
    return PN_OK;
}

/* Adds 1 to value v of every n-gram (orders 1..maxn) of items x[0..len). */
static pn_status count_ngrams(const char *op, ngtab *t, const uint32_t *x, size_t len, int maxn, int v) {
    uint32_t k[1 + CORDER];
    for (int n = 1; n <= maxn; n++) {
        if (len < (size_t)n) break;
        memset(k, 0, sizeof k);
        k[0] = (uint32_t)n;
        for (size_t i = 0; i + (size_t)n <= len; i++) {
            memcpy(k + 1, x + i, sizeof(uint32_t) * (size_t)n);
            size_t e;
            PN_TRY(tab_get(op, t, k, &e));
            t->val[e * NV + (size_t)v]++;
        }
    }
    return PN_OK;
}

static void tab_free(ngtab *t) {
    free(t->key);
    free(t->val);
    free(t->where);
    free(t->slot);
}

/* ---- argument checks ------------------------------------------------------------------------ */
static const char *line_name(char *buf, size_t size, int32_t stream, int32_t n_streams, int64_t line) {
    if (stream < 0) snprintf(buf, size, "hypothesis line %lld", (long long)line + 1);
    else if (n_streams == 1) snprintf(buf, size, "reference line %lld", (long long)line + 1);
    else snprintf(buf, size, "reference stream %d line %lld", stream + 1, (long long)line + 1);
    return buf;
}

static pn_status check_lines(const char *op, const char *const *s, int64_t n, int32_t stream, int32_t n_streams) {
    char nm[96];
    for (int64_t i = 0; i < n; i++) {
        if (!s[i]) return pn_error(PN_ERR_ARG, "%s: %s is NULL", op, line_name(nm, sizeof nm, stream, n_streams, i));
        size_t bad = utf8_bad((const unsigned char *)s[i]);
        if (bad != SIZE_MAX)
            return pn_error(PN_ERR_ARG, "%s: %s is not valid UTF-8 (byte %zu is 0x%02x)", op,
                            line_name(nm, sizeof nm, stream, n_streams, i), bad + 1, (unsigned)(unsigned char)s[i][bad]);
    }
    return PN_OK;
}

static pn_status check_args(const char *op, const char *const *hyp, int64_t n_hyp, const char *const *const *ref,
                            const int64_t *n_ref, int32_t n_streams, const void *out) {
    if (!out) return pn_error(PN_ERR_ARG, "%s: the output struct is NULL", op);
    if (n_hyp < 0) return pn_error(PN_ERR_ARG, "%s: the hypothesis count %lld is negative", op, (long long)n_hyp);
    if (n_hyp > 0 && !hyp) return pn_error(PN_ERR_ARG, "%s: %lld hypothesis lines but the array is NULL", op, (long long)n_hyp);
    if (n_streams < 1) return pn_error(PN_ERR_ARG, "%s: at least one reference stream is needed, got %d", op, n_streams);
    if (!ref || !n_ref) return pn_error(PN_ERR_ARG, "%s: the reference streams are NULL", op);
    for (int32_t r = 0; r < n_streams; r++) {
        if (n_ref[r] != n_hyp) {
            if (n_streams == 1)
                return pn_error(PN_ERR_SHAPE, "%s: %lld hypothesis lines but %lld reference lines", op, (long long)n_hyp,
                                (long long)n_ref[r]);
            return pn_error(PN_ERR_SHAPE, "%s: %lld hypothesis lines but reference stream %d has %lld lines", op,
                            (long long)n_hyp, r + 1, (long long)n_ref[r]);
        }
        if (n_hyp > 0 && !ref[r]) return pn_error(PN_ERR_ARG, "%s: reference stream %d is NULL", op, r + 1);
    }
    PN_TRY(check_lines(op, hyp, n_hyp, -1, n_streams));
    for (int32_t r = 0; r < n_streams; r++) PN_TRY(check_lines(op, ref[r], n_hyp, r, n_streams));
    return PN_OK;
}

/* ---- BLEU -------------------------------------------------------------------------------------- */
typedef struct {
    tokbufs tb;
    interner in;
    ngtab tab;
    uint32_t *ids;
    size_t ids_cap;
    uint32_t *cps;
    size_t cps_cap;
    int64_t *lens;
    size_t lens_cap;
} work;

static void work_free(work *w) {
    free(w->tb.a.p);
    free(w->tb.b.p);
    intern_free(&w->in);
    tab_free(&w->tab);
    free(w->ids);
    free(w->cps);
    free(w->lens);
}

/* tokenise line (13a) and intern its tokens into w->ids; *len tokens */
static pn_status line_ids(const char *op, work *w, const char *line, size_t *len) {
    const unsigned char *t;
    size_t n;
    PN_TRY(tok13a(op, line, &w->tb, &t, &n));
    size_t cnt = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t j = i;
        while (j < n && t[j] != ' ') j++;
        if (j > i) {
            PN_TRY(grow(op, (void **)&w->ids, &w->ids_cap, cnt + 1, sizeof(uint32_t)));
            PN_TRY(intern(op, &w->in, t + i, j - i, &w->ids[cnt]));
            cnt++;
        }
        i = j;
    }
    *len = cnt;
    return PN_OK;
}

static void bleu_finish(pn_bleu_score *o) {
    const int64_t sys = o->sys_len, ref = o->ref_len;
    o->ratio = ref ? (double)sys / (double)ref : 0.0;
    o->bp = 1.0;
    if (sys < ref) o->bp = sys > 0 ? exp(1.0 - (double)ref / (double)sys) : 0.0;
    bool any = false;
    for (int n = 0; n < BORDER; n++) {
        o->precisions[n] = 0.0;
        any |= o->counts[n] != 0;
    }
    o->score = 0.0;
    if (any) {
        double smooth = 1.0;
        for (int n = 0; n < BORDER; n++) {
            if (o->totals[n] == 0) break;
            if (o->counts[n] == 0) {
                smooth *= 2;
                o->precisions[n] = 100. / (smooth * (double)o->totals[n]);
            } else
                o->precisions[n] = 100. * (double)o->counts[n] / (double)o->totals[n];
        }
        double s = 0.0; /* Python 3.11 sum(): left to right */
        for (int n = 0; n < BORDER; n++) s += o->precisions[n] == 0.0 ? -9999999999.0 : log(o->precisions[n]);
        o->score = o->bp * exp(s / BORDER);
    }
    snprintf(o->line, sizeof o->line, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = %lld)",
             o->score, o->precisions[0], o->precisions[1], o->precisions[2], o->precisions[3], o->bp, o->ratio,
             (long long)o->sys_len, (long long)o->ref_len);
}

pn_status pn_bleu(const char *const *hyp, int64_t n_hyp, const char *const *const *ref, const int64_t *n_ref,
                  int32_t n_streams, pn_bleu_score *out) {
    PN_TRY(check_args(OP_BLEU, hyp, n_hyp, ref, n_ref, n_streams, out));
    memset(out, 0, sizeof *out);
    work w;
    memset(&w, 0, sizeof w);
    w.tab.kw = 1 + BORDER;
    pn_status st = grow(OP_BLEU, (void **)&w.lens, &w.lens_cap, (size_t)n_streams, sizeof(int64_t));
    for (int64_t i = 0; i < n_hyp && st == PN_OK; i++) {
        tab_clear(&w.tab);
        size_t len;
        for (int32_t r = 0; r < n_streams && st == PN_OK; r++) {
            if ((st = line_ids(OP_BLEU, &w, ref[r][i], &len))) break;
            w.lens[r] = (int64_t)len;
            if ((st = count_ngrams(OP_BLEU, &w.tab, w.ids, len, BORDER, V_CUR))) break;
            for (size_t e = 0; e < w.tab.count; e++) { /* the maximum count over the references */
                int64_t *v = w.tab.val + e * NV;
                if (v[V_CUR] > v[V_REF]) v[V_REF] = v[V_CUR];
                v[V_CUR] = 0;
            }
        }
        if (st) break;
        if ((st = line_ids(OP_BLEU, &w, hyp[i], &len))) break;
        if ((st = count_ngrams(OP_BLEU, &w.tab, w.ids, len, BORDER, V_HYP))) break;
        for (size_t e = 0; e < w.tab.count; e++) {
            const int64_t *v = w.tab.val + e * NV;
            if (v[V_HYP]) out->counts[w.tab.key[e * (size_t)w.tab.kw] - 1] += v[V_HYP] < v[V_REF] ? v[V_HYP] : v[V_REF];
        }
        for (int n = 1; n <= BORDER; n++)
            if (len >= (size_t)n) out->totals[n - 1] += (int64_t)(len - (size_t)n + 1);
        /* the closest reference length; ties go to the shorter */
        int64_t best = -1, bestd = -1;
        for (int32_t r = 0; r < n_streams; r++) {
            int64_t d = llabs((int64_t)len - w.lens[r]);
            if (bestd < 0 || d < bestd || (d == bestd && w.lens[r] < best)) bestd = d, best = w.lens[r];
        }
        out->sys_len += (int64_t)len;
        out->ref_len += best;
    }
    work_free(&w);
    if (st) {
        memset(out, 0, sizeof *out);
        return st;
    }
    bleu_finish(out);
    return PN_OK;
}

/* ---- chrF -------------------------------------------------------------------------------------- */
/* the code points of line without its whitespace, into w->cps */
static pn_status line_chars(const char *op, work *w, const char *line, size_t *len) {
    const unsigned char *s = (const unsigned char *)line;
    size_t n = strlen(line), cnt = 0;
    PN_TRY(grow(op, (void **)&w->cps, &w->cps_cap, n + 1, sizeof(uint32_t)));
    for (size_t i = 0; i < n;) {
        size_t l = u8len(s[i]);
        uint32_t c = u8dec(s + i, l);
        if (!py_space(c)) w->cps[cnt++] = c;
        i += l;
    }
    *len = cnt;
    return PN_OK;
}

/* sacreBLEU's CHRF._compute_f_score with eps_smoothing False; st: (hyp, ref, match) per order */
static double chrf_f(const int64_t (*st)[3]) {
    const double eps = 1e-16;
    const int factor = CHRF_BETA * CHRF_BETA;
    double avg_prec = 0.0, avg_rec = 0.0;
    int eff = 0;
    for (int i = 0; i < CORDER; i++) {
        int64_t h = st[i][0], r = st[i][1], m = st[i][2];
        double prec = h > 0 ? (double)m / (double)h : eps;
        double rec = r > 0 ? (double)m / (double)r : eps;
        if (h > 0 && r > 0) {
            avg_prec += prec;
            avg_rec += rec;
            eff++;
        }
    }
    if (eff == 0) avg_prec = avg_rec = 0.0;
    else {
        avg_prec /= eff;
        avg_rec /= eff;
    }
    if (avg_prec + avg_rec != 0.0) {
        double score = (double)(1 + factor) * avg_prec * avg_rec;
        score /= ((double)factor * avg_prec) + avg_rec;
        return 100 * score;
    }
    return 0.0;
}

pn_status pn_chrf(const char *const *hyp, int64_t n_hyp, const char *const *const *ref, const int64_t *n_ref,
                  int32_t n_streams, pn_chrf_score *out) {
    PN_TRY(check_args(OP_CHRF, hyp, n_hyp, ref, n_ref, n_streams, out));
    memset(out, 0, sizeof *out);
    work w;
    memset(&w, 0, sizeof w);
    w.tab.kw = 1 + CORDER;
    pn_status st = PN_OK;
    int64_t tot[CORDER][3];
    memset(tot, 0, sizeof tot);
    for (int64_t i = 0; i < n_hyp && st == PN_OK; i++) {
        tab_clear(&w.tab);
        size_t lh, lr;
        if ((st = line_chars(OP_CHRF, &w, hyp[i], &lh))) break;
        if ((st = count_ngrams(OP_CHRF, &w.tab, w.cps, lh, CORDER, V_HYP))) break;
        double best = -1.0;
        int64_t best_st[CORDER][3];
        memset(best_st, 0, sizeof best_st);
        for (int32_t r = 0; r < n_streams; r++) {
            if ((st = line_chars(OP_CHRF, &w, ref[r][i], &lr))) break;
            if ((st = count_ngrams(OP_CHRF, &w.tab, w.cps, lr, CORDER, V_CUR))) break;
            int64_t s[CORDER][3];
            memset(s, 0, sizeof s);
            for (size_t e = 0; e < w.tab.count; e++) {
                int64_t *v = w.tab.val + e * NV;
                if (v[V_CUR]) {
                    s[w.tab.key[e * (size_t)w.tab.kw] - 1][2] += v[V_HYP] < v[V_CUR] ? v[V_HYP] : v[V_CUR];
                    v[V_CUR] = 0;
                }
            }
            for (int n = 1; n <= CORDER; n++) {
                s[n - 1][1] = lr >= (size_t)n ? (int64_t)(lr - (size_t)n + 1) : 0;
                /* "hyp_count if ref_ngrams else 0" */
                s[n - 1][0] = (s[n - 1][1] > 0 && lh >= (size_t)n) ? (int64_t)(lh - (size_t)n + 1) : 0;
            }
            double f = chrf_f((const int64_t(*)[3])s);
            if (f > best) {
                best = f;
                memcpy(best_st, s, sizeof s);
            }
        }
        if (st) break;
        for (int n = 0; n < CORDER; n++)
            for (int k = 0; k < 3; k++) tot[n][k] += best_st[n][k];
    }
    work_free(&w);
    if (st) {
        memset(out, 0, sizeof *out);
        return st;
    }
    for (int n = 0; n < CORDER; n++) {
        out->hyp[n] = tot[n][0];
        out->ref[n] = tot[n][1];
        out->match[n] = tot[n][2];
    }
    out->score = chrf_f((const int64_t(*)[3])tot);
    out->char_order = CORDER;
    out->word_order = 0;
    out->beta = CHRF_BETA;
    snprintf(out->line, sizeof out->line, "chrF%d = %.2f", CHRF_BETA, out->score);
    return PN_OK;
}

/* ---- the tokenizer alone ------------------------------------------------------------------------ */
int64_t pn_bleu_tokenize_13a(const char *line, char *buf, int64_t size) {
    if (!line) return pn_error(PN_ERR_ARG, "%s: the line is NULL", OP_TOK), -1;
    if (size < 0 || (size > 0 && !buf))
        return pn_error(PN_ERR_ARG, "%s: the buffer is NULL or its size %lld is negative", OP_TOK, (long long)size), -1;
    size_t bad = utf8_bad((const unsigned char *)line);
    if (bad != SIZE_MAX)
        return pn_error(PN_ERR_ARG, "%s: the line is not valid UTF-8 (byte %zu is 0x%02x)", OP_TOK, bad + 1,
                        (unsigned)(unsigned char)line[bad]), -1;
    tokbufs tb;
    memset(&tb, 0, sizeof tb);
    const unsigned char *t;
    size_t n;
    pn_status st = tok13a(OP_TOK, line, &tb, &t, &n);
    int64_t ret = -1;
    if (st == PN_OK) {
        if (size > 0) {
            size_t k = n < (size_t)size - 1 ? n : (size_t)size - 1;
            memcpy(buf, t, k);
            buf[k] = 0;
        }
        ret = (int64_t)n;
    }
    free(tb.a.p);
    free(tb.b.p);
    return ret;
}
