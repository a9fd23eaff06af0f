//===- CudaDriver.h ---------------------------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The NVIDIA driver library, loaded at run time: no link-time CUDA
/// dependency and no CUDA header. libcuda.so.1 is dlopen'ed and every entry
/// point of CudaDriverFunctions.def is resolved by name (as IREE does), so
/// the runtime builds everywhere and, without a driver, says so clearly.
/// `cu` holds our own minimal, ABI-compatible declarations of the driver
/// API's types and constants.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CUDADRIVER_H
#define FLASHOPT_HOST_CUDADRIVER_H

#include "flashopt/host/Abi.h"

#include <cstddef>
#include <memory>
#include <string>

namespace flashopt::host {

namespace cu {
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st *;
using CUmodule = struct CUmod_st *;
using CUfunction = struct CUfunc_st *;
using CUstream = struct CUstream_st *;
using CUevent = struct CUevent_st *;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
constexpr CUresult CUDA_ERROR_INVALID_PTX = 218;
constexpr CUresult CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222;

constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_FUNC_ATTRIBUTE_NUM_REGS = 4;
constexpr int CU_JIT_INFO_LOG_BUFFER = 3;
constexpr int CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4;
constexpr int CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr int CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr unsigned CU_STREAM_DEFAULT = 0;
} // namespace cu

//===----------------------------------------------------------------------===//
// CudaDriver
//===----------------------------------------------------------------------===//

/// The NVIDIA driver library, dlopen'ed, with every entry point of
/// CudaDriverFunctions.def resolved and cuInit(0) done.
class CudaDriver {
public:
#define FLASHOPT_CUDA_FUNCTION(name, symbol, fallback, params)                 \
  using PFN_##name = cu::CUresult(*) params;                                   \
  PFN_##name name = nullptr;
#include "flashopt/host/CudaDriverFunctions.def"

  /// The process-wide driver: loaded (libcuda.so.1, or the library named by
  /// the FLASHOPT_CUDA_DRIVER environment variable: tests use a stand-in)
  /// and initialized on the first call for that library, thread-safe; later
  /// calls return the same result. The error
  /// is "CUDA was requested but the NVIDIA driver library libcuda.so.1 could
  /// not be loaded: <dlerror>" or names the entry point or cuInit failure.
  static Expected<const CudaDriver *> get();
  /// Loads and initializes `library` (a soname or path) into a driver of the
  /// caller's own (tests). Never unloaded.
  static Expected<std::unique_ptr<CudaDriver>> load(const std::string &library);

  /// The driver's CUDA version (cuDriverGetVersion: 12040 = 12.4).
  int version() const { return version_; }
  /// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for `r`.
  std::string describe(cu::CUresult r) const;
  /// Success when `r` is CUDA_SUCCESS, else "<what>: <describe(r)>": the
  /// one place a driver result becomes a code, OutOfMemory for
  /// CUDA_ERROR_OUT_OF_MEMORY and Cuda for any other.
  Status check(cu::CUresult r, const std::string &what) const;

  CudaDriver(const CudaDriver &) = delete;
  CudaDriver &operator=(const CudaDriver &) = delete;

private:
  CudaDriver() = default;
  void *handle_ = nullptr;
  int version_ = 0;
};

/// "12.4" for a cuDriverGetVersion value.
std::string cuda_version_string(int version);

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CUDADRIVER_H
