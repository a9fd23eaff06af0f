//===- PtxArith.h - the PTX interpreter's value semantics -------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What PtxExecutor.cpp computes per lane, as pure functions of the decoded
/// instruction and its operand bits: conversions (cvt), float compares,
/// min/max, and the f32, bf16 and f64 arithmetic with their rounding
/// modifiers. Header-only so that they inline into the executor's loop.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTXEMU_PTXARITH_H
#define FLASHOPT_PTXEMU_PTXARITH_H

#include "PtxFloat.h"
#include "PtxInternal.h"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace flashopt::ptxemu::detail {

/// A run-time error of the kernel being interpreted (launch() reports it).
struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};


inline int64_t sext(uint64_t v, int bits) {
  if (bits >= 64)
    return int64_t(v);
  uint64_t m = 1ull << (bits - 1);
  v &= maskOf(bits);
  return int64_t((v ^ m) - m);
}

/// cvt: a (and b, the low half of a packed pair) converted as `I` says.
inline uint64_t convert(const Inst &I, uint64_t a, uint64_t b) {
  const T d = I.t, s = I.t2;
  const int db = bitsOf(d), sb = bitsOf(s);
  if (d == T::F16X2 || d == T::BF16X2) {
    bool bf = d == T::BF16X2;
    uint16_t hi = narrow16(uint32_t(a), bf, I.rnd),
             lo = narrow16(uint32_t(b), bf, I.rnd);
    return uint64_t(hi) << 16 | lo;
  }
  if (isInt(d) && isInt(s)) {
    int64_t sv = isSigned(s) ? sext(a, sb) : int64_t(a & maskOf(sb));
    bool sU64 = !isSigned(s) && sb == 64;
    if (I.sat) {
      if (isSigned(d)) {
        int64_t lo = -(int64_t(1) << (db - 1)), hi = (int64_t(1) << (db - 1)) - 1;
        if (db == 64) {
          if (sU64 && (a >> 63))
            sv = INT64_MAX;
        } else if (sU64 && (a >> 63)) {
          sv = hi;
        } else {
          sv = std::min(std::max(sv, lo), hi);
        }
      } else {
        uint64_t hi = maskOf(db);
        if (!sU64 && sv < 0)
          sv = 0;
        else if (db < 64 && (sU64 ? a > hi : uint64_t(sv) > hi))
          sv = int64_t(hi);
      }
    }
    uint64_t r = uint64_t(sv) & maskOf(db);
    return isSigned(d) ? uint64_t(sext(r, db)) : r;
  }
  if (isInt(d)) { // from float
    double v;
    if (s == T::F64)
      v = asD(a);
    else {
      uint32_t x = s == T::F32 ? uint32_t(a) : asU(toF32(a, s));
      if (I.ftz)
        x = ftz32(x);
      v = double(asF(x));
    }
    if (std::isnan(v))
      return 0;
    switch (I.rnd) {
    case Rnd::RNI: v = std::nearbyint(v); break; // ties to even
    case Rnd::RZI: v = std::trunc(v); break;
    case Rnd::RMI: v = std::floor(v); break;
    default: v = std::ceil(v); break;
    }
    uint64_t r;
    if (isSigned(d)) {
      // Saturate to [-2^(db-1), 2^(db-1) - 1].
      const double lo = -std::ldexp(1.0, db - 1), hi = std::ldexp(1.0, db - 1);
      const int64_t minV = db == 64 ? INT64_MIN : -(int64_t(1) << (db - 1));
      const int64_t maxV = db == 64 ? INT64_MAX : (int64_t(1) << (db - 1)) - 1;
      int64_t iv = v <= lo ? minV : v >= hi ? maxV : int64_t(v);
      r = uint64_t(sext(uint64_t(iv), db));
    } else {
      double hi = std::ldexp(1.0, db);
      r = v <= 0 ? 0 : v >= hi ? maskOf(db) : uint64_t(v);
    }
    return r & (isSigned(d) ? ~0ull : maskOf(db));
  }
  if (isInt(s)) { // to float
    RoundScope rs(I.rnd);
    bool sg = isSigned(s);
    int64_t iv = sg ? sext(a, sb) : 0;
    uint64_t uv = a & maskOf(sb);
    if (d == T::F32) {
      volatile float f = sg ? float(iv) : float(uv);
      return asU(f);
    }
    if (d == T::F64) {
      volatile double f = sg ? double(iv) : double(uv);
      return asU64(f);
    }
    // 16-bit: through f32 exactly (only <= 24-bit magnitudes are exact).
    double dv = sg ? double(iv) : double(uv);
    if (std::fabs(dv) > 16777216.0)
      throw Fault("cvt of a wide integer to f16/bf16 is not implemented");
    return narrow16(asU(float(dv)), d == T::BF16, I.rnd);
  }
  // float -> float
  if (d == s) { // f32 round to integral
    uint32_t x = uint32_t(a);
    if (I.ftz)
      x = ftz32(x);
    float v = asF(x), r;
    switch (I.rnd) {
    case Rnd::RNI: r = std::nearbyintf(v); break;
    case Rnd::RZI: r = std::truncf(v); break;
    case Rnd::RMI: r = std::floor(v); break;
    default: r = std::ceil(v); break;
    }
    uint32_t o = res32(r);
    if (I.sat)
      o = res32(std::isnan(asF(o)) ? 0.0f : std::min(std::max(asF(o), 0.0f), 1.0f));
    return I.ftz ? ftz32(o) : o;
  }
  if (d == T::F32 && (s == T::F16 || s == T::BF16)) {
    uint32_t o = s == T::F16 ? widenF16(uint16_t(a)) : widenBF16(uint16_t(a));
    if (I.ftz)
      o = ftz32(o);
    if (I.sat)
      o = nan32(o) ? 0 : asU(std::min(std::max(asF(o), 0.0f), 1.0f));
    return o;
  }
  if (d == T::F64 && s == T::F32) {
    uint32_t x = I.ftz ? ftz32(uint32_t(a)) : uint32_t(a);
    return nan32(x) ? kCanonF64 : asU64(double(asF(x)));
  }
  if (d == T::F32 && s == T::F64) {
    RoundScope rs(I.rnd);
    volatile float f = float(asD(a));
    uint32_t o = res32(f);
    if (I.ftz)
      o = ftz32(o);
    if (I.sat)
      o = nan32(o) ? 0 : asU(std::min(std::max(asF(o), 0.0f), 1.0f));
    return o;
  }
  // f32 -> f16/bf16
  uint32_t x = I.ftz ? ftz32(uint32_t(a)) : uint32_t(a);
  return narrow16(x, d == T::BF16, I.rnd);
}

