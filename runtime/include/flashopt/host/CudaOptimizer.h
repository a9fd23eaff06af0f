//===- CudaOptimizer.h - The optimizer on a CUDA device ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The optimizer core (Optimizer.h) over the CUDA backend: a bundle's GPU
/// kernel (CudaBundle.h) launched once per step on one stream with no host
/// synchronization, device arenas for the state, and the tensor and hyper
/// tables in device memory, uploaded only when they change. Params and
/// grads are caller-owned device addresses, 16-byte aligned; the kernel ABI
/// is the CPU one (docs/KERNEL-ABI.md), tables holding device addresses.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CUDAOPTIMIZER_H
#define FLASHOPT_HOST_CUDAOPTIMIZER_H

#include "flashopt/host/CudaBundle.h"
#include "flashopt/host/Optimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::host {

struct CudaOptimizerOptions {
  /// The stream every upload, memset and launch of the optimizer is ordered
  /// on; nullptr is the legacy default stream (ordered with all blocking
  /// streams, so a gradient written on another stream is seen).
  cu::CUstream stream = nullptr;
  /// The grid is at most blocks_per_sm * SM count blocks.
  int blocks_per_sm = 8;
  /// Records longer than this are split (0: gpu_max_record_elements, the
  /// kernel's 32-bit limit). Smaller values test the splitting.
  int64_t max_record_elements = 0;
};

/// The geometry of the next launch.
struct LaunchConfig {
  int64_t grid = 0, block = 0;
  int64_t total_groups = 0;
  int64_t records = 0;
};

class CudaBackend;

/// Arenas are sized to the registered tensors when first needed
/// (allocate(), step(), buffer(), read_buffer()), and grown (contents kept)
/// when tensors are added later.
class CudaOptimizer : public Optimizer {
public:
  /// An optimizer over a loaded GPU bundle, with one param group (slot 0)
  /// holding the manifest's defaults.
  static Expected<std::unique_ptr<CudaOptimizer>>
  create(std::shared_ptr<CudaBundle> bundle,
         const CudaOptimizerOptions &opts = {});
  /// Loads `bundle_dir` on `ctx` and creates an optimizer over it.
  static Expected<std::unique_ptr<CudaOptimizer>>
  create(std::shared_ptr<CudaContext> ctx, const std::string &bundle_dir,
         const CudaOptimizerOptions &opts = {});
  ~CudaOptimizer() override;

  /// The same bundle (so the same context) and options, the stream included
  /// (Optimizer::create_sibling).
  Expected<std::unique_ptr<Optimizer>> create_sibling() const override;

  const CudaBundle &bundle() const;

  /// The core's tensor calls with device addresses (grad may be 0 until
  /// set_grad).
  Expected<int64_t> add_param(int param_group, cu::CUdeviceptr param,
                              int64_t numel, cu::CUdeviceptr grad);
  Status set_grad(int64_t tensor, cu::CUdeviceptr grad);
  Status set_param(int64_t tensor, cu::CUdeviceptr param);

  /// The launch the next step makes.
  LaunchConfig launch_config() const;
  /// Table and hyper uploads so far (a plain step adds none).
  int64_t table_uploads() const;
  int64_t hyper_uploads() const;

private:
  friend class Optimizer; // create_over
  explicit CudaOptimizer(std::unique_ptr<CudaBackend> backend);
  CudaBackend *cuda_; ///< the backend, owned by the core
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CUDAOPTIMIZER_H
