//===- CApi.cpp - The libflashopt C ABI
//-------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt.h over the internal C++ layer: CPU contexts wrap
/// host::Optimizer, CUDA contexts host::CudaOptimizer.
///
///  - Handles are ids (never reused) looked up in a global registry under a
///    mutex; a destroyed or unknown handle is FLASHOPT_ERROR_INVALID_HANDLE,
///    never dereferenced. Each optimizer call holds the optimizer's mutex.
///  - Errors: every entry point runs its body in `guard`, which clears the
///    thread-local last error, turns an ApiError (status + message) into the
///    status and the message "<function>: <object>: <reason>", and every
///    other exception into OUT_OF_MEMORY or INTERNAL. Nothing escapes.
///  - Per-parameter step counters (gradient release): flashopt_step runs one
///    kernel call per distinct counter value (one call when all are equal),
///    flashopt_step_param one call over the parameter's records.
///  - Checkpoints: safetensors (Safetensors.h) with the layout of
///    docs/RUNTIME.md; the fp32 form goes through Codec.h.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Codec.h"
#include "Safetensors.h"
#include "flashopt/host/Cuda.h"
#include "flashopt/host/Harness.h"

#include <dlpack/dlpack.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <unordered_map>
#include <vector>

using namespace flashopt::host;
using json = nlohmann::json;

namespace {

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

thread_local std::string lastError;

/// Thrown inside this file only; caught by guard().
struct ApiError {
  flashopt_status status;
  std::string message;
};

[[noreturn]] void fail(flashopt_status s, std::string message) {
  throw ApiError{s, std::move(message)};
}

/// Runs `body` for entry point `fn`: clears the last error, maps failures to
/// a status and a message. No exception escapes.
template <typename F> flashopt_status guard(const char *fn, F &&body) noexcept {
  try {
    lastError.clear();
    body();
    return FLASHOPT_OK;
  } catch (const ApiError &e) {
    try {
      lastError = std::string(fn) + ": " + e.message;
    } catch (...) {
    }
    return e.status;
  } catch (const std::bad_alloc &) {
    try {
      lastError = std::string(fn) + ": out of memory";
    } catch (...) {
    }
    return FLASHOPT_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception &e) {
    try {
      lastError = std::string(fn) + ": internal error: " + e.what();
    } catch (...) {
    }
    return FLASHOPT_ERROR_INTERNAL;
  } catch (...) {
    try {
      lastError = std::string(fn) + ": internal error (unknown exception)";
    } catch (...) {
    }
    return FLASHOPT_ERROR_INTERNAL;
  }
}

std::string quote(const std::string &s) { return "'" + s + "'"; }

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string fmt(double v) {
  std::ostringstream os;
  os.precision(6);
  os << v;
  return os.str();
}

//===----------------------------------------------------------------------===//
// Dtypes
//===----------------------------------------------------------------------===//

bool validDtype(int d) { return d >= FLASHOPT_BF16 && d <= FLASHOPT_I16; }

DType toHost(flashopt_dtype d) {
  switch (d) {
  case FLASHOPT_BF16:
    return DType::BF16;
  case FLASHOPT_F16:
    return DType::F16;
  case FLASHOPT_F32:
    return DType::F32;
  case FLASHOPT_I8:
    return DType::I8;
  case FLASHOPT_U8:
    return DType::U8;
  case FLASHOPT_I16:
    return DType::I16;
  }
  return DType::F32;
}

flashopt_dtype toC(DType d) {
  switch (d) {
  case DType::BF16:
    return FLASHOPT_BF16;
  case DType::F16:
    return FLASHOPT_F16;
  case DType::F32:
    return FLASHOPT_F32;
  case DType::I8:
    return FLASHOPT_I8;
  case DType::U8:
    return FLASHOPT_U8;
  case DType::I16:
    return FLASHOPT_I16;
  }
  return FLASHOPT_F32;
}

std::string dtypeText(int d) {
  if (validDtype(d))
    return dtype_name(toHost(flashopt_dtype(d)));
  return "dtype " + std::to_string(d) + " (not a flashopt_dtype)";
}

//===----------------------------------------------------------------------===//
// Objects and the handle registry
//===----------------------------------------------------------------------===//

struct OptObj;

struct ContextObj {
  flashopt_device_type type = FLASHOPT_DEVICE_CPU;
  int device = 0;
  int threads = 0;
  std::shared_ptr<CudaContext> cuda;
  std::mutex mu; ///< guards threads and opts
  std::vector<std::weak_ptr<OptObj>> opts;
};

struct ParamRec {
  std::string name;
  int64_t numel = 0;
  int32_t group = 0;
  std::vector<int64_t> shape;
  int64_t step = 0;
  uintptr_t param = 0;
  int64_t paramBytes = 0;
};

struct OptObj {
  std::mutex mu; ///< held by every call on the optimizer
  std::shared_ptr<ContextObj> ctx;
  std::unique_ptr<Optimizer> cpu;
  std::unique_ptr<CudaOptimizer> gpu;
  const Manifest *m = nullptr;
  std::deque<ParamRec> params; ///< a deque: name and shape pointers stay put
  std::map<std::string, int64_t> byName;
  /// Every checkpoint tensor name of every parameter -> its parameter.
  std::map<std::string, int64_t> tensorNames;
  int64_t globalStep = 0, skipped = 0;
  flashopt_nonfinite_policy policy = FLASHOPT_NONFINITE_PROPAGATE;

  bool isGpu() const { return gpu != nullptr; }

  std::string describe(int64_t i) const {
    return "parameter " + quote(params[size_t(i)].name) + " (index " +
           std::to_string(i) + ")";
  }

  // ---- dispatch to the CPU or GPU optimizer --------------------------------
  int numGroups() const {
    return gpu ? gpu->num_param_groups() : cpu->num_param_groups();
  }
  int addGroup() {
    return gpu ? gpu->add_param_group() : cpu->add_param_group();
  }
  Status setHyper(int g, const std::string &n, float v) {
    return gpu ? gpu->set_hyper(g, n, v) : cpu->set_hyper(g, n, v);
  }
  Expected<float> hyper(int g, const std::string &n) const {
    return gpu ? gpu->hyper(g, n) : cpu->hyper(g, n);
  }
  const std::vector<float> &hyperTable() const {
    return gpu ? gpu->hyper_table() : cpu->hyper_table();
  }
  Expected<int64_t> addParam(int g, void *p, int64_t n, const void *grad) {
    if (gpu)
      return gpu->add_param(g, cu::CUdeviceptr(uintptr_t(p)), n,
                            cu::CUdeviceptr(uintptr_t(grad)));
    return cpu->add_param(g, p, n, const_cast<void *>(grad));
  }
  Status setGrad(int64_t i, const void *grad) {
    if (gpu)
      return gpu->set_grad(i, cu::CUdeviceptr(uintptr_t(grad)));
    return cpu->set_grad(i, const_cast<void *>(grad));
  }
  const TensorInfo &tensor(int64_t i) const {
    return gpu ? gpu->tensor(i) : cpu->tensor(i);
  }
  Status stepTensors(const std::vector<int64_t> &idx, int64_t t) {
    return gpu ? gpu->step_tensors(idx, t) : cpu->step_tensors(idx, t);
  }
  void setStepCount(int64_t t) {
    if (gpu)
      gpu->set_step_count(t);
    else
      cpu->set_step_count(t);
  }
  BytesReport bytes() const { return gpu ? gpu->bytes() : cpu->bytes(); }

