//===- Float16.h - bf16 / f16 <-> f32 conversions ---------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Portable, header-only conversions between f32 and the two 16-bit float
/// formats, with the rounding docs/NUMERICS.md prescribes for `narrow_T`:
/// round to nearest even, overflow to +-inf, NaN stays NaN (quiet), f16
/// subnormals produced and consumed exactly. Widening is exact. No F16C or
/// AVX512-BF16 instructions, so the results never depend on the host CPU.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_FLOAT16_H
#define FLASHOPT_HOST_FLOAT16_H

#include <cstdint>
#include <cstring>

namespace flashopt::host {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Exact widening of a bf16 bit pattern.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

/// Round-to-nearest-even narrowing to bf16; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) // NaN: keep sign, force quiet bit
    return uint16_t((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb; // overflow of the largest finite values rounds to inf
  return uint16_t(u >> 16);
}

/// Exact widening of an IEEE binary16 bit pattern (subnormals included).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) // inf / NaN
    return f32_from_bits(sign | 0x7F800000u | (man << 13) |
                         (man ? 0x00400000u : 0u));
  if (exp == 0) {
    if (man == 0)
      return f32_from_bits(sign);
    // Subnormal: man * 2^-24, exact in f32.
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/// Round-to-nearest-even narrowing to binary16; overflow gives +-inf, NaN
/// stays a (quiet) NaN, results below the normal range become subnormals.
inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) // NaN
    return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) // >= 65520 (the midpoint above the max) -> inf
    return uint16_t(sign | 0x7C00u);
  if (a < 0x38800000u) { // below 2^-14: subnormal or zero
    if (a < 0x33000000u) // below 2^-25: rounds to zero (2^-25 itself ties to 0)
      return sign;
    uint32_t e = a >> 23;            // biased f32 exponent, 102..112
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;       // 14..24: value = m * 2^(e-150); unit 2^-24
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
      ++q;
    return uint16_t(sign | q); // q may carry into the smallest normal: correct
  }
  // Normal range: rebias and round the 13 dropped bits.
  uint32_t r = a - 0x38000000u; // exponent 127 -> 15
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xFFFu + lsb;
  return uint16_t(sign | (r >> 13));
}

} // namespace flashopt::host

#endif // FLASHOPT_HOST_FLOAT16_H
