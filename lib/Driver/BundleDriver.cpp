//===- BundleDriver.cpp - specs to kernels and bundles --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Loading inputs, the emit stages and the bundle build of flashopt-gen, over
/// the named pipelines (buildCPUPipeline, buildGPUPipeline).
///
//===----------------------------------------------------------------------===//

#include "flashopt/Driver/BundleDriver.h"

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/StateEncodingInterface.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"
#include "flashopt/Spec/Spec.h"
#include "flashopt/Spec/SpecToDialect.h"
#include "flashopt/Spec/InputLimits.h"
#include "flashopt/abi/Files.h"
#include "flashopt/Target/PTX.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;
using namespace mlir::flashopt;
using namespace ::flashopt;
using namespace ::flashopt::driver;

char ReportedError::ID = 0;

namespace {

llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

std::string hex64(uint64_t v) {
  return llvm::utohexstr(v, /*LowerCase=*/true, /*Width=*/16);
}

OwningOpRef<ModuleOp> cloneModule(const CompileJob &job) {
  return OwningOpRef<ModuleOp>(cast<ModuleOp>(job.module.get()->clone()));
}

LogicalResult runPasses(ModuleOp module,
                        llvm::function_ref<void(OpPassManager &)> build) {
  PassManager pm(module->getContext());
  build(pm);
  return pm.run(module);
}

llvm::Error writeFile(const std::string &path, llvm::StringRef data) {
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

/// Expands the encodings of a copy of `job`.
llvm::Expected<OwningOpRef<ModuleOp>> expandEncodings(const CompileJob &job) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  if (failed(runPasses(*module, [](OpPassManager &pm) {
        pm.addPass(createFlashOptExpandEncodings());
      })))
    return makeError("expanding " + job.getName() + " failed");
  return module;
}

/// A copy of `job` through flashopt-cpu-pipeline for `cpu`.
llvm::Expected<OwningOpRef<ModuleOp>>
lowerToHostLLVM(const CompileJob &job, const target::HostCPU &cpu,
                llvm::StringRef failureMessage) {
  OwningOpRef<ModuleOp> module = cloneModule(job);
  bool fma = cpuHasFMA(cpu);
  int64_t interleave = cpuInterleave(cpu);
  int64_t x86Bits = cpuX86VectorBits(cpu);
  if (failed(runPasses(*module, [fma, interleave, x86Bits](OpPassManager &pm) {
        buildCPUPipeline(pm, fma, interleave, x86Bits);
      })))
    return makeError(failureMessage);
  return module;
}

std::string lowerToLLVMFailed(const CompileJob &job) {
  return ("lowering " + job.getName() + " to LLVM failed").str();
}

} // namespace

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
  if (kind != abi::KernelKind::Step)
    out.optimizer->setAttr("flashopt.kernel_kind",
                           StringAttr::get(out.module->getContext(),
                                           abi::kernel_kind_name(kind)));
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
  if (failed(runPasses(*module,
                       [&](OpPassManager &pm) { buildGPUPipeline(pm, gpu); })))
    return makeError("lowering " + job.getName() + " for " + chip + " failed");
  return target::serializeToPTX(*module, options.tritonCompat);
}

//===----------------------------------------------------------------------===//
// Bundles
//===----------------------------------------------------------------------===//

