//===- OptimizerImpl.h - The optimizer core's state -------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// host::Optimizer's private state (the pimpl), shared by the files of the
/// core: Optimizer.cpp (tensors, param groups, the table, stepping) and
/// Accumulator.cpp (gradient accumulation). Not installed.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_RUNTIME_CORE_OPTIMIZERIMPL_H
#define FLASHOPT_RUNTIME_CORE_OPTIMIZERIMPL_H

#include "flashopt/host/Optimizer.h"

#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flashopt::host {

struct Optimizer::Impl {
  std::unique_ptr<Backend> backend;
  const Manifest *m = nullptr;
  int64_t G = 1;
  size_t B = 0;
  std::unique_ptr<HyperTable> hypers;

  std::vector<TensorInfo> tensors;
  std::vector<std::vector<int64_t>> offsets; ///< [tensor][buffer] arena entry
  int64_t totalGroups = 0, totalNumel = 0;

  /// The host table, its records per tensor, and what it was built from.
  std::vector<int64_t> table;
  std::vector<int64_t> recordStart{0}; ///< [tensor] first record; + total
  int64_t records = 0;
  uint64_t tableGeneration = 0;
  bool dirty = false;              ///< tensors changed since the build
  std::vector<int64_t> builtBases; ///< arena addresses of the build
  std::vector<int64_t> compacted;  ///< step_tensors: a subset's records
  int64_t t = 0;
  bool released = false; ///< release_state(): no correction or state here

  /// What release_state() frees: the correction terms and states (the
  /// gradient accumulator stays: every rank accumulates its own gradients).
  bool releasable(size_t b) const {
    BufferRole r = m->buffers[b].role;
    return r == BufferRole::Correction || r == BufferRole::State;
  }

  bool runtimeOwned(size_t b) const {
    BufferRole r = m->buffers[b].role;
    return r == BufferRole::Correction || r == BufferRole::State ||
           r == BufferRole::Accum;
  }

  /// The address of element/group 0 of buffer b of tensor i.
  int64_t address(size_t i, size_t b) const {
    const BufferSpec &spec = m->buffers[b];
    if (spec.role == BufferRole::Param)
      return int64_t(reinterpret_cast<uintptr_t>(tensors[i].param));
    if (spec.role == BufferRole::Grad)
      return int64_t(reinterpret_cast<uintptr_t>(tensors[i].grad));
    // Arena offsets are multiples of 64 entries: whole bytes at any width.
    return backend->arena_address(b) +
           int64_t(dtype_bytes(spec.dtype, uint64_t(offsets[i][b])));
  }

  std::vector<int64_t> bases() const {
    std::vector<int64_t> out(B, 0);
    for (size_t b = 0; b < B; ++b)
      if (runtimeOwned(b))
        out[b] = backend->arena_address(b);
    return out;
  }

  /// Appends tensor i's records to `out`; returns how many.
  int64_t appendRecords(size_t i, std::vector<int64_t> &out) const {
    std::vector<int64_t> addresses(B, 0);
    for (size_t b = 0; b < B; ++b)
      addresses[b] = address(i, b);
    return append_table_records(*m, tensors[i], addresses,
                                backend->max_record_elements(), out);
  }

  void rebuild() {
    table.clear();
    table.reserve(tensors.size() * size_t(m->record_words));
    records = 0;
    recordStart.assign(1, 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      records += appendRecords(i, table);
      recordStart.push_back(records);
    }
    builtBases = bases();
    dirty = false;
    ++tableGeneration;
  }

  /// Rebuilds the table if it is stale and the state is addressable.
  void refresh() {
    if (!backend->committed())
      return;
    if (dirty || builtBases != bases())
      rebuild();
  }

  /// A changed param or grad address of tensor i: rewrite its records in
  /// place when the table is current, else leave it to the next build.
  void repoint(size_t i) {
    if (dirty || !backend->committed() || builtBases != bases()) {
      dirty = true;
      refresh();
      return;
    }
    std::vector<int64_t> recs;
    appendRecords(i, recs);
    std::copy(recs.begin(), recs.end(),
              table.begin() + recordStart[i] * m->record_words);
    ++tableGeneration;
  }

  Status checkTensor(int64_t tensor, const char *who) const {
    if (tensor < 0 || tensor >= int64_t(tensors.size()))
      return Status::error(Code::InvalidArgument, std::string(who) +
                                                      ": no tensor " +
                                                      std::to_string(tensor));
    return Status::success();
  }

