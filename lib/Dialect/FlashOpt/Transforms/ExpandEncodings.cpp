//===- ExpandEncodings.cpp - flashopt-expand-encodings ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Turns `flashopt.optimizer` into target-neutral `flashopt.kernel` IR:
/// decode → rule → encode per element, with group reductions as
/// `flashopt.group_max`. The master weight's formulas are here
/// (docs/NUMERICS.md §1, in the same order of roundings); every state is
/// decoded and encoded by its StateEncodingAttrInterface (StateEncodings.cpp),
/// so this pass knows no state encoding by name.
///
//===----------------------------------------------------------------------===//

#include "flashopt/abi/KernelAbi.h"
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTEXPANDENCODINGS
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

/// Emits the arithmetic of the master-weight encoding at one insertion point.
class EncodingEmitter {
public:
  EncodingEmitter(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  Value f32(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value i32(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(v));
  }
  Value i16(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI16IntegerAttr(v));
  }

  /// f32(x) for a narrow float, x for f32.
  Value widen(Value x) { return emitWidenToF32(b, loc, x); }

  /// RTNE narrowing of an f32 to `type` (identity for f32).
  Value narrow(Value x, Type type) {
    return emitNarrowFromF32(b, loc, x, type);
  }

  /// 2^k for an i32 k in [-126, 127], built from its bits (exact).
  Value pow2(Value k) {
    Value biased = arith::AddIOp::create(b, loc, k, i32(127));
    Value bits = arith::ShLIOp::create(b, loc, biased, i32(23));
    return arith::BitcastOp::create(b, loc, b.getF32Type(), bits);
  }

