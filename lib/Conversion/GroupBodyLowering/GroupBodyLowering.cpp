//===- GroupBodyLowering.cpp - Shared lowering of group bodies -------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Maps the scalar code of a `flashopt.group_body` onto W vector lanes.
/// Values that are uniform across a group (derived only from the prologue,
/// `flashopt.load_group` and `flashopt.group_max`) stay scalars; everything
/// else becomes a `vector<W x T>`, uniform operands being broadcast.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/GroupBodyLowering.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <memory>
#include <vector>

using namespace mlir;
using namespace mlir::flashopt;

namespace {

/// Lowers one group body for one worker.
///
/// The body is split into phases: phase 0 is everything that does not
/// depend on a `flashopt.group_max`; a group maximum of a phase-p value is
/// available from phase p+1 on. Each phase emits its uniform (scalar) code,
/// then its varying (vector) code and this worker's part of the group
/// maxima, then its element stores, then completes the maxima across
/// workers. Element stores thus follow the last computation they need.
class GroupBodyEmitter {
public:
  GroupBodyEmitter(OpBuilder &b, KernelOp kernel, const GroupBodyEnv &env,
                   const IRMapping &prologue)
      : b(b), kernel(kernel), env(env), prologue(prologue) {}

  /// Analyzes the body and sets up the predicates; the first step of a
  /// lowering.
  LogicalResult prepare(Block &block, Location loc) {
    if (failed(analyze(block)))
      return failure();
    setUpPredicates(loc);
    return success();
  }

  int64_t numPhases() const { return maxPhase + 1; }

  /// Loads first: every per-element load is one full-width access.
  void emitLoad(Operation &op) {
    if (auto load = dyn_cast<LoadElementOp>(op))
      vectors[load.getResult()] =
          loadElements(load.getLoc(), load.getBuffer(), load.getType());
  }

  /// Uniform code of phase `p` (group loads and stores, scalars derived
  /// from the previous phase's group maxima).
  LogicalResult emitUniformStep(Operation &op, int64_t p) {
    if (phaseOf(&op) == p && isUniformOp(&op))
      return emitUniform(op);
    return success();
  }

  /// Varying code of phase `p`, and this worker's part of the group maxima.
  void emitVaryingStep(Operation &op, int64_t p) {
    if (auto gmax = dyn_cast<GroupMaxOp>(op)) {
      if (varying.count(gmax.getValue()) && phaseOf(gmax.getValue()) == p)
        partialMax[gmax.getResult()] =
            localMax(op.getLoc(), gmax.getValue(), bitOrder(gmax));
      return;
    }
    if (phaseOf(&op) != p || isUniformOp(&op) ||
        isa<LoadElementOp, StoreElementOp>(op))
      return;
    emitVarying(op);
  }

  /// Whether the group maximum `op` of phase `p` can be reduced together
  /// with other groups' (emitGroupBodies' `reduceLanes`): an unsigned
  /// maximum of bits (order-independent, NaN payloads included), of a
  /// worker that holds its whole group and no masked lanes.
  bool canBatchMax(Operation &op, int64_t p) {
    auto gmax = dyn_cast<GroupMaxOp>(op);
    return gmax && varying.count(gmax.getValue()) &&
           phaseOf(gmax.getValue()) == p && bitOrder(gmax) &&
           env.predication == Predication::None && !env.combineAcrossWorkers;
  }
  int64_t width() const { return env.width; }
  /// The operand of a batchable group maximum as a vector of i32 bits.
  Value maxInputBits(Operation &op) {
    auto gmax = cast<GroupMaxOp>(op);
    Value v = vectorOf(op.getLoc(), gmax.getValue());
    return arith::BitcastOp::create(b, op.getLoc(), vecOf(b.getI32Type()), v);
  }
  /// This worker's part of a batched group maximum (i32 bits).
  void setPartialMaxBits(Operation &op, Value bits) {
    partialMax[cast<GroupMaxOp>(op).getResult()] =
        arith::BitcastOp::create(b, op.getLoc(), b.getF32Type(), bits);
  }

