//===- PtxExecutor.cpp - the SIMT executor ----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The SIMT executor of the PTX interpreter: warps of 32 lanes in lock step,
/// divergence and reconvergence at the parser's post-dominators, the
/// instruction semantics of the PTX ISA (chapter "Instructions"; where it
/// says "canonical NaN", NVIDIA's encodings: 0x7FFFFFFF for f32, 0x7FFF for
/// f16 and bf16), and `launch` (PtxEmulator.h). Compiled with
/// -ffp-contract=off -frounding-math: host float arithmetic is IEEE and
/// honours fesetround for the directed rounding modes.
///
//===----------------------------------------------------------------------===//

#include "PtxInternal.h"

#include "PtxArith.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

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

//===----------------------------------------------------------------------===//
// Execution
//===----------------------------------------------------------------------===//

struct Executor {
  const KernelImpl &k;
  const LaunchDims &dims;
  const std::vector<uint8_t> &params;
  const MemoryCheck &check;
  LaunchStats stats;
  std::vector<uint64_t> R; ///< R[reg * 32 + lane]
  unsigned block[3] = {0, 0, 0};
  unsigned warpInBlock = 0;
  uint32_t tid[32][3];

  Executor(const KernelImpl &k, const LaunchDims &d,
           const std::vector<uint8_t> &p, const MemoryCheck &c)
      : k(k), dims(d), params(p), check(c) {
    R.assign(size_t(k.numRegs) * 32, 0);
  }

  [[noreturn]] void fault(const Inst &I, int lane, const std::string &what) {
    std::ostringstream os;
    os << k.name << " line " << I.line << " (" << I.opcode << "), block ("
       << block[0] << "," << block[1] << "," << block[2] << ") thread ("
       << tid[lane][0] << "," << tid[lane][1] << "," << tid[lane][2]
       << "): " << what;
    throw Fault(os.str());
  }

  inline uint64_t rd(const Operand &o, int l) const {
    return o.kind == Operand::Reg ? R[size_t(o.reg) * 32 + l] : o.imm;
  }
  /// Element i of the vector source `o` in lane l.
  inline uint64_t vecElem(const Operand &o, int i, int l) const {
    return o.vec[i] == -2 ? o.vimm[i] : R[size_t(o.vec[i]) * 32 + l];
  }
  inline void wr(int reg, int l, uint64_t v) {
    R[size_t(reg) * 32 + l] = v & k.regMask[size_t(reg)];
  }
  uint32_t special(Special s, int l) const {
    switch (s) {
    case Special::TidX: return tid[l][0];
    case Special::TidY: return tid[l][1];
    case Special::TidZ: return tid[l][2];
    case Special::NtidX: return dims.block[0];
    case Special::NtidY: return dims.block[1];
    case Special::NtidZ: return dims.block[2];
    case Special::CtaidX: return block[0];
    case Special::CtaidY: return block[1];
    case Special::CtaidZ: return block[2];
    case Special::NctaidX: return dims.grid[0];
    case Special::NctaidY: return dims.grid[1];
    case Special::NctaidZ: return dims.grid[2];
    case Special::LaneId: return uint32_t(l);
    case Special::WarpId: return warpInBlock;
    }
    return 0;
  }

  template <class F> static inline void lanes(uint32_t m, F &&f) {
    while (m) {
      int l = __builtin_ctz(m);
      m &= m - 1;
      f(l);
    }
  }

  uint64_t loadGlobal(const Inst &I, int l, uint64_t addr, int bytes) {
    uint64_t v = 0;
    std::memcpy(&v, reinterpret_cast<const void *>(uintptr_t(addr)),
                size_t(bytes));
    (void)I;
    (void)l;
    return v;
  }

  void checkAccess(const Inst &I, int l, uint64_t addr, uint64_t bytes,
                   bool write) {
    if (addr % bytes != 0) {
      std::ostringstream os;
      os << "misaligned " << (write ? "store" : "load") << " of " << bytes
         << " bytes at 0x" << std::hex << addr;
      fault(I, l, os.str());
    }
    if (!write && k.constData)
      for (auto [lo, size] : k.constData->ranges)
        if (addr >= lo && addr + bytes <= lo + size)
          return;
    if (check && !check(addr, bytes, write)) {
      std::ostringstream os;
      os << (write ? "store" : "load") << " of " << bytes << " bytes at 0x"
         << std::hex << addr << " outside device memory";
      fault(I, l, os.str());
    }
  }

