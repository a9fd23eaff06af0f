//===- DataParallel.h - Replicated data parallelism ------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// DDP semantics beside the optimizer core, not inside a backend: the
/// layout check across ranks, the initial copy of rank 0's parameters and
/// state, and the average of the gradients in byte-capped buckets (fixed
/// order on every rank). Each bucket is reduced as reduce-scatter then
/// all-gather, so every element is reduced once by its owner and copied to
/// the others: the replicas are bit-identical by construction. In
/// deterministic mode the owner sums the W contributions in rank order in
/// fp32 (then divides by W and rounds once to the gradient dtype), so a
/// single process that sums the same way gets the same bits.
///
/// Gradients, parameters and state are reached through the core's
/// read_buffer / write_buffer, so this works on every backend (device
/// buffers are staged through host memory) -- except when the engine
/// averages device memory itself (reduce_mean_device: NCCL) and the
/// optimizer is on CUDA: then each bucket's gradient pieces are handed to
/// the engine in place.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIST_DATAPARALLEL_H
#define FLASHOPT_DIST_DATAPARALLEL_H

#include "Communicator.h"
#include "flashopt/host/Optimizer.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::dist {

/// One registered parameter, as the layout check compares it.
struct LayoutEntry {
  std::string name;
  int64_t numel = 0;
  int32_t group = 0;
};

/// Elements [offset, offset + count) of tensor `tensor`'s gradient.
struct Piece {
  int64_t tensor = 0, offset = 0, count = 0;
};

/// Gradient elements reduced together: consecutive pieces of consecutive
/// parameters [first, first + count).
struct Bucket {
  std::vector<Piece> pieces;
  int64_t first = 0, count = 0;
  int64_t numel = 0; ///< elements of gradient in the bucket
};

/// Calls `fn(piece, at)` for each of `pieces` in order, `at` its first
/// element when the pieces lie back to back; stops at the first failure.
template <typename Fn>
Status forEachPiece(const std::vector<Piece> &pieces, Fn &&fn) {
  int64_t at = 0;
  for (const Piece &pc : pieces) {
    if (Status s = fn(pc, at); !s)
      return s;
    at += pc.count;
  }
  return Status::success();
}

/// Buckets of `cap_bytes` of gradient each (the last one less), filled in
/// registration order; a tensor larger than what is left of a bucket
/// continues in the next, so the staging memory is bounded by the cap.
std::vector<Bucket> plan_buckets(const std::vector<LayoutEntry> &layout,
                                 int grad_bytes, size_t cap_bytes);

/// The text every rank must agree on: spec name and hash, param groups,
/// and one line per parameter.
std::string layout_text(const host::Manifest &m, int num_param_groups,
                        const std::vector<LayoutEntry> &layout);

/// The elements [begin, end) of a tensor one rank owns in sharded mode:
/// quantization groups [floor(g*r/W), floor(g*(r+1)/W)) of its g groups, so
/// every shard boundary is a group boundary and a tensor with fewer than W
/// groups leaves some ranks owning nothing of it.
struct OwnedRange {
  int64_t begin = 0, end = 0;
};
OwnedRange owned_range(int64_t numel, int64_t group_size, int rank, int W);

/// Makes the optimizer that holds one rank's shards (same bundle and
/// backend kind as the full one, no tensors).
using OwnerFactory =
    std::function<Expected<std::unique_ptr<host::Optimizer>>()>;

class DataParallel {
public:
  /// Checks the layout across ranks (an error naming the first difference,
  /// the same on every rank), then copies parameters, correction terms and
  /// state from rank 0 into `opt` on every other rank.
  /// With `make_owner`, sharded mode (ZeRO-1): each rank keeps only its
  /// shard of the correction terms and states (in the optimizer
  /// `make_owner` returns; `opt` releases its own), the gradients are
  /// reduce-scattered to their owners and the parameters all-gathered after
  /// the owners' step.
  static Expected<std::unique_ptr<DataParallel>>
  attach(std::shared_ptr<Communicator> comm, host::Optimizer &opt,
         const std::vector<LayoutEntry> &layout, bool deterministic,
         size_t bucket_bytes, const OwnerFactory &make_owner = nullptr);

