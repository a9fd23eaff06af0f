//===- Prologue.cpp - The kernel prologue of both back ends ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The code before a kernel's group body, shared by flashopt-to-cpu and
/// flashopt-to-gpu: hyper-parameters read from the hyper table, the step
/// count, and flashopt.powi as β^n correctly rounded to f32 (double-double
/// repeated squaring with binary64 multiply, add and subtract only).
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/GroupBodyLowering.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>

using namespace mlir;
using namespace mlir::flashopt;

Value mlir::flashopt::loadI64(OpBuilder &b, Location loc, Value base,
                              Value index) {
  return RawLoadOp::create(b, loc, b.getI64Type(), base, index, Value(),
                           /*alignment=*/8);
}

namespace {
/// Double-double (f64 pair) arithmetic with plain IEEE binary64 multiply,
/// add and subtract only (Dekker's product, no FMA), so every back end
/// computes the same bits.
struct DoubleDouble {
  OpBuilder &b;
  Location loc;
  Value c(double v) {
    return arith::ConstantOp::create(b, loc, b.getF64FloatAttr(v));
  }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  /// Veltkamp's split: x = hi + lo, each with at most 26 significant bits.
  std::pair<Value, Value> split(Value x) {
    Value t = mul(c(134217729.0), x); // 2^27 + 1
    Value hi = sub(t, sub(t, x));
    return {hi, sub(x, hi)};
  }
  /// (x.hi + x.lo) * (y.hi + y.lo), renormalized (|lo| <= ulp(hi)/2).
  std::pair<Value, Value> mulDD(std::pair<Value, Value> x,
                                std::pair<Value, Value> y) {
    Value p = mul(x.first, y.first);
    auto [xh, xl] = split(x.first);
    auto [yh, yl] = split(y.first);
    // Dekker: the exact error of p = x.hi * y.hi.
    Value err = add(add(add(sub(mul(xh, yh), p), mul(xh, yl)), mul(xl, yh)),
                    mul(xl, yl));
    Value cross = add(mul(x.first, y.second), mul(x.second, y.first));
    Value e = add(err, cross);
    Value hi = add(p, e);
    Value lo = sub(e, sub(hi, p));
    return {hi, lo};
  }
};
} // namespace

