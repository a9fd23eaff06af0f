//===- FastArithmetic.cpp - flashopt-fast-arithmetic ----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The portable fast mode (docs/NUMERICS.md §7). In every kernel with
/// `arithmetic<fast>` (its typed attribute), first the softsign quotients
/// become one division each (fuseSoftsign below), and after the square roots
/// are shared a softsign decode and Adam's update share one reciprocal
/// (pairQuotients below); then a per-element f32
/// division by a value that is uniform across the group (a per-step scalar of
/// the prologue such as a bias correction, a constant such as the code range N,
/// a group's absmax) becomes a multiply by its IEEE reciprocal, computed
/// once where the divisor is defined:
///
///   x / d   ->   x * r,   r = 1 / d
///
/// Two roundings instead of one (at most 1.5 ulp from the quotient), the
/// same on every back end and in the scalar reference. Then, in this order:
///
///   sqrt(x * u)        ->  sqrt(x) * sqrt(u)   when the body also takes
///                                              sqrt(x) (one root per element)
///   (x * u1) * u2      ->  x * (u1 * u2)       the inner product used once
///   a * b + c, c - a * b, ...  ->  fma         a per-element product used
///                                              once; the left one first
///
/// (u: uniform). Each changes roundings, never which operations see NaN or
/// infinity, and the reference applies the same ones (Lazy, Arith in
/// test/reference/flashopt_reference.h). Per-element divisions and square
/// roots stay IEEE: Newton iterations from a bit-level seed were measured
/// slower on the CPU and the GPU alike (docs/PERFORMANCE.md, "The fast
/// mode"). The pass runs before flashopt-exact-int-division and
/// flashopt-exact-group-division, which then find nothing left to prove in
/// a fast kernel.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTFASTARITHMETIC
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

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
    else if (isa<LoadElementOp, DitherOp>(def) || def->getNumRegions() != 0)
      uniform = false;
    else
      uniform = llvm::all_of(def->getOperands(),
                             [&](Value o) { return isUniform(o); });
    memo[v] = uniform;
    return uniform;
  }

  /// After operations are erased: their results' storage may be reused.
  void forget() { memo.clear(); }

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

bool isF32(Value v) { return v.getType().isF32(); }

/// Where a value computed from uniform `a` and `b` goes: before the body when
/// both come from outside it (once per tensor), else right after the later
/// of their definitions inside the body (once per group).
OpBuilder builderAfterBoth(GroupBodyOp body, Value a, Value b) {
  Operation *da = a.getDefiningOp(), *db = b.getDefiningOp();
  bool ina = da && body->isProperAncestor(da);
  bool inb = db && body->isProperAncestor(db);
  if (!ina && !inb)
    return OpBuilder(body);
  Operation *last = !ina ? db : !inb ? da : (da->isBeforeInBlock(db) ? db : da);
  OpBuilder b2(last->getContext());
  b2.setInsertionPointAfter(last);
  return b2;
}

/// The operand of a commutative binary op `op` other than the constant
/// `c`, or null.
template <typename OpTy> Value otherThan(OpTy op, double c) {
  if (!op)
    return {};
  if (isConstantFloat(op.getLhs(), c))
    return op.getRhs();
  if (isConstantFloat(op.getRhs(), c))
    return op.getLhs();
  return {};
}

