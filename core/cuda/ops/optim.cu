/* optim.cu — the CUDA twins of ops/optim.c: the fused Adam and SGD updates, in place, one
 * thread per element through optim.h's element updates (the CPU's formulas, one source). */
#include "../cuda.cuh"
#include "../../ops/optim.h"

// p, g, m, v: (n) contiguous, one float dtype T
template <class T> __global__ void adam_kernel(int64_t n, T *p, const T *g, T *m, T *v, pn_adam_hp h) {
    PN_CU_LOOP(i, n) {
        double pi = p[i], mi = m[i], vi = v[i];
        pn_adam_elem(&h, g[i], &pi, &mi, &vi);
        m[i] = (T)mi;
        v[i] = (T)vi;
        p[i] = (T)pi;
    }
}

pn_status pn_cuda_adam_step(pn_tensor *p, const pn_tensor *g, pn_tensor *m, pn_tensor *v, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int decoupled, int64_t step) {
    int64_t n = pn_numel(p);
    if (!n) return PN_OK;
    pn_adam_hp h = pn_adam_hp_of(lr, beta1, beta2, eps, weight_decay, decoupled, step);
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(p->dt, T, {
        auto k = adam_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), n, (T *)pn_ptr(p),
                      (const T *)pn_ptr(g), (T *)pn_ptr(m), (T *)pn_ptr(v), h);
    });
    return pn_cu_check("adam_step", e);
}

// p, g, buf: (n) contiguous, one float dtype T; buf NULL without momentum
template <class T>
__global__ void sgd_kernel(int64_t n, T *p, const T *g, T *buf, double lr, double momentum, double dampening,
                           double weight_decay, int nesterov, int first_step) {
    PN_CU_LOOP(i, n) {
        double pi = p[i], bi = buf ? (double)buf[i] : 0;
        pn_sgd_elem(g[i], &pi, &bi, buf != NULL, lr, momentum, dampening, weight_decay, nesterov, first_step);
        if (buf) buf[i] = (T)bi;
        p[i] = (T)pi;
    }
}

pn_status pn_cuda_sgd_step(pn_tensor *p, const pn_tensor *g, pn_tensor *buf, double lr, double momentum,
                           double dampening, double weight_decay, int nesterov, int first_step) {
    int64_t n = pn_numel(p);
    if (!n) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(p->dt, T, {
        auto k = sgd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), n, (T *)pn_ptr(p),
                      (const T *)pn_ptr(g), buf ? (T *)pn_ptr(buf) : (T *)NULL, lr, momentum, dampening,
                      weight_decay, nesterov, first_step);
    });
    return pn_cu_check("sgd_step", e);
}