  /// The scale exponent ℓ (i32) of a narrow value: 2^ℓ = ULP/2.
  Value scaleExponent(Value narrowValue) {
    Type p = narrowValue.getType();
    int64_t mant = p.isBF16() ? 7 : 10;
    int64_t bias = p.isBF16() ? 127 : 15;
    Value bits = arith::BitcastOp::create(b, loc, b.getI16Type(), narrowValue);
    Value mag = arith::AndIOp::create(b, loc, bits, i16(0x7FFF));
    Value field16 = arith::ShRUIOp::create(b, loc, mag, i16(mant));
    Value field = arith::ExtUIOp::create(b, loc, b.getI32Type(), field16);
    Value isZero = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                         field, i32(0));
    // E = F == 0 ? 1 - bias : F - bias;  ℓ = E - mant - 1.
    Value normal = arith::SubIOp::create(b, loc, field, i32(bias + mant + 1));
    Value subnormal = i32(1 - bias - mant - 1);
    return arith::SelectOp::create(b, loc, isZero, subnormal, normal);
  }

  /// (x * 2^h) * 2^(k - h) with h = k >> 1: exact scaling by 2^k.
  Value scaleByPow2(Value x, Value k) {
    Value h = arith::ShRSIOp::create(b, loc, k, i32(1));
    Value rest = arith::SubIOp::create(b, loc, k, h);
    Value first = arith::MulFOp::create(b, loc, x, pow2(h));
    return arith::MulFOp::create(b, loc, first, pow2(rest));
  }

  /// 2^(F' - 127) with F' the exponent field of a bf16 or f16 value clamped
  /// to [1, 254] (bf16) or [1, 31] (f16), as an f32 built from bits: the
  /// field moved to the f32 exponent's place, so no shift back and forth
  /// through a small integer (docs/NUMERICS.md §1, "in fewer operations").
  Value fieldPow2(Value narrowValue) {
    Type p = narrowValue.getType();
    bool bf = p.isBF16();
    Value at23;
    if (bf) {
      // F << 23 is the exponent field of f32(θ') (a bf16 widens by a 16-bit
      // shift; a NaN's quieting touches only the significand): one AND on
      // the widened value the decode and encode compute anyway.
      Value wide = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                            widen(narrowValue));
      at23 = arith::AndIOp::create(b, loc, wide, i32(0x7F800000));
    } else {
      Value bits16 =
          arith::BitcastOp::create(b, loc, b.getI16Type(), narrowValue);
      Value bits = arith::ExtUIOp::create(b, loc, b.getI32Type(), bits16);
      // F << 23: f16's field is bits 10..14.
      Value field = arith::AndIOp::create(b, loc, bits, i32(0x7C00));
      at23 = arith::ShLIOp::create(b, loc, field, i32(13));
    }
    Value lo = arith::MaxUIOp::create(b, loc, at23, i32(1 << 23));
    Value f = bf ? arith::MinUIOp::create(b, loc, lo, i32(254 << 23)).getResult()
                 : lo;
    return arith::BitcastOp::create(b, loc, b.getF32Type(), f);
  }

  /// Decode (θ', ρ) → θ (docs/NUMERICS.md §1).
  Value decodeMaster(Value narrowValue, Value rho) {
    int64_t n = rho.getType().getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value r = widen(narrowValue);
    Value rhoF = arith::SIToFPOp::create(b, loc, b.getF32Type(), rho);
    Value c = arith::DivFOp::create(b, loc, rhoF, f32(n));
    // e = c * 2^ℓ, ℓ = F' - 135 for bf16: (c * 2^-8) * 2^(F' - 127), the
    // first step exact, so the same bits as §1's two-step scaling (proof
    // there); c * 2^-8 is a function of the code alone (a GPU table folds
    // it in). f16 keeps §1's form: the one-step one made adamw_f16_m24 spill
    // 4 bytes on sm_100 (ptxas 13, 64 registers).
    Value e;
    if (narrowValue.getType().isBF16()) {
      Value c8 = arith::MulFOp::create(b, loc, c, f32(1.0 / 256.0));
      e = arith::MulFOp::create(b, loc, c8, fieldPow2(narrowValue));
    } else {
      e = scaleByPow2(c, scaleExponent(narrowValue));
    }
    return arith::AddFOp::create(b, loc, r, e);
  }

  /// Encode θ → (θ', ρ) (docs/NUMERICS.md §1).
  std::pair<Value, Value> encodeMaster(Value theta, Type paramType,
                                       Type corrType) {
    int64_t n = corrType.getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value narrowValue = narrow(theta, paramType);
    Value r = widen(narrowValue);
    Value e = arith::SubFOp::create(b, loc, theta, r);
    // en = e * 2^-ℓ, exact: bf16 (e * 2^(128 - F')) * 2^7, f16
    // e * 2^(26 - F') (docs/NUMERICS.md §1). 2^(128 - F') is
    // 0x7F800000 - (F' << 23) in bits; 2^(26 - F') is (153 - F') << 23.
    // bf16: s = clamp(en, -1, 1) * N as clamp(en * N, -N, N), folding the
    // 2^7 into the N: the same bits, en being exact (|en| <= 1: the same
    // single rounding; beyond: ±N either way; NaN stays NaN). f16 keeps
    // §1's order (the other measured +0.1-0.5 SASS per element).
    Value s;
    if (paramType.isBF16()) {
      Value f = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                         fieldPow2(narrowValue));
      Value inv = arith::SubIOp::create(b, loc, i32(0x7F800000), f);
      Value scale = arith::BitcastOp::create(b, loc, b.getF32Type(), inv);
      Value scaled = arith::MulFOp::create(b, loc, e, scale);
      Value sN = arith::MulFOp::create(b, loc, scaled, f32(128.0 * double(n)));
      Value lo = arith::MaximumFOp::create(b, loc, sN, f32(-double(n)));
      s = arith::MinimumFOp::create(b, loc, lo, f32(n));
    } else {
      Value f = arith::BitcastOp::create(b, loc, b.getI32Type(),
                                         fieldPow2(narrowValue));
      Value inv = arith::SubIOp::create(b, loc, i32(153 << 23), f);
      Value en = arith::MulFOp::create(
          b, loc, e, arith::BitcastOp::create(b, loc, b.getF32Type(), inv));
      Value lo = arith::MaximumFOp::create(b, loc, en, f32(-1.0));
      Value ec = arith::MinimumFOp::create(b, loc, lo, f32(1.0));
      s = arith::MulFOp::create(b, loc, ec, f32(n));
    }
    // Round half away from zero, copysign(floor(|s| + 0.5), s), as
    // s + copysign(0.5, s) and the conversion's truncation: the same
    // rounded sum, mirrored for s < 0 (round to nearest even is symmetric),
    // and trunc = floor on |.| (docs/NUMERICS.md §1). Two operations fewer.
    Value half = math::CopySignOp::create(b, loc, f32(0.5), s);
    Value plusHalf = arith::AddFOp::create(b, loc, s, half);
    Value isNan = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, s, s);
    Value rhoF = arith::SelectOp::create(b, loc, isNan, f32(0.0), plusHalf);
    Value rho = arith::FPToSIOp::create(b, loc, corrType, rhoF);
    return {narrowValue, rho};
  }

