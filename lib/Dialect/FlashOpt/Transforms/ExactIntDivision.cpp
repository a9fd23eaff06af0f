//===- ExactIntDivision.cpp - flashopt-exact-int-division -------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Rewrites `divf(itofp(k : iN), C)`, N <= 16, into q0 = k * r,
/// e = fma(-q0, C, k), q = fma(e, r, q0) with r = RN(1/C), after checking
/// exhaustively (APFloat, IEEE binary32, round to nearest even) that the
/// sequence equals the correctly rounded quotient for all 2^N numerators.
/// Results are bit-identical; the conformance tests hold every kernel to
/// the scalar reference. The reciprocal must be a normal number, so the
/// result does not depend on flush-to-zero modes.
///
//===----------------------------------------------------------------------===//

#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::flashopt {
#define GEN_PASS_DEF_FLASHOPTEXACTINTDIVISION
#include "flashopt/Dialect/FlashOpt/Transforms/Passes.h.inc"
} // namespace mlir::flashopt

using namespace mlir;
using llvm::APFloat;

namespace {

constexpr unsigned kMaxBits = 16;

/// The numerators an N-bit integer converted with sitofp/uitofp can take.
struct Range {
  int64_t lo, hi;
};

/// Whether q0 = RN(x*r), e = RN(-q0*C + x), q = RN(e*r + q0) equals
/// RN(x / C) bit for bit for every integer x in `range`.
bool sequenceIsExact(const APFloat &c, const APFloat &r, Range range) {
  const auto rm = APFloat::rmNearestTiesToEven;
  for (int64_t k = range.lo; k <= range.hi; ++k) {
    APFloat x{static_cast<float>(k)}; // exact: |k| < 2^24
    APFloat want = x;
    want.divide(c, rm);
    APFloat q0 = x;
    q0.multiply(r, rm);
    APFloat nq0 = q0;
    nq0.changeSign();
    APFloat e = nq0;
    e.fusedMultiplyAdd(c, x, rm);
    APFloat q = e;
    q.fusedMultiplyAdd(r, q0, rm);
    if (!q.bitwiseIsEqual(want))
      return false;
  }
  return true;
}

struct FlashOptExactIntDivisionPass
    : mlir::flashopt::impl::FlashOptExactIntDivisionBase<
          FlashOptExactIntDivisionPass> {
  void runOnOperation() override {
    // (divisor bits, signed, bit width) -> verified reciprocal (or none).
    llvm::DenseMap<uint64_t, std::optional<float>> verified;
    SmallVector<arith::DivFOp> divs;
    getOperation().walk([&](arith::DivFOp d) { divs.push_back(d); });
    for (arith::DivFOp div : divs) {
      if (!div.getType().isF32())
        continue;
      Operation *num = div.getLhs().getDefiningOp();
      if (!num || !isa<arith::SIToFPOp, arith::UIToFPOp>(num))
        continue;
      auto intTy = dyn_cast<IntegerType>(num->getOperand(0).getType());
      if (!intTy || intTy.getWidth() > kMaxBits)
        continue;
      FloatAttr cAttr;
      if (auto cst = div.getRhs().getDefiningOp<arith::ConstantOp>())
        cAttr = dyn_cast<FloatAttr>(cst.getValue());
      if (!cAttr)
        continue;
      APFloat c = cAttr.getValue();
      if (!c.isFiniteNonZero())
        continue;
      bool isSigned = isa<arith::SIToFPOp>(num);
      unsigned w = intTy.getWidth();
      Range range = isSigned ? Range{-(int64_t(1) << (w - 1)),
                                     (int64_t(1) << (w - 1)) - 1}
                             : Range{0, (int64_t(1) << w) - 1};
      uint64_t key = (c.bitcastToAPInt().getZExtValue() << 32) |
                     (uint64_t(isSigned) << 8) | w;
      auto it = verified.find(key);
      if (it == verified.end()) {
        APFloat r{1.0f};
        r.divide(c, APFloat::rmNearestTiesToEven);
        std::optional<float> ok;
        // A subnormal reciprocal would depend on the FTZ/DAZ state of
        // whoever runs the kernel: keep the division.
        if (r.isNormal() && sequenceIsExact(c, r, range))
          ok = r.convertToFloat();
        it = verified.try_emplace(key, ok).first;
      }
      if (!it->second)
        continue;
      OpBuilder b(div);
      Location loc = div.getLoc();
      Type f32 = b.getF32Type();
      Value x = div.getLhs();
      Value cv = div.getRhs();
      Value r = arith::ConstantOp::create(b, loc, b.getFloatAttr(f32, *it->second));
      Value q0 = arith::MulFOp::create(b, loc, x, r);
      Value nq0 = arith::NegFOp::create(b, loc, q0);
      Value e = math::FmaOp::create(b, loc, nq0, cv, x);
      Value q = math::FmaOp::create(b, loc, e, r, q0);
      div.replaceAllUsesWith(q);
      div.erase();
    }
  }
};

} // namespace
