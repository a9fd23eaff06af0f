//===- Cuda.h - CUDA runtime for flashopt GPU kernels -----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The GPU side of the host runtime: loads a bundle's PTX or cubin with the
/// CUDA driver API and runs its step kernel over device memory. Plain C++17;
/// no link-time CUDA dependency and no CUDA header: libcuda.so.1 is dlopen'ed
/// and every entry point is resolved by name (an X-macro table, as IREE
/// does), so this builds everywhere and, without a driver, says so clearly.
///
///  - `CudaDriver`: the loaded driver library and its entry points.
///  - `CudaContext`: one device's primary context, with its name, compute
///    capability and SM count, and small memory helpers.
///  - `select_gpu_kernel`: which of a manifest's GPU kernels a device runs
///    (pure, unit-tested); `CudaBundle` loads it as a module.
///  - `CudaOptimizer`: the host `Optimizer` API over device memory: param
///    groups, caller-owned device params and grads, runtime-owned device
///    state, tensor and hyper tables uploaded only when they change, and
///    `step()` as one kernel launch with no host synchronization.
///
/// The kernel ABI is the CPU one (docs/KERNEL-ABI.md): six 64-bit
/// parameters, the table and hypers in device memory holding device
/// addresses. Blocks are 256 threads; the grid-stride loop takes any grid.
///
/// No exception escapes the API: fallible calls return `Status` or
/// `Expected<T>`.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CUDA_H
#define FLASHOPT_HOST_CUDA_H

#include "flashopt/host/Harness.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::host {

//===----------------------------------------------------------------------===//
// Driver API types (our own minimal declarations; ABI-compatible with cuda.h)
//===----------------------------------------------------------------------===//

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

// clang-format off
/// The driver entry points used, as X(member, "symbol", "fallback symbol"
/// or nullptr, parameter list). Versioned names (`_v2`) are the ones cuda.h
/// maps the plain names to; a fallback is tried when the first is absent.
#define FLASHOPT_CUDA_DRIVER_FUNCTIONS(X)                                      \
  X(cuInit, "cuInit", nullptr, (unsigned int))                                 \
  X(cuDriverGetVersion, "cuDriverGetVersion", nullptr, (int *))                \
  X(cuGetErrorName, "cuGetErrorName", nullptr, (cu::CUresult, const char **))  \
  X(cuGetErrorString, "cuGetErrorString", nullptr,                             \
    (cu::CUresult, const char **))                                             \
  X(cuDeviceGetCount, "cuDeviceGetCount", nullptr, (int *))                    \
  X(cuDeviceGet, "cuDeviceGet", nullptr, (cu::CUdevice *, int))                \
  X(cuDeviceGetName, "cuDeviceGetName", nullptr, (char *, int, cu::CUdevice))  \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", nullptr,                     \
    (int *, int, cu::CUdevice))                                                \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", nullptr, (size_t *, cu::CUdevice))\
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", nullptr,             \
    (cu::CUcontext *, cu::CUdevice))                                           \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2",                 \
    "cuDevicePrimaryCtxRelease", (cu::CUdevice))                               \
  X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", nullptr, (cu::CUcontext))         \
  X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", nullptr, (cu::CUcontext *))         \
  X(cuCtxSynchronize, "cuCtxSynchronize", nullptr, ())                         \
  X(cuModuleLoadDataEx, "cuModuleLoadDataEx", nullptr,                         \
    (cu::CUmodule *, const void *, unsigned int, int *, void **))              \
  X(cuModuleUnload, "cuModuleUnload", nullptr, (cu::CUmodule))                 \
  X(cuModuleGetFunction, "cuModuleGetFunction", nullptr,                       \
    (cu::CUfunction *, cu::CUmodule, const char *))                            \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", nullptr,                         \
    (int *, int, cu::CUfunction))                                              \
  X(cuLaunchKernel, "cuLaunchKernel", nullptr,                                 \
    (cu::CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,   \
     unsigned int, unsigned int, unsigned int, cu::CUstream, void **,          \
     void **))                                                                 \
  X(cuMemGetInfo, "cuMemGetInfo_v2", nullptr, (size_t *, size_t *))            \
  X(cuMemAlloc, "cuMemAlloc_v2", nullptr, (cu::CUdeviceptr *, size_t))         \
  X(cuMemFree, "cuMemFree_v2", nullptr, (cu::CUdeviceptr))                     \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", nullptr,                                  \
    (cu::CUdeviceptr, const void *, size_t))                                   \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", nullptr,                                  \
    (void *, cu::CUdeviceptr, size_t))                                         \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2", nullptr,                                  \
    (cu::CUdeviceptr, cu::CUdeviceptr, size_t))                                \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", nullptr,                        \
    (cu::CUdeviceptr, const void *, size_t, cu::CUstream))                     \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", nullptr,                        \
    (void *, cu::CUdeviceptr, size_t, cu::CUstream))                           \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", nullptr,                        \
    (cu::CUdeviceptr, cu::CUdeviceptr, size_t, cu::CUstream))                  \
  X(cuMemsetD8, "cuMemsetD8_v2", nullptr,                                      \
    (cu::CUdeviceptr, unsigned char, size_t))                                  \
  X(cuMemsetD8Async, "cuMemsetD8Async", nullptr,                               \
    (cu::CUdeviceptr, unsigned char, size_t, cu::CUstream))                    \
  X(cuStreamCreate, "cuStreamCreate", nullptr, (cu::CUstream *, unsigned int)) \
  X(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy", (cu::CUstream))  \
  X(cuStreamSynchronize, "cuStreamSynchronize", nullptr, (cu::CUstream))       \
  X(cuEventCreate, "cuEventCreate", nullptr, (cu::CUevent *, unsigned int))    \
  X(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy", (cu::CUevent))      \
  X(cuEventRecord, "cuEventRecord", nullptr, (cu::CUevent, cu::CUstream))      \
  X(cuEventSynchronize, "cuEventSynchronize", nullptr, (cu::CUevent))          \
  X(cuEventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime_v2",         \
    (float *, cu::CUevent, cu::CUevent))
