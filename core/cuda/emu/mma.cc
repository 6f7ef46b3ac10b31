/* mma.cc — the interpreter's wmma collectives (see mma.h): the per-launch fragment maps, and
 * load/store/mma once the warp's 32 lanes have met (called from the scheduler's rendezvous in
 * emu_sched.cc, with every lane's call). */
#include "mma.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <vector>

namespace pn_emu_wmma {
namespace {

/* slot (lane·num + i) → element (row·cols + col), for every fragment type, for the grid whose
 * serial is `serial`; built on first use in that grid */
struct Maps {
    long long serial = -1;
    std::vector<uint16_t> m[NUM_IDS];
};
Maps g_maps; /* only touched by kernels, which run under the runtime lock */

/* the element at position idx of the row-major (col_major = false) or column-major order */
int element(const desc &d, int idx, bool col_major) {
    int r = col_major ? idx % d.rows : idx / d.cols, c = col_major ? idx / d.rows : idx % d.cols;
    return r * d.cols + c;
}

void build(std::vector<uint16_t> &map, const desc &d, const grid_key &g) {
    int slots = 32 * d.num, E = d.rows * d.cols; /* slots is a multiple of E: each element in slots/E slots */
    map.resize(slots);
    bool col = d.lay == LAY_COL;
    if (g.kind == 0) { /* fwd: natural, in the order of the fragment's own layout */
        for (int s = 0; s < slots; s++) map[s] = (uint16_t)element(d, s % E, col);
    } else if (g.kind == 1) { /* rev: backwards through the other order */
        for (int s = 0; s < slots; s++) map[s] = (uint16_t)element(d, E - 1 - s % E, !col);
    } else { /* rand: a permutation of the slots, from the grid's key and the type */
        std::vector<int> perm(slots);
        for (int s = 0; s < slots; s++) perm[s] = s;
        uint64_t st = g.key ^ (0x9E3779B97F4A7C15ull * (uint64_t)(d.id + 1));
        for (int s = slots - 1; s > 0; s--) std::swap(perm[s], perm[splitmix(&st) % (uint64_t)(s + 1)]);
        for (int s = 0; s < slots; s++) map[s] = (uint16_t)element(d, perm[s] % E, false);
    }
}

const uint16_t *slot_map(const desc &d) {
    grid_key g = current_grid();
    if (g_maps.serial != g.serial) {
        for (auto &m : g_maps.m) m.clear();
        g_maps.serial = g.serial;
    }
    std::vector<uint16_t> &m = g_maps.m[d.id];
    if (m.empty()) build(m, d, g);
    return m.data();
}

int say(char *err, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
int say(char *err, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(err, cap, f, ap);
    va_end(ap);
    return -1;
}

const char *elem_name(int e) { return e == ELEM_HALF ? "__half" : e == ELEM_BF16 ? "__nv_bfloat16" : "float"; }
const char *use_name(int u) { return u == USE_A ? "matrix_a" : u == USE_B ? "matrix_b" : "accumulator"; }
size_t elem_bytes(const desc &d) { return d.elem == ELEM_F32 ? 4 : 2; }

/* element j of a fragment's x[] (or of a tile in memory) as float, and its bits for comparison */
float get(const desc &d, const void *x, size_t j) {
    if (d.elem == ELEM_F32) return ((const float *)x)[j];
    uint16_t h = ((const uint16_t *)x)[j];
    return d.elem == ELEM_HALF ? pn_emu_impl::half_bits_to_float(h) : pn_emu_impl::bf16_bits_to_float(h);
}
uint32_t bits(const desc &d, const void *x, size_t j) {
    if (d.elem == ELEM_F32) return pn_emu_impl::float_bits(((const float *)x)[j]);
    return ((const uint16_t *)x)[j];
}

/* offset (elements) of element (r, c) of a tile stored with layout lay and leading dimension ldm */
size_t offset(int r, int c, int lay, unsigned ldm) {
    return lay == LAY_COL ? (size_t)c * ldm + r : (size_t)r * ldm + c;
}

/* every lane passed the same as lane 0 (CUDA requires it) */
int same_args(int op, const call *const *L, char *err, size_t cap) {
    const call *c0 = L[0];
    for (int l = 1; l < 32; l++) {
        const call *c = L[l];
        if (c->d != c0->d || (op == PN_EMU_WMMA_MMA && (c->da != c0->da || c->db != c0->db)))
            return say(err, cap, "lanes 0 and %d pass fragments of different types", l);
        if (op == PN_EMU_WMMA_MMA) {
            if (c->satf != c0->satf) return say(err, cap, "lanes 0 and %d pass different satf", l);
            continue;
        }
        if (op == PN_EMU_MMA_16816 || op == PN_EMU_DMMA_884) continue; /* registers only: nothing else to agree on */
        if (op == PN_EMU_LDMATRIX) { /* each lane its own row address; the shape is the warp's */
            if (c->ldm != c0->ldm)
                return say(err, cap, "lanes 0 and %d load different numbers of matrices (.x%u, .x%u)", l, c0->ldm,
                           c->ldm);
            continue;
        }
        if (c->mem != c0->mem || c->ldm != c0->ldm || c->mem_lay != c0->mem_lay)
            return say(err, cap,
                       "every lane must pass the same pointer, ldm and layout: lane 0 %p ldm %u %s, lane %d %p ldm %u %s",
                       c0->mem, c0->ldm, c0->mem_lay == LAY_COL ? "col-major" : "row-major", l, c->mem, c->ldm,
                       c->mem_lay == LAY_COL ? "col-major" : "row-major");
    }
    return 0;
}

/* CUDA's rules for the tile in memory, and the interpreter's bounds check */
int check_tile(const call &c, char *err, size_t cap) {
    const desc &d = *c.d;
    unsigned mult = d.elem == ELEM_F32 ? 4 : 8;
    const char *lay = c.mem_lay == LAY_COL ? "col-major" : "row-major";
    if (c.ldm % mult)
        return say(err, cap, "%s %s %dx%d: ldm %u is not a multiple of %u (%s elements; CUDA requires ldm·%zu bytes to be "
                   "a multiple of 16)", use_name(d.use), elem_name(d.elem), d.rows, d.cols, c.ldm, mult,
                   elem_name(d.elem), elem_bytes(d));
    if ((uintptr_t)c.mem % 32)
        return say(err, cap, "%s %s %dx%d: pointer %p is not 32-byte (256-bit) aligned", use_name(d.use),
                   elem_name(d.elem), d.rows, d.cols, c.mem);
    int lead = c.mem_lay == LAY_COL ? d.rows : d.cols, other = c.mem_lay == LAY_COL ? d.cols : d.rows;
    size_t bytes = ((size_t)(other - 1) * c.ldm + (size_t)lead) * elem_bytes(d);
    if (!pn_emu_is_device(c.mem, bytes) && !in_shared(c.mem, bytes))
        return say(err, cap, "%s %s %dx%d %s with ldm %u: the %zu bytes at %p are not inside one device allocation or one "
                   "shared array of the block", use_name(d.use), elem_name(d.elem), d.rows, d.cols, lay, c.ldm, bytes,
                   c.mem);
    return 0;
}

/* A whole operand of mma_sync from the lanes' fragments (x of lane l at ptr(l)), checking that
 * the slots holding one element agree (they differ only when code wrote x[i] assuming a map). */
template <class Ptr> int gather(const desc &d, Ptr ptr, std::vector<float> &out, char *err, size_t cap) {
    const uint16_t *map = slot_map(d);
    int E = d.rows * d.cols;
    std::vector<int> first(E, -1);
    out.assign(E, 0.0f);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < d.num; i++) {
            int s = l * d.num + i, e = map[s];
            const void *x = ptr(l);
            if (first[e] < 0) {
                first[e] = s;
                out[e] = get(d, x, i);
            } else {
                int s0 = first[e];
                if (bits(d, ptr(s0 / d.num), s0 % d.num) != bits(d, x, i))
                    return say(err, cap,
                                "%s %s: the copies of element (%d,%d) differ (lane %d x[%d] = %g, lane %d x[%d] = %g): "
                                "x[] was written assuming a fragment map, which CUDA leaves unspecified",
                                use_name(d.use), elem_name(d.elem), e / d.cols, e % d.cols, s0 / d.num, s0 % d.num,
                                (double)get(d, ptr(s0 / d.num), s0 % d.num), l, i, (double)get(d, x, i));
            }
        }
    return 0;
}

} // namespace

/* PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: the registers in the layout PTX
 * documents (mma_ptx.cuh; no drawn map: PTX fixes it). g = lane / 4, t = lane % 4; a 16-bit pair
 * packs its lower column (or row, for B) in the low half. */
static int mma_16816(const call *const lanes[32], char *err, size_t cap) {
    const desc &d = *lanes[0]->d;
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const uint32_t *a = (const uint32_t *)lanes[l]->a, *b = (const uint32_t *)lanes[l]->b;
        const float *c = (const float *)lanes[l]->c;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = get(d, &a[0], h);
            A[g + 8][2 * t + h] = get(d, &a[1], h);
            A[g][2 * t + 8 + h] = get(d, &a[2], h);
            A[g + 8][2 * t + 8 + h] = get(d, &a[3], h);
            B[2 * t + h][g] = get(d, &b[0], h);
            B[2 * t + 8 + h][g] = get(d, &b[1], h);
            C[g][2 * t + h] = c[h];
            C[g + 8][2 * t + h] = c[2 + h];
        }
    }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        float *x = (float *)lanes[l]->x;
        for (int i = 0; i < 4; i++) {
            const int r = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            float acc = C[r][col];
            for (int k = 0; k < 16; k++) acc += A[r][k] * B[k][col]; /* the product is exact in f32 */
            x[i] = acc;
        }
    }
    (void)err, (void)cap;
    return 0;
}

