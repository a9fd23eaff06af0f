//===- NcclComm.cpp - NCCL communicators for libflashopt ------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_comm_create_nccl (flashopt_nccl.h): a flashopt_comm_backend
/// whose host collectives (layout check, rank 0's state, the per-step
/// agreement) go over a duplicate of the caller's MPI communicator and whose
/// reduce_mean_device averages gradients in device memory with NCCL:
///
///   pack the bucket's pieces (device-to-device copies) into W slices;
///   DETERMINISTIC: all-to-all of the raw slices (grouped ncclSend/ncclRecv),
///     then each owner sums its W contributions in rank order in f32,
///     divides by W and rounds once (ReduceKernels.h) -- the host path's
///     operations, so the result is bit-identical to the MPI communicator's;
///   FAST: widen to f32, ncclReduceScatter (sum, NCCL's order), divide and
///     round;
///   ncclAllGather of the averaged slices, unpack.
///
/// Every element is reduced once by its owner and copied to the others, so
/// the replicas are bit-identical in both modes. The unique id is created
/// by rank 0 and broadcast over MPI.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_nccl.h"

#include "NcclLibrary.h"
#include "ReduceKernels.h"
#include "capi/Errors.h"
#include "flashopt/host/CudaDriver.h"
#include "mpi/MpiCollectives.h"

#include <cstring>
#include <new>
#include <string>
#include <vector>

using flashopt::capi::statusOf;
using flashopt::host::Code;
using flashopt::host::CudaDriver;
using flashopt::host::Expected;
using flashopt::host::Status;
namespace cu = flashopt::host::cu;

namespace {

/// reduce_mean_device's failures: the text is in NcclComm::lastError.
constexpr int kDeviceError = -1;

struct NcclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  const flashopt::nccl::NcclLibrary *nccl = nullptr;
  const CudaDriver *cuda = nullptr;
  cu::CUdevice device = 0;
  cu::CUcontext context = nullptr;
  bool retained = false;
  cu::CUmodule module = nullptr;
  cu::CUfunction combine[3][3] = {};
  ncclComm_t comm = nullptr;
  cu::CUdeviceptr scratch = 0;
  size_t scratchBytes = 0;
  std::string lastError;
};

//===----------------------------------------------------------------------===//
// Host collectives over MPI (mpi/MpiCollectives.h)
//===----------------------------------------------------------------------===//

MPI_Comm mpiOf(void *self) { return static_cast<NcclComm *>(self)->mpi; }

/// MPI's text for an MPI code, lastError for the device reduction's.
const char *errorString(void *self, int code) {
  NcclComm *c = static_cast<NcclComm *>(self);
  if (code == kDeviceError)
    return c->lastError.c_str();
  return flashopt::mpi::errorString(code);
}

//===----------------------------------------------------------------------===//
// The device reduction
//===----------------------------------------------------------------------===//

/// The calling thread's context is `c`'s for the scope.
class ContextScope {
public:
  explicit ContextScope(NcclComm *c) : c_(c) {
    ok_ = c->cuda->cuCtxPushCurrent(c->context) == cu::CUDA_SUCCESS;
  }
  ~ContextScope() {
    if (ok_) {
      cu::CUcontext popped = nullptr;
      c_->cuda->cuCtxPopCurrent(&popped);
    }
  }
  bool ok() const { return ok_; }

private:
  NcclComm *c_;
  bool ok_ = false;
};

/// Fails with "<what>: <driver error>" into lastError.
bool cudaOk(NcclComm *c, cu::CUresult r, const char *what) {
  if (r == cu::CUDA_SUCCESS)
    return true;
  c->lastError = std::string(what) + ": " + c->cuda->describe(r);
  return false;
}

bool ncclOk(NcclComm *c, ncclResult_t r, const char *what) {
  if (r == ncclSuccess)
    return true;
  c->lastError = std::string(what) + ": " + c->nccl->describe(r);
  return false;
}

size_t roundUp(size_t n) { return (n + 255) & ~size_t(255); }

bool ensureScratch(NcclComm *c, size_t bytes) {
  if (bytes <= c->scratchBytes)
    return true;
  if (c->scratch)
    c->cuda->cuMemFree(c->scratch);
  c->scratch = 0;
  c->scratchBytes = 0;
  if (!cudaOk(c, c->cuda->cuMemAlloc(&c->scratch, bytes),
              "cuMemAlloc of the NCCL staging buffer"))
    return false;
  c->scratchBytes = bytes;
  return true;
}

