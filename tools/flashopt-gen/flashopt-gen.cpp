//===- flashopt-gen.cpp - Spec files → optimizer kernels --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-gen` turns optimizer specs (JSON, docs/SPEC.md) or optimizer
/// dialect files into kernels: a bundle directory per optimizer with
/// manifest.json and the compiled artifacts, or any intermediate stage on
/// stdout (--emit=mlir|kernel-ir|llvm). Every spec is checked before anything
/// is written; a bad spec gives a located error and exit status 1.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"
#include "flashopt/InitAll.h"
#include "flashopt/Rules/BuiltinRules.h"
#include "flashopt/Spec/Spec.h"
#include "flashopt/Spec/SpecToDialect.h"
#include "flashopt/Target/HostObject.h"
#include "flashopt/Target/Manifest.h"
#include "flashopt/Target/PTX.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::flashopt;
namespace cl = llvm::cl;
namespace target = ::flashopt::target;
using ::flashopt::BytesPerParam;
using ::flashopt::ManifestHyper;
using ::flashopt::ManifestInfo;
using ::flashopt::ManifestKernel;
using ::flashopt::ManifestState;
using ::flashopt::computeBytesPerParam;
using ::flashopt::renderManifest;

namespace {

enum class Emit { MLIR, KernelIR, LLVM, Obj, PTX, Bundle };

cl::OptionCategory genCategory("flashopt-gen options");

cl::list<std::string> inputFiles(
    cl::Positional, cl::desc("<spec.json | optimizer.mlir> ..."),
    cl::cat(genCategory));

cl::opt<std::string> outputDir(
    "o", cl::desc("Directory for bundles and objects (default: current "
                  "directory). Text emits (mlir, kernel-ir, llvm) go to "
                  "stdout."),
    cl::value_desc("dir"), cl::init("."), cl::cat(genCategory));

cl::opt<std::string> targetList(
    "target",
    cl::desc("Comma-separated targets to build: cpu, sm_80, sm_90, sm_100. "
             "Default: the targets the spec lists."),
    cl::value_desc("t1,t2"), cl::cat(genCategory));

cl::opt<std::string> cpuList(
    "cpu",
    cl::desc("Comma-separated CPU flavours for the cpu target (default: "
             "x86-64-v3,x86-64 on x86-64 hosts). The runtime picks the first "
             "one the machine supports."),
    cl::value_desc("cpu1,cpu2"), cl::cat(genCategory));

cl::opt<Emit> emitKind(
    "emit", cl::desc("What to produce:"), cl::init(Emit::Bundle),
    cl::values(
        clEnumValN(Emit::MLIR, "mlir",
                   "the configured flashopt.optimizer (round-trips through "
                   "flashopt-opt)"),
        clEnumValN(Emit::KernelIR, "kernel-ir",
                   "target-neutral kernel IR (after "
                   "flashopt-expand-encodings)"),
        clEnumValN(Emit::LLVM, "llvm",
                   "optimized LLVM IR of the CPU kernel (first --cpu)"),
        clEnumValN(Emit::Obj, "obj", "CPU object files <name>.<cpu>.o in -o"),
        clEnumValN(Emit::PTX, "ptx",
                   "PTX text of the GPU kernel (first GPU target, default "
                   "sm_90)"),
        clEnumValN(Emit::Bundle, "bundle",
                   "a bundle directory <dir>/<name>/ with manifest.json and "
                   "the artifacts (default)")),
    cl::cat(genCategory));

cl::opt<bool> ftzOpt(
    "ftz", cl::desc("GPU: flush f32 subnormals to zero (breaks the numerics "
                    "contract; off by default)"),
    cl::cat(genCategory));

cl::opt<bool> tritonCompatOpt(
    "triton-compat",
    cl::desc("GPU: approximate division/sqrt and FMA contraction like "
             "FlashOptim's Triton kernels (breaks CPU/GPU bit identity; off "
             "by default)"),
    cl::cat(genCategory));

cl::opt<int> gpuBytesPerThread(
    "gpu-bytes-per-thread",
    cl::desc("GPU: bytes of the widest stream per thread access (16 or 8; "
             "0 = chosen per kernel)"),
    cl::init(0), cl::cat(genCategory), cl::Hidden);

cl::opt<bool> noPtxas(
    "no-ptxas",
    cl::desc("Do not assemble cubins with ptxas even when it is installed"),
    cl::cat(genCategory));

cl::opt<bool> listRules("list-rules",
                        cl::desc("Print the built-in rules and exit"),
                        cl::cat(genCategory));

const char *kOverview = R"(flashopt-gen: compile optimizer specs into fused kernels

