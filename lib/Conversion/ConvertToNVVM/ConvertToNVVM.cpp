//===- ConvertToNVVM.cpp - flashopt-convert-to-nvvm ------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt's own GPU → NVVM conversion (the IREE pattern): it reuses the
/// upstream populate functions but gives the math → LLVM-intrinsic patterns
/// priority over the libdevice fallbacks of convert-gpu-to-nvvm, so the PTX
/// has IEEE sqrt.rn/div.rn and no __nv_* calls. This is one of the few
/// translation units that include the NVVM dialect headers.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/GuardedConversion.h"
#include "flashopt/Conversion/Passes.h"
#include "flashopt/Conversion/RawMemoryToLLVM.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/LLVMCommon/ConversionTarget.h"
#include "mlir/Conversion/LLVMCommon/Pattern.h"
#include "mlir/Conversion/LLVMCommon/TypeConverter.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/DataLayoutInterfaces.h"
#include "mlir/Transforms/DialectConversion.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTCONVERTTONVVM
#include "flashopt/Conversion/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

/// Triton-compatible arithmetic: FMA contraction everywhere, approximate
/// square roots. (Approximate division is a code-generation option,
/// -nvptx-prec-divf32=1, that flashopt-gen sets with --triton-compat.)
void applyTritonCompatFlags(gpu::GPUModuleOp module) {
  module.walk([](Operation *op) {
    auto fmf = dyn_cast<arith::ArithFastMathInterface>(op);
    if (!fmf)
      return;
    arith::FastMathFlags flags = arith::FastMathFlags::contract;
    if (isa<math::SqrtOp>(op))
      flags = flags | arith::FastMathFlags::afn;
    op->setAttr(fmf.getFastMathAttrName(),
                arith::FastMathFlagsAttr::get(op->getContext(), flags));
  });
}

/// A float-to-integer conversion behind a NaN guard, the form every code
/// and correction encode ends in (docs/NUMERICS.md §1, §2):
///     fptosi(select(isnan(a), 0.0, y))     y NaN whenever a is
/// as one PTX cvt.rzi (cvt.rmi when y = floor(w): the floor folded in):
/// PTX float-to-integer conversions give 0 for NaN and saturate, so the
/// guard is the conversion's own behaviour (arith's fptosi leaves NaN
/// undefined, hence the select in the target-independent IR; the PTX
/// interpreter models cvt the same way). Results narrower than 32 bits are
/// truncated from the i32: the guarded value is in range (NUMERICS §1, §2),
/// and an out-of-range fptosi is poison anyway. Vectors are unrolled
/// (the intrinsics are scalar; NVPTX scalarizes the vector arithmetic too).
template <typename ConvOp, bool Signed>
struct GuardedFloatToIntLowering : public ConvertOpToLLVMPattern<ConvOp> {
  using ConvertOpToLLVMPattern<ConvOp>::ConvertOpToLLVMPattern;
  LogicalResult
  matchAndRewrite(ConvOp op, typename ConvOp::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    GuardedConversion g = matchGuardedConversion(op);
    if (!g.source)
      return failure();
    auto outElt = cast<IntegerType>(getElementTypeOrSelf(op.getType()));
    const char *intrinsic =
        g.floored ? (Signed ? "llvm.nvvm.f2i.rm" : "llvm.nvvm.f2ui.rm")
                  : (Signed ? "llvm.nvvm.f2i.rz" : "llvm.nvvm.f2ui.rz");
    Value in = rewriter.getRemappedValue(g.source);
    Location loc = op.getLoc();
    Type i32 = rewriter.getI32Type();
    auto convert = [&](Value x) -> Value {
      Value r = LLVM::CallIntrinsicOp::create(rewriter, loc, i32,
                                              rewriter.getStringAttr(intrinsic),
                                              ValueRange{x})
                    .getResult(0);
      if (outElt.getWidth() < 32)
        r = LLVM::TruncOp::create(rewriter, loc, outElt, r);
      return r;
    };
    auto vecType = dyn_cast<VectorType>(op.getType());
    if (!vecType) {
      rewriter.replaceOp(op, convert(in));
      return success();
    }
    if (vecType.getRank() != 1 || vecType.isScalable())
      return failure();
    Type resultType = this->getTypeConverter()->convertType(vecType);
    Value result = LLVM::PoisonOp::create(rewriter, loc, resultType);
    for (int64_t i = 0, e = vecType.getNumElements(); i < e; ++i) {
      Value idx = LLVM::ConstantOp::create(rewriter, loc, i32,
                                           rewriter.getI32IntegerAttr(i));
      Value x = LLVM::ExtractElementOp::create(rewriter, loc, in, idx);
      result = LLVM::InsertElementOp::create(rewriter, loc, result, convert(x),
                                             idx);
    }
    rewriter.replaceOp(op, result);
    return success();
  }
};

struct FlashOptConvertToNVVMPass
    : mlir::flashopt::impl::FlashOptConvertToNVVMBase<
          FlashOptConvertToNVVMPass> {
  using FlashOptConvertToNVVMBase::FlashOptConvertToNVVMBase;

  void runOnOperation() override {
    gpu::GPUModuleOp module = getOperation();
    MLIRContext *ctx = &getContext();
    if (tritonCompat)
      applyTritonCompatFlags(module);

    LowerToLLVMOptions options(
        ctx, DataLayout(cast<DataLayoutOpInterface>(module.getOperation())));
    // 32-bit index arithmetic: a table record covers < 2^31 elements (the
    // runtime splits larger tensors), and 64-bit indices would double the
    // registers of every index; addresses stay 64-bit.
    options.overrideIndexBitwidth(32);
    LLVMTypeConverter converter(ctx, options);
    configureGpuToNVVMTypeConverter(converter);

    RewritePatternSet patterns(ctx);
    // Math → llvm.intr.* wins over the libdevice fallbacks below.
    populateMathToLLVMConversionPatterns(converter, patterns,
                                         /*approximateLog1p=*/true,
                                         /*benefit=*/10);
    populateRawMemoryToLLVMPatterns(converter, patterns, /*addressSpace=*/1,
                                    /*bf16AsInt=*/false);
    arith::populateArithToLLVMConversionPatterns(converter, patterns);
    cf::populateControlFlowToLLVMConversionPatterns(converter, patterns);
    populateVectorToLLVMConversionPatterns(converter, patterns);
    populateFuncToLLVMConversionPatterns(converter, patterns);
    ub::populateUBToLLVMConversionPatterns(converter, patterns);
    // gpu.func, thread ids and shuffles have no competitor at benefit 0;
    // the libdevice patterns in this set lose against the ones above.
    populateGpuToNVVMConversionPatterns(converter, patterns, /*benefit=*/0);
    // gpu.subgroup_reduce (uniform, i32): one redux.sync (sm_80+).
    populateGpuSubgroupReduceOpLoweringPattern(converter, patterns,
                                               /*benefit=*/1);
    // The guarded conversions of the encodes: one cvt each, over arith's.
    patterns.add<GuardedFloatToIntLowering<arith::FPToSIOp, true>,
                 GuardedFloatToIntLowering<arith::FPToUIOp, false>>(
        converter, /*benefit=*/10);

    LLVMConversionTarget target(*ctx);
    configureGpuToNVVMConversionLegality(target);
    // Undo the NVVM legality's ban on the intrinsics we want.
    target.addLegalOp<LLVM::SqrtOp, LLVM::FAbsOp, LLVM::FFloorOp,
                      LLVM::FCeilOp, LLVM::RoundEvenOp, LLVM::MaxNumOp,
                      LLVM::MinNumOp, LLVM::MaximumOp, LLVM::MinimumOp,
                      LLVM::FMAOp, LLVM::CopySignOp>();
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();

    module.walk([&](LLVM::LLVMFuncOp fn) {
      if (!fn->hasAttr(NVVM::NVVMDialect::getKernelFuncAttrName()))
        return;
      // A register budget: without one ptxas may trade spills for
      // occupancy on its own (48 registers and a 4-byte spill for AdamW on
      // sm_90 instead of 56 and none).
      // A kernel flashopt-to-gpu gave a cap of its own keeps it.
      int64_t cap = maxRegisters;
      if (auto own = fn->getAttrOfType<IntegerAttr>(kMaxRegistersAttrName)) {
        cap = own.getInt();
        fn->removeAttr(kMaxRegistersAttrName);
      }
      if (cap > 0)
        fn->setAttr(NVVM::NVVMDialect::getMaxnregAttrName(),
                    IntegerAttr::get(IntegerType::get(ctx, 32), cap));
      if (ftz)
        fn.setDenormalFpMathF32Attr(StringAttr::get(ctx, "preserve-sign"));
    });
  }
};

} // namespace
