//===- BundleDriver.cpp - specs to kernels and bundles --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Loading inputs and the emit stages of flashopt-gen, over the named
/// pipelines (buildCPUPipeline, buildGPUPipeline); the bundle build is in
/// Bundles.cpp.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Driver/BundleDriver.h"

#include "DriverSupport.h"

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"
#include "flashopt/Spec/InputLimits.h"
#include "flashopt/Spec/Spec.h"
#include "flashopt/Spec/SpecToDialect.h"
#include "flashopt/Target/PTX.h"
#include "flashopt/abi/Files.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;
using namespace mlir::flashopt;
using namespace ::flashopt;
using namespace ::flashopt::driver;
using namespace ::flashopt::driver::detail;

char ReportedError::ID = 0;

namespace {

std::string hex64(uint64_t v) {
  return llvm::utohexstr(v, /*LowerCase=*/true, /*Width=*/16);
}

/// Whether a CPU flavour has a hardware FMA (then flashopt-exact-int-division
/// runs for it; see flashopt-cpu-pipeline{fma}).
bool cpuHasFMA(const target::HostCPU &cpu) {
  return llvm::is_contained(cpu.requires_, "fma");
}

/// Full groups per loop iteration for a CPU flavour (flashopt-to-cpu
/// {interleave}): four independent groups side by side keep an out-of-order
/// core busy through each group's long dependency chain (decode, step,
/// group absmax, quantize). Measured in docs/PERFORMANCE.md: +17-32 % on
/// x86-64-v3/v4 for AdamW, SGD and Lion; the SSE2 baseline (16 xmm
/// registers, calls for FMA) is slower with it, so it keeps one group.
int64_t cpuInterleave(const target::HostCPU &cpu) {
  return llvm::is_contained(cpu.requires_, "avx2") ? 4 : 1;
}

/// The x86 vector width of a CPU flavour for flashopt-convert-to-llvm
/// {x86-vector-bits} (512 with AVX-512, 256 with AVX2, 128 for the x86-64
/// baseline, 0 for anything else: the guarded conversions stay generic).
int64_t cpuX86VectorBits(const target::HostCPU &cpu) {
  if (llvm::is_contained(cpu.requires_, "avx512f"))
    return 512;
  if (llvm::is_contained(cpu.requires_, "avx2"))
    return 256;
  return cpu.name == "x86-64" ? 128 : 0;
}

/// The largest dialect file flashopt-gen reads (rule files are a few KiB).
constexpr uint64_t kMaxDialectInputBytes = uint64_t(64) << 20;

/// Loads an optimizer dialect file (each flashopt.optimizer becomes a job).
llvm::Expected<std::vector<CompileJob>>
loadDialectInput(MLIRContext &ctx, llvm::StringRef path,
                 llvm::raw_ostream &diagnostics) {
  // A regular file of bounded size (a FIFO or /dev/zero is refused).
  std::string text, reason;
  if (abi::read_regular_file(path.str(), kMaxDialectInputBytes, text, reason) !=
      abi::FileError::None)
    return makeError(path + ": cannot read: " + reason);
  auto file = llvm::MemoryBuffer::getMemBufferCopy(text, path);
  uint64_t hash = spec::fnv1a64(file->getBuffer());
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx, diagnostics);
  if (std::optional<spec::NestingViolation> deep =
          spec::findExcessiveNesting(text)) {
    emitError(FileLineColLoc::get(&ctx, path, unsigned(deep->line),
                                  unsigned(deep->column)))
        << deep->message;
    return llvm::make_error<ReportedError>();
  }
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &ctx);
  if (!module)
    return llvm::make_error<ReportedError>();
  auto optimizers = llvm::to_vector(module->getOps<OptimizerOp>());
  if (optimizers.empty())
    return makeError(path + ": no flashopt.optimizer found");
  std::vector<CompileJob> jobs;
  for (OptimizerOp op : optimizers) {
    CompileJob job;
    job.module = ModuleOp::create(UnknownLoc::get(&ctx));
    job.optimizer = cast<OptimizerOp>(op->clone());
    job.module->push_back(job.optimizer);
    job.specPath = path.str();
    job.specHash = "fnv1a64:" + hex64(hash);
    job.rule = ("file:" + llvm::sys::path::filename(path)).str();
    job.targets = {"cpu"};
    jobs.push_back(std::move(job));
  }
  return jobs;
}

/// Loads a spec applied to its rule.
llvm::Expected<std::vector<CompileJob>>
loadSpecInput(MLIRContext &ctx, llvm::StringRef path,
              llvm::raw_ostream &diagnostics) {
  auto loaded = spec::loadSpecAsOptimizer(ctx, path.str(), diagnostics);
  if (!loaded)
    return llvm::make_error<ReportedError>();
  CompileJob job;
  job.module = std::move(loaded->module);
  job.optimizer = *job.module->getOps<OptimizerOp>().begin();
  job.specPath = path.str();
  job.specHash = loaded->specHash;
  job.rule = loaded->rule;
  job.description = loaded->description;
  job.targets = loaded->targets;
  std::vector<CompileJob> jobs;
  jobs.push_back(std::move(job));
  return jobs;
}

std::string lowerToLLVMFailed(const CompileJob &job) {
  return ("lowering " + job.getName() + " to LLVM failed").str();
}

} // namespace

//===----------------------------------------------------------------------===//
// Shared with Bundles.cpp (DriverSupport.h)
//===----------------------------------------------------------------------===//

llvm::Error driver::detail::makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

KernelKind driver::detail::dialectKernelKind(abi::KernelKind kind) {
  std::optional<KernelKind> k =
      symbolizeKernelKind(abi::kernel_kind_name(kind));
  assert(k && "the dialect's kernel kinds are the kernel ABI's");
  return *k;
}

OwningOpRef<ModuleOp> driver::detail::cloneModule(const CompileJob &job) {
  return OwningOpRef<ModuleOp>(cast<ModuleOp>(job.module.get()->clone()));
}

LogicalResult
driver::detail::runPasses(ModuleOp module,
                          llvm::function_ref<void(OpPassManager &)> build) {
  PassManager pm(module->getContext());
  build(pm);
  return pm.run(module);
}

llvm::Error driver::detail::writeFile(const std::string &path,
                                      llvm::StringRef data) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec)
    return llvm::createStringError(ec, "cannot write " + path + ": " +
                                           ec.message());
  os << data;
  os.close();
  if (os.has_error())
    return llvm::createStringError(os.error(), "cannot write " + path);
  return llvm::Error::success();
}

llvm::Expected<OwningOpRef<ModuleOp>>
driver::detail::expandEncodings(const CompileJob &job) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  FlashOptExpandEncodingsOptions expand;
  expand.kernelKind = dialectKernelKind(job.kernelKind);
  if (failed(runPasses(*module, [&](OpPassManager &pm) {
        pm.addPass(createFlashOptExpandEncodings(expand));
      })))
    return makeError("expanding " + job.getName() + " failed");
  return module;
}

llvm::Expected<OwningOpRef<ModuleOp>>
driver::detail::lowerToHostLLVM(const CompileJob &job,
                                const target::HostCPU &cpu,
                                llvm::StringRef failureMessage) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  bool fma = cpuHasFMA(cpu);
  int64_t interleave = cpuInterleave(cpu);
  int64_t x86Bits = cpuX86VectorBits(cpu);
  KernelKind kind = dialectKernelKind(job.kernelKind);
  if (failed(runPasses(*module, [&](OpPassManager &pm) {
        buildCPUPipeline(pm, fma, interleave, x86Bits, kind);
      })))
    return makeError(failureMessage);
  return module;
}

//===----------------------------------------------------------------------===//
// Inputs and targets
//===----------------------------------------------------------------------===//

llvm::Expected<std::vector<CompileJob>>
driver::loadInput(MLIRContext &ctx, llvm::StringRef path,
                  llvm::raw_ostream &diagnostics) {
  return path.ends_with(".mlir") ? loadDialectInput(ctx, path, diagnostics)
                                 : loadSpecInput(ctx, path, diagnostics);
}

llvm::Error driver::verifyJob(const CompileJob &job) {
  if (failed(verify(job.module.get())))
    return llvm::make_error<ReportedError>();
  return llvm::Error::success();
}

llvm::Expected<std::vector<std::string>>
driver::resolveTargets(const CompileJob &job, const DriverOptions &options) {
  std::vector<std::string> targets =
      options.targets ? *options.targets : job.targets;
  for (const std::string &t : targets)
    if (t != "cpu" && !target::isSupportedChip(t))
      return makeError("unknown target '" + t +
                       "' (supported: cpu, sm_80, sm_90, sm_100)");
  return targets;
}

std::vector<target::HostCPU>
driver::resolveHostCPUs(const DriverOptions &options) {
  return options.cpus ? *options.cpus : target::defaultHostCPUs();
}

//===----------------------------------------------------------------------===//
// Emit stages
//===----------------------------------------------------------------------===//

std::vector<abi::KernelKind> driver::kernelKinds(const CompileJob &job) {
  if (!OptimizerOp(job.optimizer).getAccumulateAttr())
    return {abi::KernelKind::Step};
  return {std::begin(abi::kKernelKinds), std::end(abi::kKernelKinds)};
}

CompileJob driver::jobForKernel(const CompileJob &job, abi::KernelKind kind) {
  CompileJob out;
  out.module = cloneModule(job);
  out.optimizer = *out.module->getOps<OptimizerOp>().begin();
  out.kernelKind = kind;
  out.specPath = job.specPath;
  out.specHash = job.specHash;
  out.rule = job.rule;
  out.description = job.description;
  out.targets = job.targets;
  return out;
}

std::string driver::emitOptimizerText(const CompileJob &job) {
  std::string text;
  llvm::raw_string_ostream os(text);
  job.module.get().print(os);
  return text;
}

llvm::Expected<std::string> driver::emitKernelIRText(const CompileJob &job) {
  auto module = expandEncodings(job);
  if (!module)
    return module.takeError();
  std::string text;
  llvm::raw_string_ostream os(text);
  (*module)->print(os);
  return text;
}

llvm::Expected<std::string>
driver::emitHostLLVMIRText(const CompileJob &job, const target::HostCPU &cpu) {
  auto module = lowerToHostLLVM(job, cpu, lowerToLLVMFailed(job));
  if (!module)
    return module.takeError();
  return target::emitHostLLVMIR(**module, cpu, /*optimize=*/true);
}

llvm::Expected<std::string>
driver::emitHostObjectFile(const CompileJob &job, const target::HostCPU &cpu) {
  auto module = lowerToHostLLVM(job, cpu, lowerToLLVMFailed(job));
  if (!module)
    return module.takeError();
  return target::emitHostObject(**module, cpu);
}

std::vector<driver::DriverOptions>
driver::gpuShapeLadder(const DriverOptions &options) {
  std::vector<DriverOptions> ladder{options};
  if (options.gpuFullWarpPath && options.gpuSharedBases) {
    DriverOptions o = ladder.back();
    o.gpuSharedBases = false;
    ladder.push_back(o);
  }
  if (options.gpuFullWarpPath) {
    DriverOptions o = ladder.back();
    o.gpuFullWarpPath = false;
    ladder.push_back(o);
  }
  return ladder;
}

