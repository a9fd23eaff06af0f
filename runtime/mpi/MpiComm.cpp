//===- MpiComm.cpp - MPI communicators for libflashopt
//---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The flashopt_comm_backend table over MPI (flashopt_mpi.h): byte
/// all-gather, all-to-all and broadcast, and an fp32 reduce-scatter for
/// FLASHOPT_REDUCE_FAST, on a duplicate of the caller's communicator with
/// MPI_ERRORS_RETURN. Broadcasts go in 1 GiB pieces; the other collectives
/// refuse more than INT_MAX bytes per rank (MPI_ERR_COUNT).
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"

#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

namespace {

struct MpiComm {
  MPI_Comm comm = MPI_COMM_NULL;
};

/// The int count of a byte collective; MPI_ERR_COUNT above INT_MAX bytes
/// per rank (libflashopt's buckets are far smaller).
int byteCount(size_t bytes, int *count) {
  if (bytes > size_t(INT_MAX))
    return MPI_ERR_COUNT;
  *count = int(bytes);
  return MPI_SUCCESS;
}

int allGather(void *self, const void *send, void *recv, size_t bytes) {
  MpiComm *c = static_cast<MpiComm *>(self);
  int count = 0;
  if (int rc = byteCount(bytes, &count); rc != MPI_SUCCESS)
    return rc;
  return MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, c->comm);
}

int allToAll(void *self, const void *send, void *recv, size_t bytes) {
  MpiComm *c = static_cast<MpiComm *>(self);
  int count = 0;
  if (int rc = byteCount(bytes, &count); rc != MPI_SUCCESS)
    return rc;
  return MPI_Alltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, c->comm);
}

int broadcast(void *self, void *buf, size_t bytes, int32_t root) {
  MpiComm *c = static_cast<MpiComm *>(self);
  // In pieces of at most 1 GiB (every rank cuts the same way): parameters
  // and states of large tensors go through here.
  const size_t piece = size_t(1) << 30;
  char *p = static_cast<char *>(buf);
  for (size_t off = 0; off < bytes; off += piece) {
    size_t n = bytes - off < piece ? bytes - off : piece;
    if (int rc = MPI_Bcast(p + off, int(n), MPI_BYTE, root, c->comm);
        rc != MPI_SUCCESS)
      return rc;
  }
  return MPI_SUCCESS;
}

int reduceScatterF32(void *self, const float *send, float *recv, size_t count) {
  MpiComm *c = static_cast<MpiComm *>(self);
  if (count > size_t(INT_MAX))
    return MPI_ERR_COUNT;
  return MPI_Reduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM,
                                  c->comm);
}

const char *errorString(void *, int code) {
  thread_local char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof text, "MPI error %d", code);
  else
    text[len] = '\0';
  return text;
}

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
  b.all_gather = allGather;
  b.all_to_all = allToAll;
  b.broadcast = broadcast;
  b.reduce_scatter_f32 = reduceScatterF32;
  b.error_string = errorString;
  b.destroy = destroy;
  flashopt_status s = flashopt_comm_create(&b, out);
  if (s != FLASHOPT_OK)
    destroy(c);
  return s;
}
