/* microkernel.c — the f32 GEMM block (microkernel.h) for each instruction set, the choice
 * between them, and the packing of its B operand.
 *
 * One body (microkernel_impl.h) is compiled three times: under `#pragma GCC target` for
 * AVX-512F and for AVX2 + FMA (so the rest of the library keeps the baseline ISA and runs on
 * any x86-64), and once with GCC's generic vector type for everything else. Which one runs is
 * decided once, at the first attention call: PENUMBRA_CPU_KERNEL when set, else the widest
 * the CPU reports (__builtin_cpu_supports), changeable later with pn_set_cpu_kernel. */
#include "microkernel.h"
#include "../ops/fast_math.h" /* PN_VEC */

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define PN_MK_X86 1
#include <immintrin.h>
#endif

/* ---- portable: GCC/Clang's generic vector of 4 floats (SSE on x86-64, NEON on ARM) ----------- */
typedef float pn_v4 __attribute__((vector_size(16)));
static inline pn_v4 pn_v4_load(const float *p) {
    pn_v4 x;
    memcpy(&x, p, sizeof x);
    return x;
}
static inline void pn_v4_store(float *p, pn_v4 x) { memcpy(p, &x, sizeof x); }
typedef int32_t pn_v4i __attribute__((vector_size(16)));
static inline int64_t pn_v4_count(pn_v4i m) { return -(int64_t)(m[0] + m[1] + m[2] + m[3]); } /* lanes are 0 / −1 */
static inline pn_v4 pn_v4_max(pn_v4 x, pn_v4 m) { /* m where x is NaN, as maxps */
    for (int l = 0; l < 4; l++) m[l] = x[l] > m[l] ? x[l] : m[l];
    return m;
}
static inline pn_v4 pn_v4_set1(float a) {
    pn_v4 x = {a, a, a, a};
    return x;
}
#define MK(name) pn_mk_##name##_portable
#define MR 4
#define VW 4
#define vec pn_v4
#define V_ZERO() pn_v4_set1(0)
#define V_LOAD(p) pn_v4_load(p)
#define V_STORE(p, x) pn_v4_store(p, x)
#define V_SET1(x) pn_v4_set1(x)
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_COUNT_LT(a, b) pn_v4_count((a) < (b))
#define V_MAX(x, m) pn_v4_max(x, m)
#include "microkernel_impl.h"

#ifdef PN_MK_X86
/* ---- AVX2 + FMA ---------------------------------------------------------------------------- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define MK(name) pn_mk_##name##_avx2
#define MR 6
#define VW 8
#define vec __m256
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, x) _mm256_storeu_ps(p, x)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_COUNT_LT(a, b) __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ)))
#define V_MAX(x, m) _mm256_max_ps(x, m) /* the second operand where either is NaN */
#include "microkernel_impl.h"
#pragma GCC pop_options

/* ---- AVX-512F ------------------------------------------------------------------------------ */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#define MK(name) pn_mk_##name##_avx512
/* 6 rows × 2 panels of 32 (24 accumulators; 4 loads and 6 broadcasts feed 24 FMAs) rather than
 * 8 × 32 (2 + 8 for 16): the attention's products 5–10 % faster, in one process with the two
 * taking turns (2026-12-01, Xeon of model 207, one thread; README, issue 16) */
#define MR 6
#define NP 2
#define VW 16
#define vec __m512
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps(p, x)
#define V_SET1(x) _mm512_set1_ps(x)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_COUNT_LT(a, b) __builtin_popcount((unsigned)_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ))
#define V_MAX(x, m) _mm512_max_ps(x, m)
#include "microkernel_impl.h"
#pragma GCC pop_options
#endif

/* ---- the table and the choice -------------------------------------------------------------- */
static const pn_microkernel pn_mk_table[] = {
#ifdef PN_MK_X86
    {"avx512", 6, 32, 64, pn_mk_gemm_avx512, pn_mk_dist_avx512},
    {"avx2", 6, 16, 16, pn_mk_gemm_avx2, pn_mk_dist_avx2},
#endif
    {"portable", 4, 8, 8, pn_mk_gemm_portable, pn_mk_dist_portable},
};
enum { PN_MK_COUNT = sizeof pn_mk_table / sizeof pn_mk_table[0] };
#define PN_MK_VALID "auto, avx512, avx2, portable"

