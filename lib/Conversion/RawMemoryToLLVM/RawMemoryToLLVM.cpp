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
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/Hashing.h"
#include "llvm/Support/Format.h"

#include <cmath>

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

/// `lane` applied to the operands lane by lane (extract, compute, insert)
/// into a value of `resultType`, or to the operands themselves when they
/// are scalars.
Value perLane(ConversionPatternRewriter &rw, Location loc, Type resultType,
              ValueRange operands,
              llvm::function_ref<Value(ValueRange)> lane) {
  auto vt = dyn_cast<VectorType>(operands.front().getType());
  if (!vt)
    return lane(operands);
  Type i32 = rw.getI32Type();
  Value out = LLVM::PoisonOp::create(rw, loc, resultType);
  for (int64_t i = 0; i < vt.getNumElements(); ++i) {
    Value pos = LLVM::ConstantOp::create(rw, loc, i32,
                                         rw.getI32IntegerAttr(int32_t(i)));
    SmallVector<Value> args;
    for (Value v : operands)
      args.push_back(LLVM::ExtractElementOp::create(rw, loc, v, pos));
    out = LLVM::InsertElementOp::create(rw, loc, out, lane(args), pos);
  }
  return out;
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

/// `flashopt.table_lookup` → a constant global array (one per distinct
/// table, in the enclosing module, in `addressSpace`) and, per lane, an
/// invariant load of the entry the zero-extended code selects (on NVPTX an
/// `ld.global.nc`, through the read-only cache); on the host (address space
/// 0) a vector of codes is one masked gather with every lane on.
struct TableLookupLowering : ConvertOpToLLVMPattern<TableLookupOp> {
  TableLookupLowering(const LLVMTypeConverter &c, unsigned as)
      : ConvertOpToLLVMPattern<TableLookupOp>(c), addressSpace(as) {}

  LogicalResult
  matchAndRewrite(TableLookupOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Operation *symbols = op->getParentWithTrait<OpTrait::SymbolTable>();
    auto table = dyn_cast<DenseElementsAttr>(op.getTable());
    if (!symbols || !table)
      return rw.notifyMatchFailure(op, "no symbol table or no dense table");
    Type f32 = rw.getF32Type();
    int64_t n = table.getNumElements();
    auto arrayType = LLVM::LLVMArrayType::get(f32, unsigned(n));
    // One global per table contents.
    ArrayRef<char> raw = table.getRawData();
    std::string name;
    {
      llvm::raw_string_ostream os(name);
      os << "__flashopt_table_"
         << llvm::format_hex_no_prefix(
                uint64_t(llvm::hash_combine_range(raw.begin(), raw.end())), 16);
    }
    auto global = dyn_cast_or_null<LLVM::GlobalOp>(
        SymbolTable::lookupSymbolIn(symbols, name));
    if (!global) {
      OpBuilder::InsertionGuard guard(rw);
      rw.setInsertionPointToStart(&symbols->getRegion(0).front());
      global = LLVM::GlobalOp::create(rw, loc, arrayType, /*isConstant=*/true,
                                      LLVM::Linkage::Internal, name, table,
                                      /*alignment=*/16, addressSpace);
    }
    Value base = LLVM::AddressOfOp::create(rw, loc, global);
    auto ptrType = LLVM::LLVMPointerType::get(rw.getContext(), addressSpace);
    Type i32 = rw.getI32Type();
    auto read = [&](Value code) -> Value {
      Value idx = LLVM::ZExtOp::create(rw, loc, i32, code);
      Value ptr = LLVM::GEPOp::create(rw, loc, ptrType, f32, base,
                                      ArrayRef<LLVM::GEPArg>{idx},
                                      LLVM::GEPNoWrapFlags::inbounds);
      return LLVM::LoadOp::create(rw, loc, f32, ptr, /*alignment=*/4,
                                  /*isVolatile=*/false, /*isNonTemporal=*/false,
                                  /*isInvariant=*/true);
    };
    Value index = adaptor.getIndex();
    auto vt = dyn_cast<VectorType>(index.getType());
    if (!vt) {
      rw.replaceOp(op, read(index));
      return success();
    }
    Type resultType = getTypeConverter()->convertType(op.getType());
    if (addressSpace == 0) {
      // The host: one gather (vpgatherdd on AVX2/AVX-512, scalarized by
      // LLVM elsewhere).
      int64_t lanes = vt.getNumElements();
      Value idx = LLVM::ZExtOp::create(rw, loc, VectorType::get({lanes}, i32),
                                       index);
      auto ptrsType = VectorType::get({lanes}, ptrType);
      Value ptrs = LLVM::GEPOp::create(rw, loc, ptrsType, f32, base,
                                       ArrayRef<LLVM::GEPArg>{idx},
                                       LLVM::GEPNoWrapFlags::inbounds);
      Value all = LLVM::ConstantOp::create(
          rw, loc, VectorType::get({lanes}, rw.getI1Type()),
          DenseElementsAttr::get(VectorType::get({lanes}, rw.getI1Type()),
                                 true));
      Value none = LLVM::PoisonOp::create(rw, loc, resultType);
      rw.replaceOp(op, LLVM::masked_gather::create(
                           rw, loc, resultType, ptrs, all, ValueRange{none},
                           rw.getI32IntegerAttr(4)));
      return success();
    }
    rw.replaceOp(op, perLane(rw, loc, resultType, index,
                             [&](ValueRange c) { return read(c[0]); }));
    return success();
  }

  unsigned addressSpace;
};

/// `flashopt.rcp_approx` / `flashopt.sqrt_approx`: on NVPTX (address space
/// 1) one `rcp.approx.ftz.f32` / `sqrt.approx.ftz.f32` per lane (MUFU.RCP,
/// MUFU.SQRT); on the host the IEEE division and square root, which meet
/// the ops' error bounds.
template <typename ApproxOp, bool IsRcp>
struct ApproxLowering : ConvertOpToLLVMPattern<ApproxOp> {
  ApproxLowering(const LLVMTypeConverter &c, unsigned as)
      : ConvertOpToLLVMPattern<ApproxOp>(c), addressSpace(as) {}

  LogicalResult
  matchAndRewrite(ApproxOp op, typename ApproxOp::Adaptor adaptor,
                  ConversionPatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Value x = adaptor.getX();
    Type type = x.getType();
    if (addressSpace != 1) {
      if (!IsRcp) {
        rw.replaceOp(op, LLVM::SqrtOp::create(rw, loc, x));
        return success();
      }
      Attribute one = rw.getF32FloatAttr(1.0f);
      if (auto vt = dyn_cast<VectorType>(type))
        one = DenseElementsAttr::get(vt, rw.getF32FloatAttr(1.0f));
      Value c = LLVM::ConstantOp::create(rw, loc, type, cast<TypedAttr>(one));
      rw.replaceOp(op, LLVM::FDivOp::create(rw, loc, c, x));
      return success();
    }
    StringRef name = IsRcp ? "llvm.nvvm.rcp.approx.ftz.f" : "llvm.nvvm.sqrt.approx.ftz.f";
    Type f32 = rw.getF32Type();
    auto one = [&](Value v) -> Value {
      return LLVM::CallIntrinsicOp::create(rw, loc, f32,
                                           rw.getStringAttr(name), ValueRange{v})
          .getResult(0);
    };
    rw.replaceOp(op, perLane(rw, loc, type, x,
                             [&](ValueRange v) { return one(v[0]); }));
    return success();
  }

  unsigned addressSpace;
};

/// `flashopt.add_round_down`: on NVPTX one `add.rm.f32` per lane (FADD.RM);
/// on the host the round-to-nearest sum s and its exact error e (TwoSum),
/// then the float below s where e < 0, -0 for an exact zero sum of anything
/// but two +0, and the largest finite value for a finite overflow to +inf.
struct AddRoundDownLowering : ConvertOpToLLVMPattern<AddRoundDownOp> {
  AddRoundDownLowering(const LLVMTypeConverter &c, unsigned as)
      : ConvertOpToLLVMPattern<AddRoundDownOp>(c), addressSpace(as) {}

  LogicalResult
  matchAndRewrite(AddRoundDownOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Value x = adaptor.getX(), y = adaptor.getY();
    Type type = x.getType();
    auto vt = dyn_cast<VectorType>(type);
    Type i32 = rw.getI32Type();
    if (addressSpace == 1) {
      rw.replaceOp(op, perLane(rw, loc, type, {x, y}, [&](ValueRange v) {
        return LLVM::CallIntrinsicOp::create(
                   rw, loc, rw.getF32Type(),
                   rw.getStringAttr("llvm.nvvm.add.rm.f"), v)
            .getResult(0);
      }));
      return success();
    }
    Type itype = vt ? Type(VectorType::get(vt.getShape(), i32)) : i32;
    auto cst = [&](Type t, Attribute scalar) -> Value {
      Attribute a = scalar;
      if (auto v = dyn_cast<VectorType>(t))
        a = DenseElementsAttr::get(v, scalar);
      return LLVM::ConstantOp::create(rw, loc, t, cast<TypedAttr>(a));
    };
    auto ci = [&](uint32_t v) {
      return cst(itype, rw.getI32IntegerAttr(int32_t(v)));
    };
    auto cf = [&](float v) { return cst(type, rw.getF32FloatAttr(v)); };
    auto fcmp = [&](LLVM::FCmpPredicate p, Value a, Value b) {
      return LLVM::FCmpOp::create(rw, loc, p, a, b).getResult();
    };
    auto select = [&](Value c, Value a, Value b) {
      return LLVM::SelectOp::create(rw, loc, c, a, b).getResult();
    };
    auto bits = [&](Value v) {
      return LLVM::BitcastOp::create(rw, loc, itype, v).getResult();
    };
    auto fromBits = [&](Value v) {
      return LLVM::BitcastOp::create(rw, loc, type, v).getResult();
    };
    Value s = LLVM::FAddOp::create(rw, loc, x, y);
    Value bb = LLVM::FSubOp::create(rw, loc, s, x);
    Value e = LLVM::FAddOp::create(
        rw, loc,
        LLVM::FSubOp::create(rw, loc, x, LLVM::FSubOp::create(rw, loc, s, bb)),
        LLVM::FSubOp::create(rw, loc, y, bb));
    // The float below s: one step of its bit pattern toward -inf.
    Value sb = bits(s);
    Value below = select(
        fcmp(LLVM::FCmpPredicate::ogt, s, cf(0.0f)),
        LLVM::SubOp::create(rw, loc, sb, ci(1)),
        select(fcmp(LLVM::FCmpPredicate::olt, s, cf(0.0f)),
               LLVM::AddOp::create(rw, loc, sb, ci(1)), ci(0x80000001u)));
    Value r = select(fcmp(LLVM::FCmpPredicate::olt, e, cf(0.0f)), below, sb);
    Value bothPlusZero = LLVM::ICmpOp::create(
        rw, loc, LLVM::ICmpPredicate::eq,
        LLVM::OrOp::create(rw, loc, bits(x), bits(y)), ci(0));
    Value exactZero =
        LLVM::AndOp::create(rw, loc, fcmp(LLVM::FCmpPredicate::oeq, s, cf(0.0f)),
                            fcmp(LLVM::FCmpPredicate::oeq, e, cf(0.0f)));
    r = select(exactZero, select(bothPlusZero, ci(0), ci(0x80000000u)), r);
    Value finite = LLVM::AndOp::create(
        rw, loc,
        fcmp(LLVM::FCmpPredicate::olt, LLVM::FAbsOp::create(rw, loc, x),
             cf(INFINITY)),
        fcmp(LLVM::FCmpPredicate::olt, LLVM::FAbsOp::create(rw, loc, y),
             cf(INFINITY)));
    Value overflow = LLVM::AndOp::create(
        rw, loc, finite, fcmp(LLVM::FCmpPredicate::oeq, s, cf(INFINITY)));
    r = select(overflow, ci(0x7F7FFFFFu), r);
    rw.replaceOp(op, fromBits(r));
    return success();
  }

  unsigned addressSpace;
};

} // namespace

void mlir::flashopt::populateRawMemoryToLLVMPatterns(
    const LLVMTypeConverter &converter, RewritePatternSet &patterns,
    unsigned addressSpace, bool bf16AsInt) {
  patterns.add<RawLoadLowering, RawStoreLowering>(converter, addressSpace,
                                                  bf16AsInt);
  patterns.add<TableLookupLowering>(converter, addressSpace);
  patterns.add<ApproxLowering<RcpApproxOp, true>,
               ApproxLowering<SqrtApproxOp, false>, AddRoundDownLowering>(
      converter, addressSpace);
}
