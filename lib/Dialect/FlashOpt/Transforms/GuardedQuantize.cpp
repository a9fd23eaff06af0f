//===- GuardedQuantize.cpp - flashopt-guarded-quantize -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// 8-bit softsign and sqrt quantization codes from approximate arithmetic
/// (one MUFU per element) behind a guard that proves them equal to the exact
/// IEEE codes, with the exact chain as a `flashopt.guarded` fallback.
///
/// A code is `floor(w)`, w = RN(RN(t * N) + 0.5). The approximate chain
/// below computes y' with |y' - RN(t * N)| <= E (docs/NUMERICS.md §2c:
/// 13.5 u N for softsign, 9 u N for sqrt, u = 2^-24), so wherever
/// |y' - rint(y')| <= 0.5 - delta, delta > E + 2^-17, the exact code is
/// rint(y') too. That test is the guard; NaN fails it.
///
///   softsign, n = y / a, t = 2n / (1 + |n|), delta = 2^-13:
///     R  = a < 2^126 ? rcp_approx(a) : NaN                  (per group)
///     n' = y * R;  y' = (n' * 2N) * rcp_approx(1 + |n'|)
///   sqrt, y = sqrt(x), n = y / a, t = n, delta = 2^-12:
///     a  = max(sqrt(group_max(x + 0.0) {bits}), C0)         (per group,
///          the same bits as max(group_max(|sqrt(x)|), C0))
///     K  = N * rcp_approx(a);  S = a < 2^60 ? K * K : NaN   (per group)
///     y' = sqrt_approx(x * S)
///   fast-mode softsign (code = floor(fma(t, N, 0.5)),
///   t = y / fma(|y|, 0.5, a * 0.5)):
///     y' = (y * (a < 2^126 ? N : NaN)) * rcp_approx(fma(|y|, 0.5, a * 0.5))
///
/// Dithered codes (the bounded numerics, floor(RN(t * N) + u), docs/
/// NUMERICS.md §8) add 1 + u (a flashopt.dither at offset 0: its bits, no
/// float add) where the chains above add nothing, so z = y' + 1 + u, and
/// take the code floor(z) - 1 as the low byte of
/// add_round_down(z, 1.5 * 2^23 - 1); the guard is -|z - rint(z)| <= -delta
/// (z at least delta from the integers where the code changes).
///
/// The codes of one group body share one flashopt.guarded (one per form,
/// rounded to nearest or dithered): one test of a worker's lanes and one
/// branch per iteration.
///
/// Only the i8 codes of flashopt-expand-encodings' quantizer are matched
/// (checked operation by operation); anything else is left alone.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/DenseMap.h"

#include <cmath>

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTGUARDEDQUANTIZE
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

bool isConstantFloat(Value v, double c) {
  APFloat f(0.0f);
  return matchPattern(v, m_ConstantFloat(&f)) && f.convertToDouble() == c;
}

/// One matched code: the chain from `y` (softsign) or `x` (sqrt) to `conv`.
struct Site {
  enum Kind { Softsign, SoftsignFast, Sqrt } kind;
  Value den;         // SoftsignFast: the quotient's divisor, (a + |y|) / 2
  Operation *conv;   // fptosi / fptoui to i8
  Value y;           // the value divided by the absmax (sqrt(x) for sqrt;
                     // SoftsignFast: the quantized value itself)
  Value x;           // sqrt: the radicand
  Value a;           // maximumf(group_max(absf(y)), c0)
  Value dither;      // the rounding offset u in [0, 1) of the bounded
                     // numerics (a flashopt.dither), or null for 1/2
  GroupMaxOp absmax; // the group_max under a
  double n = 0;      // N
  SmallVector<Operation *> chain; // from the division (or sqrt) to conv
};