  flashopt-gen specs/adamw_bf16_m24.json -o build/kernels
      writes build/kernels/adamw_bf16_m24/{manifest.json, *.so}
  flashopt-gen specs/adamw_bf16_m24.json --emit=mlir
      prints the optimizer in the flashopt dialect (spec applied to the rule)
  flashopt-gen specs/adamw_bf16_m24.json --emit=kernel-ir
      prints decode -> rule -> encode, before any target lowering
  flashopt-gen my_rule.mlir --emit=llvm --cpu=x86-64-v3
      compiles a hand-written flashopt.optimizer and prints the LLVM IR

A spec names a built-in rule (sgd, sgdw, adam, adamw, lion) or a rule file
of its own, the parameter/master-weight encoding, the gradient dtype, the
state encodings and hyper-parameter defaults; docs/SPEC.md has the schema.
flashopt-opt --flashopt-cpu-pipeline reproduces the CPU lowering exactly.
)";

/// One optimizer to compile, with where it came from.
struct Job {
  OwningOpRef<ModuleOp> module;
  OptimizerOp optimizer;
  std::string specPath;
  std::string specHash;
  std::string rule;
  std::string description;
  std::vector<std::string> targets;
};

std::vector<std::string> splitList(llvm::StringRef list) {
  llvm::SmallVector<llvm::StringRef> parts;
  list.split(parts, ',', -1, /*KeepEmpty=*/false);
  std::vector<std::string> out;
  for (llvm::StringRef p : parts)
    out.push_back(p.trim().str());
  return out;
}

std::string hex64(uint64_t v) {
  return llvm::utohexstr(v, /*LowerCase=*/true, /*Width=*/16);
}

/// Loads an optimizer dialect file (each flashopt.optimizer becomes a job).
LogicalResult loadMLIRInput(MLIRContext &ctx, llvm::StringRef path,
                            std::vector<Job> &jobs) {
  std::string error;
  auto file = openInputFile(path, &error);
  if (!file) {
    llvm::WithColor::error(llvm::errs(), "flashopt-gen") << error << "\n";
    return failure();
  }
  uint64_t hash = ::flashopt::spec::fnv1a64(file->getBuffer());
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &ctx);
  if (!module)
    return failure();
  auto optimizers = llvm::to_vector(module->getOps<OptimizerOp>());
  if (optimizers.empty()) {
    llvm::WithColor::error(llvm::errs(), "flashopt-gen")
        << path << ": no flashopt.optimizer found\n";
    return failure();
  }
  for (OptimizerOp op : optimizers) {
    Job job;
    job.module = ModuleOp::create(UnknownLoc::get(&ctx));
    job.optimizer = cast<OptimizerOp>(op->clone());
    job.module->push_back(job.optimizer);
    job.specPath = path.str();
    job.specHash = "fnv1a64:" + hex64(hash);
    job.rule = ("file:" + llvm::sys::path::filename(path)).str();
    job.targets = {"cpu"};
    jobs.push_back(std::move(job));
  }
  return success();
}

