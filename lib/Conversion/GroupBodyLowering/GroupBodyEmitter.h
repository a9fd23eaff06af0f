//===- GroupBodyEmitter.h - One group body on W lanes ------------*- C++
//-*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The emitter behind GroupBodyLowering.h (internal to this library): the
/// analysis of a group body into uniform and varying values and phases, the
/// predicates and element accesses, in this header; the code of single
/// operations (uniform, varying, guarded, dither, local maxima) in
/// LaneCode.cpp; the drivers over phases and groups in GroupBodyLowering.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_LIB_GROUPBODYLOWERING_GROUPBODYEMITTER_H
#define FLASHOPT_LIB_GROUPBODYLOWERING_GROUPBODYEMITTER_H

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

namespace mlir::flashopt::detail {

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
    if (isa<LoadElementOp, StoreElementOp, GroupMaxOp, GuardedOp, DitherOp>(op))
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
  /// With a `stride`, lane i stands for element offset + i·stride (the
  /// bytes of a packed buffer: each holds elements 2i and 2i + 1, and is
  /// valid with its even element, since the valid lanes are a prefix).
  Value laneMask(OpBuilder &ob, Location loc, int64_t offset, int64_t n,
                 int64_t stride = 1) {
    // Index arithmetic (32-bit on the GPU, 64-bit on the host).
    Type idx = ob.getIndexType();
    SmallVector<int64_t> iota(n);
    for (int64_t i = 0; i < n; ++i)
      iota[i] = offset + i * stride;
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
    // Without predication every access is in the body's own block (or, for
    // a group leader's store, nested below it): one load of each buffer's
    // base serves them all.
    if (env.shareBases && env.predication == Predication::None &&
        ob.getInsertionBlock() == b.getInsertionBlock()) {
      Value &v = bases[buffer];
      if (!v)
        v = env.baseAddress(ob, loc, buffer);
      return v;
    }
    return env.baseAddress(ob, loc, buffer);
  }
  llvm::DenseMap<int64_t, Value> bases;

  /// An access as the predication asks: `plain` (every lane valid),
  /// `masked` (per-lane masks), or, per access, both under one test of
  /// allValid (an scf.if yielding the access's value, if it has one).
  /// Returns that value, or null for a store.
  Value predicated(Location loc,
                   llvm::function_ref<Value(OpBuilder &, Location)> plain,
                   llvm::function_ref<Value(OpBuilder &, Location)> masked) {
    switch (env.predication) {
    case Predication::None:
      return plain(b, loc);
    case Predication::Masked:
      return masked(b, loc);
    case Predication::PerAccess: {
      auto yield = [](OpBuilder &ob, Location l, Value v) {
        if (v)
          scf::YieldOp::create(ob, l, v);
        else
          scf::YieldOp::create(ob, l);
      };
      auto ifOp = scf::IfOp::create(
          b, loc, allValid,
          [&](OpBuilder &tb, Location l) { yield(tb, l, plain(tb, l)); },
          [&](OpBuilder &eb, Location l) { yield(eb, l, masked(eb, l)); });
      return ifOp.getNumResults() ? ifOp.getResult(0) : Value();
    }
    }
    llvm_unreachable("unknown predication");
  }

  /// Whether `buffer` holds packed 4-bit codes (i4, ui4; two per byte, the
  /// even element in the low nibble: docs/KERNEL-ABI.md).
  bool isPacked(int64_t buffer) {
    return kernel.getBuffer(buffer).getElementType().getIntOrFloatBitWidth() ==
           4;
  }

  /// The byte index of this worker's first element of a packed buffer: the
  /// element index over 2 (W is even and every worker starts at a multiple
  /// of W, so no byte has two writers).
  Value packedIndex(Location loc) {
    assert(env.width % 2 == 0 && "packed codes need an even width");
    return arith::ShRUIOp::create(b, loc, env.elementIndex,
                                  arith::ConstantIndexOp::create(b, loc, 1));
  }

  /// An i8 vector of `n` copies of `v`.
  Value splatI8(Location loc, int64_t n, int64_t v) {
    return arith::ConstantOp::create(
        b, loc,
        DenseElementsAttr::get(vecOf(b.getI8Type(), n),
                               b.getIntegerAttr(b.getI8Type(), v)));
  }

