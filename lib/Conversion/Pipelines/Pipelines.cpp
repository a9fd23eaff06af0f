//===- Pipelines.cpp - flashopt's named pass pipelines ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The pipelines flashopt-gen runs, registered under names so that
/// `flashopt-opt --flashopt-cpu-pipeline` reproduces them exactly.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using mlir::flashopt::KernelKind;

void mlir::flashopt::buildCPUPipeline(OpPassManager &pm, bool fma,
                                      int64_t interleave,
                                      int64_t x86VectorBits,
                                      KernelKind kind) {
  FlashOptExpandEncodingsOptions expand;
  expand.kernelKind = kind;
  // Minifloat codes without subnormal products: x86 takes a microcode assist
  // for each (a 4-bit AdamW ran 3x slower), the GPU none (it keeps the
  // direct product, fewer instructions). Same bits (ConformanceTests).
  expand.subnormalFreeCodes = true;
  pm.addPass(createFlashOptExpandEncodings(expand));
  // Fast kernels (docs/NUMERICS.md §7) on every flavour: the FMAs are part of
  // their arithmetic (a baseline x86-64 kernel calls fmaf).
  pm.addPass(createFlashOptFastArithmetic());
  // No flashopt-decode-tables here: on the AVX-512 EPYC of
  // docs/PERFORMANCE.md the tables' gathers made AdamW-24 slower (390 ->
  // 318 Mparams/s on one core, SGD-24 642 -> 542) than the divisions they
  // replace.
  if (fma) {
    pm.addPass(createFlashOptExactIntDivision());
    pm.addPass(createFlashOptExactGroupDivision());
  }
  // No flashopt-uniform-division here: its binary64 arithmetic made
  // AdamW-24 slower on the AVX-512 EPYC of docs/PERFORMANCE.md (x86-64-v4,
  // 1e7, one thread: 590 -> 490 Mparams/s) than the vdivps it replaces (a
  // multiply alone, without the tie snap that makes it exact for every
  // divisor, was +3 % on v4 and within noise on v3).
  FlashOptToCPUOptions toCPU;
  toCPU.interleave = interleave;
  // The groups' absmaxes reduced together, down to one native vector (an
  // x86 flavour's width; 4 lanes elsewhere).
  toCPU.reduceLanes = x86VectorBits > 0 ? x86VectorBits / 32 : 4;
  pm.addPass(createFlashOptToCPU(toCPU));
  buildCPULLVMPipeline(pm, x86VectorBits);
}

void mlir::flashopt::buildCPULLVMPipeline(OpPassManager &pm,
                                          int64_t x86VectorBits) {
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createSCFToControlFlowPass());
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  FlashOptConvertToLLVMOptions toLLVM;
  toLLVM.x86VectorBits = x86VectorBits;
  pm.addPass(createFlashOptConvertToLLVM(toLLVM));
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::flashopt::buildGPUPreLoweringPipeline(OpPassManager &pm,
                                                 KernelKind kind) {
  FlashOptExpandEncodingsOptions expand;
  expand.kernelKind = kind;
  pm.addPass(createFlashOptExpandEncodings(expand));
  pm.addPass(createFlashOptFastArithmetic());
  // Decodes that divide or take a root as a 256-entry table read (an address
  // and one cached load against ~12 SASS per division).
  pm.addPass(createFlashOptDecodeTables());
  // Softsign and sqrt codes from one MUFU per element behind a guard that
  // proves them exact, the exact chain as a rarely taken fallback.
  pm.addPass(createFlashOptGuardedQuantize());
  // Code decodes (k / 127, k / 255) as a multiply and two FMAs, proven exact
  // for every code: div.rn costs ~12 SASS, and its slow path runs for every
  // zero code (measured on an H200: 42 of sgd_bf16_m24's 180 SASS/elt).
  pm.addPass(createFlashOptExactIntDivision());
  pm.addPass(createFlashOptExactGroupDivision());
  // Divisions by a per-step value (Adam's bias corrections) in binary64,
  // proven correctly rounded: 6 SASS against div.rn's ~10.
  pm.addPass(createFlashOptUniformDivision());
}

void mlir::flashopt::buildGPUPipeline(OpPassManager &pm,
                                      const GPUPipelineOptions &options) {
  buildGPUPreLoweringPipeline(pm, options.kernelKind);
  FlashOptToGPUOptions toGPU;
  toGPU.bytesPerThread = options.bytesPerThread;
  toGPU.heavyBudget = gpuHeavyBudget(options.chip);
  toGPU.wideBudget = gpuWideBudget(options.chip);
  toGPU.wideRegisters = gpuWideRegisters(options.chip);
  toGPU.fullWarpPath = options.fullWarpPath;
  toGPU.sharedBases = options.sharedBases;
  pm.addPass(createFlashOptToGPU(toGPU));
  GpuNVVMAttachTargetOptions attach;
  attach.chip = options.chip;
  attach.optLevel = 3;
  pm.addPass(createGpuNVVMAttachTarget(attach));
  OpPassManager &gpm = pm.nest<gpu::GPUModuleOp>();
  gpm.addPass(createCanonicalizerPass());
  gpm.addPass(createCSEPass());
  gpm.addPass(createSCFToControlFlowPass());
  FlashOptConvertToNVVMOptions nvvm;
  nvvm.ftz = options.ftz;
  nvvm.tritonCompat = options.tritonCompat;
  if (options.maxRegisters > 0)
    nvvm.maxRegisters = options.maxRegisters;
  gpm.addPass(createFlashOptConvertToNVVM(nvvm));
  gpm.addPass(createCanonicalizerPass());
  gpm.addPass(createCSEPass());
  gpm.addPass(createReconcileUnrealizedCastsPass());
}

