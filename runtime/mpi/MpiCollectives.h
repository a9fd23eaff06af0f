//===- MpiCollectives.h - Host collectives over MPI -------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The host collectives of a flashopt_comm_backend over an MPI communicator,
/// written once for both engines that use MPI for them: libflashopt_mpi
/// (MpiComm.cpp) and libflashopt_nccl (its layout check, rank 0's state and
/// the per-step agreement; nccl/NcclComm.cpp). Each returns an MPI error
/// code (MPI_SUCCESS on success) and expects a communicator with
/// MPI_ERRORS_RETURN. Broadcasts go in 1 GiB pieces; the other collectives
/// refuse more than INT_MAX elements per rank (MPI_ERR_COUNT).
///
/// The source is compiled into each of the two libraries (hidden there):
/// neither exports more than its C entry points.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_MPI_MPICOLLECTIVES_H
#define FLASHOPT_MPI_MPICOLLECTIVES_H

#include "flashopt/flashopt_mpi.h" // <mpi.h> without its C++ bindings

#include <cstddef>
#include <cstdint>

namespace flashopt::mpi {

/// `bytes` bytes from every rank into `recv` (W blocks, rank order).
int allGatherBytes(MPI_Comm comm, const void *send, void *recv, size_t bytes);

/// Block q of `send` (`bytes` bytes each) to rank q; `recv` gets every
/// rank's block for this rank, in rank order.
int allToAllBytes(MPI_Comm comm, const void *send, void *recv, size_t bytes);

/// `bytes` bytes of `buf` from rank `root` to every rank, in pieces of at
/// most 1 GiB (every rank cuts the same way).
int broadcastBytes(MPI_Comm comm, void *buf, size_t bytes, int32_t root);

/// `send` holds W blocks of `count` floats, block q for rank q; `recv` gets
/// this rank's block summed over the ranks (MPI's order).
int reduceScatterF32(MPI_Comm comm, const float *send, float *recv,
                     size_t count);

/// MPI's text for `code` (a thread-local buffer, valid until the thread's
/// next call), or "MPI error <code>" when MPI has none.
const char *errorString(int code);

/// Points `b`'s all_gather, all_to_all, broadcast and reduce_scatter_f32 at
/// the collectives above, over the communicator `CommOf(self)`, and its
/// error_string at errorString (an engine with codes of its own sets
/// error_string after).
template <MPI_Comm (*CommOf)(void *self)>
void setHostCollectives(flashopt_comm_backend &b) {
  b.all_gather = [](void *self, const void *send, void *recv, size_t bytes) {
    return allGatherBytes(CommOf(self), send, recv, bytes);
  };
  b.all_to_all = [](void *self, const void *send, void *recv, size_t bytes) {
    return allToAllBytes(CommOf(self), send, recv, bytes);
  };
  b.broadcast = [](void *self, void *buf, size_t bytes, int32_t root) {
    return broadcastBytes(CommOf(self), buf, bytes, root);
  };
  b.reduce_scatter_f32 = [](void *self, const float *send, float *recv,
                            size_t count) {
    return reduceScatterF32(CommOf(self), send, recv, count);
  };
  b.error_string = [](void *, int code) { return errorString(code); };
}

} // namespace flashopt::mpi

#endif // FLASHOPT_MPI_MPICOLLECTIVES_H
