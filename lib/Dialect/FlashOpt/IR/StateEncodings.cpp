//===- StateEncodings.cpp - the state encodings of the dialect ------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// StateEncodingAttrInterface for `#flashopt.quant`, `#flashopt.plain` and
/// `#flashopt.elided`: their buffers, their decode and encode IR
/// (docs/NUMERICS.md §2, in the same order of roundings) and their manifest
/// description. Everything an encoding is lives here, except its verifier
/// (FlashOptDialect.cpp) and its spec spelling (lib/Spec).
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/Companders.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/abi/Manifest.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>

using namespace mlir;
using namespace mlir::flashopt;

#include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.cpp.inc"

static Value f32Constant(OpBuilder &b, Location loc, double v) {
  return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
}

Value mlir::flashopt::emitWidenToF32(OpBuilder &b, Location loc, Value x) {
  if (x.getType().isF32())
    return x;
  return arith::ExtFOp::create(b, loc, b.getF32Type(), x);
}

Value mlir::flashopt::emitNarrowFromF32(OpBuilder &b, Location loc, Value x,
                                        Type type) {
  if (type.isF32())
    return x;
  return arith::TruncFOp::create(b, loc, type, x);
}

//===----------------------------------------------------------------------===//
// QuantAttr: codes per element, one scale per group, a compander
//===----------------------------------------------------------------------===//

SmallVector<EncodingBuffer> QuantAttr::getBuffers() const {
  return {{".codes", getStorage(), BufferRate::element},
          {".scales", getScale(), BufferRate::group}};
}

std::optional<int64_t> QuantAttr::getGroupSize() const { return getGroup(); }

/// Dequantizes one code (signless i8 holding i8 or ui8 bits) with its
/// group's scale.
Value QuantAttr::emitDecode(OpBuilder &b, Location loc,
                            ValueRange loaded) const {
  assert(loaded.size() == 2 && "quantized states load codes and a scale");
  Value code = loaded[0], scale = loaded[1];
  const CompanderInfo &compander = getCompanderInfo(getCompand());
  Value t0 =
      isSigned()
          ? arith::SIToFPOp::create(b, loc, b.getF32Type(), code).getResult()
          : arith::UIToFPOp::create(b, loc, b.getF32Type(), code).getResult();
  Value t =
      arith::DivFOp::create(b, loc, t0, f32Constant(b, loc, getMaxCode()));
  Value n =
      compander.expandNormalized ? compander.expandNormalized(b, loc, t) : t;
  Value x = arith::MulFOp::create(b, loc, n, emitWidenToF32(b, loc, scale));
  if (compander.expandValue)
    x = compander.expandValue(b, loc, x);
  return x;
}

