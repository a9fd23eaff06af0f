//===- DLPack.h - DLPack tensors in the C ABI -------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Reading a DLTensor (the standard header from libdlpack-dev): device,
/// dtype, shape, compact row-major strides, byte offset.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_DLPACK_H
#define FLASHOPT_CAPI_DLPACK_H

#include "Objects.h"

namespace flashopt::capi {

/// A DLPack tensor, checked against the context.
struct DLInfo {
  void *data = nullptr;
  flashopt_dtype dtype = FLASHOPT_F32;
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

/// The DLTensor at `ptr`, checked against context `ctx` (device, dtype,
/// shape, strides); `who` prefixes errors.
DLInfo parseDL(const void *ptr, const ContextObj &ctx, const std::string &who);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_DLPACK_H