/// dst[i] = narrow(sum of `parts` widened elements of src, `stride` bytes
/// apart, / div) for i < n.
bool combine(NcclComm *c, int s, int d, cu::CUdeviceptr src,
             cu::CUdeviceptr dst, uint64_t n, uint64_t strideBytes,
             uint32_t parts, float div) {
  uint32_t divBits;
  std::memcpy(&divBits, &div, 4);
  void *args[] = {&src, &dst, &n, &strideBytes, &parts, &divBits};
  const uint64_t blocks = (n + 255) / 256;
  const unsigned grid = unsigned(blocks < 4096 ? blocks : 4096);
  return cudaOk(c,
                c->cuda->cuLaunchKernel(c->combine[s][d], grid, 1, 1, 256, 1, 1,
                                        0, nullptr, args, nullptr),
                "cuLaunchKernel(flashopt_nccl_combine)");
}

int reduceMeanDevice(void *self, void *const *pieces, const int64_t *counts,
                     size_t numPieces, int32_t dtype, int32_t mode) {
  NcclComm *c = static_cast<NcclComm *>(self);
  c->lastError.clear();
  if (dtype < 0 || dtype >= flashopt::nccl::kNumKernelDTypes) {
    c->lastError =
        "gradient dtype " + std::to_string(dtype) + " is not bf16, f16 or f32";
    return kDeviceError;
  }
  const auto *cu = c->cuda;
  const auto *nc = c->nccl;
  const size_t W = size_t(c->size), es = dtype == FLASHOPT_F32 ? 4 : 2;
  size_t n = 0;
  for (size_t i = 0; i < numPieces; ++i)
    n += size_t(counts[i]);
  if (n == 0)
    return 0;
  const size_t slice = (n + W - 1) / W;
  // Staging: packed (W slices), parts (W slices received), f32 copies of
  // both for FAST, and this rank's averaged slice.
  const size_t packedB = roundUp(slice * W * es),
               flatB = roundUp(slice * W * 4), sumB = roundUp(slice * 4),
               mineB = roundUp(slice * es);
  ContextScope scope(c);
  if (!scope.ok()) {
    c->lastError = "cuCtxPushCurrent failed";
    return kDeviceError;
  }
  if (!ensureScratch(c, 2 * packedB + flatB + sumB + mineB))
    return kDeviceError;
  const cu::CUdeviceptr packed = c->scratch, parts = packed + packedB,
                        flat = parts + packedB, sum = flat + flatB,
                        mine = sum + sumB;
  // Everything queued before (the optimizer's kernels, the caller's
  // backward on the legacy stream) is done; NCCL runs on the legacy stream.
  if (!cudaOk(c, cu->cuCtxSynchronize(), "cuCtxSynchronize"))
    return kDeviceError;
  size_t at = 0;
  for (size_t i = 0; i < numPieces; ++i) {
    size_t b = size_t(counts[i]) * es;
    if (!cudaOk(c,
                cu->cuMemcpyDtoD(packed + at * es,
                                 cu::CUdeviceptr(uintptr_t(pieces[i])), b),
                "cuMemcpyDtoD (pack)"))
      return kDeviceError;
    at += size_t(counts[i]);
  }
  if (slice * W > n &&
      !cudaOk(c, cu->cuMemsetD8(packed + n * es, 0, (slice * W - n) * es),
              "cuMemsetD8 (padding)"))
    return kDeviceError;
  if (mode == FLASHOPT_REDUCE_DETERMINISTIC) {
    // Block r of `packed` to rank r; block r of `parts` from rank r.
    if (!ncclOk(c, nc->ncclGroupStart(), "ncclGroupStart"))
      return kDeviceError;
    bool sent = true;
    for (size_t r = 0; r < W && sent; ++r)
      sent =
          ncclOk(c,
                 nc->ncclSend(reinterpret_cast<void *>(
                                  uintptr_t(packed + r * slice * es)),
                              slice * es, ncclUint8, int(r), c->comm, nullptr),
                 "ncclSend") &&
          ncclOk(c,
                 nc->ncclRecv(reinterpret_cast<void *>(
                                  uintptr_t(parts + r * slice * es)),
                              slice * es, ncclUint8, int(r), c->comm, nullptr),
                 "ncclRecv");
    if (!ncclOk(c, nc->ncclGroupEnd(), "ncclGroupEnd (all-to-all)") || !sent)
      return kDeviceError;
    if (!combine(c, dtype, dtype, parts, mine, slice, slice * es, uint32_t(W),
                 float(W)))
      return kDeviceError;
  } else {
    if (!combine(c, dtype, FLASHOPT_F32, packed, flat, slice * W, 0, 1, 1.0f))
      return kDeviceError;
    if (!ncclOk(c,
                nc->ncclReduceScatter(
                    reinterpret_cast<const void *>(uintptr_t(flat)),
                    reinterpret_cast<void *>(uintptr_t(sum)), slice,
                    ncclFloat32, ncclSum, c->comm, nullptr),
                "ncclReduceScatter"))
      return kDeviceError;
    if (!combine(c, FLASHOPT_F32, dtype, sum, mine, slice, 0, 1, float(W)))
      return kDeviceError;
  }
  if (!ncclOk(c,
              nc->ncclAllGather(reinterpret_cast<const void *>(uintptr_t(mine)),
                                reinterpret_cast<void *>(uintptr_t(packed)),
                                slice * es, ncclUint8, c->comm, nullptr),
              "ncclAllGather"))
    return kDeviceError;
  at = 0;
  for (size_t i = 0; i < numPieces; ++i) {
    size_t b = size_t(counts[i]) * es;
    if (!cudaOk(c,
                cu->cuMemcpyDtoD(cu::CUdeviceptr(uintptr_t(pieces[i])),
                                 packed + at * es, b),
                "cuMemcpyDtoD (unpack)"))
      return kDeviceError;
    at += size_t(counts[i]);
  }
  if (!cudaOk(c, cu->cuCtxSynchronize(), "cuCtxSynchronize"))
    return kDeviceError;
  return 0;
}