/// Describes the optimizer and its expanded kernel for the manifest.
ManifestInfo describe(Job &job, KernelOp kernel) {
  ManifestInfo info;
  info.name = kernel.getSymName().str();
  info.specPath = job.specPath;
  info.specHash = job.specHash;
  info.rule = job.rule;
  info.description = job.description;
  info.groupSize = kernel.getGroupSize();
  MasterAttr master = job.optimizer.getParam();
  info.paramDtype = storageTypeName(master.getParamType());
  info.correction =
      master.hasCorrection() ? storageTypeName(master.getCorrection()) : "none";
  info.gradDtype = storageTypeName(job.optimizer.getGrad());
  for (HyperOp h : getHypers(kernel)) {
    ManifestHyper mh;
    mh.name = h.getName().str();
    if (auto d = h.getDefaultValueAttr())
      mh.defaultValue = d.getValueAsDouble();
    info.hypers.push_back(mh);
  }
  for (StateOp s : getStates(job.optimizer)) {
    ManifestState ms;
    ms.name = s.getName().str();
    s.getEncoding().describeInManifest(ms);
    if (auto e = s.getElidable())
      ms.elidableIfZero = e->str();
    info.states.push_back(ms);
  }
  for (Attribute a : kernel.getBuffers()) {
    auto b = cast<BufferAttr>(a);
    info.buffers.push_back({b.getName().str(),
                            storageTypeName(b.getElementType()),
                            b.getRate() == BufferRate::group,
                            b.getAccess() == BufferAccess::readwrite});
  }
  return info;
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

int fail(const llvm::Twine &message) {
  llvm::WithColor::error(llvm::errs(), "flashopt-gen") << message << "\n";
  return 1;
}

/// Lowers `job` for `chip` and returns the PTX.
llvm::Expected<std::string> compilePTX(Job &job, llvm::StringRef chip) {
  OwningOpRef<ModuleOp> gpuModule(cast<ModuleOp>(job.module->clone()));
  GPUPipelineOptions options;
  options.chip = chip.str();
  options.ftz = ftzOpt;
  options.tritonCompat = tritonCompatOpt;
  options.bytesPerThread = gpuBytesPerThread;
  if (failed(runPasses(*gpuModule, [&](OpPassManager &pm) {
        buildGPUPipeline(pm, options);
      })))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "lowering " + job.optimizer.getSymName() +
                                       " for " + chip + " failed");
  return target::serializeToPTX(*gpuModule, tritonCompatOpt);
}

/// Whether a CPU flavour has a hardware FMA (then flashopt-exact-int-division
/// runs for it; see flashopt-cpu-pipeline{fma}).
bool cpuHasFMA(const target::HostCPU &cpu) {
  return llvm::is_contained(cpu.requires_, "fma");
}

