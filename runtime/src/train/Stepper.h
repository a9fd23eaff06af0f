//===- Stepper.h - What a training step means -------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The training step over one host::Optimizer, written once: the per-tensor
/// step and accumulation counters, the non-finite policy (propagate, or skip
/// the step and count it), gradient-norm clipping, the normalizer of an
/// accumulated gradient, and data parallelism (the ranks' agreement, the
/// reduction, the owners' shards). One step() does
///
///   agree -> reduce -> decide (skip, clip) -> step by counter groups (or
///   the owners' shards) -> finish
///
/// for a plain step and for one that ends a gradient accumulation. The C
/// ABI's entry points are a guard, a lock and one call each
/// (capi/StepApi.cpp, capi/AccumulateApi.cpp, capi/Comm.cpp).
///
/// Failures are a Status whose code says what went wrong (abi/Status.h),
/// set where it went wrong: the stepper's own checks give State (a call not
/// valid now: a missing gradient, micro-batches pending, a communicator
/// attached twice), InvalidArgument (a setter's value, a tensor or bucket
/// index) and Unsupported (a policy or accumulation the bundle or device
/// cannot do); what it calls keeps its own code: State (a hyper-parameter
/// never set), Mismatch (the ranks disagree), Comm (a collective, or
/// another rank, failed), Cuda (a driver call), OutOfMemory, Internal. The
/// stepper adds context to a message (the rank) but never changes a code.
/// A failed step advances no step counter.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TRAIN_STEPPER_H
#define FLASHOPT_TRAIN_STEPPER_H

#include "dist/DataParallel.h"
#include "flashopt/host/Optimizer.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::train {

using host::Code;
using host::Expected;
using host::Status;

/// What a step does with a non-finite (NaN or +-Inf) gradient.
enum class NonFinitePolicy {
  /// Step anyway: the NaN reaches the weights it touches.
  Propagate,
  /// Skip the whole step (every tensor; every rank) and count it.
  Skip,
};

/// The three shapes of a step.
enum class StepKind {
  /// No micro-batches pending: the step kernel on the gradients.
  Plain,
  /// Micro-batches pending, one process, nothing decided over the whole
  /// gradient: the fused kernel adds this last micro-batch in registers,
  /// scales by 1/N and steps (one pass over memory fewer).
  Fused,
  /// Micro-batches pending, and data parallelism, clipping or the skip
  /// policy: the last micro-batch is accumulated first, the accumulators
  /// reduced over the ranks, the decisions taken on the result, and the
  /// step_accumulated kernel steps at 1/(N * W).
  Accumulated,
};

/// Names tensor `i` in messages ("parameter 'w' (index 0)").
using TensorNamer = std::function<std::string(int64_t)>;

class Stepper {
public:
  /// A stepper over `opt` (which must outlive it). Tensors registered with
  /// `opt` at any time start with step and accumulation counters at 0.
  explicit Stepper(host::Optimizer &opt, TensorNamer name = nullptr);
  ~Stepper();
  Stepper(const Stepper &) = delete;
  Stepper &operator=(const Stepper &) = delete;

  host::Optimizer &optimizer() { return opt_; }

  // ---- stepping ------------------------------------------------------------
  /// The shape of the next step() (Accumulated or Fused while micro-batches
  /// are pending).
  StepKind next_step_kind() const;
  /// One step of every tensor (StepKind says which). Each tensor steps with
  /// its own counter + 1 (one kernel call per distinct counter); a skipped
  /// step counts in skipped_steps() and, when micro-batches were pending,
  /// drops them (the accumulators zeroed).
  Status step();
  /// Gradient release: steps tensor `i` alone (its counter + 1). State while
  /// micro-batches are pending, with clipping or with data parallelism.
  Status step_tensor(int64_t i);
  /// Adds the gradients of `indices` to their accumulators (one micro-batch
  /// each). Unsupported without an accumulator; State after a bucket was
  /// reduced for this step.
  Status accumulate(const std::vector<int64_t> &indices);