private:
  OpBuilder &b;
  Location loc;
};

/// Builds the kernel buffers of an optimizer, and remembers where each
/// input lives.
struct BufferPlan {
  SmallVector<Attribute> buffers;
  int64_t param = -1, correction = -1, grad = -1;
  /// The gradient accumulator's buffers (-1 without one).
  int64_t accum = -1, accumCorrection = -1;
  /// Per state: its kernel buffers, in the order of its encoding's
  /// getBuffers() (none for an encoding that stores nothing).
  SmallVector<SmallVector<int64_t, 2>> states;
  int64_t groupSize = 32;

  int64_t add(MLIRContext *ctx, StringRef name, Type type, BufferRate rate,
              BufferAccess access) {
    buffers.push_back(BufferAttr::get(ctx, name, type, rate, access));
    return buffers.size() - 1;
  }
};

BufferPlan planBuffers(OptimizerOp op) {
  MLIRContext *ctx = op.getContext();
  BufferPlan plan;
  MasterAttr master = op.getParam();
  plan.param = plan.add(ctx, "param", master.getParamType(),
                        BufferRate::element, BufferAccess::readwrite);
  if (master.hasCorrection())
    plan.correction = plan.add(ctx, "correction", master.getCorrection(),
                               BufferRate::element, BufferAccess::readwrite);
  plan.grad = plan.add(ctx, "grad", op.getGrad(), BufferRate::element,
                       BufferAccess::read);
  // The accumulator comes right after the gradient (abi::implied_buffers).
  if (MasterAttr acc = op.getAccumulateAttr()) {
    plan.accum = plan.add(ctx, "accum", acc.getParamType(),
                          BufferRate::element, BufferAccess::readwrite);
    if (acc.hasCorrection())
      plan.accumCorrection =
          plan.add(ctx, "accum_correction", acc.getCorrection(),
                   BufferRate::element, BufferAccess::readwrite);
  }
  for (StateOp state : getStates(op)) {
    StateEncodingAttrInterface encoding = state.getEncoding();
    if (std::optional<int64_t> group = encoding.getGroupSize())
      plan.groupSize = *group;
    SmallVector<int64_t, 2> &indices = plan.states.emplace_back();
    for (const EncodingBuffer &buffer : encoding.getBuffers())
      indices.push_back(plan.add(ctx, (state.getName() + buffer.suffix).str(),
                                 buffer.storage, buffer.rate,
                                 BufferAccess::readwrite));
  }
  return plan;
}

/// The type a kernel loads and stores for a buffer type: arith works on
/// signless integers, so ui8 codes are accessed as i8.
Type accessType(Type t) {
  if (auto it = dyn_cast<IntegerType>(t))
    if (!it.isSignless())
      return IntegerType::get(t.getContext(), it.getWidth());
  return t;
}

/// Every float a kernel stores is made canonical when it is a NaN: all
/// ones but the sign (0x7FFFFFFF for f32, 0x7FFF for bf16 and f16), the NaN
/// NVIDIA GPUs produce. Both back ends then store the same bits for every
/// NaN, whatever payload the CPU's arithmetic or conversions would give
/// (docs/NUMERICS.md §5). The NaN test is one unordered compare on the f32
/// value stored or rounded to 16 bits (a 16-bit rounding is a NaN exactly
/// when its f32 operand is: overflow gives infinity), which the CPU's
/// expansion of the rounding shares; other 16-bit values are tested in
/// integers: |bits| > the exponent mask.
void canonicalizeStoredNaNs(GroupBodyOp body) {
  SmallVector<Operation *> stores;
  body.walk([&](Operation *op) {
    if (isa<StoreElementOp, StoreGroupOp>(op) &&
        isa<FloatType>(op->getOperand(0).getType()))
      stores.push_back(op);
  });
  for (Operation *store : stores) {
    OpBuilder b(store);
    Location loc = store->getLoc();
    Value v = store->getOperand(0);
    auto ft = cast<FloatType>(v.getType());
    unsigned w = ft.getWidth();
    Type it = b.getIntegerType(w);
    uint64_t expMask = ft.isF32() ? 0x7F800000u : ft.isBF16() ? 0x7F80u : 0x7C00u;
    uint64_t magMask = w == 32 ? 0x7FFFFFFFu : 0x7FFFu;
    auto cst = [&](uint64_t x) {
      return arith::ConstantOp::create(b, loc, it, b.getIntegerAttr(it, x))
          .getResult();
    };
    Value bits = arith::BitcastOp::create(b, loc, it, v);
    Value wide = v;
    if (auto trunc = v.getDefiningOp<arith::TruncFOp>())
      wide = trunc.getIn();
    Value isNaN;
    if (wide.getType().isF32()) {
      isNaN = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, wide,
                                    wide);
    } else {
      Value mag = arith::AndIOp::create(b, loc, bits, cst(magMask));
      isNaN = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt, mag,
                                    cst(expMask));
    }
    Value canon = arith::SelectOp::create(b, loc, isNaN, cst(magMask), bits);
    store->setOperand(0, arith::BitcastOp::create(b, loc, ft, canon));
  }
}

