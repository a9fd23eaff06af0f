//===- Communicator.h - An engine's collectives, with errors -----*- C++
//-*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The C ABI's flashopt_comm_backend table wrapped for the runtime: every
/// collective returns a Status naming the engine and the operation, and the
/// engine's state is released with the last owner. libflashopt moves no
/// bytes between processes itself: MPI (flashopt_mpi) or NCCL do.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_DIST_COMMUNICATOR_H
#define FLASHOPT_DIST_COMMUNICATOR_H

#include "flashopt/flashopt.h"
#include "flashopt/host/Abi.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace flashopt::dist {

using host::Code;
using host::Expected;
using host::Status;

class Communicator {
public:
  /// Checks and copies `backend` (abi version, rank/size, required
  /// functions); the error says what is wrong.
  static Expected<std::shared_ptr<Communicator>>
  create(const flashopt_comm_backend &backend);
  ~Communicator();
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  int rank() const { return b_.rank; }
  int size() const { return b_.size; }
  const std::string &name() const { return name_; }

  Status all_gather(const void *send, void *recv, size_t bytes);
  Status all_to_all(const void *send, void *recv, size_t bytes);
  Status broadcast(void *buf, size_t bytes, int root);
  bool has_reduce_scatter() const { return b_.reduce_scatter_f32 != nullptr; }
  Status reduce_scatter_f32(const float *send, float *recv, size_t count);
  /// Whether the engine averages device-memory gradients itself
  /// (flashopt_comm_backend::reduce_mean_device: NCCL).
  bool has_reduce_mean_device() const {
    return b_.reduce_mean_device != nullptr;
  }
  Status reduce_mean_device(void *const *pieces, const int64_t *counts,
                            size_t num_pieces, int32_t dtype, int32_t mode);
  /// Whether `flag` is true on any rank (every rank gets the same answer).
  Expected<bool> any(bool flag);

private:
  explicit Communicator(const flashopt_comm_backend &b);
  Status check(int code, const char *what) const;
  flashopt_comm_backend b_;
  std::string name_;
};

} // namespace flashopt::dist

#endif // FLASHOPT_DIST_COMMUNICATOR_H