  void runWarp(uint32_t live) {
    const int n = int(k.code.size());
    std::vector<Entry> stack;
    stack.push_back({live, 0, -1});
    uint32_t exited = 0;
    while (!stack.empty()) {
      Entry &e = stack.back();
      if (e.pc == e.rpc || e.mask == 0) {
        stack.pop_back();
        continue;
      }
      if (e.pc >= n) {
        if (e.pc > n)
          throw Fault(k.name + ": ran past the end");
        exited |= e.mask;
        stack.pop_back();
        for (Entry &x : stack)
          x.mask &= ~exited;
        continue;
      }
      const Inst &I = k.code[size_t(e.pc)];
      ++stats.warp_instructions;
      uint32_t m = e.mask;
      if (I.guard >= 0) {
        uint32_t g = 0;
        const uint64_t *p = &R[size_t(I.guard) * 32];
        lanes(m, [&](int l) {
          if ((p[l] != 0) != I.guardNeg)
            g |= 1u << l;
        });
        m = g;
      }
      stats.lane_instructions += uint64_t(__builtin_popcount(m));
      if (I.op == Op::Bra || I.op == Op::Ret) {
        const int target = I.op == Op::Bra ? I.o[0].target : n;
        const uint32_t taken = m, stay = e.mask & ~m;
        if (I.uni && taken != 0 && stay != 0)
          fault(I, __builtin_ctz(taken), "bra.uni is not uniform across the "
                                         "warp's active lanes");
        if (stay == 0) {
          e.pc = target;
        } else if (taken == 0) {
          e.pc += 1;
        } else {
          ++stats.divergent_branches;
          const int R0 = I.reconverge;
          Entry a{taken, target, R0}, b{stay, e.pc + 1, R0};
          if (e.rpc == R0) {
            stack.pop_back();
          } else {
            e.pc = R0;
          }
          if (b.pc != R0)
            stack.push_back(b);
          if (a.pc != R0)
            stack.push_back(a);
        }
        continue;
      }
      execute(I, m, e.mask & ~exited, live & ~exited);
      stack.back().pc += 1;
    }
  }

  void execute(const Inst &I, uint32_t m, uint32_t active, uint32_t live) {
    const int w = bitsOf(I.t);
    const uint64_t tm = maskOf(w);
    const Operand &D = I.o[0], &A = I.o[1], &B = I.o[2], &C = I.o[3];
    const int dreg = D.reg;
    switch (I.op) {
    case Op::Mov:
      if (D.kind == Operand::Vec) {
        const int ew = w / D.nvec;
        lanes(m, [&](int l) {
          uint64_t v = rd(A, l);
          for (int i = 0; i < D.nvec; ++i)
            if (D.vec[i] >= 0)
              wr(D.vec[i], l, (v >> (i * ew)) & maskOf(ew));
        });
      } else if (A.kind == Operand::Vec) {
        const int ew = w / A.nvec;
        lanes(m, [&](int l) {
          uint64_t v = 0;
          for (int i = 0; i < A.nvec; ++i)
            v |= (vecElem(A, i, l) & maskOf(ew)) << (i * ew);
          wr(dreg, l, v);
        });
      } else if (A.kind == Operand::Spec) {
        lanes(m, [&](int l) { wr(dreg, l, special(A.special, l)); });
      } else {
        lanes(m, [&](int l) { wr(dreg, l, rd(A, l) & tm); });
      }
      return;
    case Op::Ld: {
      const int bytes = w / 8;
      const uint64_t total = uint64_t(bytes) * I.vec;
      lanes(m, [&](int l) {
        uint64_t vals[4];
        if (I.space == Space::Param) {
          uint64_t off = A.imm;
          if (off + total > params.size())
            fault(I, l, "ld.param past the parameter buffer");
          vals[0] = 0;
          std::memcpy(&vals[0], params.data() + off, size_t(bytes));
        } else {
          uint64_t addr = R[size_t(A.reg) * 32 + l] + A.imm;
          checkAccess(I, l, addr, total, false);
          for (int i = 0; i < I.vec; ++i)
            vals[i] = loadGlobal(I, l, addr + uint64_t(i * bytes), bytes);
        }
        for (int i = 0; i < I.vec; ++i) {
          uint64_t v = isSigned(I.t) ? uint64_t(sext(vals[i], w)) : vals[i];
          int r = I.vec == 1 ? dreg : D.vec[i];
          if (r >= 0)
            wr(r, l, v);
        }
      });
      return;
    }
    case Op::St: {
      const int bytes = w / 8;
      const uint64_t total = uint64_t(bytes) * I.vec;
      lanes(m, [&](int l) {
        uint64_t addr = R[size_t(D.reg) * 32 + l] + D.imm;
        checkAccess(I, l, addr, total, true);
        for (int i = 0; i < I.vec; ++i) {
          uint64_t v = I.vec == 1 ? rd(A, l) : vecElem(A, i, l);
          std::memcpy(reinterpret_cast<void *>(uintptr_t(addr + uint64_t(i * bytes))),
                      &v, size_t(bytes));
        }
      });
      return;
    }
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
    case Op::Shfl: {
      ++stats.shuffles;
      if (m == 0)
        return;
      // Member mask: one value for the warp is required here.
      const uint32_t member = uint32_t(rd(I.o[4], __builtin_ctz(m)));
      lanes(m, [&](int l) {
        if (uint32_t(rd(I.o[4], l)) != member)
          fault(I, l, "shfl.sync member masks differ across lanes");
      });
      if ((m & ~member) != 0)
        fault(I, __builtin_ctz(m & ~member),
              "shfl.sync executed by a lane outside its member mask");
      if ((member & live & ~m) != 0)
        fault(I, __builtin_ctz(member & live & ~m),
              "shfl.sync: a lane named in the member mask does not execute "
              "it (divergence or predication)");
      uint64_t out[32];
      lanes(m, [&](int l) {
        uint32_t b = uint32_t(rd(B, l)) & 31, c = uint32_t(rd(C, l));
        uint32_t clamp = c & 31, seg = (c >> 8) & 31;
        uint32_t lane = uint32_t(l);
        uint32_t maxLane = (lane & seg) | (clamp & ~seg);
        uint32_t minLane = lane & seg;
        int64_t j;
        bool p;
        switch (I.mode) {
        case ShflMode::Up:
          j = int64_t(lane) - b;
          p = j >= int64_t(maxLane);
          break;
        case ShflMode::Down:
          j = int64_t(lane) + b;
          p = j <= int64_t(maxLane);
          break;
        case ShflMode::Bfly:
          j = lane ^ b;
          p = j <= int64_t(maxLane);
          break;
        default:
          j = minLane | (b & ~seg);
          p = j <= int64_t(maxLane);
          break;
        }
        if (!p)
          j = lane;
        if (!((m >> j) & 1))
          fault(I, l, "shfl.sync reads lane " + std::to_string(j) +
                          ", which does not take part");
        out[l] = R[size_t(A.reg >= 0 && A.kind == Operand::Reg ? A.reg : 0) * 32 + size_t(j)];
        if (A.kind != Operand::Reg)
          out[l] = A.imm;
      });
      (void)active;
      lanes(m, [&](int l) { wr(dreg, l, out[l] & 0xFFFFFFFFu); });
      return;
    }
    default:
      fault(I, __builtin_ctz(m | 1), "internal: unhandled operation");
    }
  }