/// Whether `v` is a rounding offset: the constant 1/2 (round to nearest) or
/// a flashopt.dither in [0, 1) (the bounded numerics); the dither or null.
static bool isRoundingOffset(Value v, Value &dither) {
  if (isConstantFloat(v, 0.5)) {
    dither = Value();
    return true;
  }
  auto d = v.getDefiningOp<DitherOp>();
  if (!d || !d.getType().isF32() || d.getOffset().convertToFloat() != 1.0f)
    return false;
  dither = v;
  return true;
}

/// conv = fpto?i(select(cmpf uno(f, f), 0.0, f)), f = floor(h),
/// h = addf(mulf(t, N), u), u = 0.5 or a dither, t softsign or plain,
/// n = divf(y, a).
std::optional<Site> match(Operation *conv) {
  if (!conv->getResult(0).getType().isInteger(8))
    return std::nullopt;
  bool isSigned = isa<arith::FPToSIOp>(conv);
  auto sel = conv->getOperand(0).getDefiningOp<arith::SelectOp>();
  if (!sel || !isConstantFloat(sel.getTrueValue(), 0.0))
    return std::nullopt;
  auto floor = sel.getFalseValue().getDefiningOp<math::FloorOp>();
  auto isNan = sel.getCondition().getDefiningOp<arith::CmpFOp>();
  if (!floor || !isNan || isNan.getPredicate() != arith::CmpFPredicate::UNO ||
      isNan.getLhs() != floor.getResult() ||
      isNan.getRhs() != floor.getResult())
    return std::nullopt;
  // h = addf(mulf(t, N), u), or the fast mode's fma(t, N, u).
  SmallVector<Operation *> tail;
  Value t, nValue, dither;
  if (auto fma = floor.getOperand().getDefiningOp<math::FmaOp>()) {
    if (!isRoundingOffset(fma.getC(), dither))
      return std::nullopt;
    t = fma.getA();
    nValue = fma.getB();
    tail = {fma};
  } else {
    auto half = floor.getOperand().getDefiningOp<arith::AddFOp>();
    if (!half || !isRoundingOffset(half.getRhs(), dither))
      return std::nullopt;
    auto scaled = half.getLhs().getDefiningOp<arith::MulFOp>();
    if (!scaled)
      return std::nullopt;
    t = scaled.getLhs();
    nValue = scaled.getRhs();
    tail = {scaled, half};
  }
  APFloat nAttr(0.0f);
  if (!matchPattern(nValue, m_ConstantFloat(&nAttr)))
    return std::nullopt;
  Site s;
  s.conv = conv;
  s.dither = dither;
  s.n = nAttr.convertToDouble();
  bool fused = tail.size() == 1;
  arith::DivFOp div;
  SmallVector<Operation *> head;
  if (auto soft = t.getDefiningOp<arith::DivFOp>();
      soft && isSigned && s.n == 127.0) {
    if (fused) {
      // The fast mode (NUMERICS §7): t = y / fma(|y|, 0.5, a * 0.5), a the
      // group absmax of y; the chain starts at the quotient.
      auto den = soft.getRhs().getDefiningOp<math::FmaOp>();
      Value y = soft.getLhs();
      auto absY = den ? den.getA().getDefiningOp<math::AbsFOp>() : nullptr;
      auto h = den ? den.getC().getDefiningOp<arith::MulFOp>() : nullptr;
      if (!den || !absY || absY.getOperand() != y ||
          !isConstantFloat(den.getB(), 0.5) || !h)
        return std::nullopt;
      Value a = isConstantFloat(h.getRhs(), 0.5)   ? h.getLhs()
                : isConstantFloat(h.getLhs(), 0.5) ? h.getRhs()
                                           : Value();
      if (!a || !getGroupAbsmaxOf(a, y))
        return std::nullopt;
      s.kind = Site::SoftsignFast;
      s.y = y;
      s.a = a;
      s.den = den.getResult();
      s.chain = {soft};
      s.chain.append(tail.begin(), tail.end());
      s.chain.append({floor, isNan, sel, conv});
      return s;
    }
    // t = divf(mulf(2, n), addf(1, absf(n)))
    auto two = soft.getLhs().getDefiningOp<arith::MulFOp>();
    auto den = soft.getRhs().getDefiningOp<arith::AddFOp>();
    if (!two || !den || !isConstantFloat(two.getLhs(), 2.0) ||
        !isConstantFloat(den.getLhs(), 1.0))
      return std::nullopt;
    auto abs = den.getRhs().getDefiningOp<math::AbsFOp>();
    if (!abs || abs.getOperand() != two.getRhs())
      return std::nullopt;
    head = {two, abs, den, soft};
    div = two.getRhs().getDefiningOp<arith::DivFOp>();
    s.kind = Site::Softsign;
  } else if (auto d = t.getDefiningOp<arith::DivFOp>();
             d && !isSigned && s.n == 255.0 && !fused) {
    auto root = d.getLhs().getDefiningOp<math::SqrtOp>();
    if (!root)
      return std::nullopt;
    div = d;
    s.kind = Site::Sqrt;
    s.x = root.getOperand();
  } else {
    return std::nullopt;
  }
  if (!div || !div.getType().isF32())
    return std::nullopt;
  s.y = div.getLhs();
  s.a = div.getRhs();
  s.absmax = getGroupAbsmaxOf(s.a, s.y);
  if (!s.absmax)
    return std::nullopt;
  if (s.kind == Site::Sqrt)
    s.chain.push_back(s.y.getDefiningOp());
  s.chain.push_back(div);
  s.chain.append(head.begin(), head.end());
  s.chain.append(tail.begin(), tail.end());
  s.chain.append({floor, isNan, sel, conv});
  return s;
}

