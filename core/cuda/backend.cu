/* backend.cu — the CUDA kernel table (backend.h). Every kernel of kernels.def is declared weak
 * here: a .cu file that defines pn_cuda_<name> fills its slot, and a kernel nobody has written
 * yet stays NULL, which the front ends report as "no cuda kernel '<name>' yet" (backend.c). So
 * adding a CUDA kernel is defining its function in the .cu file of its op's stem — there is no
 * second list to keep in step with kernels.def. */
#include "cuda.cuh"

#include <string.h>

#define PN_KERNEL(name, args) extern "C" pn_status pn_cuda_##name args __attribute__((weak));
#include "../kernels.def"

static pn_kernels make_table(void) {
    pn_kernels k;
    memset(&k, 0, sizeof k);
    k.device = "cuda";
#define PN_KERNEL(name, args) k.name = pn_cuda_##name;
#include "../kernels.def"
    return k;
}

extern "C" const pn_kernels pn_cuda_kernels = make_table();
