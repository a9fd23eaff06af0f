//===- FlashOptDialect.cpp - flashopt dialect and attributes ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Registration of the flashopt dialect and the verifiers of its encoding
/// attributes.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"
#include "flashopt/Dialect/FlashOpt/IR/Companders.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::flashopt;

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.cpp.inc"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "flashopt/Dialect/FlashOpt/IR/FlashOptAttrs.cpp.inc"

void FlashOptDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "flashopt/Dialect/FlashOpt/IR/FlashOptAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Storage type helpers
//===----------------------------------------------------------------------===//

bool mlir::flashopt::isStorageFloatType(Type t) {
  return t && (t.isF32() || t.isBF16() || t.isF16());
}

static bool isSignlessInt(Type t, unsigned width) {
  return t && t.isSignlessInteger(width);
}

static bool isUnsignedInt(Type t, unsigned width) {
  return t && t.isUnsignedInteger(width);
}

std::optional<::flashopt::abi::DType> mlir::flashopt::storageDType(Type t) {
  using ::flashopt::abi::DType;
  if (!t)
    return std::nullopt;
  if (t.isF32())
    return DType::F32;
  if (t.isBF16())
    return DType::BF16;
  if (t.isF16())
    return DType::F16;
  if (isSignlessInt(t, 8))
    return DType::I8;
  if (isUnsignedInt(t, 8))
    return DType::U8;
  if (isSignlessInt(t, 16))
    return DType::I16;
  if (isSignlessInt(t, 4))
    return DType::I4;
  if (isUnsignedInt(t, 4))
    return DType::U4;
  return std::nullopt;
}

Type mlir::flashopt::storageType(MLIRContext *ctx, ::flashopt::abi::DType d) {
  using ::flashopt::abi::DType;
  Builder b(ctx);
  switch (d) {
  case DType::F32:
    return b.getF32Type();
  case DType::BF16:
    return b.getBF16Type();
  case DType::F16:
    return b.getF16Type();
  case DType::I8:
    return b.getIntegerType(8);
  case DType::U8:
    return IntegerType::get(ctx, 8, IntegerType::Unsigned);
  case DType::I16:
    return b.getIntegerType(16);
  case DType::I4:
    return b.getIntegerType(4);
  case DType::U4:
    return IntegerType::get(ctx, 4, IntegerType::Unsigned);
  }
  return nullptr;
}

std::string mlir::flashopt::storageTypeName(Type t) {
  std::optional<::flashopt::abi::DType> d = storageDType(t);
  return d ? ::flashopt::abi::dtype_name(*d) : "";
}

Type mlir::flashopt::parseStorageTypeName(MLIRContext *ctx,
                                          llvm::StringRef name) {
  std::optional<::flashopt::abi::DType> d =
      ::flashopt::abi::parse_dtype(std::string_view(name.data(), name.size()));
  return d ? storageType(ctx, *d) : nullptr;
}

Type mlir::flashopt::accessType(Type t) {
  if (auto it = dyn_cast<IntegerType>(t))
    if (!it.isSignless() || it.getWidth() < 8)
      return IntegerType::get(t.getContext(), std::max(8u, it.getWidth()));
  return t;
}

static std::string typeString(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (t)
    os << t;
  else
    os << "<<null>>";
  return s;
}

//===----------------------------------------------------------------------===//
// MasterAttr
//===----------------------------------------------------------------------===//

LogicalResult
MasterAttr::verify(function_ref<InFlightDiagnostic()> emitError, Type paramType,
                   Type correction) {
  if (!isStorageFloatType(paramType))
    return emitError() << "parameter type must be bf16, f16 or f32, got "
                       << typeString(paramType);
  if (!correction)
    return success();
  if (!isSignlessInt(correction, 8) && !isSignlessInt(correction, 16))
    return emitError() << "correction must be i8 or i16, got "
                       << typeString(correction);
  if (paramType.isF32())
    return emitError() << "f32 parameters take no correction term";
  return success();
}

//===----------------------------------------------------------------------===//
// QuantAttr
//===----------------------------------------------------------------------===//

bool QuantAttr::isSigned() const { return getStorage().isSignlessInteger(); }

LogicalResult QuantAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                Type storage, int64_t group, Compander compand,
                                Type scale) {
  bool is8 = isSignlessInt(storage, 8) || isUnsignedInt(storage, 8);
  bool is4 = isSignlessInt(storage, 4) || isUnsignedInt(storage, 4);
  if (!is8 && !is4)
    return emitError() << "quantized storage must be i8, ui8, i4 or ui4, got "
                       << typeString(storage);
  if (group < 16 || group > 128 || !llvm::isPowerOf2_64(group))
    return emitError() << "group size must be a power of two in [16, 128], got "
                       << group;
  if (!isStorageFloatType(scale))
    return emitError() << "scale type must be f16, bf16 or f32, got "
                       << typeString(scale);
  // A code's width is its storage's: the 4-bit minifloats in i4/ui4, every
  // other compander in i8/ui8; and its signedness the compander's.
  std::optional<::flashopt::abi::MinifloatFormat> fmt =
      ::flashopt::abi::minifloat_format(stringifyCompander(compand));
  unsigned bits = fmt ? unsigned(fmt->codeBits()) : 8u;
  bool signedStorage = storage.isSignlessInteger();
  std::optional<bool> needsSigned = getCompanderInfo(compand).signedCodes;
  if (bits != storage.getIntOrFloatBitWidth() ||
      (needsSigned && *needsSigned != signedStorage)) {
    bool s = needsSigned.value_or(signedStorage);
    return emitError() << stringifyCompander(compand) << " compander needs "
                       << (s ? "signed (i" : "unsigned (ui") << bits
                       << ") storage, got " << typeString(storage);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// PlainAttr
//===----------------------------------------------------------------------===//

LogicalResult PlainAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                Type storage) {
  if (!isStorageFloatType(storage))
    return emitError() << "plain storage must be f32, bf16 or f16, got "
                       << typeString(storage);
  return success();
}

//===----------------------------------------------------------------------===//
// BufferAttr
//===----------------------------------------------------------------------===//

LogicalResult BufferAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                 StringRef name, Type elementType,
                                 BufferRate rate, BufferAccess access) {
  if (name.empty())
    return emitError() << "buffer name must not be empty";
  if (storageTypeName(elementType).empty())
    return emitError() << "buffer element type must be one of bf16, f16, f32, "
                          "i8, ui8, i16, i4, ui4, got "
                       << typeString(elementType);
  return success();
}
