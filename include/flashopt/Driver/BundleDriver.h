//===- BundleDriver.h - specs to kernels and bundles ------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The library behind flashopt-gen: loads optimizer specs (JSON) or dialect
/// files, and compiles each optimizer to one emit stage (the configured
/// optimizer, kernel IR, LLVM IR, objects, PTX) or to a bundle directory
/// (manifest.json plus artifacts), over the registered pipelines of
/// lib/Conversion/Pipelines. Every function returns its errors; nothing
/// here exits or prints the tool's name.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DRIVER_BUNDLEDRIVER_H
#define FLASHOPT_DRIVER_BUNDLEDRIVER_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Target/HostObject.h"
#include "flashopt/abi/Manifest.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flashopt::driver {

/// What to produce for each optimizer (flashopt-gen --emit).
enum class EmitStage {
  /// The configured flashopt.optimizer, as text.
  MLIR,
  /// Target-neutral kernel IR (after flashopt-expand-encodings), as text.
  KernelIR,
  /// Optimized LLVM IR of the CPU kernel for the first CPU flavour.
  LLVM,
  /// One object file <name>.<cpu>.o per CPU flavour in the output directory.
  Obj,
  /// PTX of the GPU kernel for the first GPU target (default sm_90).
  PTX,
  /// A bundle directory <output>/<name>/ with manifest.json and artifacts.
  Bundle,
};

/// How to compile (flashopt-gen's flags).
struct DriverOptions {
  EmitStage emit = EmitStage::Bundle;
  /// Where bundles and object files go (created when missing).
  std::string outputDir = ".";
  /// The targets to build ("cpu", "sm_80", "sm_90", "sm_100"); nullopt:
  /// the targets each input lists.
  std::optional<std::vector<std::string>> targets;
  /// The CPU flavours of the cpu target, best first; nullopt:
  /// target::defaultHostCPUs().
  std::optional<std::vector<target::HostCPU>> cpus;
  /// GPU: flush f32 subnormals to zero.
  bool ftz = false;
  /// GPU: Triton-compatible approximate division/sqrt and FMA contraction.
  bool tritonCompat = false;
  /// GPU: bytes of the widest stream per thread access (0 = per kernel).
  int64_t gpuBytesPerThread = 0;
  /// GPU: every kernel's register cap (0 = 64, or the wide cap flashopt-to-gpu
  /// gives a kernel it widens); for experiments (scripts/device-check.sh).
  int64_t gpuMaxRegisters = 0;
  /// GPU: flashopt-to-gpu{full-warp-path} and {shared-bases}. A bundle build
  /// whose kernel spills (ptxas's report) is rebuilt without shared bases,
  /// then without the full-warp body.
  bool gpuFullWarpPath = true;
  bool gpuSharedBases = true;
  /// Assemble cubins with ptxas when it is installed.
  bool runPtxas = true;
  /// Which kernel the single-kernel emit stages (kernel-ir, llvm, obj, ptx)
  /// make; a bundle has every kernel its optimizer has (docs/KERNEL-ABI.md
  /// "Gradient accumulation").
  abi::KernelKind kernel = abi::KernelKind::Step;
};

/// One optimizer to compile, with where it came from.
struct CompileJob {
  /// A module holding exactly `optimizer`.
  mlir::OwningOpRef<mlir::ModuleOp> module;
  mlir::flashopt::OptimizerOp optimizer;
  std::string specPath;
  /// "fnv1a64:<16 hex digits>".
  std::string specHash;
  /// The built-in rule name, or "file:<name>" for a rule file.
  std::string rule;
  std::string description;
  /// The targets the input lists (["cpu"] for dialect files).
  std::vector<std::string> targets;
  /// Which of the optimizer's kernels the pipelines make
  /// (flashopt-expand-encodings{kernel-kind}).
  abi::KernelKind kernelKind = abi::KernelKind::Step;

  /// The optimizer's name (the kernel symbol and bundle directory name).
  llvm::StringRef getName() const {
    return mlir::flashopt::OptimizerOp(optimizer).getSymName();
  }
};

/// The kernels a bundle of `job` has: the step, and with an accumulator the
/// accumulate, step_accumulated and step_fused kernels too.
std::vector<abi::KernelKind> kernelKinds(const CompileJob &job);

