//===- DType.cpp - Storage dtypes of the kernel ABI
//------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/abi/DType.h"

namespace flashopt::abi {

const char *dtype_name(DType t) {
  switch (t) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  case DType::E:                                                               \
    return name;
#include "flashopt/abi/DTypes.def"
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view n) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  if (n == name)                                                               \
    return DType::E;
#include "flashopt/abi/DTypes.def"
  return std::nullopt;
}

int dtype_bits(DType t) {
  switch (t) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  case DType::E:                                                               \
    return bits;
#include "flashopt/abi/DTypes.def"
  }
  return 0;
}

const char *dtype_safetensors_name(DType t) {
  switch (t) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  case DType::E:                                                               \
    return st;
#include "flashopt/abi/DTypes.def"
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view n) {
#define FLASHOPT_DTYPE(E, name, bits, st)                                      \
  if (n == st)                                                                 \
    return DType::E;
#include "flashopt/abi/DTypes.def"
  return std::nullopt;
}

} // namespace flashopt::abi
