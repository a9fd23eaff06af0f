//===- PTX.cpp - GPU kernels to PTX and cubins ----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Target/PTX.h"

#include "mlir/Dialect/GPU/IR/CompilationInterfaces.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/Regex.h"
#include "llvm/Support/raw_ostream.h"

using namespace flashopt::target;

namespace {
llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// Sets a hidden LLVM code-generation option by name (e.g. the NVPTX
/// division precision), if this LLVM has it.
void setLLVMOption(llvm::StringRef name, llvm::StringRef value) {
  auto &options = llvm::cl::getRegisteredOptions();
  auto it = options.find(name);
  if (it != options.end())
    it->second->addOccurrence(0, name, value);
}
} // namespace

bool flashopt::target::isSupportedChip(llvm::StringRef chip) {
  return chip == "sm_80" || chip == "sm_90" || chip == "sm_100";
}

llvm::Expected<std::string>
flashopt::target::serializeToPTX(mlir::ModuleOp module, bool tritonCompat) {
  auto gpuModules = llvm::to_vector(module.getOps<mlir::gpu::GPUModuleOp>());
  if (gpuModules.size() != 1)
    return makeError("expected exactly one gpu.module to serialize");
  mlir::gpu::GPUModuleOp gm = gpuModules.front();
  if (!gm.getTargetsAttr() || gm.getTargetsAttr().empty())
    return makeError("the gpu.module has no #nvvm.target");
  auto target =
      llvm::dyn_cast<mlir::gpu::TargetAttrInterface>(gm.getTargetsAttr()[0]);
  if (!target)
    return makeError("the gpu.module's target cannot serialize");
  // IEEE division (div.rn.f32) unless Triton-compatible arithmetic is asked
  // for (div.full.f32).
  setLLVMOption("nvptx-prec-divf32", tritonCompat ? "1" : "2");
  mlir::gpu::TargetOptions options(
      /*toolkitPath=*/"", /*librariesToLink=*/{}, /*cmdOptions=*/"",
      /*elfSection=*/"", mlir::gpu::CompilationTarget::Assembly);
  std::optional<llvm::SmallVector<char, 0>> ptx =
      target.serializeToObject(gm, options);
  if (!ptx)
    return makeError("PTX serialization of " + gm.getSymName() + " failed");
  std::string text(ptx->begin(), ptx->end());
  while (!text.empty() && text.back() == '\0')
    text.pop_back();
  return text;
}

std::optional<std::string> flashopt::target::findPtxas() {
  for (const char *var : {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"}) {
    const char *root = std::getenv(var);
    if (!root || !*root)
      continue;
    llvm::SmallString<256> p(root);
    llvm::sys::path::append(p, "bin", "ptxas");
    if (llvm::sys::fs::can_execute(p))
      return p.str().str();
  }
  if (llvm::sys::fs::can_execute("/usr/local/cuda/bin/ptxas"))
    return std::string("/usr/local/cuda/bin/ptxas");
  if (auto p = llvm::sys::findProgramByName("ptxas"))
    return *p;
  return std::nullopt;
}

llvm::Expected<PtxasResult> flashopt::target::runPtxas(const std::string &ptxas,
                                                       const std::string &ptx,
                                                       llvm::StringRef chip) {
  llvm::SmallString<128> in, out, log;
  if (llvm::sys::fs::createTemporaryFile("flashopt", "ptx", in) ||
      llvm::sys::fs::createTemporaryFile("flashopt", "cubin", out) ||
      llvm::sys::fs::createTemporaryFile("flashopt-ptxas", "log", log))
    return makeError("cannot create temporary files for ptxas");
  llvm::scope_exit cleanup([&] {
    llvm::sys::fs::remove(in);
    llvm::sys::fs::remove(out);
    llvm::sys::fs::remove(log);
  });
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(in, ec);
    if (ec)
      return makeError("cannot write " + in + ": " + ec.message());
    os << ptx;
  }
  std::string arch = ("-arch=" + chip).str();
  llvm::SmallVector<llvm::StringRef> args = {ptxas,    arch, "-O3",    "-v",
                                             in.str(), "-o", out.str()};
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, log.str(),
                                                log.str()};
  std::string errorMessage;
  int rc = llvm::sys::ExecuteAndWait(ptxas, args, std::nullopt, redirects, 0, 0,
                                     &errorMessage);
  PtxasResult result;
  if (auto buf = llvm::MemoryBuffer::getFile(log))
    result.log = (*buf)->getBuffer().str();
  if (rc != 0)
    return makeError("ptxas failed for " + chip + ": " + errorMessage + "\n" +
                     result.log);
  if (auto buf = llvm::MemoryBuffer::getFile(out, /*IsText=*/false))
    result.cubin = (*buf)->getBuffer().str();
  llvm::SmallVector<llvm::StringRef> groups;
  if (llvm::Regex("Used ([0-9]+) registers").match(result.log, &groups))
    result.registers = std::stoi(groups[1].str());
  if (llvm::Regex("([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads")
          .match(result.log, &groups)) {
    result.spillStores = std::stoi(groups[1].str());
    result.spillLoads = std::stoi(groups[2].str());
  }
  return result;
}
