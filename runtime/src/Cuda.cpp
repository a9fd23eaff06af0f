//===- Cuda.cpp - CUDA runtime for flashopt GPU kernels
//----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The driver loader (dlopen + an X-macro table of entry points), device
/// contexts, kernel selection and module loading, launch geometry, and the
/// device-memory optimizer. See Cuda.h and docs/KERNEL-ABI.md.
///
/// Exceptions are used inside this file only (allocation) and are always
/// turned into a Status before returning to the caller.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/Cuda.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/stat.h>

namespace flashopt::host {

using namespace cu;

//===----------------------------------------------------------------------===//
// CudaDriver
//===----------------------------------------------------------------------===//

namespace {

constexpr const char *kDriverLibrary = "libcuda.so.1";

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

} // namespace

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." +
         std::to_string((version % 1000) / 10);
}

Expected<std::unique_ptr<CudaDriver>>
CudaDriver::load(const std::string &library) {
  try {
    dlerror();
    void *h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      return Status::error(
          "CUDA was requested but the NVIDIA driver library " + library +
          " could not be loaded: " + (e ? e : "dlopen failed"));
    }
    std::unique_ptr<CudaDriver> d(new CudaDriver());
    d->handle_ = h;
    auto resolve = [h](const char *symbol, const char *fallback) -> void * {
      void *p = dlsym(h, symbol);
      if (!p && fallback)
        p = dlsym(h, fallback);
      return p;
    };
#define FLASHOPT_CUDA_RESOLVE(name, symbol, fallback, params)                  \
  d->name = reinterpret_cast<PFN_##name>(resolve(symbol, fallback));           \
  if (!d->name) {                                                              \
    dlclose(h);                                                                \
    return Status::error("CUDA was requested but the NVIDIA driver library " + \
                         library + " lacks the entry point " + symbol +        \
                         " (a driver older than this runtime supports?)");     \
  }
    FLASHOPT_CUDA_DRIVER_FUNCTIONS(FLASHOPT_CUDA_RESOLVE)
#undef FLASHOPT_CUDA_RESOLVE
    CUresult r = d->cuInit(0);
    if (r != CUDA_SUCCESS) {
      std::string why = d->describe(r);
      dlclose(h);
      return Status::error("CUDA was requested but the NVIDIA driver (" +
                           library +
                           ") could not be initialized: cuInit: " + why);
    }
    if (d->cuDriverGetVersion(&d->version_) != CUDA_SUCCESS)
      d->version_ = 0;
    return Expected<std::unique_ptr<CudaDriver>>(std::move(d));
  } catch (const std::exception &e) {
    return Status::error(std::string("CUDA driver: ") + e.what());
  }
}

Expected<const CudaDriver *> CudaDriver::get() {
  // The library: libcuda.so.1, or $FLASHOPT_CUDA_DRIVER (tests point it at a
  // stand-in or at a missing file). Each is loaded once and never unloaded
  // (other libraries may hold its contexts).
  std::string library = kDriverLibrary;
  if (const char *env = std::getenv("FLASHOPT_CUDA_DRIVER"))
    if (*env)
      library = env;
  static std::mutex *const mu = new std::mutex();
  static auto *const loaded =
      new std::map<std::string, Expected<std::unique_ptr<CudaDriver>>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto it = loaded->find(library);
  if (it == loaded->end())
    it = loaded->emplace(library, load(library)).first;
  if (!it->second.ok())
    return it->second.status();
  return static_cast<const CudaDriver *>(it->second.value().get());
}

std::string CudaDriver::describe(CUresult r) const {
  const char *name = nullptr, *text = nullptr;
  if (cuGetErrorName)
    cuGetErrorName(r, &name);
  if (cuGetErrorString)
    cuGetErrorString(r, &text);
  std::string s = name ? std::string(name) : "CUDA error " + std::to_string(r);
  if (text)
    s += std::string(" (") + text + ")";
  return s;
}

Status CudaDriver::check(CUresult r, const std::string &what) const {
  if (r == CUDA_SUCCESS)
    return Status::success();
  return Status::error(what + ": " + describe(r));
}

//===----------------------------------------------------------------------===//
// CudaContext
//===----------------------------------------------------------------------===//

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
      return Status::error("CUDA was requested but the driver reports no "
                           "CUDA device");
    if (ordinal < 0 || ordinal >= count)
      return Status::error("CUDA device " + std::to_string(ordinal) +
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
    return Status::error(std::string("CudaContext::create: ") + e.what());
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
    return Status::error("DeviceBuffer::allocate: null context");
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
    return Status::error("DeviceBuffer::upload: " + std::to_string(bytes) +
                         " bytes into a buffer of " + std::to_string(bytes_));
  return ctx_->upload(ptr_, src, bytes);
}