  /// The host bytes of buffer `name` of parameter `i`.
  std::vector<uint8_t> read(int64_t i, const std::string &name) {
    if (gpu) {
      Expected<std::vector<uint8_t>> d = gpu->download(i, name);
      if (!d)
        fail(FLASHOPT_ERROR_CUDA, describe(i) + ": " + d.error());
      return std::move(d.value());
    }
    Expected<BufferView> v = cpu->buffer(i, name);
    if (!v)
      fail(FLASHOPT_ERROR_INTERNAL, describe(i) + ": " + v.error());
    const uint8_t *p = static_cast<const uint8_t *>(v->data);
    return std::vector<uint8_t>(p, p + v->bytes);
  }
  /// Overwrites buffer `name` of parameter `i` with `bytes` host bytes.
  void write(int64_t i, const std::string &name, const void *data,
             int64_t bytes) {
    if (gpu) {
      Expected<BufferView> v = gpu->buffer(i, name);
      if (!v)
        fail(FLASHOPT_ERROR_CUDA, describe(i) + ": " + v.error());
      if (v->bytes != bytes)
        fail(FLASHOPT_ERROR_INTERNAL,
             describe(i) + ": buffer " + name + " size mismatch");
      Status s = gpu->synchronize();
      if (s)
        s = gpu->bundle().context()->upload(cu::CUdeviceptr(uintptr_t(v->data)),
                                            data, bytes);
      if (!s)
        fail(FLASHOPT_ERROR_CUDA, describe(i) + ": " + s.message());
      return;
    }
    Expected<BufferView> v = cpu->buffer(i, name);
    if (!v || v->bytes != bytes)
      fail(FLASHOPT_ERROR_INTERNAL,
           describe(i) + ": buffer " + name + " unavailable or resized");
    std::memcpy(v->data, data, size_t(bytes));
  }
};

struct Registry {
  std::mutex mu;
  uint64_t next = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ContextObj>> contexts;
  std::unordered_map<uint64_t, std::shared_ptr<OptObj>> optimizers;
};

Registry &registry() {
  static Registry *r = new Registry(); // never destroyed: safe at exit
  return *r;
}

uint64_t idOf(const void *h) {
  return uint64_t(reinterpret_cast<uintptr_t>(h));
}

std::string handleText(const void *h) {
  std::ostringstream os;
  os << "0x" << std::hex << idOf(h);
  return os.str();
}

/// The live object behind handle `h` in `map` ("context"/"optimizer" in
/// messages); with `take`, it also leaves the registry (destroy).
template <typename T>
std::shared_ptr<T> findHandle(std::unordered_map<uint64_t, std::shared_ptr<T>> &map,
                              const void *h, const char *kind, bool take) {
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = map.find(idOf(h));
  if (!h || it == map.end())
    fail(FLASHOPT_ERROR_INVALID_HANDLE,
         std::string(kind) + " handle " + handleText(h) + " is not a live " +
             kind + " (destroyed, or never created)");
  std::shared_ptr<T> obj = it->second;
  if (take)
    map.erase(it);
  return obj;
}

std::shared_ptr<ContextObj> getContext(flashopt_context h) {
  return findHandle(registry().contexts, h, "context", /*take=*/false);
}

std::shared_ptr<OptObj> getOptimizer(flashopt_optimizer h) {
  return findHandle(registry().optimizers, h, "optimizer", /*take=*/false);
}

/// Looks up an optimizer and holds its mutex for the call.
struct Locked {
  std::shared_ptr<OptObj> obj;
  std::unique_lock<std::mutex> lock;
  explicit Locked(flashopt_optimizer h) : obj(getOptimizer(h)), lock(obj->mu) {}
  OptObj *operator->() const { return obj.get(); }
  OptObj &operator*() const { return *obj; }
};

template <typename T> void needOut(T *p, const char *what) {
  if (!p)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, std::string(what) + " is NULL");
}

void checkIndex(const OptObj &o, int64_t i) {
  if (i < 0 || i >= int64_t(o.params.size()))
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter index " + std::to_string(i) + " is out of range (" +
             std::to_string(o.params.size()) + " registered)");
}

void checkGroup(const OptObj &o, int32_t g) {
  if (g < 0 || g >= o.numGroups())
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "param group " + std::to_string(g) + " does not exist (there are " +
             std::to_string(o.numGroups()) + ")");
}

bool fileExists(const std::string &path, int *err) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0)
    return true;
  *err = errno;
  return false;
}

//===----------------------------------------------------------------------===//
// Bundles
//===----------------------------------------------------------------------===//

/// Maps a bundle load failure to a status.
[[noreturn]] void bundleFailure(const std::string &dir, const Status &s) {
  int err = 0;
  if (!fileExists(dir, &err))
    fail(FLASHOPT_ERROR_NOT_FOUND,
         "bundle directory " + quote(dir) + ": " + std::strerror(err));
  if (!fileExists(dir + "/manifest.json", &err))
    fail(FLASHOPT_ERROR_NOT_FOUND, "bundle " + quote(dir) +
                                       " has no manifest.json (" +
                                       std::strerror(err) + ")");
  const std::string &m = s.message();
  if (m.find("CUDA_ERROR") != std::string::npos)
    fail(FLASHOPT_ERROR_CUDA, m);
  if (m.find("no GPU kernel") != std::string::npos ||
      m.find("no CPU kernel") != std::string::npos)
    fail(FLASHOPT_ERROR_UNSUPPORTED, m);
  fail(FLASHOPT_ERROR_FORMAT, m);
}

std::shared_ptr<OptObj> createOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                        const std::string &dir) {
  auto o = std::make_shared<OptObj>();
  o->ctx = ctx;
  if (ctx->type == FLASHOPT_DEVICE_CPU) {
    OptimizerOptions opts;
    {
      std::lock_guard<std::mutex> lock(ctx->mu);
      opts.threads = ctx->threads;
    }
    Expected<std::unique_ptr<Optimizer>> cpu = Optimizer::create(dir, {}, opts);
    if (!cpu)
      bundleFailure(dir, cpu.status());
    o->cpu = std::move(cpu.value());
    o->m = &o->cpu->manifest();
  } else {
    Expected<std::unique_ptr<CudaOptimizer>> gpu =
        CudaOptimizer::create(ctx->cuda, dir);
    if (!gpu)
      bundleFailure(dir, gpu.status());
    o->gpu = std::move(gpu.value());
    o->m = &o->gpu->manifest();
  }
  return o;
}

flashopt_optimizer registerOptimizer(const std::shared_ptr<ContextObj> &ctx,
                                     std::shared_ptr<OptObj> o) {
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->opts.erase(std::remove_if(ctx->opts.begin(), ctx->opts.end(),
                                   [](const std::weak_ptr<OptObj> &w) {
                                     return w.expired();
                                   }),
                    ctx->opts.end());
    ctx->opts.push_back(o);
  }
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t id = r.next++;
  r.optimizers.emplace(id, std::move(o));
  return reinterpret_cast<flashopt_optimizer>(uintptr_t(id));
}