struct Builder {
  OpBuilder &b;
  Location loc;
  Value c(double v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(float(v)));
  }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value rcp(Value x) { return RcpApproxOp::create(b, loc, x); }
  /// x where `a < limit` (ordered), else NaN: the uniform range guard.
  Value belowOrNaN(Value a, double limit, Value x) {
    Value ok =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, a, c(limit));
    return arith::SelectOp::create(b, loc, ok, x, c(NAN));
  }
};

GuardedOp rewrite(Site &s, llvm::DenseMap<int32_t, Value> &onePlusUs) {
  Operation *conv = s.conv;
  Location loc = conv->getLoc();
  OpBuilder b(conv);
  Builder B{b, loc};
  Value a = s.a;
  // With a dither u (the bounded numerics), the code is floor(RN(y + u)):
  // the approximation is z = y' + (1 + u) (a dither at offset 0, exact:
  // the bits of 1 + u need no float add), folded into the last multiply as
  // an FMA where there is one; the code is floor(z) - 1 (docs/NUMERICS.md
  // §8).
  Value d;
  if (s.dither) {
    auto u = s.dither.getDefiningOp<DitherOp>();
    Value &onePlusU = onePlusUs[u.getPhase()];
    if (!onePlusU) {
      // Right before the first code that uses it (the lowering computes a
      // dither in the phase of its first use).
      onePlusU = DitherOp::create(b, u.getLoc(), b.getF32Type(), u.getStep(),
                                  b.getF32FloatAttr(0.0f), u.getPhaseAttr())
                     .getResult();
    }
    d = onePlusU;
  }
  auto mulPlusD = [&](Value x, Value y) -> Value {
    return d ? math::FmaOp::create(b, loc, x, y, d).getResult() : B.mul(x, y);
  };
  Value scaledApprox;
  double delta;
  if (s.kind == Site::SoftsignFast) {
    // y' = (y * N) * rcp_approx(den), den = (a + |y|) / 2 in [a/2, a]: a
    // normal reciprocal where a < 2^126 (else N is NaN: the guard fails).
    Value n = B.belowOrNaN(a, 0x1p126, B.c(s.n));
    scaledApprox = mulPlusD(B.mul(s.y, n), B.rcp(s.den));
    delta = 0x1p-13;
  } else if (s.kind == Site::Softsign) {
    Value n = B.mul(s.y, B.belowOrNaN(a, 0x1p126, B.rcp(a)));
    Value den = B.add(B.c(1.0), math::AbsFOp::create(b, loc, n));
    scaledApprox = mulPlusD(B.mul(n, B.c(2.0 * s.n)), B.rcp(den));
    delta = 0x1p-13;
  } else {
    // The absmax from the maximum of the radicands: sqrt is monotonic, so
    // the same bits (docs/NUMERICS.md §2c), one root per group.
    OpBuilder ab(s.absmax);
    Builder A{ab, loc};
    Value z = A.add(s.x, A.c(0.0)); // -0 -> +0
    auto gm = GroupMaxOp::create(ab, loc, z);
    gm.setBits(true);
    s.absmax.getResult().replaceAllUsesWith(
        math::SqrtOp::create(ab, loc, gm.getResult()));
    Value k = B.mul(B.c(s.n), B.rcp(a));
    Value scale = B.belowOrNaN(a, 0x1p60, B.mul(k, k));
    scaledApprox = SqrtApproxOp::create(b, loc, B.mul(s.x, scale));
    if (d)
      scaledApprox = B.add(scaledApprox, d);
    delta = 0x1p-12;
  }
  Type i8 = conv->getResult(0).getType();
  Value f = math::RoundEvenOp::create(b, loc, scaledApprox);
  Value code, slack;
  float limit;
  if (d) {
    // z = y' + 1 + u: the code floor(z) - 1 changes where z crosses an
    // integer, so the guard is -|z - rint(z)| <= -delta (NaN fails it). The
    // code is the low byte of RD(z + 1.5 * 2^23 - 1) = 1.5 * 2^23 - 1 +
    // floor(z) (|z| < 2^22; the sum's ulp is 1 and its bits end in
    // 0x3FFFFF + floor(z)): one add rounded down instead of a floor, the
    // -1 and a conversion.
    Value sum = AddRoundDownOp::create(b, loc, scaledApprox,
                                       B.c(0x1.8p23 - 1.0));
    Value bits = arith::BitcastOp::create(b, loc, b.getI32Type(), sum);
    code = arith::TruncIOp::create(b, loc, i8, bits);
    slack = arith::NegFOp::create(
        b, loc, math::AbsFOp::create(b, loc, B.sub(scaledApprox, f)));
    limit = float(-delta);
  } else {
    // The nearest integer: floor(y' + 0.5) but at the half-integers, which
    // the guard excludes (one rounding instead of an add and a floor).
    Value isNan =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, f, f);
    Value q = arith::SelectOp::create(b, loc, isNan, B.c(0.0), f);
    Operation *codeOp = b.clone(*conv);
    codeOp->setOperand(0, q);
    code = codeOp->getResult(0);
    // |y' - rint(y')| <= 0.5 - delta: y' is at least delta from the
    // half-integers where the code changes (NaN fails the compare).
    slack = math::AbsFOp::create(b, loc, B.sub(scaledApprox, f));
    limit = float(0.5 - delta);
  }
  auto guarded = GuardedOp::create(b, loc, TypeRange{i8}, slack,
                                   b.getF32FloatAttr(limit), ValueRange{code});
  Block *body = new Block();
  guarded.getFallback().push_back(body);
  OpBuilder rb = OpBuilder::atBlockEnd(body);
  IRMapping m;
  // The exact chain's u as (1 + u) - 1 (exact), so that only the fallback
  // computes it.
  if (d)
    m.map(s.dither, arith::SubFOp::create(
                        rb, loc, d,
                        arith::ConstantOp::create(rb, loc,
                                                  rb.getF32FloatAttr(1.0f))));
  for (Operation *op : s.chain)
    rb.clone(*op, m);
  YieldOp::create(rb, loc, ValueRange{m.lookup(conv->getResult(0))});
  conv->getResult(0).replaceAllUsesWith(guarded.getResult(0));
  return guarded;
}

