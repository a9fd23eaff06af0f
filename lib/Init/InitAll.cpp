//===- InitAll.cpp - Register flashopt dialects and passes -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/InitAll.h"
#include "flashopt/Conversion/Passes.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptDialect.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"

void flashopt::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::flashopt::FlashOptDialect, mlir::arith::ArithDialect,
                  mlir::math::MathDialect, mlir::scf::SCFDialect,
                  mlir::func::FuncDialect, mlir::vector::VectorDialect,
                  mlir::cf::ControlFlowDialect, mlir::LLVM::LLVMDialect,
                  mlir::ub::UBDialect, mlir::gpu::GPUDialect,
                  mlir::NVVM::NVVMDialect>();
  // PTX serialization: #nvvm.target and MLIR → LLVM IR translation.
  mlir::NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  mlir::registerBuiltinDialectTranslation(registry);
  mlir::registerLLVMDialectTranslation(registry);
  mlir::registerNVVMDialectTranslation(registry);
  mlir::registerGPUDialectTranslation(registry);
}

void flashopt::registerAllPasses() {
  mlir::registerTransformsPasses();
  mlir::registerConversionPasses();
  mlir::arith::registerArithPasses();
  mlir::registerGPUPasses();
  mlir::flashopt::registerFlashOptTransformsPasses();
  mlir::flashopt::registerFlashOptConversionPasses();
  mlir::flashopt::registerFlashOptPipelines();
}