Status DeviceBuffer::download(void *dst, int64_t bytes) const {
  if (!ctx_ || bytes > bytes_)
    return Status::error("DeviceBuffer::download: " + std::to_string(bytes) +
                         " bytes from a buffer of " + std::to_string(bytes_));
  return ctx_->download(dst, ptr_, bytes);
}

//===----------------------------------------------------------------------===//
// Kernel selection and launch geometry
//===----------------------------------------------------------------------===//

bool parse_sm_target(std::string_view target, int *chip, bool *arch_specific) {
  if (target.size() < 4 || target.substr(0, 3) != "sm_")
    return false;
  std::string_view rest = target.substr(3);
  bool suffix = false;
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    suffix = true;
    rest.remove_suffix(1);
  }
  if (rest.empty() || rest.size() > 4)
    return false;
  int v = 0;
  for (char c : rest) {
    if (c < '0' || c > '9')
      return false;
    v = v * 10 + (c - '0');
  }
  if (chip)
    *chip = v;
  if (arch_specific)
    *arch_specific = suffix;
  return true;
}

Expected<GpuKernelChoice>
select_gpu_kernel(const Manifest &m, int cc_major, int cc_minor,
                  const std::function<bool(const std::string &)> &file_exists) {
  const int device = cc_major * 10 + cc_minor;
  const std::string sm = "sm_" + std::to_string(device);
  const std::string where = (m.path.empty() ? m.name : m.path);
  auto exists = [&](const std::string &f) {
    return !f.empty() && (!file_exists || file_exists(f));
  };
  std::string targets;
  std::optional<size_t> exact, bestPtx;
  int bestChip = -1;
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    const KernelEntry &k = m.kernels[i];
    int chip = 0;
    bool specific = false;
    if (!parse_sm_target(k.target, &chip, &specific))
      continue;
    targets += (targets.empty() ? "" : ", ") + k.target;
    if (chip == device && !exact && exists(k.cubin))
      exact = i;
    bool runs = specific ? chip == device : chip <= device;
    // Prefer the plain target over an arch-specific one of the same chip.
    if (runs && exists(k.file) &&
        (chip > bestChip || (chip == bestChip && !specific)))
      bestPtx = i, bestChip = chip;
  }

  GpuKernelChoice c;
  if (exact) {
    const KernelEntry &k = m.kernels[*exact];
    c.kernel_index = *exact;
    c.use_cubin = true;
    c.image = k.cubin;
    if (exists(k.file))
      c.ptx_fallback = k.file;
    c.reason = k.target + " cubin for " + sm;
  } else if (bestPtx) {
    const KernelEntry &k = m.kernels[*bestPtx];
    c.kernel_index = *bestPtx;
    c.use_cubin = false;
    c.image = k.file;
    c.reason = k.target + " PTX, JIT-compiled for " + sm +
               (bestChip == device ? " (no cubin for this chip)" : "");
  } else {
    return Status::error(
        where + ": no GPU kernel for " + sm + " (compute capability " +
        std::to_string(cc_major) + "." + std::to_string(cc_minor) + "): " +
        (targets.empty() ? std::string("the bundle has no GPU kernels")
                         : "the bundle has " + targets +
                               "; a PTX kernel runs only on its own chip or a "
                               "newer one, a cubin only on its own chip"));
  }
  const KernelEntry &k = m.kernels[c.kernel_index];
  c.target = k.target;
  parse_sm_target(k.target, &c.chip, nullptr);
  c.symbol = k.symbol;
  if (c.symbol.empty())
    return Status::error(where + ": the " + k.target + " kernel has no symbol");
  c.threads_per_block = k.threads_per_block > 0 ? k.threads_per_block : 256;
  if (c.threads_per_block != 256)
    return Status::error(where + ": the " + k.target +
                         " kernel was built for " +
                         std::to_string(c.threads_per_block) +
                         " threads per block; this runtime launches 256");
  c.elements_per_thread = k.elements_per_thread;
  return c;
}

int64_t gpu_grid_size(int64_t total_groups, int64_t group_size,
                      int elements_per_thread, int threads_per_block,
                      int sm_count, int blocks_per_sm) {
  if (total_groups <= 0)
    return 0;
  const int64_t warp = 32;
  int64_t G = std::max<int64_t>(1, group_size);
  int64_t width = elements_per_thread > 0 ? elements_per_thread : 4;
  width = std::max<int64_t>(1, std::min<int64_t>(width, G));
  int64_t lanesPerGroup =
      std::max<int64_t>(1, std::min<int64_t>(warp, G / width));
  int64_t groupsPerWarp = warp / lanesPerGroup;
  int64_t warps = (total_groups + groupsPerWarp - 1) / groupsPerWarp;
  int64_t tpb = std::max<int64_t>(warp, threads_per_block);
  int64_t blocks = (warps * warp + tpb - 1) / tpb;
  int64_t cap = int64_t(std::max(1, sm_count)) * std::max(1, blocks_per_sm);
  return std::max<int64_t>(1, std::min(blocks, cap));
}

