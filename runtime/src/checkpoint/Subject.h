//===- Subject.h - What a checkpoint is taken of ----------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A checkpoint is taken of, and loaded into, a Subject: one
/// host::Optimizer, the train::Stepper that steps it (the step counters; the
/// data parallelism whose owners hold the shards of a sharded state) and the
/// name and shape each of its tensors has in the file (TensorNames: the C
/// ABI's are the names its user registered; a test's or a tool's a
/// NameTable). The Subject also reads and writes one buffer of one tensor
/// as host bytes, gathered from and scattered to the owners when the state
/// is sharded (a collective every rank calls in the same order).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CHECKPOINT_SUBJECT_H
#define FLASHOPT_CHECKPOINT_SUBJECT_H

#include "flashopt/host/Optimizer.h"
#include "train/Stepper.h"

#include <cstdint>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <vector>

namespace flashopt::checkpoint {

using namespace flashopt::host;

/// The name and shape each tensor of an optimizer has in a checkpoint:
/// names unique, a shape's elements the tensor's numel.
class TensorNames {
public:
  virtual ~TensorNames() = default;
  /// How many tensors are named (the optimizer's num_tensors()).
  virtual int64_t size() const = 0;
  virtual const std::string &name(int64_t tensor) const = 0;
  virtual const std::vector<int64_t> &shape(int64_t tensor) const = 0;
  /// The tensor named `name`, or -1.
  virtual int64_t find(const std::string &name) const = 0;
};

/// TensorNames held in a table, in tensor order.
class NameTable final : public TensorNames {
public:
  /// Names tensor size(): InvalidArgument for a name taken already.
  Status add(std::string name, std::vector<int64_t> shape);
  int64_t size() const override { return int64_t(entries_.size()); }
  const std::string &name(int64_t tensor) const override {
    return entries_[size_t(tensor)].first;
  }
  const std::vector<int64_t> &shape(int64_t tensor) const override {
    return entries_[size_t(tensor)].second;
  }
  int64_t find(const std::string &name) const override;

private:
  std::vector<std::pair<std::string, std::vector<int64_t>>> entries_;
  std::map<std::string, int64_t> index_;
};

/// An optimizer, its stepper and its tensors' names (all outlive the
/// Subject, a view of them).
class Subject {
public:
  Subject(train::Stepper &stepper, const TensorNames &names)
      : stepper_(stepper), names_(names) {}

  host::Optimizer &optimizer() const { return stepper_.optimizer(); }
  train::Stepper &stepper() const { return stepper_; }
  const TensorNames &names() const { return names_; }
  const Manifest &manifest() const { return optimizer().manifest(); }
  /// The attached data parallelism, or null.
  dist::DataParallel *data_parallel() const { return stepper_.data_parallel(); }
  /// Whether the correction and state buffers are sharded over the ranks.
  bool sharded() const;

  /// Internal unless the names name every tensor of the optimizer: checked
  /// by every entry point of the module before it reads anything.
  Status check() const;
  /// "parameter 'w' (index 0)": how messages name tensor `i`.
  std::string describe(int64_t i) const;
  int64_t numel(int64_t i) const { return optimizer().tensor(i).numel; }
  int32_t group(int64_t i) const {
    return int32_t(optimizer().tensor(i).param_group);
  }

  /// The host bytes of buffer `name` of tensor `i` (sharded: gathered from
  /// its owner, a collective). Errors keep their code, the message prefixed
  /// with describe(i).
  Expected<std::vector<uint8_t>> read(int64_t i, const std::string &name) const;
  /// Overwrites buffer `name` of tensor `i` with `bytes` host bytes
  /// (sharded: scattered to its owner, a collective).
  Status write(int64_t i, const std::string &name, const void *data,
               int64_t bytes) const;

private:
  train::Stepper &stepper_;
  const TensorNames &names_;
};

/// Runs `body` (which returns a Status or an Expected) so that no exception
/// leaves the module: std::bad_alloc becomes OutOfMemory "out of memory",
/// any other exception Internal "internal error: <what>" (what the C ABI's
/// guard reported for them before).
template <typename F> auto no_throw(F &&body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return Status::error(Code::OutOfMemory, "out of memory");
  } catch (const std::exception &e) {
    return Status::error(Code::Internal,
                         std::string("internal error: ") + e.what());
  } catch (...) {
    return Status::error(Code::Internal, "internal error (unknown exception)");
  }
}

/// "'s'": how messages quote a name.
inline std::string quote(const std::string &s) { return "'" + s + "'"; }
/// "[2, 3]".
std::string shape_string(const std::vector<int64_t> &shape);

} // namespace flashopt::checkpoint

#endif // FLASHOPT_CHECKPOINT_SUBJECT_H
