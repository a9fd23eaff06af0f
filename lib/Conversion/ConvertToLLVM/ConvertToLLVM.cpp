//===- ConvertToLLVM.cpp - flashopt-convert-to-llvm ------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CPU back end's single full conversion to the LLVM dialect.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/Passes.h"
#include "flashopt/Conversion/RawMemoryToLLVM.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/LLVMCommon/ConversionTarget.h"
#include "mlir/Conversion/LLVMCommon/TypeConverter.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Transforms/DialectConversion.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTCONVERTTOLLVM
#include "flashopt/Conversion/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

struct FlashOptConvertToLLVMPass
    : mlir::flashopt::impl::FlashOptConvertToLLVMBase<
          FlashOptConvertToLLVMPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    LowerToLLVMOptions options(ctx);
    LLVMTypeConverter converter(ctx, options);
    RewritePatternSet patterns(ctx);
    populateRawMemoryToLLVMPatterns(converter, patterns, /*addressSpace=*/0,
                                    /*bf16AsInt=*/true);
    arith::populateArithToLLVMConversionPatterns(converter, patterns);
    populateMathToLLVMConversionPatterns(converter, patterns);
    populateVectorToLLVMConversionPatterns(converter, patterns);
    populateFuncToLLVMConversionPatterns(converter, patterns);
    cf::populateControlFlowToLLVMConversionPatterns(converter, patterns);
    ub::populateUBToLLVMConversionPatterns(converter, patterns);
    LLVMConversionTarget target(*ctx);
    target.addLegalOp<ModuleOp>();
    if (failed(applyFullConversion(module, target, std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