//===----------------------------------------------------------------------===//
// CudaBundle
//===----------------------------------------------------------------------===//

namespace {

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string joinPath(const std::string &dir, const std::string &file) {
  return (!file.empty() && file[0] == '/') ? file : dir + "/" + file;
}

Expected<std::string> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    return Status::error(path + ": cannot open (" + std::strerror(err) + ")");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad())
    return Status::error(path + ": read error");
  return ss.str();
}

std::string trimLog(const char *log) {
  std::string s(log);
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\0' || s.back() == ' '))
    s.pop_back();
  return s;
}

} // namespace

Expected<std::shared_ptr<CudaBundle>>
CudaBundle::load(std::shared_ptr<CudaContext> ctx, const std::string &dir) {
  if (!ctx)
    return Status::error("CudaBundle::load: null context");
  try {
    Expected<Manifest> m = load_manifest(dir + "/manifest.json");
    if (!m)
      return m.status();
    const CudaDeviceInfo &info = ctx->info();
    Expected<GpuKernelChoice> choice = select_gpu_kernel(
        *m, info.cc_major, info.cc_minor,
        [&](const std::string &f) { return fileExists(joinPath(dir, f)); });
    if (!choice)
      return choice.status();

    std::shared_ptr<CudaBundle> b(new CudaBundle());
    b->ctx_ = ctx;
    b->dir_ = dir;
    b->manifest_ = std::move(m.value());
    b->choice_ = std::move(choice.value());
    const CudaDriver &d = ctx->driver();
    CudaContext::Scope scope(*ctx);
    if (!scope.ok())
      return scope.status();

    // Loads one image; a PTX image gets a NUL terminator and JIT logs.
    auto loadImage = [&](const std::string &file, bool ptx,
                         std::string *log) -> Status {
      std::string path = joinPath(dir, file);
      Expected<std::string> bytes = readFile(path);
      if (!bytes)
        return bytes.status();
      if (ptx)
        bytes->push_back('\0');
      static constexpr size_t kLog = 16384;
      std::vector<char> info(kLog, 0), error(kLog, 0);
      int opts[4] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                     CU_JIT_ERROR_LOG_BUFFER,
                     CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
      void *vals[4] = {
          info.data(), reinterpret_cast<void *>(uintptr_t(kLog - 1)),
          error.data(), reinterpret_cast<void *>(uintptr_t(kLog - 1))};
      CUmodule mod = nullptr;
      CUresult r = d.cuModuleLoadDataEx(&mod, bytes->data(), 4, opts, vals);
      if (r != CUDA_SUCCESS) {
        std::string msg = path + ": cuModuleLoadDataEx: " + d.describe(r);
        std::string elog = trimLog(error.data());
        if (!elog.empty())
          msg += "\n" + elog;
        if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
          msg += " (the driver, CUDA " + cuda_version_string(d.version()) +
                 ", is older than the PTX ISA this kernel was written in)";
        return Status::error(msg);
      }
      b->module_ = mod;
      *log = trimLog(info.data());
      return Status::success();
    };

    const GpuKernelChoice &c = b->choice_;
    std::string log, file = c.image;
    Status s = loadImage(c.image, !c.use_cubin, &log);
    if (s) {
      b->loaded_ = c.target + (c.use_cubin ? " cubin" : " PTX (JIT)");
    } else if (c.use_cubin && !c.ptx_fallback.empty()) {
      Status p = loadImage(c.ptx_fallback, true, &log);
      file = c.ptx_fallback;
      if (!p)
        return Status::error("cannot load the " + c.target + " kernel: " +
                             s.message() + "\nand its PTX: " + p.message());
      b->loaded_ =
          c.target + " PTX (JIT; the cubin did not load: " + s.message() + ")";
    } else {
      return s;
    }
    if (!log.empty())
      b->loaded_ += "\n" + log;

    s = d.check(d.cuModuleGetFunction(&b->fn_, b->module_, c.symbol.c_str()),
                joinPath(dir, file) + ": cuModuleGetFunction(\"" + c.symbol +
                    "\")");
    if (!s)
      return s;
    int regs = -1;
    if (d.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, b->fn_) ==
        CUDA_SUCCESS)
      b->registers_ = regs;
    return Expected<std::shared_ptr<CudaBundle>>(std::move(b));
  } catch (const std::exception &e) {
    return Status::error(dir + ": " + e.what());
  }
}

