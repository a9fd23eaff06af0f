//===- GroupBodyLowering.cpp - Shared lowering of group bodies
//-------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Maps the scalar code of a `flashopt.group_body` onto W vector lanes.
/// Values that are uniform across a group (derived only from the prologue,
/// `flashopt.load_group` and `flashopt.group_max`) stay scalars; everything
/// else becomes a `vector<W x T>`, uniform operands being broadcast.
///
//===----------------------------------------------------------------------===//

#include "GroupBodyEmitter.h"

#include "flashopt/Conversion/GroupBodyLowering.h"

using namespace mlir;
using namespace mlir::flashopt;
using namespace mlir::flashopt::detail;

namespace {

/// The unsigned maxima of each of `in` (N vectors of W i32 lanes, N and W
/// powers of two, N <= W), reduced together: pairs of vectors merged half
/// by half (the lower halves of every segment of both against the upper
/// halves) until one vector of W lanes holds N segments of W/N; then folded
/// the same way while wider than `lanes`; then a butterfly within each
/// segment. Segment g's first lane is the maximum of in[g]; each merge and
/// fold step is two shuffles and one max of vectors, each butterfly step one
/// of each. For N = 4, W = 32 on 16 lanes: 17 vector operations instead of
/// 4 x 9.
SmallVector<Value> transposedMax(OpBuilder &b, Location loc, ArrayRef<Value> in,
                                 int64_t lanes) {
  auto maxOf = [&](Value x, Value y) -> Value {
    return arith::MaxUIOp::create(b, loc, x, y);
  };
  int64_t w = cast<VectorType>(in.front().getType()).getNumElements();
  SmallVector<Value> vs(in.begin(), in.end());
  int64_t segs = 1, len = w;
  // Lanes of the lower (`upper` false) or upper halves of every segment of
  // a vector of `segs` segments of `len`, starting at lane `base`.
  auto halves = [](SmallVectorImpl<int64_t> &mask, int64_t base, int64_t segs,
                   int64_t len, bool upper) {
    for (int64_t s = 0; s < segs; ++s)
      for (int64_t i = 0; i < len / 2; ++i)
        mask.push_back(base + s * len + (upper ? len / 2 : 0) + i);
  };
  while (vs.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < vs.size(); i += 2) {
      SmallVector<int64_t> lo, hi;
      halves(lo, 0, segs, len, false);
      halves(lo, w, segs, len, false);
      halves(hi, 0, segs, len, true);
      halves(hi, w, segs, len, true);
      next.push_back(
          maxOf(vector::ShuffleOp::create(b, loc, vs[i], vs[i + 1], lo),
                vector::ShuffleOp::create(b, loc, vs[i], vs[i + 1], hi)));
    }
    vs = next;
    segs *= 2;
    len /= 2;
  }
  Value z = vs.front();
  int64_t width = w;
  while (width > lanes && len > 1) {
    SmallVector<int64_t> lo, hi;
    halves(lo, 0, segs, len, false);
    halves(hi, 0, segs, len, true);
    z = maxOf(vector::ShuffleOp::create(b, loc, z, z, lo),
              vector::ShuffleOp::create(b, loc, z, z, hi));
    width /= 2;
    len /= 2;
  }
  for (int64_t d = len / 2; d >= 1; d /= 2) {
    SmallVector<int64_t> swap;
    for (int64_t i = 0; i < width; ++i)
      swap.push_back(i ^ d);
    z = maxOf(z, vector::ShuffleOp::create(b, loc, z, z, swap));
  }
  SmallVector<Value> out;
  for (int64_t g = 0; g < int64_t(in.size()); ++g)
    out.push_back(vector::ExtractOp::create(b, loc, z, g * len));
  return out;
}

} // namespace

LogicalResult mlir::flashopt::emitGroupBody(OpBuilder &b, KernelOp kernel,
                                            const GroupBodyEnv &env,
                                            const IRMapping &mapping) {
  return emitGroupBodies(b, kernel, ArrayRef<GroupBodyEnv>(env), mapping);
}

/// Emits the bodies of `envs` step by step: each operation of the body for
/// every group before the next operation, so that independent groups stand
/// side by side in the instruction stream. The body is split into phases:
/// phase 0 is everything that does not depend on a `flashopt.group_max`; a
/// group maximum of a phase-p value is available from phase p+1 on. Each
/// phase emits its uniform (scalar) code, then its varying (vector) code and
/// the workers' part of the group maxima, then its element stores, then
/// completes the maxima across workers. Element stores thus follow the last
/// computation they need.
LogicalResult mlir::flashopt::emitGroupBodies(OpBuilder &b, KernelOp kernel,
                                              ArrayRef<GroupBodyEnv> envs,
                                              const IRMapping &mapping,
                                              int64_t reduceLanes) {
  GroupBodyOp body = getGroupBody(kernel);
  if (!body)
    return kernel.emitOpError() << "has no group body";
  Block &block = body.getBody().front();
  std::vector<std::unique_ptr<GroupBodyEmitter>> emitters;
  for (const GroupBodyEnv &env : envs) {
    emitters.push_back(
        std::make_unique<GroupBodyEmitter>(b, kernel, env, mapping));
    if (failed(emitters.back()->prepare(block, body.getLoc())))
      return failure();
  }
  for (Operation &op : block)
    for (auto &e : emitters)
      e->emitLoad(op);
  int64_t phases = emitters.front()->numPhases();
  for (int64_t p = 0; p < phases; ++p) {
    for (Operation &op : block)
      for (auto &e : emitters)
        if (failed(e->emitUniformStep(op, p)))
          return failure();
    int64_t n = emitters.size();
    int64_t w = emitters.front()->width();
    bool batch = reduceLanes > 0 && n > 1 && llvm::isPowerOf2_64(n) &&
                 llvm::isPowerOf2_64(w) && n <= w;
    for (Operation &op : block) {
      if (batch && llvm::all_of(emitters, [&](auto &e) {
            return e->canBatchMax(op, p);
          })) {
        SmallVector<Value> in;
        for (auto &e : emitters)
          in.push_back(e->maxInputBits(op));
        SmallVector<Value> out = transposedMax(b, op.getLoc(), in, reduceLanes);
        for (int64_t g = 0; g < n; ++g)
          emitters[g]->setPartialMaxBits(op, out[g]);
        continue;
      }
      for (auto &e : emitters)
        e->emitVaryingStep(op, p);
    }
    for (Operation &op : block)
      for (auto &e : emitters)
        e->emitStoreStep(op, p);
    for (Operation &op : block)
      for (auto &e : emitters)
        e->emitMaxStep(op, p);
  }
  return success();
}

bool mlir::flashopt::usesElementOffset(KernelOp kernel) {
  GroupBodyOp body = getGroupBody(kernel);
  if (!body)
    return false;
  bool found = false;
  body.walk([&](DitherOp) { found = true; });
  return found;
}
