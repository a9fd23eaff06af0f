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
  if (compander.isMinifloat())
    return emitMinifloatDecode(b, loc, code, scale);
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
                                         Value ditherStep, int32_t ditherPhase,
                                         bool subnormalFree) const {
  const CompanderInfo &compander = getCompanderInfo(getCompand());
  if (compander.isMinifloat())
    return emitMinifloatEncode(b, loc, x, ditherStep, ditherPhase,
                               subnormalFree);
  Value dither;
  if (ditherStep)
    dither = DitherOp::create(b, loc, b.getF32Type(), ditherStep,
                              b.getF32FloatAttr(1.0f),
                              b.getI32IntegerAttr(ditherPhase))
                 .getResult();
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
    Value isInf = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ, a,
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
// QuantAttr with minifloat codes (docs/NUMERICS.md §2d)
//===----------------------------------------------------------------------===//

::flashopt::abi::MinifloatFormat QuantAttr::getMinifloatFormat() const {
  std::optional<::flashopt::abi::MinifloatFormat> f =
      ::flashopt::abi::minifloat_format(stringifyCompander(getCompand()));
  assert(f && f->isSigned == isSigned() && "not a minifloat compander");
  return *f;
}

static Value i32Constant(OpBuilder &b, Location loc, int64_t v) {
  return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(v)));
}

/// sign · V(|code|) · scale: the magnitude's bits are (c + bias) << (23 − M)
/// for a normal code; below the first normal one, c · 2^(1 − emax − M) (a
/// subnormal) or a constant (flashopt-decode-tables makes the code's part one
/// table read on the GPU).
Value QuantAttr::emitMinifloatDecode(OpBuilder &b, Location loc, Value code,
                                     Value scale) const {
  ::flashopt::abi::MinifloatFormat fmt = getMinifloatFormat();
  Type i32 = b.getI32Type(), f32 = b.getF32Type();
  Value c = fmt.isSigned && getCodeBits() == 8
                ? arith::ExtSIOp::create(b, loc, i32, code).getResult()
                : arith::ExtUIOp::create(b, loc, i32, code).getResult();
  // A packed signed code is loaded as its raw nibble: sign-extend bit 3.
  if (fmt.isSigned && getCodeBits() == 4)
    c = arith::ShRSIOp::create(
        b, loc, arith::ShLIOp::create(b, loc, c, i32Constant(b, loc, 28)),
        i32Constant(b, loc, 28));
  Value mag = c;
  if (fmt.isSigned)
    mag = math::AbsIOp::create(b, loc, c);
  Value bits = arith::ShLIOp::create(
      b, loc,
      arith::AddIOp::create(b, loc, mag,
                            i32Constant(b, loc, fmt.exponentBias())),
      i32Constant(b, loc, 23 - fmt.mantissaBits));
  Value normal = arith::BitcastOp::create(b, loc, f32, bits);
  Value isNormal =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, mag,
                            i32Constant(b, loc, fmt.firstNormalCode()));
  Value low = f32Constant(b, loc, fmt.value(0));
  if (fmt.subnormals) {
    Value sub =
        arith::MulFOp::create(b, loc, arith::SIToFPOp::create(b, loc, f32, mag),
                              f32Constant(b, loc, fmt.value(1)));
    // Zero-free unsigned codes: code 0 is half the smallest subnormal.
    if (fmt.value(0) != 0.0)
      sub = arith::SelectOp::create(
          b, loc,
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, mag,
                                i32Constant(b, loc, 0)),
          low, sub);
    low = sub;
  }
  Value v = arith::SelectOp::create(b, loc, isNormal, normal, low);
  if (fmt.isSigned) {
    Value neg = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, c,
                                      i32Constant(b, loc, 0));
    v = arith::SelectOp::create(b, loc, neg, arith::NegFOp::create(b, loc, v),
                                v);
  }
  return arith::MulFOp::create(b, loc, v, emitWidenToF32(b, loc, scale));
}