/// A private temporary directory, removed with the object.
struct TempDir {
  std::string path;
  TempDir() {
    std::string base = std::filesystem::temp_directory_path().string();
    std::vector<char> tmpl(base.begin(), base.end());
    const char *suffix = "/flashopt-bundle-XXXXXX";
    tmpl.insert(tmpl.end(), suffix, suffix + std::strlen(suffix) + 1);
    if (!mkdtemp(tmpl.data())) {
      int err = errno;
      fail(FLASHOPT_ERROR_IO, std::string("cannot create a temporary "
                                          "directory in ") +
                                  base + ": " + std::strerror(err));
    }
    path = tmpl.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

/// The checkpoint tensor names of a parameter called `name` (both forms).
std::vector<std::string> tensorNamesOf(const Manifest &m,
                                       const std::string &name) {
  std::vector<std::string> out{name};
  if (m.correction)
    out.push_back(name + ".correction");
  for (const StateSpec &s : m.states) {
    if (s.kind == StateKind::Elided)
      continue;
    out.push_back(name + "." + s.name);
    if (s.kind == StateKind::Quantized) {
      out.push_back(name + "." + s.name + ".codes");
      out.push_back(name + "." + s.name + ".scales");
    }
  }
  return out;
}

/// Registers a parameter after the common checks.
void addParam(OptObj &o, int32_t group, const char *cname, void *param,
              flashopt_dtype pdt, int64_t numel, const void *grad,
              flashopt_dtype gdt, std::vector<int64_t> shape,
              int64_t *out_index) {
  needOut(out_index, "out_index");
  int64_t index = int64_t(o.params.size());
  if (cname && !*cname)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         "parameter " + std::to_string(index) +
             ": the name is empty (pass NULL for \"p<index>\")");
  std::string name = cname ? cname : "p" + std::to_string(index);
  std::string who = "parameter " + quote(name);
  checkGroup(o, group);
  if (!param)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": the param pointer is NULL");
  if (numel <= 0)
    fail(FLASHOPT_ERROR_SIZE,
         who + ": numel must be > 0, got " + std::to_string(numel));
  if (numel > (int64_t(1) << 56))
    fail(FLASHOPT_ERROR_SIZE,
         who + ": numel " + std::to_string(numel) + " is too large");
  const Manifest &m = *o.m;
  if (!validDtype(pdt) || toHost(pdt) != m.param)
    fail(FLASHOPT_ERROR_DTYPE, who + ": param dtype is " + dtypeText(pdt) +
                                   ", but " + m.name + " takes " +
                                   dtype_name(m.param) + " parameters");
  if (grad && (!validDtype(gdt) || toHost(gdt) != m.grad))
    fail(FLASHOPT_ERROR_DTYPE, who + ": grad dtype is " + dtypeText(gdt) +
                                   ", but " + m.name + " takes " +
                                   dtype_name(m.grad) + " gradients");
  if (uintptr_t(param) % 16 != 0 || uintptr_t(grad) % 16 != 0)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         who + ": the " + (uintptr_t(param) % 16 ? "param" : "grad") +
             " address is not 16-byte aligned");
  // Names: unique, and no checkpoint tensor name shared with another
  // parameter ("w.correction" as a name next to a parameter "w").
  auto same = o.byName.find(name);
  if (same != o.byName.end())
    fail(FLASHOPT_ERROR_ALREADY_EXISTS,
         who + ": a parameter with this name is already registered (index " +
             std::to_string(same->second) + ")");
  std::vector<std::string> names = tensorNamesOf(m, name);
  for (const std::string &n : names) {
    auto it = o.tensorNames.find(n);
    if (it != o.tensorNames.end())
      fail(FLASHOPT_ERROR_ALREADY_EXISTS, who + ": its checkpoint tensor " +
                                              quote(n) + " clashes with " +
                                              o.describe(it->second));
  }
  // Memory: the same (or overlapping) param memory is registered once.
  int64_t bytes = numel * dtype_size(m.param);
  uintptr_t lo = uintptr_t(param), hi = lo + uintptr_t(bytes);
  for (size_t i = 0; i < o.params.size(); ++i) {
    const ParamRec &p = o.params[i];
    if (lo < p.param + uintptr_t(p.paramBytes) && p.param < hi)
      fail(FLASHOPT_ERROR_ALREADY_EXISTS,
           who + ": its param memory " + (lo == p.param ? "is" : "overlaps") +
               " that of " + o.describe(int64_t(i)) + ", already registered");
  }
  Expected<int64_t> r = o.addParam(group, param, numel, grad);
  if (!r) {
    const std::string &e = r.error();
    fail(e.find("out of memory") != std::string::npos
             ? FLASHOPT_ERROR_OUT_OF_MEMORY
             : FLASHOPT_ERROR_INTERNAL,
         who + ": " + e);
  }
  ParamRec rec;
  rec.name = name;
  rec.numel = numel;
  rec.group = group;
  rec.shape = shape.empty() ? std::vector<int64_t>{numel} : std::move(shape);
  rec.param = lo;
  rec.paramBytes = bytes;
  o.params.push_back(std::move(rec));
  o.byName.emplace(name, index);
  for (const std::string &n : names)
    o.tensorNames.emplace(n, index);
  *out_index = index;
}

/// A DLPack tensor, checked against the context.
struct DLInfo {
  void *data = nullptr;
  flashopt_dtype dtype = FLASHOPT_F32;
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

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
  out.data = static_cast<char *>(t->data) + t->byte_offset;
  if (!t->data)
    out.data = nullptr;
  return out;
}

//===----------------------------------------------------------------------===//
// Stepping helpers
//===----------------------------------------------------------------------===//

[[noreturn]] void stepFailure(OptObj &o, const Status &s);

/// Fails (STATE) unless tensors `idx` have gradients and every hyper
/// without default was set.
void checkStepReady(OptObj &o, const std::vector<int64_t> &idx) {
  for (int64_t i : idx)
    if (!o.tensor(i).grad)
      fail(FLASHOPT_ERROR_STATE,
           o.describe(i) + " has no gradient (flashopt_add_param with a "
                           "grad, or flashopt_set_grad)");
  // An empty step checks the hyper table and runs nothing.
  Status s = o.stepTensors({}, 0);
  if (!s)
    stepFailure(o, s);
}

[[noreturn]] void stepFailure(OptObj &o, const Status &s) {
  const std::string &m = s.message();
  if (m.find("never set") != std::string::npos)
    fail(FLASHOPT_ERROR_STATE, m);
  if (o.isGpu())
    fail(FLASHOPT_ERROR_CUDA, m);
  fail(FLASHOPT_ERROR_INTERNAL, m);
}

/// Whether the gradients of `idx` are all finite (CPU only).
bool gradsFinite(OptObj &o, const std::vector<int64_t> &idx) {
  return o.cpu->grads_finite(idx);
}

//===----------------------------------------------------------------------===//
// Master weights
//===----------------------------------------------------------------------===//

std::vector<float> exportMaster(OptObj &o, int64_t i) {
  const Manifest &m = *o.m;
  int64_t n = o.params[size_t(i)].numel;
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<uint8_t> param = o.read(i, "param");
  std::vector<uint8_t> corr;
  if (m.correction)
    corr = o.read(i, "correction");
  codec::decode_master(param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction, n,
                       out.data());
  return out;
}

void importMaster(OptObj &o, int64_t i, const float *in) {
  const Manifest &m = *o.m;
  int64_t n = o.params[size_t(i)].numel;
  std::vector<uint8_t> param(size_t(n * dtype_size(m.param)));
  std::vector<uint8_t> corr;
  if (m.correction)
    corr.resize(size_t(n * dtype_size(*m.correction)));
  codec::encode_master(in, n, param.data(), m.param,
                       m.correction ? corr.data() : nullptr, m.correction);
  o.write(i, "param", param.data(), int64_t(param.size()));
  if (m.correction)
    o.write(i, "correction", corr.data(), int64_t(corr.size()));
}

//===----------------------------------------------------------------------===//
// Checkpoints
//===----------------------------------------------------------------------===//

constexpr const char *kCheckpointFormat = "flashopt.checkpoint";

