//===- PtxExecutor.h - the SIMT executor's state ----------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The SIMT executor of the PTX interpreter (internal): one launch's
/// registers (32 lanes per warp), the current block and warp, and the
/// operand, memory and fault helpers the instruction semantics share. The
/// warp scheduler, divergence and the data-movement instructions are in
/// PtxExecutor.cpp; integer, comparison, float and conversion instructions
/// in PtxExecuteArith.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_PTXEMU_PTXEXECUTOR_H
#define FLASHOPT_PTXEMU_PTXEXECUTOR_H

#include "PtxArith.h"
#include "PtxInternal.h"

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace flashopt::ptxemu::detail {

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


  /// Runs the lanes `live` of the current warp to completion: a stack of
  /// (mask, pc, reconvergence pc) entries, divergent branches split at the
  /// parser's post-dominators.
  void runWarp(uint32_t live);
  /// One instruction for the lanes `m` (guard applied) of a warp whose
  /// active lanes are `active` and whose unexited lanes are `live`: data
  /// movement here (PtxExecutor.cpp), the rest through executeArith.
  void execute(const Inst &I, uint32_t m, uint32_t active, uint32_t live);
  /// The member mask of a warp-synchronous instruction (`name`): one value
  /// across the executing lanes `m`, holding each of them and every live
  /// lane (a live lane named in it that does not execute it, by divergence
  /// or predication, is a fault).
  void checkMemberMask(const Inst &I, uint32_t m, uint32_t live, const Operand &mask,
                       const char *name);
  /// Integer, comparison, float and conversion instructions
  /// (PtxExecuteArith.cpp).
  void executeArith(const Inst &I, uint32_t m);
  /// Every block and warp of the launch, one after the other.
  void run();
};

} // namespace flashopt::ptxemu::detail

#endif // FLASHOPT_PTXEMU_PTXEXECUTOR_H
