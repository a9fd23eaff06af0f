//===- FlashOptOps.cpp - flashopt operations -------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Verifiers and custom assembly of the flashopt operations.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/TypeUtilities.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace mlir::flashopt;

/// Whether `name` is an identifier: [A-Za-z_][A-Za-z0-9_]*.
static bool isIdentifier(StringRef name) {
  if (name.empty() || !(llvm::isAlpha(name[0]) || name[0] == '_'))
    return false;
  return llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; });
}

/// Whether `op` is one of the arith/math operations allowed in rules and
/// per-step scalar code.
static bool isScalarMathOp(Operation *op) {
  Dialect *d = op->getDialect();
  return d && (isa<arith::ArithDialect>(d) || isa<math::MathDialect>(d));
}

/// Whether `t` is a scalar (integer, index or float) type.
static bool isScalarType(Type t) {
  return t.isIntOrIndexOrFloat();
}

/// Checks that every operand and result of `op` is a scalar.
static LogicalResult verifyScalarOperands(Operation *op, Operation *diagOp,
                                          StringRef where) {
  for (Type t : op->getOperandTypes())
    if (!isScalarType(t))
      return diagOp->emitOpError()
             << "operations in " << where << " must work on scalars, but '"
             << op->getName() << "' has an operand of type " << t;
  for (Type t : op->getResultTypes())
    if (!isScalarType(t))
      return diagOp->emitOpError()
             << "operations in " << where << " must work on scalars, but '"
             << op->getName() << "' has a result of type " << t;
  return success();
}

//===----------------------------------------------------------------------===//
// OptimizerOp
//===----------------------------------------------------------------------===//

SmallVector<HyperOp> mlir::flashopt::getHypers(Operation *op) {
  return llvm::to_vector(op->getRegion(0).front().getOps<HyperOp>());
}

SmallVector<StateOp> mlir::flashopt::getStates(OptimizerOp optimizer) {
  return llvm::to_vector(optimizer.getBody().front().getOps<StateOp>());
}

UpdateOp mlir::flashopt::getUpdate(OptimizerOp optimizer) {
  auto ops = optimizer.getBody().front().getOps<UpdateOp>();
  return ops.empty() ? UpdateOp() : *ops.begin();
}

/// The discardable attributes that once carried the modes, which nothing
/// reads now: an error that names the spelling that replaced them, rather
/// than a mode silently ignored.
static LogicalResult verifyNoStringModes(Operation *op) {
  static constexpr std::pair<llvm::StringLiteral, llvm::StringLiteral>
      kReplaced[] = {
          {"flashopt.numerics", "numerics<bounded|flashoptim>"},
          {"flashopt.arithmetic", "arithmetic<exact|fast>"},
          {"flashopt.kernel_kind",
           "flashopt-expand-encodings{kernel-kind=...} (on a kernel: "
           "kind<...>)"}};
  for (auto [name, spelling] : kReplaced)
    if (op->getDiscardableAttr(name))
      return op->emitOpError()
             << "carries the string attribute '" << name
             << "', which is no longer read; the mode is written "
             << spelling;
  return success();
}

LogicalResult OptimizerOp::verify() {
  if (failed(verifyNoStringModes(*this)))
    return failure();
  Type grad = getGrad();
  if (!isStorageFloatType(grad))
    return emitOpError() << "gradient type must be bf16, f16 or f32, got "
                         << grad;
  // The accumulator encodings (docs/NUMERICS.md §6): f32, bf16 + i8, bf16.
  if (MasterAttr acc = getAccumulateAttr()) {
    Type t = acc.getParamType();
    bool ok = t.isF32() ? !acc.hasCorrection()
                        : t.isBF16() && (!acc.hasCorrection() ||
                                         acc.getCorrection().isInteger(8));
    if (!ok)
      return emitOpError()
             << "accumulator must be #flashopt.master<f32>, "
                "#flashopt.master<bf16, correction = i8> or "
                "#flashopt.master<bf16>, got "
             << acc;
  }
  return success();
}

/// Checks the hyper-parameter declarations of an optimizer or kernel body.
static LogicalResult verifyUniqueHypers(Operation *op, Block &body) {
  llvm::StringSet<> names;
  for (auto hyper : body.getOps<HyperOp>())
    if (!names.insert(hyper.getName()).second)
      return hyper.emitOpError()
             << "hyper-parameter \"" << hyper.getName() << "\" declared twice";
  return success();
}