/// One tensor a checkpoint of this optimizer holds.
struct Expect {
  std::string name;
  int64_t param = 0;
  std::string buffer; ///< the optimizer buffer ("" for an F32 master/state)
  std::string state;  ///< F32 form: the state (or "" for the master)
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

std::vector<Expect> expectedTensors(const OptObj &o, bool f32) {
  const Manifest &m = *o.m;
  std::vector<Expect> out;
  for (size_t i = 0; i < o.params.size(); ++i) {
    const ParamRec &p = o.params[i];
    std::vector<int64_t> groups{(p.numel + m.group_size - 1) / m.group_size};
    if (f32) {
      out.push_back({p.name, int64_t(i), "", "", DType::F32, p.shape});
      for (const StateSpec &s : m.states)
        if (s.kind != StateKind::Elided)
          out.push_back({p.name + "." + s.name, int64_t(i), "", s.name,
                         DType::F32, p.shape});
      continue;
    }
    out.push_back({p.name, int64_t(i), "param", "", m.param, p.shape});
    if (m.correction)
      out.push_back({p.name + ".correction", int64_t(i), "correction", "",
                     *m.correction, p.shape});
    for (const StateSpec &s : m.states) {
      if (s.kind == StateKind::Quantized) {
        out.push_back({p.name + "." + s.name + ".codes", int64_t(i),
                       s.name + ".codes", "", s.storage, p.shape});
        out.push_back({p.name + "." + s.name + ".scales", int64_t(i),
                       s.name + ".scales", "", s.scale, groups});
      } else if (s.kind == StateKind::Plain) {
        out.push_back({p.name + "." + s.name, int64_t(i), s.name, "", s.storage,
                       p.shape});
      }
    }
  }
  return out;
}

void saveCheckpoint(OptObj &o, const std::string &path,
                    flashopt_checkpoint_format format) {
  const Manifest &m = *o.m;
  bool f32 = format == FLASHOPT_CHECKPOINT_F32;
  std::vector<Expect> ex = expectedTensors(o, f32);
  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(ex.size());
  std::vector<safetensors::TensorRef> refs;
  std::vector<float> master;
  for (const Expect &e : ex) {
    const ParamRec &p = o.params[size_t(e.param)];
    if (!f32) {
      storage.push_back(o.read(e.param, e.buffer));
    } else if (e.state.empty()) {
      master = exportMaster(o, e.param);
      const uint8_t *b = reinterpret_cast<const uint8_t *>(master.data());
      storage.emplace_back(b, b + master.size() * sizeof(float));
    } else {
      const StateSpec *s = nullptr;
      for (const StateSpec &st : m.states)
        if (st.name == e.state)
          s = &st;
      std::vector<float> v(size_t(p.numel));
      if (s->kind == StateKind::Quantized) {
        std::vector<uint8_t> codes = o.read(e.param, s->name + ".codes");
        std::vector<uint8_t> scales = o.read(e.param, s->name + ".scales");
        codec::dequantize(codes.data(), s->storage, scales.data(), s->scale,
                          s->compand, m.group_size, p.numel, v.data());
      } else {
        std::vector<uint8_t> plain = o.read(e.param, s->name);
        codec::widen(plain.data(), s->storage, p.numel, v.data());
      }
      const uint8_t *b = reinterpret_cast<const uint8_t *>(v.data());
      storage.emplace_back(b, b + v.size() * sizeof(float));
    }
    safetensors::TensorRef r;
    r.name = e.name;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.data = storage.back().data();
    refs.push_back(std::move(r));
  }

  json params = json::array();
  for (const ParamRec &p : o.params)
    params.push_back({{"name", p.name},
                      {"group", p.group},
                      {"step", p.step},
                      {"numel", p.numel},
                      {"shape", p.shape}});
  json groups = json::array();
  const std::vector<float> &table = o.hyperTable();
  size_t H = m.hypers.size();
  for (int g = 0; g < o.numGroups(); ++g) {
    json obj = json::object();
    for (size_t h = 0; h < H; ++h)
      obj[m.hypers[h].name] = double(table[size_t(g) * H + h]);
    groups.push_back(obj);
  }
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat},
      {"format_version", "1"},
      {"generator", std::string("libflashopt ") + flashopt_version()},
      {"spec", m.name},
      {"spec_hash", m.spec_hash},
      {"rule", m.rule},
      {"checkpoint", f32 ? "f32" : "compressed"},
      {"step", std::to_string(o.globalStep)},
      {"skipped_steps", std::to_string(o.skipped)},
      {"params", params.dump()},
      {"param_groups", groups.dump()}};
  Status s = safetensors::write_file(path, refs, meta);
  if (!s)
    fail(FLASHOPT_ERROR_IO, s.message());
}

int64_t parseInt(const std::map<std::string, std::string> &meta,
                 const std::string &key, const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ has no " + quote(key));
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size() || v < 0)
      throw std::invalid_argument("trailing");
    return int64_t(v);
  } catch (const std::exception &) {
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ " + quote(key) +
             " is not a non-negative integer: " + quote(it->second));
  }
}

json parseJson(const std::map<std::string, std::string> &meta,
               const std::string &key, const std::string &file) {
  auto it = meta.find(key);
  if (it == meta.end())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ has no " + quote(key));
  try {
    return json::parse(it->second);
  } catch (const std::exception &e) {
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ " + quote(key) +
                                    " is not valid JSON: " + e.what());
  }
}

