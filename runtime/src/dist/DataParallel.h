//===- DataParallel.h - Replicated data parallelism --------------*- C++
//-*-===//
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

/// Buckets of `cap_bytes` of gradient each (the last one less), filled in
/// registration order; a tensor larger than what is left of a bucket
/// continues in the next, so the staging memory is bounded by the cap.
std::vector<Bucket> plan_buckets(const std::vector<LayoutEntry> &layout,
                                 int grad_bytes, size_t cap_bytes);

/// The text every rank must agree on: spec name and hash, param groups,
/// and one line per parameter.
std::string layout_text(const host::Manifest &m, int num_param_groups,
                        const std::vector<LayoutEntry> &layout);

class DataParallel {
public:
  /// Checks the layout across ranks (an error naming the first difference,
  /// the same on every rank), then copies parameters, correction terms and
  /// state from rank 0 into `opt` on every other rank.
  static Expected<std::unique_ptr<DataParallel>>
  attach(std::shared_ptr<Communicator> comm, host::Optimizer &opt,
         const std::vector<LayoutEntry> &layout, bool deterministic,
         size_t bucket_bytes);

  Communicator &comm() { return *comm_; }
  const std::vector<Bucket> &buckets() const { return buckets_; }
  /// Averages bucket `b`'s gradients (in place, in the gradient buffers).
  /// Reducing a bucket twice before a step is an error.
  Status reduce_bucket(host::Optimizer &opt, int b);
  /// Reduces every bucket not reduced yet, in order.
  Status reduce_remaining(host::Optimizer &opt);
  /// Starts the next step's bookkeeping (no bucket reduced).
  void step_done();
  /// What every rank must agree on before a step: its NaN policy, whether
  /// its gradients are all finite (only looked at under the skip policy),
  /// the clipping threshold, its hyper table and its step counter.
  struct StepView {
    bool skip_policy = false;
    bool finite = true;
    double max_grad_norm = 0.0;
    uint64_t hyper_hash = 0;
    int64_t step = 0;
  };
  /// All-gathers every rank's view: an error naming the first rank and the
  /// first thing that differs from rank 0's (the same on every rank), else
  /// whether any rank has a non-finite gradient.
  Expected<bool> agree(const StepView &mine);

private:
  DataParallel() = default;
  /// Bucket `bk` averaged by the engine in device memory.
  Status reduceOnDevice(host::Optimizer &opt, const Bucket &bk);
  std::shared_ptr<Communicator> comm_;
  bool deterministic_ = true;
  std::vector<Bucket> buckets_;
  std::vector<bool> reduced_;
};

} // namespace flashopt::dist

#endif // FLASHOPT_DIST_DATAPARALLEL_H