static int pn_mk_runs(const pn_microkernel *k) {
#ifdef PN_MK_X86
    if (!strcmp(k->name, "avx512")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(k->name, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return 1;
}

/* *out = the kernel `name` names; an error naming `what` (where the name came from) when it is
 * unknown or the CPU cannot run it */
static pn_status pn_mk_find(const char *what, const char *name, const pn_microkernel **out) {
    for (int i = 0; i < PN_MK_COUNT; i++) {
        const pn_microkernel *k = &pn_mk_table[i];
        if (!strcmp(name, "auto") ? !pn_mk_runs(k) : strcmp(k->name, name)) continue;
        if (!pn_mk_runs(k))
            return pn_error(PN_ERR_ARG, "%s: this CPU cannot run the %s kernel (/proc/cpuinfo lacks its "
                            "instructions); use auto or portable", what, name);
        *out = k;
        return PN_OK;
    }
    if (!strcmp(name, "avx512") || !strcmp(name, "avx2"))
        return pn_error(PN_ERR_ARG, "%s: the %s kernel exists on x86-64 only; use auto or portable", what, name);
    return pn_error(PN_ERR_ARG, "%s: unknown CPU kernel '%s'; valid: " PN_MK_VALID, what, name);
}

static const pn_microkernel *_Atomic pn_mk_current;

const pn_microkernel *pn_mk_get(void) {
    const pn_microkernel *k = pn_mk_current;
    if (k) return k;
    const char *env = getenv("PENUMBRA_CPU_KERNEL");
    if (pn_mk_find("PENUMBRA_CPU_KERNEL", env && *env ? env : "auto", &k) != PN_OK) return NULL;
    pn_mk_current = k;
    return k;
}

const char *pn_cpu_kernel(void) {
    const pn_microkernel *k = pn_mk_get();
    return k ? k->name : "";
}

pn_status pn_set_cpu_kernel(const char *name) {
    const pn_microkernel *k = NULL;
    if (!name) return pn_error(PN_ERR_ARG, "set_cpu_kernel: name is NULL; valid: " PN_MK_VALID);
    pn_status st = pn_mk_find("set_cpu_kernel", name, &k);
    if (st == PN_OK) pn_mk_current = k;
    return st;
}

/* ---- packing B ------------------------------------------------------------------------------ */
/* Packing rows is a transpose, and element by element it was a strided gather per float
 * (~1 µs for a 30 × 64 head, 2 % of a translation step). Eight rows × eight columns at a
 * time it is eight loads, 24 shuffles and eight stores: ~4× faster at that size. Plain data
 * movement, so every instruction set packs the same bits; the generic 8-float vector is one
 * ymm register in the AVX clones and two xmm ones in the baseline. */
typedef float pn_v8 __attribute__((vector_size(32)));
typedef int32_t pn_v8i __attribute__((vector_size(32)));

/* r[i][c] → o[c][i] for an 8 × 8 block: pairs of rows interleaved, then pairs of pairs, then
 * the 128-bit halves */
PN_INLINE void pn_v8_transpose(const pn_v8 r[8], pn_v8 o[8]) {
    const pn_v8i il = {0, 8, 1, 9, 4, 12, 5, 13}, ih = {2, 10, 3, 11, 6, 14, 7, 15};
    const pn_v8i pl = {0, 1, 8, 9, 4, 5, 12, 13}, ph = {2, 3, 10, 11, 6, 7, 14, 15};
    const pn_v8i hl = {0, 1, 2, 3, 8, 9, 10, 11}, hh = {4, 5, 6, 7, 12, 13, 14, 15};
    pn_v8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shuffle(r[i], r[i + 1], il);
        t[i + 1] = __builtin_shuffle(r[i], r[i + 1], ih);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = __builtin_shuffle(t[i], t[i + 2], pl);
        u[i + 1] = __builtin_shuffle(t[i], t[i + 2], ph);
        u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], pl);
        u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], ph);
    }
    for (int c = 0; c < 4; c++) {
        o[c] = __builtin_shuffle(u[c], u[c + 4], hl);
        o[c + 4] = __builtin_shuffle(u[c], u[c + 4], hh);
    }
}

/* rows j0 … j0 + 7 of X (those below `rows` read, the rest 0), columns k0 … k0 + 7 → the
 * panel p (nr floats a column), starting at its row jj */
PN_INLINE void pn_pack_rows_8x8(const float *X, int64_t ldx, int64_t rows, int64_t k0, int nr, float *p) {
    pn_v8 r[8], o[8];
    for (int i = 0; i < 8; i++) {
        if (i < rows) memcpy(&r[i], X + i * ldx + k0, sizeof r[i]);
        else r[i] = (pn_v8){0};
    }
    pn_v8_transpose(r, o);
    for (int c = 0; c < 8; c++) memcpy(p + (k0 + c) * nr, &o[c], sizeof o[c]);
}

PN_VEC void pn_mk_pack_rows(int64_t n, int64_t K, const float *X, int64_t ldx, int nr, float *Bp) {
    const int64_t K8 = K / 8 * 8;
    for (int64_t j0 = 0; j0 < n; j0 += nr) {
        float *p = Bp + (j0 / nr) * K * nr;
        const int64_t w = n - j0 < nr ? n - j0 : nr;
        int64_t jj = 0;
        for (; jj + 8 <= nr; jj += 8) {
            const int64_t rows = w - jj < 0 ? 0 : w - jj < 8 ? w - jj : 8;
            const float *x = X + (j0 + jj) * ldx;
            if (rows == 8) { /* the same call with a constant count: no per-row tests */
                for (int64_t k0 = 0; k0 < K8; k0 += 8) pn_pack_rows_8x8(x, ldx, 8, k0, nr, p + jj);
            } else {
                for (int64_t k0 = 0; k0 < K8; k0 += 8) pn_pack_rows_8x8(x, ldx, rows, k0, nr, p + jj);
            }
            for (int64_t k = K8; k < K; k++)
                for (int64_t i = 0; i < 8; i++) p[k * nr + jj + i] = i < rows ? x[i * ldx + k] : 0;
        }
        for (int64_t k = 0; k < K; k++) /* nr not a multiple of 8: the last rows one by one */
            for (int64_t j = jj; j < nr; j++) p[k * nr + j] = j < w ? X[(j0 + j) * ldx + k] : 0;
    }
}

void pn_mk_pack_cols(int64_t K, int64_t ncols, const float *X, int64_t ldx, int nr, int64_t bstride, float *Bp) {
    for (int64_t c0 = 0; c0 < ncols; c0 += nr) {
        float *p = Bp + (c0 / nr) * bstride;
        const int64_t w = ncols - c0 < nr ? ncols - c0 : nr;
        for (int64_t k = 0; k < K; k++) {
            pn_copy_run(p + k * nr, X + k * ldx + c0, sizeof(float) * (size_t)w);
            for (int64_t c = w; c < nr; c++) p[k * nr + c] = 0;
        }
    }
}