void loadCheckpoint(OptObj &o, const std::string &path) {
  const Manifest &m = *o.m;
  const std::string file = quote(path);
  int err = 0;
  if (!fileExists(path, &err))
    fail(err == ENOENT || err == ENOTDIR ? FLASHOPT_ERROR_NOT_FOUND
                                         : FLASHOPT_ERROR_IO,
         "checkpoint file " + file + ": " + std::strerror(err));
  Expected<safetensors::File> read = safetensors::File::read(path);
  if (!read) {
    const std::string &e = read.error();
    bool io = e.find("cannot open") != std::string::npos ||
              e.find("read error") != std::string::npos;
    fail(io ? FLASHOPT_ERROR_IO : FLASHOPT_ERROR_FORMAT,
         "checkpoint file " + file + ": " + e);
  }
  const safetensors::File &f = read.value();
  const auto &meta = f.metadata();

  // ---- validate everything ------------------------------------------------
  auto metaOr = [&](const char *key) -> std::string {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (metaOr("format") != kCheckpointFormat)
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": not a flashopt checkpoint (__metadata__ format is " +
             quote(metaOr("format")) + ", expected " +
             quote(kCheckpointFormat) + ")");
  if (metaOr("format_version") != "1")
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": unsupported checkpoint format_version " +
             quote(metaOr("format_version")) + " (this library reads 1)");
  if (metaOr("spec") != m.name || metaOr("spec_hash") != m.spec_hash)
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": checkpoint of spec " + quote(metaOr("spec")) + " (" +
             metaOr("spec_hash") + "), but this optimizer runs " +
             quote(m.name) + " (" + m.spec_hash + ")");
  std::string form = metaOr("checkpoint");
  if (form != "compressed" && form != "f32")
    fail(FLASHOPT_ERROR_FORMAT, file + ": unknown checkpoint form " +
                                    quote(form) + " (compressed or f32)");
  bool f32 = form == "f32";
  int64_t globalStep = parseInt(meta, "step", file);
  int64_t skipped = parseInt(meta, "skipped_steps", file);

  // Parameters: the same names, groups and shapes.
  json params = parseJson(meta, "params", file);
  if (!params.is_array())
    fail(FLASHOPT_ERROR_FORMAT, file + ": __metadata__ 'params' is not a list");
  std::vector<int64_t> steps(o.params.size(), -1);
  std::set<std::string> inFile;
  for (const json &p : params) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() ||
        !p.contains("group") || !p["group"].is_number_integer() ||
        !p.contains("step") || !p["step"].is_number_integer() ||
        p["step"].get<int64_t>() < 0)
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": __metadata__ 'params' has a malformed entry " + p.dump());
    std::string name = p["name"].get<std::string>();
    inFile.insert(name);
    auto it = o.byName.find(name);
    if (it == o.byName.end())
      fail(FLASHOPT_ERROR_MISMATCH, file + ": the checkpoint holds parameter " +
                                        quote(name) +
                                        ", which is not registered here");
    int64_t group = p["group"].get<int64_t>();
    if (group != o.params[size_t(it->second)].group)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": parameter " + quote(name) + " is in param group " +
               std::to_string(group) + " in the checkpoint but in group " +
               std::to_string(o.params[size_t(it->second)].group) + " here");
    steps[size_t(it->second)] = p["step"].get<int64_t>();
  }
  for (size_t i = 0; i < o.params.size(); ++i)
    if (!inFile.count(o.params[i].name))
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": " + o.describe(int64_t(i)) + " is not in the checkpoint");

  // Param groups and their hyper-parameters.
  json groups = parseJson(meta, "param_groups", file);
  if (!groups.is_array())
    fail(FLASHOPT_ERROR_FORMAT,
         file + ": __metadata__ 'param_groups' is not a list");
  if (int64_t(groups.size()) != o.numGroups())
    fail(FLASHOPT_ERROR_MISMATCH,
         file + ": the checkpoint has " + std::to_string(groups.size()) +
             " param groups, this optimizer " + std::to_string(o.numGroups()));
  std::vector<std::vector<float>> hyperValues;
  for (size_t g = 0; g < groups.size(); ++g) {
    const json &obj = groups[g];
    if (!obj.is_object())
      fail(FLASHOPT_ERROR_FORMAT,
           file + ": param group " + std::to_string(g) + " is not an object");
    std::vector<float> vals;
    for (const HyperSpec &h : m.hypers) {
      if (!obj.contains(h.name) || !obj[h.name].is_number())
        fail(FLASHOPT_ERROR_FORMAT, file + ": param group " +
                                        std::to_string(g) + " has no number " +
                                        quote(h.name));
      float v = float(obj[h.name].get<double>());
      if (!std::isfinite(v))
        fail(FLASHOPT_ERROR_FORMAT, file + ": param group " +
                                        std::to_string(g) + ": " +
                                        quote(h.name) + " is not finite");
      for (const StateSpec &s : m.states)
        if (s.kind == StateKind::Elided && s.elidable_if_zero == h.name &&
            v != 0.0f)
          fail(FLASHOPT_ERROR_MISMATCH,
               file + ": param group " + std::to_string(g) + " sets " +
                   quote(h.name) + " nonzero, but its state is elided");
      vals.push_back(v);
    }
    if (obj.size() != m.hypers.size())
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": param group " + std::to_string(g) +
               " has hyper-parameters this spec does not know");
    hyperValues.push_back(std::move(vals));
  }

  // Tensors: every expected one, with its dtype and shape; nothing else.
  std::vector<Expect> ex = expectedTensors(o, f32);
  std::set<std::string> expectedNames;
  for (const Expect &e : ex) {
    expectedNames.insert(e.name);
    const safetensors::StoredTensor *t = f.find(e.name);
    if (!t)
      fail(FLASHOPT_ERROR_MISMATCH, file + ": tensor " + quote(e.name) + " (" +
                                        form + " form) is missing");
    if (t->dtype != e.dtype)
      fail(FLASHOPT_ERROR_MISMATCH,
           file + ": tensor " + quote(e.name) + " is " +
               safetensors::dtype_name(t->dtype) + ", expected " +
               safetensors::dtype_name(e.dtype));
    if (t->shape != e.shape)
      fail(FLASHOPT_ERROR_MISMATCH, file + ": tensor " + quote(e.name) +
                                        " has shape " + shapeString(t->shape) +
                                        ", but " + o.describe(e.param) +
                                        " needs " + shapeString(e.shape));
  }
  for (const auto &kv : f.tensors())
    if (!expectedNames.count(kv.first))
      fail(FLASHOPT_ERROR_MISMATCH, file + ": unexpected tensor " +
                                        quote(kv.first) + " (" + form +
                                        " checkpoint of " + m.name + ")");

  // ---- copy
  // ------------------------------------------------------------------
  for (const Expect &e : ex) {
    const safetensors::StoredTensor *t = f.find(e.name);
    const ParamRec &p = o.params[size_t(e.param)];
    if (!f32) {
      o.write(e.param, e.buffer, t->data, t->bytes);
      continue;
    }
    // The F32 form: aligned copies of the floats.
    std::vector<float> v(size_t(p.numel));
    std::memcpy(v.data(), t->data, size_t(t->bytes));
    if (e.state.empty()) {
      importMaster(o, e.param, v.data());
      continue;
    }
    const StateSpec *s = nullptr;
    for (const StateSpec &st : m.states)
      if (st.name == e.state)
        s = &st;
    if (s->kind == StateKind::Quantized) {
      int64_t ng = (p.numel + m.group_size - 1) / m.group_size;
      std::vector<uint8_t> codes(size_t(p.numel * dtype_size(s->storage)));
      std::vector<uint8_t> scales(size_t(ng * dtype_size(s->scale)));
      codec::quantize(v.data(), p.numel, m.group_size, s->compand, codes.data(),
                      s->storage, scales.data(), s->scale);
      o.write(e.param, s->name + ".codes", codes.data(), int64_t(codes.size()));
      o.write(e.param, s->name + ".scales", scales.data(),
              int64_t(scales.size()));
    } else {
      std::vector<uint8_t> plain(size_t(p.numel * dtype_size(s->storage)));
      codec::narrow(v.data(), p.numel, s->storage, plain.data());
      o.write(e.param, s->name, plain.data(), int64_t(plain.size()));
    }
  }
  for (size_t g = 0; g < hyperValues.size(); ++g)
    for (size_t h = 0; h < m.hypers.size(); ++h) {
      Status s = o.setHyper(int(g), m.hypers[h].name, hyperValues[g][h]);
      if (!s)
        fail(FLASHOPT_ERROR_INTERNAL, s.message());
    }
  for (size_t i = 0; i < o.params.size(); ++i)
    o.params[i].step = steps[i];
  o.globalStep = globalStep;
  o.skipped = skipped;
  o.setStepCount(globalStep);
}

//===----------------------------------------------------------------------===//
// check_numerics (numerics.md §4.3)
//===----------------------------------------------------------------------===//

int exponentBits(DType t) { return t == DType::F16 ? 5 : 8; }

} // namespace

//===----------------------------------------------------------------------===//
// The C ABI
//===----------------------------------------------------------------------===//

