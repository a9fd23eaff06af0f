//===- LaneCode.cpp - The code of one operation on W lanes
//------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// GroupBodyEmitter's code for single operations: uniform ones as scalars,
/// varying ones as vectors of W lanes, guarded values, the dither of the
/// bounded numerics, and a worker's local group maximum.
///
//===----------------------------------------------------------------------===//

#include "GroupBodyEmitter.h"

using namespace mlir;
using namespace mlir::flashopt;
using namespace mlir::flashopt::detail;

/// The maximum of `in` over the worker's valid lanes.
///
/// When `in` is an absolute value (the group absmax of every quantized
/// state), its lanes are non-negative floats or NaNs with the sign bit
/// clear, whose IEEE order is the unsigned order of their bit patterns
/// (NaNs above +inf): an integer max reduction gives the same result as
/// the NaN-propagating float one, without its compare-and-blend at every
/// step. A `bits` maximum is that integer reduction by definition.
/// Masked lanes then become +0.0 (all bits clear).
Value GroupBodyEmitter::localMax(Location loc, Value in, bool nonNegative) {
  Value v = vectorOf(loc, in);
  auto reduce = [&](OpBuilder &ob, Location l, Value x) -> Value {
    if (!nonNegative)
      return vector::ReductionOp::create(ob, l, vector::CombiningKind::MAXIMUMF,
                                         x);
    Type i32 = ob.getI32Type();
    Value bits = arith::BitcastOp::create(ob, l, vecOf(i32), x);
    Value m =
        vector::ReductionOp::create(ob, l, vector::CombiningKind::MAXUI, bits);
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
  return predicated(loc, plain, masked);
}

LogicalResult GroupBodyEmitter::emitUniform(Operation &op) {
  Location loc = op.getLoc();
  if (auto load = dyn_cast<LoadGroupOp>(op)) {
    int64_t align = alignmentFor(load.getType(), 1);
    scalars[load.getResult()] = RawLoadOp::create(
        b, loc, load.getType(), base(b, loc, load.getBuffer()), env.groupIndex,
        Value(), align);
    return success();
  }
  if (auto store = dyn_cast<StoreGroupOp>(op)) {
    Value v = scalarOf(store.getValue());
    int64_t align = alignmentFor(v.getType(), 1);
    Value cond = env.isGroupLeader;
    if (env.active)
      cond = cond ? arith::AndIOp::create(b, loc, cond, env.active).getResult()
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
void GroupBodyEmitter::emitGuarded(GuardedOp g) {
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
        cur[j] =
            vector::InsertOp::create(b, loc, inner.getResult(j), cur[j], lane);
    }
    scf::YieldOp::create(b, loc, cur);
  }
  for (auto [orig, res] : llvm::zip(g.getResults(), ifOp.getResults()))
    vectors[orig] = res;
}

/// The dither of each of the worker's elements (docs/NUMERICS.md §8):
/// h = i * A + H(t) + phase in 32-bit arithmetic (each term a multiple of
/// 2^18), i the element's index in its tensor (the record's element offset
/// plus the index in the record), as one scalar per worker plus a constant
/// vector of lane * A; then (f32) the float with bits (h >> 9) + 0x3F800000
/// (an or), minus the offset, or (i32) h.
void GroupBodyEmitter::emitDither(DitherOp op) {
  Location loc = op.getLoc();
  Type i32 = b.getI32Type();
  auto c32 = [&](uint32_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(v)))
        .getResult();
  };
  Value first = arith::IndexCastUIOp::create(b, loc, i32, env.elementIndex);
  Value h0;
  Value ditherBase;
  for (auto [step, base] : env.ditherBases)
    if (step == op.getStep())
      ditherBase = base;
  assert((ditherBase || env.ditherBases.empty()) &&
         "a dither of a step without a carried base");
  if (ditherBase) {
    h0 = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, first, c32(DitherOp::kElementMultiplier)),
        ditherBase);
  } else {
    if (env.elementOffset)
      first = arith::AddIOp::create(
          b, loc, first,
          arith::TruncIOp::create(b, loc, i32, env.elementOffset));
    Value step = arith::TruncIOp::create(b, loc, i32, scalarOf(op.getStep()));
    Value stepWord = DitherOp::emitStepWord(b, loc, step);
    h0 = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, first, c32(DitherOp::kElementMultiplier)),
        stepWord);
  }
  // The state's phase, per worker (it folds into the record-uniform part).
  if (uint32_t phase = op.getPhaseWord())
    h0 = arith::AddIOp::create(b, loc, h0, c32(phase));
  SmallVector<int32_t> laneTerms;
  for (int64_t lane = 0; lane < env.width; ++lane)
    laneTerms.push_back(int32_t(uint32_t(lane) * DitherOp::kElementMultiplier));
  Value h = arith::AddIOp::create(
      b, loc, vector::BroadcastOp::create(b, loc, vecOf(i32), h0),
      arith::ConstantOp::create(
          b, loc, DenseElementsAttr::get(vecOf(i32), ArrayRef(laneTerms))));
  if (op.getType().isInteger(32)) { // the word h << 18 itself
    vectors[op.getResult()] = h;
    return;
  }
  auto splat = [&](Attribute a, Type t) {
    return arith::ConstantOp::create(b, loc,
                                     DenseElementsAttr::get(vecOf(t), a));
  };
  Value bits = arith::AddIOp::create(
      b, loc,
      arith::ShRUIOp::create(b, loc, h, splat(b.getI32IntegerAttr(9), i32)),
      splat(b.getI32IntegerAttr(0x3F800000), i32));
  Value w = arith::BitcastOp::create(b, loc, vecOf(b.getF32Type()), bits);
  vectors[op.getResult()] =
      op.getOffset().isZero()
          ? w
          : arith::SubFOp::create(b, loc, w,
                                  splat(op.getOffsetAttr(), b.getF32Type()))
                .getResult();
}

void GroupBodyEmitter::emitVarying(Operation &op) {
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
