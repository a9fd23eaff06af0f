//===- BoundLowering.cpp - flashopt.bound for a numerics ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The lowering of `flashopt.bound` (docs/NUMERICS.md §8), one pattern built
/// for the numerics of the optimizer whose rule holds it: the bounded
/// numerics clamp, min(max(x, -limit), limit), NaN-propagating as
/// `arith.maximumf`/`arith.minimumf`; FlashOptim's numerics leave x.
/// flashopt-expand-encodings applies it to the rule it inlines.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::flashopt;

namespace {

struct LowerBound : OpRewritePattern<BoundOp> {
  LowerBound(MLIRContext *ctx, Numerics numerics)
      : OpRewritePattern(ctx), numerics(numerics) {}

  LogicalResult matchAndRewrite(BoundOp bound,
                                PatternRewriter &rewriter) const override {
    Value x = bound.getX();
    if (numerics == Numerics::Bounded) {
      Location loc = bound.getLoc();
      Value limit = bound.getLimit();
      Value low = arith::NegFOp::create(rewriter, loc, limit);
      x = arith::MinimumFOp::create(
          rewriter, loc, arith::MaximumFOp::create(rewriter, loc, x, low),
          limit);
    }
    rewriter.replaceOp(bound, x);
    return success();
  }

  Numerics numerics;
};

} // namespace

void mlir::flashopt::populateBoundLoweringPatterns(RewritePatternSet &patterns,
                                                   Numerics numerics) {
  patterns.add<LowerBound>(patterns.getContext(), numerics);
}
