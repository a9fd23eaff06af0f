//===- DType.h - Storage dtypes of the kernel ABI ---------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The dtypes a buffer of the kernel ABI can have, generated from
/// DTypes.def (the one table of names and sizes).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_DTYPE_H
#define FLASHOPT_ABI_DTYPE_H

#include <optional>
#include <string_view>

namespace flashopt::abi {

enum class DType {
#define FLASHOPT_DTYPE(E, name, bytes, st) E,
#include "flashopt/abi/DTypes.def"
};

/// "bf16", "f16", "f32", "i8", "ui8", "i16" (the manifest spelling).
const char *dtype_name(DType t);
/// Parses a manifest dtype name.
std::optional<DType> parse_dtype(std::string_view name);
/// Bytes per element.
int dtype_size(DType t);
/// "BF16", "F16", "F32", "I8", "U8", "I16" (the safetensors spelling).
const char *dtype_safetensors_name(DType t);
/// Parses a safetensors dtype name (only the ones above).
std::optional<DType> parse_safetensors_dtype(std::string_view name);

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_DTYPE_H