  /// Stores of phase `p`: full-width accesses.
  void emitStoreStep(Operation &op, int64_t p) {
    if (auto store = dyn_cast<StoreElementOp>(op))
      if (phaseOf(&op) == p)
        storeElements(op.getLoc(), store.getBuffer(),
                      vectorOf(op.getLoc(), store.getValue()));
  }

  /// Finishes the group maxima of phase `p` across workers.
  void emitMaxStep(Operation &op, int64_t p) {
    auto gmax = dyn_cast<GroupMaxOp>(op);
    if (!gmax || phaseOf(gmax.getValue()) != p ||
        !varying.count(gmax.getValue()))
      return;
    Location loc = op.getLoc();
    Value v = partialMax.lookup(gmax.getResult());
    if (env.combineAcrossWorkers) {
      // Absolute values combine as the unsigned max of their bits, as in
      // localMax, so every target agrees on NaN payloads too.
      if (bitOrder(gmax)) {
        Value bits = arith::BitcastOp::create(b, loc, b.getI32Type(), v);
        bits = env.combineAcrossWorkers(b, loc, bits);
        v = arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
      } else {
        v = env.combineAcrossWorkers(b, loc, v);
      }
    }
    scalars[gmax.getResult()] = v;
  }

private:
  OpBuilder &b;
  KernelOp kernel;
  const GroupBodyEnv &env;
  const IRMapping &prologue;
  int64_t maxPhase = 0;
  /// Phase of every body operation.
  llvm::DenseMap<Operation *, int64_t> phases;
  /// Body values that differ from element to element.
  llvm::DenseSet<Value> varying;
  /// Uniform values (scalars).
  llvm::DenseMap<Value, Value> scalars;
  /// Vector values of varying body values.
  llvm::DenseMap<Value, Value> vectors;
  /// This worker's part of each group maximum of the current phase.
  llvm::DenseMap<Value, Value> partialMax;
  /// Whether all of the worker's lanes are valid (i1), for PerAccess.
  Value allValid;

  VectorType vecOf(Type t, int64_t n) { return VectorType::get({n}, t); }
  VectorType vecOf(Type t) { return vecOf(t, env.width); }

  int64_t phaseOf(Operation *op) { return phases.lookup(op); }
  /// Whether a group maximum is taken over bit patterns as unsigned
  /// integers: asked for (`bits`), or the same as the float order because
  /// the operand is an absolute value.
  static bool bitOrder(GroupMaxOp gmax) {
    return gmax.getBits() ||
           gmax.getValue().getDefiningOp<math::AbsFOp>() != nullptr;
  }
  int64_t phaseOf(Value v) {
    Operation *def = v.getDefiningOp();
    return def && phases.count(def) ? phases.lookup(def) : 0;
  }
  bool isUniformOp(Operation *op) {
    if (isa<LoadGroupOp, StoreGroupOp>(op))
      return true;
    if (isa<LoadElementOp, StoreElementOp, GroupMaxOp, GuardedOp, DitherOp>(
            op))
      return false;
    return llvm::none_of(op->getResults(),
                         [&](Value r) { return varying.count(r); });
  }

