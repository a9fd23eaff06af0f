//===- RawMemoryToLLVM.cpp - flashopt.raw_* to LLVM ------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/Conversion/RawMemoryToLLVM.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Conversion/LLVMCommon/Pattern.h"
#include "mlir/Conversion/LLVMCommon/TypeConverter.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

using namespace mlir;
using namespace mlir::flashopt;

namespace {

/// Computes the element pointer `base + index * sizeof(elementType)`.
Value elementPointer(ConversionPatternRewriter &rw, Location loc, Value base,
                     Value index, Type elementType, unsigned addressSpace) {
  auto ptrType = LLVM::LLVMPointerType::get(rw.getContext(), addressSpace);
  Value ptr = LLVM::IntToPtrOp::create(rw, loc, ptrType, base);
  return LLVM::GEPOp::create(rw, loc, ptrType, elementType, ptr,
                             ArrayRef<LLVM::GEPArg>{index},
                             LLVM::GEPNoWrapFlags::inbounds);
}

Type scalarTypeOf(Type t) {
  if (auto v = dyn_cast<VectorType>(t))
    return v.getElementType();
  return t;
}

/// The type memory is accessed as: bf16 becomes i16 when `bf16AsInt` (the
/// host, where LLVM would otherwise legalize bf16 vectors through libcalls).
Type memoryTypeOf(Type t, bool bf16AsInt) {
  if (!bf16AsInt || !scalarTypeOf(t).isBF16())
    return t;
  Type i16 = IntegerType::get(t.getContext(), 16);
  if (auto v = dyn_cast<VectorType>(t))
    return VectorType::get(v.getShape(), i16);
  return i16;
}

struct RawLoadLowering : ConvertOpToLLVMPattern<RawLoadOp> {
  RawLoadLowering(const LLVMTypeConverter &c, unsigned as, bool bf16AsInt)
      : ConvertOpToLLVMPattern<RawLoadOp>(c), addressSpace(as),
        bf16AsInt(bf16AsInt) {}

  LogicalResult
  matchAndRewrite(RawLoadOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Type resultType = getTypeConverter()->convertType(op.getType());
    Type memType =
        getTypeConverter()->convertType(memoryTypeOf(op.getType(), bf16AsInt));
    Type elemType = scalarTypeOf(memType);
    if (!resultType || !memType)
      return rw.notifyMatchFailure(op, "unsupported type");
    Value ptr = elementPointer(rw, loc, adaptor.getBase(), adaptor.getIndex(),
                               elemType, addressSpace);
    unsigned align = op.getAlignment();
    Value loaded;
    if (!adaptor.getMask()) {
      loaded = LLVM::LoadOp::create(rw, loc, memType, ptr, align);
    } else {
      Value zero = LLVM::ZeroOp::create(rw, loc, memType);
      loaded = LLVM::MaskedLoadOp::create(rw, loc, memType, ptr,
                                          adaptor.getMask(), zero,
                                          rw.getI32IntegerAttr(align),
                                          UnitAttr());
    }
    if (memType != resultType)
      loaded = LLVM::BitcastOp::create(rw, loc, resultType, loaded);
    rw.replaceOp(op, loaded);
    return success();
  }

  unsigned addressSpace;
  bool bf16AsInt;
};

struct RawStoreLowering : ConvertOpToLLVMPattern<RawStoreOp> {
  RawStoreLowering(const LLVMTypeConverter &c, unsigned as, bool bf16AsInt)
      : ConvertOpToLLVMPattern<RawStoreOp>(c), addressSpace(as),
        bf16AsInt(bf16AsInt) {}

  LogicalResult
  matchAndRewrite(RawStoreOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Type memType = getTypeConverter()->convertType(
        memoryTypeOf(op.getValue().getType(), bf16AsInt));
    if (!memType)
      return rw.notifyMatchFailure(op, "unsupported type");
    Type elemType = scalarTypeOf(memType);
    Value ptr = elementPointer(rw, loc, adaptor.getBase(), adaptor.getIndex(),
                               elemType, addressSpace);
    unsigned align = op.getAlignment();
    Value value = adaptor.getValue();
    if (value.getType() != memType)
      value = LLVM::BitcastOp::create(rw, loc, memType, value);
    if (!adaptor.getMask()) {
      rw.replaceOpWithNewOp<LLVM::StoreOp>(op, value, ptr, align);
      return success();
    }
    rw.replaceOpWithNewOp<LLVM::MaskedStoreOp>(op, value, ptr,
                                               adaptor.getMask(),
                                               rw.getI32IntegerAttr(align));
    return success();
  }

  unsigned addressSpace;
  bool bf16AsInt;
};

} // namespace

void mlir::flashopt::populateRawMemoryToLLVMPatterns(
    const LLVMTypeConverter &converter, RewritePatternSet &patterns,
    unsigned addressSpace, bool bf16AsInt) {
  patterns.add<RawLoadLowering, RawStoreLowering>(converter, addressSpace,
                                                  bf16AsInt);
}