/// The softsign quotients in one division each, with fewer roundings
/// (docs/NUMERICS.md §7); both are the same real function of their inputs:
///
///   encode  n = y / a, t = 2n / (1 + |n|)  ->  t = y / fma(|y|, 0.5, a*0.5)
///   decode  t = q / N, n = t / (2 - |t|)   ->  n = q / (2N - |q|)
///
/// (a, N uniform; a*0.5 and 2N computed once). The encode's divisor is
/// (a + |y|)/2 rounded once and never overflows (|y| <= a, the group's
/// absmax); the decode's is exact for integer codes |q| <= N. Each takes
/// effect only where the intermediate (n, t) has no other use.
void fuseSoftsign(GroupBodyOp body, Uniformity &uniformity) {
  SmallVector<arith::DivFOp> quotients;
  body.walk([&](arith::DivFOp d) {
    if (isF32(d.getResult()) && !uniformity.isUniform(d.getResult()))
      quotients.push_back(d);
  });
  llvm::DenseSet<Operation *> erased;
  for (arith::DivFOp outer : quotients) {
    Location loc = outer.getLoc();
    // Encode: outer = (2 * n) / (1 + |n|), n = y / a.
    if (erased.contains(outer))
      continue;
    Value n = otherThan(outer.getLhs().getDefiningOp<arith::MulFOp>(), 2.0);
    Value absN = otherThan(outer.getRhs().getDefiningOp<arith::AddFOp>(), 1.0);
    auto abs = absN ? absN.getDefiningOp<math::AbsFOp>() : nullptr;
    auto inner = n ? n.getDefiningOp<arith::DivFOp>() : nullptr;
    if (abs && inner && abs.getOperand() == n && isF32(n) &&
        uniformity.isUniform(inner.getRhs()) &&
        !uniformity.isUniform(inner.getLhs())) {
      Operation *mul2 = outer.getLhs().getDefiningOp();
      Operation *add1 = outer.getRhs().getDefiningOp();
      if (!mul2->hasOneUse() || !add1->hasOneUse() || !abs->hasOneUse() ||
          !llvm::all_of(inner->getUsers(),
                        [&](Operation *u) { return u == mul2 || u == abs; }))
        continue;
      Value y = inner.getLhs(), a = inner.getRhs();
      OpBuilder ub = builderAfter(a);
      Value half = arith::ConstantOp::create(ub, loc, ub.getF32FloatAttr(0.5f));
      Value h = arith::MulFOp::create(ub, loc, a, half);
      OpBuilder b(outer);
      Value ay = math::AbsFOp::create(b, loc, y);
      Value d = math::FmaOp::create(b, loc, ay, half, h);
      outer.replaceAllUsesWith(arith::DivFOp::create(b, loc, y, d).getResult());
      outer.erase();
      add1->erase();
      mul2->erase();
      abs.erase();
      erased.insert(inner);
      inner.erase();
      uniformity.forget();
      continue;
    }
    // Decode: outer = t / (2 - |t|), t = q / N.
    auto sub = outer.getRhs().getDefiningOp<arith::SubFOp>();
    if (!sub || !isConstantFloat(sub.getLhs(), 2.0))
      continue;
    auto absT = sub.getRhs().getDefiningOp<math::AbsFOp>();
    auto t = outer.getLhs().getDefiningOp<arith::DivFOp>();
    if (!absT || !t || absT.getOperand() != t.getResult() ||
        !uniformity.isUniform(t.getRhs()) || uniformity.isUniform(t.getLhs()) ||
        !sub->hasOneUse() || !absT->hasOneUse() ||
        !llvm::all_of(t->getUsers(),
                      [&](Operation *u) { return u == outer || u == absT; }))
      continue;
    Value q = t.getLhs(), nmax = t.getRhs();
    Value twoNmax;
    APFloat nConst(0.0f);
    if (matchPattern(nmax, m_ConstantFloat(&nConst))) {
      // 2N as a constant: pairQuotients recognizes the decode by it.
      OpBuilder cb(outer);
      twoNmax = arith::ConstantOp::create(
          cb, loc, cb.getF32FloatAttr(2.0f * nConst.convertToFloat()));
    } else {
      OpBuilder ub = builderAfter(nmax);
      Value two = arith::ConstantOp::create(ub, loc, ub.getF32FloatAttr(2.0f));
      twoNmax = arith::MulFOp::create(ub, loc, nmax, two);
    }
    OpBuilder b(outer);
    Value den =
        arith::SubFOp::create(b, loc, twoNmax, math::AbsFOp::create(b, loc, q));
    outer.replaceAllUsesWith(arith::DivFOp::create(b, loc, q, den).getResult());
    outer.erase();
    sub.erase();
    absT.erase();
    erased.insert(t);
    t.erase();
    uniformity.forget();
  }
}

/// A softsign decode quotient `q / (C - |q|)` after fuseSoftsign: q an
/// 8-bit code converted to f32 (|q| <= 128 signed, <= 255 unsigned) and C =
/// 2N a constant in (max |q|, 1024], so the divisor is an exact integer in
/// [1, 1024]: never 0, never far from 1.
bool isDecodeQuotient(arith::DivFOp d) {
  auto sub = d.getRhs().getDefiningOp<arith::SubFOp>();
  if (!sub)
    return false;
  auto abs = sub.getRhs().getDefiningOp<math::AbsFOp>();
  APFloat c(0.0f);
  if (!abs || abs.getOperand() != d.getLhs() ||
      !matchPattern(sub.getLhs(), m_ConstantFloat(&c)))
    return false;
  Operation *conv = d.getLhs().getDefiningOp();
  if (!conv || !isa<arith::SIToFPOp, arith::UIToFPOp>(conv) ||
      !conv->getOperand(0).getType().isInteger(8))
    return false;
  double maxCode = isa<arith::SIToFPOp>(conv) ? 128.0 : 255.0;
  return c.convertToDouble() > maxCode && c.convertToDouble() <= 1024.0;
}

/// Every operation of the body that depends on `root`'s result.
llvm::DenseSet<Operation *> dependents(Operation *root) {
  llvm::DenseSet<Operation *> seen;
  SmallVector<Operation *> work{root};
  while (!work.empty()) {
    Operation *op = work.pop_back_val();
    for (Operation *user : op->getUsers())
      if (seen.insert(user).second)
        work.push_back(user);
  }
  return seen;
}

