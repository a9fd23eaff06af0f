//===- ExactGroupDivision.cpp - flashopt-exact-group-division ----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Rewrites the quantization division `divf(y, a)` by a group's absmax
/// `a = maximumf(group_max(absf(y)), C)` (C > 0) or `a = group_max(absf(y))`
/// into one IEEE reciprocal per group and, per element, a multiply and two
/// FMA residual corrections:
///
///   s  = a > 2^126 ? 2^-64 : 1;  A = a * s;  r = 1 / A     (per group)
///   Y  = y * s;  q0 = Y * r
///   e0 = fma(-q0, A, Y);  q1 = fma(e0, r, q0)
///   e1 = fma(-q1, A, Y);  q  = fma(e1, r, q1)
///
/// |y| <= a holds by construction (the pattern is checked, not assumed), and
/// docs/NUMERICS.md §2b proves that q is the correctly rounded y / a wherever
/// the quantization code can depend on it, and that the codes are identical
/// everywhere else. The conformance tests hold every kernel to the scalar
/// reference, which still divides.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTEXACTGROUPDIVISION
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

struct FlashOptExactGroupDivisionPass
    : mlir::flashopt::impl::FlashOptExactGroupDivisionBase<
          FlashOptExactGroupDivisionPass> {
  void runOnOperation() override {
    SmallVector<arith::DivFOp> divs;
    getOperation().walk([&](arith::DivFOp d) {
      if (d.getType().isF32() && getGroupAbsmaxOf(d.getRhs(), d.getLhs()))
        divs.push_back(d);
    });
    for (arith::DivFOp div : divs) {
      OpBuilder b(div);
      Location loc = div.getLoc();
      auto c = [&](float v) -> Value {
        return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
      };
      Value y = div.getLhs(), a = div.getRhs();
      // Per group (uniform): the scaling keeps 1/A a normal number.
      Value big = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, a,
                                        c(0x1p126f));
      Value s = arith::SelectOp::create(b, loc, big, c(0x1p-64f), c(1.0f));
      Value A = arith::MulFOp::create(b, loc, a, s);
      Value r = arith::DivFOp::create(b, loc, c(1.0f), A);
      Value negA = arith::NegFOp::create(b, loc, A);
      // Per element.
      Value Y = arith::MulFOp::create(b, loc, y, s);
      Value q0 = arith::MulFOp::create(b, loc, Y, r);
      Value e0 = math::FmaOp::create(b, loc, q0, negA, Y);
      Value q1 = math::FmaOp::create(b, loc, e0, r, q0);
      Value e1 = math::FmaOp::create(b, loc, q1, negA, Y);
      Value q = math::FmaOp::create(b, loc, e1, r, q1);
      div.replaceAllUsesWith(q);
      div.erase();
    }
  }
};

} // namespace
