//===- CudaContext.h --------------------------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One device's primary context (name, compute capability, SM count) with
/// small synchronous memory helpers, and DeviceBuffer, device memory owned
/// by one object.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CUDACONTEXT_H
#define FLASHOPT_HOST_CUDACONTEXT_H

#include "flashopt/host/CudaDriver.h"

#include <cstdint>
#include <memory>
#include <string>

namespace flashopt::host {

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

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CUDACONTEXT_H