/// A softsign decode quotient and the next per-element division whose
/// divisor does not depend on it (AdamW's m-hat / (sqrt(v-hat) + eps)) share
/// one IEEE reciprocal (docs/NUMERICS.md §7):
///
///   q / d0, x / d   ->   r = 1 / (d0 * d);   q * (d * r),  x * (d0 * r)
///
/// One division instead of two, where the divider is what bounds a CPU core
/// (docs/PERFORMANCE.md). d0 is in [C - 128, C], so r, d * r and d0 * r are
/// normal wherever d is in about [2^-127, 2^118] (C = 254); outside, the
/// quotients may be 0, infinite or NaN where the IEEE ones were not (d = 0 or
/// infinite makes the decoded state NaN; the update it divides is not finite
/// then either).
void pairQuotients(GroupBodyOp body, Uniformity &uniformity) {
  Block &block = body.getBody().front();
  SmallVector<arith::DivFOp> divs;
  for (Operation &op : block)
    if (auto d = dyn_cast<arith::DivFOp>(op))
      if (isF32(d.getResult()) && !uniformity.isUniform(d.getResult()))
        divs.push_back(d);
  llvm::DenseSet<Operation *> used;
  bool changed = false;
  for (size_t i = 0; i < divs.size(); ++i) {
    arith::DivFOp dec = divs[i];
    if (used.contains(dec) || !isDecodeQuotient(dec))
      continue;
    llvm::DenseSet<Operation *> after = dependents(dec);
    arith::DivFOp partner;
    for (size_t j = i + 1; j < divs.size() && !partner; ++j) {
      arith::DivFOp d = divs[j];
      Operation *den = d.getRhs().getDefiningOp();
      if (used.contains(d) || isDecodeQuotient(d) || !den ||
          !body->isProperAncestor(den) || after.contains(den) || den == dec)
        continue;
      partner = d;
    }
    if (!partner)
      continue;
    used.insert(dec);
    used.insert(partner);
    Value d0 = dec.getRhs(), d = partner.getRhs();
    Operation *last = d0.getDefiningOp()->isBeforeInBlock(d.getDefiningOp())
                          ? d.getDefiningOp()
                          : d0.getDefiningOp();
    Location loc = dec.getLoc();
    OpBuilder b(last->getContext());
    b.setInsertionPointAfter(last);
    Value p = arith::MulFOp::create(b, loc, d0, d);
    Value one = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(1.0f));
    Value r = arith::DivFOp::create(b, loc, one, p);
    Value s1 = arith::MulFOp::create(b, loc, d, r);
    Value decoded = arith::MulFOp::create(b, loc, dec.getLhs(), s1);
    Value s0 = arith::MulFOp::create(b, loc, d0, r);
    dec.replaceAllUsesWith(decoded);
    dec.erase();
    // The decoded value now follows the partner's divisor: what uses it
    // before that point moves right after it, in order; the rest stays.
    Operation *anchor = s0.getDefiningOp();
    llvm::DenseSet<Operation *> users = dependents(decoded.getDefiningOp());
    SmallVector<Operation *> early;
    for (Operation &op : block) {
      if (&op == last)
        break;
      if (users.contains(&op))
        early.push_back(&op);
    }
    for (Operation *op : early) {
      op->moveAfter(anchor);
      anchor = op;
    }
    OpBuilder pb(partner);
    partner.replaceAllUsesWith(
        arith::MulFOp::create(pb, partner.getLoc(), partner.getLhs(), s0)
            .getResult());
    partner.erase();
    changed = true;
  }
  if (changed)
    uniformity.forget();
}

/// `sqrt(x * u)`, u uniform, where the body also takes `sqrt(x)`:
/// `sqrt(x) * sqrt(u)`, the uniform root computed once (AdamW's
/// `sqrt(v / bc2)` next to the variance encoding's `sqrt(v)`: one square
/// root per element instead of two).
void shareSquareRoots(GroupBodyOp body, Uniformity &uniformity) {
  llvm::DenseSet<Value> rooted;
  body.walk([&](math::SqrtOp s) { rooted.insert(s.getOperand()); });
  SmallVector<math::SqrtOp> roots;
  body.walk([&](math::SqrtOp s) {
    if (isF32(s.getResult()) && !uniformity.isUniform(s.getResult()))
      roots.push_back(s);
  });
  for (math::SqrtOp s : roots) {
    auto mul = s.getOperand().getDefiningOp<arith::MulFOp>();
    if (!mul)
      continue;
    Value x = mul.getLhs(), u = mul.getRhs();
    if (uniformity.isUniform(x))
      std::swap(x, u);
    if (uniformity.isUniform(x) || !uniformity.isUniform(u) ||
        !rooted.contains(x))
      continue;
    OpBuilder ub = builderAfter(u);
    Value ru = math::SqrtOp::create(ub, s.getLoc(), u);
    OpBuilder b(s);
    Value rx = math::SqrtOp::create(b, s.getLoc(), x);
    s.replaceAllUsesWith(
        arith::MulFOp::create(b, s.getLoc(), rx, ru).getResult());
    s.erase();
    if (mul->use_empty())
      mul.erase();
    uniformity.forget();
  }
}

