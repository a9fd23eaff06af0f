//===- Companders.cpp - companding functions of quantized states ----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The compander table (docs/NUMERICS.md §2). The formulas keep the order of
/// their roundings and of their constants: kernels are bit-identical to the
/// reference only if they do.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/Companders.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::flashopt;

static Value f32Constant(OpBuilder &b, Location loc, double v) {
  return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
}

/// softsign: n ↦ 2n / (1 + |n|).
static Value softsignForward(OpBuilder &b, Location loc, Value n) {
  Value twoN = arith::MulFOp::create(b, loc, f32Constant(b, loc, 2.0), n);
  Value absN = math::AbsFOp::create(b, loc, n);
  Value den = arith::AddFOp::create(b, loc, f32Constant(b, loc, 1.0), absN);
  return arith::DivFOp::create(b, loc, twoN, den);
}

/// The inverse of softsign: t ↦ t / (2 - |t|).
static Value softsignInverse(OpBuilder &b, Location loc, Value t) {
  Value absT = math::AbsFOp::create(b, loc, t);
  Value den = arith::SubFOp::create(b, loc, f32Constant(b, loc, 2.0), absT);
  return arith::DivFOp::create(b, loc, t, den);
}

/// sqrt: x ↦ √x (states that are never negative).
static Value sqrtForward(OpBuilder &b, Location loc, Value x) {
  return math::SqrtOp::create(b, loc, x);
}

/// The inverse of sqrt: x ↦ x · x.
static Value sqrtInverse(OpBuilder &b, Location loc, Value x) {
  return arith::MulFOp::create(b, loc, x, x);
}

static const CompanderInfo kCompanders[] = {
    {Compander::none, std::nullopt, nullptr, nullptr, nullptr, nullptr},
    {Compander::softsign, true, nullptr, softsignForward, softsignInverse,
     nullptr},
    {Compander::sqrt, false, sqrtForward, nullptr, nullptr, sqrtInverse,
     /*nonNegative=*/true},
    {Compander::e3m4, true, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
    {Compander::e4m4, false, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
    {Compander::e2m1, true, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
    {Compander::e3m0, true, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
    {Compander::e3m1, false, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
    {Compander::e4m0, false, nullptr, nullptr, nullptr, nullptr,
     /*nonNegative=*/false, /*minifloat=*/true},
};

const CompanderInfo &mlir::flashopt::getCompanderInfo(Compander compander) {
  for (const CompanderInfo &info : kCompanders)
    if (info.kind == compander)
      return info;
  llvm_unreachable("compander without a row in the compander table");
}
