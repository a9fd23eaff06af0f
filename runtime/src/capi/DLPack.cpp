//===- DLPack.cpp - DLPack tensors in the C ABI ---------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See DLPack.h.
///
//===----------------------------------------------------------------------===//

#include "DLPack.h"

#include <dlpack/dlpack.h>

#include <limits>

namespace flashopt::capi {

DLInfo parseDL(const void *ptr, const ContextObj &ctx, const std::string &who) {
  const DLTensor *t = static_cast<const DLTensor *>(ptr);
  DLInfo out;
  int want = ctx.type == FLASHOPT_DEVICE_CPU ? kDLCPU : kDLCUDA;
  auto devName = [](int type) -> std::string {
    switch (type) {
    case kDLCPU:
      return "kDLCPU";
    case kDLCUDA:
      return "kDLCUDA";
    case kDLCUDAHost:
      return "kDLCUDAHost";
    default:
      return "device type " + std::to_string(type);
    }
  };
  std::string ctxName =
      ctx.type == FLASHOPT_DEVICE_CPU
          ? std::string("a CPU context")
          : "a CUDA context (device " + std::to_string(ctx.device) + ")";
  if (int(t->device.device_type) != want)
    fail(FLASHOPT_ERROR_DEVICE, who + ": the DLPack tensor is on " +
                                    devName(t->device.device_type) + ":" +
                                    std::to_string(t->device.device_id) +
                                    ", but the optimizer is on " + ctxName);
  if (t->device.device_id != (ctx.type == FLASHOPT_DEVICE_CPU ? 0 : ctx.device))
    fail(FLASHOPT_ERROR_DEVICE, who + ": the DLPack tensor is on " +
                                    devName(t->device.device_type) + ":" +
                                    std::to_string(t->device.device_id) +
                                    ", but the optimizer is on " + ctxName);
  if (t->dtype.lanes != 1)
    fail(FLASHOPT_ERROR_DTYPE, who + ": DLPack dtype has " +
                                   std::to_string(t->dtype.lanes) +
                                   " lanes (only 1 is supported)");
  int code = t->dtype.code, bits = t->dtype.bits;
  if (code == kDLBfloat && bits == 16)
    out.dtype = FLASHOPT_BF16;
  else if (code == kDLFloat && bits == 16)
    out.dtype = FLASHOPT_F16;
  else if (code == kDLFloat && bits == 32)
    out.dtype = FLASHOPT_F32;
  else if (code == kDLInt && bits == 8)
    out.dtype = FLASHOPT_I8;
  else if (code == kDLInt && bits == 16)
    out.dtype = FLASHOPT_I16;
  else if (code == kDLUInt && bits == 8)
    out.dtype = FLASHOPT_U8;
  else
    fail(FLASHOPT_ERROR_DTYPE, who + ": unsupported DLPack dtype (code " +
                                   std::to_string(code) + ", bits " +
                                   std::to_string(bits) + ")");
  if (t->ndim < 0)
    fail(FLASHOPT_ERROR_SIZE, who + ": ndim " + std::to_string(t->ndim));
  if (t->ndim > 0 && !t->shape)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": shape is NULL");
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0)
      fail(FLASHOPT_ERROR_SIZE, who + ": negative dimension in shape");
    out.shape.push_back(t->shape[d]);
    if (t->shape[d] != 0 &&
        numel > std::numeric_limits<int64_t>::max() / t->shape[d])
      fail(FLASHOPT_ERROR_SIZE, who + ": shape overflows");
    numel *= t->shape[d];
  }
  if (t->strides) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
      if (t->shape[d] != 1 && t->strides[d] != expect) {
        std::vector<int64_t> st(t->strides, t->strides + t->ndim);
        fail(FLASHOPT_ERROR_SIZE,
             who + ": not a compact row-major tensor (shape " +
                 shapeString(out.shape) + ", strides " + shapeString(st) + ")");
      }
      expect *= t->shape[d];
    }
  }
  if (t->ndim == 0)
    out.shape = {1};
  out.numel = numel;
  // byte_offset is a uint64_t: one that wraps the address (or is absurd)
  // is an error, not a pointer somewhere else.
  uintptr_t base = reinterpret_cast<uintptr_t>(t->data), addr = 0;
  if (t->byte_offset > uint64_t(std::numeric_limits<int64_t>::max()) ||
      __builtin_add_overflow(base, uintptr_t(t->byte_offset), &addr))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": DLPack byte_offset " +
                                              std::to_string(t->byte_offset) +
                                              " overflows the data pointer");
  out.data = static_cast<char *>(t->data) + t->byte_offset;
  if (!t->data)
    out.data = nullptr;
  return out;
}

} // namespace flashopt::capi
