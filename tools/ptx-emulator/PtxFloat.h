//===- PtxFloat.h - The PTX interpreter's floating-point helpers -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Bit views, canonical NaNs, flush-to-zero, rounding-mode scopes and the
/// 16-bit float conversions the executor (PtxExecutor.cpp) computes with.
/// Included by that one file, compiled with -ffp-contract=off
/// -frounding-math.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTXEMU_PTXFLOAT_H
#define FLASHOPT_PTXEMU_PTXFLOAT_H

#include "PtxInternal.h"

#include <cfenv>
#include <cmath>
#include <cstring>

namespace flashopt::ptxemu::detail {

//===----------------------------------------------------------------------===//
// Floating-point helpers
//===----------------------------------------------------------------------===//

constexpr uint32_t kCanonF32 = 0x7FFFFFFFu;
constexpr uint16_t kCanonF16 = 0x7FFFu, kCanonBF16 = 0x7FFFu;
constexpr uint64_t kCanonF64 = 0x7FFFFFFFFFFFFFFFull;

inline float asF(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t asU(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline double asD(uint64_t u) {
  double f;
  std::memcpy(&f, &u, 8);
  return f;
}
inline uint64_t asU64(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return u;
}
inline bool nan32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
inline uint32_t ftz32(uint32_t u) {
  return (u & 0x7F800000u) == 0 ? (u & 0x80000000u) : u;
}
inline uint32_t res32(float r) { return std::isnan(r) ? kCanonF32 : asU(r); }
inline uint64_t res64(double r) { return std::isnan(r) ? kCanonF64 : asU64(r); }

inline int feMode(Rnd r) {
  switch (r) {
  case Rnd::RZ: return FE_TOWARDZERO;
  case Rnd::RM: return FE_DOWNWARD;
  case Rnd::RP: return FE_UPWARD;
  default: return FE_TONEAREST;
  }
}

/// Sets the host rounding mode for a scope (only when not nearest).
struct RoundScope {
  int saved = -1;
  explicit RoundScope(Rnd r) {
    if (r == Rnd::RZ || r == Rnd::RM || r == Rnd::RP) {
      saved = std::fegetround();
      std::fesetround(feMode(r));
    }
  }
  ~RoundScope() {
    if (saved >= 0)
      std::fesetround(saved);
  }
};

/// f32 -> f16 / bf16 bits, .rn (ties to even) or .rz. NaN -> canonical.
inline uint16_t narrow16(uint32_t x, bool bf16, Rnd r) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  if (nan32(x))
    return bf16 ? kCanonBF16 : kCanonF16;
  if (bf16) {
    uint32_t mag = x & 0x7FFFFFFFu;
    if (mag == 0x7F800000u)
      return uint16_t(sign | 0x7F80u);
    uint32_t hi = x >> 16, lo = x & 0xFFFFu;
    if (r == Rnd::RZ)
      return uint16_t(hi);
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1)))
      ++hi; // may carry into the exponent and to infinity: correct
    return uint16_t(hi);
  }
  // f16: 1-5-10.
  uint32_t mag = x & 0x7FFFFFFFu;
  if (mag >= 0x7F800000u)
    return uint16_t(sign | 0x7C00u);
  int exp = int(mag >> 23) - 127;
  uint64_t mant = (mag & 0x7FFFFFu) | (mag >= 0x00800000u ? 0x800000u : 0);
  if (mag < 0x00800000u)
    exp = -126; // f32 subnormal
  // value = mant * 2^(exp - 23); target units: 2^-24 (f16 subnormal ulp)
  // for exp < -14, else 2^(exp - 10).
  int unitExp = exp < -14 ? -24 : exp - 10;
  int shift = unitExp - (exp - 23); // right shift of mant
  uint64_t q, rem, half;
  if (shift <= 0) {
    q = mant << (-shift);
    rem = 0;
    half = 1;
  } else if (shift >= 63) {
    // Far below half the smallest subnormal (< 2^-62 of it): rounds to zero.
    q = 0;
    rem = mant;
    half = ~0ull;
  } else {
    q = mant >> shift;
    rem = mant & ((1ull << shift) - 1);
    half = 1ull << (shift - 1);
  }
  if (r == Rnd::RN && (rem > half || (rem == half && (q & 1))))
    ++q;
  // Assemble: for subnormal range unitExp=-24 -> bits = q (carry into the
  // normal range works); else q has an implicit bit at 2^10.
  uint32_t bits;
  if (unitExp == -24) {
    bits = uint32_t(q); // q <= 0x400 -> 0x400 is the smallest normal
  } else {
    int e = exp;
    if (q >= 0x800) { // mantissa overflow from rounding
      q >>= 1;
      ++e;
    }
    if (e > 15)
      return uint16_t(sign | (r == Rnd::RZ ? 0x7BFFu : 0x7C00u));
    bits = uint32_t((e + 15) << 10) | uint32_t(q & 0x3FFu);
  }
  return uint16_t(sign | bits);
}

inline uint32_t widenF16(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FFu;
  if (e == 0x1F)
    return sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0); // quiet NaN
  if (e == 0) {
    if (m == 0)
      return sign;
    float v = float(m) * 0x1p-24f;
    return sign | asU(v);
  }
  return sign | ((e + 112) << 23) | (m << 13);
}
inline uint32_t widenBF16(uint16_t b) { return uint32_t(b) << 16; }

inline float toF32(uint64_t v, T t) {
  switch (t) {
  case T::F16: return asF(widenF16(uint16_t(v)));
  case T::BF16: return asF(widenBF16(uint16_t(v)));
  default: return asF(uint32_t(v));
  }
}

} // namespace flashopt::ptxemu::detail

#endif // FLASHOPT_PTXEMU_PTXFLOAT_H
