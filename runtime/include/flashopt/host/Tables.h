//===- Tables.h - Hyper tables, tensor records, bytes reports ---*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The backend-free data of an optimizer step (docs/KERNEL-ABI.md): the
/// hyper-parameter table with its validation, the tensor-table records
/// (and the splitting of large tensors into several), the checks of a
/// step's tensor subset, and the exact bytes report. Used by the optimizer
/// core (Optimizer.h); no backend, no device.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_TABLES_H
#define FLASHOPT_HOST_TABLES_H

#include "flashopt/host/Abi.h"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace flashopt::host {

/// One registered tensor.
struct TensorInfo {
  int64_t numel = 0;
  int64_t first_group = 0; ///< table word 1
  int64_t num_groups = 0;  ///< ceil(numel / G)
  int param_group = 0;     ///< hyper slot, table word 2
  /// Index of the tensor's first element in the logical tensor it is a
  /// shard of (0 for a whole tensor); table word 3 adds each record's own
  /// offset to it (the bounded numerics' dither index, docs/NUMERICS.md §8).
  int64_t element_offset = 0;
  /// Host pointers (CPU) or device addresses (CUDA), caller-owned.
  void *param = nullptr;
  void *grad = nullptr;
};

/// A view of one buffer of one tensor.
struct BufferView {
  /// A host pointer (CPU) or a device address (CUDA).
  void *data = nullptr;
  DType dtype = DType::F32;
  Per per = Per::Element;
  int64_t count = 0; ///< elements (per-element) or groups (per-group)
  int64_t bytes = 0; ///< dtype_bytes(dtype, count)
  bool runtime_owned = false;
};

/// Exact memory, in bytes, by category, computed from the registered tensors
/// (per-group buffers count ceil(numel / G) entries). `per_param` divides by
/// `numel`; for large tensors it equals the manifest's bytes_per_param.
struct BytesReport {
  int64_t numel = 0;
  int64_t param = 0, correction = 0, grad = 0;
  int64_t states = 0;                  ///< every state buffer, scales included
  int64_t accumulator = 0;             ///< the gradient accumulator, if any
  int64_t total = 0; ///< param + correction + grad + states + accumulator
  int64_t total_with_grad_release = 0; ///< total - grad
  /// Bytes the runtime actually allocated (correction and state arenas,
  /// 64-element alignment padding, spare capacity and device tables
  /// included).
  int64_t runtime_allocated = 0;
  BytesPerParam per_param;
};

/// The hyper-parameter table of one optimizer: param groups (slots) of H
/// floats in the manifest's `hypers` order, slot-major (docs/KERNEL-ABI.md),
/// with the validation every back end applies.
class HyperTable {
public:
  /// Checks that every elided state's hyper-parameter defaults to 0 (or has
  /// no default).
  static Status check_manifest(const Manifest &m);
  /// An empty table (no slots) for `m`, which must outlive it.
  explicit HyperTable(const Manifest &m) : m_(&m) {}

  /// Adds a slot holding the manifest's defaults; returns it (-1 if memory
  /// ran out).
  int add_slot();
  int num_slots() const { return slots_; }
  /// Sets one value. Unknown names, bad slots, non-finite values, nonzero
  /// values of a hyper an elided state needs at 0 and envelopes (kept by the
  /// table itself) are rejected.
  Status set(int slot, std::string_view name, float value);
  /// Sets one value as a checkpoint recorded it, envelopes included (a
  /// finite value, as set() checks); nullopt leaves an envelope unset (no
  /// step was taken yet).
  Status restore(int slot, std::string_view name, std::optional<float> value);
  /// Whether column `h` of `slot` holds a value (a default, a set value, or
  /// an envelope after its first step).
  bool given(int slot, size_t h) const {
    return given_[size_t(slot) * m_->hypers.size() + h] != 0;
  }
  /// A step is about to run with the current values: every envelope column
  /// (HyperSpec::is_envelope) takes the running maximum or minimum of its
  /// hyper-parameter, in every slot (the value itself at the first step).
  void note_step();
  /// Sets one value in every slot.
  Status set_all(std::string_view name, float value);
  Expected<float> get(int slot, std::string_view name) const;
  /// An error naming the first hyper-parameter that has no default and was
  /// never set (prefixed "step: "; envelopes excepted), else success.
  Status check_complete() const;
  /// The table the kernel reads: num_slots() * H floats.
  const std::vector<float> &values() const { return values_; }
  /// Incremented by every change of values(): a device copy is stale when
  /// its generation differs.
  uint64_t generation() const { return generation_; }

private:
  Status check(int slot, std::string_view name, int *index) const;
  const Manifest *m_;
  std::vector<float> values_;
  std::vector<uint8_t> given_; ///< slots * H: default or set
  int slots_ = 0;
  uint64_t generation_ = 0;
};

/// One table record's part of a tensor: elements [offset, offset + numel).
struct RecordSlice {
  int64_t offset = 0;
  int64_t numel = 0;
};

/// Splits a tensor of `numel` elements into table records of at most
/// `max_record_elements` elements. Every boundary is a multiple of 64 groups
/// (64 * group_size elements), so each record starts at a group boundary and
/// at a 64-entry (hence 16-byte aligned) offset of every per-element and
/// per-group buffer. `max_record_elements` below 64 * group_size is raised
/// to it. A tensor that fits is one record.
std::vector<RecordSlice> split_records(int64_t numel, int64_t group_size,
                                       int64_t max_record_elements);

/// The largest record the GPU kernels take (they index elements with 32-bit
/// math): 2^31 - 1 rounded down to a multiple of 64 * group_size.
int64_t gpu_max_record_elements(int64_t group_size);

/// Appends the records of tensor `t` to `table` (docs/KERNEL-ABI.md):
/// split with split_records when it exceeds `max_record_elements`, each
/// record's word 1 being its own first global group and its buffer words
/// `addresses[b]` (element 0 / group 0 of buffer b of the tensor) advanced to
/// the record's first element or group. Returns the number of records.
int64_t append_table_records(const Manifest &m, const TensorInfo &t,
                             const std::vector<int64_t> &addresses,
                             int64_t max_record_elements,
                             std::vector<int64_t> &table);

/// Checks that every tensor has a gradient (the first one without is named).
Status check_all_grads(const std::vector<TensorInfo> &tensors);

/// Checks the tensor subset of a step_tensors call: valid, ascending,
/// distinct indices whose tensors all have a gradient.
Status check_step_indices(const std::vector<TensorInfo> &tensors,
                          const std::vector<int64_t> &indices);

/// The bytes report of `tensors` under `m`; `runtime_allocated` is passed
/// through.
BytesReport compute_bytes_report(const Manifest &m,
                                 const std::vector<TensorInfo> &tensors,
                                 int64_t runtime_allocated);

} // namespace flashopt::host

#endif // FLASHOPT_HOST_TABLES_H