/// The discardable attribute of an optimizer that selects which of its
/// kernels this pass makes (docs/KERNEL-ABI.md "Gradient accumulation"):
/// "step" (the default), "accumulate", "step_accumulated", "step_fused".
constexpr llvm::StringLiteral kKernelKindAttr = "flashopt.kernel_kind";

LogicalResult expandOptimizer(OptimizerOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  MLIRContext *ctx = op.getContext();
  BufferPlan plan = planBuffers(op);

  using ::flashopt::abi::KernelKind;
  KernelKind kind = KernelKind::Step;
  if (Attribute a = op->getDiscardableAttr(kKernelKindAttr)) {
    auto s = dyn_cast<StringAttr>(a);
    if (!s || !::flashopt::abi::parse_kernel_kind(s.getValue(), kind))
      return op.emitOpError()
             << "'" << kKernelKindAttr
             << "' must be one of \"step\", \"accumulate\", "
                "\"step_accumulated\", \"step_fused\", got "
             << a;
    op->removeDiscardableAttr(kKernelKindAttr);
  }
  std::optional<Numerics> numericsOr = getNumerics(op);
  if (!numericsOr)
    return op.emitOpError() << "'" << kNumericsAttr
                            << "' must be \"bounded\" or \"flashoptim\"";
  Numerics numerics = *numericsOr;
  MasterAttr accumulator = op.getAccumulateAttr();
  if (kind != KernelKind::Step && !accumulator)
    return op.emitOpError()
           << "has no accumulator (accumulate(...)), so it has no "
           << ::flashopt::abi::kernel_kind_name(kind) << " kernel";
  std::string kernelName =
      (op.getSymName() + ::flashopt::abi::kernel_kind_suffix(kind)).str();

  SmallVector<Attribute> hyperNames;
  for (HyperOp h : getHypers(op)) {
    if (h.getName() == ::flashopt::abi::kGradScaleHyper)
      return h.emitOpError()
             << "declares \"" << ::flashopt::abi::kGradScaleHyper
             << "\", which every kernel gets after the rule's hyper-parameters "
                "(the scale of the gradient); use another name";
    hyperNames.push_back(StringAttr::get(ctx, h.getName()));
  }
  // The gradient's scale, last (docs/KERNEL-ABI.md).
  hyperNames.push_back(StringAttr::get(ctx, ::flashopt::abi::kGradScaleHyper));

  auto kernel = KernelOp::create(b, loc, kernelName, plan.groupSize,
                                 b.getArrayAttr(plan.buffers),
                                 b.getArrayAttr(hyperNames));
  // Keep the optimizer's own discardable attributes (e.g. spec metadata).
  for (NamedAttribute attr : op->getDiscardableAttrs())
    kernel->setAttr(attr.getName(), attr.getValue());
  if (kind != KernelKind::Step)
    kernel->setAttr(kKernelKindAttr,
                    b.getStringAttr(::flashopt::abi::kernel_kind_name(kind)));
  Block *kernelBlock = new Block();
  kernel.getBody().push_back(kernelBlock);

  IRMapping mapping;
  OpBuilder kb = OpBuilder::atBlockEnd(kernelBlock);
  UpdateOp update = getUpdate(op);
  // The accumulate kernel reads no hyper-parameter: it has no prologue (it
  // still has every hyper-parameter column, as all kernels share one table).
  if (kind != KernelKind::Accumulate)
    for (Operation &inner : op.getBody().front()) {
      if (isa<StateOp, UpdateOp>(inner))
        continue;
      kb.clone(inner, mapping);
    }
  Value gradScale =
      HyperOp::create(kb, loc, kb.getF32Type(),
                      kb.getStringAttr(::flashopt::abi::kGradScaleHyper),
                      kb.getF32FloatAttr(1.0f), EnvelopeAttr(), StringAttr())
          .getResult();

  auto body = GroupBodyOp::create(kb, loc);
  Block *bodyBlock = new Block();
  body.getBody().push_back(bodyBlock);
  OpBuilder gb = OpBuilder::atBlockEnd(bodyBlock);
  EncodingEmitter em(gb, loc);

  auto bufferAt = [&](int64_t buffer) {
    return cast<BufferAttr>(plan.buffers[buffer]);
  };
  auto load = [&](int64_t buffer) -> Value {
    Type t = accessType(bufferAt(buffer).getElementType());
    return LoadElementOp::create(gb, loc, t, buffer);
  };

  MasterAttr master = op.getParam();
  Type paramType = master.getParamType();

  // The accumulator's decode (f32: as is; bf16: widened; bf16 + i8: the
  // master-weight decode of docs/NUMERICS.md §1) and encode.
  auto decodeAccum = [&]() -> Value {
    Value a = load(plan.accum);
    return accumulator.hasCorrection()
               ? em.decodeMaster(a, load(plan.accumCorrection))
               : em.widen(a);
  };
  auto encodeAccum = [&](Value sum) -> std::pair<Value, Value> {
    Type t = accumulator.getParamType();
    if (accumulator.hasCorrection())
      return em.encodeMaster(sum, t, accumulator.getCorrection());
    return {t.isF32() ? sum : em.narrow(sum, t), Value()};
  };
  auto storeAccum = [&](std::pair<Value, Value> encoded) {
    StoreElementOp::create(gb, loc, plan.accum, encoded.first);
    if (encoded.second)
      StoreElementOp::create(gb, loc, plan.accumCorrection, encoded.second);
  };
  // decode(accum) + f32(grad), encoded (the accumulate kernel's result).
  auto accumulated = [&]() {
    // (Loads in a fixed order: the accumulator, then the gradient.)
    Value acc = decodeAccum();
    Value g = em.widen(load(plan.grad));
    Value sum = arith::AddFOp::create(gb, loc, acc, g);
    return encodeAccum(sum);
  };

  if (kind == KernelKind::Accumulate) {
    storeAccum(accumulated());
    canonicalizeStoredNaNs(body);
    op.erase();
    return success();
  }

  // Decode inputs.
  Value paramValue = load(plan.param);
  Value theta = master.hasCorrection()
                    ? em.decodeMaster(paramValue, load(plan.correction))
                    : em.widen(paramValue);
  // The gradient: the micro-batch's (step), the accumulator's
  // (step_accumulated), or the accumulator plus this micro-batch's after
  // the same encode → decode round trip the accumulate kernel's store and
  // the next load make (step_fused: bit-identical to accumulate, then
  // step_accumulated). Then times its scale (exact when the scale is 1).
  Value rawGrad;
  switch (kind) {
  case KernelKind::Step:
  case KernelKind::Accumulate:
    rawGrad = em.widen(load(plan.grad));
    break;
  case KernelKind::StepAccumulated:
    rawGrad = decodeAccum();
    break;
  case KernelKind::StepFused: {
    auto [a, rho] = accumulated();
    rawGrad = rho ? em.decodeMaster(a, rho) : em.widen(a);
    break;
  }
  }
  Value grad = arith::MulFOp::create(gb, loc, rawGrad, gradScale);
  // The accumulated steps leave the accumulator zeroed for the next round
  // (its bits all zero: +0, correction 0).
  if (kind == KernelKind::StepAccumulated || kind == KernelKind::StepFused) {
    Type t = accumulator.getParamType();
    Value zero = arith::ConstantOp::create(gb, loc, t, gb.getFloatAttr(t, 0.0));
    Value zeroCorr;
    if (accumulator.hasCorrection())
      zeroCorr = arith::ConstantOp::create(
          gb, loc, accumulator.getCorrection(),
          gb.getIntegerAttr(accumulator.getCorrection(), 0));
    storeAccum({zero, zeroCorr});
  }
  SmallVector<Value> decodedStates;
  SmallVector<StateOp> states = getStates(op);
  for (auto [state, buffers] : llvm::zip(states, plan.states)) {
    SmallVector<Value> loaded;
    for (int64_t buffer : buffers) {
      BufferAttr attr = bufferAt(buffer);
      loaded.push_back(attr.getRate() == BufferRate::group
                           ? LoadGroupOp::create(gb, loc, attr.getElementType(),
                                                 buffer)
                                 .getResult()
                           : load(buffer));
    }
    decodedStates.push_back(
        state.getEncoding().emitDecode(gb, loc, loaded));
  }

  // Inline the rule.
  Block &rule = update.getBody().front();
  mapping.map(rule.getArgument(0), theta);
  mapping.map(rule.getArgument(1), grad);
  for (auto [arg, value] :
       llvm::zip(rule.getArguments().drop_front(2), decodedStates))
    mapping.map(arg, value);
  // flashopt.bound: min(max(x, -limit), limit) in the bounded numerics, x
  // in FlashOptim's (docs/NUMERICS.md §8).
  for (Operation &inner : rule.without_terminator()) {
    auto bound = dyn_cast<BoundOp>(inner);
    if (!bound) {
      gb.clone(inner, mapping);
      continue;
    }
    Value x = mapping.lookupOrDefault(bound.getX());
    if (numerics == Numerics::Bounded) {
      Location l = bound.getLoc();
      Value limit = mapping.lookupOrDefault(bound.getLimit());
      Value low = arith::NegFOp::create(gb, l, limit);
      x = arith::MinimumFOp::create(
          gb, l, arith::MaximumFOp::create(gb, l, x, low), limit);
    }
    mapping.map(bound.getResult(), x);
  }
  auto yield = cast<YieldOp>(rule.getTerminator());
  SmallVector<Value> results = llvm::map_to_vector(
      yield.getValues(), [&](Value v) { return mapping.lookupOrDefault(v); });

  // Encode outputs.
  if (master.hasCorrection()) {
    auto [narrowValue, rho] =
        em.encodeMaster(results[0], paramType, master.getCorrection());
    StoreElementOp::create(gb, loc, plan.param, narrowValue);
    StoreElementOp::create(gb, loc, plan.correction, rho);
  } else {
    StoreElementOp::create(gb, loc, plan.param,
                           em.narrow(results[0], paramType));
  }
  // The bounded numerics round every state code with the element's dither
  // (docs/NUMERICS.md §8), each quantized state at its own phase (k times
  // DitherOp::kStatePhase for the k-th), so that one element's states do
  // not share their rounding errors.
  Value ditherStep;
  if (numerics == Numerics::Bounded &&
      llvm::any_of(states, [](StateOp st) {
        return isa<QuantAttr>(st.getEncoding());
      })) {
    for (Operation &p : *kernelBlock)
      if (auto sc = dyn_cast<StepCountOp>(p))
        ditherStep = sc.getResult();
    if (!ditherStep) {
      OpBuilder sb = OpBuilder::atBlockBegin(kernelBlock);
      ditherStep = StepCountOp::create(sb, loc, sb.getI64Type()).getResult();
    }
  }
  // Per-group values are stored before per-element ones (the order the
  // kernel IR has always had).
  int32_t quantized = 0;
  for (auto [i, state] : llvm::enumerate(states)) {
    int32_t phase = 0;
    if (isa<QuantAttr>(state.getEncoding()))
      phase = (quantized++ * DitherOp::kStatePhase) & 0x3FFF;
    SmallVector<Value> stored = state.getEncoding().emitEncode(
        gb, loc, results[i + 1], ditherStep, phase);
    ArrayRef<int64_t> buffers = plan.states[i];
    assert(stored.size() == buffers.size() &&
           "an encoding stores one value per buffer");
    for (BufferRate rate : {BufferRate::group, BufferRate::element}) {
      for (auto [buffer, value] : llvm::zip(buffers, stored)) {
        if (bufferAt(buffer).getRate() != rate)
          continue;
        if (rate == BufferRate::group)
          StoreGroupOp::create(gb, loc, buffer, value);
        else
          StoreElementOp::create(gb, loc, buffer, value);
      }
    }
  }

  canonicalizeStoredNaNs(body);
  op.erase();
  return success();
}

struct FlashOptExpandEncodingsPass
    : mlir::flashopt::impl::FlashOptExpandEncodingsBase<
          FlashOptExpandEncodingsPass> {
  void runOnOperation() override {
    SmallVector<OptimizerOp> optimizers;
    getOperation().walk([&](OptimizerOp op) { optimizers.push_back(op); });
    for (OptimizerOp op : optimizers)
      if (failed(expandOptimizer(op)))
        return signalPassFailure();
  }
};

} // namespace