// clang-format on

//===----------------------------------------------------------------------===//
// CudaDriver
//===----------------------------------------------------------------------===//

/// The NVIDIA driver library, dlopen'ed, with every entry point of
/// FLASHOPT_CUDA_DRIVER_FUNCTIONS resolved and cuInit(0) done.
class CudaDriver {
public:
#define FLASHOPT_CUDA_PFN(name, symbol, fallback, params)                      \
  using PFN_##name = cu::CUresult(*) params;                                   \
  PFN_##name name = nullptr;
  FLASHOPT_CUDA_DRIVER_FUNCTIONS(FLASHOPT_CUDA_PFN)
#undef FLASHOPT_CUDA_PFN

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
  /// Success when `r` is CUDA_SUCCESS, else "<what>: <describe(r)>".
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

//===----------------------------------------------------------------------===//
// CudaContext
//===----------------------------------------------------------------------===//

/// What a device is.
struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int64_t total_memory = 0; ///< bytes
  int driver_version = 0;   ///< cuDriverGetVersion
  /// The chip number of the compute capability: 90 for 9.0, 100 for 10.0.
  int chip() const { return cc_major * 10 + cc_minor; }
};

/// One device's primary context (retained for the object's lifetime).
/// Methods that call the driver push the context for their duration and
/// pop it after, so they work from any thread and leave the caller's
/// current context alone.
class CudaContext {
public:
  /// Opens device `ordinal`. Errors: the driver cannot be loaded (the
  /// CudaDriver::get() message), no device, or an ordinal out of range.
  static Expected<std::shared_ptr<CudaContext>> create(int ordinal = 0);
  /// Opens device `ordinal` of `driver` (which must outlive the context):
  /// another driver library than libcuda.so.1, e.g. a test's stand-in.
  static Expected<std::shared_ptr<CudaContext>> create(const CudaDriver &driver,
                                                       int ordinal);
  ~CudaContext();
  CudaContext(const CudaContext &) = delete;
  CudaContext &operator=(const CudaContext &) = delete;

