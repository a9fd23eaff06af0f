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

#include <cstdint>
#include <optional>
#include <string_view>

namespace flashopt::abi {

enum class DType {
#define FLASHOPT_DTYPE(E, name, bits, st) E,
#include "flashopt/abi/DTypes.def"
};

/// "bf16", "f16", "f32", "i8", "ui8", "i16", "i4", "ui4" (the manifest
/// spelling).
const char *dtype_name(DType t);
/// Parses a manifest dtype name.
std::optional<DType> parse_dtype(std::string_view name);
/// Bits per element: 4 for the packed codes (i4, ui4), else 8, 16 or 32.
int dtype_bits(DType t);
/// Bytes that `count` elements take: ceil(count · bits / 8) (the packed
/// codes' last byte holds a zero pad nibble when count is odd).
inline uint64_t dtype_bytes(DType t, uint64_t count) {
  return (count * uint64_t(dtype_bits(t)) + 7) / 8;
}
/// Whether elements are packed below a byte (i4, ui4).
inline bool dtype_is_packed(DType t) { return dtype_bits(t) < 8; }
/// "BF16", "F16", "F32", "I8", "U8", "I16" (the safetensors spelling).
const char *dtype_safetensors_name(DType t);
/// Parses a safetensors dtype name (only the ones above).
std::optional<DType> parse_safetensors_dtype(std::string_view name);

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_DTYPE_H
