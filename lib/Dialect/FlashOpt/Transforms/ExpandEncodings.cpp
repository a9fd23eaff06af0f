//===- ExpandEncodings.cpp - flashopt-expand-encodings ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Turns `flashopt.optimizer` into target-neutral `flashopt.kernel` IR:
/// decode → rule → encode per element, with group reductions as
/// `flashopt.group_max`. Every formula here is docs/NUMERICS.md §1–§2, in
/// the same order of roundings.
///
//===----------------------------------------------------------------------===//

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

/// Emits the arithmetic of the encodings at one insertion point.
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
  Value widen(Value x) {
    if (x.getType().isF32())
      return x;
    return arith::ExtFOp::create(b, loc, b.getF32Type(), x);
  }

  /// RTNE narrowing of an f32 to `type` (identity for f32).
  Value narrow(Value x, Type type) {
    if (type.isF32())
      return x;
    return arith::TruncFOp::create(b, loc, type, x);
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

  /// Decode (θ', ρ) → θ (docs/NUMERICS.md §1).
  Value decodeMaster(Value narrowValue, Value rho) {
    int64_t n = rho.getType().getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value r = widen(narrowValue);
    Value ell = scaleExponent(narrowValue);
    Value rhoF = arith::SIToFPOp::create(b, loc, b.getF32Type(), rho);
    Value c = arith::DivFOp::create(b, loc, rhoF, f32(n));
    Value e = scaleByPow2(c, ell);
    return arith::AddFOp::create(b, loc, r, e);
  }

  /// Encode θ → (θ', ρ) (docs/NUMERICS.md §1).
  std::pair<Value, Value> encodeMaster(Value theta, Type paramType,
                                       Type corrType) {
    int64_t n = corrType.getIntOrFloatBitWidth() == 8 ? 127 : 32767;
    Value narrowValue = narrow(theta, paramType);
    Value r = widen(narrowValue);
    Value e = arith::SubFOp::create(b, loc, theta, r);
    Value ell = scaleExponent(narrowValue);
    Value a = arith::SubIOp::create(b, loc, i32(0), ell);
    Value en = scaleByPow2(e, a);
    Value lo = arith::MaximumFOp::create(b, loc, en, f32(-1.0));
    Value ec = arith::MinimumFOp::create(b, loc, lo, f32(1.0));
    Value s = arith::MulFOp::create(b, loc, ec, f32(n));
    Value absS = math::AbsFOp::create(b, loc, s);
    Value plusHalf = arith::AddFOp::create(b, loc, absS, f32(0.5));
    Value fl = math::FloorOp::create(b, loc, plusHalf);
    Value signed_ = math::CopySignOp::create(b, loc, fl, s);
    Value isNan = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, s, s);
    Value rhoF = arith::SelectOp::create(b, loc, isNan, f32(0.0), signed_);
    Value rho = arith::FPToSIOp::create(b, loc, corrType, rhoF);
    return {narrowValue, rho};
  }

  /// Dequantize one code (signless i8 holding i8 or ui8 bits).
  Value dequantize(Value code, Value scale, QuantAttr enc) {
    Value t0 = enc.isSigned()
                   ? arith::SIToFPOp::create(b, loc, b.getF32Type(), code)
                         .getResult()
                   : arith::UIToFPOp::create(b, loc, b.getF32Type(), code)
                         .getResult();
    Value t = arith::DivFOp::create(b, loc, t0, f32(enc.getMaxCode()));
    Value n = t;
    if (enc.getCompand() == Compander::softsign) {
      Value absT = math::AbsFOp::create(b, loc, t);
      Value den = arith::SubFOp::create(b, loc, f32(2.0), absT);
      n = arith::DivFOp::create(b, loc, t, den);
    }
    Value x = arith::MulFOp::create(b, loc, n, widen(scale));
    if (enc.getCompand() == Compander::sqrt)
      x = arith::MulFOp::create(b, loc, x, x);
    return x;
  }

  /// Quantize: returns (code as signless i8, scale in the scale type).
  std::pair<Value, Value> quantize(Value x, QuantAttr enc) {
    Value y = x;
    if (enc.getCompand() == Compander::sqrt)
      y = math::SqrtOp::create(b, loc, x);
    Value absY = math::AbsFOp::create(b, loc, y);
    Value amax = GroupMaxOp::create(b, loc, absY);
    Value a = arith::MaximumFOp::create(b, loc, amax, f32(1e-12));
    Value scale = narrow(a, enc.getScale());
    Value n = arith::DivFOp::create(b, loc, y, a);
    Value t = n;
    if (enc.getCompand() == Compander::softsign) {
      Value twoN = arith::MulFOp::create(b, loc, f32(2.0), n);
      Value absN = math::AbsFOp::create(b, loc, n);
      Value den = arith::AddFOp::create(b, loc, f32(1.0), absN);
      t = arith::DivFOp::create(b, loc, twoN, den);
    }
    double maxCode = enc.getMaxCode();
    Value scaled = arith::MulFOp::create(b, loc, t, f32(maxCode));
    Value half = arith::AddFOp::create(b, loc, scaled, f32(0.5));
    Value f = math::FloorOp::create(b, loc, half);
    Value lo = arith::MaximumFOp::create(b, loc, f,
                                         f32(enc.isSigned() ? -maxCode : 0.0));
    Value clamped = arith::MinimumFOp::create(b, loc, lo, f32(maxCode));
    Value isNan = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, f, f);
    Value q = arith::SelectOp::create(b, loc, isNan, f32(0.0), clamped);
    Type i8 = b.getI8Type();
    Value code = enc.isSigned()
                     ? arith::FPToSIOp::create(b, loc, i8, q).getResult()
                     : arith::FPToUIOp::create(b, loc, i8, q).getResult();
    return {code, scale};
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
  /// Per state: {codes, scales} for quantized, {plain, -1}, or {-1, -1}.
  SmallVector<std::pair<int64_t, int64_t>> states;
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
  for (StateOp state : getStates(op)) {
    std::string name = state.getName().str();
    if (auto q = dyn_cast<QuantAttr>(state.getEncoding())) {
      plan.groupSize = q.getGroup();
      int64_t codes = plan.add(ctx, name + ".codes", q.getStorage(),
                               BufferRate::element, BufferAccess::readwrite);
      int64_t scales = plan.add(ctx, name + ".scales", q.getScale(),
                                BufferRate::group, BufferAccess::readwrite);
      plan.states.push_back({codes, scales});
    } else if (auto p = dyn_cast<PlainAttr>(state.getEncoding())) {
      int64_t buf = plan.add(ctx, name, p.getStorage(), BufferRate::element,
                             BufferAccess::readwrite);
      plan.states.push_back({buf, -1});
    } else {
      plan.states.push_back({-1, -1});
    }
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

LogicalResult expandOptimizer(OptimizerOp op) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  MLIRContext *ctx = op.getContext();
  BufferPlan plan = planBuffers(op);

  SmallVector<Attribute> hyperNames;
  for (HyperOp h : getHypers(op))
    hyperNames.push_back(StringAttr::get(ctx, h.getName()));

  auto kernel = KernelOp::create(b, loc, op.getSymName(), plan.groupSize,
                                 b.getArrayAttr(plan.buffers),
                                 b.getArrayAttr(hyperNames));
  // Keep the optimizer's own discardable attributes (e.g. spec metadata).
  for (NamedAttribute attr : op->getDiscardableAttrs())
    kernel->setAttr(attr.getName(), attr.getValue());
  Block *kernelBlock = new Block();
  kernel.getBody().push_back(kernelBlock);

  IRMapping mapping;
  OpBuilder kb = OpBuilder::atBlockEnd(kernelBlock);
  UpdateOp update = getUpdate(op);
  for (Operation &inner : op.getBody().front()) {
    if (isa<StateOp, UpdateOp>(inner))
      continue;
    kb.clone(inner, mapping);
  }

  auto body = GroupBodyOp::create(kb, loc);
  Block *bodyBlock = new Block();
  body.getBody().push_back(bodyBlock);
  OpBuilder gb = OpBuilder::atBlockEnd(bodyBlock);
  EncodingEmitter em(gb, loc);

  auto load = [&](int64_t buffer) -> Value {
    Type t = accessType(cast<BufferAttr>(plan.buffers[buffer]).getElementType());
    return LoadElementOp::create(gb, loc, t, buffer);
  };

  MasterAttr master = op.getParam();
  Type paramType = master.getParamType();

  // Decode inputs.
  Value paramValue = load(plan.param);
  Value theta = master.hasCorrection()
                    ? em.decodeMaster(paramValue, load(plan.correction))
                    : em.widen(paramValue);
  Value grad = em.widen(load(plan.grad));
  SmallVector<Value> decodedStates;
  SmallVector<StateOp> states = getStates(op);
  for (auto [state, bufs] : llvm::zip(states, plan.states)) {
    if (auto q = dyn_cast<QuantAttr>(state.getEncoding())) {
      Value code = load(bufs.first);
      Value scale = LoadGroupOp::create(gb, loc, q.getScale(), bufs.second);
      decodedStates.push_back(em.dequantize(code, scale, q));
    } else if (isa<PlainAttr>(state.getEncoding())) {
      decodedStates.push_back(em.widen(load(bufs.first)));
    } else {
      decodedStates.push_back(em.f32(0.0));
    }
  }

  // Inline the rule.
  Block &rule = update.getBody().front();
  mapping.map(rule.getArgument(0), theta);
  mapping.map(rule.getArgument(1), grad);
  for (auto [arg, value] :
       llvm::zip(rule.getArguments().drop_front(2), decodedStates))
    mapping.map(arg, value);
  for (Operation &inner : rule.without_terminator())
    gb.clone(inner, mapping);
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
  for (auto [i, state] : llvm::enumerate(states)) {
    Value value = results[i + 1];
    auto bufs = plan.states[i];
    if (auto q = dyn_cast<QuantAttr>(state.getEncoding())) {
      auto [code, scale] = em.quantize(value, q);
      StoreGroupOp::create(gb, loc, bufs.second, scale);
      StoreElementOp::create(gb, loc, bufs.first, code);
    } else if (auto p = dyn_cast<PlainAttr>(state.getEncoding())) {
      StoreElementOp::create(gb, loc, bufs.first,
                             em.narrow(value, p.getStorage()));
    }
  }

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
