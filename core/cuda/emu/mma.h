/* mma.h — the nvcuda::wmma subset (<mma.h>) for penumbra's kernel interpreter (DESIGN §8),
 * with the 16-bit types of half.h. Included by core/cuda/cuda.cuh in the PN_CUDA_EMU build,
 * so a kernel writes nvcuda::wmma and __nv_bfloat16 the same way in both builds.
 *
 *   fragment<matrix_a | matrix_b, m, n, k, __half | __nv_bfloat16, row_major | col_major>
 *   fragment<accumulator, m, n, k, float>            shapes m16n16k16, m32n8k16, m8n32k16
 *   fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync
 *
 * num_elements is CUDA's (sm_80 headers): 8 for every float accumulator; 16 for __half A/B
 * (each element held by several (lane, index) slots, as on the hardware); m·k/32 or k·n/32
 * for __nv_bfloat16. load/store/mma are warp-collective: the 32 lanes meet in the
 * scheduler's warp rendezvous (pn_emu_warp, emu_sched.cc), so a lane that exited, waits at
 * another wmma call, or a partial warp, is a kernel error like the shuffles' (reported at the
 * next sync, text in pn_emu_detail()). fill_fragment is per lane, as in CUDA's header.
 *
 * The fragment map — which tile element each (lane, x[i]) holds — is unspecified in CUDA.
 * Here it is a map over the slots (lane, i) onto the tile's elements, every element held by
 * the same number of slots, one per fragment type (use, shape, element type, layout) and
 * launch, the same in every warp and block of the launch: schedule fwd → the natural order of
 * the fragment's layout (lane l, x[i] is element l·num_elements + i), rev → another fixed map
 * (the reverse of the transposed order), rand:SEED → a random map drawn from SEED and the
 * number of grids run since the schedule was set. Element-wise code over all x[i] (scale, add
 * two fragments of one type) gives the same answer under every map; code that assumes a map
 * gets a wrong one, or, where it wrote the copies of one element differently, an error at
 * mma_sync. A fragment starts as the 0xFF (NaN) pattern, so an accumulator that was never
 * filled or loaded shows.
 *
 * Checked at each load/store (CUDA's documented rules plus the interpreter's bounds): every
 * lane passes the same pointer, ldm and layout; ldm a multiple of 8 (16-bit elements) or 4
 * (float); the pointer 32-byte (256-bit) aligned; the whole tile inside one device
 * allocation or one shared array of the block. mma_sync computes D = A·B + C in f32 (the
 * products of 16-bit inputs are exact in f32; the sum runs over k in order); satf is refused.
 */
#ifndef PN_CUDA_EMU_MMA_H
#define PN_CUDA_EMU_MMA_H

#include "emu.h"
#include "half.h"

namespace nvcuda {
namespace wmma {
struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };
} // namespace wmma
} // namespace nvcuda