  LogicalResult analyze(Block &block) {
    for (Operation &op : block) {
      if (op.getNumRegions() != 0 && !isa<GuardedOp>(op))
        return op.emitOpError() << "cannot be lowered inside a group body";
      int64_t phase = 0;
      for (Value operand : op.getOperands())
        phase = std::max(phase, phaseOf(operand));
      // A guarded fallback runs in the phase of everything it uses.
      bool usesVarying = false;
      if (auto guarded = dyn_cast<GuardedOp>(op))
        guarded.getFallback().walk([&](Operation *inner) {
          for (Value v : inner->getOperands())
            if (!guarded->isAncestor(v.getParentRegion()->getParentOp())) {
              phase = std::max(phase, phaseOf(v));
              usesVarying |= varying.count(v) != 0;
            }
        });
      if (auto gmax = dyn_cast<GroupMaxOp>(op))
        phase =
            phaseOf(gmax.getValue()) + (varying.count(gmax.getValue()) ? 1 : 0);
      phases[&op] = phase;
      maxPhase = std::max(maxPhase, phase);
      bool isVarying = isa<LoadElementOp, DitherOp>(op) || usesVarying ||
                       (!isa<GroupMaxOp, LoadGroupOp>(op) &&
                        llvm::any_of(op.getOperands(), [&](Value v) {
                          return varying.count(v);
                        }));
      if (isVarying)
        for (Value r : op.getResults())
          varying.insert(r);
    }
    // A dither is computed in the phase of its first use, not before the
    // group maxima its uses wait for: W more values live across a
    // butterfly cost the GPU kernels registers.
    for (Operation &op : block) {
      if (!isa<DitherOp>(op))
        continue;
      int64_t first = maxPhase;
      for (Operation *user : op.getUsers()) {
        Operation *top = block.findAncestorOpInBlock(*user);
        if (top)
          first = std::min(first, phases.lookup(top));
      }
      phases[&op] = std::max(phases.lookup(&op), first);
    }
    return success();
  }

  void setUpPredicates(Location loc) {
    if (env.predication != Predication::PerAccess)
      return;
    Value width = arith::ConstantIndexOp::create(b, loc, env.width);
    Value end = arith::AddIOp::create(b, loc, env.elementIndex, width);
    allValid = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sle, end,
                                     env.numElements);
    if (env.active)
      allValid = arith::AndIOp::create(b, loc, allValid, env.active);
  }

  /// Emits the validity mask (vector<n x i1>) of the worker's lanes
  /// [offset, offset + n). It is recomputed at every use rather than kept
  /// live across the body: on the GPU a live vector of predicates costs
  /// registers.
  Value laneMask(OpBuilder &ob, Location loc, int64_t offset, int64_t n) {
    // Index arithmetic (32-bit on the GPU, 64-bit on the host).
    Type idx = ob.getIndexType();
    SmallVector<int64_t> iota(n);
    for (int64_t i = 0; i < n; ++i)
      iota[i] = offset + i;
    Value lanes = arith::ConstantOp::create(
        ob, loc,
        DenseElementsAttr::get(
            vecOf(idx, n),
            llvm::map_to_vector(iota, [](int64_t v) { return APInt(64, v); })));
    Value firstV =
        vector::BroadcastOp::create(ob, loc, vecOf(idx, n), env.elementIndex);
    Value numelV =
        vector::BroadcastOp::create(ob, loc, vecOf(idx, n), env.numElements);
    Value pos = arith::AddIOp::create(ob, loc, firstV, lanes);
    Value mask =
        arith::CmpIOp::create(ob, loc, arith::CmpIPredicate::slt, pos, numelV);
    if (env.active) {
      Value activeV = vector::BroadcastOp::create(
          ob, loc, vecOf(ob.getI1Type(), n), env.active);
      mask = arith::AndIOp::create(ob, loc, mask, activeV);
    }
    return mask;
  }
  Value laneMask(OpBuilder &ob, Location loc) {
    return laneMask(ob, loc, 0, env.width);
  }

  Value scalarOf(Value v) {
    auto it = scalars.find(v);
    if (it != scalars.end())
      return it->second;
    return prologue.lookupOrDefault(v);
  }

  /// The vector form of `v`: a varying value, or a broadcast of a uniform
  /// one.
  Value vectorOf(Location loc, Value v) {
    auto it = vectors.find(v);
    if (it != vectors.end())
      return it->second;
    Value s = scalarOf(v);
    return vector::BroadcastOp::create(b, loc, vecOf(s.getType()), s);
  }

  int64_t alignmentFor(Type elementType, int64_t count) {
    int64_t bytes = (elementType.getIntOrFloatBitWidth() + 7) / 8;
    int64_t align = bytes;
    int64_t total = bytes * count;
    while (align * 2 <= env.maxAlignment && total % (align * 2) == 0)
      align *= 2;
    return align;
  }