/// β^n for an f32 β and an i64 n >= 0, correctly rounded to f32
/// (docs/NUMERICS.md §3): repeated squaring in double-double arithmetic
/// (relative error below n * 2^-103), then hi rounded to odd with lo as the
/// sticky bit and narrowed once (round-to-odd at 53 bits followed by RTNE at
/// 24 is the correct rounding of hi + lo). A NaN from a non-NaN β can only
/// come from Dekker's split overflowing (|β^n| > 2^996): it becomes the
/// signed infinity that β^n is in f32. Only f64 multiply, add, subtract and
/// integer ops: the same bits on every back end and in the reference.
static Value emitPowI(OpBuilder &b, Location loc, Value base, Value exponent) {
  Type f64 = b.getF64Type();
  Type i64 = b.getI64Type();
  auto cI64 = [&](OpBuilder &ob, int64_t v) -> Value {
    return arith::ConstantOp::create(ob, loc, ob.getI64IntegerAttr(v));
  };
  Value one = arith::ConstantOp::create(b, loc, b.getF64FloatAttr(1.0));
  Value zeroF = arith::ConstantOp::create(b, loc, b.getF64FloatAttr(0.0));
  Value zero = cI64(b, 0);
  Value wide = arith::ExtFOp::create(b, loc, f64, base);
  // Loop state: r (hi, lo), b (hi, lo), n.
  auto loop = scf::WhileOp::create(
      b, loc, TypeRange{f64, f64, f64, f64, i64},
      ValueRange{one, zeroF, wide, zeroF, exponent},
      [&](OpBuilder &nb, Location l, ValueRange args) {
        Value more = arith::CmpIOp::create(nb, l, arith::CmpIPredicate::sgt,
                                           args[4], cI64(nb, 0));
        scf::ConditionOp::create(nb, l, more, args);
      },
      [&](OpBuilder &nb, Location l, ValueRange args) {
        DoubleDouble dd{nb, l};
        Value bit = arith::AndIOp::create(nb, l, args[4], cI64(nb, 1));
        Value odd = arith::CmpIOp::create(nb, l, arith::CmpIPredicate::ne, bit,
                                          cI64(nb, 0));
        auto prod = dd.mulDD({args[0], args[1]}, {args[2], args[3]});
        auto sq = dd.mulDD({args[2], args[3]}, {args[2], args[3]});
        auto sel = [&](Value x, Value y) {
          return arith::SelectOp::create(nb, l, odd, x, y).getResult();
        };
        Value n = arith::ShRSIOp::create(nb, l, args[4], cI64(nb, 1));
        scf::YieldOp::create(
            nb, l,
            ValueRange{sel(prod.first, args[0]), sel(prod.second, args[1]),
                       sq.first, sq.second, n});
      });
  Value hi = loop.getResult(0), lo = loop.getResult(1);
  // Round hi to odd: if lo != 0 and hi's last bit is 0, step hi one ulp
  // towards hi + lo.
  Value bits = arith::BitcastOp::create(b, loc, i64, hi);
  Value loBits = arith::BitcastOp::create(b, loc, i64, lo);
  Value inexact =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ONE, lo, zeroF);
  Value even = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::eq,
      arith::AndIOp::create(b, loc, bits, cI64(b, 1)), zero);
  Value sameSign = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::sge,
      arith::XOrIOp::create(b, loc, bits, loBits), zero);
  Value step = arith::SelectOp::create(b, loc, sameSign, cI64(b, 1),
                                       cI64(b, -1));
  Value adjust = arith::AndIOp::create(b, loc, inexact, even);
  Value odd = arith::SelectOp::create(
      b, loc, adjust, arith::AddIOp::create(b, loc, bits, step), bits);
  Value hiOdd = arith::BitcastOp::create(b, loc, f64, odd);
  Value f32v = arith::TruncFOp::create(b, loc, b.getF32Type(), hiOdd);
  // Overflow of the split (only where |β^n| > 2^996): ±inf.
  Value isNaN =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, f32v, f32v);
  Value baseOk =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ORD, base, base);
  Value overflow = arith::AndIOp::create(b, loc, isNaN, baseOk);
  Value negBase = arith::CmpFOp::create(
      b, loc, arith::CmpFPredicate::OLT, base,
      arith::ConstantOp::create(b, loc, b.getF32FloatAttr(0.0f)));
  Value oddN = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ne,
      arith::AndIOp::create(b, loc, exponent, cI64(b, 1)), zero);
  Value negative = arith::AndIOp::create(b, loc, negBase, oddN);
  Value inf = arith::SelectOp::create(
      b, loc, negative,
      arith::ConstantOp::create(b, loc, b.getF32FloatAttr(-INFINITY)),
      arith::ConstantOp::create(b, loc, b.getF32FloatAttr(INFINITY)));
  return arith::SelectOp::create(b, loc, overflow, inf, f32v);
}

void mlir::flashopt::emitPrologue(OpBuilder &b, KernelOp kernel,
                                  Value hyperBase, Value step,
                                  IRMapping &mapping) {
  for (Operation &op : kernel.getBody().front()) {
    if (isa<GroupBodyOp>(op))
      break;
    Location loc = op.getLoc();
    if (auto hyper = dyn_cast<HyperOp>(op)) {
      int64_t index = kernel.getHyperIndex(hyper.getName());
      Value idx = arith::ConstantIndexOp::create(b, loc, index);
      Value v = RawLoadOp::create(b, loc, b.getF32Type(), hyperBase, idx,
                                  Value(), /*alignment=*/4);
      mapping.map(hyper.getResult(), v);
    } else if (auto count = dyn_cast<StepCountOp>(op)) {
      mapping.map(count.getResult(), step);
    } else if (auto powi = dyn_cast<PowIOp>(op)) {
      mapping.map(powi.getResult(),
                  emitPowI(b, loc, mapping.lookup(powi.getBase()),
                           mapping.lookup(powi.getExponent())));
    } else {
      b.clone(op, mapping);
    }
  }
}
