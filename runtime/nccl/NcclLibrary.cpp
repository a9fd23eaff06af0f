//===- NcclLibrary.cpp - libnccl, loaded at run time ----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "NcclLibrary.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>

namespace flashopt::nccl {

using host::Code;
using host::Expected;
using host::Status;

namespace {

Expected<const NcclLibrary *> loadOnce(NcclLibrary *lib, std::string name) {
  void *h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    return Status::error(
        Code::Unsupported,
        "NCCL was requested but the library " + name +
            " could not be loaded: " + (e ? e : "unknown dlopen error") +
            " (install NCCL or set FLASHOPT_NCCL_LIBRARY to libnccl.so.2's "
            "path)");
  }
#define FLASHOPT_NCCL_FUNCTION(fn)                                             \
  lib->fn = reinterpret_cast<decltype(lib->fn)>(dlsym(h, #fn));                \
  if (!lib->fn)                                                                \
    return Status::error(Code::Unsupported,                                    \
                         "the NCCL library " + name + " has no symbol " #fn);
#include "NcclFunctions.def"
  return static_cast<const NcclLibrary *>(lib);
}

} // namespace

Expected<const NcclLibrary *> NcclLibrary::get() {
  // Loaded once (never unloaded: NCCL keeps threads of its own).
  static const Expected<const NcclLibrary *> loaded = [] {
    const char *env = std::getenv("FLASHOPT_NCCL_LIBRARY");
    std::string name = env && *env ? env : "libnccl.so.2";
    static NcclLibrary lib;
    lib.library_ = name;
    return loadOnce(&lib, name);
  }();
  return loaded;
}

std::string NcclLibrary::describe(ncclResult_t r) const {
  const char *s = ncclGetErrorString ? ncclGetErrorString(r) : nullptr;
  return "NCCL error " + std::to_string(int(r)) +
         (s ? std::string(" (") + s + ")" : "");
}

} // namespace flashopt::nccl