  const CudaDriver &driver() const { return *driver_; }
  const CudaDeviceInfo &info() const { return info_; }
  cu::CUcontext context() const { return context_; }
  cu::CUdevice device() const { return device_; }

  /// Pushes this context on the calling thread's stack until destroyed.
  class Scope {
  public:
    explicit Scope(const CudaContext &c);
    ~Scope();
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;
    /// Whether the push succeeded (else status() says why).
    bool ok() const { return status_.ok(); }
    const Status &status() const { return status_; }

  private:
    const CudaContext &c_;
    Status status_;
  };

  /// Waits for all work on the device.
  Status synchronize() const;
  /// Free and total device memory, in bytes.
  Status memory_info(int64_t *free_bytes, int64_t *total_bytes) const;
  /// Allocates `bytes` (at least 1) of device memory (256-byte aligned).
  Expected<cu::CUdeviceptr> allocate(int64_t bytes) const;
  /// Frees memory from allocate(); 0 is ignored.
  void release(cu::CUdeviceptr p) const;
  /// Synchronous copies (ordered after all work of the legacy stream).
  Status upload(cu::CUdeviceptr dst, const void *src, int64_t bytes) const;
  Status download(void *dst, cu::CUdeviceptr src, int64_t bytes) const;

private:
  CudaContext() = default;
  const CudaDriver *driver_ = nullptr;
  cu::CUdevice device_ = 0;
  cu::CUcontext context_ = nullptr;
  CudaDeviceInfo info_;
};

/// Device memory owned by one object (freed with it).
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  /// `bytes` of uninitialized device memory.
  static Expected<DeviceBuffer> allocate(std::shared_ptr<CudaContext> ctx,
                                         int64_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer &&o) noexcept { *this = std::move(o); }
  DeviceBuffer &operator=(DeviceBuffer &&o) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  cu::CUdeviceptr ptr() const { return ptr_; }
  int64_t bytes() const { return bytes_; }
  /// Copies `bytes` from the host to offset 0 (synchronous).
  Status upload(const void *src, int64_t bytes) const;
  /// Copies `bytes` from offset 0 to the host (synchronous).
  Status download(void *dst, int64_t bytes) const;
  /// Frees the memory now.
  void reset();

private:
  std::shared_ptr<CudaContext> ctx_;
  cu::CUdeviceptr ptr_ = 0;
  int64_t bytes_ = 0;
};

//===----------------------------------------------------------------------===//
// Kernel selection
//===----------------------------------------------------------------------===//

/// Which GPU kernel of a manifest a device runs, and how it is loaded.
struct GpuKernelChoice {
  size_t kernel_index = 0; ///< in Manifest::kernels
  std::string target;      ///< "sm_90"
  int chip = 0;            ///< 90
  /// True: load the cubin `image`; false: JIT-compile the PTX `image`.
  bool use_cubin = false;
  std::string image; ///< file name, relative to the bundle
  /// With a cubin: the same chip's PTX (or ""), tried if the cubin does not
  /// load (a cubin newer than the driver).
  std::string ptx_fallback;
  std::string symbol;
  int threads_per_block = 256;
  int elements_per_thread = 0; ///< 0 when the manifest does not say
  /// A line saying what was chosen and why.
  std::string reason;
};

/// Parses "sm_90" / "sm_100" / "sm_90a" into 90 / 100 / 90 and whether the
/// target is architecture-specific ("a" or "f" suffix); false if not an
/// sm_ target.
bool parse_sm_target(std::string_view target, int *chip, bool *arch_specific);

