//===- UniformDivision.cpp - flashopt-uniform-division -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Rewrites an f32 division `x / c` inside a group body whose divisor is the
/// same for the whole launch (a per-step scalar of the kernel prologue, such
/// as Adam's bias corrections, or a constant) into binary64 arithmetic
/// without a division per element:
///
///   R = 1.0 / f64(c)                                  (prologue, once)
///   p = f64(x) * R                                    (per element)
///   q = f32((|p| + 1.5 * 2^-124) - 1.5 * 2^-124) with the sign of p
///
/// docs/NUMERICS.md §3b proves q == RN32(x / c) for every x and c, special
/// values included: p is within 2^-52 relative of x / c; a quotient that is
/// not an f32 tie lies at least 2^-49 relative and 2^-174 absolute from
/// every f32 rounding boundary; the only exact ties are subnormal quotients
/// by |c| >= 2, and the middle line (rounding p to a multiple of 2^-176
/// below 2^-126) puts p exactly on them. A constant divisor with |c| < 2
/// skips that line. The GPU pipeline runs it (div.rn.f32 is ~10 SASS with
/// its slow-path scaffolding; this is 6: two conversions, a DMUL, two DADD
/// and the sign); the CPU keeps `vdivps`, which measured faster.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/IR/FlashOptOps.h"
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Matchers.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTUNIFORMDIVISION
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using namespace mlir::flashopt;

namespace {

struct FlashOptUniformDivisionPass
    : mlir::flashopt::impl::FlashOptUniformDivisionBase<
          FlashOptUniformDivisionPass> {
  void runOnOperation() override {
    SmallVector<arith::DivFOp> divs;
    getOperation().walk([&](arith::DivFOp d) {
      auto body = d->getParentOfType<GroupBodyOp>();
      if (!body || !d.getType().isF32())
        return;
      Value c = d.getRhs();
      bool uniform = matchPattern(c, m_Constant()) ||
                     !body.getBody().isAncestor(c.getParentRegion());
      if (uniform)
        divs.push_back(d);
    });
    // One reciprocal per divisor, computed before the group body.
    struct Divisor {
      Value r;
      bool snap = true; // whether the quotient may be an exact f32 tie
    };
    DenseMap<Value, Divisor> divisors;
    for (arith::DivFOp div : divs) {
      Location loc = div.getLoc();
      Value c = div.getRhs();
      auto it = divisors.find(c);
      if (it == divisors.end()) {
        auto body = div->getParentOfType<GroupBodyOp>();
        OpBuilder b(body);
        auto f64 = b.getF64Type();
        Divisor d;
        APFloat cst(0.0f);
        if (matchPattern(c, m_ConstantFloat(&cst))) {
          // The same correctly rounded binary64 reciprocal, at compile time.
          // No quotient by |c| < 2 is an f32 tie: no snapping (§3b).
          APFloat two(2.0f);
          d.snap = !(cst.isFiniteNonZero() &&
                     abs(cst).compare(two) == APFloat::cmpLessThan);
          bool lost;
          cst.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven,
                      &lost); // exact: every f32 is a binary64
          APFloat one(1.0);
          one.divide(cst, APFloat::rmNearestTiesToEven);
          d.r = arith::ConstantOp::create(b, loc, b.getFloatAttr(f64, one));
        } else {
          Value cd = arith::ExtFOp::create(b, loc, f64, c);
          Value one =
              arith::ConstantOp::create(b, loc, b.getFloatAttr(f64, 1.0));
          d.r = arith::DivFOp::create(b, loc, one, cd);
        }
        it = divisors.insert({c, d}).first;
      }
      const Divisor &d = it->second;
      OpBuilder b(div);
      auto f64 = b.getF64Type();
      Value xd = arith::ExtFOp::create(b, loc, f64, div.getLhs());
      Value p = arith::MulFOp::create(b, loc, xd, d.r);
      Value q;
      if (d.snap) {
        // Round |p| to a multiple of 2^-176 where |p| < 2^-126 (|p| + K
        // stays in [2^-124, 2^-123)), nearly a no-op above: a quotient that
        // is an exact tie of the f32 subnormal grid (possible for |c| >= 2)
        // is within 2^-178 of it and lands on it; any other stays on its
        // side. The sign is p's, put back on the f32 result (one LOP3 on
        // the GPU: p's high word masked into the magnitude).
        Value k = arith::ConstantOp::create(b, loc,
                                            b.getFloatAttr(f64, 0x1.8p-124));
        Value mag = math::AbsFOp::create(b, loc, p);
        Value up = arith::AddFOp::create(b, loc, mag, k);
        Value snapped = arith::SubFOp::create(b, loc, up, k);
        Value qm = arith::TruncFOp::create(b, loc, b.getF32Type(), snapped);
        auto i64 = b.getI64Type(), i32 = b.getI32Type();
        Value pBits = arith::BitcastOp::create(b, loc, i64, p);
        Value hi = arith::TruncIOp::create(
            b, loc, i32,
            arith::ShRUIOp::create(
                b, loc, pBits,
                arith::ConstantOp::create(b, loc, b.getI64IntegerAttr(32))));
        Value sign = arith::AndIOp::create(
            b, loc, hi,
            arith::ConstantOp::create(
                b, loc, b.getI32IntegerAttr(static_cast<int32_t>(0x80000000u))));
        Value qBits = arith::OrIOp::create(
            b, loc, arith::BitcastOp::create(b, loc, i32, qm), sign);
        q = arith::BitcastOp::create(b, loc, b.getF32Type(), qBits);
      } else {
        q = arith::TruncFOp::create(b, loc, b.getF32Type(), p);
      }
      div.replaceAllUsesWith(q);
      div.erase();
    }
  }
};

} // namespace