  // ---- counters ------------------------------------------------------------
  /// Steps taken by flashopt_step (skipped ones not counted).
  int64_t step_count() const { return step_; }
  /// Steps of tensor `i` (gradient release steps one at a time).
  int64_t tensor_step(int64_t i) const;
  /// Micro-batches added to tensor `i`'s accumulator since its last step.
  int64_t accumulated(int64_t i) const;
  /// Whether any tensor has micro-batches pending.
  bool accumulation_pending() const;
  int64_t skipped_steps() const { return skipped_; }
  /// Sets the step counters (a checkpoint restored): one step per tensor,
  /// the step count and the skipped steps. Micro-batches pending stay.
  void restore(const std::vector<int64_t> &tensor_steps, int64_t step,
               int64_t skipped);

  // ---- policy --------------------------------------------------------------
  /// Unsupported for Skip where the backend cannot scan gradients.
  Status set_nonfinite_policy(NonFinitePolicy policy);
  NonFinitePolicy nonfinite_policy() const { return policy_; }
  /// Clips the global gradient norm to `max_norm` (0: off) through the
  /// kernels' grad_scale: InvalidArgument unless finite and >= 0;
  /// Unsupported where the backend cannot sum gradients or the bundle has
  /// no grad_scale.
  Status set_max_grad_norm(double max_norm);
  double max_grad_norm() const { return maxGradNorm_; }
  /// The norm the last clipped step computed (-1: none yet, or clipping
  /// off).
  double last_grad_norm() const { return lastGradNorm_; }
  /// What an accumulated gradient is divided by (0: N micro-batches times W
  /// ranks). InvalidArgument unless finite and >= 0.
  Status set_accumulation_normalizer(double normalizer);
  double accumulation_normalizer() const { return normalizer_; }

  // ---- data parallelism ----------------------------------------------------
  /// Attaches `comm` (dist::DataParallel::attach over the tensors of
  /// `layout`; `sharded`: each rank keeps its shard of the state in a
  /// sibling optimizer, Optimizer::create_sibling). State when one is
  /// attached; Mismatch when the ranks' layouts differ; Unsupported when the
  /// engine lacks what `deterministic` = false needs; else Comm. Messages
  /// start "rank R of W: ".
  Status attach(std::shared_ptr<dist::Communicator> comm,
                const std::vector<dist::LayoutEntry> &layout,
                bool deterministic, size_t bucket_bytes, bool sharded);
  /// The attached data parallelism, or null.
  dist::DataParallel *data_parallel() { return dp_.get(); }
  const dist::DataParallel *data_parallel() const { return dp_.get(); }
  // ---- externally reduced data parallelism --------------------------------
  /// What this rank brings to an externally reduced step's agreement.
  struct ExternalStep {
    /// The framework found a non-finite gradient on this rank (e.g. torch's
    /// GradScaler): every rank skips the step.
    bool found_inf = false;
    /// Why this rank cannot step (success: it can): the step fails on every
    /// rank with this code and message, naming the rank.
    Status error;
    /// The caller's ids of the parameters that step (the framework's
    /// parameters, whose tensors here are this rank's pieces of them): the
    /// same on every rank (else Mismatch on every rank), each counted by
    /// external_step() when the step goes ahead — also on a rank that holds
    /// none of a parameter's elements.
    std::vector<int64_t> params;
  };
  /// Attaches `comm` for externally reduced data parallelism: a framework
  /// (FSDP2) has reduced the gradients already, and each rank steps its own
  /// tensors (its shards), which need not match other ranks' in number or
  /// size; `comm` carries only the steps' agreement (ExternalAgreement.cpp).
  /// State when a communicator is attached.
  Status attach_external(std::shared_ptr<dist::Communicator> comm);
  /// Whether externally reduced data parallelism is attached.
  bool external() const { return peers_ != nullptr; }
  /// One step of tensors `idx` (all of them: a whole step, counted in
  /// step_count()) under externally reduced data parallelism; collective:
  /// every rank calls it for every step, with its own tensors. The ranks
  /// agree (a fixed wire exchanged through `comm`): an error on any rank
  /// (`mine.error`, or this rank's own checks: a gradient missing, the
  /// hyper table incomplete, micro-batches pending, clipping on) fails the
  /// step on every rank with that rank's code and message; a different NaN
  /// policy, hyper table or parameter ids is Mismatch on every rank; then a
  /// `found_inf` on any rank, or under the skip policy a non-finite
  /// gradient on any rank, skips the step on every rank (counted in
  /// skipped_steps(); returns false). Otherwise each rank steps its tensors
  /// `idx`, each with its own counter + 1, and returns true. Nothing
  /// changes on any rank unless every rank steps. State without
  /// attach_external.
  Expected<bool> step_external(const std::vector<int64_t> &idx,
                               const ExternalStep &mine);
  /// The steps taken by the caller's parameter `id` (ExternalStep::params;
  /// 0 before its first).
  int64_t external_step(int64_t id) const;
  /// Sets it (a framework's checkpoint restored).
  void set_external_step(int64_t id, int64_t step);

