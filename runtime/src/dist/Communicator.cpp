//===- Communicator.cpp - An engine's collectives, with errors
//-------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "Communicator.h"

#include <memory>
#include <vector>

namespace flashopt::dist {

Communicator::Communicator(const flashopt_comm_backend &b)
    : b_(b), name_(b.name && *b.name ? b.name : "communicator") {}

Communicator::~Communicator() {
  if (b_.destroy)
    b_.destroy(b_.self);
}

Expected<std::shared_ptr<Communicator>>
Communicator::create(const flashopt_comm_backend &b) {
  if (b.abi_version != FLASHOPT_ABI_VERSION)
    return Status::error(Code::InvalidArgument,
                         "the backend was built for ABI version " +
                             std::to_string(b.abi_version) +
                             ", this library is " +
                             std::to_string(FLASHOPT_ABI_VERSION));
  if (b.size < 1 || b.rank < 0 || b.rank >= b.size)
    return Status::error(Code::InvalidArgument,
                         "rank " + std::to_string(b.rank) + " of size " +
                             std::to_string(b.size) + " is not a valid rank");
  const char *missing = !b.all_gather   ? "all_gather"
                        : !b.all_to_all ? "all_to_all"
                        : !b.broadcast  ? "broadcast"
                                        : nullptr;
  if (missing)
    return Status::error(Code::InvalidArgument,
                         std::string("the backend has no ") + missing +
                             " function");
  return std::shared_ptr<Communicator>(new Communicator(b));
}

Status Communicator::check(int code, const char *what) const {
  if (code == 0)
    return Status::success();
  const char *text = b_.error_string ? b_.error_string(b_.self, code) : nullptr;
  return Status::error(
      Code::Comm,
      name_ + " " + what + " failed on rank " + std::to_string(b_.rank) + ": " +
          (text ? std::string(text) : "error " + std::to_string(code)));
}

Status Communicator::all_gather(const void *send, void *recv, size_t bytes) {
  return check(b_.all_gather(b_.self, send, recv, bytes), "all_gather");
}

Status Communicator::all_to_all(const void *send, void *recv, size_t bytes) {
  return check(b_.all_to_all(b_.self, send, recv, bytes), "all_to_all");
}

Status Communicator::broadcast(void *buf, size_t bytes, int root) {
  return check(b_.broadcast(b_.self, buf, bytes, root), "broadcast");
}

Status Communicator::reduce_scatter_f32(const float *send, float *recv,
                                        size_t count) {
  if (!b_.reduce_scatter_f32)
    return Status::error(Code::Unsupported,
                         name_ + " has no reduce_scatter_f32");
  return check(b_.reduce_scatter_f32(b_.self, send, recv, count),
               "reduce_scatter_f32");
}

Status Communicator::reduce_mean_device(void *const *pieces,
                                        const int64_t *counts,
                                        size_t num_pieces, int32_t dtype,
                                        int32_t mode) {
  if (!b_.reduce_mean_device)
    return Status::error(Code::Unsupported,
                         name_ + " has no reduce_mean_device");
  return check(
      b_.reduce_mean_device(b_.self, pieces, counts, num_pieces, dtype, mode),
      "reduce_mean_device");
}

Expected<bool> Communicator::any(bool flag) {
  uint8_t mine = flag ? 1 : 0;
  std::vector<uint8_t> all(size_t(size()), 0);
  if (Status s = all_gather(&mine, all.data(), 1); !s)
    return s;
  for (uint8_t f : all)
    if (f)
      return true;
  return false;
}

} // namespace flashopt::dist