namespace {
/// The values of the pipelines' kernel-kind option
/// (flashopt-expand-encodings{kernel-kind}).
llvm::cl::ValuesClass kernelKindValues() {
  return llvm::cl::values(
      clEnumValN(KernelKind::Step, "step", "the step kernel"),
      clEnumValN(KernelKind::Accumulate, "accumulate", "the accumulate kernel"),
      clEnumValN(KernelKind::StepAccumulated, "step_accumulated",
                 "the step on the accumulated gradient"),
      clEnumValN(KernelKind::StepFused, "step_fused",
                 "the fused last micro-batch and step"));
}

struct GPUPipelineCLOptions : public PassPipelineOptions<GPUPipelineCLOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("NVIDIA chip (sm_80, sm_90, sm_100)"),
      llvm::cl::init("sm_90")};
  PassOptions::Option<bool> ftz{*this, "ftz",
                                llvm::cl::desc("Flush f32 subnormals"),
                                llvm::cl::init(false)};
  PassOptions::Option<bool> tritonCompat{
      *this, "triton-compat",
      llvm::cl::desc("Triton-compatible approximate arithmetic"),
      llvm::cl::init(false)};
  PassOptions::Option<KernelKind> kernelKind{
      *this, "kernel-kind",
      llvm::cl::desc("Which kernel of each optimizer to make"),
      llvm::cl::init(KernelKind::Step), kernelKindValues()};
  PassOptions::Option<bool> fullWarpPath{
      *this, "full-warp-path",
      llvm::cl::desc("flashopt-to-gpu{full-warp-path}: the group body also "
                     "without predicates, for warps of full vectors"),
      llvm::cl::init(true)};
  PassOptions::Option<bool> sharedBases{
      *this, "shared-bases",
      llvm::cl::desc("flashopt-to-gpu{shared-bases}: one base-address load "
                     "per buffer in the full-warp body"),
      llvm::cl::init(true)};
};
struct CPUPipelineCLOptions : public PassPipelineOptions<CPUPipelineCLOptions> {
  PassOptions::Option<bool> fma{
      *this, "fma",
      llvm::cl::desc("The CPU has a hardware FMA: run "
                     "flashopt-exact-int-division (flashopt-gen: true for "
                     "x86-64-v3, false for the x86-64 baseline)"),
      llvm::cl::init(true)};
  PassOptions::Option<int64_t> interleave{
      *this, "interleave",
      llvm::cl::desc("Full groups per loop iteration (flashopt-to-cpu)"),
      llvm::cl::init(1)};
  PassOptions::Option<int64_t> x86VectorBits{
      *this, "x86-vector-bits",
      llvm::cl::desc("x86 vector width, 512/256/128, 0 for not x86 "
                     "(flashopt-convert-to-llvm; flashopt-gen: from the "
                     "flavour's features)"),
      llvm::cl::init(0)};
  PassOptions::Option<KernelKind> kernelKind{
      *this, "kernel-kind",
      llvm::cl::desc("Which kernel of each optimizer to make"),
      llvm::cl::init(KernelKind::Step), kernelKindValues()};
};
} // namespace

void mlir::flashopt::registerFlashOptPipelines() {
  PassPipelineRegistration<GPUPipelineCLOptions>(
      "flashopt-gpu-pipeline",
      "Lower flashopt optimizers to NVVM-dialect GPU kernels (what "
      "flashopt-gen --target=sm_XX runs before PTX serialization)",
      [](OpPassManager &pm, const GPUPipelineCLOptions &cl) {
        GPUPipelineOptions options;
        options.chip = cl.chip;
        options.ftz = cl.ftz;
        options.tritonCompat = cl.tritonCompat;
        options.kernelKind = cl.kernelKind;
        options.fullWarpPath = cl.fullWarpPath;
        options.sharedBases = cl.sharedBases;
        buildGPUPipeline(pm, options);
      });
  PassPipelineRegistration<CPUPipelineCLOptions>(
      "flashopt-cpu-pipeline",
      "Lower flashopt optimizers to LLVM dialect host kernels (what "
      "flashopt-gen --target=cpu runs before LLVM code generation)",
      [](OpPassManager &pm, const CPUPipelineCLOptions &cl) {
        buildCPUPipeline(pm, cl.fma, cl.interleave, cl.x86VectorBits,
                         cl.kernelKind);
      });
}
