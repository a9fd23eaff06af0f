//===- HostObject.cpp - LLVM dialect to host object / shared object -------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Target/HostObject.h"
#include "flashopt/abi/KernelAbi.h"

#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/IR/Constants.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"

#include <mutex>

using namespace flashopt::target;

namespace {

void initializeNativeTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

llvm::Expected<std::unique_ptr<llvm::TargetMachine>>
makeTargetMachine(const HostCPU &cpu) {
  initializeNativeTarget();
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  std::string error;
  const llvm::Target *target =
      llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target)
    return makeError("no LLVM target for " + triple.str() + ": " + error);
  llvm::TargetOptions options;
  // The numerics contract: no FMA contraction unless the IR says fma.
  options.AllowFPOpFusion = llvm::FPOpFusion::Strict;
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(
      triple, cpu.name, /*Features=*/"", options, llvm::Reloc::PIC_,
      std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!tm)
    return makeError("cannot create a target machine for CPU '" + cpu.name +
                     "'");
  return std::move(tm);
}

/// Translates and (optionally) optimizes `module` into `ctx`.
llvm::Expected<std::unique_ptr<llvm::Module>> translate(mlir::ModuleOp module,
                                                        llvm::LLVMContext &ctx,
                                                        llvm::TargetMachine &tm,
                                                        bool optimize) {
  mlir::DialectRegistry registry;
  mlir::registerBuiltinDialectTranslation(registry);
  mlir::registerLLVMDialectTranslation(registry);
  module->getContext()->appendDialectRegistry(registry);
  std::unique_ptr<llvm::Module> llvmModule =
      mlir::translateModuleToLLVMIR(module, ctx, "flashopt");
  if (!llvmModule)
    return makeError("cannot translate the kernel module to LLVM IR");
  llvmModule->setTargetTriple(tm.getTargetTriple());
  llvmModule->setDataLayout(tm.createDataLayout());
  for (llvm::Function &fn : *llvmModule) {
    if (fn.isDeclaration())
      continue;
    fn.addFnAttr("target-cpu", tm.getTargetCPU());
    fn.addFnAttr(llvm::Attribute::NoUnwind);
  }
  if (optimize) {
    auto transformer = mlir::makeOptimizingTransformer(3, 0, &tm);
    if (llvm::Error err = transformer(llvmModule.get()))
      return std::move(err);
  }
  return std::move(llvmModule);
}

/// The object file `tm` makes of `module`.
llvm::Expected<std::string> emitObjectFile(llvm::TargetMachine &tm,
                                           llvm::Module &module) {
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr,
                             llvm::CodeGenFileType::ObjectFile))
    return makeError("the target cannot emit object files");
  pm.run(module);
  return std::string(buffer.begin(), buffer.end());
}

} // namespace

std::vector<HostCPU> flashopt::target::defaultHostCPUs() {
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  if (triple.getArch() == llvm::Triple::x86_64) {
    // The flavours and the features the runtime checks for them: the ABI
    // library's one list (abi/CpuFeatures.def).
    std::vector<HostCPU> cpus;
    for (const ::flashopt::abi::CpuFlavour &f :
         ::flashopt::abi::default_x86_cpu_flavours())
      cpus.push_back({f.cpu, f.features});
    return cpus;
  }
  return {{"generic", {}}};
}

llvm::Expected<HostCPU> flashopt::target::lookupHostCPU(llvm::StringRef name) {
  for (const HostCPU &cpu : defaultHostCPUs())
    if (cpu.name == name)
      return cpu;
  auto tm = makeTargetMachine(HostCPU{name.str(), {}});
  if (!tm)
    return tm.takeError();
  const llvm::MCSubtargetInfo *sti = (*tm)->getMCSubtargetInfo();
  if (!sti->isCPUStringValid(name))
    return makeError("unknown CPU '" + name + "' for " +
                     llvm::sys::getDefaultTargetTriple());
  // Any other CPU: the runtime must check every feature the code may use,
  // so the manifest lists each known feature (abi/CpuFeatures.def) that
  // LLVM enables for it (else a kernel built for an AVX-512 CPU would be
  // chosen on any x86-64 host and die with SIGILL).
  HostCPU cpu{name.str(), {}};
  for (const std::string &feature : ::flashopt::abi::known_cpu_features()) {
    // "abm" is CPUID's name for what LLVM calls lzcnt.
    if (feature == "abm")
      continue;
    if (sti->checkFeatures("+" + feature))
      cpu.requires_.push_back(feature);
  }
  return cpu;
}