extern "C" {

const char *flashopt_last_error(void) { return lastError.c_str(); }

const char *flashopt_status_name(flashopt_status status) {
  switch (status) {
  case FLASHOPT_OK:
    return "FLASHOPT_OK";
  case FLASHOPT_ERROR_INVALID_ARGUMENT:
    return "FLASHOPT_ERROR_INVALID_ARGUMENT";
  case FLASHOPT_ERROR_INVALID_HANDLE:
    return "FLASHOPT_ERROR_INVALID_HANDLE";
  case FLASHOPT_ERROR_DTYPE:
    return "FLASHOPT_ERROR_DTYPE";
  case FLASHOPT_ERROR_DEVICE:
    return "FLASHOPT_ERROR_DEVICE";
  case FLASHOPT_ERROR_SIZE:
    return "FLASHOPT_ERROR_SIZE";
  case FLASHOPT_ERROR_NOT_FOUND:
    return "FLASHOPT_ERROR_NOT_FOUND";
  case FLASHOPT_ERROR_ALREADY_EXISTS:
    return "FLASHOPT_ERROR_ALREADY_EXISTS";
  case FLASHOPT_ERROR_STATE:
    return "FLASHOPT_ERROR_STATE";
  case FLASHOPT_ERROR_FORMAT:
    return "FLASHOPT_ERROR_FORMAT";
  case FLASHOPT_ERROR_MISMATCH:
    return "FLASHOPT_ERROR_MISMATCH";
  case FLASHOPT_ERROR_IO:
    return "FLASHOPT_ERROR_IO";
  case FLASHOPT_ERROR_OUT_OF_MEMORY:
    return "FLASHOPT_ERROR_OUT_OF_MEMORY";
  case FLASHOPT_ERROR_UNSUPPORTED:
    return "FLASHOPT_ERROR_UNSUPPORTED";
  case FLASHOPT_ERROR_NUMERICS:
    return "FLASHOPT_ERROR_NUMERICS";
  case FLASHOPT_ERROR_CUDA:
    return "FLASHOPT_ERROR_CUDA";
  case FLASHOPT_ERROR_INTERNAL:
    return "FLASHOPT_ERROR_INTERNAL";
  }
  return "unknown";
}

const char *flashopt_version(void) { return "0.1.0"; }
int flashopt_abi_version(void) { return FLASHOPT_ABI_VERSION; }

const char *flashopt_dtype_name(flashopt_dtype dtype) {
  if (!validDtype(dtype))
    return nullptr;
  return dtype_name(toHost(dtype));
}

size_t flashopt_dtype_size(flashopt_dtype dtype) {
  if (!validDtype(dtype))
    return 0;
  return size_t(dtype_size(toHost(dtype)));
}

// ---- contexts
// ----------------------------------------------------------------

flashopt_status flashopt_context_create(flashopt_device_type type,
                                        int device_id, flashopt_context *out) {
  return guard("flashopt_context_create", [&] {
    needOut(out, "out");
    auto c = std::make_shared<ContextObj>();
    c->type = type;
    c->device = device_id;
    if (type == FLASHOPT_DEVICE_CPU) {
      if (device_id != 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "CPU context: device_id must be 0, got " +
                 std::to_string(device_id));
    } else if (type == FLASHOPT_DEVICE_CUDA) {
      if (device_id < 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "CUDA context: device_id " +
                                                  std::to_string(device_id) +
                                                  " is negative");
      Expected<std::shared_ptr<CudaContext>> cc =
          CudaContext::create(device_id);
      if (!cc)
        fail(FLASHOPT_ERROR_DEVICE,
             "CUDA device " + std::to_string(device_id) + ": " + cc.error());
      c->cuda = std::move(cc.value());
    } else {
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown device type " + std::to_string(int(type)) +
               " (FLASHOPT_DEVICE_CPU or FLASHOPT_DEVICE_CUDA)");
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    uint64_t id = r.next++;
    r.contexts.emplace(id, std::move(c));
    *out = reinterpret_cast<flashopt_context>(uintptr_t(id));
  });
}

flashopt_status flashopt_context_set_threads(flashopt_context ctx,
                                             int threads) {
  return guard("flashopt_context_set_threads", [&] {
    std::shared_ptr<ContextObj> c = getContext(ctx);
    if (c->type != FLASHOPT_DEVICE_CPU)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "a CUDA context has no CPU threads to set");
    if (threads < 0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "threads must be >= 0 (0 = all hardware threads), got " +
               std::to_string(threads));
    std::lock_guard<std::mutex> lock(c->mu);
    c->threads = threads;
    for (const std::weak_ptr<OptObj> &w : c->opts)
      if (std::shared_ptr<OptObj> o = w.lock()) {
        std::lock_guard<std::mutex> olock(o->mu);
        Status s = o->cpu->set_threads(threads);
        if (!s)
          fail(FLASHOPT_ERROR_INTERNAL, s.message());
      }
  });
}

flashopt_status flashopt_context_destroy(flashopt_context ctx) {
  return guard("flashopt_context_destroy", [&] {
    // Released here, outside the registry lock.
    std::shared_ptr<ContextObj> c =
        findHandle(registry().contexts, ctx, "context", /*take=*/true);
  });
}

// ---- optimizers
// ----------------------------------------------------------------

flashopt_status flashopt_optimizer_create(flashopt_context ctx,
                                          const char *bundle_dir,
                                          flashopt_optimizer *out) {
  return guard("flashopt_optimizer_create", [&] {
    needOut(out, "out");
    needOut(bundle_dir, "bundle_dir");
    std::shared_ptr<ContextObj> c = getContext(ctx);
    std::shared_ptr<OptObj> o = createOptimizer(c, bundle_dir);
    *out = registerOptimizer(c, std::move(o));
  });
}

flashopt_status
flashopt_optimizer_create_embedded(flashopt_context ctx,
                                   const flashopt_embedded_bundle *bundle,
                                   flashopt_optimizer *out) {
  return guard("flashopt_optimizer_create_embedded", [&] {
    needOut(out, "out");
    needOut(bundle, "bundle");
    std::string name = bundle->name ? bundle->name : "(unnamed)";
    std::string who = "embedded bundle " + quote(name);
    if (bundle->abi_version != FLASHOPT_ABI_VERSION)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           who + " was built for ABI version " +
               std::to_string(bundle->abi_version) + ", this library is " +
               std::to_string(FLASHOPT_ABI_VERSION));
    if (bundle->num_files > 0 && !bundle->files)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": files is NULL");
    std::shared_ptr<ContextObj> c = getContext(ctx);
    TempDir tmp;
    bool manifest = false;
    for (size_t i = 0; i < bundle->num_files; ++i) {
      const flashopt_bundle_file &f = bundle->files[i];
      if (!f.path || !*f.path || (f.size > 0 && !f.data))
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             who + ": file " + std::to_string(i) + " has no path or data");
      std::filesystem::path rel(f.path);
      bool bad = rel.is_absolute();
      for (const auto &part : rel)
        if (part == "..")
          bad = true;
      if (bad)
        fail(FLASHOPT_ERROR_FORMAT,
             who + ": file path " + quote(f.path) + " leaves the bundle");
      if (rel == "manifest.json")
        manifest = true;
      std::filesystem::path full = std::filesystem::path(tmp.path) / rel;
      std::error_code ec;
      std::filesystem::create_directories(full.parent_path(), ec);
      std::ofstream os(full, std::ios::binary);
      os.write(static_cast<const char *>(f.data), std::streamsize(f.size));
      os.close();
      if (!os)
        fail(FLASHOPT_ERROR_IO, who + ": cannot write " + full.string());
    }
    if (!manifest)
      fail(FLASHOPT_ERROR_FORMAT, who + " has no manifest.json");
    std::shared_ptr<OptObj> o = createOptimizer(c, tmp.path);
    *out = registerOptimizer(c, std::move(o));
  });
}

flashopt_status flashopt_optimizer_destroy(flashopt_optimizer opt) {
  return guard("flashopt_optimizer_destroy", [&] {
    // Destroyed here, outside the registry lock.
    std::shared_ptr<OptObj> o =
        findHandle(registry().optimizers, opt, "optimizer", /*take=*/true);
    // Wait for a call in flight (misuse, but do not free under it).
    std::lock_guard<std::mutex> lock(o->mu);
  });
}

flashopt_status flashopt_optimizer_get_info(flashopt_optimizer opt,
                                            flashopt_optimizer_info *out) {
  return guard("flashopt_optimizer_get_info", [&] {
    needOut(out, "out");
    Locked o(opt);
    const Manifest &m = *o->m;
    flashopt_optimizer_info i{};
    i.name = m.name.c_str();
    i.rule = m.rule.c_str();
    i.spec_hash = m.spec_hash.c_str();
    i.param_dtype = toC(m.param);
    i.grad_dtype = toC(m.grad);
    i.has_correction = m.correction ? 1 : 0;
    i.correction_dtype = m.correction ? toC(*m.correction) : FLASHOPT_I8;
    i.group_size = m.group_size;
    i.num_hypers = int32_t(m.hypers.size());
    int32_t states = 0;
    for (const StateSpec &s : m.states)
      if (s.kind != StateKind::Elided)
        ++states;
    i.num_states = states;
    i.device_type = o->ctx->type;
    i.device_id = o->ctx->device;
    *out = i;
  });
}

flashopt_status flashopt_hyper_name(flashopt_optimizer opt, int32_t index,
                                    const char **out) {
  return guard("flashopt_hyper_name", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index < 0 || index >= int32_t(o->m->hypers.size()))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "hyper-parameter index " + std::to_string(index) +
               " is out of range (" + o->m->name + " has " +
               std::to_string(o->m->hypers.size()) + ")");
    *out = o->m->hypers[size_t(index)].name.c_str();
  });
}

// ---- param groups and hyper-parameters
// ------------------------------------------

flashopt_status flashopt_add_param_group(flashopt_optimizer opt,
                                         int32_t *out_group) {
  return guard("flashopt_add_param_group", [&] {
    needOut(out_group, "out_group");
    Locked o(opt);
    int g = o->addGroup();
    if (g < 0)
      fail(FLASHOPT_ERROR_OUT_OF_MEMORY, "adding a param group");
    *out_group = g;
  });
}