/* PTX's mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (mma_ptx.cuh: pn_dmma_884): g = lane / 4,
 * t = lane % 4; A[g][t], B[t][g], C and D [g][2t], [g][2t + 1]. Each element of D is C's plus the
 * four products in k order, each by a fused multiply-add (f64 tensor cores round as IEEE FMA:
 * rounding-level differences from the hardware's internal order would not show in the specs'
 * 1e-12, and a wrong register or lane would). */
static int dmma_884(const call *const lanes[32]) {
    double A[8][4], B[4][8], C[8][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const double *c = (const double *)lanes[l]->c;
        A[g][t] = *(const double *)lanes[l]->a;
        B[t][g] = *(const double *)lanes[l]->b;
        C[g][2 * t] = c[0], C[g][2 * t + 1] = c[1];
    }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        double *x = (double *)lanes[l]->x;
        for (int i = 0; i < 2; i++) {
            double acc = C[g][2 * t + i];
            for (int k = 0; k < 4; k++) acc = fma(A[g][k], B[k][2 * t + i], acc);
            x[i] = acc;
        }
    }
    return 0;
}

/* PTX's ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16: lane 8i + r gives the address of row r
 * of matrix i; lane l receives, for each matrix i, its row l / 4 at columns 2·(l % 4) and that
 * + 1, the lower column in the low half — mma.sync's fragment layout (mma_ptx.cuh). PTX requires
 * each row address 16-byte aligned in shared memory; the lanes past 8·num pass addresses it
 * ignores. */
