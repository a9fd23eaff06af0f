//===- FlashOptDialect.h - flashopt dialect ---------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The flashopt dialect, its enums and its encoding attributes (the state
/// encodings implement StateEncodingAttrInterface).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTDIALECT_H
#define FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTDIALECT_H

#include "flashopt/abi/DType.h"
#include "flashopt/abi/Minifloat.h"

#include <optional>
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h.inc"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptEnums.h.inc"
#include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.h"

#define GET_ATTRDEF_CLASSES
#include "flashopt/Dialect/FlashOpt/IR/FlashOptAttrs.h.inc"

namespace mlir::flashopt {

/// Whether `t` is a parameter or plain-state float type (f32, bf16, f16).
bool isStorageFloatType(Type t);

/// The kernel-ABI dtype (abi/DTypes.def) a storage type is stored as, or
/// nullopt for anything else.
std::optional<::flashopt::abi::DType> storageDType(Type t);

/// The storage type of a kernel-ABI dtype.
Type storageType(MLIRContext *ctx, ::flashopt::abi::DType d);

/// The short name flashopt uses for a storage type in specs and manifests
/// (the ABI's dtype names: "bf16", "f16", "f32", "i8", "ui8", "i16", "i4",
/// "ui4"), or ""
/// for anything else.
std::string storageTypeName(Type t);

/// Parses a storage type name ("bf16", ..., "ui8"); null on failure.
Type parseStorageTypeName(MLIRContext *ctx, llvm::StringRef name);

/// The type a kernel loads and stores for a buffer of storage type `t`:
/// arith works on signless integers of at least 8 bits, so ui8 codes are
/// accessed as i8, and the packed 4-bit codes as i8 too: the raw nibble,
/// zero-extended (0..15) for i4 and ui4 alike (a signed code's decode
/// sign-extends it); a store keeps the low 4 bits (docs/KERNEL-ABI.md,
/// packed buffers).
Type accessType(Type t);

} // namespace mlir::flashopt

#endif // FLASHOPT_DIALECT_FLASHOPT_IR_FLASHOPTDIALECT_H