llvm::Expected<abi::Manifest> driver::describeBundle(const CompileJob &job,
                                                    KernelOp kernel) {
  abi::Manifest m;
  m.generator = std::string("flashopt-gen ") + abi::kFlashOptVersion;
  m.name = kernel.getSymName().str();
  m.spec = job.specPath;
  m.spec_hash = job.specHash;
  m.rule = job.rule;
  m.description = job.description;
  m.group_size = kernel.getGroupSize();
  OptimizerOp optimizer = job.optimizer;
  MasterAttr master = optimizer.getParam();
  m.param = *storageDType(master.getParamType());
  if (master.hasCorrection())
    m.correction = *storageDType(master.getCorrection());
  m.grad = *storageDType(optimizer.getGrad());
  if (auto a = optimizer->getAttrOfType<StringAttr>("flashopt.arithmetic"))
    m.arithmetic = a.getValue().str();
  m.numerics = getNumerics(optimizer) == Numerics::FlashOptim ? "flashoptim"
                                                              : "bounded";
  if (MasterAttr acc = optimizer.getAccumulateAttr()) {
    abi::AccumulatorSpec a;
    a.dtype = *storageDType(acc.getParamType());
    if (acc.hasCorrection())
      a.correction = *storageDType(acc.getCorrection());
    m.accumulator = a;
  }
  for (HyperOp h : getHypers(kernel)) {
    abi::HyperSpec mh;
    mh.name = h.getName().str();
    if (auto d = h.getDefaultValueAttr())
      mh.default_value = d.getValueAsDouble();
    m.hypers.push_back(mh);
  }
  for (StateOp s : getStates(optimizer)) {
    abi::StateSpec ms;
    ms.name = s.getName().str();
    s.getEncoding().describeInManifest(ms);
    if (auto e = s.getElidable())
      ms.elidable_if_zero = e->str();
    m.states.push_back(ms);
  }
  // The buffers, table layout and bytes follow from the ABI; the expanded
  // kernel must agree with it buffer for buffer.
  abi::complete_manifest(m);
  auto buffers = kernel.getBuffers();
  auto render = [](llvm::StringRef name, llvm::StringRef dtype, bool perGroup,
                   bool writable) {
    return (name + " (" + dtype + (perGroup ? ", per group" : ", per element") +
            (writable ? ", readwrite)" : ", read)"))
        .str();
  };
  for (size_t i = 0; i < std::max<size_t>(buffers.size(), m.buffers.size());
       ++i) {
    std::string have = "nothing", want = "nothing";
    if (i < buffers.size()) {
      auto b = cast<BufferAttr>(buffers[i]);
      have = render(b.getName(), storageTypeName(b.getElementType()),
                    b.getRate() == BufferRate::group,
                    b.getAccess() == BufferAccess::readwrite);
    }
    if (i < m.buffers.size()) {
      const abi::BufferSpec &e = m.buffers[i];
      want = render(e.name, abi::dtype_name(e.dtype), e.per == abi::Per::Group,
                    e.writable);
    }
    if (have != want)
      return makeError("internal error: buffer " + std::to_string(i) + " of " +
                       m.name + " is " + have + " in the kernel but " + want +
                       " in the kernel ABI");
  }
  return m;
}