  Communicator &comm() { return *comm_; }
  const std::vector<Bucket> &buckets() const { return buckets_; }
  /// Averages bucket `b`'s gradients (in place, in the gradient buffers).
  /// Reducing a bucket twice before a step is an error.
  Status reduce_bucket(host::Optimizer &opt, int b);
  /// Reduces every bucket not reduced yet, in order.
  Status reduce_remaining(host::Optimizer &opt);
  /// Starts the next step's bookkeeping (no bucket reduced).
  void step_done();
  /// Whether a bucket was reduced since the last step.
  bool any_reduced() const;
  /// What every rank must agree on before a step: its NaN policy, whether
  /// its gradients are all finite (only looked at under the skip policy),
  /// the clipping threshold, its hyper table and its step counter.
  struct StepView {
    bool skip_policy = false;
    bool finite = true;
    double max_grad_norm = 0.0;
    uint64_t hyper_hash = 0;
    int64_t step = 0;
    /// Micro-batches accumulated for this step (0: none) and the
    /// normalizer the accumulated gradient is divided by (0: N * W).
    int64_t micro_batches = 0;
    double normalizer = 0.0;
  };
  /// All-gathers every rank's view: an error naming the first rank and the
  /// first thing that differs from rank 0's (the same on every rank), else
  /// whether any rank has a non-finite gradient.
  Expected<bool> agree(const StepView &mine);

  // ---- gradient accumulation (Accumulation.cpp) ----------------------------
  /// Sums every rank's accumulators (each rank's N micro-batches, decoded
  /// to f32) in the buckets, in bucket order: reduce-scatter (deterministic:
  /// rank-order f32 sums) then, replicated, all-gather, the sums encoded
  /// back into `opt`'s accumulators; sharded, each owner encodes its sums
  /// into its shard's accumulators (and, with set_full_grads, every rank
  /// gets all of them in `opt`'s). Not divided: the step's grad_scale
  /// carries 1/(N * W) or the caller's normalizer.
  Status reduce_accumulators(host::Optimizer &opt);
  /// Whether the reduced accumulators are all finite, the same answer on
  /// every rank (replicated: `opt`'s, bit-identical everywhere; sharded:
  /// each owner's shard, agreed over the ranks).
  Expected<bool> accumulators_finite(host::Optimizer &opt);
  /// Zeroes `opt`'s accumulators and, sharded, the shard's.
  Status zero_accumulators(host::Optimizer &opt);

