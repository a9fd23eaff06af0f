//===- CudaBundle.h ---------------------------------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Which of a manifest's GPU kernels a device runs (`select_gpu_kernel`,
/// pure and unit-tested), the launch geometry (`gpu_grid_size`), and
/// CudaBundle, that kernel loaded as a module (cubin, or PTX JIT-compiled by
/// the driver).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CUDABUNDLE_H
#define FLASHOPT_HOST_CUDABUNDLE_H

#include "flashopt/abi/KernelAbi.h"
#include "flashopt/host/CudaContext.h"

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

namespace flashopt::host {

//===----------------------------------------------------------------------===//
// Kernel selection
//===----------------------------------------------------------------------===//

/// Which GPU kernel of a manifest a device runs, and how it is loaded.
struct GpuKernelChoice {
  size_t kernel_index = 0; ///< in Manifest::kernels
  std::string target;      ///< "sm_90"
  int chip = 0;            ///< 90
  /// True: load the cubin `image`; false: JIT-compile the PTX `image`.
  bool use_cubin = false;
  std::string image; ///< file name, relative to the bundle
  /// With a cubin: the same chip's PTX (or ""), tried if the cubin does not
  /// load (a cubin newer than the driver).
  std::string ptx_fallback;
  std::string symbol;
  int threads_per_block = 256;
  int elements_per_thread = 0; ///< 0 when the manifest does not say
  /// A line saying what was chosen and why.
  std::string reason;
};

/// Parses "sm_90" / "sm_100" / "sm_90a" into 90 / 100 / 90 and whether the
/// target is architecture-specific ("a" or "f" suffix); false if not an
/// sm_ target.
bool parse_sm_target(std::string_view target, int *chip, bool *arch_specific);

/// Picks the step kernel for a device of compute capability
/// cc_major.cc_minor (the other kinds come from the same target):
/// the exact chip's cubin when the manifest lists one (and `file_exists`,
/// when given, says it is there); else the PTX of the highest chip at or
/// below the device (architecture-specific targets only on their own chip),
/// JIT-compiled by the driver. An error names the device and the targets
/// when no kernel fits, or when the chosen kernel's block size is not 256.
Expected<GpuKernelChoice> select_gpu_kernel(
    const Manifest &m, int cc_major, int cc_minor,
    const std::function<bool(const std::string &)> &file_exists = nullptr);

//===----------------------------------------------------------------------===//
// Launch geometry
//===----------------------------------------------------------------------===//

/// The grid of one launch over `total_groups` groups: enough 256-thread
/// blocks for one pass (each group takes group_size / elements_per_thread
/// lanes; `elements_per_thread` 0 means unknown and assumes the fewest, 4),
/// capped at blocks_per_sm * sm_count (the grid-stride loop does the rest),
/// at least 1. 0 when there is nothing to do.
int64_t gpu_grid_size(int64_t total_groups, int64_t group_size,
                      int elements_per_thread, int threads_per_block,
                      int sm_count, int blocks_per_sm = 8);

//===----------------------------------------------------------------------===//
// CudaBundle
//===----------------------------------------------------------------------===//

/// A bundle's GPU kernels loaded as modules in one context: the step and,
/// with an accumulator, the accumulate / step_accumulated / step_fused
/// kernels of the same target (docs/KERNEL-ABI.md "Gradient accumulation").
/// Shared by the optimizers created from it; unloaded with the last one.
class CudaBundle {
public:
  /// Loads `dir` (holding manifest.json) for the context's device.
  static Expected<std::shared_ptr<CudaBundle>>
  load(std::shared_ptr<CudaContext> ctx, const std::string &dir);
  ~CudaBundle();
  CudaBundle(const CudaBundle &) = delete;
  CudaBundle &operator=(const CudaBundle &) = delete;

  const std::string &dir() const { return dir_; }
  const Manifest &manifest() const { return manifest_; }
  const std::shared_ptr<CudaContext> &context() const { return ctx_; }
  const GpuKernelChoice &choice() const { return choice_; }
  /// What was loaded: "sm_90 cubin" / "sm_80 PTX (JIT)", and the JIT log.
  const std::string &loaded() const { return loaded_; }
  /// The step kernel.
  cu::CUfunction function() const { return kinds_[0].fn; }
  /// The kernel of `kind` (null when the bundle has none: no accumulator).
  cu::CUfunction function(abi::KernelKind kind) const {
    return kinds_[size_t(kind)].fn;
  }
  /// Elements per thread the kernel of `kind` was built for (0: unknown).
  int elements_per_thread(abi::KernelKind kind) const {
    return kinds_[size_t(kind)].elements_per_thread;
  }
  /// Registers per thread the step kernel uses (-1 if unknown).
  int registers() const { return kinds_[0].registers; }
  /// Registers per thread the kernel of `kind` uses (-1 if unknown).
  int registers(abi::KernelKind kind) const {
    return kinds_[size_t(kind)].registers;
  }

private:
  CudaBundle() = default;
  std::shared_ptr<CudaContext> ctx_;
  std::string dir_;
  Manifest manifest_;
  GpuKernelChoice choice_;
  std::string loaded_;
  /// One per abi::KernelKind, in kKernelKinds order.
  struct Loaded {
    cu::CUmodule module = nullptr;
    cu::CUfunction fn = nullptr;
    int registers = -1;
    int elements_per_thread = 0;
  };
  Loaded kinds_[std::size(abi::kKernelKinds)];
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CUDABUNDLE_H