CudaBundle::~CudaBundle() {
  if (module_ && ctx_) {
    CudaContext::Scope scope(*ctx_);
    if (scope.ok())
      ctx_->driver().cuModuleUnload(module_);
  }
}

//===----------------------------------------------------------------------===//
// CudaOptimizer
//===----------------------------------------------------------------------===//

namespace {

/// A zero-filled device arena of one buffer: slices are reserved on the
/// host (64-entry boundaries, as the CPU arena) and the memory is brought up
/// to the reserved size by commit().
struct DeviceArena {
  CUdeviceptr data = 0;
  int64_t capacity = 0; ///< bytes allocated
  int64_t used = 0;     ///< entries reserved
  int elem = 1;         ///< bytes per entry

  int64_t reserve(int64_t count) {
    int64_t offset = (used + 63) / 64 * 64;
    used = offset + count;
    return offset;
  }
  int64_t neededBytes() const { return (used + 63) / 64 * 64 * elem; }
};

} // namespace

struct CudaOptimizer::Impl {
  std::shared_ptr<CudaBundle> bundle;
  std::shared_ptr<CudaContext> ctx;
  const CudaDriver *d = nullptr;
  const Manifest *m = nullptr;
  int64_t G = 1;
  size_t B = 0;
  CUstream stream = nullptr;
  int blocksPerSm = 8;
  int64_t maxRecord = 0;

  std::unique_ptr<HyperTable> hypers;
  uint64_t uploadedHyperGeneration = 0;
  bool hypersUploaded = false;

  std::vector<TensorInfo> tensors;
  std::vector<std::vector<int64_t>> offsets; ///< [tensor][buffer] entry
  std::vector<DeviceArena> arenas;
  int64_t totalGroups = 0, totalNumel = 0;

  std::vector<int64_t> table; ///< host copy of the device table
  int64_t records = 0;
  std::vector<int64_t> recordStart; ///< [tensor] its first record; + total
  std::vector<int64_t> subTable;    ///< step_tensors: compacted records
  CUdeviceptr devSubTable = 0;
  int64_t devSubTableBytes = 0;
  bool tableDirty = true;
  CUdeviceptr devTable = 0, devHypers = 0;
  int64_t devTableBytes = 0, devHypersBytes = 0;
  int64_t tableUploads = 0, hyperUploads = 0;
  int64_t t = 0;

  bool runtimeOwned(size_t b) const {
    BufferRole r = m->buffers[b].role;
    return r == BufferRole::Correction || r == BufferRole::State;
  }

  int64_t address(size_t tensor, size_t b) const {
    const BufferSpec &spec = m->buffers[b];
    if (spec.role == BufferRole::Param)
      return int64_t(reinterpret_cast<uintptr_t>(tensors[tensor].param));
    if (spec.role == BufferRole::Grad)
      return int64_t(reinterpret_cast<uintptr_t>(tensors[tensor].grad));
    return int64_t(arenas[b].data) +
           offsets[tensor][b] * dtype_size(spec.dtype);
  }

  /// Frees device memory once the stream is done with it.
  void freeAfterStream(CUdeviceptr p) {
    if (!p)
      return;
    d->cuStreamSynchronize(stream);
    d->cuMemFree(p);
  }

  /// Brings every arena up to its reserved size (context pushed).
  Status commit() {
    for (size_t b = 0; b < B; ++b) {
      DeviceArena &a = arenas[b];
      if (!runtimeOwned(b) || a.used == 0)
        continue;
      int64_t need = a.neededBytes();
      if (need <= a.capacity)
        continue;
      CUdeviceptr p = 0;
      Status s = d->check(d->cuMemAlloc(&p, size_t(need)),
                          "allocating " + std::to_string(need) + " bytes for " +
                              m->name + " buffer \"" + m->buffers[b].name +
                              "\" on " + ctx->info().name);
      if (!s)
        return s;
      s = d->check(d->cuMemsetD8Async(p, 0, size_t(need), stream),
                   "cuMemsetD8Async");
      if (s && a.data)
        s = d->check(
            d->cuMemcpyDtoDAsync(p, a.data, size_t(a.capacity), stream),
            "cuMemcpyDtoDAsync (growing a state arena)");
      if (!s) {
        freeAfterStream(p);
        return s;
      }
      freeAfterStream(a.data);
      a.data = p;
      a.capacity = need;
      tableDirty = true;
    }
    return Status::success();
  }

