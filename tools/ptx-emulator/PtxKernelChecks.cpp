//===- PtxKernelChecks.cpp - checks and analyses of a parsed kernel ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What the PTX interpreter's parser (PtxParser.cpp) runs on what it parsed:
/// the operand counts and kinds of every instruction, and each branch's
/// reconvergence point (the immediate post-dominator the SIMT executor
/// rejoins diverged lanes at); and what launch() checks of a launch.
///
//===----------------------------------------------------------------------===//

#include "PtxInternal.h"

#include <algorithm>
#include <string>
#include <vector>

namespace flashopt::ptxemu {

namespace detail {

/// Operand counts and kinds per instruction.
void checkOperands(Inst &I) {
  auto bad = [&](const std::string &why) {
    fail(I.line, I.opcode + ": " + why);
  };
  auto isRegOrImm = [](const Operand &o) {
    return o.kind == Operand::Reg || o.kind == Operand::Imm;
  };
  auto count = [&](int n) {
    if (I.nops != n)
      bad("expected " + std::to_string(n) + " operands");
  };
  auto dstReg = [&](int i) {
    if (I.o[i].kind != Operand::Reg)
      bad("operand " + std::to_string(i + 1) + " must be a register");
  };
  auto srcs = [&](int from, int to) {
    for (int i = from; i < to; ++i)
      if (!isRegOrImm(I.o[i]))
        bad("operand " + std::to_string(i + 1) +
            " must be a register or an immediate");
  };
  switch (I.op) {
  case Op::Mov:
    count(2);
    if (I.o[0].kind == Operand::Vec) {
      if (I.o[1].kind != Operand::Reg)
        bad("unpacking needs a register source");
      for (int i = 0; i < I.o[0].nvec; ++i)
        if (I.o[0].vec[i] == -2)
          bad("an immediate in a vector destination");
    } else {
      dstReg(0);
      if (I.o[1].kind == Operand::Vec) {
        for (int i = 0; i < I.o[1].nvec; ++i)
          if (I.o[1].vec[i] == -1)
            bad("sink in a packing source");
      } else if (!isRegOrImm(I.o[1]) && I.o[1].kind != Operand::Spec) {
        bad("source must be a register, immediate, vector or special "
            "register");
      }
    }
    if (I.o[0].kind == Operand::Vec || I.o[1].kind == Operand::Vec) {
      const Operand &v = I.o[0].kind == Operand::Vec ? I.o[0] : I.o[1];
      if (v.nvec != 2 && v.nvec != 4)
        bad("vector of 2 or 4 elements expected");
      if (bitsOf(I.t) / v.nvec < 8)
        bad("vector elements too narrow");
    }
    break;
  case Op::Ld:
    count(2);
    if (I.o[1].kind != Operand::Mem)
      bad("second operand must be an address");
    if (I.space == Space::Param && I.o[1].reg >= 0)
      bad("ld.param through a register address is not implemented");
    if (I.space == Space::Global && I.o[1].reg < 0)
      bad("ld.global from a parameter symbol");
    if (I.vec == 1)
      dstReg(0);
    else if (I.o[0].kind != Operand::Vec || I.o[0].nvec != I.vec)
      bad("vector destination of the load's width expected");
    else
      for (int i = 0; i < I.vec; ++i)
        if (I.o[0].vec[i] == -2)
          bad("an immediate in a vector destination");
    break;
  case Op::St:
    count(2);
    if (I.o[0].kind != Operand::Mem || I.o[0].reg < 0)
      bad("first operand must be a register address");
    if (I.vec == 1)
      srcs(1, 2);
    else if (I.o[1].kind != Operand::Vec || I.o[1].nvec != I.vec)
      bad("vector source of the store's width expected");
    else
      for (int i = 0; i < I.vec; ++i)
        if (I.o[1].vec[i] == -1)
          bad("sink in a store source");
    break;
  case Op::Selp:
    count(4);
    dstReg(0);
    srcs(1, 4);
    break;
  case Op::SetpI:
  case Op::SetpF:
    count(3);
    dstReg(0);
    srcs(1, 3);
    break;
  case Op::MadLo:
  case Op::MadWide:
  case Op::FmaF:
  case Op::Bfe:
  case Op::Prmt:
    count(4);
    dstReg(0);
    srcs(1, 4);
    break;
  case Op::Bfi:
    count(5);
    dstReg(0);
    srcs(1, 5);
    break;
  case Op::NegI:
  case Op::AbsI:
  case Op::Not:
  case Op::SqrtF:
  case Op::RcpF:
  case Op::AbsF:
  case Op::NegF:
    count(2);
    dstReg(0);
    srcs(1, 2);
    break;
  case Op::Cvt:
    if (I.t == T::F16X2 || I.t == T::BF16X2) {
      count(3);
      srcs(1, 3);
    } else {
      count(2);
      srcs(1, 2);
    }
    dstReg(0);
    break;
  case Op::Shfl:
    count(5);
    dstReg(0);
    srcs(1, 5);
    break;
  case Op::Redux:
    count(3);
    dstReg(0);
    srcs(1, 3);
    break;
  case Op::Bra:
    count(1);
    if (I.o[0].kind != Operand::Label)
      bad("branch target must be a label");
    break;
  case Op::Ret:
    count(0);
    break;
  default:
    count(3);
    dstReg(0);
    srcs(1, 3);
    break;
  }
}

} // namespace detail

using namespace detail;

/// Immediate post-dominators of every branch, over basic blocks with a
/// virtual exit (pc = code size) reached by ret.
void computeReconvergence(KernelImpl &k) {
  const int n = int(k.code.size());
  std::vector<int> leader(n + 1, 0);
  leader[0] = 1;
  for (int i = 0; i < n; ++i) {
    const Inst &I = k.code[i];
    if (I.op == Op::Bra) {
      leader[I.o[0].target] = 1;
      if (i + 1 <= n)
        leader[i + 1] = 1;
    } else if (I.op == Op::Ret && i + 1 <= n) {
      leader[i + 1] = 1;
    }
  }
  std::vector<int> blockStart, blockOf(n + 1, -1);
  for (int i = 0; i < n; ++i) {
    if (leader[i])
      blockStart.push_back(i);
    blockOf[i] = int(blockStart.size()) - 1;
  }
  const int nb = int(blockStart.size());
  const int exitB = nb;
  blockOf[n] = exitB;
  std::vector<std::vector<int>> succ(nb);
  for (int b = 0; b < nb; ++b) {
    int last = (b + 1 < nb ? blockStart[b + 1] : n) - 1;
    const Inst &I = k.code[last];
    if (I.op == Op::Bra) {
      succ[b].push_back(blockOf[I.o[0].target]);
      if (I.guard >= 0)
        succ[b].push_back(blockOf[last + 1]);
    } else if (I.op == Op::Ret) {
      succ[b].push_back(exitB);
      if (I.guard >= 0)
        succ[b].push_back(blockOf[last + 1]);
    } else {
      succ[b].push_back(blockOf[last + 1]);
    }
  }
  // pdom sets as bit vectors.
  const int words = (nb + 1 + 63) / 64;
  std::vector<std::vector<uint64_t>> pdom(nb + 1,
                                          std::vector<uint64_t>(words, ~0ull));
  std::fill(pdom[exitB].begin(), pdom[exitB].end(), 0);
  pdom[exitB][exitB / 64] |= 1ull << (exitB % 64);
  bool changed = true;
  while (changed) {
    changed = false;
    for (int b = nb - 1; b >= 0; --b) {
      std::vector<uint64_t> s(words, ~0ull);
      for (int x : succ[b])
        for (int w = 0; w < words; ++w)
          s[w] &= pdom[x][w];
      s[b / 64] |= 1ull << (b % 64);
      if (s != pdom[b]) {
        pdom[b] = s;
        changed = true;
      }
    }
  }
  auto size = [&](int b) {
    int c = 0;
    for (uint64_t w : pdom[b])
      c += __builtin_popcountll(w);
    return c;
  };
  for (int i = 0; i < n; ++i) {
    Inst &I = k.code[i];
    if (I.op != Op::Bra && I.op != Op::Ret)
      continue;
    int b = blockOf[i];
    int want = size(b) - 1, ip = -1;
    for (int d = 0; d <= nb; ++d)
      if (d != b && (pdom[b][d / 64] >> (d % 64) & 1) && size(d) == want)
        ip = d;
    I.reconverge = ip < 0 || ip == exitB ? n : blockStart[ip];
  }
}

std::string launchError(const KernelImpl &k, const LaunchDims &dims,
                        size_t paramBytes) {
  if (paramBytes < k.paramBytes)
    return k.name + ": parameter buffer too small";
  for (int i = 0; i < 3; ++i)
    if (dims.grid[i] == 0 || dims.block[i] == 0)
      return k.name + ": empty grid or block";
  if (dims.block[0] * dims.block[1] * dims.block[2] > 1024)
    return k.name + ": more than 1024 threads per block";
  if (!k.ntidLimit[0])
    return {};
  bool bad = false;
  for (int i = 0; i < 3; ++i)
    bad |= k.ntidExact ? dims.block[i] != k.ntidLimit[i]
                       : dims.block[i] > k.ntidLimit[i];
  if (!bad)
    return {};
  return k.name + ": block (" + std::to_string(dims.block[0]) + "," +
         std::to_string(dims.block[1]) + "," + std::to_string(dims.block[2]) +
         ") violates its " + (k.ntidExact ? ".reqntid " : ".maxntid ") +
         std::to_string(k.ntidLimit[0]) + ", " +
         std::to_string(k.ntidLimit[1]) + ", " +
         std::to_string(k.ntidLimit[2]);
}

} // namespace flashopt::ptxemu
