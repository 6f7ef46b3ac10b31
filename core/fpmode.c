/* fpmode.c — whether the CPU threads that run penumbra's kernels flush subnormal floats to zero.
 *
 * Why: an x86 core meets a subnormal operand or result of an SSE/AVX instruction with a
 * microcode assist costing on the order of a hundred cycles, and one subnormal lane of a
 * 16-lane FMA is enough. Cone attention produces them: ψ's gradient is g·e^{x_d}, subnormal
 * wherever a head's height is tiny, and such numbers then feed the q/k projections' backward
 * GEMMs (0.2–0.4 % of their inputs in an umbral NMT step). On an Intel Xeon (model 207) an
 * umbral step took 2.9 s against dot's 2.2 s with IEEE subnormals and 2.3 s with flushing.
 * Flushing sets MXCSR's FTZ (subnormal results become ±0) and DAZ (subnormal inputs read as
 * ±0) — what TensorFlow and XLA do on CPU by default and torch.set_flush_denormal(True) asks
 * for. It is off unless asked for (recipes opt in through their flush_denormal key): it also
 * changes f64 arithmetic below 2.2e-308 and the host's own (LuaJIT's numbers on this thread).
 *
 * The mode is per thread. It is set on the calling thread and on every thread of the OpenMP
 * pool (one parallel region at the pool's current size); threads created later, by this thread
 * or by a pool thread, inherit it (pthread_create copies the creator's floating-point
 * environment). OpenBLAS's own threads are not touched: every GEMM of ours runs OpenBLAS serially
 * on our threads (ops/matmul.c). NaN and ±inf are unaffected. CUDA kernels are unaffected. */
#include "penumbra.h"

#include <omp.h>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define PN_FTZ_DAZ 0x8040u /* MXCSR bit 15 (FTZ) | bit 6 (DAZ) */
static void set_here(int on) {
    unsigned m = _mm_getcsr();
    _mm_setcsr(on ? (m | PN_FTZ_DAZ) : (m & ~PN_FTZ_DAZ));
}
static int get_here(void) { return (_mm_getcsr() & PN_FTZ_DAZ) == PN_FTZ_DAZ; }
#define PN_HAVE_FPMODE 1
#else
#define PN_HAVE_FPMODE 0
#endif

int pn_set_flush_denormal(int on) {
#if PN_HAVE_FPMODE
    set_here(on);
    #pragma omp parallel
    set_here(on);
    return 1;
#else
    (void)on;
    return 0;
#endif
}

int pn_flush_denormal(void) {
#if PN_HAVE_FPMODE
    return get_here();
#else
    return 0;
#endif
}
