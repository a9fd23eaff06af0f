//===- Companders.h - companding functions of quantized states --*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The companders of `#flashopt.quant` in one table: FlashOptim's linear
/// codes of a companded value (none, softsign, sqrt: the storage each needs
/// and the IR of its forward and inverse functions, docs/NUMERICS.md §2) and
/// the minifloat codes (e3m4, e4m4: the format, §2d). A new compander is one
/// enum case in FlashOptAttrs.td plus one row of this table.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIALECT_FLASHOPT_IR_COMPANDERS_H
#define FLASHOPT_DIALECT_FLASHOPT_IR_COMPANDERS_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"

#include "mlir/IR/Builders.h"

#include <optional>

namespace mlir::flashopt {

/// One compander: the signedness of the codes it needs and its functions.
/// A compander has two places to act, around the scaling by the group
/// absmax; a null function there is the identity.
struct CompanderInfo {
  /// Emits f32 → f32 at the builder's insertion point.
  using EmitFn = Value (*)(OpBuilder &b, Location loc, Value x);

  Compander kind;
  /// The codes it needs: true for signed (i8), false for unsigned (ui8),
  /// nullopt for either.
  std::optional<bool> signedCodes;
  /// Encode, on the value before the group absmax is taken (sqrt: √x).
  EmitFn compressValue;
  /// Encode, on the value divided by the group absmax, in [-1, 1]
  /// (softsign: 2n / (1 + |n|)).
  EmitFn compressNormalized;
  /// Decode: the inverse of compressNormalized, on code / max code
  /// (softsign: t / (2 - |t|)).
  EmitFn expandNormalized;
  /// Decode: the inverse of compressValue, after the scale (sqrt: x · x).
  EmitFn expandValue;
  /// Whether compressValue's result is never negative (sqrt: √x ≥ 0, or
  /// NaN), so unsigned codes need no clamp at 0.
  bool nonNegative = false;
  /// Whether the codes are minifloats (docs/NUMERICS.md §2d; their format is
  /// abi::minifloat_format of the compander's name, abi/Minifloat.h); the
  /// four functions above are then null.
  bool minifloat = false;

  /// Whether the codes are minifloats.
  bool isMinifloat() const { return minifloat; }
};

/// The table row of `compander`.
const CompanderInfo &getCompanderInfo(Compander compander);

} // namespace mlir::flashopt

#endif // FLASHOPT_DIALECT_FLASHOPT_IR_COMPANDERS_H
