//===- Backend.h - What an optimizer needs from a device --------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The backend interface under the optimizer core (Optimizer.h): the small
/// set of things that differ between running kernels on the host CPU and on
/// a CUDA device — state memory and its addresses, the pointer rules, table
/// upload and kernel launch, buffer reads and writes, synchronization.
/// Everything else (the tensor registry, param groups and hyper tables,
/// every argument check, table records, the step_tensors plan, the bytes
/// report) is the core's, written once.
///
/// Implementations: CpuBackend (cpu/CpuBackend.cpp: dlopen'ed kernel,
/// host arenas, a thread pool) and CudaBackend (cuda/CudaBackend.cpp:
/// device arenas, tables uploaded when they change, one launch per step).
/// Shaped like IREE's HAL drivers: one small vtable, one file per backend.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_BACKEND_H
#define FLASHOPT_HOST_BACKEND_H

#include "flashopt/host/Tables.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace flashopt::host {

/// What one kernel launch covers: `num_records` records of the tensor table
/// (docs/KERNEL-ABI.md) and the global groups [group_begin, group_end).
struct LaunchRequest {
  /// False: records [first_record, first_record + num_records) of the
  /// optimizer's table. True: `compacted` (num_records records whose word 1
  /// is renumbered from 0), a subset of tensors stepped on its own.
  bool use_compacted = false;
  int64_t first_record = 0;
  const std::vector<int64_t> *compacted = nullptr;
  int64_t num_records = 0;
  int64_t group_begin = 0, group_end = 0;
  /// The step number t the kernel computes its bias corrections for.
  int64_t step = 0;
  /// Which kernel of the bundle runs (the step, or with an accumulator the
  /// accumulate / step_accumulated / step_fused kernels; docs/KERNEL-ABI.md).
  abi::KernelKind kernel = abi::KernelKind::Step;
};

/// One gradient (or other floating-point buffer) to scan for NaN/Inf.
struct ScanRange {
  const void *data = nullptr; ///< host pointer or device address
  int64_t numel = 0;
};

/// The device side of an optimizer. Every call is made by the core under its
/// own discipline (the core is not thread-safe; the C ABI holds a mutex).
class Backend {
public:
  virtual ~Backend();

  /// The manifest of the loaded bundle (owned by the backend's bundle).
  virtual const Manifest &manifest() const = 0;
  /// "cpu" or "cuda" (for messages only: what a backend can do is asked
  /// below, never inferred from its name).
  virtual const char *kind() const = 0;

  // ---- capabilities --------------------------------------------------------
  /// Whether the backend's addresses (state arenas, params, grads, scratch)
  /// are device memory the host cannot dereference: what is copied out goes
  /// through read() and write(), and a communicator that reduces device
  /// memory in place (NCCL) can be handed the gradients themselves.
  virtual bool memory_is_device() const = 0;
  /// Whether all_finite() and sum_squares() are implemented: the non-finite
  /// skip policy and gradient-norm clipping need them.
  virtual bool scans_gradients() const = 0;

  // ---- pointer rules -------------------------------------------------------
  /// Success if `address` (a param or grad the caller registers; may be
  /// null) can be used by this backend's kernels, else "<who>: <what> ..."
  /// saying why.
  virtual Status check_address(const char *who, const char *what,
                               const void *address) const = 0;
  /// The most elements one table record may cover (larger tensors are split
  /// into several records).
  virtual int64_t max_record_elements() const = 0;

  // ---- state memory (one zeroed arena per runtime-owned buffer) -----------
  /// Reserves `entries` entries of buffer `buffer` at a 64-entry boundary
  /// and returns the entry offset. Contents of earlier reservations are kept
  /// when an arena grows (its address may change).
  virtual Expected<int64_t> reserve(size_t buffer, int64_t entries) = 0;
  /// Makes every reservation addressable (allocating and zeroing).
  virtual Status commit() = 0;
  /// Whether every reservation is addressable now.
  virtual bool committed() const = 0;
  /// The address of entry 0 of buffer `buffer`'s arena (0 when none).
  virtual int64_t arena_address(size_t buffer) const = 0;
  /// Bytes allocated: arenas (with padding and spare capacity) and device
  /// tables.
  virtual int64_t allocated_bytes() const = 0;
  /// Frees the arenas of the buffers `which[b]` is true for (the correction
  /// terms and states live elsewhere from now on: sharded data parallelism;
  /// the gradient accumulator stays). Backends that cannot say so.
  virtual Status release_arenas(const std::vector<bool> &which) {
    (void)which;
    return Status::error(Code::Unsupported,
                         std::string(kind()) +
                             " backend cannot release its state arenas");
  }

  // ---- stepping ------------------------------------------------------------
  /// Runs the step kernel over `request`. `table` is the optimizer's whole
  /// host table, changed exactly when `table_generation` changes (so a
  /// device copy is refreshed only then); likewise `hypers`.
  virtual Status launch(const LaunchRequest &request,
                        const std::vector<int64_t> &table,
                        uint64_t table_generation,
                        const HyperTable &hypers) = 0;
  /// Whether every element of every range (of dtype `dtype`) is finite.
  virtual Expected<bool> all_finite(const std::vector<ScanRange> &ranges,
                                    DType dtype) = 0;
  /// The sum of the squares of each range's elements (of dtype `dtype`), in
  /// double, deterministically: fixed pieces of 65536 elements, each summed
  /// in order, the pieces added in order — the same bits for any number of
  /// threads.
  virtual Expected<std::vector<double>>
  sum_squares(const std::vector<ScanRange> &ranges, DType dtype) = 0;
  /// Waits for all work of this backend's queue.
  virtual Status synchronize() = 0;

  // ---- buffer access ------------------------------------------------------
  /// Copies `bytes` from `address` (one of the backend's addresses) to host
  /// memory, after all work queued before.
  virtual Status read(const void *address, void *dst, int64_t bytes) = 0;
  /// Copies `bytes` of host memory to `address`, after all work queued
  /// before.
  virtual Status write(void *address, const void *src, int64_t bytes) = 0;

  // ---- scratch memory -----------------------------------------------------
  /// `bytes` (at least 1) of zeroed memory the backend's kernels can address
  /// (host memory on the CPU, device memory on CUDA), outside the arenas and
  /// freed with the last copy of the pointer: sharded data parallelism's
  /// gradient staging. Reached through read() and write() like a buffer.
  virtual Expected<std::shared_ptr<void>> allocate_scratch(int64_t bytes);
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_BACKEND_H
