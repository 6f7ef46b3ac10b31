/* rng.cu — fill_random on the device: the same Philox blocks as the CPU (pn_random_block in
 * internal.h), so a seed draws the same numbers on both (f64 normals can differ in the last
 * bit: the device's log/sin/cos are not glibc's). */
#include "cuda.cuh"

__global__ void fill_random_kernel(void *p, int dt, int64_t n, int kind, uint64_t seed, uint64_t base) {
    PN_CU_LOOP(b, (n + 1) / 2) pn_random_block(p, dt, n, kind, seed, base, b);
}

pn_status pn_cuda_fill_random(pn_tensor *t, int kind, uint64_t seed, uint64_t base) {
    int64_t n = pn_numel(t);
    if (!n) return PN_OK;
    return pn_cu_check("random", PN_LAUNCH(fill_random_kernel, pn_cu_blocks((n + 1) / 2), PN_CU_THREADS, 0,
                                           pn_cu_stream(), (void *)pn_ptr(t), t->dt, n, kind, seed, base));
}