  /// A full-width load of this worker's elements of a packed 4-bit buffer:
  /// W/2 bytes, each split into its low (even element) and high nibble,
  /// zero-extended (the raw nibble, i4 and ui4 alike: a signed decode
  /// sign-extends it in its own IR, which flashopt-decode-tables folds into
  /// its table on the GPU), interleaved into W i8 lanes.
  Value loadPacked(Location loc, int64_t buffer) {
    int64_t n = env.width / 2;
    VectorType bt = vecOf(b.getI8Type(), n);
    int64_t align = alignmentFor(b.getI8Type(), n);
    Value index = packedIndex(loc);
    auto plain = [&](OpBuilder &ob, Location l) -> Value {
      return RawLoadOp::create(ob, l, bt, base(ob, l, buffer), index, Value(),
                               align);
    };
    auto masked = [&](OpBuilder &ob, Location l) -> Value {
      return RawLoadOp::create(ob, l, bt, base(ob, l, buffer), index,
                               laneMask(ob, l, 0, n, 2), 1);
    };
    if (env.packedAsWords && 4 * env.width >= 32) {
      // Split inside each arm, so the masks stay word-wide: LLVM's DAG
      // combiner, seeing the masks beside the byte extractions in one
      // block, moves them onto every byte.
      auto split = [&](auto load) {
        return [=, this](OpBuilder &ob, Location l) -> Value {
          return splitNibbles(ob, l, load(ob, l));
        };
      };
      return interleaveNibbles(loc,
                               predicated(loc, split(plain), split(masked)));
    }
    Value bytes = predicated(loc, plain, masked);
    if (env.packedAsWords)
      return unpackWords(loc, bytes);
    Value lo = arith::AndIOp::create(b, loc, bytes, splatI8(loc, n, 15));
    Value hi = arith::ShRUIOp::create(b, loc, bytes, splatI8(loc, n, 4));
    SmallVector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) {
      order.push_back(i);
      order.push_back(n + i);
    }
    return vector::ShuffleOp::create(b, loc, lo, hi, order);
  }

  /// The word form of packed codes (GroupBodyEnv::packedAsWords): the
  /// worker's W/2 bytes as words of min(32, 4W) bits.
  Type packedWordType() {
    return b.getIntegerType(std::min<int64_t>(32, 4 * env.width));
  }
  int64_t packedWords() {
    return 4 * env.width / packedWordType().getIntOrFloatBitWidth();
  }

  /// The word form with 32-bit words (W >= 8): the worker's W/2 bytes as
  /// i32 words w, split a word at a time into lo = w & 0x0F0F0F0F (the even
  /// lanes' codes, one per byte) and hi = (w >> 4) & 0x0F0F0F0F (the odd
  /// lanes'), returned as one vector [lo words..., hi words...].
  Value splitNibbles(OpBuilder &ob, Location loc, Value bytes) {
    int64_t nw = packedWords();
    VectorType wt = vecOf(ob.getI32Type(), nw);
    auto splat = [&](int32_t c) {
      return arith::ConstantOp::create(
          ob, loc, DenseElementsAttr::get(wt, ob.getI32IntegerAttr(c)));
    };
    Value words = vector::BitCastOp::create(ob, loc, wt, bytes);
    Value lo = arith::AndIOp::create(ob, loc, words, splat(0x0F0F0F0F));
    Value hi = arith::AndIOp::create(
        ob, loc, arith::ShRUIOp::create(ob, loc, words, splat(4)),
        splat(0x0F0F0F0F));
    SmallVector<int64_t> both;
    for (int64_t i = 0; i < 2 * nw; ++i)
      both.push_back(i);
    return vector::ShuffleOp::create(ob, loc, lo, hi, both);
  }

  /// Lane j of the codes from splitNibbles' words: byte j/2 of lo (even j)
  /// or of hi (odd j), each lane one byte extraction (a PRMT on NVPTX) of an
  /// i32 computed once per four lanes.
  Value interleaveNibbles(Location loc, Value split) {
    int64_t n = env.width / 2;
    Value bytes =
        vector::BitCastOp::create(b, loc, vecOf(b.getI8Type(), 2 * n), split);
    SmallVector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) {
      order.push_back(i);
      order.push_back(n + i);
    }
    return vector::ShuffleOp::create(b, loc, bytes, bytes, order);
  }

  /// Lane j of the worker's codes is nibble j of its bytes (little-endian
  /// words: bits 4j..4j+3 of the W/2 bytes): with words narrower than 32
  /// bits (W = 2, 4; wider ones take splitNibbles) each lane takes its word
  /// (a shuffle of the words widened to i32), shifts it right by 4j mod the
  /// word's width and masks it, all as W-lane i32 vector operations, then
  /// narrows to i8; LLVM folds the decode's extension of that narrowing
  /// away (the lanes are known to be below 16), so no i8 vector is built.
  Value unpackWords(Location loc, Value bytes) {
    Type wordType = packedWordType();
    int64_t wordBits = wordType.getIntOrFloatBitWidth();
    Type i32 = b.getI32Type();
    Value words = vector::BitCastOp::create(
        b, loc, vecOf(wordType, packedWords()), bytes);
    words = arith::ExtUIOp::create(b, loc, vecOf(i32, packedWords()), words);
    SmallVector<int64_t> pick;
    SmallVector<int32_t> shifts;
    for (int64_t j = 0; j < env.width; ++j) {
      pick.push_back((4 * j) / wordBits);
      shifts.push_back(int32_t((4 * j) % wordBits));
    }
    Value lanes = vector::ShuffleOp::create(b, loc, words, words, pick);
    Value shifted = arith::ShRUIOp::create(
        b, loc, lanes,
        arith::ConstantOp::create(
            b, loc, DenseElementsAttr::get(vecOf(i32), ArrayRef(shifts))));
    Value masked = arith::AndIOp::create(
        b, loc, shifted,
        arith::ConstantOp::create(
            b, loc,
            DenseElementsAttr::get(vecOf(i32), b.getI32IntegerAttr(15))));
    return arith::TruncIOp::create(b, loc, vecOf(b.getI8Type()), masked);
  }

  /// The worker's codes packed into its W/2 bytes, as words: lane j's low 4
  /// bits at bits 4j..4j+3.
  Value packWords(OpBuilder &ob, Location loc, Value v) {
    Type wordType = packedWordType();
    int64_t wordBits = wordType.getIntOrFloatBitWidth();
    Type i32 = ob.getI32Type();
    auto c32 = [&](int64_t x) {
      return arith::ConstantOp::create(ob, loc,
                                       ob.getI32IntegerAttr(int32_t(x)))
          .getResult();
    };
    Value wide = arith::ExtUIOp::create(ob, loc, vecOf(i32), v);
    if (wordBits == 32) {
      // A byte per lane pair: (lane 2k & 15) | (lane 2k+1 << 4) in i32 (two
      // operations; what the shift carries above bit 7 is cut by the
      // narrowing), the bytes then built into words (PRMTs on NVPTX).
      SmallVector<Value> bytes;
      for (int64_t k = 0; k < env.width / 2; ++k) {
        Value even = arith::AndIOp::create(
            ob, loc, vector::ExtractOp::create(ob, loc, wide, 2 * k), c32(15));
        Value odd = arith::ShLIOp::create(
            ob, loc, vector::ExtractOp::create(ob, loc, wide, 2 * k + 1),
            c32(4));
        bytes.push_back(arith::TruncIOp::create(
            ob, loc, ob.getI8Type(),
            arith::OrIOp::create(ob, loc, even, odd)));
      }
      return vector::FromElementsOp::create(
          ob, loc, vecOf(ob.getI8Type(), env.width / 2), bytes);
    }
    SmallVector<Value> words(packedWords());
    for (int64_t j = 0; j < env.width; ++j) {
      Value lane = arith::AndIOp::create(
          ob, loc, vector::ExtractOp::create(ob, loc, wide, j), c32(15));
      int64_t shift = (4 * j) % wordBits;
      if (shift)
        lane = arith::ShLIOp::create(ob, loc, lane, c32(shift));
      Value &w = words[(4 * j) / wordBits];
      w = w ? arith::OrIOp::create(ob, loc, w, lane).getResult() : lane;
    }
    if (wordBits < 32)
      for (Value &w : words)
        w = arith::TruncIOp::create(ob, loc, wordType, w);
    Value packed = vector::FromElementsOp::create(
        ob, loc, vecOf(wordType, packedWords()), words);
    return vector::BitCastOp::create(
        ob, loc, vecOf(ob.getI8Type(), env.width / 2), packed);
  }

  /// A full-width store of this worker's elements to a packed 4-bit buffer:
  /// lanes 2j in the low and 2j + 1 in the high nibble of byte j, the low 4
  /// bits of each. Lanes past the end store 0, so the pad nibble of an
  /// odd-length tensor is always 0 (identical bytes on every back end).
  void storePacked(Location loc, int64_t buffer, Value v) {
    int64_t n = env.width / 2;
    Value index = packedIndex(loc);
    int64_t align = alignmentFor(b.getI8Type(), n);
    auto pack = [&](OpBuilder &ob, Location l, Value x) -> Value {
      if (env.packedAsWords)
        return packWords(ob, l, x);
      SmallVector<int64_t> even, odd;
      for (int64_t i = 0; i < n; ++i) {
        even.push_back(2 * i);
        odd.push_back(2 * i + 1);
      }
      Value e = vector::ShuffleOp::create(ob, l, x, x, even);
      Value o = vector::ShuffleOp::create(ob, l, x, x, odd);
      auto splat = [&](int64_t c) {
        return arith::ConstantOp::create(
            ob, l,
            DenseElementsAttr::get(vecOf(ob.getI8Type(), n),
                                   ob.getIntegerAttr(ob.getI8Type(), c)));
      };
      return arith::OrIOp::create(
          ob, l, arith::AndIOp::create(ob, l, e, splat(15)),
          arith::ShLIOp::create(ob, l, o, splat(4)));
    };
    auto plain = [&](OpBuilder &ob, Location l) -> Value {
      RawStoreOp::create(ob, l, pack(ob, l, v), base(ob, l, buffer), index,
                         Value(), align);
      return Value();
    };
    auto masked = [&](OpBuilder &ob, Location l) -> Value {
      Value zero = arith::ConstantOp::create(
          ob, l,
          DenseElementsAttr::get(vecOf(ob.getI8Type()),
                                 ob.getIntegerAttr(ob.getI8Type(), 0)));
      Value kept = arith::SelectOp::create(ob, l, laneMask(ob, l), v, zero);
      RawStoreOp::create(ob, l, pack(ob, l, kept), base(ob, l, buffer), index,
                         laneMask(ob, l, 0, n, 2), 1);
      return Value();
    };
    predicated(loc, plain, masked);
  }

  /// A full-width load of this worker's elements of `buffer`.
  Value loadElements(Location loc, int64_t buffer, Type t) {
    if (isPacked(buffer))
      return loadPacked(loc, buffer);
    VectorType vt = vecOf(t);
    int64_t align = alignmentFor(t, env.width);
    int64_t elemAlign = alignmentFor(t, 1);
    return predicated(
        loc,
        [&](OpBuilder &ob, Location l) -> Value {
          return RawLoadOp::create(ob, l, vt, base(ob, l, buffer),
                                   env.elementIndex, Value(), align);
        },
        [&](OpBuilder &ob, Location l) -> Value {
          return RawLoadOp::create(ob, l, vt, base(ob, l, buffer),
                                   env.elementIndex, laneMask(ob, l),
                                   elemAlign);
        });
  }

  void storeElements(Location loc, int64_t buffer, Value v) {
    if (isPacked(buffer))
      return storePacked(loc, buffer, v);
    Type t = cast<VectorType>(v.getType()).getElementType();
    int64_t align = alignmentFor(t, env.width);
    int64_t elemAlign = alignmentFor(t, 1);
    predicated(
        loc,
        [&](OpBuilder &ob, Location l) -> Value {
          RawStoreOp::create(ob, l, v, base(ob, l, buffer), env.elementIndex,
                             Value(), align);
          return Value();
        },
        [&](OpBuilder &ob, Location l) -> Value {
          RawStoreOp::create(ob, l, v, base(ob, l, buffer), env.elementIndex,
                             laneMask(ob, l), elemAlign);
          return Value();
        });
  }

  /// The maximum of `in` over the worker's valid lanes (LaneCode.cpp).
  Value localMax(Location loc, Value in, bool nonNegative);
  /// The scalar code of a uniform operation.
  LogicalResult emitUniform(Operation &op);
  /// A guarded value (LaneCode.cpp).
  void emitGuarded(GuardedOp g);
  /// The dither of each of the worker's elements (LaneCode.cpp).
  void emitDither(DitherOp op);
  /// The vector code of a varying operation.
  void emitVarying(Operation &op);
};

} // namespace mlir::flashopt::detail

#endif // FLASHOPT_LIB_GROUPBODYLOWERING_GROUPBODYEMITTER_H