flashopt_status flashopt_num_param_groups(flashopt_optimizer opt,
                                          int32_t *out) {
  return guard("flashopt_num_param_groups", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->numGroups();
  });
}

namespace {
void checkHyperName(const OptObj &o, const char *name) {
  needOut(name, "name");
  if (o.m->hyper_index(name) < 0) {
    std::string names;
    for (const HyperSpec &h : o.m->hypers)
      names += (names.empty() ? "" : ", ") + h.name;
    fail(FLASHOPT_ERROR_NOT_FOUND, "unknown hyper-parameter " + quote(name) +
                                       " (" + o.m->name + " has: " + names +
                                       ")");
  }
}
} // namespace

flashopt_status flashopt_set_hyper(flashopt_optimizer opt, int32_t group,
                                   const char *name, double value) {
  return guard("flashopt_set_hyper", [&] {
    Locked o(opt);
    checkHyperName(*o, name);
    if (group != -1)
      checkGroup(*o, group);
    float v = float(value);
    if (!std::isfinite(value) || !std::isfinite(v))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "hyper-parameter " + quote(name) +
                                                ": value " + fmt(value) +
                                                " is not finite (as a float)");
    // Validate every group first, so that nothing changes on failure.
    int first = group == -1 ? 0 : group;
    int last = group == -1 ? o->numGroups() - 1 : group;
    if (v != 0.0f)
      for (const StateSpec &s : o->m->states)
        if (s.kind == StateKind::Elided && s.elidable_if_zero == name)
          fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
               "hyper-parameter " + quote(name) + " must stay 0 in " +
                   o->m->name + ": its state " + quote(s.name) +
                   " is elided (compile a spec that keeps it)");
    for (int g = first; g <= last; ++g) {
      Status s = o->setHyper(g, name, v);
      if (!s)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "param group " + std::to_string(g) + ": " + s.message());
    }
  });
}

flashopt_status flashopt_get_hyper(flashopt_optimizer opt, int32_t group,
                                   const char *name, double *out) {
  return guard("flashopt_get_hyper", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkHyperName(*o, name);
    checkGroup(*o, group);
    Expected<float> v = o->hyper(group, name);
    if (!v)
      fail(FLASHOPT_ERROR_INTERNAL, v.error());
    *out = double(*v);
  });
}

// ---- parameters and gradients
// ---------------------------------------------------

flashopt_status flashopt_add_param(flashopt_optimizer opt, int32_t group,
                                   const char *name, void *param,
                                   flashopt_dtype param_dtype, int64_t numel,
                                   const void *grad, flashopt_dtype grad_dtype,
                                   int64_t *out_index) {
  return guard("flashopt_add_param", [&] {
    Locked o(opt);
    addParam(*o, group, name, param, param_dtype, numel, grad, grad_dtype, {},
             out_index);
  });
}

flashopt_status flashopt_add_param_dlpack(flashopt_optimizer opt, int32_t group,
                                          const char *name, const void *param,
                                          const void *grad,
                                          int64_t *out_index) {
  return guard("flashopt_add_param_dlpack", [&] {
    Locked o(opt);
    needOut(param, "param");
    std::string who =
        "parameter " +
        quote(name ? name : "p" + std::to_string(o->params.size()));
    DLInfo p = parseDL(param, *o->ctx, who + " (param)");
    DLInfo g;
    if (grad) {
      g = parseDL(grad, *o->ctx, who + " (grad)");
      if (g.numel != p.numel)
        fail(FLASHOPT_ERROR_SIZE,
             who + ": grad has " + std::to_string(g.numel) +
                 " elements, param " + std::to_string(p.numel));
      if (!g.data)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT, who + ": grad data is NULL");
    }
    addParam(*o, group, name, p.data, p.dtype, p.numel, grad ? g.data : nullptr,
             grad ? g.dtype : toC(o->m->grad), p.shape, out_index);
  });
}

namespace {
void setGrad(OptObj &o, int64_t index, const void *grad, flashopt_dtype dt,
             int64_t numel) {
  checkIndex(o, index);
  const ParamRec &p = o.params[size_t(index)];
  std::string who = o.describe(index);
  if (!validDtype(dt) || toHost(dt) != o.m->grad)
    fail(FLASHOPT_ERROR_DTYPE, who + ": grad dtype is " + dtypeText(dt) +
                                   ", but " + o.m->name + " takes " +
                                   dtype_name(o.m->grad) + " gradients");
  if (numel != p.numel)
    fail(FLASHOPT_ERROR_SIZE, who + ": grad has " + std::to_string(numel) +
                                  " elements, the parameter " +
                                  std::to_string(p.numel));
  if (uintptr_t(grad) % 16 != 0)
    fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
         who + ": the grad address is not 16-byte aligned");
  Status s = o.setGrad(index, grad);
  if (!s)
    fail(FLASHOPT_ERROR_INTERNAL, who + ": " + s.message());
}
} // namespace

flashopt_status flashopt_set_grad(flashopt_optimizer opt, int64_t index,
                                  const void *grad, flashopt_dtype grad_dtype,
                                  int64_t numel) {
  return guard("flashopt_set_grad", [&] {
    Locked o(opt);
    setGrad(*o, index, grad, grad_dtype, numel);
  });
}

flashopt_status flashopt_set_grad_dlpack(flashopt_optimizer opt, int64_t index,
                                         const void *grad) {
  return guard("flashopt_set_grad_dlpack", [&] {
    Locked o(opt);
    needOut(grad, "grad");
    checkIndex(*o, index);
    DLInfo g = parseDL(grad, *o->ctx, o->describe(index) + " (grad)");
    setGrad(*o, index, g.data, g.dtype, g.numel);
  });
}

flashopt_status flashopt_num_params(flashopt_optimizer opt, int64_t *out) {
  return guard("flashopt_num_params", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = int64_t(o->params.size());
  });
}

flashopt_status flashopt_find_param(flashopt_optimizer opt, const char *name,
                                    int64_t *out_index) {
  return guard("flashopt_find_param", [&] {
    needOut(out_index, "out_index");
    needOut(name, "name");
    Locked o(opt);
    auto it = o->byName.find(name);
    if (it == o->byName.end())
      fail(FLASHOPT_ERROR_NOT_FOUND,
           "no parameter named " + quote(name) + " is registered");
    *out_index = it->second;
  });
}

flashopt_status flashopt_get_param_info(flashopt_optimizer opt, int64_t index,
                                        flashopt_param_info *out) {
  return guard("flashopt_get_param_info", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkIndex(*o, index);
    const ParamRec &p = o->params[size_t(index)];
    flashopt_param_info i{};
    i.name = p.name.c_str();
    i.numel = p.numel;
    i.group = p.group;
    i.ndim = int32_t(p.shape.size());
    i.shape = p.shape.data();
    i.step = p.step;
    *out = i;
  });
}

// ---- stepping
// ------------------------------------------------------------------------

flashopt_status flashopt_step(flashopt_optimizer opt) {
  return guard("flashopt_step", [&] {
    Locked o(opt);
    std::vector<int64_t> all(o->params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    checkStepReady(*o, all);
    if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, all)) {
      ++o->skipped;
      return;
    }
    // One kernel call per distinct step counter (one when all are equal).
    std::map<int64_t, std::vector<int64_t>> byStep;
    for (size_t i = 0; i < o->params.size(); ++i)
      byStep[o->params[i].step].push_back(int64_t(i));
    for (const auto &kv : byStep) {
      Status s = o->stepTensors(kv.second, kv.first + 1);
      if (!s)
        stepFailure(*o, s);
    }
    for (ParamRec &p : o->params)
      ++p.step;
    ++o->globalStep;
    o->setStepCount(o->globalStep);
  });
}