  /// Copies `bytes` of `src` to the device buffer *dst (grown to fit).
  Status uploadTo(CUdeviceptr *dst, int64_t *capacity, const void *src,
                  int64_t bytes, const char *what) {
    if (bytes > *capacity) {
      CUdeviceptr p = 0;
      Status s = d->check(d->cuMemAlloc(&p, size_t(bytes)),
                          std::string("allocating the ") + what);
      if (!s)
        return s;
      freeAfterStream(*dst);
      *dst = p;
      *capacity = bytes;
    }
    if (bytes == 0)
      return Status::success();
    // Pageable source: the driver stages it before returning, so the host
    // copy may change afterwards; ordered on the stream after earlier steps.
    return d->check(d->cuMemcpyHtoDAsync(*dst, src, size_t(bytes), stream),
                    std::string("uploading the ") + what);
  }

  /// Before a launch (inside a context scope): allocates what add_param
  /// deferred, and uploads the tensor table and the hyper table if they
  /// changed since the last upload.
  Status prepareLaunch() {
    Status s = commit();
    if (!s)
      return s;
    if (tableDirty) {
      rebuildTable();
      if (!(s = uploadTo(&devTable, &devTableBytes, table.data(),
                         int64_t(table.size() * sizeof(int64_t)),
                         "tensor table")))
        return s;
      tableDirty = false;
      ++tableUploads;
    }
    const std::vector<float> &hv = hypers->values();
    if (!hypersUploaded || uploadedHyperGeneration != hypers->generation()) {
      if (!(s = uploadTo(&devHypers, &devHypersBytes, hv.data(),
                         int64_t(hv.size() * sizeof(float)), "hyper table")))
        return s;
      hypersUploaded = true;
      uploadedHyperGeneration = hypers->generation();
      ++hyperUploads;
    }
    return Status::success();
  }

  void rebuildTable() {
    table.clear();
    table.reserve(tensors.size() * size_t(m->record_words));
    std::vector<int64_t> addresses(B, 0);
    records = 0;
    recordStart.assign(1, 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (size_t b = 0; b < B; ++b)
        addresses[b] = address(i, b);
      records +=
          append_table_records(*m, tensors[i], addresses, maxRecord, table);
      recordStart.push_back(records);
    }
  }

  Status checkTensor(int64_t tensor, const char *who) const {
    if (tensor < 0 || tensor >= int64_t(tensors.size()))
      return Status::error(std::string(who) + ": no tensor " +
                           std::to_string(tensor));
    return Status::success();
  }

  LaunchConfig config() const {
    const GpuKernelChoice &c = bundle->choice();
    LaunchConfig lc;
    lc.block = c.threads_per_block;
    lc.total_groups = totalGroups;
    lc.grid =
        gpu_grid_size(totalGroups, G, c.elements_per_thread,
                      c.threads_per_block, ctx->info().sm_count, blocksPerSm);
    lc.records = records;
    return lc;
  }
};

namespace {
Status checkAligned(const char *who, const char *what, CUdeviceptr p) {
  if (p % 16 == 0)
    return Status::success();
  return Status::error(std::string(who) + ": " + what + " address " + hex(p) +
                       " is not 16-byte aligned (GPU kernels use 128-bit "
                       "accesses)");
}
} // namespace

CudaOptimizer::CudaOptimizer() : impl_(new Impl()) {}

CudaOptimizer::~CudaOptimizer() {
  Impl &I = *impl_;
  if (!I.ctx)
    return;
  CudaContext::Scope scope(*I.ctx);
  if (!scope.ok())
    return;
  I.d->cuStreamSynchronize(I.stream);
  for (DeviceArena &a : I.arenas)
    if (a.data)
      I.d->cuMemFree(a.data);
  if (I.devTable)
    I.d->cuMemFree(I.devTable);
  if (I.devHypers)
    I.d->cuMemFree(I.devHypers);
  if (I.devSubTable)
    I.d->cuMemFree(I.devSubTable);
}