  void run() {
    const unsigned threads = dims.block[0] * dims.block[1] * dims.block[2];
    const unsigned warps = (threads + 31) / 32;
    for (unsigned bz = 0; bz < dims.grid[2]; ++bz)
      for (unsigned by = 0; by < dims.grid[1]; ++by)
        for (unsigned bx = 0; bx < dims.grid[0]; ++bx) {
          block[0] = bx;
          block[1] = by;
          block[2] = bz;
          for (unsigned wi = 0; wi < warps; ++wi) {
            warpInBlock = wi;
            uint32_t live = 0;
            for (unsigned l = 0; l < 32; ++l) {
              unsigned t = wi * 32 + l;
              if (t < threads) {
                live |= 1u << l;
                tid[l][0] = t % dims.block[0];
                tid[l][1] = (t / dims.block[0]) % dims.block[1];
                tid[l][2] = t / (dims.block[0] * dims.block[1]);
              } else {
                tid[l][0] = tid[l][1] = tid[l][2] = 0;
              }
            }
            // Registers start undefined on a GPU; a recognisable pattern
            // makes reads before writes visible in results.
            std::fill(R.begin(), R.end(), 0xDEADBEEFDEADBEEFull);
            for (size_t r = 0; r < size_t(k.numRegs); ++r)
              for (int l = 0; l < 32; ++l)
                R[r * 32 + size_t(l)] &= k.regMask[r];
            runWarp(live);
          }
        }
  }
};

} // namespace

bool launch(const Kernel &kernel, const LaunchDims &dims,
            const std::vector<uint8_t> &params, const MemoryCheck &check,
            std::string *error, LaunchStats *stats) {
  const KernelImpl &k = kernel.impl();
  if (std::string why = launchError(k, dims, params.size()); !why.empty()) {
    if (error)
      *error = why;
    return false;
  }
  Executor ex(k, dims, params, check);
  try {
    ex.run();
  } catch (const std::exception &e) {
    if (error)
      *error = e.what();
    if (stats)
      *stats = ex.stats;
    return false;
  }
  if (stats)
    *stats = ex.stats;
  return true;
}

} // namespace flashopt::ptxemu
