//===- mock_cuda.cpp - A CUDA driver stand-in for tests without a GPU
//-------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A shared library exporting the driver entry points the runtime resolves
/// (FLASHOPT_CUDA_DRIVER_FUNCTIONS in Cuda.h), with "device memory" in host
/// memory. A launch runs the bundle's CPU kernel (same ABI) on the launch's
/// whole group range, after checking what a GPU would need: 256-thread
/// blocks, a table and hyper table in device (mock-allocated) memory,
/// records under 2^31 elements, ordered and contiguous, and every buffer
/// 16-byte aligned and inside a mock allocation or caller memory.
///
/// Built a second time with FLASHOPT_MOCK_CUDA_EMULATE_PTX (the target
/// flashopt_emulated_cuda), the stand-in instead JIT-"loads" the PTX image
/// with the PTX interpreter (tools/ptx-emulator) and cuLaunchKernel runs the
/// launch's grid through it, with the kernel parameters exactly as the
/// runtime packed them and every global access checked against the mock
/// allocations (the interpreter replaces the table checks below); cubins
/// are refused there, so the runtime falls back to the chip's PTX.
/// mockcuda_last_error() returns the last interpreter error.
///
/// Fresh allocations are filled with 0xCD, so a runtime that forgets to zero
/// its state is caught. Configuration, read at each call:
///   FLASHOPT_MOCK_CUDA_CC        compute capability, "8.9" by default;
///   FLASHOPT_MOCK_CUDA_SMS       SM count (132): fewer SMs, a smaller grid;
///   FLASHOPT_MOCK_CUDA_MEMORY    device memory in bytes (16 GiB);
///   FLASHOPT_MOCK_CUDA_KERNEL    the CPU kernel library for every symbol;
///   FLASHOPT_MOCK_CUDA_KERNELS   else <dir>/<symbol>/<symbol>.x86-64.so.
/// Counters for tests: mockcuda_stats(launches, allocations, live bytes).
///
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
#include "ptx-emulator/PtxEmulator.h"
#include <memory>
#endif

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using KernelFn = void (*)(const int64_t *, int64_t, const float *, int64_t,
                          int64_t, int64_t);

constexpr CUresult kOk = 0, kInvalidValue = 1, kOutOfMemory = 2,
                   kInvalidDevice = 101, kInvalidImage = 200, kNotFound = 500,
                   kLaunchFailed = 719;

struct Module {
  std::string image;
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  std::shared_ptr<flashopt::ptxemu::Module> ptx;
#endif
};
struct Function {
  std::string symbol;
  KernelFn fn = nullptr;
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  std::shared_ptr<flashopt::ptxemu::Module> module;
  const flashopt::ptxemu::Kernel *kernel = nullptr;
#endif
};

std::mutex mu;
std::map<uintptr_t, size_t> allocations; // base -> bytes
int64_t liveBytes = 0, totalAllocations = 0, launches = 0;
std::string lastError;
uint64_t laneInstructions = 0;
int contextToken = 0;

int64_t memoryLimit() {
  const char *e = std::getenv("FLASHOPT_MOCK_CUDA_MEMORY");
  return e ? std::atoll(e) : (int64_t(16) << 30);
}

void ccFromEnv(int *major, int *minor) {
  const char *e = std::getenv("FLASHOPT_MOCK_CUDA_CC");
  *major = 8;
  *minor = 9;
  if (e && *e) {
    int a = 0, b = 0;
    if (std::sscanf(e, "%d.%d", &a, &b) == 2) {
      *major = a;
      *minor = b;
    }
  }
}

/// Whether [p, p + bytes) lies inside one mock allocation.
bool isDevice(uintptr_t p, size_t bytes) {
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin())
    return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

CUresult fail(CUresult r, const std::string &why) {
  std::fprintf(stderr, "mock libcuda: %s\n", why.c_str());
  lastError = why;
  return r;
}

} // namespace