/* ---- interpreter internals (mma.cc, emu_sched.cc) -------------------------------------- */
namespace pn_emu_wmma {

enum Use { USE_A, USE_B, USE_C };
enum Elem { ELEM_HALF, ELEM_BF16, ELEM_F32 };
enum Lay { LAY_ROW, LAY_COL, LAY_NONE };

/* one fragment type: what it holds (rows × cols: A m×k, B k×n, accumulator m×n) */
struct desc {
    int use, m, n, k, elem, lay, num, rows, cols;
    int id; /* dense index over every (use, shape, elem, layout): the map table's key */
};
enum { NUM_IDS = 3 * 3 * 3 * 3 };

constexpr int shape_index(int m, int n, int k) {
    return k != 16 ? -1 : m == 16 && n == 16 ? 0 : m == 32 && n == 8 ? 1 : m == 8 && n == 32 ? 2 : -1;
}

template <class T> struct elem_of { static constexpr int v = -1; };
template <> struct elem_of<__half> { static constexpr int v = ELEM_HALF; };
template <> struct elem_of<__nv_bfloat16> { static constexpr int v = ELEM_BF16; };
template <> struct elem_of<float> { static constexpr int v = ELEM_F32; };
template <class L> struct lay_of { static constexpr int v = -1; };
template <> struct lay_of<nvcuda::wmma::row_major> { static constexpr int v = LAY_ROW; };
template <> struct lay_of<nvcuda::wmma::col_major> { static constexpr int v = LAY_COL; };
template <> struct lay_of<void> { static constexpr int v = LAY_NONE; };
template <class U> struct use_of { static constexpr int v = -1; };
template <> struct use_of<nvcuda::wmma::matrix_a> { static constexpr int v = USE_A; };
template <> struct use_of<nvcuda::wmma::matrix_b> { static constexpr int v = USE_B; };
template <> struct use_of<nvcuda::wmma::accumulator> { static constexpr int v = USE_C; };

template <class Use, int m, int n, int k, class T, class L> struct traits {
    static constexpr int use = use_of<Use>::v, elem = elem_of<T>::v, lay = lay_of<L>::v, shape = shape_index(m, n, k);
    static_assert(use >= 0, "wmma::fragment: the use must be matrix_a, matrix_b or accumulator");
    static_assert(shape >= 0, "wmma::fragment: the interpreter models the shapes m16n16k16, m32n8k16 and m8n32k16");
    static_assert(use != USE_C || (elem == ELEM_F32 && lay == LAY_NONE),
                  "wmma::fragment: accumulators are float, without a layout (half accumulators are not modelled)");
    static_assert(use == USE_C || ((elem == ELEM_HALF || elem == ELEM_BF16) && (lay == LAY_ROW || lay == LAY_COL)),
                  "wmma::fragment: matrix_a/matrix_b hold __half or __nv_bfloat16 with row_major or col_major");
    static constexpr int rows = use == USE_B ? k : m, cols = use == USE_A ? k : n;
    /* CUDA's counts: float accumulators 8, __half A/B 16 (duplicated slots), bf16 exactly the tile over 32 lanes */
    static constexpr int num = use == USE_C ? 8 : elem == ELEM_HALF ? 16 : rows * cols / 32;
    static constexpr desc d = {use, m, n, k, elem, lay, num, rows, cols, ((use * 3 + shape) * 3 + elem) * 3 + lay};
};

/* What one lane hands to the rendezvous (it lives on the lane's stack while the lane waits). */
struct call {
    const desc *d;     /* load/store: the fragment's type; mma: D's */
    void *x;           /* load, mma: the lane's fragment elements to write */
    const void *cx;    /* store: the lane's fragment elements to read */
    void *mem;         /* load/store: the tile in memory */
    unsigned ldm;
    int mem_lay;       /* LAY_ROW / LAY_COL */
    const desc *da, *db; /* mma: the A and B fragments (C has D's type) */
    const void *a, *b, *c;
    bool satf;
};

/* Perform the collective op (PN_EMU_WMMA_*) once all 32 lanes arrived: lanes[l] is lane l's
 * call. 0 on success; else -1 with a message in err. (mma.cc, called by emu_sched.cc) */
int release(int op, const call *const lanes[32], char *err, size_t cap);

/* the kind of schedule (0 fwd, 1 rev, 2 rand) and, for rand, the key of the grid now running
 * (from the seed and the grids run since the schedule was set); serial changes with every
 * grid, so maps are drawn afresh per launch (emu_sched.cc) */
struct grid_key {
    int kind;
    uint64_t key;
    long long serial;
};
grid_key current_grid(void);
uint64_t splitmix(uint64_t *state);
/* is [p, p+bytes) inside one shared array (static or dynamic) of the running block? */
bool in_shared(const void *p, size_t bytes);

template <class T> struct ident { typedef T type; };

inline void collective(int op, call *c, const char *file, int line) {
    pn_emu_warp(op, 0xffffffffu, (uint64_t)(uintptr_t)c, 0, 32, file, line);
}

} // namespace pn_emu_wmma

