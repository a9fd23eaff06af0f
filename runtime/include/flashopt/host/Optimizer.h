//===- Optimizer.h - The backend-free optimizer core ------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One optimizer over one loaded bundle: param groups (hyper slots),
/// caller-owned params and grads, runtime-owned correction and state
/// buffers (one arena per buffer, each tensor's slice at a 64-entry
/// boundary, zeroed), the tensor and hyper tables, and the step — written
/// once over a Backend (Backend.h). CpuOptimizer and CudaOptimizer add how
/// they are created and their device's own knobs; the C ABI, gradient
/// accumulation, data parallelism and the Python binding all work through
/// this class.
///
/// No exception escapes: fallible calls return `Status` or `Expected<T>`.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_OPTIMIZER_H
#define FLASHOPT_HOST_OPTIMIZER_H

#include "flashopt/host/Backend.h"
#include "flashopt/host/Tables.h"

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashopt::host {

class Optimizer {
public:
  virtual ~Optimizer();
  Optimizer(const Optimizer &) = delete;
  Optimizer &operator=(const Optimizer &) = delete;

  const Manifest &manifest() const;
  Backend &backend();
  const Backend &backend() const;

  /// A new, empty optimizer like this one: the same loaded bundle (shared,
  /// so it stays loaded while either lives), the same backend and options
  /// (CPU threads; CUDA context and stream), one param group holding the
  /// manifest's defaults, no tensors. Sharded data parallelism keeps each
  /// rank's shard of the state in one.
  virtual Expected<std::unique_ptr<Optimizer>> create_sibling() const = 0;

  // ---- param groups (hyper slots) ----------------------------------------
  /// Adds a param group with the manifest's defaults; returns its slot
  /// (-1 if memory ran out).
  int add_param_group();
  int num_param_groups() const;
  /// Sets one hyper-parameter of one param group. Unknown names, bad slots,
  /// non-finite values and nonzero values of a hyper an elided state needs
  /// at 0 are rejected.
  Status set_hyper(int param_group, std::string_view name, float value);
  /// Sets one hyper-parameter in every param group.
  /// The envelopes take the current values (HyperTable::note_step): what a
  /// step does first. Sharded data parallelism calls it on the optimizer
  /// whose shards another steps, so that both keep the same envelopes.
  void note_hyper_step();
  /// Sets a hyper-parameter as a checkpoint recorded it (envelopes
  /// included; nullopt: an envelope before its first step).
  Status restore_hyper(int param_group, std::string_view name,
                       std::optional<float> value);
  Status set_hyper_all(std::string_view name, float value);
  Expected<float> hyper(int param_group, std::string_view name) const;
  /// The hyper table the kernel reads: slot-major, H floats per slot.
  const std::vector<float> &hyper_table() const;
  const HyperTable &hypers() const;

  // ---- tensors -------------------------------------------------------------
  /// Registers a tensor: `param` (numel elements of the manifest's param
  /// dtype) and `grad` (of its grad dtype; may be null until the first step)
  /// stay caller-owned (host pointers on the CPU, device addresses on CUDA)
  /// and must outlive their use. Reserves its zeroed correction and state
  /// slices; nothing is registered on failure. Returns the tensor index.
  /// Addresses from buffer() may move when a later tensor grows an arena.
  Expected<int64_t> add_param(int param_group, void *param, int64_t numel,
                              void *grad);
  /// Re-points a tensor's gradient (takes effect at the next step).
  Status set_grad(int64_t tensor, void *grad);
  /// Re-points a tensor's parameter storage.
  Status set_param(int64_t tensor, void *param);
  /// Sets the index of a tensor's first element in the logical tensor it is
  /// a piece of (>= 0; 0 after add_param): the bounded numerics' dither
  /// index (docs/NUMERICS.md §8, KERNEL-ABI "Tensor table" word 3), so a
  /// piece steps exactly as the same elements of the whole tensor.
  Status set_element_offset(int64_t tensor, int64_t offset);
  int64_t num_tensors() const;
  int64_t total_groups() const;
  int64_t total_numel() const;
  const TensorInfo &tensor(int64_t index) const;
  const std::vector<TensorInfo> &tensors() const;
  /// Makes the state of every registered tensor addressable now (CUDA
  /// allocates lazily: else the first step or buffer() does it).
  Status allocate();
  /// Buffer `name` (a manifest buffer name: "param", "grad", "correction",
  /// "exp_avg.codes", ...) of tensor `tensor` (allocating state first).
  Expected<BufferView> buffer(int64_t tensor, std::string_view name);
  /// Copies buffer `name` of tensor `tensor` to host memory (after all work
  /// queued before).
  Expected<std::vector<uint8_t>> read_buffer(int64_t tensor,
                                             std::string_view name);
  /// Overwrites buffer `name` of tensor `tensor` with `bytes` bytes of host
  /// memory (exactly the buffer's size).
  Status write_buffer(int64_t tensor, std::string_view name, const void *data,
                      int64_t bytes);
  /// The tensor table as last built (CPU: after every change; CUDA: at the
  /// last launch, when the state became addressable), one or more records
  /// per tensor of manifest.record_words int64 words.
  const std::vector<int64_t> &table() const;
  int64_t num_records() const;

  // ---- stepping ------------------------------------------------------------
  /// t += 1, then one kernel call over every tensor. Fails (t unchanged) if
  /// a grad is missing, a hyper without default was never set, or the
  /// backend fails.
  Status step();
  /// Runs the kernel with step number `t` over the tensors `indices` only
  /// (ascending, distinct); step_count() is unchanged (the caller keeps
  /// per-tensor counters: gradient release). A contiguous run [a, b) is one
  /// slice of the table (its records, global groups [first_group(a), end of
  /// b-1)); any other subset runs on a compacted copy of its records with
  /// word 1 renumbered from 0. Stepping every tensor this way equals step()
  /// bit for bit. Fails (nothing run) on a bad index, a missing gradient or
  /// an incomplete hyper table; an empty subset only checks the hyper table.
  Status step_tensors(const std::vector<int64_t> &indices, int64_t t,
                      abi::KernelKind kernel = abi::KernelKind::Step);
  /// Adds the gradients of tensors `indices` (as step_tensors) to their
  /// accumulators: the bundle's accumulate kernel (docs/KERNEL-ABI.md
  /// "Gradient accumulation"). An error naming the bundle when it has no
  /// accumulator.
  Status accumulate_tensors(const std::vector<int64_t> &indices);
  /// Elements [offset, offset + count) of tensor `tensor`'s accumulator,
  /// decoded to f32 (its encoding's decode: f32 as is, bf16 widened, bf16 +
  /// i8 the master-weight decode), into host memory `out`.
  Status read_accumulator(int64_t tensor, int64_t offset, int64_t count,
                          float *out);
  /// The inverse: encodes `count` f32 values of host memory `in` into
  /// elements [offset, offset + count) of the accumulator (elementwise, so
  /// any range encodes as the whole would).
  Status write_accumulator(int64_t tensor, int64_t offset, int64_t count,
                           const float *in);
  /// Zeroes every tensor's accumulator (all bits, as the accumulated steps
  /// leave it); nothing without an accumulator.
  Status zero_accumulators();
  /// Whether every decoded accumulator element of tensors `indices` is
  /// finite.
  Expected<bool> accumulators_finite(const std::vector<int64_t> &indices);
  /// The sum of the squares of each tensor's decoded accumulator, computed
  /// as grad_sum_squares computes it for f32 gradients (CPU only).
  Expected<std::vector<double>>
  accumulator_sum_squares(const std::vector<int64_t> &indices);
  /// Whether every gradient element of tensors `indices` is finite (no NaN
  /// or +-Inf). Missing gradients and bad indices are skipped.
  Expected<bool> grads_finite(const std::vector<int64_t> &indices);
  /// The sum of the squares of the gradient of each tensor of `indices`
  /// (double; deterministic: Backend::sum_squares). A missing gradient is 0.
  Expected<std::vector<double>>
  grad_sum_squares(const std::vector<int64_t> &indices);
  /// The number of the last step taken (0 before the first).
  int64_t step_count() const;
  /// Sets the step counter (checkpoint restore): the next step runs t + 1.
  void set_step_count(int64_t t);
  /// Waits for the backend's queue.
  Status synchronize();

  /// Frees the correction terms and states of every tensor (sharded data
  /// parallelism keeps its shard of them in another optimizer). Afterwards
  /// those buffers and stepping are errors, and bytes() counts none of them;
  /// the gradient accumulator stays (accumulate_tensors still runs).
  Status release_state();
  /// Whether release_state() was called.
  bool state_released() const;

  // ---- memory -------------------------------------------------------------
  BytesReport bytes() const;

protected:
  /// Takes the backend; call init() before use.
  explicit Optimizer(std::unique_ptr<Backend> backend);
  /// Checks the manifest and adds param group 0. `who` prefixes errors.
  Status init(const char *who);

  /// Creates a `Derived` (a subclass whose constructor takes the backend
  /// and befriends Optimizer) over a new `BackendT` built from `args`, and
  /// runs init(); every exception becomes an error prefixed with `who`.
  template <typename Derived, typename BackendT, typename... Args>
  static Expected<std::unique_ptr<Derived>> create_over(const char *who,
                                                        Args &&...args) {
    try {
      std::unique_ptr<Derived> o(
          new Derived(std::make_unique<BackendT>(std::forward<Args>(args)...)));
      if (Status s = o->init(who); !s)
        return s;
      return Expected<std::unique_ptr<Derived>>(std::move(o));
    } catch (const std::exception &e) {
      return Status::from_exception(e, std::string(who) + ": ");
    }
  }

private:
  /// Points `field` (param or grad) of `tensor` at `address`.
  Status repoint(int64_t tensor, void *TensorInfo::*field, void *address,
                 const char *who, const char *what);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_OPTIMIZER_H