void destroy(void *self) {
  NcclComm *c = static_cast<NcclComm *>(self);
  if (!c)
    return;
  if (c->cuda && c->retained) {
    ContextScope scope(c);
    if (c->comm)
      c->nccl->ncclCommDestroy(c->comm);
    if (c->scratch)
      c->cuda->cuMemFree(c->scratch);
    if (c->module)
      c->cuda->cuModuleUnload(c->module);
  }
  if (c->cuda && c->retained)
    c->cuda->cuDevicePrimaryCtxRelease(c->device);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c->mpi != MPI_COMM_NULL)
    MPI_Comm_free(&c->mpi);
  delete c;
}

//===----------------------------------------------------------------------===//
// Creation
//===----------------------------------------------------------------------===//

/// This rank's part of the set-up before NCCL: the libraries, the device,
/// the kernels. The status of the failure's code: UNSUPPORTED for a missing
/// NCCL library or symbol, DEVICE for no usable driver or device, CUDA for
/// a failed driver call.
flashopt_status setUp(NcclComm *c, int32_t device, std::string &why) {
  Expected<const flashopt::nccl::NcclLibrary *> lib =
      flashopt::nccl::NcclLibrary::get();
  if (!lib) {
    why = lib.error();
    return statusOf(lib.status());
  }
  c->nccl = *lib;
  Expected<const CudaDriver *> drv = CudaDriver::get();
  if (!drv) {
    why = drv.error();
    return statusOf(drv.status());
  }
  c->cuda = *drv;
  int count = 0;
  Status s =
      c->cuda->check(c->cuda->cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (s && (device < 0 || device >= count))
    s = Status::error(Code::Device, "CUDA device " + std::to_string(device) +
                                        " does not exist (" +
                                        std::to_string(count) + " devices)");
  if (s)
    s = c->cuda->check(c->cuda->cuDeviceGet(&c->device, device), "cuDeviceGet");
  if (s)
    s = c->cuda->check(
        c->cuda->cuDevicePrimaryCtxRetain(&c->context, c->device),
        "cuDevicePrimaryCtxRetain");
  if (!s) {
    why = s.message();
    return statusOf(s);
  }
  c->retained = true;
  ContextScope scope(c);
  const std::string &ptx = flashopt::nccl::combine_kernels_ptx();
  s = c->cuda->check(
      c->cuda->cuModuleLoadDataEx(&c->module, ptx.c_str(), 0, nullptr, nullptr),
      "cuModuleLoadDataEx (NCCL combine kernels)");
  for (int a = 0; a < 3 && s; ++a)
    for (int b = 0; b < 3 && s; ++b) {
      std::string name = flashopt::nccl::combine_kernel_name(a, b);
      s = c->cuda->check(c->cuda->cuModuleGetFunction(&c->combine[a][b],
                                                      c->module, name.c_str()),
                         "cuModuleGetFunction " + name);
    }
  if (!s) {
    why = s.message();
    return statusOf(s);
  }
  return FLASHOPT_OK;
}

/// Every rank's status; the first failure (this rank's own, else the first
/// failing rank's) with a message, the same status on every rank.
flashopt_status agree(NcclComm *c, flashopt_status mine, std::string &why,
                      const char *stage) {
  std::vector<int> all(size_t(c->size), 0);
  int code = int(mine);
  if (MPI_Allgather(&code, 1, MPI_INT, all.data(), 1, MPI_INT, c->mpi) !=
      MPI_SUCCESS) {
    why = std::string("MPI_Allgather failed while agreeing on ") + stage;
    return FLASHOPT_ERROR_COMM;
  }
  for (int r = 0; r < c->size; ++r)
    if (all[size_t(r)] != FLASHOPT_OK) {
      if (mine == FLASHOPT_OK)
        why = "rank " + std::to_string(r) + " failed at " + stage +
              " (its error is on that rank)";
      else
        why = "rank " + std::to_string(c->rank) + ": " + stage + ": " + why;
      return flashopt_status(all[size_t(r)]);
    }
  return FLASHOPT_OK;
}

} // namespace

