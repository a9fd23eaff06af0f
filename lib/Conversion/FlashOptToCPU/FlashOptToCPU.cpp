//===- FlashOptToCPU.cpp - flashopt-to-cpu ---------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Lowers each `flashopt.kernel` to a host function with the kernel ABI of
/// docs/KERNEL-ABI.md. A group is one vector of G lanes; the partial last
/// group of a tensor takes the masked path; with interleave=N, runs of N full
/// groups share an iteration.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/GroupBodyLowering.h"
#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/Support/MathExtras.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTTOCPU
#include "flashopt/Conversion/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

LogicalResult lowerKernel(KernelOp kernel, int64_t interleave,
                          int64_t reduceLanes) {
  OpBuilder b(kernel);
  Location loc = kernel.getLoc();
  Type i64 = b.getI64Type();
  Type idx = b.getIndexType();
  int64_t groupSize = kernel.getGroupSize();
  int64_t numBuffers = kernel.getBuffers().size();
  int64_t recordWords = kTableHeaderWords + numBuffers;
  int64_t numHypers = kernel.getHypers().size();

  auto fnType = b.getFunctionType({i64, i64, i64, i64, i64, i64}, {});
  auto fn = func::FuncOp::create(b, loc, kernel.getSymName(), fnType);
  for (NamedAttribute attr : kernel->getDiscardableAttrs())
    fn->setAttr(attr.getName(), attr.getValue());
  Block *entry = fn.addEntryBlock();
  OpBuilder fb = OpBuilder::atBlockEnd(entry);
  Value table = entry->getArgument(0), ntensors = entry->getArgument(1),
        hypers = entry->getArgument(2), step = entry->getArgument(3),
        groupBegin = entry->getArgument(4), groupEnd = entry->getArgument(5);

  auto cIdx = [&](OpBuilder &ob, int64_t v) -> Value {
    return arith::ConstantIndexOp::create(ob, loc, v);
  };
  auto cI64 = [&](OpBuilder &ob, int64_t v) -> Value {
    return arith::ConstantOp::create(ob, loc, ob.getI64IntegerAttr(v));
  };

  Value zero = cIdx(fb, 0), one = cIdx(fb, 1);
  Value nt = arith::IndexCastOp::create(fb, loc, idx, ntensors);
  auto tensorLoop = scf::ForOp::create(fb, loc, zero, nt, one);
  {
    OpBuilder lb = OpBuilder::atBlockBegin(tensorLoop.getBody());
    Value t = tensorLoop.getInductionVar();
    Value rec = arith::MulIOp::create(lb, loc, t, cIdx(lb, recordWords));
    auto word = [&](OpBuilder &ob, int64_t w) {
      Value i = arith::AddIOp::create(ob, loc, rec, cIdx(ob, w));
      return loadI64(ob, loc, table, i);
    };
    Value numel = word(lb, ::flashopt::abi::kRecordNumel);
    Value first = word(lb, ::flashopt::abi::kRecordFirstGroup);
    Value slot = word(lb, ::flashopt::abi::kRecordHyperSlot);
    Value gs = cI64(lb, groupSize);
    Value numelPlus =
        arith::AddIOp::create(lb, loc, numel, cI64(lb, groupSize - 1));
    Value ngroups = arith::DivUIOp::create(lb, loc, numelPlus, gs);
    Value last = arith::AddIOp::create(lb, loc, first, ngroups);
    Value lo = arith::MaxSIOp::create(lb, loc, groupBegin, first);
    Value hi = arith::MinSIOp::create(lb, loc, groupEnd, last);
    Value any =
        arith::CmpIOp::create(lb, loc, arith::CmpIPredicate::slt, lo, hi);
    auto ifOp = scf::IfOp::create(lb, loc, any, /*withElse=*/false);
    OpBuilder ib = ifOp.getThenBodyBuilder();

    // Per-tensor prologue: hyper-parameters of this tensor's slot.
    Value slotOffset =
        arith::MulIOp::create(ib, loc, slot, cI64(ib, numHypers * 4));
    Value hyperBase = arith::AddIOp::create(ib, loc, hypers, slotOffset);
    IRMapping mapping;
    emitPrologue(ib, kernel, hyperBase, step, mapping);

    GroupBodyEnv env;
    env.width = groupSize;
    env.maxAlignment = 1; // Caller buffers need only element alignment.
    SmallVector<Value> bases;
    for (int64_t bIdx = 0; bIdx < numBuffers; ++bIdx)
      bases.push_back(word(ib, kTableHeaderWords + bIdx));
    env.baseAddress = [bases](OpBuilder &, Location, int64_t buffer) {
      return bases[buffer];
    };
    Value numelIdx = arith::IndexCastOp::create(ib, loc, idx, numel);
    env.numElements = numelIdx;
    if (usesElementOffset(kernel))
      env.elementOffset = word(ib, ::flashopt::abi::kRecordElementOffset);

    Value loLocal = arith::SubIOp::create(ib, loc, lo, first);
    Value hiLocal = arith::SubIOp::create(ib, loc, hi, first);
    Value loIdx = arith::IndexCastOp::create(ib, loc, idx, loLocal);
    Value hiIdx = arith::IndexCastOp::create(ib, loc, idx, hiLocal);
    LogicalResult result = success();
    Value from = loIdx;
    if (interleave > 1) {
      // Runs of `interleave` full groups: [lo, runEnd), one run per
      // iteration, every body unmasked.
      Value fullGroups =
          arith::DivUIOp::create(ib, loc, numelIdx, cIdx(ib, groupSize));
      Value hiFull = arith::MinSIOp::create(ib, loc, hiIdx, fullGroups);
      Value span = arith::MaxSIOp::create(
          ib, loc, arith::SubIOp::create(ib, loc, hiFull, loIdx), zero);
      Value runs = arith::DivUIOp::create(ib, loc, span, cIdx(ib, interleave));
      Value runEnd = arith::AddIOp::create(
          ib, loc, loIdx,
          arith::MulIOp::create(ib, loc, runs, cIdx(ib, interleave)));
      auto runLoop =
          scf::ForOp::create(ib, loc, loIdx, runEnd, cIdx(ib, interleave));
      OpBuilder rb = OpBuilder::atBlockBegin(runLoop.getBody());
      SmallVector<GroupBodyEnv> envs;
      for (int64_t k = 0; k < interleave; ++k) {
        GroupBodyEnv groupEnv = env;
        groupEnv.predication = Predication::None;
        groupEnv.groupIndex = arith::AddIOp::create(
            rb, loc, runLoop.getInductionVar(), cIdx(rb, k));
        groupEnv.elementIndex = arith::MulIOp::create(
            rb, loc, groupEnv.groupIndex, cIdx(rb, groupSize));
        envs.push_back(groupEnv);
      }
      if (failed(emitGroupBodies(rb, kernel, envs, mapping, reduceLanes)))
        return failure();
      from = runEnd;
    }
    // One group per iteration: the rest of the full groups, then the
    // partial last group of the tensor (masked).
    auto groupLoop = scf::ForOp::create(ib, loc, from, hiIdx, cIdx(ib, 1));
    OpBuilder gb = OpBuilder::atBlockBegin(groupLoop.getBody());
    Value g = groupLoop.getInductionVar();
    Value elem = arith::MulIOp::create(gb, loc, g, cIdx(gb, groupSize));
    env.groupIndex = g;
    env.elementIndex = elem;
    Value end = arith::AddIOp::create(gb, loc, elem, cIdx(gb, groupSize));
    Value full = arith::CmpIOp::create(gb, loc, arith::CmpIPredicate::sle, end,
                                       numelIdx);
    scf::IfOp::create(
        gb, loc, full,
        [&](OpBuilder &tb, Location l) {
          GroupBodyEnv fullEnv = env;
          fullEnv.predication = Predication::None;
          if (failed(emitGroupBody(tb, kernel, fullEnv, mapping)))
            result = failure();
          scf::YieldOp::create(tb, l);
        },
        [&](OpBuilder &eb, Location l) {
          GroupBodyEnv tailEnv = env;
          tailEnv.predication = Predication::Masked;
          if (failed(emitGroupBody(eb, kernel, tailEnv, mapping)))
            result = failure();
          scf::YieldOp::create(eb, l);
        });
    if (failed(result))
      return failure();
  }
  func::ReturnOp::create(fb, loc);
  kernel.erase();
  return success();
}

struct FlashOptToCPUPass
    : mlir::flashopt::impl::FlashOptToCPUBase<FlashOptToCPUPass> {
  using Base::Base;
  void runOnOperation() override {
    if (interleave < 1) {
      mlir::emitError(getOperation().getLoc())
          << "flashopt-to-cpu: interleave must be >= 1, got "
          << static_cast<int64_t>(interleave);
      return signalPassFailure();
    }
    if (reduceLanes < 0 ||
        (reduceLanes > 0 && !llvm::isPowerOf2_64(uint64_t(reduceLanes)))) {
      mlir::emitError(getOperation().getLoc())
          << "flashopt-to-cpu: reduce-lanes must be 0 or a power of two, got "
          << static_cast<int64_t>(reduceLanes);
      return signalPassFailure();
    }
    SmallVector<KernelOp> kernels;
    getOperation().walk([&](KernelOp k) { kernels.push_back(k); });
    for (KernelOp k : kernels)
      if (failed(lowerKernel(k, interleave, reduceLanes)))
        return signalPassFailure();
  }
};

} // namespace
