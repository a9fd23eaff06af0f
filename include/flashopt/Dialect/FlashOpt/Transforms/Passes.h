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

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::flashopt {

#define GEN_PASS_DECL
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"

} // namespace mlir::flashopt

#endif // FLASHOPT_DIALECT_FLASHOPT_TRANSFORMS_PASSES_H
