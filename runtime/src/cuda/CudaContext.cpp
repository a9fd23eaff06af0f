//===- CudaContext.cpp ----------------------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Primary contexts, context scopes, device memory helpers.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CudaContext.h"

#include <exception>

namespace flashopt::host {

using namespace cu;

Expected<std::shared_ptr<CudaContext>> CudaContext::create(int ordinal) {
  Expected<const CudaDriver *> drv = CudaDriver::get();
  if (!drv)
    return drv.status();
  return create(**drv, ordinal);
}

Expected<std::shared_ptr<CudaContext>> CudaContext::create(const CudaDriver &d,
                                                           int ordinal) {
  try {
    int count = 0;
    Status s = d.check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (!s)
      return s;
    if (count == 0)
      return Status::error(Code::Device,
                           "CUDA was requested but the driver reports no "
                           "CUDA device");
    if (ordinal < 0 || ordinal >= count)
      return Status::error(Code::Device, "CUDA device " +
                                             std::to_string(ordinal) +
                                             " does not exist (there are " +
                                             std::to_string(count) + ")");
    std::shared_ptr<CudaContext> c(new CudaContext());
    c->driver_ = &d;
    CudaDeviceInfo &info = c->info_;
    info.ordinal = ordinal;
    info.driver_version = d.version();
    std::string at = "device " + std::to_string(ordinal);
    if (!(s = d.check(d.cuDeviceGet(&c->device_, ordinal),
                      "cuDeviceGet " + at)))
      return s;
    char name[256] = {0};
    if (!(s = d.check(d.cuDeviceGetName(name, sizeof name - 1, c->device_),
                      "cuDeviceGetName " + at)))
      return s;
    info.name = name;
    auto attr = [&](int a, int *out) {
      return d.check(d.cuDeviceGetAttribute(out, a, c->device_),
                     "cuDeviceGetAttribute(" + std::to_string(a) + ") " + at);
    };
    if (!(s = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                   &info.cc_major)) ||
        !(s = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                   &info.cc_minor)) ||
        !(s = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &info.sm_count)))
      return s;
    size_t total = 0;
    if (!(s = d.check(d.cuDeviceTotalMem(&total, c->device_),
                      "cuDeviceTotalMem " + at)))
      return s;
    info.total_memory = int64_t(total);
    if (!(s = d.check(d.cuDevicePrimaryCtxRetain(&c->context_, c->device_),
                      "cuDevicePrimaryCtxRetain " + at)))
      return s;
    return Expected<std::shared_ptr<CudaContext>>(std::move(c));
  } catch (const std::exception &e) {
    return Status::from_exception(e, "CudaContext::create: ");
  }
}

CudaContext::~CudaContext() {
  if (context_)
    driver_->cuDevicePrimaryCtxRelease(device_);
}

CudaContext::Scope::Scope(const CudaContext &c) : c_(c) {
  status_ = c.driver().check(c.driver().cuCtxPushCurrent(c.context()),
                             "cuCtxPushCurrent");
}

CudaContext::Scope::~Scope() {
  if (status_.ok()) {
    CUcontext popped = nullptr;
    c_.driver().cuCtxPopCurrent(&popped);
  }
}

Status CudaContext::synchronize() const {
  Scope scope(*this);
  if (!scope.ok())
    return scope.status();
  return driver_->check(driver_->cuCtxSynchronize(), "cuCtxSynchronize");
}

Status CudaContext::memory_info(int64_t *free_bytes,
                                int64_t *total_bytes) const {
  Scope scope(*this);
  if (!scope.ok())
    return scope.status();
  size_t f = 0, t = 0;
  Status s = driver_->check(driver_->cuMemGetInfo(&f, &t), "cuMemGetInfo");
  if (free_bytes)
    *free_bytes = int64_t(f);
  if (total_bytes)
    *total_bytes = int64_t(t);
  return s;
}

Expected<CUdeviceptr> CudaContext::allocate(int64_t bytes) const {
  Scope scope(*this);
  if (!scope.ok())
    return scope.status();
  CUdeviceptr p = 0;
  Status s = driver_->check(
      driver_->cuMemAlloc(&p, size_t(std::max<int64_t>(1, bytes))),
      "cuMemAlloc(" + std::to_string(bytes) + " bytes) on " + info_.name);
  if (!s)
    return s;
  return p;
}

void CudaContext::release(CUdeviceptr p) const {
  if (!p)
    return;
  Scope scope(*this);
  if (scope.ok())
    driver_->cuMemFree(p);
}

Status CudaContext::upload(CUdeviceptr dst, const void *src,
                           int64_t bytes) const {
  if (bytes <= 0)
    return Status::success();
  Scope scope(*this);
  if (!scope.ok())
    return scope.status();
  return driver_->check(driver_->cuMemcpyHtoD(dst, src, size_t(bytes)),
                        "cuMemcpyHtoD(" + std::to_string(bytes) + " bytes)");
}

Status CudaContext::download(void *dst, CUdeviceptr src, int64_t bytes) const {
  if (bytes <= 0)
    return Status::success();
  Scope scope(*this);
  if (!scope.ok())
    return scope.status();
  return driver_->check(driver_->cuMemcpyDtoH(dst, src, size_t(bytes)),
                        "cuMemcpyDtoH(" + std::to_string(bytes) + " bytes)");
}

//===----------------------------------------------------------------------===//
// DeviceBuffer
//===----------------------------------------------------------------------===//

Expected<DeviceBuffer> DeviceBuffer::allocate(std::shared_ptr<CudaContext> ctx,
                                              int64_t bytes) {
  if (!ctx)
    return Status::error(Code::InvalidArgument,
                         "DeviceBuffer::allocate: null context");
  Expected<CUdeviceptr> p = ctx->allocate(bytes);
  if (!p)
    return p.status();
  DeviceBuffer b;
  b.ctx_ = std::move(ctx);
  b.ptr_ = *p;
  b.bytes_ = bytes;
  return Expected<DeviceBuffer>(std::move(b));
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
  if (this != &o) {
    reset();
    ctx_ = std::move(o.ctx_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ctx_ && ptr_)
    ctx_->release(ptr_);
  ptr_ = 0;
  bytes_ = 0;
  ctx_.reset();
}

Status DeviceBuffer::upload(const void *src, int64_t bytes) const {
  if (!ctx_ || bytes > bytes_)
    return Status::error(Code::InvalidArgument,
                         "DeviceBuffer::upload: " + std::to_string(bytes) +
                             " bytes into a buffer of " +
                             std::to_string(bytes_));
  return ctx_->upload(ptr_, src, bytes);
}

Status DeviceBuffer::download(void *dst, int64_t bytes) const {
  if (!ctx_ || bytes > bytes_)
    return Status::error(Code::InvalidArgument,
                         "DeviceBuffer::download: " + std::to_string(bytes) +
                             " bytes from a buffer of " +
                             std::to_string(bytes_));
  return ctx_->download(dst, ptr_, bytes);
}

} // namespace flashopt::host
