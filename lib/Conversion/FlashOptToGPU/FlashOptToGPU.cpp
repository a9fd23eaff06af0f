//===- FlashOptToGPU.cpp - flashopt-to-gpu --------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Lowers each `flashopt.kernel` to a `gpu.func` in a `gpu.module` of its
/// own, with the kernel ABI of docs/KERNEL-ABI.md. Each thread moves 16
/// bytes of the widest per-element stream (W elements); a group of G
/// elements spans G/W consecutive lanes of a warp, so the group absmax is a
/// log2(G/W)-step xor butterfly. Blocks of 256 threads walk the global group
/// range with a warp-uniform grid-stride loop; every lane of a warp runs
/// every iteration (inactive lanes predicated), so all 32 lanes reach every
/// shuffle. One launch covers every tensor of the table (multi-tensor):
/// a lane finds its group's table record by a binary search, and computes
/// that record's prologue (hyper-parameters, per-step scalars), only when
/// its group leaves the record it looked up last; the loop carries the
/// record and the prologue values, so a lane in a large tensor does both
/// once per launch, not once per group.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/GroupBodyLowering.h"
#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "mlir/IR/Matchers.h"

#include "llvm/ADT/SetVector.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTTOGPU
#include "flashopt/Conversion/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

constexpr int64_t kWarpSize = 32;
/// The fewest elements per thread the access width is reduced to.
constexpr int64_t kMinElementsPerThread = 4;

/// Elements per thread: `bytes` bytes of the widest per-element buffer.
int64_t elementsPerThread(KernelOp kernel, int64_t bytes) {
  int64_t widest = 1;
  for (Attribute a : kernel.getBuffers()) {
    auto b = cast<BufferAttr>(a);
    if (b.getRate() == BufferRate::element)
      widest = std::max<int64_t>(
          widest, (b.getElementType().getIntOrFloatBitWidth() + 7) / 8);
  }
  return std::max<int64_t>(1, bytes / widest);
}

/// Bytes per thread access when the pass is not told: 16 (128-bit
/// accesses) unless the per-element arithmetic is heavy. IEEE divisions and
/// square roots are long instruction sequences with several temporaries
/// each; W elements of them in flight need more than 64 registers when
/// W x (divisions + square roots) exceeds the chip's budget
/// (gpuHeavyBudget). Such kernels halve the access width, down to 4
/// elements per thread; accesses stay coalesced (a warp covers a contiguous
/// span of every stream).
///
/// With a wide budget (flashopt-gpu-pipeline sets it per chip), a kernel over
/// the 64-register budget keeps 16 bytes when W x heavy fits the wide budget,
/// and gets `wideRegisters` instead of 64 (the Adam family: 8 elements per
/// thread at up to 104 registers, 2 blocks of 256 per SM, the same 4096
/// elements in flight per SM as 4 blocks at 4 elements; per-iteration work
/// — the record, the table's buffer pointers, addresses, loop control — is
/// shared by twice the elements: sm_90 AdamW-24 174.0 -> 155.8 SASS per
/// element, no spills).
struct LaneChoice {
  int64_t bytes = 16;
  /// Over the heavy budget, within the wide one: the wide register cap.
  bool wide = false;
};
/// Heavy operations per element from which a kernel takes the wide cap.
constexpr int64_t kWideAtLeast = 5;

LaneChoice chooseLanes(KernelOp kernel, int64_t heavyBudget,
                       int64_t wideBudget) {
  int64_t heavy = 0;
  getGroupBody(kernel).walk([&](Operation *op) {
    if (isa<arith::DivFOp, math::SqrtOp>(op))
      ++heavy;
  });
  int64_t quantizedStates = 0;
  getGroupBody(kernel).walk([&](StoreGroupOp) { ++quantizedStates; });
  LaneChoice c;
  // The Adam family (5 or more such operations per element, or two
  // quantized states: the minifloat codes of docs/NUMERICS.md §2d leave
  // Adam 4 divisions and roots, yet its two encodes in flight spilled
  // 100-180 bytes at 64 registers on sm_80 and sm_90) takes the wide cap
  // even where W x heavy fits the budget: with f32 parameters (W = 4) it
  // spilled 8-36 bytes at 64 registers (adamw_f32 with the bounded
  // numerics' dither on sm_90; adam(w)_f32_fast on every chip).
  bool adamFamily = heavy >= kWideAtLeast || quantizedStates >= 2;
  if (elementsPerThread(kernel, c.bytes) * heavy <= heavyBudget &&
      !(adamFamily && wideBudget > 0))
    return c;
  if (elementsPerThread(kernel, c.bytes) * heavy <= wideBudget) {
    c.wide = true;
    return c;
  }
  while (elementsPerThread(kernel, c.bytes) > kMinElementsPerThread &&
         elementsPerThread(kernel, c.bytes) * heavy > heavyBudget)
    c.bytes /= 2;
  return c;
}