static int ldmatrix(const call *const lanes[32], char *err, size_t cap) {
    const unsigned num = lanes[0]->ldm;
    if (num != 1 && num != 2 && num != 4) return say(err, cap, "%u matrices: PTX has .x1, .x2 and .x4", num);
    uint16_t m[4][8][8];
    for (unsigned i = 0; i < num; i++)
        for (int r = 0; r < 8; r++) {
            const int l = 8 * (int)i + r;
            const void *p = lanes[l]->mem;
            if ((uintptr_t)p % 16)
                return say(err, cap, "lane %d (row %d of matrix %u): the address %p is not 16-byte aligned", l, r, i, p);
            if (!in_shared(p, 16))
                return say(err, cap,
                           "lane %d (row %d of matrix %u): the 16 bytes at %p are not inside one shared array of the "
                           "block (ldmatrix reads shared memory)", l, r, i, p);
            memcpy(m[i][r], p, 16);
        }
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        uint32_t *x = (uint32_t *)lanes[l]->x;
        for (unsigned i = 0; i < num; i++) x[i] = (uint32_t)m[i][g][2 * t] | (uint32_t)m[i][g][2 * t + 1] << 16;
    }
    return 0;
}

int release(int op, const call *const lanes[32], char *err, size_t cap) {
    if (same_args(op, lanes, err, cap)) return -1;
    if (op == PN_EMU_MMA_16816) return mma_16816(lanes, err, cap);
    if (op == PN_EMU_LDMATRIX) return ldmatrix(lanes, err, cap);
    if (op == PN_EMU_DMMA_884) return dmma_884(lanes);
    const call &c0 = *lanes[0];
    const desc &d = *c0.d;
    if (op == PN_EMU_WMMA_LOAD || op == PN_EMU_WMMA_STORE) {
        if (check_tile(c0, err, cap)) return -1;
        const uint16_t *map = slot_map(d);
        size_t eb = elem_bytes(d);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < d.num; i++) {
                int e = map[l * d.num + i];
                char *m = (char *)c0.mem + offset(e / d.cols, e % d.cols, c0.mem_lay, c0.ldm) * eb;
                if (op == PN_EMU_WMMA_LOAD) memcpy((char *)lanes[l]->x + i * eb, m, eb);
                else memcpy(m, (const char *)lanes[l]->cx + i * eb, eb);
            }
        return 0;
    }
    /* mma_sync: D = A·B + C over the whole tile, then D handed out through D's map */
    if (c0.satf) return say(err, cap, "satf = true is not modelled (deprecated in CUDA for float accumulators)");
    const desc &da = *c0.da, &db = *c0.db;
    std::vector<float> A, B, C;
    if (gather(da, [&](int l) { return lanes[l]->a; }, A, err, cap) ||
        gather(db, [&](int l) { return lanes[l]->b; }, B, err, cap) ||
        gather(d, [&](int l) { return lanes[l]->c; }, C, err, cap))
        return -1;
    int M = d.m, N = d.n, K = d.k;
    std::vector<float> D(M * N);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float acc = C[r * N + c];
            for (int k = 0; k < K; k++) acc += A[r * K + k] * B[k * N + c]; /* the product is exact in f32 */
            D[r * N + c] = acc;
        }
    const uint16_t *map = slot_map(d);
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < d.num; i++) ((float *)lanes[l]->x)[i] = D[map[l * d.num + i]];
    return 0;
}

} // namespace pn_emu_wmma
