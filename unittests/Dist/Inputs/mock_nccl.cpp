//===- mock_nccl.cpp - A stand-in libnccl over MPI, for tests -------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The NCCL entry points libflashopt_nccl uses (runtime/nccl/
/// NcclFunctions.def), over MPI_COMM_WORLD on host memory: under the
/// stand-in CUDA driver (flashopt_emulated_cuda) device memory is host
/// memory, so the NCCL path runs with real mpirun ranks and no GPU, as the
/// CUDA path runs against the stand-in driver. Synchronous (streams are
/// ignored). ncclCommInitRank checks that every rank got rank 0's unique id
/// (so the id exchange is tested), and flashopt_mock_nccl_bytes() counts the
/// bytes the collectives moved (so a test sees that the path was taken).
///
//===----------------------------------------------------------------------===//

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#define API extern "C" __attribute__((visibility("default")))

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

namespace {

struct Op {
  bool send;
  void *buf;
  size_t bytes;
  int peer;
  ncclComm_t comm;
};

int groupDepth = 0;
std::vector<Op> pending;
uint64_t movedBytes = 0;

size_t typeBytes(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8:
    return 1;
  case ncclFloat16:
  case ncclBfloat16:
    return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32:
    return 4;
  default:
    return 8;
  }
}

ncclResult_t flush() {
  std::vector<MPI_Request> reqs;
  for (const Op &op : pending) {
    MPI_Request r;
    int rc = op.send ? MPI_Isend(op.buf, int(op.bytes), MPI_BYTE, op.peer, 77,
                                 op.comm->comm, &r)
                     : MPI_Irecv(op.buf, int(op.bytes), MPI_BYTE, op.peer, 77,
                                 op.comm->comm, &r);
    if (rc != MPI_SUCCESS)
      return ncclSystemError;
    reqs.push_back(r);
    if (op.send)
      movedBytes += op.bytes;
  }
  pending.clear();
  if (MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE) !=
      MPI_SUCCESS)
    return ncclSystemError;
  return ncclSuccess;
}

} // namespace

API uint64_t flashopt_mock_nccl_bytes() { return movedBytes; }

API ncclResult_t ncclGetVersion(int *version) {
  *version = 22000;
  return ncclSuccess;
}

API const char *ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : "stand-in NCCL error";
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  std::random_device rd;
  for (size_t i = 0; i < sizeof id->internal; ++i)
    id->internal[i] = char(rd() & 0xff);
  return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id,
                                  int rank) {
  auto *c = new ncclComm();
  MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
  MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  // Every rank must hold rank 0's id (the caller's exchange worked).
  ncclUniqueId root = id;
  MPI_Bcast(&root, int(sizeof root), MPI_BYTE, 0, c->comm);
  int same = std::memcmp(&root, &id, sizeof id) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, c->comm);
  if (nranks != c->size || rank != c->rank || !all) {
    MPI_Comm_free(&c->comm);
    delete c;
    return ncclInvalidArgument;
  }
  *out = c;
  return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    MPI_Comm_free(&c->comm);
  delete c;
  return ncclSuccess;
}

API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count,
                               ncclDataType_t t, ncclComm_t c, cudaStream_t) {
  int n = int(count * typeBytes(t));
  movedBytes += size_t(n);
  return MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, c->comm) ==
                 MPI_SUCCESS
             ? ncclSuccess
             : ncclSystemError;
}

API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                   ncclDataType_t t, ncclRedOp_t op,
                                   ncclComm_t c, cudaStream_t) {
  if (t != ncclFloat32 || op != ncclSum)
    return ncclInvalidArgument; // the only one flashopt uses
  movedBytes += count * 4;
  return MPI_Reduce_scatter_block(send, recv, int(count), MPI_FLOAT, MPI_SUM,
                                  c->comm) == MPI_SUCCESS
             ? ncclSuccess
             : ncclSystemError;
}

API ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t,
                          int peer, ncclComm_t c, cudaStream_t) {
  pending.push_back(
      {true, const_cast<void *>(buf), count * typeBytes(t), peer, c});
  return groupDepth ? ncclSuccess : flush();
}

API ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer,
                          ncclComm_t c, cudaStream_t) {
  pending.push_back({false, buf, count * typeBytes(t), peer, c});
  return groupDepth ? ncclSuccess : flush();
}

API ncclResult_t ncclGroupStart() {
  ++groupDepth;
  return ncclSuccess;
}

API ncclResult_t ncclGroupEnd() {
  if (groupDepth == 0)
    return ncclInvalidUsage;
  return --groupDepth ? ncclSuccess : flush();
}
