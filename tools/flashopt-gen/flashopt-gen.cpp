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
/// is written; a bad spec gives a located error and exit status 1. This file
/// is the command line only; the work is lib/Driver (BundleDriver.h).
///
//===----------------------------------------------------------------------===//

#include "flashopt/Driver/BundleDriver.h"
#include "flashopt/InitAll.h"
#include "flashopt/Rules/BuiltinRules.h"

#include "mlir/IR/MLIRContext.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/WithColor.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
namespace cl = llvm::cl;
namespace driver = ::flashopt::driver;
namespace target = ::flashopt::target;
using Emit = driver::EmitStage;

namespace {

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

cl::opt<int> gpuMaxRegisters(
    "gpu-max-registers",
    cl::desc("GPU: every kernel's register cap (.maxnreg; 0 = 64, or 96 for "
             "the kernels flashopt-to-gpu widens)"),
    cl::init(0), cl::cat(genCategory), cl::Hidden);

cl::opt<std::string> kernelKind(
    "kernel",
    cl::desc("Which kernel --emit=kernel-ir/llvm/obj/ptx makes: step (the "
             "default), or for a spec with an accumulator accumulate, "
             "step_accumulated, step_fused (a bundle has them all)"),
    cl::init("step"), cl::cat(genCategory));

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

std::vector<std::string> splitList(llvm::StringRef list) {
  llvm::SmallVector<llvm::StringRef> parts;
  list.split(parts, ',', -1, /*KeepEmpty=*/false);
  std::vector<std::string> out;
  for (llvm::StringRef p : parts)
    out.push_back(p.trim().str());
  return out;
}

int fail(const llvm::Twine &message) {
  llvm::WithColor::error(llvm::errs(), "flashopt-gen") << message << "\n";
  return 1;
}

/// Prints `err` as flashopt-gen's error (nothing more for errors whose
/// diagnostics were already written); returns the exit status.
int fail(llvm::Error err) {
  int rc = 1;
  llvm::handleAllErrors(
      std::move(err), [](const driver::ReportedError &) {},
      [&](const llvm::ErrorInfoBase &e) { rc = fail(e.message()); });
  return rc;
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
  std::vector<driver::CompileJob> jobs;
  bool ok = true;
  for (const std::string &path : inputFiles) {
    auto loaded = driver::loadInput(ctx, path, llvm::errs());
    if (!loaded) {
      fail(loaded.takeError());
      ok = false;
      continue;
    }
    for (driver::CompileJob &job : *loaded)
      jobs.push_back(std::move(job));
  }
  for (const driver::CompileJob &job : jobs)
    if (llvm::Error err = driver::verifyJob(job)) {
      fail(std::move(err));
      ok = false;
    }
  if (!ok)
    return 1;

  driver::DriverOptions options;
  options.emit = emitKind;
  options.outputDir = outputDir;
  if (targetList.getNumOccurrences())
    options.targets = splitList(targetList);
  if (cpuList.getNumOccurrences()) {
    options.cpus.emplace();
    for (const std::string &name : splitList(cpuList)) {
      auto cpu = target::lookupHostCPU(name);
      if (!cpu)
        return fail(cpu.takeError());
      options.cpus->push_back(*cpu);
    }
  }
  options.ftz = ftzOpt;
  options.tritonCompat = tritonCompatOpt;
  options.gpuBytesPerThread = gpuBytesPerThread;
  options.gpuMaxRegisters = gpuMaxRegisters;
  options.runPtxas = !noPtxas;
  if (!::flashopt::abi::parse_kernel_kind(kernelKind, options.kernel)) {
    llvm::errs() << "flashopt-gen: error: --kernel=" << kernelKind
                 << ": expected one of step, accumulate, step_accumulated, "
                    "step_fused\n";
    return 1;
  }

  for (const driver::CompileJob &job : jobs) {
    auto result = driver::compile(job, options, llvm::outs());
    if (!result)
      return fail(result.takeError());
    if (const std::optional<driver::BundleResult> &bundle = result->bundle) {
      size_t artifacts = bundle->manifest.kernels.size();
      llvm::outs() << "flashopt-gen: wrote " << bundle->directory << " ("
                   << artifacts << " artifact" << (artifacts == 1 ? "" : "s")
                   << ", "
                   << llvm::format("%.4g",
                                   bundle->manifest.bytes_per_param.total)
                   << " B/param)\n";
    }
  }
  return 0;
}