/// Whether the grid-stride loop carries the prologue values from one
/// iteration to the next rather than recomputing them per group. Worth its
/// registers only where the prologue is long: β^t (flashopt.powi, a loop in
/// double-double) costs ~10 SASS per element at 4 elements per lane when
/// recomputed, and the Adam family has registers to spare under the 64 cap
/// (56 -> 63 on sm_90, the same 4 blocks of 256 per SM); the short prologues
/// of SGD and Lion cost fewer instructions than carrying them costs
/// registers (48 -> 56: 5 -> 4 blocks per SM), so they are recomputed.
bool carryPrologue(KernelOp kernel) {
  for (Operation &op : kernel.getBody().front())
    if (isa<PowIOp>(op))
      return true;
  return false;
}

/// One flashopt.kernel lowered to a gpu.func, in named phases:
///
///   createFunction -> threadCoordinates -> chooseCarried ->
///   beginGridStrideLoop -> lookupRecord (binary search, prologue) ->
///   emitBody (the group body for this lane's elements)
///
/// The order in which the phases create operations is the kernels' IR (and
/// so their PTX): a phase may not be reordered without changing every
/// bundle.
class GpuKernelLowering {
public:
  GpuKernelLowering(KernelOp kernel, int64_t blockSize, int64_t bytesPerThread,
                    int64_t maxRegisters, bool fullWarpPath, bool sharedBases)
      : kernel(kernel), loc(kernel.getLoc()), fullWarpPath(fullWarpPath),
        sharedBases(sharedBases),
        blockSize(blockSize),
        maxRegisters(maxRegisters), groupSize(kernel.getGroupSize()),
        width(gpuElementsPerThread(kernel, bytesPerThread)),
        lanesPerGroup(groupSize / width), groupsPerWarp(kWarpSize / lanesPerGroup),
        recordWords(kTableHeaderWords +
                    int64_t(kernel.getBuffers().size())),
        numHypers(kernel.getHypers().size()) {}

  LogicalResult run() {
    if (lanesPerGroup > kWarpSize)
      return kernel.emitOpError()
             << "group size " << groupSize << " spans more than one warp at "
             << width << " elements per thread";
    createFunction();
    threadCoordinates();
    chooseCarried();
    beginGridStrideLoop();
    lookupRecord();
    if (failed(emitBody()))
      return failure();
    OpBuilder rb = OpBuilder::atBlockEnd(entry);
    gpu::ReturnOp::create(rb, loc);
    kernel.erase();
    return success();
  }

private:
  Value cIdx(OpBuilder &ob, int64_t v) {
    return arith::ConstantIndexOp::create(ob, loc, v);
  }
  Value cI64(OpBuilder &ob, int64_t v) {
    return arith::ConstantOp::create(ob, loc, ob.getI64IntegerAttr(v));
  }

