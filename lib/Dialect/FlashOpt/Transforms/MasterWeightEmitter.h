//===- MasterWeightEmitter.h - the master weight's arithmetic ---*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The arithmetic of the master-weight encoding (a 16-bit parameter and its
/// 8- or 16-bit ULP-normalized correction term, docs/NUMERICS.md §1, in the
/// same order of roundings), emitted at one insertion point; used by
/// flashopt-expand-encodings for the parameter and the gradient
/// accumulator. Internal to lib/Dialect/FlashOpt/Transforms.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TRANSFORMS_MASTERWEIGHTEMITTER_H
#define FLASHOPT_TRANSFORMS_MASTERWEIGHTEMITTER_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"

namespace mlir::flashopt {

/// Emits the arithmetic of the master-weight encoding at one insertion point.
class MasterWeightEmitter {
public:
  MasterWeightEmitter(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value i32(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(v));
  }
  Value i16(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI16IntegerAttr(v));
  }

  /// f32(x) for a narrow float, x for f32.
  Value widen(Value x) { return emitWidenToF32(b, loc, x); }

  /// RTNE narrowing of an f32 to `type` (identity for f32).
  Value narrow(Value x, Type type) {
    return emitNarrowFromF32(b, loc, x, type);
  }

  /// 2^k for an i32 k in [-126, 127], built from its bits (exact).
  Value pow2(Value k) {
    Value biased = arith::AddIOp::create(b, loc, k, i32(127));
    Value bits = arith::ShLIOp::create(b, loc, biased, i32(23));
    return arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
  }

