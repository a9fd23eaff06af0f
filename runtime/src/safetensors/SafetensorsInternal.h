//===- SafetensorsInternal.h - What the reader and writer share -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The safetensors limits and message helpers that Safetensors.cpp (reading,
/// dtypes, CRC-32C) and Writer.cpp (atomic writing) share. Not installed.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_RUNTIME_SAFETENSORS_SAFETENSORSINTERNAL_H
#define FLASHOPT_RUNTIME_SAFETENSORS_SAFETENSORSINTERNAL_H

#include "Safetensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace flashopt::host::safetensors::detail {

/// The largest header the reference implementation accepts.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char *kMetadataKey = "__metadata__";

std::string quote(const std::string &s);
std::string errnoText(int err);
/// "BF16 [4, 3]".
std::string describe(DType t, const std::vector<int64_t> &shape);
/// numel and byte size of (dtype, shape); false on a negative dimension or
/// 64-bit overflow.
bool tensorSize(DType t, const std::vector<int64_t> &shape, int64_t *numel,
                int64_t *bytes);

} // namespace flashopt::host::safetensors::detail

#endif // FLASHOPT_RUNTIME_SAFETENSORS_SAFETENSORSINTERNAL_H
