//===- Passes.h - flashopt conversion passes --------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The lowering passes from flashopt kernel IR to the CPU and GPU targets,
/// and the named pipelines that flashopt-gen runs.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CONVERSION_PASSES_H
#define FLASHOPT_CONVERSION_PASSES_H

#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir {
namespace LLVM {
class LLVMDialect;
} // namespace LLVM
namespace NVVM {
class NVVMDialect;
} // namespace NVVM
namespace gpu {
class GPUDialect;
class GPUModuleOp;
} // namespace gpu
namespace func {
class FuncDialect;
} // namespace func
namespace scf {
class SCFDialect;
} // namespace scf
namespace vector {
class VectorDialect;
} // namespace vector
} // namespace mlir

namespace mlir::flashopt {

#define GEN_PASS_DECL
#include "flashopt/Conversion/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "flashopt/Conversion/Passes.h.inc"

/// Adds flashopt-cpu-pipeline: flashopt.optimizer → LLVM dialect
/// (flashopt-expand-encodings, flashopt-to-cpu, then buildCPULLVMPipeline).
/// `fma`: the target CPU has a hardware fused multiply-add, so
/// flashopt-exact-int-division runs (x86-64-v3: yes; baseline x86-64: no).
/// `interleave`: full groups per loop iteration (flashopt-to-cpu{interleave}).
/// `x86VectorBits`: the x86 vector width (512, 256, 128; 0 not x86), for
/// flashopt-convert-to-llvm{x86-vector-bits}. `kind`: which kernel of each
/// optimizer (flashopt-expand-encodings{kernel-kind}).
void buildCPUPipeline(OpPassManager &pm, bool fma = true,
                      int64_t interleave = 1, int64_t x86VectorBits = 0,
                      KernelKind kind = KernelKind::Step);

/// Adds the part of the CPU pipeline after flashopt-to-cpu: cleanup,
/// scf → cf, bf16 expansion, flashopt-convert-to-llvm.
void buildCPULLVMPipeline(OpPassManager &pm, int64_t x86VectorBits = 0);

/// Options of the GPU pipeline.
struct GPUPipelineOptions {
  std::string chip = "sm_90";
  /// Bytes of the widest per-element stream per thread access; 0 = chosen
  /// per kernel (see flashopt-to-gpu).
  int64_t bytesPerThread = 0;
  /// Every kernel's register cap (flashopt-convert-to-nvvm's max-registers);
  /// 0 = 64, and wide-registers for the kernels flashopt-to-gpu widens.
  int64_t maxRegisters = 0;
  bool ftz = false;
  bool tritonCompat = false;
  /// Which kernel of each optimizer (flashopt-expand-encodings{kernel-kind}).
  KernelKind kernelKind = KernelKind::Step;
  /// flashopt-to-gpu{full-warp-path}: the group body also without
  /// predicates, for warps whose lanes all hold full vectors.
  bool fullWarpPath = true;
  /// flashopt-to-gpu{shared-bases}: in that body, one base-address load per
  /// buffer.
  bool sharedBases = true;
};

/// Adds the flashopt-level rewrites that precede flashopt-to-gpu in
/// flashopt-gpu-pipeline (encodings expanded, fast arithmetic, exact integer
/// and group divisions). flashopt-to-gpu chooses the elements per thread from
/// the divisions and square roots left after them, so whoever predicts that
/// choice (gpuElementsPerThread, the manifest) runs these first.
void buildGPUPreLoweringPipeline(OpPassManager &pm,
                                 KernelKind kind = KernelKind::Step);

/// Adds flashopt-gpu-pipeline: flashopt.optimizer → gpu.module with NVVM
/// target attached, lowered to the LLVM/NVVM dialects (ready for
/// serialization to PTX).
void buildGPUPipeline(OpPassManager &pm, const GPUPipelineOptions &options);

class KernelOp;

/// Elements each GPU thread handles for `kernel` (what flashopt-to-gpu
/// chooses with the given bytes-per-thread and heavy-budget options;
/// bytes-per-thread 0 = automatic). `kernel` must have been through
/// buildGPUPreLoweringPipeline, as flashopt-to-gpu's input is.
int64_t gpuElementsPerThread(KernelOp kernel, int64_t bytesPerThread = 0,
                             int64_t heavyBudget = 24, int64_t wideBudget = 0);

/// flashopt-to-gpu's heavy-budget for `chip` (elements per thread times IEEE
/// divisions and square roots per element that fit its 64 registers).
int64_t gpuHeavyBudget(llvm::StringRef chip);

/// flashopt-to-gpu's wide-budget and wide-registers for `chip`: a kernel over
/// the heavy budget keeps 16-byte accesses at up to wide-registers registers
/// when elements per thread times its divisions and roots fit wide-budget.
int64_t gpuWideBudget(llvm::StringRef chip);
int64_t gpuWideRegisters(llvm::StringRef chip);

/// The gpu.func attribute (i32) by which flashopt-to-gpu gives one kernel a
/// register cap other than flashopt-convert-to-nvvm's max-registers.
inline constexpr llvm::StringLiteral kMaxRegistersAttrName =
    "flashopt.max_registers";

/// Registers the named pipelines (flashopt-cpu-pipeline, ...).
void registerFlashOptPipelines();

} // namespace mlir::flashopt

#endif // FLASHOPT_CONVERSION_PASSES_H