  /// The scale exponent ℓ (i32) of a narrow value: 2^ℓ = ULP/2.
  Value scaleExponent(Value narrowValue) {
    Type p = narrowValue.getType();
    int64_t mant = p.isBF16() ? 7 : 10;
    int64_t bias = p.isBF16() ? 127 : 15;
    Value bits = arith::BitcastOp::create(b, loc, b.getI16Type(), narrowValue);
    Value mag = arith::AndIOp::create(b, loc, bits, i16(0x7FFF));
    Value field16 = arith::ShRUIOp::create(b, loc, mag, i16(mant));
    Value field = arith::ExtUIOp::create(b, loc, b.getI32Type(), field16);
    Value isZero = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                         field, i32(0));
    // E = F == 0 ? 1 - bias : F - bias;  ℓ = E - mant - 1.
    Value normal = arith::SubIOp::create(b, loc, field, i32(bias + mant + 1));
    Value subnormal = i32(1 - bias - mant - 1);
    return arith::SelectOp::create(b, loc, isZero, subnormal, normal);
  }

  /// (x * 2^h) * 2^(k - h) with h = k >> 1: exact scaling by 2^k.
  Value scaleByPow2(Value x, Value k) {
    Value h = arith::ShRSIOp::create(b, loc, k, i32(1));
    Value rest = arith::SubIOp::create(b, loc, k, h);
    Value first = arith::MulFOp::create(b, loc, x, pow2(h));
    return arith::MulFOp::create(b, loc, first, pow2(rest));
  }

  /// 2^(F' - 127) with F' the exponent field of a bf16 or f16 value clamped
  /// to [1, 254] (bf16) or [1, 31] (f16), as an f32 built from bits: the
  /// field moved to the f32 exponent's place, so no shift back and forth
  /// through a small integer (docs/NUMERICS.md §1, "in fewer operations").
  Value fieldPow2(Value narrowValue) {
    Type p = narrowValue.getType();
    bool bf = p.isBF16();
    Value at23;
    if (bf) {
      // F << 23 is the exponent field of f32(θ') (a bf16 widens by a 16-bit
      // shift; a NaN's quieting touches only the significand): one AND on
      // the widened value the decode and encode compute anyway.
      Value wide = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                            widen(narrowValue));
      at23 = arith::AndIOp::create(b, loc, wide, i32(0x7F800000));
    } else {
      Value bits16 =
          arith::BitcastOp::create(b, loc, b.getI16Type(), narrowValue);
      Value bits = arith::ExtUIOp::create(b, loc, b.getI32Type(), bits16);
      // F << 23: f16's field is bits 10..14.
      Value field = arith::AndIOp::create(b, loc, bits, i32(0x7C00));
      at23 = arith::ShLIOp::create(b, loc, field, i32(13));
    }
    Value lo = arith::MaxUIOp::create(b, loc, at23, i32(1 << 23));
    Value f = bf ? arith::MinUIOp::create(b, loc, lo, i32(254 << 23)).getResult()
                 : lo;
    return arith::BitcastOp::create(b, loc, b.getF32Type(), f);
  }

  /// Decode (θ', ρ) → θ (docs/NUMERICS.md §1).
  Value decodeMaster(Value narrowValue, Value rho) {
    int64_t n = rho.getType().getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value r = widen(narrowValue);
    Value rhoF = arith::SIToFPOp::create(b, loc, b.getF32Type(), rho);
    Value c = arith::DivFOp::create(b, loc, rhoF, f32(n));
    // e = c * 2^ℓ, ℓ = F' - 135 for bf16: (c * 2^-8) * 2^(F' - 127), the
    // first step exact, so the same bits as §1's two-step scaling (proof
    // there); c * 2^-8 is a function of the code alone (a GPU table folds
    // it in). f16 keeps §1's form: the one-step one made adamw_f16_m24 spill
    // 4 bytes on sm_100 (ptxas 13, 64 registers).
    Value e;
    if (narrowValue.getType().isBF16()) {
      Value c8 = arith::MulFOp::create(b, loc, c, f32(1.0 / 256.0));
      e = arith::MulFOp::create(b, loc, c8, fieldPow2(narrowValue));
    } else {
      e = scaleByPow2(c, scaleExponent(narrowValue));
    }
    return arith::AddFOp::create(b, loc, r, e);
  }

  /// Encode θ → (θ', ρ) (docs/NUMERICS.md §1).
  std::pair<Value, Value> encodeMaster(Value theta, Type paramType,
                                       Type corrType) {
    int64_t n = corrType.getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value narrowValue = narrow(theta, paramType);
    Value r = widen(narrowValue);
    Value e = arith::SubFOp::create(b, loc, theta, r);
    // en = e * 2^-ℓ, exact: bf16 (e * 2^(128 - F')) * 2^7, f16
    // e * 2^(26 - F') (docs/NUMERICS.md §1). 2^(128 - F') is
    // 0x7F800000 - (F' << 23) in bits; 2^(26 - F') is (153 - F') << 23.
    // bf16: s = clamp(en, -1, 1) * N as clamp(en * N, -N, N), folding the
    // 2^7 into the N: the same bits, en being exact (|en| <= 1: the same
    // single rounding; beyond: ±N either way; NaN stays NaN). f16 keeps
    // §1's order (the other measured +0.1-0.5 SASS per element).
    Value s;
    if (paramType.isBF16()) {
      Value f = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                         fieldPow2(narrowValue));
      Value inv = arith::SubIOp::create(b, loc, i32(0x7F800000), f);
      Value scale = arith::BitcastOp::create(b, loc, b.getF32Type(), inv);
      Value scaled = arith::MulFOp::create(b, loc, e, scale);
      Value sN = arith::MulFOp::create(b, loc, scaled, f32(128.0 * double(n)));
      Value lo = arith::MaximumFOp::create(b, loc, sN, f32(-double(n)));
      s = arith::MinimumFOp::create(b, loc, lo, f32(n));
    } else {
      Value f = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                         fieldPow2(narrowValue));
      Value inv = arith::SubIOp::create(b, loc, i32(153 << 23), f);
      Value en = arith::MulFOp::create(
          b, loc, e, arith::BitcastOp::create(b, loc, b.getF32Type(), inv));
      Value lo = arith::MaximumFOp::create(b, loc, en, f32(-1.0));
      Value ec = arith::MinimumFOp::create(b, loc, lo, f32(1.0));
      s = arith::MulFOp::create(b, loc, ec, f32(n));
    }
    // Round half away from zero, copysign(floor(|s| + 0.5), s), as
    // s + copysign(0.5, s) and the conversion's truncation: the same
    // rounded sum, mirrored for s < 0 (round to nearest even is symmetric),
    // and trunc = floor on |.| (docs/NUMERICS.md §1). Two operations fewer.
    Value half = math::CopySignOp::create(b, loc, f32(0.5), s);
    Value plusHalf = arith::AddFOp::create(b, loc, s, half);
    Value isNan = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, s, s);
    Value rhoF = arith::SelectOp::create(b, loc, isNan, f32(0.0), plusHalf);
    Value rho = arith::FPToSIOp::create(b, loc, corrType, rhoF);
    return {narrowValue, rho};
  }

private:
  OpBuilder &b;
  Location loc;
};

} // namespace mlir::flashopt

#endif // FLASHOPT_TRANSFORMS_MASTERWEIGHTEMITTER_H