Expected<std::unique_ptr<CudaOptimizer>>
CudaOptimizer::create(std::shared_ptr<CudaBundle> bundle,
                      const CudaOptimizerOptions &opts) {
  if (!bundle)
    return Status::error("CudaOptimizer::create: null bundle");
  try {
    Status ok = HyperTable::check_manifest(bundle->manifest());
    if (!ok)
      return ok;
    std::unique_ptr<CudaOptimizer> o(new CudaOptimizer());
    Impl &I = *o->impl_;
    I.bundle = std::move(bundle);
    I.ctx = I.bundle->context();
    I.d = &I.ctx->driver();
    I.m = &I.bundle->manifest();
    I.G = I.m->group_size;
    I.B = I.m->buffers.size();
    I.stream = opts.stream;
    I.blocksPerSm = opts.blocks_per_sm > 0 ? opts.blocks_per_sm : 8;
    I.maxRecord = opts.max_record_elements > 0 ? opts.max_record_elements
                                               : gpu_max_record_elements(I.G);
    I.arenas.resize(I.B);
    for (size_t b = 0; b < I.B; ++b)
      I.arenas[b].elem = dtype_size(I.m->buffers[b].dtype);
    I.hypers = std::make_unique<HyperTable>(*I.m);
    if (I.hypers->add_slot() < 0)
      return Status::error("CudaOptimizer::create: out of memory");
    return Expected<std::unique_ptr<CudaOptimizer>>(std::move(o));
  } catch (const std::exception &e) {
    return Status::error(std::string("CudaOptimizer::create: ") + e.what());
  }
}

Expected<std::unique_ptr<CudaOptimizer>>
CudaOptimizer::create(std::shared_ptr<CudaContext> ctx, const std::string &dir,
                      const CudaOptimizerOptions &opts) {
  Expected<std::shared_ptr<CudaBundle>> b =
      CudaBundle::load(std::move(ctx), dir);
  if (!b)
    return b.status();
  return create(std::move(b.value()), opts);
}

const Manifest &CudaOptimizer::manifest() const { return *impl_->m; }
const CudaBundle &CudaOptimizer::bundle() const { return *impl_->bundle; }

int CudaOptimizer::add_param_group() { return impl_->hypers->add_slot(); }
int CudaOptimizer::num_param_groups() const {
  return impl_->hypers->num_slots();
}
Status CudaOptimizer::set_hyper(int slot, std::string_view name, float value) {
  return impl_->hypers->set(slot, name, value);
}
Status CudaOptimizer::set_hyper_all(std::string_view name, float value) {
  return impl_->hypers->set_all(name, value);
}
Expected<float> CudaOptimizer::hyper(int slot, std::string_view name) const {
  return impl_->hypers->get(slot, name);
}
const std::vector<float> &CudaOptimizer::hyper_table() const {
  return impl_->hypers->values();
}

Expected<int64_t> CudaOptimizer::add_param(int slot, CUdeviceptr param,
                                           int64_t numel, CUdeviceptr grad) {
  Impl &I = *impl_;
  if (slot < 0 || slot >= I.hypers->num_slots())
    return Status::error("add_param: param group " + std::to_string(slot) +
                         " does not exist (there are " +
                         std::to_string(I.hypers->num_slots()) + ")");
  if (!param)
    return Status::error("add_param: null param pointer");
  if (numel <= 0)
    return Status::error("add_param: numel must be > 0, got " +
                         std::to_string(numel));
  Status s = checkAligned("add_param", "param", param);
  if (s)
    s = checkAligned("add_param", "grad", grad);
  if (!s)
    return s;
  try {
    TensorInfo ti;
    ti.numel = numel;
    ti.first_group = I.totalGroups;
    ti.num_groups = (numel + I.G - 1) / I.G;
    ti.param_group = slot;
    ti.param = reinterpret_cast<void *>(uintptr_t(param));
    ti.grad = reinterpret_cast<void *>(uintptr_t(grad));
    std::vector<int64_t> offs(I.B, 0);
    // Everything that can throw comes first, so a failure leaves nothing
    // registered.
    I.tensors.reserve(I.tensors.size() + 1);
    I.offsets.reserve(I.offsets.size() + 1);
    for (size_t b = 0; b < I.B; ++b)
      if (I.runtimeOwned(b))
        offs[b] = I.arenas[b].reserve(
            I.m->buffers[b].per == Per::Group ? ti.num_groups : numel);
    I.tensors.push_back(ti);
    I.offsets.push_back(std::move(offs));
    I.totalGroups += ti.num_groups;
    I.totalNumel += numel;
    I.tableDirty = true;
    return int64_t(I.tensors.size() - 1);
  } catch (const std::exception &e) {
    return Status::error(std::string("add_param: ") + e.what());
  }
}

Status CudaOptimizer::set_grad(int64_t tensor, CUdeviceptr grad) {
  Impl &I = *impl_;
  Status s = I.checkTensor(tensor, "set_grad");
  if (s)
    s = checkAligned("set_grad", "grad", grad);
  if (!s)
    return s;
  void *g = reinterpret_cast<void *>(uintptr_t(grad));
  if (I.tensors[size_t(tensor)].grad != g) {
    I.tensors[size_t(tensor)].grad = g;
    I.tableDirty = true;
  }
  return Status::success();
}

