//===- MpiComm.cpp - MPI communicators for libflashopt --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The flashopt_comm_backend table over MPI (flashopt_mpi.h): byte
/// all-gather, all-to-all and broadcast, and an fp32 reduce-scatter for
/// FLASHOPT_REDUCE_FAST (MpiCollectives.h), on a duplicate of the caller's
/// communicator with MPI_ERRORS_RETURN.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"

#include "MpiCollectives.h"

#include <new>

namespace {

struct MpiComm {
  MPI_Comm comm = MPI_COMM_NULL;
};

MPI_Comm commOf(void *self) { return static_cast<MpiComm *>(self)->comm; }

void destroy(void *self) {
  MpiComm *c = static_cast<MpiComm *>(self);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c->comm != MPI_COMM_NULL)
    MPI_Comm_free(&c->comm);
  delete c;
}

} // namespace

extern "C" flashopt_status flashopt_comm_create_mpi(MPI_Comm comm,
                                                    flashopt_comm *out) {
  if (!out)
    return FLASHOPT_ERROR_INVALID_ARGUMENT;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return FLASHOPT_ERROR_STATE;
  MpiComm *c = new (std::nothrow) MpiComm();
  if (!c)
    return FLASHOPT_ERROR_OUT_OF_MEMORY;
  if (MPI_Comm_dup(comm, &c->comm) != MPI_SUCCESS) {
    delete c;
    return FLASHOPT_ERROR_COMM;
  }
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(c->comm, &rank);
  MPI_Comm_size(c->comm, &size);
  flashopt_comm_backend b{};
  b.abi_version = FLASHOPT_ABI_VERSION;
  b.name = "MPI";
  b.rank = rank;
  b.size = size;
  b.self = c;
  flashopt::mpi::setHostCollectives<commOf>(b);
  b.destroy = destroy;
  flashopt_status s = flashopt_comm_create(&b, out);
  if (s != FLASHOPT_OK)
    destroy(c);
  return s;
}