extern "C" {

/// The last error the stand-in reported (interpreter faults included).
__attribute__((visibility("default"))) const char *mockcuda_last_error() {
  return lastError.c_str();
}

/// Lane instructions the interpreter executed so far (0 without it).
__attribute__((visibility("default"))) uint64_t
mockcuda_lane_instructions() {
  return laneInstructions;
}

__attribute__((visibility("default"))) void
mockcuda_stats(int64_t *l, int64_t *a, int64_t *live) {
  std::lock_guard<std::mutex> lock(mu);
  if (l)
    *l = launches;
  if (a)
    *a = totalAllocations;
  if (live)
    *live = liveBytes;
}

#define API extern "C" __attribute__((visibility("default"))) CUresult

API cuInit(unsigned) { return kOk; }
API cuDriverGetVersion(int *v) {
  *v = 13000;
  return kOk;
}
API cuGetErrorName(CUresult r, const char **s) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof buf, "MOCK_CUDA_ERROR_%d", r);
  *s = buf;
  return kOk;
}
API cuGetErrorString(CUresult, const char **s) {
  *s = "mock driver error";
  return kOk;
}
API cuDeviceGetCount(int *n) {
  *n = 1;
  return kOk;
}
API cuDeviceGet(int *d, int ordinal) {
  if (ordinal != 0)
    return kInvalidDevice;
  *d = 0;
  return kOk;
}
API cuDeviceGetName(char *name, int len, int) {
  std::snprintf(name, size_t(len), "Mock GPU (host memory)");
  return kOk;
}
API cuDeviceGetAttribute(int *v, int attr, int) {
  int major, minor;
  ccFromEnv(&major, &minor);
  switch (attr) {
  case 16: {
    const char *sms = std::getenv("FLASHOPT_MOCK_CUDA_SMS");
    *v = sms && std::atoi(sms) > 0 ? std::atoi(sms) : 132;
    return kOk;
  }
  case 75:
    *v = major;
    return kOk;
  case 76:
    *v = minor;
    return kOk;
  default:
    return kInvalidValue;
  }
}
API cuDeviceTotalMem_v2(size_t *bytes, int) {
  *bytes = size_t(memoryLimit());
  return kOk;
}
API cuDevicePrimaryCtxRetain(void **ctx, int) {
  *ctx = &contextToken;
  return kOk;
}
API cuDevicePrimaryCtxRelease_v2(int) { return kOk; }
API cuCtxPushCurrent_v2(void *) { return kOk; }
API cuCtxPopCurrent_v2(void **ctx) {
  if (ctx)
    *ctx = &contextToken;
  return kOk;
}
API cuCtxSynchronize() { return kOk; }

API cuModuleLoadDataEx(void **mod, const void *image, unsigned, int *,
                       void **) {
  const char *p = static_cast<const char *>(image);
  bool elf = std::memcmp(p,
                         "\x7f"
                         "ELF",
                         4) == 0;
  bool ptx = !elf && std::strstr(p, ".version") && std::strstr(p, ".target");
  if (!elf && !ptx)
    return fail(kInvalidImage, "cuModuleLoadDataEx: neither a cubin nor PTX");
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  if (elf) { // expected: the runtime then loads the chip's PTX
    lastError = "cuModuleLoadDataEx: the PTX-emulating stand-in runs PTX, "
                "not cubins";
    return kInvalidImage;
  }
  std::string err;
  std::shared_ptr<flashopt::ptxemu::Module> parsed =
      flashopt::ptxemu::Module::parse(p, &err);
  if (!parsed)
    return fail(kInvalidImage, "cuModuleLoadDataEx: " + err);
#endif
  Module *m = new Module();
  if (ptx)
    m->image = p;
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  m->ptx = parsed;
#endif
  *mod = m;
  return kOk;
}
API cuModuleUnload(void *mod) {
  delete static_cast<Module *>(mod);
  return kOk;
}
API cuModuleGetFunction(void **fn, void *mod, const char *name) {
  Module *m = static_cast<Module *>(mod);
  if (!m->image.empty() &&
      m->image.find(std::string(".entry ") + name) == std::string::npos)
    return fail(kNotFound, std::string("no entry ") + name + " in the PTX");
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  {
    const flashopt::ptxemu::Kernel *k = m->ptx->kernel(name);
    if (!k)
      return fail(kNotFound, std::string("no entry ") + name + " in the PTX");
    Function *f = new Function(); // leaked with the module: tests only
    f->symbol = name;
    f->module = m->ptx;
    f->kernel = k;
    *fn = f;
    return kOk;
  }
#endif
  std::string lib;
  if (const char *k = std::getenv("FLASHOPT_MOCK_CUDA_KERNEL"))
    lib = k;
  else if (const char *d = std::getenv("FLASHOPT_MOCK_CUDA_KERNELS"))
    lib = std::string(d) + "/" + name + "/" + name + ".x86-64.so";
  else
    return fail(kNotFound, "set FLASHOPT_MOCK_CUDA_KERNEL(S) to run kernels");
  void *h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return fail(kNotFound, std::string("dlopen ") + lib + ": " + dlerror());
  void *sym = dlsym(h, name);
  if (!sym)
    return fail(kNotFound, lib + " has no " + name);
  Function *f = new Function(); // leaked with the module: tests only
  f->symbol = name;
  f->fn = reinterpret_cast<KernelFn>(sym);
  *fn = f;
  return kOk;
}
API cuFuncGetAttribute(int *v, int attr, void *) {
  if (attr != 4)
    return kInvalidValue;
  *v = 42;
  return kOk;
}

API cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                   unsigned by, unsigned bz, unsigned shmem, void *,
                   void **params, void **extra) {
  Function *f = static_cast<Function *>(fn);
  if (bx != 256 || by != 1 || bz != 1 || gy != 1 || gz != 1 || gx == 0 ||
      shmem != 0 || extra || !params)
    return fail(kInvalidValue, "launch geometry: want grid (n,1,1), block "
                               "(256,1,1), no shared memory");
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  // The interpreter is the check: every access the kernel makes must be
  // inside a device allocation and aligned, so a partial table (a pointer
  // into the middle of the runtime's table) is fine here. The NCCL
  // communicator's combine kernels (runtime/nccl) take no table.
  if (f->symbol.rfind("flashopt_nccl_", 0) != 0) {
    int64_t a[6];
    for (int i = 0; i < 6; ++i)
      std::memcpy(&a[i], params[i], 8);
    std::lock_guard<std::mutex> lock(mu);
    if (a[1] < 1 || !isDevice(uintptr_t(a[0]), 8 * size_t(a[1])))
      return fail(kLaunchFailed, "the table is not in device memory");
    if (a[4] < 0 || a[5] > INT32_MAX || a[4] >= a[5])
      return fail(kLaunchFailed, "bad group range");
    ++launches;
  }
#else
  int64_t a[6];
  for (int i = 0; i < 6; ++i)
    std::memcpy(&a[i], params[i], 8);
  const int64_t *table = reinterpret_cast<const int64_t *>(a[0]);
  int64_t n = a[1];
  int64_t R = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    // The runtime allocates the table to its exact size (it only grows), so
    // the allocation tells the record size.
    auto it = allocations.find(uintptr_t(a[0]));
    if (n < 1 || it == allocations.end())
      return fail(kLaunchFailed, "the table is not a device allocation");
    if (it->second % (8 * size_t(n)) == 0)
      R = int64_t(it->second / (8 * size_t(n)));
    if (a[2] && !isDevice(uintptr_t(a[2]), 4))
      return fail(kLaunchFailed, "the hyper table is not in device memory");
    if (a[4] < 0 || a[5] > INT32_MAX || a[4] >= a[5])
      return fail(kLaunchFailed, "bad group range");
    ++launches;
  }
  // Check every record: numel under 2^31, contiguous groups, aligned buffers.
  if (R >= 5) {
    const char *g = std::getenv("FLASHOPT_MOCK_CUDA_GROUP");
    const int64_t G = g ? std::atoll(g) : 32;
    int64_t expect = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t *rec = table + t * R;
      if (rec[0] < 1 || rec[0] > INT32_MAX || rec[1] != expect || rec[3] < 0)
        return fail(kLaunchFailed,
                    "record " + std::to_string(t) + " is malformed");
      for (int64_t w = 4; w < R; ++w)
        if (rec[w] % 16 != 0)
          return fail(kLaunchFailed, "record " + std::to_string(t) + " word " +
                                         std::to_string(w) +
                                         " is not 16-byte aligned");
      expect += (rec[0] + G - 1) / G;
    }
    if (expect != a[5])
      return fail(kLaunchFailed, "group_end is not the table's total");
  }