/// The group's scale, the least power of two s with s·V_top ≥ absmax (within
/// the scale type's normal range and 2^(emax + 22); +inf and NaN kept), and
/// each element's code against it: r = |x| · 2^(emax − 127) / s, which puts
/// the code's exponent in r's f32 exponent field (the code's subnormals in
/// f32's), whose bits plus the dither word moved to the code's last place,
/// shifted down to the code's place, are the code (at most top); signed codes
/// take x's sign (docs/NUMERICS.md §2d).
SmallVector<Value> QuantAttr::emitMinifloatEncode(OpBuilder &b, Location loc,
                                                  Value x, Value ditherStep,
                                                  int32_t ditherPhase,
                                                  bool subnormalFree) const {
  ::flashopt::abi::MinifloatFormat fmt = getMinifloatFormat();
  Type i32 = b.getI32Type(), f32 = b.getF32Type();
  auto scaleType = cast<FloatType>(getScale());
  Value absX = math::AbsFOp::create(b, loc, x);
  Value amax = GroupMaxOp::create(b, loc, absX);
  // +inf and NaN absmaxes are stored as they are (docs/NUMERICS.md §5); the
  // codes of their group are taken against the largest scale (a NaN's bits
  // differ by back end, so it is +inf here).
  Value nonFinite = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UGE,
                                          amax, f32Constant(b, loc, INFINITY));
  Value finiteMax = arith::SelectOp::create(
      b, loc, nonFinite, f32Constant(b, loc, INFINITY), amax);
  // The least power of two at least a / V_top: a's bits plus what the
  // mantissa lacks to 1 + (the top's mantissa), exponent kept.
  Value aBits = arith::BitcastOp::create(b, loc, i32, finiteMax);
  Value ru = arith::AndIOp::create(
      b, loc,
      arith::AddIOp::create(b, loc, aBits,
                            i32Constant(b, loc, fmt.scaleRoundUpAddend())),
      i32Constant(b, loc, int64_t(int32_t(0xFF800000u))));
  auto [minExp, maxExp] = fmt.scaleExponentRange(scaleType.isF16() ? -14 : -126,
                                                 scaleType.isF16() ? 15 : 127);
  Value s = arith::MinimumFOp::create(
      b, loc,
      arith::MaximumFOp::create(b, loc,
                                arith::BitcastOp::create(b, loc, f32, ru),
                                f32Constant(b, loc, std::ldexp(1.0, minExp))),
      f32Constant(b, loc, std::ldexp(1.0, maxExp)));
  // 2^(emax − 127 − E) for s = 2^E: an f32 normal (exponent field emax +
  // 127 − s's) or subnormal (1 << (22 + that field)).
  Value sField =
      arith::ShRUIOp::create(b, loc, arith::BitcastOp::create(b, loc, i32, s),
                             i32Constant(b, loc, 23));
  Value kField = arith::SubIOp::create(
      b, loc, i32Constant(b, loc, fmt.emax() + 127), sField);
  Value kNormal =
      arith::ShLIOp::create(b, loc, kField, i32Constant(b, loc, 23));
  Value kBits = kNormal;
  if (maxExp > fmt.emax() - 1) {
    Value kSub = arith::ShLIOp::create(
        b, loc, i32Constant(b, loc, 1),
        arith::MaxSIOp::create(
            b, loc,
            arith::AddIOp::create(b, loc, kField, i32Constant(b, loc, 22)),
            i32Constant(b, loc, 0)));
    Value isNormal = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge,
                                           kField, i32Constant(b, loc, 1));
    kBits = arith::SelectOp::create(b, loc, isNormal, kNormal, kSub);
  }
  Value k = arith::BitcastOp::create(b, loc, f32, kBits);
  Value stored32 = arith::SelectOp::create(b, loc, nonFinite, amax, s);
  Value stored = emitNarrowFromF32(b, loc, stored32, scaleType);
  Value r, rbits;
  if (subnormalFree) {
    // The same bits without a subnormal product: r' = |x| * k * 2^24 is
    // exact and normal (k * 2^24 >= 2^-125 for every scale allowed), so
    // bits(r) = bits(r') - 24 << 23 where r is normal (r' >= 2^-102);
    // below, r is an f32 subnormal, whose bits are r / 2^-149 rounded to
    // nearest even: t = r' * 2^125 (exact, < 2^23 there) rounded by
    // (t + 2^23) - 2^23 (no intermediate rounding but that one). A NaN
    // keeps its bits, as the product would.
    Value kp = arith::BitcastOp::create(
        b, loc, f32,
        arith::ShLIOp::create(
            b, loc,
            arith::AddIOp::create(b, loc, kField, i32Constant(b, loc, 24)),
            i32Constant(b, loc, 23)));
    Value rp = arith::MulFOp::create(b, loc, absX, kp);
    Value normalBits =
        arith::SubIOp::create(b, loc, arith::BitcastOp::create(b, loc, i32, rp),
                              i32Constant(b, loc, int64_t(24) << 23));
    Value t = arith::MinNumFOp::create(
        b, loc,
        arith::MulFOp::create(b, loc, rp,
                              f32Constant(b, loc, std::ldexp(1.0, 125))),
        f32Constant(b, loc, std::ldexp(1.0, 23)));
    Value magic = f32Constant(b, loc, std::ldexp(1.0, 23));
    Value rounded = arith::SubFOp::create(
        b, loc, arith::AddFOp::create(b, loc, t, magic), magic);
    Value subBits = arith::FPToUIOp::create(b, loc, i32, rounded);
    Value isSub =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, rp,
                              f32Constant(b, loc, std::ldexp(1.0, -102)));
    rbits = arith::SelectOp::create(b, loc, isSub, subBits, normalBits);
  } else {
    r = arith::MulFOp::create(b, loc, absX, k);
  }
  // The dither word h << 18 (h in the top 14 bits) moved to the code's last
  // place: (h << 18) >> (9 + M) = h << (9 - M), the fraction of a code in
  // units of 2^-(23 - M); without a dither (FlashOptim numerics) one half
  // less one bit: round to nearest, ties down, so that a zero-free code 0's
  // value (half the first subnormal step) encodes back to code 0.
  int shift = 23 - fmt.mantissaBits;
  Value word = ditherStep ? DitherOp::create(b, loc, i32, ditherStep,
                                             b.getF32FloatAttr(0.0f),
                                             b.getI32IntegerAttr(ditherPhase))
                                .getResult()
                          : i32Constant(b, loc, (int64_t(1) << 31) - 1);
  Value add =
      arith::ShRUIOp::create(b, loc, word, i32Constant(b, loc, 32 - shift));
  if (!rbits)
    rbits = arith::BitcastOp::create(b, loc, i32, r);
  Value rounded =
      arith::ShRUIOp::create(b, loc, arith::AddIOp::create(b, loc, rbits, add),
                             i32Constant(b, loc, shift));
  // At most top: a NaN, or an absmax beyond the scale's range.
  Value q = arith::MinUIOp::create(b, loc, rounded,
                                   i32Constant(b, loc, fmt.topCode()));
  if (fmt.isSigned) {
    Value neg = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, x,
                                      f32Constant(b, loc, 0.0));
    q = arith::SelectOp::create(
        b, loc, neg, arith::SubIOp::create(b, loc, i32Constant(b, loc, 0), q),
        q);
  }
  Value code = arith::TruncIOp::create(b, loc, b.getI8Type(), q);
  return {code, stored};
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
                                         Value, int32_t, bool) const {
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

SmallVector<Value> ElidedAttr::emitEncode(OpBuilder &, Location, Value, Value,
                                          int32_t, bool) const {
  return {};
}

void ElidedAttr::describeInManifest(::flashopt::abi::StateSpec &state) const {
  state.kind = ::flashopt::abi::StateKind::Elided;
}
