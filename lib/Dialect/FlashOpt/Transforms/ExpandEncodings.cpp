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

#include "MasterWeightEmitter.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/WalkPatternRewriteDriver.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTEXPANDENCODINGS
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

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

/// The kernel ABI's kind (abi::KernelKind) of the dialect's `kind`: the
/// same names.
::flashopt::abi::KernelKind abiKind(KernelKind kind) {
  ::flashopt::abi::KernelKind out = ::flashopt::abi::KernelKind::Step;
  bool known = ::flashopt::abi::parse_kernel_kind(stringifyKernelKind(kind), out);
  assert(known && "the dialect's kernel kinds are the kernel ABI's");
  (void)known;
  return out;
}

/// One optimizer turned into one kernel of `kind`, in named phases:
///
///   createKernel -> prologue -> (accumulate kernel: accumulate) |
///   decodeInputs -> inlineRule -> encodeOutputs
///
/// The order in which the phases create operations is the kernels' IR (and
/// so their code): a phase may not be reordered without changing every
/// bundle.
class OptimizerExpansion {
public:
  OptimizerExpansion(OptimizerOp op, KernelKind kind, bool subnormalFree)
      : op(op), kind(kind), subnormalFree(subnormalFree), loc(op.getLoc()), plan(planBuffers(op)),
        gb(op.getContext()), em(gb, loc) {}

  LogicalResult run() {
    if (failed(check()))
      return failure();
    createKernel();
    prologue();
    GroupBodyOp body = startGroupBody();
    if (kind == KernelKind::Accumulate) {
      storeAccum(accumulated());
    } else {
      Inputs in = decodeInputs();
      SmallVector<Value> results = inlineRule(in);
      encodeOutputs(results);
    }
    canonicalizeStoredNaNs(body);
    op.erase();
    return success();
  }

private:
  /// The decoded inputs of the rule: the master weight, the scaled
  /// gradient, the states.
  struct Inputs {
    Value theta, grad;
    SmallVector<Value> states;
  };

  /// What the optimizer must satisfy for a kernel of `kind`.
  LogicalResult check() {
    if (kind != KernelKind::Step && !op.getAccumulateAttr())
      return op.emitOpError()
             << "has no accumulator (accumulate(...)), so it has no "
             << stringifyKernelKind(kind) << " kernel";
    for (HyperOp h : getHypers(op))
      if (h.getName() == ::flashopt::abi::kGradScaleHyper)
        return h.emitOpError()
               << "declares \"" << ::flashopt::abi::kGradScaleHyper
               << "\", which every kernel gets after the rule's "
                  "hyper-parameters (the scale of the gradient); use another "
                  "name";
    return success();
  }

  /// The kernel: its name, buffers, hyper-parameter columns (the gradient's
  /// scale last, docs/KERNEL-ABI.md), kind and arithmetic, and the
  /// optimizer's own discardable attributes (e.g. spec metadata).
  void createKernel() {
    MLIRContext *ctx = op.getContext();
    OpBuilder b(op);
    SmallVector<Attribute> hyperNames;
    for (HyperOp h : getHypers(op))
      hyperNames.push_back(StringAttr::get(ctx, h.getName()));
    hyperNames.push_back(
        StringAttr::get(ctx, ::flashopt::abi::kGradScaleHyper));
    std::string name =
        (op.getSymName() + ::flashopt::abi::kernel_kind_suffix(abiKind(kind)))
            .str();
    kernel = KernelOp::create(b, loc, name, plan.groupSize,
                              b.getArrayAttr(plan.buffers),
                              b.getArrayAttr(hyperNames), kind,
                              op.getArithmetic());
    for (NamedAttribute attr : op->getDiscardableAttrs())
      kernel->setAttr(attr.getName(), attr.getValue());
    kernelBlock = new Block();
    kernel.getBody().push_back(kernelBlock);
  }

  /// The per-step scalar code: the optimizer's (the accumulate kernel reads
  /// no hyper-parameter, so it has none; it still has every column, as all
  /// kernels share one table), then the gradient's scale.
  void prologue() {
    OpBuilder kb = OpBuilder::atBlockEnd(kernelBlock);
    if (kind != KernelKind::Accumulate)
      for (Operation &inner : op.getBody().front()) {
        if (isa<StateOp, UpdateOp>(inner))
          continue;
        kb.clone(inner, mapping);
      }
    gradScale =
        HyperOp::create(kb, loc, kb.getF32Type(),
                        kb.getStringAttr(::flashopt::abi::kGradScaleHyper),
                        kb.getF32FloatAttr(1.0f), EnvelopeAttr(), StringAttr())
            .getResult();
  }

  GroupBodyOp startGroupBody() {
    OpBuilder kb = OpBuilder::atBlockEnd(kernelBlock);
    auto body = GroupBodyOp::create(kb, loc);
    Block *bodyBlock = new Block();
    body.getBody().push_back(bodyBlock);
    gb.setInsertionPointToEnd(bodyBlock);
    return body;
  }

