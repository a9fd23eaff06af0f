//===- MpiCollectives.cpp - Host collectives over MPI ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "MpiCollectives.h"

#include <climits>
#include <cstdio>

namespace flashopt::mpi {

namespace {

/// The int count of a collective; MPI_ERR_COUNT above INT_MAX per rank
/// (libflashopt's buckets are far smaller).
int intCount(size_t count, int *out) {
  if (count > size_t(INT_MAX))
    return MPI_ERR_COUNT;
  *out = int(count);
  return MPI_SUCCESS;
}

} // namespace

int allGatherBytes(MPI_Comm comm, const void *send, void *recv, size_t bytes) {
  int count = 0;
  if (int rc = intCount(bytes, &count); rc != MPI_SUCCESS)
    return rc;
  return MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm);
}

int allToAllBytes(MPI_Comm comm, const void *send, void *recv, size_t bytes) {
  int count = 0;
  if (int rc = intCount(bytes, &count); rc != MPI_SUCCESS)
    return rc;
  return MPI_Alltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm);
}

int broadcastBytes(MPI_Comm comm, void *buf, size_t bytes, int32_t root) {
  // Parameters and states of large tensors go through here.
  const size_t piece = size_t(1) << 30;
  char *p = static_cast<char *>(buf);
  for (size_t off = 0; off < bytes; off += piece) {
    size_t n = bytes - off < piece ? bytes - off : piece;
    if (int rc = MPI_Bcast(p + off, int(n), MPI_BYTE, root, comm);
        rc != MPI_SUCCESS)
      return rc;
  }
  return MPI_SUCCESS;
}

int reduceScatterF32(MPI_Comm comm, const float *send, float *recv,
                     size_t count) {
  int n = 0;
  if (int rc = intCount(count, &n); rc != MPI_SUCCESS)
    return rc;
  return MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm);
}

const char *errorString(int code) {
  thread_local char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof text, "MPI error %d", code);
  else
    text[len] = '\0';
  return text;
}

} // namespace flashopt::mpi