  Value base(OpBuilder &ob, Location loc, int64_t buffer) {
    return env.baseAddress(ob, loc, buffer);
  }

  /// A full-width load of this worker's elements of `buffer`.
  Value loadElements(Location loc, int64_t buffer, Type t) {
    VectorType vt = vecOf(t);
    int64_t align = alignmentFor(t, env.width);
    int64_t elemAlign = alignmentFor(t, 1);
    switch (env.predication) {
    case Predication::None:
      return RawLoadOp::create(b, loc, vt, base(b, loc, buffer),
                               env.elementIndex, Value(), align);
    case Predication::Masked:
      return RawLoadOp::create(b, loc, vt, base(b, loc, buffer),
                               env.elementIndex, laneMask(b, loc), elemAlign);
    case Predication::PerAccess: {
      auto ifOp = scf::IfOp::create(
          b, loc, allValid,
          [&](OpBuilder &tb, Location l) {
            Value v = RawLoadOp::create(tb, l, vt, base(tb, l, buffer),
                                        env.elementIndex, Value(), align);
            scf::YieldOp::create(tb, l, v);
          },
          [&](OpBuilder &eb, Location l) {
            Value v =
                RawLoadOp::create(eb, l, vt, base(eb, l, buffer),
                                  env.elementIndex, laneMask(eb, l), elemAlign);
            scf::YieldOp::create(eb, l, v);
          });
      return ifOp.getResult(0);
    }
    }
    llvm_unreachable("unknown predication");
  }

  void storeElements(Location loc, int64_t buffer, Value v) {
    Type t = cast<VectorType>(v.getType()).getElementType();
    int64_t align = alignmentFor(t, env.width);
    int64_t elemAlign = alignmentFor(t, 1);
    switch (env.predication) {
    case Predication::None:
      RawStoreOp::create(b, loc, v, base(b, loc, buffer), env.elementIndex,
                         Value(), align);
      return;
    case Predication::Masked:
      RawStoreOp::create(b, loc, v, base(b, loc, buffer), env.elementIndex,
                         laneMask(b, loc), elemAlign);
      return;
    case Predication::PerAccess:
      scf::IfOp::create(
          b, loc, allValid,
          [&](OpBuilder &tb, Location l) {
            RawStoreOp::create(tb, l, v, base(tb, l, buffer), env.elementIndex,
                               Value(), align);
            scf::YieldOp::create(tb, l);
          },
          [&](OpBuilder &eb, Location l) {
            RawStoreOp::create(eb, l, v, base(eb, l, buffer), env.elementIndex,
                               laneMask(eb, l), elemAlign);
            scf::YieldOp::create(eb, l);
          });
      return;
    }
  }