  /// checkTensor, and [offset, offset + count) inside the tensor's elements.
  Status checkElements(int64_t tensor, int64_t offset, int64_t count,
                       const char *who) const {
    if (Status s = checkTensor(tensor, who); !s)
      return s;
    const int64_t numel = tensors[size_t(tensor)].numel;
    if (offset < 0 || count < 0 || offset > numel - count)
      return Status::error(Code::InvalidArgument,
                           std::string(who) + ": " + std::to_string(count) +
                               " elements at offset " + std::to_string(offset) +
                               " do not fit tensor " + std::to_string(tensor) +
                               " (" + std::to_string(numel) + " elements)");
    return Status::success();
  }

  /// What reading or writing accumulator elements checks first (`who`
  /// names the call): the bundle has an accumulator, the elements fit the
  /// tensor; then makes the state addressable.
  Status checkAccumulator(int64_t tensor, int64_t offset, int64_t count,
                          const char *who) {
    if (!m->accumulator)
      return Status::error(Code::Unsupported,
                           std::string(who) + ": " + m->name +
                               " has no gradient accumulator");
    if (Status s = checkElements(tensor, offset, count, who); !s)
      return s;
    return prepare();
  }

  /// Elements [offset, offset + count) of buffer `b` of tensor `i` are
  /// whole bytes: always, unless the buffer is packed (4-bit codes, two per
  /// byte), where the range must start at an even element and end at an
  /// even one or at the buffer's end (its last byte's pad nibble).
  Status checkPackedRange(size_t i, size_t b, int64_t offset, int64_t count,
                          const char *who) const {
    const BufferSpec &spec = m->buffers[b];
    if (!dtype_is_packed(spec.dtype))
      return Status::success();
    const int64_t n = spec.per == Per::Group ? tensors[i].num_groups
                                             : tensors[i].numel;
    const int64_t end = offset + count;
    if (offset % 2 == 0 && (end % 2 == 0 || end == n))
      return Status::success();
    return Status::error(
        Code::InvalidArgument,
        std::string(who) + ": buffer \"" + spec.name + "\" of tensor " +
            std::to_string(i) + " is packed two " + dtype_name(spec.dtype) +
            " codes per byte: elements [" + std::to_string(offset) + ", " +
            std::to_string(end) + ") do not start at an even element and " +
            "end at an even one or at its end (" + std::to_string(n) + ")");
  }

  /// Copies elements [offset, offset + count) of buffer `b` of tensor `i`
  /// to host memory `dst` (the state must be addressable: prepare()); a
  /// packed buffer's range is checkPackedRange's, `dst` holding its bytes.
  Status readElements(size_t i, size_t b, int64_t offset, int64_t count,
                      void *dst) const {
    const DType t = m->buffers[b].dtype;
    if (Status s = checkPackedRange(i, b, offset, count, "read"); !s)
      return s;
    const int64_t a = address(i, b) + int64_t(dtype_bytes(t, uint64_t(offset)));
    return backend->read(reinterpret_cast<const void *>(uintptr_t(a)), dst,
                         int64_t(dtype_bytes(t, uint64_t(count))));
  }
  /// Overwrites elements [offset, offset + count) of buffer `b` of tensor
  /// `i` with host memory `src`; a packed buffer's pad nibble (the high
  /// nibble of an odd-length buffer's last byte) is written as 0.
  Status writeElements(size_t i, size_t b, int64_t offset, int64_t count,
                       const void *src) const {
    const DType t = m->buffers[b].dtype;
    if (Status s = checkPackedRange(i, b, offset, count, "write"); !s)
      return s;
    const int64_t a = address(i, b) + int64_t(dtype_bytes(t, uint64_t(offset)));
    const int64_t bytes = int64_t(dtype_bytes(t, uint64_t(count)));
    if (dtype_is_packed(t) && count % 2 != 0) {
      std::vector<uint8_t> v(static_cast<const uint8_t *>(src),
                             static_cast<const uint8_t *>(src) + bytes);
      v.back() &= 0x0F;
      return backend->write(reinterpret_cast<void *>(uintptr_t(a)), v.data(),
                            bytes);
    }
    return backend->write(reinterpret_cast<void *>(uintptr_t(a)), src, bytes);
  }

  /// Makes the state addressable and the table current.
  Status prepare() {
    if (Status s = backend->commit(); !s)
      return s;
    refresh();
    return Status::success();
  }
};

} // namespace flashopt::host

#endif // FLASHOPT_RUNTIME_CORE_OPTIMIZERIMPL_H