/// A copy of `job` whose pipelines make the `kind` kernel (its kernelKind;
/// the kernel symbol is the optimizer's name plus abi::kernel_kind_suffix).
CompileJob jobForKernel(const CompileJob &job, abi::KernelKind kind);

/// A failure whose diagnostics were already written (to the diagnostics
/// stream or through the MLIR context's handler); its message is empty.
class ReportedError : public llvm::ErrorInfo<ReportedError> {
public:
  static char ID;
  void log(llvm::raw_ostream &) const override {}
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }
};

/// Loads one input: a spec (any name not ending in .mlir), applied to its
/// rule, or a dialect file, each of whose flashopt.optimizer ops becomes
/// one job. Located diagnostics (file:line:col) go to `diagnostics` and
/// yield a ReportedError; other failures are plain errors. Verify the jobs
/// (verifyJob) before compiling them.
llvm::Expected<std::vector<CompileJob>>
loadInput(mlir::MLIRContext &ctx, llvm::StringRef path,
          llvm::raw_ostream &diagnostics);

/// Verifies the module of `job`; its diagnostics go through the context's
/// handler and yield a ReportedError.
llvm::Error verifyJob(const CompileJob &job);

/// The targets to build for `job` (the options' or the job's own), checked.
llvm::Expected<std::vector<std::string>>
resolveTargets(const CompileJob &job, const DriverOptions &options);

/// The CPU flavours to build for (the options' or the host's defaults).
std::vector<target::HostCPU> resolveHostCPUs(const DriverOptions &options);

/// The configured optimizer as dialect text.
std::string emitOptimizerText(const CompileJob &job);

/// The kernel IR of `job` (flashopt-expand-encodings) as text.
llvm::Expected<std::string> emitKernelIRText(const CompileJob &job);

/// The optimized LLVM IR of the CPU kernel of `job` for `cpu`
/// (flashopt-cpu-pipeline, then LLVM O3 for `cpu`).
llvm::Expected<std::string> emitHostLLVMIRText(const CompileJob &job,
                                               const target::HostCPU &cpu);

/// The object file of the CPU kernel of `job` for `cpu`.
llvm::Expected<std::string> emitHostObjectFile(const CompileJob &job,
                                               const target::HostCPU &cpu);

/// The shapes a GPU build tries, in order, while ptxas reports spills: the
/// options as given, then without shared base addresses, then without the
/// full-warp body (flashopt-to-gpu{shared-bases,full-warp-path}); the first
/// without spills is kept, else the one with the fewest.
std::vector<DriverOptions> gpuShapeLadder(const DriverOptions &options);

/// The PTX of the GPU kernel of `job` for `chip` (flashopt-gpu-pipeline).
llvm::Expected<std::string> emitPTXText(const CompileJob &job,
                                        llvm::StringRef chip,
                                        const DriverOptions &options);

/// The manifest of `job` before any artifact is added: names, dtypes,
/// hyper-parameters, state encodings (each from its
/// StateEncodingAttrInterface) and the buffers of its expanded `kernel`.
/// The kernel's buffers must be exactly the ones the kernel ABI implies
/// (abi::implied_buffers); anything else is an internal error.
llvm::Expected<abi::Manifest> describeBundle(const CompileJob &job,
                                             mlir::flashopt::KernelOp kernel);

/// A bundle that was written.
struct BundleResult {
  /// <outputDir>/<name>.
  std::string directory;
  /// What its manifest.json says.
  abi::Manifest manifest;
};

/// Builds the bundle of `job` for `targets` in a temporary directory next
/// to its final place, then renames it into place: a failure leaves no
/// partial bundle.
llvm::Expected<BundleResult>
buildBundle(const CompileJob &job, const std::vector<std::string> &targets,
            const DriverOptions &options);

/// What compile() produced.
struct CompileResult {
  /// The bundle written (EmitStage::Bundle only).
  std::optional<BundleResult> bundle;
};

/// Compiles `job` to `options.emit`: text stages go to `out`, objects and
/// bundles to `options.outputDir`.
llvm::Expected<CompileResult> compile(const CompileJob &job,
                                      const DriverOptions &options,
                                      llvm::raw_ostream &out);

} // namespace flashopt::driver

#endif // FLASHOPT_DRIVER_BUNDLEDRIVER_H
