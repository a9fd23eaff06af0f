//===- Passes.h - flashopt dialect transformations --------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Passes that work on the flashopt dialect itself.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_FLASHOPT_TRANSFORMS_PASSES_H
#define FLASHOPT_DIALECT_FLASHOPT_TRANSFORMS_PASSES_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir::flashopt {

#define GEN_PASS_DECL
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"

/// The lowering of flashopt.bound for `numerics` (BoundLowering.cpp): the
/// bounded numerics' NaN-propagating clamp min(max(x, -limit), limit), or x
/// itself in FlashOptim's (docs/NUMERICS.md §8). flashopt-expand-encodings
/// applies it to an optimizer's update rule before inlining it into a
/// kernel.
void populateBoundLoweringPatterns(RewritePatternSet &patterns,
                                   Numerics numerics);

} // namespace mlir::flashopt

#endif // FLASHOPT_DIALECT_FLASHOPT_TRANSFORMS_PASSES_H