inline bool cmpF(Cmp c, double a, double b) {
  bool un = std::isnan(a) || std::isnan(b);
  switch (c) {
  case Cmp::EQ: return !un && a == b;
  case Cmp::NE: return !un && a != b;
  case Cmp::LT: return !un && a < b;
  case Cmp::LE: return !un && a <= b;
  case Cmp::GT: return !un && a > b;
  case Cmp::GE: return !un && a >= b;
  case Cmp::EQU: return un || a == b;
  case Cmp::NEU: return un || a != b;
  case Cmp::LTU: return un || a < b;
  case Cmp::LEU: return un || a <= b;
  case Cmp::GTU: return un || a > b;
  case Cmp::GEU: return un || a >= b;
  case Cmp::NUM: return !un;
  case Cmp::NAN_: return un;
  default: return false;
  }
}

/// min/max of f32 per the PTX ISA: without .NaN a NaN operand yields the
/// other operand (both NaN: canonical NaN); with .NaN any NaN yields the
/// canonical NaN; -0.0 < +0.0.
inline uint32_t minmax(uint32_t a, uint32_t b, bool isMax, bool nanM,
                              bool ftz) {
  if (ftz) {
    a = ftz32(a);
    b = ftz32(b);
  }
  bool na = nan32(a), nb = nan32(b);
  if (na || nb) {
    if (nanM || (na && nb))
      return kCanonF32;
    return na ? b : a;
  }
  float fa = asF(a), fb = asF(b);
  if (fa == fb) { // equal, or +0/-0
    if ((a ^ b) & 0x80000000u)
      return isMax ? (a & 0x80000000u ? b : a) : (a & 0x80000000u ? a : b);
    return a;
  }
  return (isMax ? fa > fb : fa < fb) ? a : b;
}