  /// The gpu.module and gpu.func of the kernel ABI (docs/KERNEL-ABI.md):
  /// (table, ntensors, hypers, step, group begin, group end).
  void createFunction() {
    auto module = kernel->getParentOfType<ModuleOp>();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(kernel.getContext()));
    OpBuilder b(kernel);
    auto gpuModule =
        gpu::GPUModuleOp::create(b, loc, (kernel.getSymName() + "_gpu").str());
    OpBuilder mb = OpBuilder::atBlockBegin(gpuModule.getBody());
    Type i64 = b.getI64Type();
    auto fnType = b.getFunctionType({i64, i64, i64, i64, i64, i64}, {});
    auto fn = gpu::GPUFuncOp::create(mb, loc, kernel.getSymName(), fnType);
    fn->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
    fn.setKnownBlockSizeAttr(
        b.getDenseI32ArrayAttr({int32_t(blockSize), 1, 1}));
    for (NamedAttribute attr : kernel->getDiscardableAttrs())
      fn->setAttr(attr.getName(), attr.getValue());
    if (maxRegisters > 0)
      fn->setAttr(kMaxRegistersAttrName, b.getI32IntegerAttr(maxRegisters));
    entry = &fn.getBody().front();
    fb = OpBuilder::atBlockBegin(entry);
    table = entry->getArgument(0);
    ntensors = entry->getArgument(1);
    hypers = entry->getArgument(2);
    step = entry->getArgument(3);
    groupBegin = entry->getArgument(4);
    groupEnd = entry->getArgument(5);
  }

  /// Thread coordinates: the lane's segment (which group of its warp's
  /// groupsPerWarp), its place in the group, the grid stride, the first
  /// group of its warp.
  void threadCoordinates() {
    Type idx = fb.getIndexType();
    Value tid = gpu::ThreadIdOp::create(fb, loc, gpu::Dimension::x);
    Value bid = gpu::BlockIdOp::create(fb, loc, gpu::Dimension::x);
    Value gdim = gpu::GridDimOp::create(fb, loc, gpu::Dimension::x);
    Value gtid = arith::AddIOp::create(
        fb, loc, arith::MulIOp::create(fb, loc, bid, cIdx(fb, blockSize)), tid);
    Value lane = arith::RemUIOp::create(fb, loc, tid, cIdx(fb, kWarpSize));
    Value warp = arith::DivUIOp::create(fb, loc, gtid, cIdx(fb, kWarpSize));
    segment = arith::DivUIOp::create(fb, loc, lane, cIdx(fb, lanesPerGroup));
    laneInGroup =
        arith::RemUIOp::create(fb, loc, lane, cIdx(fb, lanesPerGroup));
    Value warpsPerGrid =
        arith::MulIOp::create(fb, loc, gdim, cIdx(fb, blockSize / kWarpSize));
    stride =
        arith::MulIOp::create(fb, loc, warpsPerGrid, cIdx(fb, groupsPerWarp));
    Value beginIdx = arith::IndexCastOp::create(fb, loc, idx, groupBegin);
    endIdx = arith::IndexCastOp::create(fb, loc, idx, groupEnd);
    ntIdx = arith::IndexCastOp::create(fb, loc, idx, ntensors);
    start = arith::AddIOp::create(
        fb, loc, beginIdx,
        arith::MulIOp::create(fb, loc, warp, cIdx(fb, groupsPerWarp)));
    isLeader = arith::CmpIOp::create(fb, loc, arith::CmpIPredicate::eq,
                                     laneInGroup, cIdx(fb, 0));
  }

  /// The prologue values the group body uses (hyper-parameters, per-step
  /// scalars), when they are carried (carryPrologue): computed once per
  /// table record and lane, not once per group. With carried prologue
  /// values, the record-uniform part of the dither (docs/NUMERICS.md §8),
  /// element offset * A + H(step), is carried too, one per step operand
  /// (dither stream, §2e): computed once per record, it leaves one
  /// multiply-add per worker in place of the offset's load and the step's
  /// hash.
  void chooseCarried() {
    carry = carryPrologue(kernel);
    if (carry && usesElementOffset(kernel)) {
      carryDither = true;
      getGroupBody(kernel).walk([&](DitherOp d) {
        if (!llvm::is_contained(ditherSteps, d.getStep()))
          ditherSteps.push_back(d.getStep());
      });
    }
    if (carry) {
      GroupBodyOp body = getGroupBody(kernel);
      llvm::SetVector<Value> used;
      body.walk([&](Operation *op) {
        for (Value v : op->getOperands())
          if (!body->isAncestor(v.getParentRegion()->getParentOp()) &&
              !matchPattern(v, m_Constant()) &&
              !(carryDither && isa<DitherOp>(op)))
            used.insert(v);
      });
      prologueValues.assign(used.begin(), used.end());
    }
  }

  /// The f32 hyper table of a record's parameter group.
  Value hyperBaseOf(OpBuilder &ob, Value rec) {
    Value slot =
        loadI64(ob, loc, table,
                arith::AddIOp::create(
                    ob, loc, rec, cIdx(ob, ::flashopt::abi::kRecordHyperSlot)));
    Value slotOffset =
        arith::MulIOp::create(ob, loc, slot, cI64(ob, numHypers * 4));
    return arith::AddIOp::create(ob, loc, hypers, slotOffset);
  }

  /// Warp-uniform grid-stride loop over the first group of each warp. It
  /// carries the last record a lane looked up — its group range [lo, hi),
  /// its word offset and element count — and (carryPrologue) that record's
  /// prologue values: a lane searches the table and recomputes the prologue
  /// only when its group leaves that range (once per tensor and lane in a
  /// large tensor; the branch diverges, and holds no cross-lane operation).
  /// Index-typed (32-bit on the GPU, docs/ARCHITECTURE.md "Index width"):
  /// the carried record costs four registers. Ends with the scf.if whose
  /// then-block lookupRecord fills.
  void beginGridStrideLoop() {
    Value zero = cIdx(fb, 0);
    SmallVector<Value> init;
    if (carry) {
      init = {zero, zero, zero, zero};
      for (Value v : prologueValues)
        init.push_back(arith::ConstantOp::create(fb, loc, v.getType(),
                                                 fb.getZeroAttr(v.getType())));
      if (carryDither)
        for (size_t i = 0; i < ditherSteps.size(); ++i)
          init.push_back(arith::ConstantOp::create(
              fb, loc, fb.getI32Type(), fb.getI32IntegerAttr(0)));
    }
    loop = scf::ForOp::create(fb, loc, start, endIdx, stride, init);
    lb = OpBuilder::atBlockBegin(loop.getBody());
    Value g = arith::AddIOp::create(lb, loc, loop.getInductionVar(), segment);
    active =
        arith::CmpIOp::create(lb, loc, arith::CmpIPredicate::ult, g, endIdx);
    Value lastGroup = arith::SubIOp::create(lb, loc, endIdx, cIdx(lb, 1));
    gc = arith::SelectOp::create(lb, loc, active, g, lastGroup);
    gc64 = arith::IndexCastOp::create(lb, loc, lb.getI64Type(), gc);
    // Without carried values the lookup runs every iteration (the condition
    // is a constant and the canonicalizer removes the branch).
    SmallVector<Value> carried(loop.getRegionIterArgs().begin(),
                               loop.getRegionIterArgs().end());
    Value miss;
    if (carry) {
      Value below = arith::CmpIOp::create(lb, loc, arith::CmpIPredicate::slt,
                                          gc, carried[0]);
      Value beyond = arith::CmpIOp::create(lb, loc, arith::CmpIPredicate::sge,
                                           gc, carried[1]);
      miss = arith::OrIOp::create(lb, loc, below, beyond);
    } else {
      miss = arith::ConstantOp::create(lb, loc, lb.getBoolAttr(true));
      carried.assign(4, cIdx(lb, 0));
    }
    SmallVector<Type> carriedTypes =
        llvm::to_vector(ValueRange(carried).getTypes());
    lookup = scf::IfOp::create(lb, loc, carriedTypes, miss,
                               /*addThenBlock=*/true, /*addElseBlock=*/true);
    OpBuilder eb = OpBuilder::atBlockBegin(lookup.elseBlock());
    scf::YieldOp::create(eb, loc, carried);
  }

  /// The lookup's then-block: a binary search for the last tensor whose
  /// first group is <= gc, then that record's group range, words, element
  /// count, carried prologue values and dither base.
  void lookupRecord() {
    OpBuilder tb = OpBuilder::atBlockBegin(lookup.thenBlock());
    Type idx = tb.getIndexType();
    auto firstGroupOf = [&](OpBuilder &ob, Value t) {
      Value w = arith::AddIOp::create(
          ob, loc, arith::MulIOp::create(ob, loc, t, cIdx(ob, recordWords)),
          cIdx(ob, 1));
      return loadI64(ob, loc, table, w);
    };
    Value hi0 = arith::SubIOp::create(tb, loc, ntIdx, cIdx(tb, 1));
    auto search = scf::WhileOp::create(
        tb, loc, TypeRange{idx, idx}, ValueRange{cIdx(tb, 0), hi0},
        [&](OpBuilder &ob, Location l, ValueRange args) {
          Value more = arith::CmpIOp::create(ob, l, arith::CmpIPredicate::ult,
                                             args[0], args[1]);
          scf::ConditionOp::create(ob, l, more, args);
        },
        [&](OpBuilder &ob, Location l, ValueRange args) {
          Value sum = arith::AddIOp::create(ob, l, args[0], args[1]);
          Value mid = arith::DivUIOp::create(
              ob, l, arith::AddIOp::create(ob, l, sum, cIdx(ob, 1)),
              cIdx(ob, 2));
          Value first = firstGroupOf(ob, mid);
          Value le = arith::CmpIOp::create(ob, l, arith::CmpIPredicate::sle,
                                           first, gc64);
          Value lo = arith::SelectOp::create(ob, l, le, mid, args[0]);
          Value hi = arith::SelectOp::create(
              ob, l, le, args[1],
              arith::SubIOp::create(ob, l, mid, cIdx(ob, 1)));
          scf::YieldOp::create(ob, l, ValueRange{lo, hi});
        });
    Value t = search.getResult(0);
    Value rec = arith::MulIOp::create(tb, loc, t, cIdx(tb, recordWords));
    auto word = [&](int64_t w) {
      return loadI64(tb, loc, table,
                     arith::AddIOp::create(tb, loc, rec, cIdx(tb, w)));
    };
    Value numel = word(::flashopt::abi::kRecordNumel);
    Value first = word(::flashopt::abi::kRecordFirstGroup);
    IRMapping mapping;
    if (!prologueValues.empty() || carryDither)
      emitPrologue(tb, kernel, hyperBaseOf(tb, rec), step, mapping);
    Value groups = arith::DivUIOp::create(
        tb, loc, arith::AddIOp::create(tb, loc, numel, cI64(tb, groupSize - 1)),
        cI64(tb, groupSize));
    Value end = arith::AddIOp::create(tb, loc, first, groups);
    SmallVector<Value> results = {
        arith::IndexCastOp::create(tb, loc, idx, first),
        arith::IndexCastOp::create(tb, loc, idx, end), rec,
        arith::IndexCastOp::create(tb, loc, idx, numel)};
    for (Value v : prologueValues)
      results.push_back(mapping.lookupOrDefault(v));
    if (carryDither) {
      Type i32 = tb.getI32Type();
      auto c32 = [&](uint32_t v) {
        return arith::ConstantOp::create(tb, loc,
                                         tb.getI32IntegerAttr(int32_t(v)));
      };
      Value offset = arith::TruncIOp::create(
          tb, loc, i32, word(::flashopt::abi::kRecordElementOffset));
      SmallVector<Value, 2> stepWords;
      for (Value ditherStep : ditherSteps) {
        Value stepI32 = arith::TruncIOp::create(
            tb, loc, i32, mapping.lookupOrDefault(ditherStep));
        stepWords.push_back(DitherOp::emitStepWord(tb, loc, stepI32));
      }
      Value offsetTerm = arith::MulIOp::create(
          tb, loc, offset, c32(DitherOp::kElementMultiplier));
      for (Value stepWord : stepWords)
        results.push_back(arith::AddIOp::create(tb, loc, offsetTerm, stepWord));
    }
    scf::YieldOp::create(tb, loc, results);
  }

  /// The loop body after the lookup: the prologue (when not carried) and
  /// its constants, then the group body for this lane's `width` elements
  /// (GroupBodyLowering), the absmax a butterfly over the group's lanes.
  LogicalResult emitBody() {
    Value first = lookup.getResult(0);
    Value rec = lookup.getResult(2);
    Value numel = lookup.getResult(3);
    IRMapping mapping;
    for (auto [i, v] : llvm::enumerate(prologueValues))
      mapping.map(v, lookup.getResult(4 + i));
    if (!carry)
      emitPrologue(lb, kernel, hyperBaseOf(lb, rec), step, mapping);
    // Prologue constants the body uses: rematerialized, not carried.
    getGroupBody(kernel).walk([&](Operation *op) {
      for (Value v : op->getOperands())
        if (!mapping.contains(v) && matchPattern(v, m_Constant()) &&
            !getGroupBody(kernel)->isAncestor(v.getDefiningOp()))
          lb.clone(*v.getDefiningOp(), mapping);
    });

    GroupBodyEnv env;
    env.width = width;
    env.maxAlignment = 16;
    env.predication = Predication::PerAccess;
    env.packedAsWords = true;
    env.active = active;
    env.isGroupLeader = isLeader;
    Value tableArg = table;
    env.baseAddress = [=](OpBuilder &ob, Location l, int64_t buffer) -> Value {
      Value w = arith::AddIOp::create(
          ob, l, rec,
          arith::ConstantIndexOp::create(ob, l, kTableHeaderWords + buffer));
      return loadI64(ob, l, tableArg, w);
    };
    env.numElements = numel;
    if (carryDither) {
      size_t firstBase = lookup.getNumResults() - ditherSteps.size();
      for (auto [i, step] : llvm::enumerate(ditherSteps))
        env.ditherBases.push_back({step, lookup.getResult(firstBase + i)});
    } else if (usesElementOffset(kernel))
      env.elementOffset = loadI64(
          lb, loc, table,
          arith::AddIOp::create(
              lb, loc, rec, cIdx(lb, ::flashopt::abi::kRecordElementOffset)));
    env.groupIndex = arith::SubIOp::create(lb, loc, gc, first);
    env.elementIndex = arith::AddIOp::create(
        lb, loc,
        arith::MulIOp::create(lb, loc, env.groupIndex, cIdx(lb, groupSize)),
        arith::MulIOp::create(lb, loc, laneInGroup, cIdx(lb, width)));
    int64_t lanes = lanesPerGroup;
    env.combineAcrossWorkers = [lanes](OpBuilder &ob, Location l, Value v) {
      for (int64_t offset = lanes / 2; offset >= 1; offset /= 2) {
        auto shfl =
            gpu::ShuffleOp::create(ob, l, v, int32_t(offset),
                                   int32_t(kWarpSize), gpu::ShuffleMode::XOR);
        Value other = shfl.getShuffleResult();
        v = v.getType().isInteger(32)
                ? arith::MaxUIOp::create(ob, l, v, other).getResult()
                : arith::MaximumFOp::create(ob, l, v, other).getResult();
      }
      return v;
    };
    if (!fullWarpPath) {
      if (failed(emitGroupBody(lb, kernel, env, mapping)))
        return failure();
      if (carry)
        scf::YieldOp::create(lb, loc, lookup.getResults());
      return success();
    }
    // Two copies of the body: without predicates when every lane of the
    // warp holds W valid elements (all but the last iteration of a tensor;
    // one warp-wide AND, redux.sync on sm_80+), and with a plain-or-masked
    // choice around each access otherwise. The branch is uniform across the
    // warp, so every lane reaches the group maximum's shuffles either way.
    Value full = arith::CmpIOp::create(
        lb, loc, arith::CmpIPredicate::sle,
        arith::AddIOp::create(lb, loc, env.elementIndex, cIdx(lb, width)),
        numel);
    full = arith::AndIOp::create(lb, loc, full, active);
    Value warpFull = gpu::SubgroupReduceOp::create(
        lb, loc,
        arith::ExtUIOp::create(lb, loc, lb.getI32Type(), full),
        gpu::AllReduceOperation::AND, /*uniform=*/true,
        /*cluster_size=*/IntegerAttr());
    Value allFull = arith::CmpIOp::create(
        lb, loc, arith::CmpIPredicate::ne, warpFull,
        arith::ConstantOp::create(lb, loc, lb.getI32IntegerAttr(0)));
    LogicalResult emitted = success();
    scf::IfOp::create(
        lb, loc, allFull,
        [&](OpBuilder &tb, Location l) {
          GroupBodyEnv unpredicated = env;
          unpredicated.predication = Predication::None;
          unpredicated.active = Value();
          unpredicated.shareBases = sharedBases;
          if (failed(emitGroupBody(tb, kernel, unpredicated, mapping)))
            emitted = failure();
          scf::YieldOp::create(tb, l);
        },
        [&](OpBuilder &eb, Location l) {
          if (failed(emitGroupBody(eb, kernel, env, mapping)))
            emitted = failure();
          scf::YieldOp::create(eb, l);
        });
    if (failed(emitted))
      return failure();
    if (carry)
      scf::YieldOp::create(lb, loc, lookup.getResults());
    return success();
  }

  KernelOp kernel;
  Location loc;
  bool fullWarpPath, sharedBases;
  int64_t blockSize, maxRegisters, groupSize, width, lanesPerGroup,
      groupsPerWarp, recordWords, numHypers;
  // createFunction
  Block *entry = nullptr;
  OpBuilder fb{kernel.getContext()}; ///< the function's entry block
  Value table, ntensors, hypers, step, groupBegin, groupEnd;
  // threadCoordinates
  Value segment, laneInGroup, stride, endIdx, ntIdx, start, isLeader;
  // chooseCarried
  bool carry = false, carryDither = false;
  /// The step operands of the group body's dithers, one per dither stream.
  SmallVector<Value, 2> ditherSteps;
  SmallVector<Value> prologueValues;
  // beginGridStrideLoop
  scf::ForOp loop;
  OpBuilder lb{kernel.getContext()}; ///< the loop body
  Value active, gc, gc64;
  scf::IfOp lookup;
};

} // namespace