LogicalResult OptimizerOp::verifyRegions() {
  Block &body = getBody().front();
  int numUpdates = 0;
  for (Operation &op : body) {
    if (isa<HyperOp, StateOp, UpdateOp, StepCountOp, PowIOp>(op)) {
      numUpdates += isa<UpdateOp>(op);
      continue;
    }
    if (!isScalarMathOp(&op))
      return op.emitOpError()
             << "is not allowed in a flashopt.optimizer body (only "
                "flashopt.hyper, flashopt.state, flashopt.update, "
                "flashopt.step_count, flashopt.powi and scalar arith/math "
                "operations)";
    if (failed(verifyScalarOperands(&op, &op, "an optimizer body")))
      return failure();
  }
  if (numUpdates != 1)
    return emitOpError() << "expects exactly one flashopt.update, found "
                         << numUpdates;
  if (failed(verifyUniqueHypers(*this, body)))
    return failure();

  llvm::StringSet<> hyperNames;
  for (auto hyper : body.getOps<HyperOp>())
    hyperNames.insert(hyper.getName());

  llvm::StringMap<int64_t> stateNames;
  std::optional<std::pair<StringRef, int64_t>> firstGroup;
  for (auto state : body.getOps<StateOp>()) {
    if (!stateNames.try_emplace(state.getName(), 0).second)
      return state.emitOpError()
             << "state \"" << state.getName() << "\" declared twice";
    if (auto elidable = state.getElidable())
      if (!hyperNames.contains(*elidable))
        return state.emitOpError()
               << "state \"" << state.getName()
               << "\" is elidable on an unknown hyper-parameter \"" << *elidable
               << "\"";
    // The state's own verifier reports an encoding that is not one; this
    // verifier runs before it.
    auto encoding =
        dyn_cast_or_null<StateEncodingAttrInterface>(state.getEncodingAttr());
    if (!encoding)
      continue;
    if (std::optional<int64_t> group = encoding.getGroupSize()) {
      if (!firstGroup) {
        firstGroup = {state.getName(), *group};
      } else if (firstGroup->second != *group) {
        return state.emitOpError()
               << "quantized states must share one group size: \""
               << firstGroup->first << "\" has " << firstGroup->second
               << ", \"" << state.getName() << "\" has " << *group;
      }
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// HyperOp / StepCountOp
//===----------------------------------------------------------------------===//

void HyperOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  if (isIdentifier(getName()))
    setNameFn(getResult(), getName());
}

/// Checks that `op` sits directly in an optimizer or kernel body.
static LogicalResult verifyDeclarationParent(Operation *op) {
  if (!isa_and_nonnull<OptimizerOp, KernelOp>(op->getParentOp()))
    return op->emitOpError()
           << "expects parent op 'flashopt.optimizer' or 'flashopt.kernel'";
  return success();
}

LogicalResult HyperOp::verify() {
  if (failed(verifyDeclarationParent(*this)))
    return failure();
  if (!isIdentifier(getName()))
    return emitOpError() << "hyper-parameter name must be an identifier, got \""
                         << getName() << "\"";
  if (auto def = getDefaultValueAttr())
    if (!def.getValue().isFinite())
      return emitOpError() << "default value of \"" << getName()
                           << "\" must be finite";
  if (getEnvelope().has_value() != getEnvelopeOf().has_value())
    return emitOpError() << "an envelope needs both its extreme and the "
                            "hyper-parameter it follows";
  if (!getEnvelopeOf())
    return success();
  if (getDefaultValueAttr())
    return emitOpError() << "envelope \"" << getName()
                         << "\" has no default (the runtime keeps it)";
  // The hyper-parameter it follows: declared in the same body, not itself
  // an envelope.
  HyperOp source;
  for (Operation &op : (*this)->getBlock()->getOperations())
    if (auto h = dyn_cast<HyperOp>(op))
      if (h.getName() == *getEnvelopeOf())
        source = h;
  if (!source)
    return emitOpError() << "envelope \"" << getName()
                         << "\" follows \"" << *getEnvelopeOf()
                         << "\", which is not a hyper-parameter here";
  if (source.getEnvelopeOf())
    return emitOpError() << "envelope \"" << getName()
                         << "\" follows another envelope, \""
                         << *getEnvelopeOf() << "\"";
  return success();
}

void StepCountOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getResult(), "step");
}

