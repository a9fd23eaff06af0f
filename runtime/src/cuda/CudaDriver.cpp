//===- CudaDriver.cpp -----------------------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// dlopen, the entry points of CudaDriverFunctions.def, cuInit, error text.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CudaDriver.h"

#include <cstdlib>
#include <dlfcn.h>
#include <exception>
#include <map>
#include <mutex>

namespace flashopt::host {

using namespace cu;

namespace {
constexpr const char *kDriverLibrary = "libcuda.so.1";
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
          Code::Device,
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
#define FLASHOPT_CUDA_FUNCTION(name, symbol, fallback, params)                 \
  d->name = reinterpret_cast<PFN_##name>(resolve(symbol, fallback));           \
  if (!d->name) {                                                              \
    dlclose(h);                                                                \
    return Status::error(Code::Device,                                         \
                         "CUDA was requested but the NVIDIA driver library " + \
                             library + " lacks the entry point " + symbol +    \
                             " (a driver older than this runtime supports?)"); \
  }
#include "flashopt/host/CudaDriverFunctions.def"
    CUresult r = d->cuInit(0);
    if (r != CUDA_SUCCESS) {
      std::string why = d->describe(r);
      dlclose(h);
      return Status::error(
          Code::Device, "CUDA was requested but the NVIDIA driver (" + library +
                            ") could not be initialized: cuInit: " + why);
    }
    if (d->cuDriverGetVersion(&d->version_) != CUDA_SUCCESS)
      d->version_ = 0;
    return Expected<std::unique_ptr<CudaDriver>>(std::move(d));
  } catch (const std::exception &e) {
    return Status::from_exception(e, "CUDA driver: ");
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
  return Status::error(r == CUDA_ERROR_OUT_OF_MEMORY ? Code::OutOfMemory
                                                     : Code::Cuda,
                       what + ": " + describe(r));
}

} // namespace flashopt::host