/// Quantizes one element: returns {code as signless i8, the group's scale in
/// the scale type}.
SmallVector<Value> QuantAttr::emitEncode(OpBuilder &b, Location loc, Value x,
                                         Value dither) const {
  const CompanderInfo &compander = getCompanderInfo(getCompand());
  Value y = compander.compressValue ? compander.compressValue(b, loc, x) : x;
  Value absY = math::AbsFOp::create(b, loc, y);
  Value amax = GroupMaxOp::create(b, loc, absY);
  Value a = arith::MaximumFOp::create(b, loc, amax, f32Constant(b, loc, 1e-12));
  // The bounded numerics store a finite absmax beyond the scale type's
  // range as its largest finite value (FlashOptim's overflows to inf, and
  // the group decodes as NaN and inf: a finite gradient spike would make
  // its 31 neighbours NaN); +inf and NaN stay as they are (docs/NUMERICS.md
  // §5, §8).
  Value stored = a;
  if (dither && !getScale().isF32()) {
    auto ft = cast<FloatType>(getScale());
    double maxFinite =
        llvm::APFloat::getLargest(ft.getFloatSemantics()).convertToDouble();
    Value isInf =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, a,
                              f32Constant(b, loc, INFINITY));
    Value sat =
        arith::MinimumFOp::create(b, loc, a, f32Constant(b, loc, maxFinite));
    stored = arith::SelectOp::create(b, loc, isInf, a, sat);
  }
  Value scale = emitNarrowFromF32(b, loc, stored, getScale());
  Value n = arith::DivFOp::create(b, loc, y, a);
  Value t = compander.compressNormalized
                ? compander.compressNormalized(b, loc, n)
                : n;
  double maxCode = getMaxCode();
  Value scaled = arith::MulFOp::create(b, loc, t, f32Constant(b, loc, maxCode));
  // + 1/2 rounds to nearest (FlashOptim); + the element's dither in [0, 1)
  // rounds up with the probability of the fraction over time (§8).
  Value offset = dither ? dither : f32Constant(b, loc, 0.5);
  Value half = arith::AddFOp::create(b, loc, scaled, offset);
  // clamp(floor(h), lo, N) (docs/NUMERICS.md §2) without the clamps it never
  // needs: |y| <= a puts t in [-1, 1] (within a relative 2^-9 for any
  // division of y by a of that accuracy), so floor(t*N + 0.5) lies in
  // [-N, N]; only unsigned codes of a value that can be negative need the
  // clamp at 0. The floor sits next to the conversion, where the GPU folds
  // both into one cvt.rmi.
  Value clamped = half;
  if (!isSigned() && !compander.nonNegative)
    clamped = arith::MaximumFOp::create(b, loc, half, f32Constant(b, loc, 0.0));
  Value f = math::FloorOp::create(b, loc, clamped);
  Value isNan = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, f, f);
  Value q = arith::SelectOp::create(b, loc, isNan, f32Constant(b, loc, 0.0), f);
  Type i8 = b.getI8Type();
  Value code = isSigned() ? arith::FPToSIOp::create(b, loc, i8, q).getResult()
                          : arith::FPToUIOp::create(b, loc, i8, q).getResult();
  return {code, scale};
}

void QuantAttr::describeInManifest(::flashopt::abi::StateSpec &state) const {
  state.kind = ::flashopt::abi::StateKind::Quantized;
  state.storage = *storageDType(getStorage());
  state.group = getGroup();
  state.compand = stringifyCompander(getCompand()).str();
  state.scale = *storageDType(getScale());
}

//===----------------------------------------------------------------------===//
// PlainAttr: one float per element
//===----------------------------------------------------------------------===//

SmallVector<EncodingBuffer> PlainAttr::getBuffers() const {
  return {{"", getStorage(), BufferRate::element}};
}

Value PlainAttr::emitDecode(OpBuilder &b, Location loc,
                            ValueRange loaded) const {
  assert(loaded.size() == 1 && "plain states load one value");
  return emitWidenToF32(b, loc, loaded[0]);
}

SmallVector<Value> PlainAttr::emitEncode(OpBuilder &b, Location loc, Value x,
                                         Value) const {
  return {emitNarrowFromF32(b, loc, x, getStorage())};
}

void PlainAttr::describeInManifest(::flashopt::abi::StateSpec &state) const {
  state.kind = ::flashopt::abi::StateKind::Plain;
  state.storage = *storageDType(getStorage());
}

//===----------------------------------------------------------------------===//
// ElidedAttr: nothing stored, reads as 0
//===----------------------------------------------------------------------===//

SmallVector<EncodingBuffer> ElidedAttr::getBuffers() const { return {}; }

Value ElidedAttr::emitDecode(OpBuilder &b, Location loc,
                             ValueRange loaded) const {
  assert(loaded.empty() && "elided states load nothing");
  return f32Constant(b, loc, 0.0);
}

SmallVector<Value> ElidedAttr::emitEncode(OpBuilder &, Location, Value,
                                          Value) const {
  return {};
}

void ElidedAttr::describeInManifest(::flashopt::abi::StateSpec &state) const {
  state.kind = ::flashopt::abi::StateKind::Elided;
}