  BufferAttr bufferAt(int64_t buffer) {
    return cast<BufferAttr>(plan.buffers[buffer]);
  }
  Value load(int64_t buffer) {
    Type t = accessType(bufferAt(buffer).getElementType());
    return LoadElementOp::create(gb, loc, t, buffer);
  }

  // ---- the gradient accumulator -------------------------------------------
  // Its decode (f32: as is; bf16: widened; bf16 + i8: the master-weight
  // decode of docs/NUMERICS.md §1) and encode.
  Value decodeAccum() {
    MasterAttr acc = op.getAccumulateAttr();
    Value a = load(plan.accum);
    return acc.hasCorrection() ? em.decodeMaster(a, load(plan.accumCorrection))
                               : em.widen(a);
  }
  std::pair<Value, Value> encodeAccum(Value sum) {
    MasterAttr acc = op.getAccumulateAttr();
    Type t = acc.getParamType();
    if (acc.hasCorrection())
      return em.encodeMaster(sum, t, acc.getCorrection());
    return {t.isF32() ? sum : em.narrow(sum, t), Value()};
  }
  void storeAccum(std::pair<Value, Value> encoded) {
    StoreElementOp::create(gb, loc, plan.accum, encoded.first);
    if (encoded.second)
      StoreElementOp::create(gb, loc, plan.accumCorrection, encoded.second);
  }
  /// decode(accum) + f32(grad), encoded (the accumulate kernel's result).
  std::pair<Value, Value> accumulated() {
    // (Loads in a fixed order: the accumulator, then the gradient.)
    Value acc = decodeAccum();
    Value g = em.widen(load(plan.grad));
    Value sum = arith::AddFOp::create(gb, loc, acc, g);
    return encodeAccum(sum);
  }

  // ---- decode inputs -------------------------------------------------------
  /// The master weight, the gradient times its scale, and every state
  /// decoded by its encoding (StateEncodingAttrInterface::emitDecode).
  Inputs decodeInputs() {
    Inputs in;
    MasterAttr master = op.getParam();
    Value paramValue = load(plan.param);
    in.theta = master.hasCorrection()
                   ? em.decodeMaster(paramValue, load(plan.correction))
                   : em.widen(paramValue);
    in.grad = arith::MulFOp::create(gb, loc, rawGradient(), gradScale);
    // The accumulated steps leave the accumulator zeroed for the next round
    // (its bits all zero: +0, correction 0).
    if (kind == KernelKind::StepAccumulated || kind == KernelKind::StepFused) {
      MasterAttr acc = op.getAccumulateAttr();
      Type t = acc.getParamType();
      Value zero =
          arith::ConstantOp::create(gb, loc, t, gb.getFloatAttr(t, 0.0));
      Value zeroCorr;
      if (acc.hasCorrection())
        zeroCorr = arith::ConstantOp::create(
            gb, loc, acc.getCorrection(),
            gb.getIntegerAttr(acc.getCorrection(), 0));
      storeAccum({zero, zeroCorr});
    }
    for (auto [state, buffers] : llvm::zip(getStates(op), plan.states)) {
      SmallVector<Value> loaded;
      for (int64_t buffer : buffers) {
        BufferAttr attr = bufferAt(buffer);
        loaded.push_back(attr.getRate() == BufferRate::group
                             ? LoadGroupOp::create(gb, loc,
                                                   attr.getElementType(), buffer)
                                   .getResult()
                             : load(buffer));
      }
      in.states.push_back(state.getEncoding().emitDecode(gb, loc, loaded));
    }
    return in;
  }

  /// The gradient before its scale: the micro-batch's (step), the
  /// accumulator's (step_accumulated), or the accumulator plus this
  /// micro-batch's after the same encode -> decode round trip the accumulate
  /// kernel's store and the next load make (step_fused: bit-identical to
  /// accumulate, then step_accumulated).
  Value rawGradient() {
    switch (kind) {
    case KernelKind::Step:
    case KernelKind::Accumulate:
      return em.widen(load(plan.grad));
    case KernelKind::StepAccumulated:
      return decodeAccum();
    case KernelKind::StepFused: {
      auto [a, rho] = accumulated();
      return rho ? em.decodeMaster(a, rho) : em.widen(a);
    }
    }
    llvm_unreachable("a kernel kind");
  }

  // ---- inline the rule -----------------------------------------------------
  /// The rule's operations on the decoded inputs, its flashopt.bound first
  /// lowered in place for the optimizer's numerics
  /// (populateBoundLoweringPatterns; the optimizer is erased afterwards);
  /// the values it yields.
  SmallVector<Value> inlineRule(const Inputs &in) {
    UpdateOp update = getUpdate(op);
    RewritePatternSet patterns(op.getContext());
    populateBoundLoweringPatterns(patterns, op.getNumerics());
    walkAndApplyPatterns(update, FrozenRewritePatternSet(std::move(patterns)));
    Block &rule = update.getBody().front();
    mapping.map(rule.getArgument(0), in.theta);
    mapping.map(rule.getArgument(1), in.grad);
    for (auto [arg, value] :
         llvm::zip(rule.getArguments().drop_front(2), in.states))
      mapping.map(arg, value);
    for (Operation &inner : rule.without_terminator())
      gb.clone(inner, mapping);
    auto yield = cast<YieldOp>(rule.getTerminator());
    return llvm::map_to_vector(yield.getValues(), [&](Value v) {
      return mapping.lookupOrDefault(v);
    });
  }

