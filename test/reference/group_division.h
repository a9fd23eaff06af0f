//===- group_division.h - Quantization division, no divide -*- C++ -*-===//
//
// Part of flashopt (test and bench code only).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A scalar model of what flashopt-exact-group-division emits (one
/// reciprocal per group, a multiply and two FMA residual corrections per
/// element) and the check that docs/NUMERICS.md §2b proves: the quantized
/// code equals the one computed with the IEEE division, and the quotient
/// equals the division's wherever |y| >= 2^-100 and |y / a| >= 2^-125.
/// Used by unittests/Numerics (special values + 1e6 random cases) and
/// bench/group_division_check.cpp (1e8 and more). Compile with
/// -ffp-contract=off.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TEST_REFERENCE_GROUP_DIVISION_H
#define FLASHOPT_TEST_REFERENCE_GROUP_DIVISION_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashopt::ref {

/// y / a the way the kernels compute it after flashopt-exact-group-division.
inline float groupDivision(float y, float a) {
  float s = a > 0x1p126f ? 0x1p-64f : 1.0f;
  float A = a * s;
  float r = 1.0f / A;
  float Y = y * s;
  float q0 = Y * r;
  float e0 = std::fma(q0, -A, Y);
  float q1 = std::fma(e0, r, q0);
  float e1 = std::fma(q1, -A, Y);
  return std::fma(e1, r, q1);
}

/// The code numerics.md §2 stores for a quotient n (softsign or not).
inline int32_t codeOf(float n, bool softsign, bool isSigned) {
  float nmax = isSigned ? 127.0f : 255.0f;
  float t = n;
  if (softsign)
    t = (2.0f * n) / (1.0f + std::fabs(n));
  float f = std::floor(t * nmax + 0.5f);
  if (std::isnan(f))
    return 0;
  float lo = isSigned ? -nmax : 0.0f;
  return int32_t(std::fmin(std::fmax(f, lo), nmax));
}

struct GroupDivisionResult {
  uint64_t cases = 0, quotientMismatches = 0, codeMismatches = 0;
};

inline uint32_t bitsOfF(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// Checks one (y, a) pair, |y| <= a or a NaN/inf (as the pattern the pass
/// matches guarantees).
inline void checkGroupDivision(float y, float a, GroupDivisionResult &r) {
  ++r.cases;
  float want = y / a, got = groupDivision(y, a);
  bool proven = std::fabs(y) >= 0x1p-100f && std::fabs(want) >= 0x1p-125f &&
                std::isfinite(a);
  if (proven && bitsOfF(want) != bitsOfF(got))
    ++r.quotientMismatches;
  for (int mode = 0; mode < 3; ++mode) {
    bool softsign = mode == 0, isSigned = mode != 2;
    if (!isSigned && y < 0)
      continue;
    if (codeOf(want, softsign, isSigned) != codeOf(got, softsign, isSigned))
      ++r.codeMismatches;
  }
}

/// xorshift64: deterministic cases for a seed.
struct CaseGenerator {
  uint64_t s;
  explicit CaseGenerator(uint64_t seed)
      : s(seed * 2654435761u + 88172645463325252ull) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  static float floatOf(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  /// A group absmax a >= 1e-12 (the kernels' clamp) up to FLT_MAX, and a
  /// y with |y| <= a: near a, anywhere below it, or subnormal.
  void pair(float &y, float &a) {
    uint32_t ea = 87 + uint32_t(next() % 168); // exponent fields 87..254
    a = floatOf((ea << 23) | uint32_t(next() & 0x7FFFFF));
    if (a < 1e-12f)
      a = 1e-12f;
    switch (next() % 4) {
    case 0: // the top binade below a: codes near N
      y = a * floatOf(0x3F000000u | uint32_t(next() & 0x7FFFFF)) * 2.0f;
      if (std::fabs(y) > a)
        y = a;
      break;
    case 1: // any exponent below a's
    case 2: {
      uint32_t ey = uint32_t(next() % (ea + 1));
      y = floatOf((ey << 23) | uint32_t(next() & 0x7FFFFF));
      if (y > a)
        y = a;
      break;
    }
    default: // subnormal or tiny
      y = floatOf(uint32_t(next() & 0x00FFFFFF));
      break;
    }
    if (next() & 1)
      y = -y;
  }
};

} // namespace flashopt::ref

#endif // FLASHOPT_TEST_REFERENCE_GROUP_DIVISION_H