LogicalResult StepCountOp::verify() {
  return verifyDeclarationParent(*this);
}

//===----------------------------------------------------------------------===//
// StateOp
//===----------------------------------------------------------------------===//

LogicalResult StateOp::verify() {
  if (!isIdentifier(getName()))
    return emitOpError() << "state name must be an identifier, got \""
                         << getName() << "\"";
  if (isElided() && !getElidable())
    return emitOpError() << "state \"" << getName()
                         << "\" is elided but not declared elidable";
  return success();
}

//===----------------------------------------------------------------------===//
// UpdateOp
//===----------------------------------------------------------------------===//

void UpdateOp::getAsmBlockArgumentNames(Region &region,
                                        OpAsmSetValueNameFn setNameFn) {
  if (&region != &getBody() || region.empty())
    return;
  Block &block = region.front();
  if (block.getNumArguments() >= 1)
    setNameFn(block.getArgument(0), "theta");
  if (block.getNumArguments() >= 2)
    setNameFn(block.getArgument(1), "grad");
  auto optimizer = dyn_cast_or_null<OptimizerOp>(getOperation()->getParentOp());
  if (!optimizer)
    return;
  unsigned i = 2;
  for (StateOp state : getStates(optimizer)) {
    if (i >= block.getNumArguments())
      break;
    if (isIdentifier(state.getName()))
      setNameFn(block.getArgument(i), state.getName());
    ++i;
  }
}

ParseResult UpdateOp::parse(OpAsmParser &parser, OperationState &result) {
  SmallVector<OpAsmParser::Argument> args;
  if (parser.parseArgumentList(args, OpAsmParser::Delimiter::Paren,
                               /*allowType=*/true))
    return failure();
  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  Region *body = result.addRegion();
  if (parser.parseRegion(*body, args))
    return failure();
  UpdateOp::ensureTerminator(*body, parser.getBuilder(), result.location);
  return success();
}

void UpdateOp::print(OpAsmPrinter &p) {
  p << "(";
  llvm::interleaveComma(getBody().getArguments(), p, [&](BlockArgument arg) {
    p.printRegionArgument(arg);
  });
  p << ")";
  p.printOptionalAttrDictWithKeyword((*this)->getAttrs());
  p << " ";
  p.printRegion(getBody(), /*printEntryBlockArgs=*/false,
                /*printBlockTerminators=*/true);
}