llvm::Expected<BundleResult>
driver::buildBundle(const CompileJob &job,
                    const std::vector<std::string> &targets,
                    const DriverOptions &options) {
  std::string name = job.getName().str();
  auto kernelModule = expandEncodings(job);
  if (!kernelModule)
    return kernelModule.takeError();
  KernelOp kernel = *(*kernelModule)->getOps<KernelOp>().begin();
  auto described = describeBundle(job, kernel);
  if (!described)
    return described.takeError();
  abi::Manifest info = std::move(*described);

  const std::string &outputDir = options.outputDir;
  llvm::SmallString<256> finalDir(outputDir);
  llvm::sys::path::append(finalDir, name);
  llvm::SmallString<256> tmpDir(outputDir);
  llvm::sys::path::append(tmpDir, "." + name + ".tmp");
  if (std::error_code ec = llvm::sys::fs::create_directories(outputDir))
    return makeError("cannot create " + outputDir + ": " + ec.message());
  llvm::sys::fs::remove_directories(tmpDir);
  if (std::error_code ec = llvm::sys::fs::create_directories(tmpDir))
    return makeError("cannot create " + tmpDir + ": " + ec.message());
  llvm::scope_exit cleanup([&] { llvm::sys::fs::remove_directories(tmpDir); });

  // One job per kernel of the bundle (the step; with an accumulator also
  // accumulate, step_accumulated and step_fused): each kernel is its own
  // file with its own ABI description (the same: one table for all).
  std::vector<abi::KernelKind> kinds = kernelKinds(job);
  std::vector<CompileJob> kindJobs;
  for (abi::KernelKind kind : kinds)
    kindJobs.push_back(jobForKernel(job, kind));

  if (llvm::is_contained(targets, "cpu")) {
    for (const target::HostCPU &cpu : resolveHostCPUs(options)) {
     for (size_t ki = 0; ki < kinds.size(); ++ki) {
      std::string symbol = name + abi::kernel_kind_suffix(kinds[ki]);
      auto cpuModule = lowerToHostLLVM(
          kindJobs[ki], cpu, "lowering " + symbol + " to the CPU failed");
      if (!cpuModule)
        return cpuModule.takeError();
      auto obj = target::emitHostObject(**cpuModule, cpu);
      if (!obj)
        return obj.takeError();
      // The kernel's ABI description, a data symbol next to the kernel (its
      // own object: the kernel's code is untouched), which the runtime
      // checks against the manifest it is given.
      auto abiObj = target::emitDataObject(
          cpu, symbol + abi::kKernelAbiSymbolSuffix,
          abi::kernel_abi_description(info));
      if (!abiObj)
        return abiObj.takeError();
      std::string base = symbol + "." + cpu.name;
      llvm::SmallString<256> objPath(tmpDir), abiPath(tmpDir), soPath(tmpDir);
      llvm::sys::path::append(objPath, base + ".o");
      llvm::sys::path::append(abiPath, base + ".abi.o");
      llvm::sys::path::append(soPath, base + ".so");
      if (auto err = writeFile(objPath.str().str(), *obj))
        return std::move(err);
      if (auto err = writeFile(abiPath.str().str(), *abiObj))
        return std::move(err);
      if (auto err = target::linkSharedObject(objPath.str().str(),
                                              soPath.str().str(),
                                              {abiPath.str().str()}))
        return std::move(err);
      llvm::sys::fs::remove(objPath);
      llvm::sys::fs::remove(abiPath);
      abi::KernelEntry k;
      k.target = "cpu";
      k.cpu = cpu.name;
      k.features = cpu.requires_;
      k.file = base + ".so";
      k.symbol = symbol;
      k.kind = kinds[ki];
      info.kernels.push_back(k);
     }
    }
  }

  std::optional<std::string> ptxas;
  if (options.runPtxas)
    ptxas = target::findPtxas();
  for (const std::string &chip : targets) {
   if (chip == "cpu")
     continue;
   for (size_t ki = 0; ki < kinds.size(); ++ki) {
    std::string symbol = name + abi::kernel_kind_suffix(kinds[ki]);
    auto ptx = emitPTXText(kindJobs[ki], chip, options);
    if (!ptx)
      return ptx.takeError();
    // The kernel's ABI description as a module-scope global after the
    // header (the PTX and the cubin ptxas makes of it both carry it), which
    // the runtime checks against the manifest it is given, as for the CPU.
    {
      size_t header = ptx->find(".address_size");
      size_t eol = header == std::string::npos ? header : ptx->find('\n', header);
      if (eol == std::string::npos)
        return makeError("lowering " + name + " to " + chip +
                         ": the PTX has no .address_size line");
      ptx->insert(eol + 1, "\n" + abi::ptx_kernel_abi_global(
                                     symbol, abi::kernel_abi_description(info)));
    }
    std::string base = symbol + "." + chip;
    llvm::SmallString<256> ptxPath(tmpDir);
    llvm::sys::path::append(ptxPath, base + ".ptx");
    if (auto err = writeFile(ptxPath.str().str(), *ptx))
      return std::move(err);
    abi::KernelEntry k;
    k.target = chip;
    k.file = base + ".ptx";
    k.symbol = symbol;
    k.kind = kinds[ki];
    k.threads_per_block = abi::kGpuThreadsPerBlock;
    {
      // The kernel as flashopt-to-gpu sees it, so that the manifest states
      // the elements per thread the PTX really handles.
      OwningOpRef<ModuleOp> kindModule = cloneModule(kindJobs[ki]);
      if (failed(runPasses(*kindModule, [](OpPassManager &pm) {
            buildGPUPreLoweringPipeline(pm);
          })))
        return makeError("preparing " + kindJobs[ki].getName() +
                         " for the GPU failed");
      k.elements_per_thread = int(gpuElementsPerThread(
          *(*kindModule).getOps<KernelOp>().begin(),
          options.gpuBytesPerThread, gpuHeavyBudget(chip),
          gpuWideBudget(chip)));
    }
    if (ptxas) {
      auto assembled = target::runPtxas(*ptxas, *ptx, chip);
      if (!assembled)
        return assembled.takeError();
      llvm::SmallString<256> cubinPath(tmpDir);
      llvm::sys::path::append(cubinPath, base + ".cubin");
      if (auto err = writeFile(cubinPath.str().str(), assembled->cubin))
        return std::move(err);
      k.cubin = base + ".cubin";
      k.registers = int(assembled->registers);
      k.spill_stores = int(assembled->spillStores);
      k.spill_loads = int(assembled->spillLoads);
    }
    info.kernels.push_back(k);
   }
  }

  llvm::SmallString<256> manifestPath(tmpDir);
  llvm::sys::path::append(manifestPath, "manifest.json");
  if (auto err = writeFile(manifestPath.str().str(), abi::write_manifest(info)))
    return std::move(err);
  llvm::sys::fs::remove_directories(finalDir);
  if (std::error_code ec = llvm::sys::fs::rename(tmpDir, finalDir))
    return makeError("cannot move the bundle into " + finalDir + ": " +
                     ec.message());
  cleanup.release();
  return BundleResult{finalDir.str().str(), std::move(info)};
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
      llvm::sys::path::append(path, job.getName() +
                                          abi::kernel_kind_suffix(options.kernel) +
                                          "." + cpu.name + ".o");
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
    auto ptx = emitPTXText(job, chip, options);
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