int64_t mlir::flashopt::gpuHeavyBudget(llvm::StringRef chip) {
  // Measured with ptxas 13 (.maxnreg 64), counting the divisions and square
  // roots left after flashopt-gpu's pre-lowering rewrites: AdamW bf16 with
  // 8-bit states (9 per element) takes 80 registers at 8 elements per thread
  // and 56-64 at 4 on every chip. SGD and Lion with exact code decodes (3)
  // take 63-64 with no spills at 8 on every chip (sm_100: 133.5 -> 101.4
  // SASS per element for sgd_bf16_m24 against 4). Their fast variants (4 or
  // 5) spilled 4-20 bytes in five specs on sm_100 at 8, which keeps those
  // at 4 there. The fast Adam family after flashopt-fast-arithmetic's one
  // softsign quotient per code (5: no per-group 1/a left) spilled 88 bytes
  // at 64 registers on sm_80 and sm_90; at 32 it takes the wide budget, as
  // it did with 6.
  return chip == "sm_80" || chip == "sm_90" ? 32 : 24;
}

int64_t mlir::flashopt::gpuWideBudget(llvm::StringRef chip) {
  // ptxas 13 at .maxnreg 104 (gpuWideRegisters), 8 elements per thread:
  // every shipped Adam kernel (9 divisions and roots per element counted
  // before CSE, 72) fits without spills on sm_80, sm_90 and sm_100, the
  // accumulate-fused step included.
  (void)chip;
  return 72;
}