  // ---- encode outputs ------------------------------------------------------
  /// The master weight, then each state by its encoding
  /// (StateEncodingAttrInterface::emitEncode): per-group values before
  /// per-element ones (the order the kernel IR has always had).
  void encodeOutputs(ArrayRef<Value> results) {
    MasterAttr master = op.getParam();
    Type paramType = master.getParamType();
    if (master.hasCorrection()) {
      auto [narrowValue, rho] =
          em.encodeMaster(results[0], paramType, master.getCorrection());
      StoreElementOp::create(gb, loc, plan.param, narrowValue);
      StoreElementOp::create(gb, loc, plan.correction, rho);
    } else {
      StoreElementOp::create(gb, loc, plan.param,
                             em.narrow(results[0], paramType));
    }
    SmallVector<StateOp> states = getStates(op);
    Value step = ditherStep(states);
    int32_t quantized = 0;
    for (auto [i, state] : llvm::enumerate(states)) {
      int32_t phase = 0;
      Value stateStep = step;
      if (auto quant = dyn_cast<QuantAttr>(state.getEncoding())) {
        int32_t k = quantized++;
        if (quant.getCodeBits() == 4)
          stateStep = streamStep(step, k);
        else
          phase = (k * DitherOp::kStatePhase) & 0x3FFF;
      }
      SmallVector<Value> stored = state.getEncoding().emitEncode(
          gb, loc, results[i + 1], stateStep, phase, subnormalFree);
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
  }

  /// The bounded numerics round every state code with the element's dither
  /// (docs/NUMERICS.md §8), each quantized state at its own phase (k times
  /// DitherOp::kStatePhase for the k-th), so that one element's states do
  /// not share their rounding errors; the dither hashes the step count (the
  /// prologue's, or one made for it). Null in FlashOptim's numerics or
  /// without a quantized state.
  Value ditherStep(ArrayRef<StateOp> states) {
    if (op.getNumerics() != Numerics::Bounded ||
        llvm::none_of(states, [](StateOp st) {
          return isa<QuantAttr>(st.getEncoding());
        }))
      return Value();
    for (Operation &p : *kernelBlock)
      if (auto sc = dyn_cast<StepCountOp>(p))
        return sc.getResult();
    OpBuilder sb = OpBuilder::atBlockBegin(kernelBlock);
    return StepCountOp::create(sb, loc, sb.getI64Type()).getResult();
  }

  /// The step operand of the k-th quantized state's dither when its codes
  /// are 4-bit (docs/NUMERICS.md §2e): an independent stream, the hash of
  /// t + k·0x9E3779B9 (mod 2^32) at phase 0, where 8-bit codes share
  /// H(t) at phases k·kStatePhase apart; a 4-bit decision is 1/8 to 1/16 of
  /// the scale, and a shared hash correlates one element's states at fixed
  /// fractions. Made once per k in the kernel's prologue, after the step
  /// count.
  Value streamStep(Value step, int32_t k) {
    if (!step || k == 0)
      return step;
    Value &made = streamSteps[k];
    if (!made) {
      OpBuilder sb(step.getContext());
      sb.setInsertionPointAfterValue(step);
      Value c = arith::ConstantOp::create(
          sb, loc, sb.getI64IntegerAttr(int64_t(k) * kStreamMultiplier));
      made = arith::AddIOp::create(sb, loc, step, c);
    }
    return made;
  }
  /// The golden ratio's 32-bit multiplier, between dither streams.
  static constexpr int64_t kStreamMultiplier = 0x9E3779B9;
  llvm::DenseMap<int32_t, Value> streamSteps;

  OptimizerOp op;
  KernelKind kind;
  /// Encodes without subnormal products (the pass option).
  bool subnormalFree;
  Location loc;
  BufferPlan plan;
  OpBuilder gb; ///< at the end of the group body
  MasterWeightEmitter em;
  KernelOp kernel;
  Block *kernelBlock = nullptr;
  IRMapping mapping;
  Value gradScale;
};

struct FlashOptExpandEncodingsPass
    : mlir::flashopt::impl::FlashOptExpandEncodingsBase<
          FlashOptExpandEncodingsPass> {
  using FlashOptExpandEncodingsBase::FlashOptExpandEncodingsBase;

  void runOnOperation() override {
    SmallVector<OptimizerOp> optimizers;
    getOperation().walk([&](OptimizerOp op) { optimizers.push_back(op); });
    for (OptimizerOp op : optimizers)
      if (failed(OptimizerExpansion(op, kernelKind, subnormalFreeCodes).run()))
        return signalPassFailure();
  }
};

} // namespace
