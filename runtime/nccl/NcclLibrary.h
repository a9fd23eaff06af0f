//===- NcclLibrary.h - libnccl, loaded at run time --------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The NCCL library, dlopen'ed like the CUDA driver (host/CudaDriver.h):
/// every entry point of NcclFunctions.def is resolved by name, so
/// libflashopt_nccl links against no NCCL library and, without one, says
/// which library or symbol is missing. nccl.h (from the CUDA toolkit) gives
/// the types and checks the signatures at build time.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_NCCL_NCCLLIBRARY_H
#define FLASHOPT_NCCL_NCCLLIBRARY_H

#include "flashopt/host/Abi.h"

#include <nccl.h>

#include <string>

namespace flashopt::nccl {

class NcclLibrary {
public:
#define FLASHOPT_NCCL_FUNCTION(name) decltype(&::name) name = nullptr;
#include "NcclFunctions.def"

  /// The process-wide library: libnccl.so.2, or the file named by the
  /// FLASHOPT_NCCL_LIBRARY environment variable (tests use a stand-in),
  /// loaded on the first call; later calls return the same result. The
  /// error is "NCCL was requested but the library <name> could not be
  /// loaded: <dlerror>" or "the NCCL library <name> has no <symbol>".
  static host::Expected<const NcclLibrary *> get();

  /// The library's file or soname, as loaded.
  const std::string &library() const { return library_; }
  /// "ncclInvalidUsage (...)" style text for `r`.
  std::string describe(ncclResult_t r) const;

private:
  NcclLibrary() = default;
  std::string library_;
};

} // namespace flashopt::nccl

#endif // FLASHOPT_NCCL_NCCLLIBRARY_H