flashopt_status flashopt_step_param(flashopt_optimizer opt, int64_t index) {
  return guard("flashopt_step_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    std::vector<int64_t> one{index};
    checkStepReady(*o, one);
    if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, one)) {
      ++o->skipped;
      return;
    }
    ParamRec &p = o->params[size_t(index)];
    Status s = o->stepTensors(one, p.step + 1);
    if (!s)
      stepFailure(*o, s);
    ++p.step;
  });
}

flashopt_status flashopt_get_step(flashopt_optimizer opt, int64_t index,
                                  int64_t *out) {
  return guard("flashopt_get_step", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index == -1) {
      *out = o->globalStep;
      return;
    }
    checkIndex(*o, index);
    *out = o->params[size_t(index)].step;
  });
}

flashopt_status
flashopt_set_nonfinite_policy(flashopt_optimizer opt,
                              flashopt_nonfinite_policy policy) {
  return guard("flashopt_set_nonfinite_policy", [&] {
    Locked o(opt);
    if (policy != FLASHOPT_NONFINITE_PROPAGATE &&
        policy != FLASHOPT_NONFINITE_SKIP)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown policy " + std::to_string(int(policy)));
    if (policy == FLASHOPT_NONFINITE_SKIP && o->isGpu())
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "FLASHOPT_NONFINITE_SKIP is not supported on CUDA contexts yet "
           "(it needs a device-side gradient scan)");
    o->policy = policy;
  });
}

flashopt_status flashopt_get_skipped_steps(flashopt_optimizer opt,
                                           int64_t *out) {
  return guard("flashopt_get_skipped_steps", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->skipped;
  });
}

flashopt_status flashopt_synchronize(flashopt_optimizer opt) {
  return guard("flashopt_synchronize", [&] {
    Locked o(opt);
    if (o->gpu) {
      Status s = o->gpu->synchronize();
      if (!s)
        fail(FLASHOPT_ERROR_CUDA, s.message());
    }
  });
}

// ---- memory report
// ------------------------------------------------------------------

flashopt_status flashopt_memory_report_get(flashopt_optimizer opt,
                                           flashopt_memory_report *out) {
  return guard("flashopt_memory_report_get", [&] {
    needOut(out, "out");
    Locked o(opt);
    BytesReport b = o->bytes();
    flashopt_memory_report r{};
    r.numel = b.numel;
    r.param_bytes = b.param;
    r.correction_bytes = b.correction;
    r.grad_bytes = b.grad;
    r.state_bytes = b.states;
    r.total_bytes = b.total;
    r.total_bytes_with_grad_release = b.total_with_grad_release;
    r.allocated_bytes = b.runtime_allocated;
    r.bytes_per_param = b.numel ? double(b.total) / double(b.numel) : 0.0;
    r.bytes_per_param_with_grad_release =
        b.numel ? double(b.total_with_grad_release) / double(b.numel) : 0.0;
    *out = r;
  });
}

// ---- master weights and numerics
// ---------------------------------------------------

flashopt_status flashopt_export_master_f32(flashopt_optimizer opt,
                                           int64_t index, float *out,
                                           int64_t numel) {
  return guard("flashopt_export_master_f32", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkIndex(*o, index);
    if (numel != o->params[size_t(index)].numel)
      fail(FLASHOPT_ERROR_SIZE,
           o->describe(index) + ": numel " + std::to_string(numel) +
               ", but it has " +
               std::to_string(o->params[size_t(index)].numel));
    std::vector<float> v = exportMaster(*o, index);
    std::memcpy(out, v.data(), v.size() * sizeof(float));
  });
}

flashopt_status flashopt_import_master_f32(flashopt_optimizer opt,
                                           int64_t index, const float *in,
                                           int64_t numel) {
  return guard("flashopt_import_master_f32", [&] {
    needOut(in, "in");
    Locked o(opt);
    checkIndex(*o, index);
    if (numel != o->params[size_t(index)].numel)
      fail(FLASHOPT_ERROR_SIZE,
           o->describe(index) + ": numel " + std::to_string(numel) +
               ", but it has " +
               std::to_string(o->params[size_t(index)].numel));
    importMaster(*o, index, in);
  });
}

flashopt_status flashopt_check_numerics(flashopt_optimizer opt,
                                        flashopt_numerics_report *out) {
  return guard("flashopt_check_numerics", [&] {
    Locked o(opt);
    const Manifest &m = *o->m;
    flashopt_numerics_report r{};
    r.first_param = -1;
    r.first_group = -1;
    // numerics.md §4.3: bits of the master weight, mantissa bits M that
    // survive, the step needed to move max|w|, and the step lr * k gives.
    int bits = 8 * (dtype_size(m.param) +
                    (m.correction ? dtype_size(*m.correction) : 0));
    double M = double(bits - 1 - exponentBits(m.param)) + std::log2(0.49);
    double k = (m.rule == "adam" || m.rule == "adamw") ? 0.1 : 1.0;
    int lrIndex = m.hyper_index("lr");
    std::string firstNonfinite, firstSmall;
    for (size_t i = 0; i < o->params.size(); ++i) {
      ++r.params_checked;
      std::vector<float> w = exportMaster(*o, int64_t(i));
      double maxabs = 0;
      bool finite = true;
      for (float x : w) {
        if (!std::isfinite(x)) {
          finite = false;
          break;
        }
        maxabs = std::max(maxabs, double(std::fabs(x)));
      }
      if (!finite) {
        if (r.nonfinite_params++ == 0)
          firstNonfinite = o->describe(int64_t(i)) + " holds NaN or Inf";
        continue;
      }
      if (lrIndex < 0 || maxabs <= 0)
        continue;
      const ParamRec &p = o->params[i];
      double lr = double(
          o->hyperTable()[size_t(p.group) * m.hypers.size() + size_t(lrIndex)]);
      if (lr <= 0)
        continue;
      double need = std::floor(std::log2(maxabs)) - M;
      double have = std::log2(lr * k);
      if (need > have) {
        if (r.params_too_small++ == 0) {
          r.first_param = int64_t(i);
          r.first_group = p.group;
          r.max_abs = maxabs;
          r.lr = lr;
          r.min_lr = std::exp2(need) / k;
          firstSmall =
              o->describe(int64_t(i)) + " in param group " +
              std::to_string(p.group) + ": lr " + fmt(lr) +
              " cannot move its largest weight (max |w| = " + fmt(maxabs) +
              ") with " + std::to_string(bits) +
              "-bit master weights; the smallest lr that does is " +
              fmt(r.min_lr);
        }
      }
    }
    if (out)
      *out = r;
    if (r.params_too_small || r.nonfinite_params) {
      std::string msg = !firstSmall.empty() ? firstSmall : firstNonfinite;
      if (r.params_too_small > 1)
        msg += " (and " + std::to_string(r.params_too_small - 1) +
               " more parameters)";
      if (!firstSmall.empty() && r.nonfinite_params)
        msg += "; " + firstNonfinite;
      fail(FLASHOPT_ERROR_NUMERICS, msg);
    }
  });
}

// ---- checkpoints
// ----------------------------------------------------------------------

flashopt_status flashopt_save_checkpoint(flashopt_optimizer opt,
                                         const char *path,
                                         flashopt_checkpoint_format format) {
  return guard("flashopt_save_checkpoint", [&] {
    needOut(path, "path");
    if (format != FLASHOPT_CHECKPOINT_COMPRESSED &&
        format != FLASHOPT_CHECKPOINT_F32)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown checkpoint format " + std::to_string(int(format)));
    Locked o(opt);
    saveCheckpoint(*o, path, format);
  });
}

flashopt_status flashopt_load_checkpoint(flashopt_optimizer opt,
                                         const char *path) {
  return guard("flashopt_load_checkpoint", [&] {
    needOut(path, "path");
    Locked o(opt);
    loadCheckpoint(*o, path);
  });
}

} // extern "C"