LogicalResult UpdateOp::verifyRegions() {
  auto optimizer = cast<OptimizerOp>(getOperation()->getParentOp());
  size_t numStates = getStates(optimizer).size();
  Block &block = getBody().front();
  size_t expected = 2 + numStates;
  if (block.getNumArguments() != expected)
    return emitOpError() << "expects " << expected
                         << " block arguments (master weight, gradient and "
                         << numStates << " states), found "
                         << block.getNumArguments();
  for (auto [i, arg] : llvm::enumerate(block.getArguments()))
    if (!arg.getType().isF32())
      return emitOpError() << "block argument #" << i << " must be f32, found "
                           << arg.getType();
  for (Operation &op : block.without_terminator()) {
    if (isa<BoundOp>(op))
      continue;
    if (!isScalarMathOp(&op))
      return op.emitOpError()
             << "is not allowed in an update rule (only scalar arith and math "
                "operations and flashopt.bound)";
    if (failed(verifyScalarOperands(&op, &op, "an update rule")))
      return failure();
    if (op.getNumRegions() != 0)
      return op.emitOpError() << "must not have regions in an update rule";
  }
  auto yield = cast<YieldOp>(block.getTerminator());
  if (yield.getValues().size() != 1 + numStates)
    return yield.emitOpError()
           << "must yield " << 1 + numStates << " values (master weight and "
           << numStates << " states), found " << yield.getValues().size();
  for (auto [i, v] : llvm::enumerate(yield.getValues()))
    if (!v.getType().isF32())
      return yield.emitOpError() << "value #" << i << " must be f32, found "
                                 << v.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// GuardedOp
//===----------------------------------------------------------------------===//

LogicalResult GuardedOp::verify() {
  if (getFast().size() != getResults().size())
    return emitOpError() << "has " << getFast().size() << " fast values for "
                         << getResults().size() << " results";
  for (auto [i, pair] :
       llvm::enumerate(llvm::zip(getFast().getTypes(), getResultTypes())))
    if (std::get<0>(pair) != std::get<1>(pair))
      return emitOpError() << "fast value #" << i << " has type "
                           << std::get<0>(pair) << ", result "
                           << std::get<1>(pair);
  Block &block = getFallback().front();
  if (block.getNumArguments() != 0)
    return emitOpError() << "fallback region takes no arguments";
  auto yield = dyn_cast<YieldOp>(block.empty() ? nullptr : &block.back());
  if (!yield)
    return emitOpError() << "fallback region must end in flashopt.yield";
  if (yield.getValues().getTypes() != getResultTypes())
    return yield.emitOpError()
           << "yields " << yield.getValues().getTypes().size()
           << " values whose types differ from the guarded results";
  for (Operation &op : block.without_terminator())
    if (op.getNumRegions() != 0 ||
        isa<LoadElementOp, StoreElementOp, LoadGroupOp, StoreGroupOp,
            GroupMaxOp>(op))
      return op.emitOpError()
             << "is not allowed in a guarded fallback (element-wise scalar "
                "code only)";
  return success();
}

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

bool mlir::flashopt::isConstantFloat(Value v, double c) {
  APFloat f(0.0f);
  return matchPattern(v, m_ConstantFloat(&f)) && f.convertToDouble() == c;
}

GroupMaxOp mlir::flashopt::getGroupAbsmaxOf(Value a, Value y) {
  if (auto mx = a.getDefiningOp<arith::MaximumFOp>()) {
    for (int i = 0; i < 2; ++i) {
      APFloat c(0.0f);
      if (matchPattern(mx->getOperand(1 - i), m_ConstantFloat(&c)) &&
          c.isFiniteNonZero() && !c.isNegative())
        return getGroupAbsmaxOf(mx->getOperand(i), y);
    }
    return nullptr;
  }
  auto gm = a.getDefiningOp<GroupMaxOp>();
  if (!gm || gm.getBits())
    return nullptr;
  auto abs = gm.getValue().getDefiningOp<math::AbsFOp>();
  return abs && abs.getOperand() == y ? gm : nullptr;
}

GroupBodyOp mlir::flashopt::getGroupBody(KernelOp kernel) {
  auto ops = kernel.getBody().front().getOps<GroupBodyOp>();
  return ops.empty() ? GroupBodyOp() : *ops.begin();
}

int64_t KernelOp::getHyperIndex(StringRef name) {
  for (auto [i, attr] : llvm::enumerate(getHypers()))
    if (cast<StringAttr>(attr).getValue() == name)
      return i;
  return -1;
}

LogicalResult KernelOp::verify() {
  if (failed(verifyNoStringModes(*this)))
    return failure();
  int64_t g = getGroupSize();
  if (g <= 0 || !llvm::isPowerOf2_64(g))
    return emitOpError() << "group size must be a positive power of two, got "
                         << g;
  llvm::StringSet<> names;
  for (Attribute a : getHypers())
    if (!names.insert(cast<StringAttr>(a).getValue()).second)
      return emitOpError() << "hyper-parameter \""
                           << cast<StringAttr>(a).getValue()
                           << "\" listed twice";
  llvm::StringSet<> bufferNames;
  for (Attribute a : getBuffers())
    if (!bufferNames.insert(cast<BufferAttr>(a).getName()).second)
      return emitOpError() << "buffer \"" << cast<BufferAttr>(a).getName()
                           << "\" listed twice";
  return success();
}

LogicalResult KernelOp::verifyRegions() {
  Block &body = getBody().front();
  int numBodies = 0;
  for (Operation &op : body) {
    if (isa<GroupBodyOp>(op)) {
      ++numBodies;
      continue;
    }
    if (auto hyper = dyn_cast<HyperOp>(op)) {
      if (getHyperIndex(hyper.getName()) < 0)
        return hyper.emitOpError() << "hyper-parameter \"" << hyper.getName()
                                   << "\" is not listed in the kernel's hypers";
      continue;
    }
    if (isa<StepCountOp, PowIOp>(op))
      continue;
    if (!isScalarMathOp(&op))
      return op.emitOpError() << "is not allowed in a flashopt.kernel prologue";
    if (failed(verifyScalarOperands(&op, &op, "a kernel prologue")))
      return failure();
  }
  if (numBodies != 1)
    return emitOpError() << "expects exactly one flashopt.group_body, found "
                         << numBodies;
  return verifyUniqueHypers(*this, body);
}

#define GET_OP_CLASSES
#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.cpp.inc"