llvm::Expected<std::string>
flashopt::target::emitHostLLVMIR(mlir::ModuleOp module, const HostCPU &cpu,
                                 bool optimize) {
  auto tm = makeTargetMachine(cpu);
  if (!tm)
    return tm.takeError();
  llvm::LLVMContext ctx;
  auto llvmModule = translate(module, ctx, **tm, optimize);
  if (!llvmModule)
    return llvmModule.takeError();
  std::string text;
  llvm::raw_string_ostream os(text);
  (*llvmModule)->print(os, nullptr);
  return text;
}

llvm::Expected<std::string>
flashopt::target::emitHostObject(mlir::ModuleOp module, const HostCPU &cpu) {
  auto tm = makeTargetMachine(cpu);
  if (!tm)
    return tm.takeError();
  llvm::LLVMContext ctx;
  auto llvmModule = translate(module, ctx, **tm, /*optimize=*/true);
  if (!llvmModule)
    return llvmModule.takeError();
  return emitObjectFile(**tm, **llvmModule);
}

llvm::Expected<std::string>
flashopt::target::emitDataObject(const HostCPU &cpu, llvm::StringRef symbol,
                                 llvm::StringRef bytes) {
  auto tm = makeTargetMachine(cpu);
  if (!tm)
    return tm.takeError();
  llvm::LLVMContext ctx;
  llvm::Module module("flashopt-abi", ctx);
  module.setTargetTriple((*tm)->getTargetTriple());
  module.setDataLayout((*tm)->createDataLayout());
  llvm::Constant *init =
      llvm::ConstantDataArray::getString(ctx, bytes, /*AddNull=*/true);
  auto *global = new llvm::GlobalVariable(
      module, init->getType(), /*isConstant=*/true,
      llvm::GlobalValue::ExternalLinkage, init, symbol);
  global->setAlignment(llvm::Align(1));
  return emitObjectFile(**tm, module);
}

llvm::Error
flashopt::target::linkSharedObject(const std::string &objectPath,
                                   const std::string &sharedPath,
                                   llvm::ArrayRef<std::string> extraObjects) {
  const char *envCC = std::getenv("CC");
  llvm::ErrorOr<std::string> cc =
      llvm::sys::findProgramByName(envCC && *envCC ? envCC : "cc");
  if (!cc)
    return makeError("no C compiler driver ('cc') found to link " + sharedPath +
                     "; set CC");
  std::string errorMessage;
  llvm::SmallVector<llvm::StringRef> args = {*cc, "-shared", "-o", sharedPath,
                                             objectPath};
  for (const std::string &extra : extraObjects)
    args.push_back(extra);
  args.push_back("-lm");
  std::string logPath;
  llvm::SmallString<128> log;
  if (llvm::sys::fs::createTemporaryFile("flashopt-link", "log", log))
    return makeError("cannot create a temporary file");
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, log.str(),
                                                log.str()};
  int rc = llvm::sys::ExecuteAndWait(*cc, args, std::nullopt, redirects, 0, 0,
                                     &errorMessage);
  auto output = llvm::MemoryBuffer::getFile(log);
  std::string text = output ? (*output)->getBuffer().str() : "";
  llvm::sys::fs::remove(log);
  if (rc != 0)
    return makeError("linking " + sharedPath + " failed (" + *cc +
                     "): " + errorMessage + text);
  return llvm::Error::success();
}
