//===- ReduceKernels.h - Device kernels of the NCCL reduction ---*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The one device kernel the NCCL communicator needs besides NCCL itself,
/// as PTX text (JIT-compiled by the driver; run by the PTX interpreter under
/// the stand-in driver):
///
///   flashopt_nccl_combine_<S>_<D>(src, dst, n, stride_bytes, parts, div)
///     for i < n: acc = widen(src[i]);
///                for r = 1 .. parts-1: acc = acc + widen(src[i] at r*stride)
///                dst[i] = narrow(acc / div)       (f32, round to nearest)
///
/// for S, D in {bf16, f16, f32}: with parts = W and div = W it is the
/// deterministic owner's sum (rank order, f32, divided once, rounded once:
/// the same operations as the host path of dist/DataParallel.cpp); with
/// parts = 1 it widens (div = 1, exact) or averages and narrows (div = W).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_NCCL_REDUCEKERNELS_H
#define FLASHOPT_NCCL_REDUCEKERNELS_H

#include <string>

namespace flashopt::nccl {

/// The dtypes the kernels read and write, numbered as flashopt_dtype.
constexpr int kNumKernelDTypes = 3; // BF16 = 0, F16 = 1, F32 = 2

/// "flashopt_nccl_combine_bf16_f32" for (FLASHOPT_BF16, FLASHOPT_F32).
std::string combine_kernel_name(int src_dtype, int dst_dtype);

/// The PTX module holding every combine kernel (NUL-terminated text).
const std::string &combine_kernels_ptx();

} // namespace flashopt::nccl

#endif // FLASHOPT_NCCL_REDUCEKERNELS_H