/* ---- the API ---------------------------------------------------------------------------- */
namespace nvcuda {
namespace wmma {

template <class Use, int m, int n, int k, class T, class Layout = void> class fragment {
    typedef pn_emu_wmma::traits<Use, m, n, k, T, Layout> tr;

  public:
    enum { num_elements = tr::num, num_storage_elements = tr::num };
    typedef T element_type;
    typedef T storage_element_type;
    alignas(8) T x[num_elements];
    fragment() { std::memset((void *)x, 0xFF, sizeof x); } /* NaN: a fragment never written shows */
};

template <class Use, int m, int n, int k, class T, class L>
inline void fill_fragment(fragment<Use, m, n, k, T, L> &f, const typename pn_emu_wmma::ident<T>::type &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}

template <class Use, int m, int n, int k, class T, class L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L> &f, const typename pn_emu_wmma::ident<T>::type *p, unsigned ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    typedef pn_emu_wmma::traits<Use, m, n, k, T, L> tr;
    static_assert(tr::use != pn_emu_wmma::USE_C, "wmma::load_matrix_sync: an accumulator takes a layout_t argument");
    pn_emu_wmma::call c{};
    c.d = &tr::d, c.x = f.x, c.mem = (void *)p, c.ldm = ldm, c.mem_lay = tr::lay;
    pn_emu_wmma::collective(PN_EMU_WMMA_LOAD, &c, file, line);
}

template <int m, int n, int k, class T>
inline void load_matrix_sync(fragment<accumulator, m, n, k, T> &f, const typename pn_emu_wmma::ident<T>::type *p,
                             unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    pn_emu_wmma::call c{};
    c.d = &pn_emu_wmma::traits<accumulator, m, n, k, T, void>::d, c.x = f.x, c.mem = (void *)p, c.ldm = ldm;
    c.mem_lay = layout == mem_col_major ? pn_emu_wmma::LAY_COL : pn_emu_wmma::LAY_ROW;
    pn_emu_wmma::collective(PN_EMU_WMMA_LOAD, &c, file, line);
}

template <int m, int n, int k, class T>
inline void store_matrix_sync(typename pn_emu_wmma::ident<T>::type *p, const fragment<accumulator, m, n, k, T> &f,
                              unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    pn_emu_wmma::call c{};
    c.d = &pn_emu_wmma::traits<accumulator, m, n, k, T, void>::d, c.cx = f.x, c.mem = (void *)p, c.ldm = ldm;
    c.mem_lay = layout == mem_col_major ? pn_emu_wmma::LAY_COL : pn_emu_wmma::LAY_ROW;
    pn_emu_wmma::collective(PN_EMU_WMMA_STORE, &c, file, line);
}

template <int m, int n, int k, class Tab, class LA, class LB, class Tc>
inline void mma_sync(fragment<accumulator, m, n, k, Tc> &d, const fragment<matrix_a, m, n, k, Tab, LA> &a,
                     const fragment<matrix_b, m, n, k, Tab, LB> &b, const fragment<accumulator, m, n, k, Tc> &c,
                     bool satf = false, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    pn_emu_wmma::call cl{};
    cl.d = &pn_emu_wmma::traits<accumulator, m, n, k, Tc, void>::d, cl.x = d.x;
    cl.da = &pn_emu_wmma::traits<matrix_a, m, n, k, Tab, LA>::d, cl.db = &pn_emu_wmma::traits<matrix_b, m, n, k, Tab, LB>::d;
    cl.a = a.x, cl.b = b.x, cl.c = c.x, cl.satf = satf;
    pn_emu_wmma::collective(PN_EMU_WMMA_MMA, &cl, file, line);
}

} // namespace wmma
} // namespace nvcuda

/* ---- PTX mma.sync.aligned.m16n8k16 (core/cuda/mma_ptx.cuh's pn_mma_16816) -------------------
 * A warp collective like wmma's, on registers in the layout PTX documents (mma.cc: mma_16816);
 * H: __nv_bfloat16 or __half, the type packed in a and b. */
namespace pn_emu_wmma {
template <class H> struct mma16816 {
    static_assert(elem_of<H>::v == ELEM_BF16 || elem_of<H>::v == ELEM_HALF, "pn_mma_16816: __nv_bfloat16 or __half");
    static constexpr desc d = {USE_C, 16, 8, 16, elem_of<H>::v, LAY_NONE, 4, 16, 8, -1};
};
} // namespace pn_emu_wmma
template <class H>
inline void pn_emu_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], const char *file,
                             int line) {
    pn_emu_wmma::call cl{};
    cl.d = cl.da = cl.db = &pn_emu_wmma::mma16816<H>::d;
    cl.a = a, cl.b = b, cl.c = c;
    float out[4];
    cl.x = out; /* d may alias c: the lanes' c are read before any d is written, via a copy */
    pn_emu_wmma::collective(PN_EMU_MMA_16816, &cl, file, line);
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

/* ---- PTX ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16 (mma_ptx.cuh's pn_ldmatrix_x*) ---------
 * A warp collective: lane 8i + r passes the address of row r of matrix i (i < num); every lane
 * gets in r_out[i] the pair (row lane / 4, columns 2·(lane % 4) and + 1) of matrix i (mma.cc:
 * ldmatrix). Each row 16 bytes, 16-byte aligned, inside one shared array of the block. */
inline void pn_emu_ldmatrix(uint32_t *r_out, int num, const void *row, const char *file, int line) {
    pn_emu_wmma::call cl{};
    cl.x = r_out, cl.mem = (void *)row, cl.ldm = (unsigned)num;
    pn_emu_wmma::collective(PN_EMU_LDMATRIX, &cl, file, line);
}

/* ---- PTX mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (mma_ptx.cuh's pn_dmma_884) ----------
 * A warp collective on registers: lane l holds a = A[l / 4][l % 4] (A 8 × 4), b = B[l % 4][l / 4]
 * (B 4 × 8), c[i] = C[l / 4][2·(l % 4) + i] and gets d likewise (C, D 8 × 8; mma.cc: dmma_884). */
inline void pn_emu_dmma_884(double d[2], double a, double b, const double c[2], const char *file, int line) {
    pn_emu_wmma::call cl{};
    cl.a = &a, cl.b = &b, cl.c = c;
    double out[2];
    cl.x = out; /* d may alias c: every lane's c is read before any d is written */
    pn_emu_wmma::collective(PN_EMU_DMMA_884, &cl, file, line);
    d[0] = out[0], d[1] = out[1];
}

#endif /* PN_CUDA_EMU_MMA_H */
