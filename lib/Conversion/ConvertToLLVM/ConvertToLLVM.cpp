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

#include "flashopt/Conversion/GuardedConversion.h"
#include "flashopt/Conversion/Passes.h"
#include "flashopt/Conversion/RawMemoryToLLVM.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/LLVMCommon/Pattern.h"
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

/// The encodes' NaN-guarded conversions (GuardedConversion.h) of vectors of
/// f32 to i8/i16 as x86's own conversion: `cvttps2dq` gives 0x80000000 for
/// a NaN, whose low 8 or 16 bits are the 0 the guard asks for, so the
/// compare and the masking go. On AVX-512 a floor under the guard folds
/// into `cvtps2dq {rd-sae}` (round toward -inf, no exceptions). The guarded
/// value is in range otherwise (NUMERICS §1, §2; an out-of-range fptosi is
/// poison anyway). Vectors are converted in slices of the register width.
template <typename ConvOp>
struct X86GuardedConversion : public ConvertOpToLLVMPattern<ConvOp> {
  X86GuardedConversion(const LLVMTypeConverter &converter, int64_t bits)
      : ConvertOpToLLVMPattern<ConvOp>(converter, /*benefit=*/10),
        bits(bits) {}
  LogicalResult
  matchAndRewrite(ConvOp op, typename ConvOp::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    GuardedConversion g = matchGuardedConversion(op);
    auto vecType = dyn_cast<VectorType>(op.getType());
    if (!g.source || !vecType || vecType.getRank() != 1 ||
        vecType.isScalable())
      return failure();
    auto outElt = cast<IntegerType>(vecType.getElementType());
    int64_t lanes = bits / 32, n = vecType.getNumElements();
    // Whole slices, concatenated pairwise: a power-of-two count of them.
    if (outElt.getWidth() > 16 || n % lanes != 0 ||
        !llvm::isPowerOf2_64(n / lanes))
      return failure();
    bool foldFloor = g.floored && bits == 512;
    Value in = rewriter.getRemappedValue(foldFloor ? g.source : g.guarded);
    Location loc = op.getLoc();
    Type i32 = rewriter.getI32Type();
    auto sliceI = VectorType::get({lanes}, i32);
    SmallVector<Value> parts;
    for (int64_t k = 0; k < n; k += lanes) {
      SmallVector<int32_t> mask;
      for (int64_t i = 0; i < lanes; ++i)
        mask.push_back(int32_t(k + i));
      Value x = LLVM::ShuffleVectorOp::create(rewriter, loc, in, in, mask);
      Value r;
      if (bits == 512) {
        Value zero = LLVM::ZeroOp::create(rewriter, loc, sliceI);
        Value all = LLVM::ConstantOp::create(
            rewriter, loc, rewriter.getI16Type(), rewriter.getI16IntegerAttr(-1));
        // Rounding argument: 4 = the current mode (truncation is the
        // instruction's own), 9 = toward -inf with exceptions suppressed.
        Value rounding = LLVM::ConstantOp::create(
            rewriter, loc, i32, rewriter.getI32IntegerAttr(foldFloor ? 9 : 4));
        r = LLVM::CallIntrinsicOp::create(
                rewriter, loc, sliceI,
                rewriter.getStringAttr(foldFloor
                                           ? "llvm.x86.avx512.mask.cvtps2dq.512"
                                           : "llvm.x86.avx512.mask.cvttps2dq.512"),
                ValueRange{x, zero, all, rounding})
                .getResult(0);
      } else {
        r = LLVM::CallIntrinsicOp::create(
                rewriter, loc, sliceI,
                rewriter.getStringAttr(bits == 256 ? "llvm.x86.avx.cvtt.ps2dq.256"
                                                   : "llvm.x86.sse2.cvttps2dq"),
                ValueRange{x})
                .getResult(0);
      }
      parts.push_back(r);
    }
    // Concatenate the slices pairwise, then narrow.
    while (parts.size() > 1) {
      SmallVector<Value> next;
      for (size_t i = 0; i < parts.size(); i += 2) {
        int64_t w = cast<VectorType>(parts[i].getType()).getNumElements();
        SmallVector<int32_t> mask;
        for (int64_t j = 0; j < 2 * w; ++j)
          mask.push_back(int32_t(j));
        next.push_back(LLVM::ShuffleVectorOp::create(rewriter, loc, parts[i],
                                                     parts[i + 1], mask));
      }
      parts = std::move(next);
    }
    Type resultType = this->getTypeConverter()->convertType(vecType);
    rewriter.replaceOp(op, LLVM::TruncOp::create(rewriter, loc, resultType,
                                                 parts.front()));
    return success();
  }
  int64_t bits;
};

struct FlashOptConvertToLLVMPass
    : mlir::flashopt::impl::FlashOptConvertToLLVMBase<
          FlashOptConvertToLLVMPass> {
  using FlashOptConvertToLLVMBase::FlashOptConvertToLLVMBase;
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
    if (x86VectorBits == 128 || x86VectorBits == 256 || x86VectorBits == 512)
      patterns.add<X86GuardedConversion<arith::FPToSIOp>,
                   X86GuardedConversion<arith::FPToUIOp>>(converter,
                                                          x86VectorBits);
    LLVMConversionTarget target(*ctx);
    target.addLegalOp<ModuleOp>();
    if (failed(applyFullConversion(module, target, std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace
