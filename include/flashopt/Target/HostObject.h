//===- HostObject.h - LLVM dialect to host and shared objects ---*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Code generation for the host CPU: an LLVM-dialect module is translated to
/// LLVM IR, optimized at O3 for an explicit CPU (never the build machine's
/// features by accident), emitted as a PIC object and linked into a shared
/// object that the runtime dlopen()s.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TARGET_HOSTOBJECT_H
#define FLASHOPT_TARGET_HOSTOBJECT_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace flashopt::target {

/// One CPU flavour an artifact is built for.
struct HostCPU {
  /// LLVM CPU name ("x86-64-v3", "x86-64", "generic", ...).
  std::string name;
  /// CPU features the runtime must see before using the artifact, in the
  /// spelling of __builtin_cpu_supports ("avx2", "fma", "f16c", ...).
  std::vector<std::string> requires_;
};

/// The CPU flavours built by default for the host architecture: on x86-64
/// an AVX2/FMA/F16C build and a baseline fallback; elsewhere "generic".
std::vector<HostCPU> defaultHostCPUs();

/// Looks up a CPU flavour by name (one of defaultHostCPUs() or any CPU
/// LLVM knows for the host architecture, then with no feature list).
llvm::Expected<HostCPU> lookupHostCPU(llvm::StringRef name);

/// Translates `module` (LLVM dialect) to LLVM IR text, optimized at O3 for
/// `cpu` when `optimize` is set.
llvm::Expected<std::string> emitHostLLVMIR(mlir::ModuleOp module,
                                           const HostCPU &cpu, bool optimize);

/// Emits a position-independent object file for `cpu`.
llvm::Expected<std::string> emitHostObject(mlir::ModuleOp module,
                                           const HostCPU &cpu);

/// Emits an object file for `cpu` holding only one exported, read-only,
/// NUL-terminated string `bytes` named `symbol` (no code): how a kernel's ABI
/// description travels next to the kernel without touching its code.
llvm::Expected<std::string> emitDataObject(const HostCPU &cpu,
                                           llvm::StringRef symbol,
                                           llvm::StringRef bytes);

/// Links `objectPath` (and `extraObjects`) into the shared object
/// `sharedPath` with the system C compiler driver (cc), adding libm and
/// libgcc for the runtime helpers that baseline CPUs need (floorf,
/// half-precision conversions).
llvm::Error linkSharedObject(const std::string &objectPath,
                             const std::string &sharedPath,
                             llvm::ArrayRef<std::string> extraObjects = {});

} // namespace flashopt::target

#endif // FLASHOPT_TARGET_HOSTOBJECT_H
