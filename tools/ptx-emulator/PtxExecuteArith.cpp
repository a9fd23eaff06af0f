//===- PtxExecuteArith.cpp - integer, float, conversion semantics ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The PTX interpreter's integer, comparison, float and conversion
/// instructions (Executor::executeArith), as the PTX ISA's chapter
/// "Instructions" defines them; where it says "canonical NaN", NVIDIA's
/// encodings: 0x7FFFFFFF for f32, 0x7FFF for f16 and bf16. Compiled with
/// -ffp-contract=off -frounding-math: host float arithmetic is IEEE and
/// honours fesetround for the directed rounding modes.
///
//===----------------------------------------------------------------------===//

#include "PtxExecutor.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>

namespace flashopt::ptxemu {

using namespace detail;

namespace {

/// How rcp.approx / sqrt.approx are modelled (approxF32):
/// FLASHOPT_PTX_APPROX=away picks the other faithful rounding wherever the
/// result is inexact; unset or anything else, the correctly rounded one.
bool approxAway() {
  static const bool away = [] {
    const char *e = std::getenv("FLASHOPT_PTX_APPROX");
    return e && std::string(e) == "away";
  }();
  return away;
}

} // namespace

void Executor::executeArith(const Inst &I, uint32_t m) {
  const int w = bitsOf(I.t);
  const uint64_t tm = maskOf(w);
  const Operand &D = I.o[0], &A = I.o[1], &B = I.o[2], &C = I.o[3];
  const int dreg = D.reg;
  switch (I.op) {
  case Op::Add:
  case Op::Sub:
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l), b = rd(B, l), r;
      if (I.sat) { // s32
        int64_t x = sext(a, 32), y = sext(b, 32);
        int64_t s = I.op == Op::Add ? x + y : x - y;
        s = std::min<int64_t>(std::max<int64_t>(s, INT32_MIN), INT32_MAX);
        r = uint64_t(s);
      } else {
        r = I.op == Op::Add ? a + b : a - b;
      }
      wr(dreg, l, r & tm);
    });
    return;
  case Op::MulLo:
  case Op::MadLo:
    lanes(m, [&](int l) {
      uint64_t r = rd(A, l) * rd(B, l);
      if (I.op == Op::MadLo)
        r += rd(C, l);
      wr(dreg, l, r & tm);
    });
    return;
  case Op::MulHi:
    lanes(m, [&](int l) {
      uint64_t r;
      if (w == 64) {
        if (isSigned(I.t))
          r = uint64_t((__int128(int64_t(rd(A, l))) * __int128(int64_t(rd(B, l)))) >> 64);
        else
          r = uint64_t((static_cast<unsigned __int128>(rd(A, l)) * rd(B, l)) >> 64);
      } else if (isSigned(I.t)) {
        r = uint64_t((sext(rd(A, l), w) * sext(rd(B, l), w)) >> w);
      } else {
        r = ((rd(A, l) & tm) * (rd(B, l) & tm)) >> w;
      }
      wr(dreg, l, r & tm);
    });
    return;
  case Op::MulWide:
  case Op::MadWide:
    lanes(m, [&](int l) {
      uint64_t r;
      if (isSigned(I.t))
        r = uint64_t(sext(rd(A, l), w) * sext(rd(B, l), w));
      else
        r = (rd(A, l) & tm) * (rd(B, l) & tm);
      if (I.op == Op::MadWide)
        r += rd(C, l);
      wr(dreg, l, r & maskOf(2 * w));
    });
    return;
  case Op::MinI:
  case Op::MaxI:
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l) & tm, b = rd(B, l) & tm;
      bool lt = isSigned(I.t) ? sext(a, w) < sext(b, w) : a < b;
      wr(dreg, l, (I.op == Op::MinI) == lt ? a : b);
    });
    return;
  case Op::NegI:
    lanes(m, [&](int l) { wr(dreg, l, (0 - rd(A, l)) & tm); });
    return;
  case Op::AbsI:
    lanes(m, [&](int l) {
      int64_t v = sext(rd(A, l), w);
      wr(dreg, l, uint64_t(v < 0 ? -v : v) & tm);
    });
    return;
  case Op::And:
    lanes(m, [&](int l) { wr(dreg, l, rd(A, l) & rd(B, l) & tm); });
    return;
  case Op::Or:
    lanes(m, [&](int l) { wr(dreg, l, (rd(A, l) | rd(B, l)) & tm); });
    return;
  case Op::Xor:
    lanes(m, [&](int l) { wr(dreg, l, (rd(A, l) ^ rd(B, l)) & tm); });
    return;
  case Op::Not:
    lanes(m, [&](int l) { wr(dreg, l, ~rd(A, l) & tm); });
    return;
  case Op::Shl:
    lanes(m, [&](int l) {
      uint64_t s = rd(B, l) & 0xFFFFFFFFu;
      wr(dreg, l, s >= uint64_t(w) ? 0 : (rd(A, l) << s) & tm);
    });
    return;
  case Op::Shr:
    lanes(m, [&](int l) {
      uint64_t s = rd(B, l) & 0xFFFFFFFFu, a = rd(A, l) & tm;
      uint64_t r;
      if (isSigned(I.t)) {
        int64_t v = sext(a, w);
        r = uint64_t(v >> (s >= uint64_t(w) ? w - 1 : s));
      } else {
        r = s >= uint64_t(w) ? 0 : a >> s;
      }
      wr(dreg, l, r & tm);
    });
    return;
  case Op::Bfe:
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l) & tm;
      unsigned pos = unsigned(rd(B, l) & 0xFF), len = unsigned(rd(C, l) & 0xFF);
      uint64_t sbit = 0;
      if (isSigned(I.t) && len != 0)
        sbit = (a >> std::min<unsigned>(pos + len - 1, unsigned(w - 1))) & 1;
      uint64_t r = 0;
      for (int i = 0; i < w; ++i) {
        uint64_t bit = (unsigned(i) < len && pos + unsigned(i) <= unsigned(w - 1))
                           ? (a >> (pos + unsigned(i))) & 1
                           : sbit;
        r |= bit << i;
      }
      wr(dreg, l, r);
    });
    return;
  case Op::Bfi:
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l), f = rd(B, l) & tm;
      unsigned pos = unsigned(rd(C, l) & 0xFF),
               len = unsigned(rd(I.o[4], l) & 0xFF);
      for (unsigned i = 0; i < len && pos + i <= unsigned(w - 1); ++i)
        f = (f & ~(1ull << (pos + i))) | (((a >> i) & 1) << (pos + i));
      wr(dreg, l, f);
    });
    return;
  case Op::Prmt:
    lanes(m, [&](int l) {
      uint64_t src = (rd(A, l) & 0xFFFFFFFFu) | (rd(B, l) & 0xFFFFFFFFu) << 32;
      uint32_t c = uint32_t(rd(C, l)), r = 0;
      for (int i = 0; i < 4; ++i) {
        uint32_t sel = (c >> (4 * i)) & 0xF;
        uint32_t byte = uint32_t(src >> (8 * (sel & 7))) & 0xFF;
        if (sel & 8)
          byte = (byte & 0x80) ? 0xFF : 0;
        r |= byte << (8 * i);
      }
      wr(dreg, l, r);
    });
    return;
  case Op::Selp:
    lanes(m, [&](int l) { wr(dreg, l, (rd(C, l) ? rd(A, l) : rd(B, l)) & tm); });
    return;
  case Op::SetpI:
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l) & tm, b = rd(B, l) & tm;
      bool r;
      if (isSigned(I.t)) {
        int64_t x = sext(a, w), y = sext(b, w);
        switch (I.cmp) {
        case Cmp::EQ: r = x == y; break;
        case Cmp::NE: r = x != y; break;
        case Cmp::LT: r = x < y; break;
        case Cmp::LE: r = x <= y; break;
        case Cmp::GT: r = x > y; break;
        default: r = x >= y; break;
        }
      } else {
        switch (I.cmp) {
        case Cmp::EQ: r = a == b; break;
        case Cmp::NE: r = a != b; break;
        case Cmp::LT: case Cmp::LO: r = a < b; break;
        case Cmp::LE: case Cmp::LS: r = a <= b; break;
        case Cmp::GT: case Cmp::HI: r = a > b; break;
        default: r = a >= b; break;
        }
      }
      wr(dreg, l, r);
    });
    return;
  case Op::SetpF:
    lanes(m, [&](int l) {
      double a, b;
      if (I.t == T::F64) {
        a = asD(rd(A, l));
        b = asD(rd(B, l));
      } else if (I.t == T::F32) {
        uint32_t x = uint32_t(rd(A, l)), y = uint32_t(rd(B, l));
        if (I.ftz) {
          x = ftz32(x);
          y = ftz32(y);
        }
        a = asF(x);
        b = asF(y);
      } else {
        a = toF32(rd(A, l), I.t);
        b = toF32(rd(B, l), I.t);
      }
      wr(dreg, l, cmpF(I.cmp, a, b));
    });
    return;
  case Op::AddF:
  case Op::SubF:
  case Op::MulF:
  case Op::DivF:
  case Op::FmaF:
  case Op::SqrtF:
  case Op::RcpF:
    if (I.approx) {
      lanes(m, [&](int l) {
        wr(dreg, l, approxF32(I.op, I.ftz, uint32_t(rd(A, l)), approxAway()));
      });
      return;
    }
    if (I.op == Op::RcpF) { // 1 / a, one IEEE rounding
      lanes(m, [&](int l) {
        wr(dreg, l,
           I.t == T::F32
               ? uint64_t(arith32(Op::DivF, I.rnd, I.ftz, 0x3F800000u,
                                  uint32_t(rd(A, l)), 0))
               : arith64(Op::DivF, I.rnd, 0x3FF0000000000000ull, rd(A, l),
                         0));
      });
      return;
    }
    if (I.t == T::BF16 || I.t == T::BF16X2) {
      const bool fma = I.op == Op::FmaF, two = I.t == T::BF16X2;
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l), b = rd(B, l), c = fma ? rd(C, l) : 0;
        uint64_t lo = arithBF16(I.op, uint16_t(a), uint16_t(b), uint16_t(c));
        uint64_t hi = two ? arithBF16(I.op, uint16_t(a >> 16),
                                      uint16_t(b >> 16), uint16_t(c >> 16))
                          : 0;
        wr(dreg, l, hi << 16 | lo);
      });
    } else if (I.t == T::F32) {
      const bool sq = I.op == Op::SqrtF, fma = I.op == Op::FmaF;
      lanes(m, [&](int l) {
        wr(dreg, l,
           arith32(I.op, I.rnd, I.ftz, uint32_t(rd(A, l)),
                   sq ? 0 : uint32_t(rd(B, l)), fma ? uint32_t(rd(C, l)) : 0));
      });
    } else if (I.t == T::F32X2) {
      const bool fma = I.op == Op::FmaF;
      lanes(m, [&](int l) {
        uint64_t a = rd(A, l), b = rd(B, l), c = fma ? rd(C, l) : 0;
        uint64_t lo = arith32(I.op, I.rnd, false, uint32_t(a), uint32_t(b),
                              uint32_t(c));
        uint64_t hi = arith32(I.op, I.rnd, false, uint32_t(a >> 32),
                              uint32_t(b >> 32), uint32_t(c >> 32));
        wr(dreg, l, hi << 32 | lo);
      });
    } else {
      const bool sq = I.op == Op::SqrtF, fma = I.op == Op::FmaF;
      lanes(m, [&](int l) {
        wr(dreg, l, arith64(I.op, I.rnd, rd(A, l), sq ? 0 : rd(B, l),
                            fma ? rd(C, l) : 0));
      });
    }
    return;
  case Op::AbsF:
  case Op::NegF: {
    uint64_t sign;
    switch (I.t) {
    case T::F16: case T::BF16: sign = 0x8000u; break;
    case T::F16X2: case T::BF16X2: sign = 0x80008000u; break;
    case T::F64: sign = 1ull << 63; break;
    default: sign = 0x80000000u; break;
    }
    const bool abs = I.op == Op::AbsF;
    lanes(m, [&](int l) {
      uint64_t a = rd(A, l) & tm;
      if (I.ftz)
        a = ftz32(uint32_t(a));
      wr(dreg, l, abs ? a & ~sign : a ^ sign);
    });
    return;
  }
  case Op::MinF:
  case Op::MaxF:
    lanes(m, [&](int l) {
      wr(dreg, l,
         minmax(uint32_t(rd(A, l)), uint32_t(rd(B, l)), I.op == Op::MaxF,
                I.nanMode, I.ftz));
    });
    return;
  case Op::CopysignF: {
    const uint64_t sign = w == 64 ? 1ull << 63 : 0x80000000u;
    lanes(m, [&](int l) {
      wr(dreg, l, (rd(B, l) & tm & ~sign) | (rd(A, l) & sign));
    });
    return;
  }
  case Op::Cvt: {
    const bool packed = I.t == T::F16X2 || I.t == T::BF16X2;
    try {
      lanes(m, [&](int l) {
        wr(dreg, l, convert(I, rd(A, l), packed ? rd(B, l) : 0));
      });
    } catch (const Fault &f) {
      fault(I, __builtin_ctz(m), f.what());
    }
    return;
  }
  default:
    fault(I, __builtin_ctz(m | 1), "internal: unhandled operation");
  }
}

} // namespace flashopt::ptxemu