/// Picks the kernel for a device of compute capability cc_major.cc_minor:
/// the exact chip's cubin when the manifest lists one (and `file_exists`,
/// when given, says it is there); else the PTX of the highest chip at or
/// below the device (architecture-specific targets only on their own chip),
/// JIT-compiled by the driver. An error names the device and the targets
/// when no kernel fits, or when the chosen kernel's block size is not 256.
Expected<GpuKernelChoice> select_gpu_kernel(
    const Manifest &m, int cc_major, int cc_minor,
    const std::function<bool(const std::string &)> &file_exists = nullptr);

//===----------------------------------------------------------------------===//
// Launch geometry
//===----------------------------------------------------------------------===//

/// The grid of one launch over `total_groups` groups: enough 256-thread
/// blocks for one pass (each group takes group_size / elements_per_thread
/// lanes; `elements_per_thread` 0 means unknown and assumes the fewest, 4),
/// capped at blocks_per_sm * sm_count (the grid-stride loop does the rest),
/// at least 1. 0 when there is nothing to do.
int64_t gpu_grid_size(int64_t total_groups, int64_t group_size,
                      int elements_per_thread, int threads_per_block,
                      int sm_count, int blocks_per_sm = 8);

//===----------------------------------------------------------------------===//
// CudaBundle
//===----------------------------------------------------------------------===//

/// A bundle's GPU kernel loaded as a module in one context. Shared by the
/// optimizers created from it; unloaded with the last one.
class CudaBundle {
public:
  /// Loads `dir` (holding manifest.json) for the context's device.
  static Expected<std::shared_ptr<CudaBundle>>
  load(std::shared_ptr<CudaContext> ctx, const std::string &dir);
  ~CudaBundle();
  CudaBundle(const CudaBundle &) = delete;
  CudaBundle &operator=(const CudaBundle &) = delete;

  const std::string &dir() const { return dir_; }
  const Manifest &manifest() const { return manifest_; }
  const std::shared_ptr<CudaContext> &context() const { return ctx_; }
  const GpuKernelChoice &choice() const { return choice_; }
  /// What was loaded: "sm_90 cubin" / "sm_80 PTX (JIT)", and the JIT log.
  const std::string &loaded() const { return loaded_; }
  cu::CUfunction function() const { return fn_; }
  /// Registers per thread the loaded function uses (-1 if unknown).
  int registers() const { return registers_; }

private:
  CudaBundle() = default;
  std::shared_ptr<CudaContext> ctx_;
  std::string dir_;
  Manifest manifest_;
  GpuKernelChoice choice_;
  std::string loaded_;
  cu::CUmodule module_ = nullptr;
  cu::CUfunction fn_ = nullptr;
  int registers_ = -1;
};

//===----------------------------------------------------------------------===//
// CudaOptimizer
//===----------------------------------------------------------------------===//

struct CudaOptimizerOptions {
  /// The stream every upload, memset and launch of the optimizer is ordered
  /// on; nullptr is the legacy default stream (ordered with all blocking
  /// streams, so a gradient written on another stream is seen).
  cu::CUstream stream = nullptr;
  /// The grid is at most blocks_per_sm * SM count blocks.
  int blocks_per_sm = 8;
  /// Records longer than this are split (0: gpu_max_record_elements, the
  /// kernel's 32-bit limit). Smaller values test the splitting.
  int64_t max_record_elements = 0;
};

/// The geometry of the next launch.
struct LaunchConfig {
  int64_t grid = 0, block = 0;
  int64_t total_groups = 0;
  int64_t records = 0;
};