int64_t mlir::flashopt::gpuWideRegisters(llvm::StringRef chip) {
  // 104, not 96: the bounded numerics' dither (docs/NUMERICS.md §8) keeps 8
  // more values live through AdamW-24's two codes, which spilled 12-16
  // bytes on sm_100 at 96. Occupancy is the same: 2 blocks of 256 per SM
  // up to 128 registers (65536 per SM).
  (void)chip;
  return 104;
}

int64_t mlir::flashopt::gpuElementsPerThread(KernelOp kernel,
                                             int64_t bytesPerThread,
                                             int64_t heavyBudget,
                                             int64_t wideBudget) {
  int64_t bytes = bytesPerThread > 0
                      ? bytesPerThread
                      : chooseLanes(kernel, heavyBudget, wideBudget).bytes;
  return std::min<int64_t>(elementsPerThread(kernel, bytes),
                           int64_t(kernel.getGroupSize()));
}

namespace {

struct FlashOptToGPUPass
    : mlir::flashopt::impl::FlashOptToGPUBase<FlashOptToGPUPass> {
  using FlashOptToGPUBase::FlashOptToGPUBase;
  void runOnOperation() override {
    SmallVector<KernelOp> kernels;
    getOperation().walk([&](KernelOp k) { kernels.push_back(k); });
    for (KernelOp k : kernels) {
      LaneChoice c;
      if (bytesPerThread > 0)
        c.bytes = bytesPerThread;
      else
        c = chooseLanes(k, heavyBudget, wideRegisters > 0 ? wideBudget : 0);
      if (failed(GpuKernelLowering(k, blockSize, c.bytes,
                                   c.wide ? wideRegisters : 0, fullWarpPath,
                                   sharedBases)
                         .run()))
        return signalPassFailure();
    }
  }
};

} // namespace
