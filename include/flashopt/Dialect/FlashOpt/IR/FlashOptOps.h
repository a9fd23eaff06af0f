//===- FlashOptOps.h - flashopt operations ----------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The operations of the flashopt dialect.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTOPS_H
#define FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTOPS_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h.inc"

namespace mlir::flashopt {

/// The hyper-parameter declarations of an optimizer or kernel, in order.
llvm::SmallVector<HyperOp> getHypers(Operation *optimizerOrKernel);

/// The state declarations of an optimizer, in order.
llvm::SmallVector<StateOp> getStates(OptimizerOp optimizer);

/// The update rule of an optimizer (null if absent).
UpdateOp getUpdate(OptimizerOp optimizer);

/// The group body of a kernel (null if absent).
GroupBodyOp getGroupBody(KernelOp kernel);

/// Where `a` is the absmax of `y` over its group — `group_max(absf(y))`,
/// possibly raised by `arith.maximumf` with positive constants, so that
/// |y| <= a (or a is NaN) for every element — the `flashopt.group_max`;
/// otherwise null.
GroupMaxOp getGroupAbsmaxOf(Value a, Value y);

/// Whether `v` is a float constant equal to `c`.
bool isConstantFloat(Value v, double c);

} // namespace mlir::flashopt

#endif // FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTOPS_H