using flashopt::capi::fail;
using flashopt::capi::guard;

namespace {
flashopt_status createNccl(MPI_Comm comm, int32_t cuda_device,
                           flashopt_comm *out) {
  return guard("flashopt_comm_create_nccl", [&] {
    if (!out)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT, "out is NULL");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      fail(FLASHOPT_ERROR_STATE, "MPI is not initialized");
    NcclComm *c = new NcclComm();
    struct Owner {
      NcclComm *c;
      ~Owner() { destroy(c); }
    } owner{c};
    if (MPI_Comm_dup(comm, &c->mpi) != MPI_SUCCESS)
      fail(FLASHOPT_ERROR_COMM, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
    std::string why;
    flashopt_status s = setUp(c, cuda_device, why);
    if ((s = agree(c, s, why, "loading NCCL and CUDA")) != FLASHOPT_OK)
      fail(s, why);
    // Rank 0's unique id (with its status) to every rank.
    struct {
      int32_t rc;
      ncclUniqueId id;
    } wire{};
    if (c->rank == 0)
      wire.rc = int32_t(c->nccl->ncclGetUniqueId(&wire.id));
    if (MPI_Bcast(&wire, int(sizeof wire), MPI_BYTE, 0, c->mpi) != MPI_SUCCESS)
      fail(FLASHOPT_ERROR_COMM, "MPI_Bcast of the NCCL unique id failed");
    if (wire.rc != ncclSuccess)
      fail(FLASHOPT_ERROR_COMM, "ncclGetUniqueId failed on rank 0: " +
                                    c->nccl->describe(ncclResult_t(wire.rc)));
    {
      ContextScope scope(c);
      ncclResult_t r =
          c->nccl->ncclCommInitRank(&c->comm, c->size, wire.id, c->rank);
      s = r == ncclSuccess ? FLASHOPT_OK : FLASHOPT_ERROR_COMM;
      if (r != ncclSuccess) {
        c->comm = nullptr;
        why = c->nccl->describe(r);
      }
    }
    if ((s = agree(c, s, why, "ncclCommInitRank")) != FLASHOPT_OK)
      fail(s, why);
    flashopt_comm_backend b{};
    b.abi_version = FLASHOPT_ABI_VERSION;
    b.name = "NCCL";
    b.rank = c->rank;
    b.size = c->size;
    b.self = c;
    flashopt::mpi::setHostCollectives<mpiOf>(b);
    b.error_string = errorString;
    b.destroy = destroy;
    b.reduce_mean_device = reduceMeanDevice;
    // The handle owns `c` once created (a failed create never destroys).
    flashopt_status cs = flashopt_comm_create(&b, out);
    if (cs != FLASHOPT_OK)
      fail(cs, flashopt_last_error());
    owner.c = nullptr;
  });
}
} // namespace

extern "C" flashopt_status flashopt_comm_create_nccl(MPI_Comm comm,
                                                     int32_t cuda_device,
                                                     flashopt_comm *out) {
  // This library's guard() reports into its own last_error() (capi/Errors.cpp
  // is compiled in, hidden); flashopt_last_error is libflashopt's.
  flashopt_status s = createNccl(comm, cuda_device, out);
  flashopt_internal_set_last_error(
      s == FLASHOPT_OK ? "" : flashopt::capi::last_error().c_str());
  return s;
}