  // ---- sharded mode (ZeRO-1; Sharded.cpp) ---------------------------------
  bool sharded() const { return owner_ != nullptr; }
  /// Sharded mode also writes the averaged gradients back into the callers'
  /// gradient buffers (an all-gather more per bucket; set while clipping is
  /// on, so the norm is computed over the same bits as in replicated mode).
  void set_full_grads(bool on) { fullGrads_ = on; }
  /// Steps this rank's shards with step number `t` (hyper-parameters copied
  /// from `opt` first) with kernel `kernel` (step_accumulated: on the
  /// shard's reduced accumulators), then all-gathers the parameters of
  /// every bucket.
  Status step_shards(host::Optimizer &opt, int64_t t,
                     abi::KernelKind kernel = abi::KernelKind::Step);
  /// Buffer `name` of tensor `tensor` whole, in host memory: a correction or
  /// state buffer is all-gathered from its owners (a collective: every rank
  /// calls it in the same order), any other buffer is read from `opt`.
  Expected<std::vector<uint8_t>>
  gather_buffer(host::Optimizer &opt, int64_t tensor, const std::string &name);
  /// Overwrites buffer `name` of tensor `tensor` from its whole contents:
  /// a correction or state buffer keeps only this rank's shard.
  Status scatter_buffer(host::Optimizer &opt, int64_t tensor,
                        const std::string &name, const void *data,
                        int64_t bytes);
  /// The correction and state bytes this rank holds, its gradient staging
  /// and the shard optimizer's allocation.
  host::BytesReport shard_bytes() const;

private:
  DataParallel() = default;
  /// Bucket `bk` averaged by the engine in device memory.
  Status reduceOnDevice(host::Optimizer &opt, const Bucket &bk);
  Status shard(host::Optimizer &opt, const std::vector<LayoutEntry> &layout,
               const OwnerFactory &make);
  Status reduce_sharded(host::Optimizer &opt, int b);
  /// Bucket `b`'s accumulators (Accumulation.cpp).
  Status reduce_accumulator_bucket(host::Optimizer &opt, int b);
  /// `send` holds W blocks of `M` f32 values, block q for rank q; `sum`
  /// gets this rank's block summed over the ranks (deterministic: in rank
  /// order in f32; fast: the engine's reduce-scatter).
  Status reduceScatterF32(std::vector<float> &send, int64_t M,
                          std::vector<float> &sum);
  /// `send` holds W blocks of `M` gradient elements of dtype `grad`, block
  /// q for rank q; `mine` gets this rank's block averaged over the ranks:
  /// summed in f32 (deterministic: in rank order, the blocks travelling in
  /// `grad`, whose widening is exact; fast: the engine's reduce-scatter),
  /// divided by W and rounded once to `grad` (Sharded.cpp).
  Status averageBlocks(const std::vector<uint8_t> &send, host::DType grad,
                       int64_t M, std::vector<uint8_t> &mine);
  /// Elements of bucket `b` owned by rank `q`, in bucket order.
  const std::vector<Piece> &owned(int b, int q) const {
    return ownedPieces_[size_t(b) * size_t(comm_->size()) + size_t(q)];
  }
  /// The most elements of bucket `b` one rank owns.
  int64_t maxOwned(int b) const;
  /// Buffer `name`'s spec when this rank keeps only its shard of it
  /// (sharded mode: correction terms and states), else nullptr.
  Expected<const host::BufferSpec *>
  shardedBuffer(const host::Manifest &m, const std::string &name) const;
  /// The owner layout of bucket `b`'s sharded collectives: W blocks of
  /// maxOwned(b) elements, block q from element q * maxOwned(b) holding the
  /// pieces rank q owns back to back, in bucket order (the rest zero).
  /// Calls `fn(piece, at)` for each piece rank `q` owns, `at` its first
  /// element in rank q's block; stops at the first failure.
  template <typename Fn> Status forEachOwnedPiece(int b, int q, Fn &&fn) const {
    return forEachPiece(owned(b, q), fn);
  }
  /// Calls `fn(piece, at)` for each piece of every rank but `except`, rank
  /// by rank, `at` its first element in the whole owner layout; stops at
  /// the first failure.
  template <typename Fn>
  Status forEachPackedPiece(int b, Fn &&fn, int except = -1) const {
    const int64_t M = maxOwned(b);
    for (int q = 0; q < comm_->size(); ++q) {
      if (q == except)
        continue;
      if (Status s = forEachOwnedPiece(
              b, q,
              [&](const Piece &pc, int64_t at) { return fn(pc, q * M + at); });
          !s)
        return s;
    }
    return Status::success();
  }

  std::unique_ptr<host::Optimizer> owner_;
  std::vector<OwnedRange> ranges_;  ///< [tensor] this rank's elements
  std::vector<int64_t> ownerIndex_; ///< [tensor] index in owner_ or -1
  /// The owner's gradient of one owned range: the reduced gradient.
  struct Stage {
    std::shared_ptr<void> mem; ///< Backend::allocate_scratch
    int64_t bytes = 0;
  };
  std::vector<Stage> stage_;                    ///< [owner tensor]
  std::vector<std::vector<Piece>> ownedPieces_; ///< [bucket * W + rank]
  std::vector<LayoutEntry> layout_;
  bool fullGrads_ = false;

  std::shared_ptr<Communicator> comm_;
  bool deterministic_ = true;
  std::vector<Bucket> buckets_;
  std::vector<bool> reduced_;
};

} // namespace flashopt::dist

#endif // FLASHOPT_DIST_DATAPARALLEL_H
