//===- Accumulation.cpp - Gradient accumulation x data parallelism --------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// DataParallel's reduction of the gradient accumulators. Each rank has
/// added its N micro-batches into its own accumulators (the generated
/// accumulate kernel, the last micro-batch included: no fused step under
/// data parallelism); at the step the accumulators, not the last
/// gradients, are reduced in the same byte-capped buckets, in the same
/// fixed order, as the gradients would be. Every encoding is decoded to
/// f32 before it travels (f32 as is; bf16 widened and bf16 + i8
/// master-decoded, both exact), so the owner sums W f32 values in rank
/// order, exactly what a single process summing the ranks' accumulators in
/// that order computes; the sum is encoded back into the accumulator's
/// encoding (elementwise, so per piece as for the whole tensor) for the
/// step_accumulated kernel, which applies 1/(N * W) (or the caller's
/// normalizer) once, through grad_scale. The sum is not divided here.
///
//===----------------------------------------------------------------------===//

#include "DataParallel.h"

#include <algorithm>
#include <cstring>
#include <exception>

namespace flashopt::dist {

using namespace flashopt::host;

Status DataParallel::reduceScatterF32(std::vector<float> &send, int64_t M,
                                      std::vector<float> &sum) {
  const int64_t W = comm_->size();
  sum.assign(size_t(M), 0.0f);
  if (!deterministic_)
    return comm_->reduce_scatter_f32(send.data(), sum.data(), size_t(M));
  std::vector<float> parts(send.size());
  if (Status s = comm_->all_to_all(send.data(), parts.data(),
                                   size_t(M) * sizeof(float));
      !s)
    return s;
  // Rank 0's contribution, then ranks 1 .. W-1 added in order.
  std::copy(parts.begin(), parts.begin() + M, sum.begin());
  for (int64_t r = 1; r < W; ++r)
    for (int64_t k = 0; k < M; ++k)
      sum[size_t(k)] = sum[size_t(k)] + parts[size_t(r * M + k)];
  return Status::success();
}

Status DataParallel::reduce_accumulator_bucket(Optimizer &opt, int bi) {
  const Bucket &bk = buckets_[size_t(bi)];
  const int W = comm_->size(), me = comm_->rank();
  // Accumulator elements of `opt` into or out of `buf`, as laid out.
  auto readInto = [&](float *buf) {
    return [&opt, buf](const Piece &pc, int64_t at) {
      return opt.read_accumulator(pc.tensor, pc.offset, pc.count, buf + at);
    };
  };
  auto writeFrom = [&](const float *buf) {
    return [&opt, buf](const Piece &pc, int64_t at) {
      return opt.write_accumulator(pc.tensor, pc.offset, pc.count, buf + at);
    };
  };
  if (!sharded()) {
    // Replicated: slices of ceil(numel / W), reduced by their owner, then
    // all-gathered (every element summed once: identical replicas).
    const int64_t slice = (bk.numel + W - 1) / W;
    std::vector<float> packed(size_t(slice * W), 0.0f);
    if (Status s = forEachPiece(bk.pieces, readInto(packed.data())); !s)
      return s;
    std::vector<float> sum;
    if (Status s = reduceScatterF32(packed, slice, sum); !s)
      return s;
    if (Status s = comm_->all_gather(sum.data(), packed.data(),
                                     size_t(slice) * sizeof(float));
        !s)
      return s;
    return forEachPiece(bk.pieces, writeFrom(packed.data()));
  }
  // Sharded: contributions packed by owner (forEachPackedPiece).
  const int64_t M = maxOwned(bi);
  std::vector<float> send(size_t(W * M), 0.0f);
  if (Status s = forEachPackedPiece(bi, readInto(send.data())); !s)
    return s;
  std::vector<float> sum;
  if (Status s = reduceScatterF32(send, M, sum); !s)
    return s;
  if (Status s = forEachOwnedPiece(
          bi, me,
          [&](const Piece &pc, int64_t at) {
            const int64_t k = ownerIndex_[size_t(pc.tensor)];
            const int64_t begin = ranges_[size_t(pc.tensor)].begin;
            return owner_->write_accumulator(k, pc.offset - begin, pc.count,
                                             sum.data() + at);
          });
      !s)
    return s;
  if (!fullGrads_)
    return Status::success();
  // Clipping: every rank needs every reduced accumulator for the norm.
  if (Status s =
          comm_->all_gather(sum.data(), send.data(), size_t(M) * sizeof(float));
      !s)
    return s;
  return forEachPackedPiece(bi, writeFrom(send.data()));
}

Status DataParallel::reduce_accumulators(Optimizer &opt) {
  if (!opt.manifest().accumulator)
    return Status::error(Code::Unsupported,
                         "reduce_accumulators: " + opt.manifest().name +
                             " has no gradient accumulator");
  try {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (reduced_[b])
        return Status::error(Code::State,
                             "bucket " + std::to_string(b) +
                                 " was reduced as gradients for this step, but "
                                 "the step reduces the accumulators");
      if (Status s = reduce_accumulator_bucket(opt, int(b)); !s)
        return s;
    }
    return Status::success();
  } catch (const std::exception &e) {
    return Status::from_exception(e, "reduce_accumulators: ");
  }
}

Expected<bool> DataParallel::accumulators_finite(Optimizer &opt) {
  if (!sharded()) {
    std::vector<int64_t> all(size_t(opt.num_tensors()));
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    // The all-gathered sums: the same bits, so the same answer, everywhere.
    return opt.accumulators_finite(all);
  }
  std::vector<int64_t> mine(size_t(owner_->num_tensors()));
  for (size_t i = 0; i < mine.size(); ++i)
    mine[i] = int64_t(i);
  Expected<bool> finite = owner_->accumulators_finite(mine);
  if (!finite)
    return finite.status();
  Expected<bool> bad = comm_->any(!*finite);
  if (!bad)
    return bad.status();
  return !*bad;
}

Status DataParallel::zero_accumulators(Optimizer &opt) {
  if (Status s = opt.zero_accumulators(); !s)
    return s;
  return sharded() ? owner_->zero_accumulators() : Status::success();
}

} // namespace flashopt::dist