#endif
#ifdef FLASHOPT_MOCK_CUDA_EMULATE_PTX
  // The kernel's own parameter list, filled from kernelParams as the driver
  // does: each parameter's bytes from its pointer.
  const auto &decl = f->kernel->params();
  std::vector<uint8_t> buf(f->kernel->param_bytes(), 0);
  for (size_t i = 0; i < decl.size(); ++i)
    std::memcpy(buf.data() + decl[i].first, params[i], decl[i].second);
  flashopt::ptxemu::LaunchDims dims;
  dims.grid[0] = gx;
  dims.grid[1] = gy;
  dims.grid[2] = gz;
  dims.block[0] = bx;
  dims.block[1] = by;
  dims.block[2] = bz;
  std::lock_guard<std::mutex> lock(mu);
  std::string err;
  flashopt::ptxemu::LaunchStats st;
  bool ok = flashopt::ptxemu::launch(
      *f->kernel, dims, buf,
      [](uint64_t addr, uint64_t bytes, bool) {
        return isDevice(uintptr_t(addr), size_t(bytes));
      },
      &err, &st);
  laneInstructions += st.lane_instructions;
  if (!ok)
    return fail(kLaunchFailed, "cuLaunchKernel(" + f->symbol + "): " + err);
  return kOk;
#else
  f->fn(table, n, reinterpret_cast<const float *>(a[2]), a[3], a[4], a[5]);
  return kOk;
#endif
}

API cuMemGetInfo_v2(size_t *fr, size_t *total) {
  std::lock_guard<std::mutex> lock(mu);
  int64_t lim = memoryLimit();
  *fr = size_t(std::max<int64_t>(0, lim - liveBytes));
  *total = size_t(lim);
  return kOk;
}
API cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (bytes == 0)
    return kInvalidValue;
  if (liveBytes + int64_t(bytes) > memoryLimit())
    return kOutOfMemory;
  void *m = nullptr;
  if (posix_memalign(&m, 256, (bytes + 255) / 256 * 256) != 0)
    return kOutOfMemory;
  std::memset(m, 0xCD, bytes);
  allocations[uintptr_t(m)] = bytes;
  liveBytes += int64_t(bytes);
  ++totalAllocations;
  *p = CUdeviceptr(uintptr_t(m));
  return kOk;
}
API cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations.find(uintptr_t(p));
  if (it == allocations.end())
    return fail(kInvalidValue, "cuMemFree of an address not allocated");
  liveBytes -= int64_t(it->second);
  allocations.erase(it);
  std::free(reinterpret_cast<void *>(uintptr_t(p)));
  return kOk;
}

namespace {
CUresult checkedCopy(void *dst, const void *src, size_t n, bool dstDev,
                     bool srcDev) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (dstDev && !isDevice(uintptr_t(dst), n))
      return fail(kInvalidValue,
                  "copy into memory that is not a device allocation");
    if (srcDev && !isDevice(uintptr_t(src), n))
      return fail(kInvalidValue,
                  "copy from memory that is not a device allocation");
  }
  std::memmove(dst, src, n);
  return kOk;
}
void *ptr(CUdeviceptr p) { return reinterpret_cast<void *>(uintptr_t(p)); }
} // namespace

API cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
  return checkedCopy(ptr(d), s, n, true, false);
}
API cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
  return checkedCopy(d, ptr(s), n, false, true);
}
API cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  return checkedCopy(ptr(d), ptr(s), n, true, true);
}
API cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *) {
  return checkedCopy(ptr(d), s, n, true, false);
}
API cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *) {
  return checkedCopy(d, ptr(s), n, false, true);
}
API cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *) {
  return checkedCopy(ptr(d), ptr(s), n, true, true);
}
API cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!isDevice(uintptr_t(d), n))
      return fail(kInvalidValue,
                  "memset of memory that is not a device allocation");
  }
  std::memset(ptr(d), v, n);
  return kOk;
}
API cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *) {
  return cuMemsetD8_v2(d, v, n);
}
API cuStreamCreate(void **s, unsigned) {
  *s = new int(0);
  return kOk;
}
API cuStreamDestroy_v2(void *s) {
  delete static_cast<int *>(s);
  return kOk;
}
API cuStreamSynchronize(void *) { return kOk; }

namespace {
struct Event {
  double t = 0;
};
double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}
} // namespace

API cuEventCreate(void **e, unsigned) {
  *e = new Event();
  return kOk;
}
API cuEventDestroy_v2(void *e) {
  delete static_cast<Event *>(e);
  return kOk;
}
API cuEventRecord(void *e, void *) {
  static_cast<Event *>(e)->t = now();
  return kOk;
}
API cuEventSynchronize(void *) { return kOk; }
API cuEventElapsedTime(float *ms, void *a, void *b) {
  *ms = float(static_cast<Event *>(b)->t - static_cast<Event *>(a)->t);
  return kOk;
}

} // extern "C"