  /// The maximum of `in` over the worker's valid lanes.
  ///
  /// When `in` is an absolute value (the group absmax of every quantized
  /// state), its lanes are non-negative floats or NaNs with the sign bit
  /// clear, whose IEEE order is the unsigned order of their bit patterns
  /// (NaNs above +inf): an integer max reduction gives the same result as
  /// the NaN-propagating float one, without its compare-and-blend at every
  /// step. A `bits` maximum is that integer reduction by definition.
  /// Masked lanes then become +0.0 (all bits clear).
  Value localMax(Location loc, Value in, bool nonNegative) {
    Value v = vectorOf(loc, in);
    auto reduce = [&](OpBuilder &ob, Location l, Value x) -> Value {
      if (!nonNegative)
        return vector::ReductionOp::create(ob, l,
                                           vector::CombiningKind::MAXIMUMF, x);
      Type i32 = ob.getI32Type();
      Value bits = arith::BitcastOp::create(ob, l, vecOf(i32), x);
      Value m = vector::ReductionOp::create(ob, l, vector::CombiningKind::MAXUI,
                                            bits);
      return arith::BitcastOp::create(ob, l, ob.getF32Type(), m);
    };
    auto plain = [&](OpBuilder &ob, Location l) -> Value {
      return reduce(ob, l, v);
    };
    // Lanes past the end take no part: they become -inf (+0 for absolute
    // values, which are never below it).
    auto masked = [&](OpBuilder &ob, Location l) -> Value {
      float fill = nonNegative ? 0.0f : -std::numeric_limits<float>::infinity();
      Value neutral = arith::ConstantOp::create(
          ob, l,
          DenseElementsAttr::get(vecOf(ob.getF32Type()),
                                 ob.getF32FloatAttr(fill)));
      Value m = laneMask(ob, l);
      Value sel = arith::SelectOp::create(ob, l, m, v, neutral);
      return reduce(ob, l, sel);
    };
    switch (env.predication) {
    case Predication::None:
      return plain(b, loc);
    case Predication::Masked:
      return masked(b, loc);
    case Predication::PerAccess:
      return scf::IfOp::create(
                 b, loc, allValid,
                 [&](OpBuilder &tb, Location l) {
                   scf::YieldOp::create(tb, l, plain(tb, l));
                 },
                 [&](OpBuilder &eb, Location l) {
                   scf::YieldOp::create(eb, l, masked(eb, l));
                 })
          .getResult(0);
    }
    llvm_unreachable("unknown predication");
  }

  LogicalResult emitUniform(Operation &op) {
    Location loc = op.getLoc();
    if (auto load = dyn_cast<LoadGroupOp>(op)) {
      int64_t align = alignmentFor(load.getType(), 1);
      scalars[load.getResult()] = RawLoadOp::create(
          b, loc, load.getType(), base(b, loc, load.getBuffer()),
          env.groupIndex, Value(), align);
      return success();
    }
    if (auto store = dyn_cast<StoreGroupOp>(op)) {
      Value v = scalarOf(store.getValue());
      int64_t align = alignmentFor(v.getType(), 1);
      Value cond = env.isGroupLeader;
      if (env.active)
        cond = cond
                   ? arith::AndIOp::create(b, loc, cond, env.active).getResult()
                   : env.active;
      auto emitStore = [&](OpBuilder &sb, Location l) {
        RawStoreOp::create(sb, l, v, base(sb, l, store.getBuffer()),
                           env.groupIndex, Value(), align);
      };
      if (!cond) {
        emitStore(b, loc);
      } else {
        scf::IfOp::create(b, loc, cond, [&](OpBuilder &tb, Location l) {
          emitStore(tb, l);
          scf::YieldOp::create(tb, l);
        });
      }
      return success();
    }
    if (auto gmax = dyn_cast<GroupMaxOp>(op)) {
      // The maximum of a group-uniform value is that value.
      scalars[gmax.getResult()] = scalarOf(gmax.getValue());
      return success();
    }
    IRMapping m;
    for (Value operand : op.getOperands())
      m.map(operand, scalarOf(operand));
    Operation *clone = b.clone(op, m);
    for (auto [orig, res] : llvm::zip(op.getResults(), clone->getResults()))
      scalars[orig] = res;
    return success();
  }

