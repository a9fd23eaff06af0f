//===- Subject.cpp - What a checkpoint is taken of ------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// NameTable, and a Subject's buffers as host bytes: the optimizer's own,
/// or (sharded data parallelism) gathered from and scattered to their
/// owners.
///
//===----------------------------------------------------------------------===//

#include "checkpoint/Subject.h"

namespace flashopt::checkpoint {

std::string shape_string(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status NameTable::add(std::string name, std::vector<int64_t> shape) {
  if (index_.count(name))
    return Status::error(Code::InvalidArgument,
                         "tensor name " + quote(name) + " is taken");
  index_.emplace(name, size());
  entries_.emplace_back(std::move(name), std::move(shape));
  return Status::success();
}

int64_t NameTable::find(const std::string &name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

bool Subject::sharded() const {
  const dist::DataParallel *dp = data_parallel();
  return dp && dp->sharded();
}

Status Subject::check() const {
  if (names_.size() != optimizer().num_tensors())
    return Status::error(Code::Internal,
                         "checkpoint: " + std::to_string(names_.size()) +
                             " tensor names for the " +
                             std::to_string(optimizer().num_tensors()) +
                             " tensors of the optimizer");
  return Status::success();
}

std::string Subject::describe(int64_t i) const {
  return "parameter " + quote(names_.name(i)) + " (index " + std::to_string(i) +
         ")";
}

Expected<std::vector<uint8_t>> Subject::read(int64_t i,
                                             const std::string &name) const {
  Expected<std::vector<uint8_t>> bytes =
      sharded() ? data_parallel()->gather_buffer(optimizer(), i, name)
                : optimizer().read_buffer(i, name);
  if (!bytes)
    return bytes.status().prefixed(describe(i) + ": ");
  return bytes;
}

Status Subject::write(int64_t i, const std::string &name, const void *data,
                      int64_t bytes) const {
  Status s = sharded() ? data_parallel()->scatter_buffer(optimizer(), i, name,
                                                         data, bytes)
                       : optimizer().write_buffer(i, name, data, bytes);
  if (!s)
    return s.prefixed(describe(i) + ": ");
  return s;
}

} // namespace flashopt::checkpoint