llvm::Expected<std::string> driver::emitPTXText(const CompileJob &job,
                                                llvm::StringRef chip,
                                                const DriverOptions &options) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  GPUPipelineOptions gpu;
  gpu.chip = chip.str();
  gpu.ftz = options.ftz;
  gpu.tritonCompat = options.tritonCompat;
  gpu.bytesPerThread = options.gpuBytesPerThread;
  gpu.maxRegisters = options.gpuMaxRegisters;
  gpu.fullWarpPath = options.gpuFullWarpPath;
  gpu.sharedBases = options.gpuSharedBases;
  gpu.kernelKind = dialectKernelKind(job.kernelKind);
  if (failed(runPasses(*module,
                       [&](OpPassManager &pm) { buildGPUPipeline(pm, gpu); })))
    return makeError("lowering " + job.getName() + " for " + chip + " failed");
  return target::serializeToPTX(*module, options.tritonCompat);
}

//===----------------------------------------------------------------------===//
// One job to one stage
//===----------------------------------------------------------------------===//

llvm::Expected<CompileResult> driver::compile(const CompileJob &bundleJob,
                                              const DriverOptions &options,
                                              llvm::raw_ostream &out) {
  // The single-kernel stages make the kernel options.kernel asks for.
  std::optional<CompileJob> kindJob;
  if (options.kernel != abi::KernelKind::Step &&
      options.emit != EmitStage::Bundle && options.emit != EmitStage::MLIR)
    kindJob = jobForKernel(bundleJob, options.kernel);
  const CompileJob &job = kindJob ? *kindJob : bundleJob;
  auto targets = resolveTargets(job, options);
  if (!targets)
    return targets.takeError();
  CompileResult result;
  switch (options.emit) {
  case EmitStage::MLIR:
    out << emitOptimizerText(job);
    break;
  case EmitStage::KernelIR: {
    auto text = emitKernelIRText(job);
    if (!text)
      return text.takeError();
    out << *text;
    break;
  }
  case EmitStage::LLVM: {
    // The first flavour; an empty list (--cpu=) means LLVM's default CPU.
    std::vector<target::HostCPU> cpus = resolveHostCPUs(options);
    auto ir = emitHostLLVMIRText(job, cpus.empty() ? target::HostCPU{}
                                                   : cpus.front());
    if (!ir)
      return ir.takeError();
    out << *ir;
    break;
  }
  case EmitStage::Obj:
    for (const target::HostCPU &cpu : resolveHostCPUs(options)) {
      auto obj = emitHostObjectFile(job, cpu);
      if (!obj)
        return obj.takeError();
      if (std::error_code ec =
              llvm::sys::fs::create_directories(options.outputDir))
        return makeError("cannot create " + options.outputDir + ": " +
                         ec.message());
      llvm::SmallString<256> path(options.outputDir);
      llvm::sys::path::append(
          path, job.getName() + abi::kernel_kind_suffix(options.kernel) + "." +
                    cpu.name + ".o");
      if (auto err = writeFile(path.str().str(), *obj))
        return std::move(err);
    }
    break;
  case EmitStage::PTX: {
    std::string chip = "sm_90";
    for (const std::string &t : *targets)
      if (t != "cpu") {
        chip = t;
        break;
      }
    // As a bundle build chooses (Bundles.cpp, buildGpuKernel): down the
    // shape ladder while ptxas spills (without ptxas, the first shape).
    std::optional<std::string> ptxas;
    if (options.runPtxas)
      ptxas = target::findPtxas();
    auto ptx = pickGpuShape<std::string>(
        options, ptxas.has_value(),
        [&](const DriverOptions &shape)
            -> llvm::Expected<std::pair<std::string, int>> {
          auto text = emitPTXText(job, chip, shape);
          if (!text)
            return text.takeError();
          int spills = 0;
          if (ptxas) {
            auto a = target::runPtxas(*ptxas, *text, chip);
            if (!a)
              return a.takeError();
            spills = std::max(0, a->spillStores) + std::max(0, a->spillLoads);
          }
          return std::make_pair(std::move(*text), spills);
        });
    if (!ptx)
      return ptx.takeError();
    out << *ptx;
    break;
  }
  case EmitStage::Bundle: {
    auto bundle = buildBundle(job, *targets, options);
    if (!bundle)
      return bundle.takeError();
    result.bundle = std::move(*bundle);
    break;
  }
  }
  return result;
}