  /// Averages bucket `b`'s gradients now (overlapping the backward pass);
  /// step() reduces the others. State without a communicator, with
  /// micro-batches pending, a gradient missing or the bucket reduced
  /// already; InvalidArgument for a bucket that does not exist; else Comm.
  Status reduce_bucket(int b);

private:
  /// The step of `kind` (next_step_kind()).
  Status step(StepKind kind);
  /// Counters for every registered tensor.
  void sync();
  std::vector<int64_t> allTensors() const;
  std::string name(int64_t i) const;
  /// InvalidArgument for an index out of range; State unless tensors `idx`
  /// have gradients and the hyper table is complete.
  Status checkReady(const std::vector<int64_t> &idx);
  /// Unsupported without an accumulator; State after a bucket reduction.
  Status checkCanAccumulate() const;
  /// Whether the gradients of `idx` are finite (Unsupported if unknown).
  Expected<bool> gradsFinite(const std::vector<int64_t> &idx);
  /// The ranks' agreement on this step; whether any rank skips it.
  Expected<bool> agree(StepKind kind, int64_t microBatches);
  /// The gradients (accumulators) of this step, reduced over the ranks.
  Status reduce(StepKind kind, int64_t microBatches);
  /// Whether the step goes ahead under the non-finite policy.
  Expected<bool> decide(StepKind kind);
  /// A skipped step: counted; pending micro-batches dropped.
  Status skip(StepKind kind);
  class GradScales;
  /// With clipping on: the global norm (last_grad_norm) and, above the
  /// maximum, every group's grad_scale times the clip factor.
  Status clip(StepKind kind, GradScales &scales);
  /// The kernel over every tensor: the owners' shards, or one call per
  /// distinct step counter.
  Status run(StepKind kind);
  /// Advances the counters after a step.
  void finish(StepKind kind);
  /// A hash of the hyper table, the same on ranks that set the same values.
  uint64_t hyperHash() const;

  struct Counters {
    int64_t step = 0;
    int64_t accumulated = 0;
  };
  host::Optimizer &opt_;
  TensorNamer name_;
  std::vector<Counters> counters_; ///< [tensor]
  int64_t step_ = 0, skipped_ = 0;
  NonFinitePolicy policy_ = NonFinitePolicy::Propagate;
  double maxGradNorm_ = 0.0, lastGradNorm_ = -1.0;
  double normalizer_ = 0.0;
  std::unique_ptr<dist::DataParallel> dp_;
  /// Externally reduced data parallelism: the ranks' agreement only, and
  /// the caller's parameters' step counters.
  std::shared_ptr<dist::Communicator> peers_;
  std::map<int64_t, int64_t> paramSteps_;
};

} // namespace flashopt::train

#endif // FLASHOPT_TRAIN_STEPPER_H