/// `(x * u1) * u2`, u1 and u2 uniform, the inner product used once:
/// `x * (u1 * u2)`, the uniform product computed once per tensor or group
/// (a dequantized state times beta: the group scale times beta).
void foldUniformFactors(GroupBodyOp body, Uniformity &uniformity) {
  SmallVector<arith::MulFOp> muls;
  body.walk([&](arith::MulFOp m) {
    if (isF32(m.getResult()) && !uniformity.isUniform(m.getResult()))
      muls.push_back(m);
  });
  for (arith::MulFOp outer : muls) {
    for (int side = 0; side < 2; ++side) {
      Value in = outer->getOperand(side), u2 = outer->getOperand(1 - side);
      auto inner = in.getDefiningOp<arith::MulFOp>();
      if (!inner || !inner->hasOneUse() || !uniformity.isUniform(u2))
        continue;
      Value x = inner.getLhs(), u1 = inner.getRhs();
      if (uniformity.isUniform(x))
        std::swap(x, u1);
      if (uniformity.isUniform(x) || !uniformity.isUniform(u1))
        continue;
      OpBuilder ub = builderAfterBoth(body, u1, u2);
      Value k = arith::MulFOp::create(ub, outer.getLoc(), u1, u2);
      OpBuilder b(outer);
      outer.replaceAllUsesWith(
          arith::MulFOp::create(b, outer.getLoc(), x, k).getResult());
      outer.erase();
      inner.erase();
      uniformity.forget();
      break;
    }
  }
}

/// `a * b + c`, `c + a * b`, `a * b - c`, `c - a * b` with a per-element
/// product used once: one fused multiply-add, one rounding instead of two.
/// The left operand's product is fused when both are products.
void contractToFMA(GroupBodyOp body, Uniformity &uniformity) {
  SmallVector<Operation *> adds;
  body.walk([&](Operation *op) {
    if (isa<arith::AddFOp, arith::SubFOp>(op) && isF32(op->getResult(0)) &&
        !uniformity.isUniform(op->getResult(0)))
      adds.push_back(op);
  });
  auto fusable = [&](Value v) -> arith::MulFOp {
    auto m = v.getDefiningOp<arith::MulFOp>();
    if (m && m->hasOneUse() && !uniformity.isUniform(m.getResult()))
      return m;
    return nullptr;
  };
  for (Operation *op : adds) {
    bool sub = isa<arith::SubFOp>(op);
    Value lhs = op->getOperand(0), rhs = op->getOperand(1);
    OpBuilder b(op);
    Location loc = op->getLoc();
    Value fma;
    if (arith::MulFOp m = fusable(lhs)) {
      Value c = sub ? arith::NegFOp::create(b, loc, rhs).getResult() : rhs;
      fma = math::FmaOp::create(b, loc, m.getLhs(), m.getRhs(), c);
      op->getResult(0).replaceAllUsesWith(fma);
      op->erase();
      m.erase();
      uniformity.forget();
    } else if (arith::MulFOp m = fusable(rhs)) {
      Value a = sub ? arith::NegFOp::create(b, loc, m.getLhs()).getResult()
                    : m.getLhs();
      fma = math::FmaOp::create(b, loc, a, m.getRhs(), lhs);
      op->getResult(0).replaceAllUsesWith(fma);
      op->erase();
      m.erase();
      uniformity.forget();
    }
  }
}

void rewriteKernel(KernelOp kernel) {
  SmallVector<GroupBodyOp> bodies(kernel.getBody().getOps<GroupBodyOp>());
  for (GroupBodyOp body : bodies) {
    Uniformity uniformity(body);
    fuseSoftsign(body, uniformity);
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
    shareSquareRoots(body, uniformity);
    pairQuotients(body, uniformity);
    foldUniformFactors(body, uniformity);
    contractToFMA(body, uniformity);
  }
}

struct FlashOptFastArithmeticPass
    : mlir::flashopt::impl::FlashOptFastArithmeticBase<
          FlashOptFastArithmeticPass> {
  void runOnOperation() override {
    SmallVector<KernelOp> kernels;
    getOperation().walk([&](KernelOp k) { kernels.push_back(k); });
    for (KernelOp kernel : kernels)
      if (kernel.getArithmetic() == Arithmetic::Fast)
        rewriteKernel(kernel);
  }
};

} // namespace
