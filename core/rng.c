/* rng.c — counter-based Philox 4x32-10 (Salmon et al. 2011). Element i of a draw uses
 * counter (offset + i/4, lane i%4) under key = seed, so the stream depends only on the
 * seed and the draw order — not on thread count or device. Each draw advances the
 * global offset past the counters it used. */
#include "backend.h"

static uint64_t g_seed = 0x5eed;
static uint64_t g_offset = 0; /* in 128-bit counter blocks */

void pn_manual_seed(uint64_t seed) {
    g_seed = seed;
    g_offset = 0;
}
uint64_t pn_seed(void) { return g_seed; }
void pn_rng_state(uint64_t *seed, uint64_t *offset) {
    *seed = g_seed;
    *offset = g_offset;
}
void pn_set_rng_state(uint64_t seed, uint64_t offset) {
    g_seed = seed;
    g_offset = offset;
}

/* Reserve n draws of 4 words each; returns the first counter block. */
static uint64_t reserve(int64_t blocks) {
    uint64_t base = g_offset;
    g_offset += (uint64_t)blocks;
    return base;
}

uint64_t pn_philox_reserve(int64_t blocks, uint64_t *seed) {
    *seed = g_seed;
    return reserve(blocks);
}

/* CPU kernel: fill the contiguous tensor t, kind 0 uniform, 1 normal; two words per value,
 * counter base + b for the values 2b, 2b+1 under key seed */
pn_status pn_cpu_fill_random(pn_tensor *t, int kind, uint64_t seed, uint64_t base) {
    int64_t n = pn_numel(t);
    int64_t blocks = (n + 1) / 2; /* one block = 4 words = 2 values */
    char *p = pn_ptr(t);
    int dt = t->dt;
    #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
    for (int64_t b = 0; b < blocks; b++) pn_random_block(p, dt, n, kind, seed, base, b);
    return PN_OK;
}

static pn_tensor *random_tensor(const char *op, int nd, const int64_t *shape, int dtype, int device, int kind) {
    if (dtype != PN_F32 && dtype != PN_F64)
        return pn_error_null(PN_ERR_DTYPE, "%s: dtype %s not supported, use f32 or f64", op, pn_dtype_name(dtype));
    pn_tensor *t = pn_empty(nd, shape, dtype, device);
    if (!t) return NULL;
    uint64_t base = reserve((pn_numel(t) + 1) / 2); /* the stream is reserved here, on the host */
    if (PN_KCALL_ON(op, t, fill_random, t, kind, g_seed, base)) {
        pn_release(t);
        return NULL;
    }
    return t;
}

pn_tensor *pn_rand(int nd, const int64_t *shape, int dtype, int device) {
    return random_tensor("rand", nd, shape, dtype, device, 0);
}
pn_tensor *pn_randn(int nd, const int64_t *shape, int dtype, int device) {
    return random_tensor("randn", nd, shape, dtype, device, 1);
}