/// One guarded op for all of a group body's codes: one test of the
/// worker's lanes and one branch instead of one per state. The merged op
/// takes the place of the last one; users of the earlier ones' results
/// (element stores) move after it.
void merge(MutableArrayRef<GuardedOp> ops) {
  if (ops.size() < 2)
    return;
  GuardedOp last = ops.back();
  GuardedOp first = ops.front();
  for (GuardedOp g : ops.drop_back())
    for (Operation *user : g->getUsers())
      if (user->getNumResults() != 0 || user->getBlock() != last->getBlock())
        return;
  OpBuilder b(last);
  Location loc = last.getLoc();
  Value slack = first.getSlack();
  float limit = first.getLimit().convertToFloat();
  SmallVector<Value> fast;
  SmallVector<Type> types;
  for (GuardedOp g : ops) {
    if (g != first)
      slack = arith::MaximumFOp::create(b, loc, slack, g.getSlack());
    limit = std::min(limit, g.getLimit().convertToFloat());
    fast.append(g.getFast().begin(), g.getFast().end());
    types.append(g.getResultTypes().begin(), g.getResultTypes().end());
  }
  auto merged =
      GuardedOp::create(b, loc, types, slack, b.getF32FloatAttr(limit), fast);
  Block *body = new Block();
  merged.getFallback().push_back(body);
  OpBuilder rb = OpBuilder::atBlockEnd(body);
  SmallVector<Value> yields;
  for (GuardedOp g : ops) {
    IRMapping m;
    Block &old = g.getFallback().front();
    for (Operation &op : old.without_terminator())
      rb.clone(op, m);
    for (Value v : cast<YieldOp>(old.getTerminator()).getValues())
      yields.push_back(m.lookupOrDefault(v));
  }
  YieldOp::create(rb, loc, yields);
  unsigned next = 0;
  Operation *after = merged;
  for (GuardedOp g : ops) {
    for (Value r : g.getResults()) {
      Value nr = merged.getResult(next++);
      SmallVector<Operation *> users(r.getUsers().begin(), r.getUsers().end());
      llvm::sort(users, [](Operation *x, Operation *y) {
        return x->isBeforeInBlock(y);
      });
      for (Operation *u : users)
        if (u->isBeforeInBlock(merged)) {
          u->moveAfter(after);
          after = u;
        }
      r.replaceAllUsesWith(nr);
    }
  }
  for (GuardedOp g : ops)
    g.erase();
}

struct FlashOptGuardedQuantizePass
    : mlir::flashopt::impl::FlashOptGuardedQuantizeBase<
          FlashOptGuardedQuantizePass> {
  void runOnOperation() override {
    getOperation().walk([&](GroupBodyOp body) {
      SmallVector<Site> sites;
      for (Operation &op : body.getBody().front())
        if (isa<arith::FPToSIOp, arith::FPToUIOp>(op))
          if (auto s = match(&op))
            sites.push_back(*s);
      // Guards of the two forms (rounded to nearest: slack <= 1/2 - delta;
      // dithered: -|z - rint(z)| <= -delta) merge separately.
      SmallVector<GuardedOp> nearest, dithered;
      // 1 + u per phase, shared by the body's dithered codes of that phase.
      llvm::DenseMap<int32_t, Value> onePlusUs;
      for (Site &s : sites) {
        GuardedOp g = rewrite(s, onePlusUs);
        (s.dither ? dithered : nearest).push_back(g);
      }
      merge(nearest);
      merge(dithered);
      // The exact chains now live in the fallbacks.
      IRRewriter rewriter(body.getContext());
      (void)runRegionDCE(rewriter, body.getBody());
    });
  }
};

} // namespace
