//===- PtxExecutor.cpp - the SIMT executor ----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The SIMT executor of the PTX interpreter: warps of 32 lanes in lock step,
/// divergence and reconvergence at the parser's post-dominators, the data
/// movement instructions (mov, ld, st, shfl.sync) and `launch`
/// (PtxEmulator.h); the other instructions' semantics are in
/// PtxExecuteArith.cpp. Compiled with -ffp-contract=off -frounding-math.
///
//===----------------------------------------------------------------------===//

#include "PtxExecutor.h"

#include <algorithm>
#include <stdexcept>

namespace flashopt::ptxemu {

using namespace detail;

void Executor::runWarp(uint32_t live) {
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

void Executor::execute(const Inst &I, uint32_t m, uint32_t active,
                       uint32_t live) {
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
  case Op::Redux: {
    if (m == 0)
      return;
    checkMemberMask(I, m, live, I.o[2], "redux.sync");
    uint32_t acc = uint32_t(rd(A, __builtin_ctz(m)));
    lanes(m, [&](int l) {
      uint32_t v = uint32_t(rd(A, l));
      switch (I.redux) {
      case ReduxKind::And: acc &= v; break;
      case ReduxKind::Or: acc |= v; break;
      case ReduxKind::Xor: acc = l == __builtin_ctz(m) ? v : acc ^ v; break;
      case ReduxKind::Add: acc = l == __builtin_ctz(m) ? v : acc + v; break;
      case ReduxKind::Min:
        acc = I.t == T::S32 ? uint32_t(std::min(int32_t(acc), int32_t(v)))
                            : std::min(acc, v);
        break;
      case ReduxKind::Max:
        acc = I.t == T::S32 ? uint32_t(std::max(int32_t(acc), int32_t(v)))
                            : std::max(acc, v);
        break;
      case ReduxKind::None: break;
      }
    });
    lanes(m, [&](int l) { wr(dreg, l, acc); });
    return;
  }
  case Op::Shfl: {
    ++stats.shuffles;
    if (m == 0)
      return;
    checkMemberMask(I, m, live, I.o[4], "shfl.sync");
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
    executeArith(I, m);
    return;
  }
}

void Executor::checkMemberMask(const Inst &I, uint32_t m, uint32_t live,
                               const Operand &mask, const char *name) {
  const std::string n(name);
  const uint32_t member = uint32_t(rd(mask, __builtin_ctz(m)));
  lanes(m, [&](int l) {
    if (uint32_t(rd(mask, l)) != member)
      fault(I, l, n + " member masks differ across lanes");
  });
  if ((m & ~member) != 0)
    fault(I, __builtin_ctz(m & ~member),
          n + " executed by a lane outside its member mask");
  if ((member & live & ~m) != 0)
    fault(I, __builtin_ctz(member & live & ~m),
          n + ": a lane named in the member mask does not execute it "
              "(divergence or predication)");
}

void Executor::run() {
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