inline uint32_t arith32(Op op, Rnd r, bool ftz, uint32_t a,
                               uint32_t b, uint32_t c) {
  if (ftz) {
    a = ftz32(a);
    b = ftz32(b);
    c = ftz32(c);
  }
  float x = asF(a), y = asF(b), res;
  if (r == Rnd::RN) {
    switch (op) {
    case Op::AddF: res = x + y; break;
    case Op::SubF: res = x - y; break;
    case Op::MulF: res = x * y; break;
    case Op::DivF: res = x / y; break;
    case Op::FmaF: res = std::fma(x, y, asF(c)); break;
    default: res = std::sqrt(x); break;
    }
  } else {
    RoundScope rs(r);
    volatile float vx = x, vy = y, vc = asF(c);
    volatile float v;
    switch (op) {
    case Op::AddF: v = vx + vy; break;
    case Op::SubF: v = vx - vy; break;
    case Op::MulF: v = vx * vy; break;
    case Op::DivF: v = vx / vy; break;
    case Op::FmaF: v = std::fma(float(vx), float(vy), float(vc)); break;
    default: v = std::sqrt(float(vx)); break;
    }
    res = v;
  }
  uint32_t o = res32(res);
  return ftz ? ftz32(o) : o;
}

/// rcp.approx.f32 / sqrt.approx.f32 (Op::RcpF / Op::SqrtF, `.ftz` or not):
/// the hardware gives some value within its documented bound (rcp: 1 ulp;
/// sqrt: a relative 2^-23), not a specified one. `away == false` models it
/// as the correctly rounded result; `away == true` as the other faithful
/// rounding whenever the result is inexact (one ulp off, still within both
/// bounds): the adversarial choice, to test code whose correctness rests
/// only on the bound (flashopt-guarded-quantize).
inline uint32_t approxF32(Op op, bool ftz, uint32_t a, bool away) {
  const bool rcp = op == Op::RcpF;
  auto at = [&](Rnd r) {
    return rcp ? arith32(Op::DivF, r, ftz, 0x3F800000u, a, 0)
               : arith32(Op::SqrtF, r, ftz, a, 0, 0);
  };
  uint32_t nearest = at(Rnd::RN);
  if (!away)
    return nearest;
  uint32_t down = at(Rnd::RM), up = at(Rnd::RP);
  if (down == up)
    return nearest;
  return nearest == down ? up : down;
}

/// bf16 a op b (op c), rounded once to nearest even: the exact result
/// rounded to odd in double (the product of two bf16 values is exact
/// there), then to odd in f32, then to nearest bf16 (rounding to odd
/// with two or more extra bits makes the last rounding correct). NaN ->
/// canonical; subnormals kept.
inline uint16_t arithBF16(Op op, uint16_t a, uint16_t b,
                                 uint16_t c) {
  const double x = double(asF(widenBF16(a))), y = double(asF(widenBF16(b))),
               z = double(asF(widenBF16(c)));
  const int saved = std::fegetround();
  std::fesetround(FE_TOWARDZERO);
  std::feclearexcept(FE_INEXACT);
  volatile double vx = x, vy = y, vz = z, v;
  switch (op) {
  case Op::AddF: v = vx + vy; break;
  case Op::SubF: v = vx - vy; break;
  case Op::MulF: v = vx * vy; break;
  default: v = std::fma(double(vx), double(vy), double(vz)); break;
  }
  double d = v;
  if (std::fetestexcept(FE_INEXACT) && !std::isnan(d) && !std::isinf(d))
    d = asD(asU64(d) | 1);
  std::feclearexcept(FE_INEXACT);
  volatile float vf = float(d);
  uint32_t f = asU(vf);
  if (std::fetestexcept(FE_INEXACT) && !nan32(f) &&
      (f & 0x7FFFFFFFu) != 0x7F800000u)
    f |= 1;
  std::fesetround(saved);
  return narrow16(f, /*bf16=*/true, Rnd::RN);
}

inline uint64_t arith64(Op op, Rnd r, uint64_t a, uint64_t b,
                               uint64_t c) {
  RoundScope rs(r);
  volatile double x = asD(a), y = asD(b), z = asD(c);
  volatile double v;
  switch (op) {
  case Op::AddF: v = x + y; break;
  case Op::SubF: v = x - y; break;
  case Op::MulF: v = x * y; break;
  case Op::DivF: v = x / y; break;
  case Op::FmaF: v = std::fma(double(x), double(y), double(z)); break;
  default: v = std::sqrt(double(x)); break;
  }
  return res64(v);
}

struct Entry {
  uint32_t mask;
  int32_t pc, rpc;
};

} // namespace flashopt::ptxemu::detail

#endif // FLASHOPT_PTXEMU_PTXARITH_H