Status CudaOptimizer::set_param(int64_t tensor, CUdeviceptr param) {
  Impl &I = *impl_;
  Status s = I.checkTensor(tensor, "set_param");
  if (!s)
    return s;
  if (!param)
    return Status::error("set_param: null param pointer");
  if (!(s = checkAligned("set_param", "param", param)))
    return s;
  void *p = reinterpret_cast<void *>(uintptr_t(param));
  if (I.tensors[size_t(tensor)].param != p) {
    I.tensors[size_t(tensor)].param = p;
    I.tableDirty = true;
  }
  return Status::success();
}

int64_t CudaOptimizer::num_tensors() const {
  return int64_t(impl_->tensors.size());
}
int64_t CudaOptimizer::total_groups() const { return impl_->totalGroups; }
int64_t CudaOptimizer::total_numel() const { return impl_->totalNumel; }
const TensorInfo &CudaOptimizer::tensor(int64_t i) const {
  return impl_->tensors[size_t(i)];
}
const std::vector<int64_t> &CudaOptimizer::table() const {
  return impl_->table;
}
int64_t CudaOptimizer::num_records() const { return impl_->records; }

Status CudaOptimizer::allocate() {
  Impl &I = *impl_;
  CudaContext::Scope scope(*I.ctx);
  if (!scope.ok())
    return scope.status();
  return I.commit();
}

Expected<BufferView> CudaOptimizer::buffer(int64_t tensor,
                                           std::string_view name) {
  Impl &I = *impl_;
  Status s = I.checkTensor(tensor, "buffer");
  if (!s)
    return s;
  Expected<int> found = find_buffer(*I.m, name);
  if (!found)
    return found.status();
  size_t b = size_t(*found);
  if (I.runtimeOwned(b) && !(s = allocate()))
    return s;
  const BufferSpec &spec = I.m->buffers[b];
  const TensorInfo &ti = I.tensors[size_t(tensor)];
  BufferView v;
  v.data = reinterpret_cast<void *>(uintptr_t(I.address(size_t(tensor), b)));
  v.dtype = spec.dtype;
  v.per = spec.per;
  v.count = spec.per == Per::Group ? ti.num_groups : ti.numel;
  v.bytes = v.count * dtype_size(spec.dtype);
  v.runtime_owned = I.runtimeOwned(b);
  return v;
}

Expected<std::vector<uint8_t>> CudaOptimizer::download(int64_t tensor,
                                                       std::string_view name) {
  Impl &I = *impl_;
  Expected<BufferView> v = buffer(tensor, name);
  if (!v)
    return v.status();
  if (!v->data)
    return Status::error("download: tensor " + std::to_string(tensor) +
                         " has no " + std::string(name) + " buffer yet");
  try {
    std::vector<uint8_t> out(size_t(v->bytes));
    CudaContext::Scope scope(*I.ctx);
    if (!scope.ok())
      return scope.status();
    Status s = I.d->check(
        I.d->cuMemcpyDtoHAsync(out.data(), CUdeviceptr(uintptr_t(v->data)),
                               size_t(v->bytes), I.stream),
        "download: cuMemcpyDtoHAsync");
    if (s)
      s = I.d->check(I.d->cuStreamSynchronize(I.stream),
                     "download: cuStreamSynchronize");
    if (!s)
      return s;
    return out;
  } catch (const std::exception &e) {
    return Status::error(std::string("download: ") + e.what());
  }
}