  /// A guarded value: the fast vectors when every lane's guard holds (one
  /// test of all lanes); otherwise, lane by lane, the fallback region's
  /// scalar code for each lane whose guard fails. On the GPU the fallback
  /// is a rarely taken branch (docs/NUMERICS.md §2c gives the rates).
  void emitGuarded(GuardedOp g) {
    Location loc = g.getLoc();
    Value slackV = vectorOf(loc, g.getSlack());
    Value limit = arith::ConstantOp::create(b, loc, g.getLimitAttr());
    SmallVector<Value> fastV;
    SmallVector<Type> types;
    for (Value f : g.getFast()) {
      fastV.push_back(vectorOf(loc, f));
      types.push_back(fastV.back().getType());
    }
    // One scalar compare per lane, and-ed: on the GPU predicates, which
    // stay live into the fallback without taking registers (a reduction of
    // a boolean vector costs NVPTX a mask assembly of ~5 ops per lane).
    SmallVector<Value> okL;
    Value all;
    for (int64_t lane = 0; lane < env.width; ++lane) {
      okL.push_back(arith::CmpFOp::create(
          b, loc, arith::CmpFPredicate::OLE,
          vector::ExtractOp::create(b, loc, slackV, lane), limit));
      all = all ? arith::AndIOp::create(b, loc, all, okL.back()).getResult()
                : okL.back();
    }
    auto ifOp = scf::IfOp::create(b, loc, types, all, /*withElse=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(ifOp.thenBlock());
      scf::YieldOp::create(b, loc, fastV);
      b.setInsertionPointToStart(ifOp.elseBlock());
      SmallVector<Value> cur = fastV;
      auto yield = cast<YieldOp>(g.getFallback().front().getTerminator());
      for (int64_t lane = 0; lane < env.width; ++lane) {
        SmallVector<Type> scalarTypes = llvm::to_vector(g.getResultTypes());
        auto inner = scf::IfOp::create(b, loc, scalarTypes, okL[lane],
                                       /*withElse=*/true);
        OpBuilder::InsertionGuard laneGuard(b);
        b.setInsertionPointToStart(inner.thenBlock());
        SmallVector<Value> kept;
        for (Value v : cur)
          kept.push_back(vector::ExtractOp::create(b, loc, v, lane));
        scf::YieldOp::create(b, loc, kept);
        b.setInsertionPointToStart(inner.elseBlock());
        IRMapping m;
        auto lookup = [&](Value v) -> Value {
          if (Value local = m.lookupOrNull(v))
            return local;
          if (varying.count(v))
            return vector::ExtractOp::create(b, loc, vectorOf(loc, v), lane);
          return scalarOf(v);
        };
        for (Operation &op : g.getFallback().front().without_terminator()) {
          for (Value operand : op.getOperands())
            if (!m.contains(operand))
              m.map(operand, lookup(operand));
          b.clone(op, m);
        }
        SmallVector<Value> exact;
        for (Value v : yield.getValues())
          exact.push_back(lookup(v));
        scf::YieldOp::create(b, loc, exact);
        b.setInsertionPointAfter(inner);
        for (size_t j = 0; j < cur.size(); ++j)
          cur[j] = vector::InsertOp::create(b, loc, inner.getResult(j), cur[j],
                                            lane);
      }
      scf::YieldOp::create(b, loc, cur);
    }
    for (auto [orig, res] : llvm::zip(g.getResults(), ifOp.getResults()))
      vectors[orig] = res;
  }

  /// The dither of each of the worker's elements (docs/NUMERICS.md §8):
  /// h = i * A + t * B in 32-bit arithmetic, i the element's index in its
  /// tensor (the record's element offset plus the index in the record), as
  /// one scalar per worker plus a constant vector of lane * A; then the f32
  /// with bits (h >> 9) + 0x3F800000 (A and B are multiples of 2^18, so
  /// the add is an or), minus the offset.
  void emitDither(DitherOp op) {
    Location loc = op.getLoc();
    Type i32 = b.getI32Type();
    auto c32 = [&](uint32_t v) {
      return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(v)))
          .getResult();
    };
    Value first =
        arith::IndexCastUIOp::create(b, loc, i32, env.elementIndex);
    if (env.elementOffset)
      first = arith::AddIOp::create(
          b, loc, first,
          arith::TruncIOp::create(b, loc, i32, env.elementOffset));
    Value step = arith::TruncIOp::create(b, loc, i32, scalarOf(op.getStep()));
    Value h0 = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, first,
                              c32(DitherOp::kElementMultiplier)),
        arith::MulIOp::create(b, loc, step, c32(DitherOp::kStepMultiplier)));
    SmallVector<int32_t> laneTerms;
    for (int64_t lane = 0; lane < env.width; ++lane)
      laneTerms.push_back(
          int32_t(uint32_t(lane) * DitherOp::kElementMultiplier));
    Value h = arith::AddIOp::create(
        b, loc, vector::BroadcastOp::create(b, loc, vecOf(i32), h0),
        arith::ConstantOp::create(
            b, loc, DenseElementsAttr::get(vecOf(i32), ArrayRef(laneTerms))));
    auto splat = [&](Attribute a, Type t) {
      return arith::ConstantOp::create(
          b, loc, DenseElementsAttr::get(vecOf(t), a));
    };
    Value bits = arith::AddIOp::create(
        b, loc,
        arith::ShRUIOp::create(b, loc, h, splat(b.getI32IntegerAttr(9), i32)),
        splat(b.getI32IntegerAttr(0x3F800000), i32));
    Value w = arith::BitcastOp::create(b, loc, vecOf(b.getF32Type()), bits);
    vectors[op.getResult()] = arith::SubFOp::create(
        b, loc, w, splat(op.getOffsetAttr(), b.getF32Type()));
  }

  void emitVarying(Operation &op) {
    Location loc = op.getLoc();
    if (auto guarded = dyn_cast<GuardedOp>(op))
      return emitGuarded(guarded);
    if (auto dither = dyn_cast<DitherOp>(op))
      return emitDither(dither);
    IRMapping m;
    for (Value operand : op.getOperands())
      m.map(operand, vectorOf(loc, operand));
    Operation *clone = b.clone(op, m);
    for (auto [orig, res] : llvm::zip(op.getResults(), clone->getResults())) {
      res.setType(vecOf(res.getType()));
      vectors[orig] = res;
    }
  }
};