/// The host `Optimizer` API over device memory. Params and grads are
/// caller-owned device buffers (16-byte aligned); correction and state
/// buffers are runtime-owned, one device arena per buffer with each tensor's
/// slice at a 64-entry boundary, zeroed. Arenas are sized to the registered
/// tensors when first needed (allocate(), step(), buffer(), download()), and
/// grown (contents kept) when tensors are added later.
class CudaOptimizer {
public:
  /// An optimizer over a loaded GPU bundle, with one param group (slot 0)
  /// holding the manifest's defaults.
  static Expected<std::unique_ptr<CudaOptimizer>>
  create(std::shared_ptr<CudaBundle> bundle,
         const CudaOptimizerOptions &opts = {});
  /// Loads `bundle_dir` on `ctx` and creates an optimizer over it.
  static Expected<std::unique_ptr<CudaOptimizer>>
  create(std::shared_ptr<CudaContext> ctx, const std::string &bundle_dir,
         const CudaOptimizerOptions &opts = {});
  ~CudaOptimizer();
  CudaOptimizer(const CudaOptimizer &) = delete;
  CudaOptimizer &operator=(const CudaOptimizer &) = delete;

  const Manifest &manifest() const;
  const CudaBundle &bundle() const;

  // ---- param groups (hyper slots): as Optimizer --------------------------
  int add_param_group();
  int num_param_groups() const;
  Status set_hyper(int param_group, std::string_view name, float value);
  Status set_hyper_all(std::string_view name, float value);
  Expected<float> hyper(int param_group, std::string_view name) const;
  const std::vector<float> &hyper_table() const;

  // ---- tensors
  // ---------------------------------------------------------------
  /// Registers a tensor of `numel` elements: `param` and `grad` are device
  /// addresses (grad may be 0 until set_grad), 16-byte aligned. Returns the
  /// tensor index. State memory is reserved, not yet allocated.
  Expected<int64_t> add_param(int param_group, cu::CUdeviceptr param,
                              int64_t numel, cu::CUdeviceptr grad);
  /// Re-points a tensor's gradient (re-uploads the table at the next step
  /// only if the address changed).
  Status set_grad(int64_t tensor, cu::CUdeviceptr grad);
  /// Re-points a tensor's parameter storage.
  Status set_param(int64_t tensor, cu::CUdeviceptr param);
  int64_t num_tensors() const;
  int64_t total_groups() const;
  int64_t total_numel() const;
  /// The tensor (param and grad hold device addresses).
  const TensorInfo &tensor(int64_t index) const;
  /// Allocates and zeroes the state of every registered tensor now (else
  /// done by the first step).
  Status allocate();
  /// Buffer `name` of tensor `tensor`; `data` is a device address.
  Expected<BufferView> buffer(int64_t tensor, std::string_view name);
  /// Copies buffer `name` of tensor `tensor` to host memory (waits for the
  /// optimizer's stream first).
  Expected<std::vector<uint8_t>> download(int64_t tensor,
                                          std::string_view name);
  /// The tensor table as uploaded at the last step (device addresses; one
  /// or more records per tensor).
  const std::vector<int64_t> &table() const;
  int64_t num_records() const;

  // ---- stepping ------------------------------------------------------------
  /// t += 1 and one kernel launch over every tensor on the optimizer's
  /// stream, uploading the tensor or hyper table first only if it changed.
  /// No host synchronization. Fails (t unchanged) as Optimizer::step does,
  /// or on a driver error.
  Status step();
  /// As Optimizer::step_tensors: one launch with step number `t` over the
  /// tensors `indices` (ascending, distinct) only; step_count() unchanged.
  /// A contiguous run uses a slice of the uploaded table; another subset
  /// uploads a compacted copy of its records (to a second device table).
  Status step_tensors(const std::vector<int64_t> &indices, int64_t t);
  int64_t step_count() const;
  void set_step_count(int64_t t);
  /// Waits for the optimizer's stream.
  Status synchronize();
  /// The launch the next step makes.
  LaunchConfig launch_config() const;
  /// Table and hyper uploads so far (a plain step adds none).
  int64_t table_uploads() const;
  int64_t hyper_uploads() const;

  // ---- memory
  // ----------------------------------------------------------------
  /// As Optimizer::bytes(); runtime_allocated counts the device arenas and
  /// tables.
  BytesReport bytes() const;

private:
  CudaOptimizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CUDA_H