Status CudaOptimizer::step() {
  Impl &I = *impl_;
  if (Status g = check_all_grads(I.tensors); !g)
    return g;
  Status s = I.hypers->check_complete();
  if (!s)
    return s;
  int64_t t = I.t + 1;
  if (I.tensors.empty()) {
    I.t = t;
    return Status::success();
  }
  LaunchConfig lc = I.config();
  // The kernels take group_begin/end and the grid-stride index in 32 bits.
  if (I.totalGroups + lc.grid * lc.block > std::numeric_limits<int32_t>::max())
    return Status::error("step: " + std::to_string(I.totalGroups) +
                         " groups are more than one launch of this kernel "
                         "can index (2^31 - 1 minus one grid stride)");
  try {
    CudaContext::Scope scope(*I.ctx);
    if (!scope.ok())
      return scope.status();
    if (!(s = I.prepareLaunch()))
      return s;
    lc = I.config(); // records may have changed
    int64_t args[6] = {
        int64_t(I.devTable), I.records, int64_t(I.devHypers), t, 0,
        I.totalGroups};
    void *params[6] = {&args[0], &args[1], &args[2],
                       &args[3], &args[4], &args[5]};
    s = I.d->check(I.d->cuLaunchKernel(I.bundle->function(), unsigned(lc.grid),
                                       1, 1, unsigned(lc.block), 1, 1, 0,
                                       I.stream, params, nullptr),
                   "step: cuLaunchKernel(" + I.bundle->choice().symbol +
                       ", grid " + std::to_string(lc.grid) + ")");
    if (!s)
      return s;
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
  I.t = t;
  return Status::success();
}

Status CudaOptimizer::step_tensors(const std::vector<int64_t> &indices,
                                   int64_t t) {
  Impl &I = *impl_;
  if (Status s = check_step_indices(I.tensors, indices); !s)
    return s;
  Status s = I.hypers->check_complete();
  if (!s)
    return s;
  if (indices.empty())
    return Status::success();
  try {
    CudaContext::Scope scope(*I.ctx);
    if (!scope.ok())
      return scope.status();
    if (!(s = I.prepareLaunch()))
      return s;
    const int64_t R = I.m->record_words;
    const int64_t a = indices.front(), b = indices.back() + 1;
    CUdeviceptr table = 0;
    int64_t nrec = 0, begin = 0, end = 0;
    if (b - a == int64_t(indices.size())) {
      table = I.devTable + CUdeviceptr(I.recordStart[size_t(a)] * R * 8);
      nrec = I.recordStart[size_t(b)] - I.recordStart[size_t(a)];
      begin = I.tensors[size_t(a)].first_group;
      const TensorInfo &last = I.tensors[size_t(b - 1)];
      end = last.first_group + last.num_groups;
    } else {
      // Copy the tensors' records, renumbering word 1 from 0.
      I.subTable.clear();
      for (int64_t i : indices) {
        int64_t delta = end - I.tensors[size_t(i)].first_group;
        for (int64_t r = I.recordStart[size_t(i)];
             r < I.recordStart[size_t(i) + 1]; ++r) {
          const int64_t *rec = I.table.data() + r * R;
          I.subTable.insert(I.subTable.end(), rec, rec + R);
          I.subTable[I.subTable.size() - size_t(R) + 1] += delta;
          ++nrec;
        }
        end += I.tensors[size_t(i)].num_groups;
      }
      if (!(s = I.uploadTo(&I.devSubTable, &I.devSubTableBytes,
                           I.subTable.data(),
                           int64_t(I.subTable.size() * sizeof(int64_t)),
                           "partial tensor table")))
        return s;
      table = I.devSubTable;
    }
    const GpuKernelChoice &c = I.bundle->choice();
    int64_t block = c.threads_per_block;
    int64_t grid =
        gpu_grid_size(end - begin, I.G, c.elements_per_thread, int(block),
                      I.ctx->info().sm_count, I.blocksPerSm);
    if (end + grid * block > std::numeric_limits<int32_t>::max())
      return Status::error("step: " + std::to_string(end) +
                           " groups are more than one launch of this kernel "
                           "can index (2^31 - 1 minus one grid stride)");
    int64_t args[6] = {int64_t(table), nrec, int64_t(I.devHypers), t, begin,
                       end};
    void *params[6] = {&args[0], &args[1], &args[2],
                       &args[3], &args[4], &args[5]};
    s = I.d->check(I.d->cuLaunchKernel(I.bundle->function(), unsigned(grid), 1,
                                       1, unsigned(block), 1, 1, 0, I.stream,
                                       params, nullptr),
                   "step: cuLaunchKernel(" + c.symbol + ", grid " +
                       std::to_string(grid) + ")");
    if (!s)
      return s;
  } catch (const std::exception &e) {
    return Status::error(std::string("step: ") + e.what());
  }
  return Status::success();
}

int64_t CudaOptimizer::step_count() const { return impl_->t; }
void CudaOptimizer::set_step_count(int64_t t) { impl_->t = t; }

Status CudaOptimizer::synchronize() {
  Impl &I = *impl_;
  CudaContext::Scope scope(*I.ctx);
  if (!scope.ok())
    return scope.status();
  return I.d->check(I.d->cuStreamSynchronize(I.stream), "cuStreamSynchronize");
}

LaunchConfig CudaOptimizer::launch_config() const { return impl_->config(); }
int64_t CudaOptimizer::table_uploads() const { return impl_->tableUploads; }
int64_t CudaOptimizer::hyper_uploads() const { return impl_->hyperUploads; }

BytesReport CudaOptimizer::bytes() const {
  const Impl &I = *impl_;
  int64_t allocated = I.devTableBytes + I.devHypersBytes;
  for (const DeviceArena &a : I.arenas)
    allocated += a.capacity;
  return compute_bytes_report(*I.m, I.tensors, allocated);
}

} // namespace flashopt::host
