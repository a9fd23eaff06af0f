//===- GuardedConversion.h - NaN-guarded float-to-integer conversions -----===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every stored code and correction ends in a float-to-integer conversion
/// behind a NaN guard, `fptosi(select(isnan(a), 0, y))` (arith's fptosi
/// leaves NaN undefined). Targets whose own conversion gives a NaN a result
/// whose low bits are 0 (PTX cvt: 0; x86 cvttps2dq: 0x80000000, so 0 in an
/// i8 or i16) lower the whole form to that conversion when y is NaN whenever
/// a is; `matchGuardedConversion` finds it (flashopt-convert-to-nvvm,
/// flashopt-convert-to-llvm).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CONVERSION_GUARDEDCONVERSION_H
#define FLASHOPT_CONVERSION_GUARDEDCONVERSION_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"

namespace mlir::flashopt {

/// Whether `y` is NaN whenever `a` is: `y` is `a`, or is computed from it by
/// operations that return NaN for a NaN operand (on that operand).
inline bool nanPropagatesTo(Value a, Value y, int depth = 0) {
  if (y == a)
    return true;
  Operation *op = y.getDefiningOp();
  if (!op || depth > 8)
    return false;
  if (isa<arith::AddFOp, arith::SubFOp, arith::MulFOp, arith::MaximumFOp,
          arith::MinimumFOp, math::FmaOp>(op))
    return llvm::any_of(op->getOperands(), [&](Value v) {
      return nanPropagatesTo(a, v, depth + 1);
    });
  if (isa<math::AbsFOp, math::FloorOp, math::TruncOp, arith::NegFOp>(op))
    return nanPropagatesTo(a, op->getOperand(0), depth + 1);
  if (auto cs = dyn_cast<math::CopySignOp>(op))
    return nanPropagatesTo(a, cs.getLhs(), depth + 1);
  return false;
}

/// What a guarded conversion converts: `y` of `fptosi/fptoui(select(
/// isnan(a), 0.0, y))`, f32 (or a vector of f32) to an integer of at most
/// 32 bits, y NaN whenever a is; with `floored` set and the floor's operand
/// returned when y = floor(w). Null when `conversion` is not of that form.
struct GuardedConversion {
  /// y, or w when y = floor(w) (then `floored`).
  Value source;
  bool floored = false;
  /// y itself.
  Value guarded;
};
inline GuardedConversion matchGuardedConversion(Operation *conversion) {
  if (!isa<arith::FPToSIOp, arith::FPToUIOp>(conversion))
    return {};
  Value in = conversion->getOperand(0);
  auto sel = in.getDefiningOp<arith::SelectOp>();
  if (!sel)
    return {};
  auto cmp = sel.getCondition().getDefiningOp<arith::CmpFOp>();
  if (!cmp || cmp.getPredicate() != arith::CmpFPredicate::UNO ||
      cmp.getLhs() != cmp.getRhs() ||
      !matchPattern(sel.getTrueValue(), m_AnyZeroFloat()) ||
      !nanPropagatesTo(cmp.getLhs(), sel.getFalseValue()))
    return {};
  auto outElt = dyn_cast<IntegerType>(
      getElementTypeOrSelf(conversion->getResult(0).getType()));
  if (!getElementTypeOrSelf(in.getType()).isF32() || !outElt ||
      outElt.getWidth() > 32)
    return {};
  GuardedConversion g{sel.getFalseValue(), false, sel.getFalseValue()};
  if (auto fl = g.source.getDefiningOp<math::FloorOp>()) {
    g.source = fl.getOperand();
    g.floored = true;
  }
  return g;
}

} // namespace mlir::flashopt

#endif // FLASHOPT_CONVERSION_GUARDEDCONVERSION_H
