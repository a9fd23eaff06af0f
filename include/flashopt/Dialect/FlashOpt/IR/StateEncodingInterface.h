//===- StateEncodingInterface.h - how a state is stored ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The attribute interface of state encodings (StateEncodingInterface.td),
/// the buffer description it returns, and the f32 widening/narrowing that
/// every encoding and the master weight share.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_FLASHOPT_IR_STATEENCODINGINTERFACE_H
#define FLASHOPT_DIALECT_FLASHOPT_IR_STATEENCODINGINTERFACE_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <string>

namespace flashopt::abi {
struct StateSpec;
} // namespace flashopt::abi

namespace mlir::flashopt {

enum class BufferRate : uint32_t;

/// One buffer a state encoding needs per tensor.
struct EncodingBuffer {
  /// Appended to the state's name to name the kernel buffer ("" or ".codes").
  std::string suffix;
  /// The stored element type (e.g. ui8 codes, f16 scales).
  Type storage;
  /// One value per element or one per group.
  BufferRate rate;
};

/// f32(x) for a narrow float `x`; `x` itself when it is f32.
Value emitWidenToF32(OpBuilder &b, Location loc, Value x);

/// Round-to-nearest-even narrowing of the f32 `x` to `type` (`x` itself
/// when `type` is f32).
Value emitNarrowFromF32(OpBuilder &b, Location loc, Value x, Type type);

} // namespace mlir::flashopt

#include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.h.inc"

#endif // FLASHOPT_DIALECT_FLASHOPT_IR_STATEENCODINGINTERFACE_H