/// The unsigned maxima of each of `in` (N vectors of W i32 lanes, N and W
/// powers of two, N <= W), reduced together: pairs of vectors merged half
/// by half (the lower halves of every segment of both against the upper
/// halves) until one vector of W lanes holds N segments of W/N; then folded
/// the same way while wider than `lanes`; then a butterfly within each
/// segment. Segment g's first lane is the maximum of in[g]; each merge and
/// fold step is two shuffles and one max of vectors, each butterfly step one
/// of each. For N = 4, W = 32 on 16 lanes: 17 vector operations instead of
/// 4 x 9.
SmallVector<Value> transposedMax(OpBuilder &b, Location loc, ArrayRef<Value> in,
                                 int64_t lanes) {
  auto maxOf = [&](Value x, Value y) -> Value {
    return arith::MaxUIOp::create(b, loc, x, y);
  };
  int64_t w = cast<VectorType>(in.front().getType()).getNumElements();
  SmallVector<Value> vs(in.begin(), in.end());
  int64_t segs = 1, len = w;
  // Lanes of the lower (`upper` false) or upper halves of every segment of
  // a vector of `segs` segments of `len`, starting at lane `base`.
  auto halves = [](SmallVectorImpl<int64_t> &mask, int64_t base, int64_t segs,
                   int64_t len, bool upper) {
    for (int64_t s = 0; s < segs; ++s)
      for (int64_t i = 0; i < len / 2; ++i)
        mask.push_back(base + s * len + (upper ? len / 2 : 0) + i);
  };
  while (vs.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < vs.size(); i += 2) {
      SmallVector<int64_t> lo, hi;
      halves(lo, 0, segs, len, false);
      halves(lo, w, segs, len, false);
      halves(hi, 0, segs, len, true);
      halves(hi, w, segs, len, true);
      next.push_back(
          maxOf(vector::ShuffleOp::create(b, loc, vs[i], vs[i + 1], lo),
                vector::ShuffleOp::create(b, loc, vs[i], vs[i + 1], hi)));
    }
    vs = next;
    segs *= 2;
    len /= 2;
  }
  Value z = vs.front();
  int64_t width = w;
  while (width > lanes && len > 1) {
    SmallVector<int64_t> lo, hi;
    halves(lo, 0, segs, len, false);
    halves(hi, 0, segs, len, true);
    z = maxOf(vector::ShuffleOp::create(b, loc, z, z, lo),
              vector::ShuffleOp::create(b, loc, z, z, hi));
    width /= 2;
    len /= 2;
  }
  for (int64_t d = len / 2; d >= 1; d /= 2) {
    SmallVector<int64_t> swap;
    for (int64_t i = 0; i < width; ++i)
      swap.push_back(i ^ d);
    z = maxOf(z, vector::ShuffleOp::create(b, loc, z, z, swap));
  }
  SmallVector<Value> out;
  for (int64_t g = 0; g < int64_t(in.size()); ++g)
    out.push_back(vector::ExtractOp::create(b, loc, z, g * len));
  return out;
}

} // namespace

