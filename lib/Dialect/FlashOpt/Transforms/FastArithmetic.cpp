//===- FastArithmetic.cpp - flashopt-fast-arithmetic
//-----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The portable fast mode (docs/NUMERICS.md §7). In every kernel whose
/// `flashopt.arithmetic` attribute is "fast", a per-element f32 division by
/// a value that is uniform across the group (a per-step scalar of the
/// prologue such as a bias correction, a constant such as the code range N,
/// a group's absmax) becomes a multiply by its IEEE reciprocal, computed
/// once where the divisor is defined:
///
///   x / d   ->   x * r,   r = 1 / d
///
/// Two roundings instead of one (at most 1.5 ulp from the quotient), the
/// same on every back end and in the scalar reference. Per-element
/// divisions and square roots stay IEEE: Newton iterations from a bit-level
/// seed were measured slower on the CPU and the GPU alike
/// (docs/PERFORMANCE.md, "The fast mode"). The pass runs before
/// flashopt-exact-int-division and flashopt-exact-group-division, which
/// then find nothing left to prove in a fast kernel.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTFASTARITHMETIC
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

constexpr llvm::StringLiteral kArithmeticAttr = "flashopt.arithmetic";

/// Which values of a group body are the same for every element of a group
/// (docs: flashopt.group_body): those defined outside the body, group maxima,
/// group loads, and what is computed from such values alone.
class Uniformity {
public:
  explicit Uniformity(GroupBodyOp body) : body(body) {}

  bool isUniform(Value v) {
    Operation *def = v.getDefiningOp();
    if (!def) // a block argument: of a region inside the body, per element
      return !body->isAncestor(v.getParentRegion()->getParentOp());
    if (!body->isProperAncestor(def))
      return true;
    auto it = memo.find(v);
    if (it != memo.end())
      return it->second;
    bool uniform;
    if (isa<GroupMaxOp, LoadGroupOp>(def))
      uniform = true;
    else if (isa<LoadElementOp>(def) || def->getNumRegions() != 0)
      uniform = false;
    else
      uniform = llvm::all_of(def->getOperands(),
                             [&](Value o) { return isUniform(o); });
    memo[v] = uniform;
    return uniform;
  }

private:
  GroupBodyOp body;
  llvm::DenseMap<Value, bool> memo;
};

/// Where the reciprocal of uniform `d` is computed: right after d, or at the
/// start of its block for a block argument (of a region outside the body;
/// kernels have none today).
OpBuilder builderAfter(Value d) {
  if (Operation *def = d.getDefiningOp()) {
    OpBuilder b(def->getContext());
    b.setInsertionPointAfter(def);
    return b;
  }
  auto arg = cast<BlockArgument>(d);
  return OpBuilder::atBlockBegin(arg.getOwner());
}

void rewriteKernel(KernelOp kernel) {
  SmallVector<GroupBodyOp> bodies(kernel.getBody().getOps<GroupBodyOp>());
  for (GroupBodyOp body : bodies) {
    Uniformity uniformity(body);
    SmallVector<arith::DivFOp> divs;
    body.walk([&](arith::DivFOp d) {
      if (d.getType().isF32() && uniformity.isUniform(d.getRhs()) &&
          !uniformity.isUniform(d.getLhs()))
        divs.push_back(d);
    });
    // One reciprocal per divisor, where the divisor is defined.
    llvm::DenseMap<Value, Value> reciprocals;
    for (arith::DivFOp div : divs) {
      Value d = div.getRhs();
      Value &r = reciprocals[d];
      if (!r) {
        OpBuilder rb = builderAfter(d);
        Value one = arith::ConstantOp::create(rb, div.getLoc(),
                                              rb.getF32FloatAttr(1.0f));
        r = arith::DivFOp::create(rb, div.getLoc(), one, d);
      }
      OpBuilder b(div);
      div.replaceAllUsesWith(
          arith::MulFOp::create(b, div.getLoc(), div.getLhs(), r).getResult());
      div.erase();
    }
  }
}

struct FlashOptFastArithmeticPass
    : mlir::flashopt::impl::FlashOptFastArithmeticBase<
          FlashOptFastArithmeticPass> {
  void runOnOperation() override {
    SmallVector<KernelOp> kernels;
    getOperation().walk([&](KernelOp k) { kernels.push_back(k); });
    for (KernelOp kernel : kernels) {
      Attribute a = kernel->getDiscardableAttr(kArithmeticAttr);
      if (!a)
        continue;
      auto s = dyn_cast<StringAttr>(a);
      if (!s || (s.getValue() != "fast" && s.getValue() != "exact")) {
        kernel.emitOpError() << "'" << kArithmeticAttr
                             << "' must be \"exact\" or \"fast\", got " << a;
        return signalPassFailure();
      }
      if (s.getValue() == "fast")
        rewriteKernel(kernel);
    }
  }
};

} // namespace
