/* half.h — the 16-bit float types of cuda_fp16.h / cuda_bf16.h for penumbra's kernel
 * interpreter (DESIGN §8): __half (IEEE binary16) and __nv_bfloat16 as 2-byte storage, and the
 * conversions a kernel that stores tiles needs, on host and device alike:
 *
 *   __float2half, __float2half_rn, __float2bfloat16, __float2bfloat16_rn   round to nearest even
 *   __half2float, __bfloat162float                                          exact
 *   __half_as_ushort, __ushort_as_half, __bfloat16_as_ushort, __ushort_as_bfloat16   the bits
 *
 * NaN stays NaN (quieted), overflow goes to ±inf, half subnormals are kept. Deliberately no
 * implicit conversions and no arithmetic: under nvcc `h1 + h2` is half arithmetic (rounded at
 * every step) where float promotion here would not be, so code that compiles against this
 * header computes the same thing under both; write the conversions out.
 *
 * The bit-level helpers (pn_emu_impl::float_to_half_bits, …) are shared with cublas.cc. */
#ifndef PN_CUDA_EMU_HALF_H
#define PN_CUDA_EMU_HALF_H

#include <cstdint>
#include <cstring>

namespace pn_emu_impl {

inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float half_bits_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 31) return bits_float(s | 0x7f800000 | (m << 13));   /* inf / nan (payload kept) */
    if (e) return bits_float(s | ((e + 112) << 23) | (m << 13)); /* normal: rebias 15 → 127 */
    float f = (float)m * 5.9604644775390625e-8f;                  /* zero or subnormal: m·2^-24, exact */
    return s ? -f : f;
}

/* Round to nearest even with integer arithmetic only, so the result does not depend on the
 * floating-point environment of whoever calls it. */
inline uint16_t float_to_half_bits(float f) {
    uint32_t u = float_bits(f), s = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000) return (uint16_t)(s | 0x7e00);  /* nan → quiet nan */
    if (a >= 0x477ff000) return (uint16_t)(s | 0x7c00); /* ≥ 65520 (halfway past 65504) → inf */
    if (a >= 0x38800000) {                              /* ≥ 2^-14: a normal half */
        uint32_t r = a + 0xfff + ((a >> 13) & 1);       /* carry into the exponent is the right answer */
        return (uint16_t)(s | ((r - 0x38000000) >> 13));
    }
    /* subnormal half (or 0): the value in units of 2^-24 is M·2^(e-126), M with its leading 1 */
    uint32_t e = a >> 23, shift = 126 - e;
    if (e == 0 || shift > 25) return (uint16_t)s;       /* below half of 2^-24: ±0 */
    uint32_t M = (a & 0x7fffff) | 0x800000, q = M >> shift, rem = M & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;    /* q = 1024 is the smallest normal: still right */
    return (uint16_t)(s | q);
}

inline float bf16_bits_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

inline uint16_t float_to_bf16_bits(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* nan → quiet nan */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);                 /* RNE; max float → inf */
}

} // namespace pn_emu_impl

/* 2-byte storage; the bits are private so kernels go through the conversions as under nvcc */
struct alignas(2) __half {
    __half() = default;

  private:
    uint16_t bits_;
    friend unsigned short __half_as_ushort(__half h);
    friend __half __ushort_as_half(unsigned short u);
};
struct alignas(2) __nv_bfloat16 {
    __nv_bfloat16() = default;

  private:
    uint16_t bits_;
    friend unsigned short __bfloat16_as_ushort(__nv_bfloat16 h);
    friend __nv_bfloat16 __ushort_as_bfloat16(unsigned short u);
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

inline unsigned short __half_as_ushort(__half h) { return h.bits_; }
inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.bits_ = u;
    return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits_; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 h;
    h.bits_ = u;
    return h;
}

inline __half __float2half_rn(float f) { return __ushort_as_half(pn_emu_impl::float_to_half_bits(f)); }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) { return pn_emu_impl::half_bits_to_float(__half_as_ushort(h)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __ushort_as_bfloat16(pn_emu_impl::float_to_bf16_bits(f)); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return pn_emu_impl::bf16_bits_to_float(__bfloat16_as_ushort(h)); }

#endif /* PN_CUDA_EMU_HALF_H */