LogicalResult mlir::flashopt::emitGroupBody(OpBuilder &b, KernelOp kernel,
                                            const GroupBodyEnv &env,
                                            const IRMapping &mapping) {
  return emitGroupBodies(b, kernel, ArrayRef<GroupBodyEnv>(env), mapping);
}

/// Emits the bodies of `envs` step by step: each operation of the body for
/// every group before the next operation, so that independent groups stand
/// side by side in the instruction stream. The body is split into phases:
/// phase 0 is everything that does not depend on a `flashopt.group_max`; a
/// group maximum of a phase-p value is available from phase p+1 on. Each
/// phase emits its uniform (scalar) code, then its varying (vector) code and
/// the workers' part of the group maxima, then its element stores, then
/// completes the maxima across workers. Element stores thus follow the last
/// computation they need.
LogicalResult mlir::flashopt::emitGroupBodies(OpBuilder &b, KernelOp kernel,
                                              ArrayRef<GroupBodyEnv> envs,
                                              const IRMapping &mapping,
                                              int64_t reduceLanes) {
  GroupBodyOp body = getGroupBody(kernel);
  if (!body)
    return kernel.emitOpError() << "has no group body";
  Block &block = body.getBody().front();
  std::vector<std::unique_ptr<GroupBodyEmitter>> emitters;
  for (const GroupBodyEnv &env : envs) {
    emitters.push_back(
        std::make_unique<GroupBodyEmitter>(b, kernel, env, mapping));
    if (failed(emitters.back()->prepare(block, body.getLoc())))
      return failure();
  }
  for (Operation &op : block)
    for (auto &e : emitters)
      e->emitLoad(op);
  int64_t phases = emitters.front()->numPhases();
  for (int64_t p = 0; p < phases; ++p) {
    for (Operation &op : block)
      for (auto &e : emitters)
        if (failed(e->emitUniformStep(op, p)))
          return failure();
    int64_t n = emitters.size();
    int64_t w = emitters.front()->width();
    bool batch = reduceLanes > 0 && n > 1 && llvm::isPowerOf2_64(n) &&
                 llvm::isPowerOf2_64(w) && n <= w;
    for (Operation &op : block) {
      if (batch && llvm::all_of(emitters, [&](auto &e) {
            return e->canBatchMax(op, p);
          })) {
        SmallVector<Value> in;
        for (auto &e : emitters)
          in.push_back(e->maxInputBits(op));
        SmallVector<Value> out = transposedMax(b, op.getLoc(), in, reduceLanes);
        for (int64_t g = 0; g < n; ++g)
          emitters[g]->setPartialMaxBits(op, out[g]);
        continue;
      }
      for (auto &e : emitters)
        e->emitVaryingStep(op, p);
    }
    for (Operation &op : block)
      for (auto &e : emitters)
        e->emitStoreStep(op, p);
    for (Operation &op : block)
      for (auto &e : emitters)
        e->emitMaxStep(op, p);
  }
  return success();
}

bool mlir::flashopt::usesElementOffset(KernelOp kernel) {
  GroupBodyOp body = getGroupBody(kernel);
  if (!body)
    return false;
  bool found = false;
  body.walk([&](DitherOp) { found = true; });
  return found;
}
