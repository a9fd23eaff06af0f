//===- DriverSupport.h - What the driver's files share ----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The helpers the emit stages (BundleDriver.cpp) and the bundle build
/// (Bundles.cpp) share: pipelines run on a copy of a job, errors and file
/// writing. Private to lib/Driver.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_LIB_DRIVER_DRIVERSUPPORT_H
#define FLASHOPT_LIB_DRIVER_DRIVERSUPPORT_H

#include "flashopt/Driver/BundleDriver.h"

#include "mlir/Pass/PassManager.h"

#include <optional>
#include <utility>

namespace flashopt::driver::detail {

/// An error with `message` and no error code.
llvm::Error makeError(const llvm::Twine &message);

/// The dialect's kernel kind of the kernel ABI's `kind` (the same names).
mlir::flashopt::KernelKind dialectKernelKind(abi::KernelKind kind);

/// A copy of `job`'s module.
mlir::OwningOpRef<mlir::ModuleOp> cloneModule(const CompileJob &job);

/// Runs the passes `build` adds on `module`.
llvm::LogicalResult
runPasses(mlir::ModuleOp module,
          llvm::function_ref<void(mlir::OpPassManager &)> build);

/// Walks gpuShapeLadder(options): `build(shape)` makes a candidate and
/// says how many bytes ptxas spilled for it (std::pair<T, int>). The first
/// candidate without spills is returned, else the one with the fewest;
/// without ptxas (`assembled` false) the first shape's.
template <class T, class Build>
llvm::Expected<T> pickGpuShape(const DriverOptions &options, bool assembled,
                               Build build) {
  std::optional<std::pair<T, int>> best;
  for (const DriverOptions &shape : gpuShapeLadder(options)) {
    llvm::Expected<std::pair<T, int>> candidate = build(shape);
    if (!candidate)
      return candidate.takeError();
    if (!best || candidate->second < best->second)
      best = std::move(*candidate);
    if (!assembled || best->second == 0)
      break;
  }
  return std::move(best->first);
}

/// Writes `data` to the file `path` (replacing it).
llvm::Error writeFile(const std::string &path, llvm::StringRef data);

/// Expands the encodings of a copy of `job` (its kernelKind's kernel).
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
expandEncodings(const CompileJob &job);

/// A copy of `job` through flashopt-cpu-pipeline for `cpu`; fails with
/// `failureMessage`.
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
lowerToHostLLVM(const CompileJob &job, const target::HostCPU &cpu,
                llvm::StringRef failureMessage);

} // namespace flashopt::driver::detail

#endif // FLASHOPT_LIB_DRIVER_DRIVERSUPPORT_H
