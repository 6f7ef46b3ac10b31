/* selftest.h — what the interpreter's planted-bug cases (selftest.cu, selftest_wmma.cu) share:
 * the error conversion, CK(), a device buffer freed on scope exit, and result output. */
#ifndef PN_CUDA_EMU_SELFTEST_H
#define PN_CUDA_EMU_SELFTEST_H

#include "../cuda.cuh"
#include "../../backend.h"

#include <vector>

namespace pn_selftest {

/* PN_ERR_DEVICE with the interpreter's message */
inline pn_status fail(cudaError_t e) {
    const char *d = pn_emu_detail();
    return pn_error(PN_ERR_DEVICE, "%s", d && *d ? d : cudaGetErrorString(e));
}

#define CK(expr)                                                     \
    do {                                                             \
        cudaError_t ck_e_ = (expr);                                  \
        if (ck_e_ != cudaSuccess) return pn_selftest::fail(ck_e_);   \
    } while (0)

/* device buffer freed on scope exit (also on the error paths) */
struct Dev {
    void *p = nullptr;
    ~Dev() { cudaFree(p); }
};

inline void put(double *out, int64_t n, int64_t i, double v) {
    if (out && i < n) out[i] = v;
}

/* count floats of device memory d to out[at …] */
inline pn_status copy_out(double *out, int64_t n, const float *d, int count, int64_t at = 0) {
    std::vector<float> h(count);
    CK(cudaMemcpy(h.data(), d, sizeof(float) * count, cudaMemcpyDeviceToHost));
    for (int i = 0; i < count; i++) put(out, n, at + i, h[i]);
    return PN_OK;
}

/* The cases of selftest_wmma.cu: runs name if it is one of them (true, *st its result);
 * wmma_case_name(i) is the i-th case's name, NULL past the last. */
bool run_wmma_case(const char *name, double *out, int64_t n, pn_status *st);
const char *wmma_case_name(size_t i);

} // namespace pn_selftest

#endif /* PN_CUDA_EMU_SELFTEST_H */