/// Builds the bundle of `job` in a temporary directory next to its final
/// place, then renames it into place: a failure leaves no partial bundle.
int buildBundle(Job &job, const std::vector<target::HostCPU> &cpus,
                const std::vector<std::string> &targets) {
  std::string name = job.optimizer.getSymName().str();
  OwningOpRef<ModuleOp> kernelModule(cast<ModuleOp>(job.module->clone()));
  if (failed(runPasses(*kernelModule, [](OpPassManager &pm) {
        pm.addPass(createFlashOptExpandEncodings());
      })))
    return fail("expanding " + name + " failed");
  KernelOp kernel = *kernelModule->getOps<KernelOp>().begin();
  ManifestInfo info = describe(job, kernel);

  llvm::SmallString<256> finalDir(outputDir);
  llvm::sys::path::append(finalDir, name);
  llvm::SmallString<256> tmpDir(outputDir);
  llvm::sys::path::append(tmpDir, "." + name + ".tmp");
  if (std::error_code ec = llvm::sys::fs::create_directories(outputDir))
    return fail("cannot create " + outputDir + ": " + ec.message());
  llvm::sys::fs::remove_directories(tmpDir);
  if (std::error_code ec = llvm::sys::fs::create_directories(tmpDir))
    return fail("cannot create " + tmpDir + ": " + ec.message());
  llvm::scope_exit cleanup(
      [&] { llvm::sys::fs::remove_directories(tmpDir); });

  bool wantCPU = llvm::is_contained(targets, "cpu");
  if (wantCPU) {
    for (const target::HostCPU &cpu : cpus) {
      OwningOpRef<ModuleOp> cpuModule(cast<ModuleOp>(kernelModule->clone()));
      bool fma = cpuHasFMA(cpu);
      if (failed(runPasses(*cpuModule, [fma](OpPassManager &pm) {
            // flashopt-cpu-pipeline{fma=...} (expand already ran).
            if (fma)
              pm.addPass(createFlashOptExactIntDivision());
            pm.addPass(createFlashOptToCPU());
          })))
        return fail("lowering " + name + " to the CPU failed");
      if (failed(runPasses(*cpuModule, [](OpPassManager &pm) {
            buildCPULLVMPipeline(pm);
          })))
        return fail("lowering " + name + " to LLVM failed");
      auto obj = target::emitHostObject(*cpuModule, cpu);
      if (!obj)
        return fail(llvm::toString(obj.takeError()));
      std::string base = name + "." + cpu.name;
      llvm::SmallString<256> objPath(tmpDir), soPath(tmpDir);
      llvm::sys::path::append(objPath, base + ".o");
      llvm::sys::path::append(soPath, base + ".so");
      if (auto err = writeFile(objPath.str().str(), *obj))
        return fail(llvm::toString(std::move(err)));
      if (auto err = target::linkSharedObject(objPath.str().str(),
                                              soPath.str().str()))
        return fail(llvm::toString(std::move(err)));
      llvm::sys::fs::remove(objPath);
      ManifestKernel k;
      k.target = "cpu";
      k.cpu = cpu.name;
      k.features = cpu.requires_;
      k.file = base + ".so";
      k.symbol = name;
      info.kernels.push_back(k);
    }
  }

  std::optional<std::string> ptxas;
  if (!noPtxas)
    ptxas = target::findPtxas();
  for (const std::string &chip : targets) {
    if (chip == "cpu")
      continue;
    auto ptx = compilePTX(job, chip);
    if (!ptx)
      return fail(llvm::toString(ptx.takeError()));
    std::string base = name + "." + chip;
    llvm::SmallString<256> ptxPath(tmpDir);
    llvm::sys::path::append(ptxPath, base + ".ptx");
    if (auto err = writeFile(ptxPath.str().str(), *ptx))
      return fail(llvm::toString(std::move(err)));
    ManifestKernel k;
    k.target = chip;
    k.file = base + ".ptx";
    k.symbol = name;
    k.threadsPerBlock = 256;
    k.elementsPerThread = gpuElementsPerThread(kernel, gpuBytesPerThread);
    if (ptxas) {
      auto assembled = target::runPtxas(*ptxas, *ptx, chip);
      if (!assembled)
        return fail(llvm::toString(assembled.takeError()));
      llvm::SmallString<256> cubinPath(tmpDir);
      llvm::sys::path::append(cubinPath, base + ".cubin");
      if (auto err = writeFile(cubinPath.str().str(), assembled->cubin))
        return fail(llvm::toString(std::move(err)));
      k.cubin = base + ".cubin";
      k.registers = assembled->registers;
      k.spillStores = assembled->spillStores;
      k.spillLoads = assembled->spillLoads;
    }
    info.kernels.push_back(k);
  }

  llvm::SmallString<256> manifestPath(tmpDir);
  llvm::sys::path::append(manifestPath, "manifest.json");
  if (auto err = writeFile(manifestPath.str().str(), renderManifest(info)))
    return fail(llvm::toString(std::move(err)));
  llvm::sys::fs::remove_directories(finalDir);
  if (std::error_code ec = llvm::sys::fs::rename(tmpDir, finalDir))
    return fail("cannot move the bundle into " + finalDir + ": " +
                ec.message());
  cleanup.release();
  llvm::outs() << "flashopt-gen: wrote " << finalDir << " ("
               << info.kernels.size() << " artifact"
               << (info.kernels.size() == 1 ? "" : "s") << ", "
               << llvm::format("%.4g", computeBytesPerParam(info).total())
               << " B/param)\n";
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM y(argc, argv);
  cl::HideUnrelatedOptions(genCategory);
  cl::ParseCommandLineOptions(argc, argv, kOverview);

  if (listRules) {
    for (std::string_view r : ::flashopt::listBuiltinRules())
      llvm::outs() << r << "\n";
    return 0;
  }
  if (inputFiles.empty())
    return fail("no input files (try --help)");

  DialectRegistry registry;
  ::flashopt::registerAllDialects(registry);
  MLIRContext ctx(registry);
  ctx.loadAllAvailableDialects();
  ctx.printOpOnDiagnostic(false);

  // Parse and check every input before writing anything.
  std::vector<Job> jobs;
  bool ok = true;
  for (const std::string &path : inputFiles) {
    if (llvm::StringRef(path).ends_with(".mlir")) {
      ok &= succeeded(loadMLIRInput(ctx, path, jobs));
      continue;
    }
    auto loaded = ::flashopt::spec::loadSpecAsOptimizer(ctx, path, llvm::errs());
    if (!loaded) {
      ok = false;
      continue;
    }
    Job job;
    job.module = std::move(loaded->module);
    job.optimizer = *job.module->getOps<OptimizerOp>().begin();
    job.specPath = path;
    job.specHash = loaded->specHash;
    job.rule = loaded->rule;
    job.description = loaded->description;
    job.targets = loaded->targets;
    jobs.push_back(std::move(job));
  }
  for (Job &job : jobs)
    if (failed(verify(*job.module)))
      ok = false;
  if (!ok)
    return 1;

  std::vector<target::HostCPU> cpus;
  if (cpuList.getNumOccurrences()) {
    for (const std::string &name : splitList(cpuList)) {
      auto cpu = target::lookupHostCPU(name);
      if (!cpu)
        return fail(llvm::toString(cpu.takeError()));
      cpus.push_back(*cpu);
    }
  } else {
    cpus = target::defaultHostCPUs();
  }

  for (Job &job : jobs) {
    std::vector<std::string> chosen =
        targetList.getNumOccurrences() ? splitList(targetList) : job.targets;
    for (const std::string &t : chosen)
      if (t != "cpu" && !target::isSupportedChip(t))
        return fail("unknown target '" + t +
                    "' (supported: cpu, sm_80, sm_90, sm_100)");
    std::string name = job.optimizer.getSymName().str();
    switch (emitKind) {
    case Emit::MLIR:
      job.module->print(llvm::outs());
      break;
    case Emit::KernelIR: {
      if (failed(runPasses(*job.module, [](OpPassManager &pm) {
            pm.addPass(createFlashOptExpandEncodings());
          })))
        return fail("expanding " + name + " failed");
      job.module->print(llvm::outs());
      break;
    }
    case Emit::LLVM:
    case Emit::Obj: {
      std::vector<target::HostCPU> use = cpus;
      if (emitKind == Emit::LLVM)
        use.resize(1);
      for (const target::HostCPU &cpu : use) {
        OwningOpRef<ModuleOp> cpuModule(cast<ModuleOp>(job.module->clone()));
        bool fma = cpuHasFMA(cpu);
        if (failed(runPasses(*cpuModule, [fma](OpPassManager &pm) {
              buildCPUPipeline(pm, fma);
            })))
          return fail("lowering " + name + " to LLVM failed");
        if (emitKind == Emit::LLVM) {
          auto ir = target::emitHostLLVMIR(*cpuModule, cpu, /*optimize=*/true);
          if (!ir)
            return fail(llvm::toString(ir.takeError()));
          llvm::outs() << *ir;
          continue;
        }
        auto obj = target::emitHostObject(*cpuModule, cpu);
        if (!obj)
          return fail(llvm::toString(obj.takeError()));
        if (std::error_code ec = llvm::sys::fs::create_directories(outputDir))
          return fail("cannot create " + outputDir + ": " + ec.message());
        llvm::SmallString<256> path(outputDir);
        llvm::sys::path::append(path, name + "." + cpu.name + ".o");
        if (auto err = writeFile(path.str().str(), *obj))
          return fail(llvm::toString(std::move(err)));
      }
      break;
    }
    case Emit::PTX: {
      std::string chip = "sm_90";
      for (const std::string &t : chosen)
        if (t != "cpu") {
          chip = t;
          break;
        }
      auto ptx = compilePTX(job, chip);
      if (!ptx)
        return fail(llvm::toString(ptx.takeError()));
      llvm::outs() << *ptx;
      break;
    }
    case Emit::Bundle:
      if (int rc = buildBundle(job, cpus, chosen))
        return rc;
      break;
    }
  }
  return 0;
}
