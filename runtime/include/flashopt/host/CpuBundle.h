//===- CpuBundle.h - Loading a bundle's CPU kernel --------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `CpuBundle::load`: reads a bundle's manifest (abi/Manifest.h), picks the
/// first CPU kernel whose features this host supports (or the one named by
/// `CpuLoadOptions::cpu` / the FLASHOPT_CPU environment variable), dlopens it
/// and resolves its step symbol (docs/KERNEL-ABI.md). The CPU features come
/// from the ABI library's one list (abi/CpuFeatures.def).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CPUBUNDLE_H
#define FLASHOPT_HOST_CPUBUNDLE_H

#include "flashopt/host/Abi.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace flashopt::host {

using KernelFn = void (*)(const int64_t *table, int64_t ntensors,
                          const float *hypers, int64_t step,
                          int64_t group_begin, int64_t group_end);

/// Whether this host supports a CPU feature named as in the manifest
/// ("avx2", "fma", "f16c", "bmi2", "avx512f", ...). Unknown names: false.
bool host_supports_feature(std::string_view feature);

struct CpuLoadOptions {
  /// Force this CPU flavour ("x86-64"); "" picks the best supported one.
  std::string cpu;
  /// When `cpu` is empty, honour the FLASHOPT_CPU environment variable.
  bool use_env = true;
  /// Compare the kernel's ABI description (the `<symbol>__abi` data symbol
  /// flashopt-gen emits) with the manifest and refuse a mismatch. Only tests
  /// that lay other manifests over a stand-in kernel (to test layouts, never
  /// stepping) turn this off; the C ABI always checks.
  bool check_kernel_abi = true;
};

/// Compares the ABI description of the CPU kernel `k` (dlopen'ed as
/// `handle`) with the manifest `m` (read from `manifest_path`): an error
/// naming both when they differ or when the kernel has none.
Status check_kernel_abi(const Manifest &m, void *handle, const KernelEntry &k,
                        const std::string &manifest_path);

/// Which step kernel of `m` runs on a CPU that `supports` the features
/// named (host_supports_feature for this host): the one of flavour `forced`
/// when it is not empty (`forced_from` names who asked, in errors), else the
/// first whose features are all supported (flashopt-gen lists the best
/// flavour first). Returns its index in m.kernels; an error naming the
/// manifest and the flavours otherwise (Unsupported when the bundle has no
/// such kernel). Pure: no dlopen, no CPUID.
Expected<size_t>
select_cpu_kernel(const Manifest &m, std::string_view forced,
                  std::string_view forced_from,
                  const std::function<bool(std::string_view)> &supports);

/// A loaded bundle: its manifest and one dlopen'ed CPU kernel. Shared by the
/// optimizers created from it; the library is closed with the last one.
class CpuBundle {
public:
  /// Loads the bundle directory `dir` (holding manifest.json).
  static Expected<std::shared_ptr<CpuBundle>> load(const std::string &dir,
                                                const CpuLoadOptions &opts = {});
  ~CpuBundle();
  CpuBundle(const CpuBundle &) = delete;
  CpuBundle &operator=(const CpuBundle &) = delete;

  const std::string &dir() const { return dir_; }
  const Manifest &manifest() const { return manifest_; }
  /// The kernel entry chosen.
  const KernelEntry &kernel() const { return manifest_.kernels[kernel_index_]; }
  /// Full path of the loaded shared object.
  const std::string &kernel_path() const { return kernel_path_; }
  KernelFn fn() const { return fn_; }
  /// The kernel of `kind` of the chosen CPU flavour (the step: fn()), or
  /// null when the bundle has none (no accumulator).
  KernelFn fn(abi::KernelKind kind) const {
    return kind == abi::KernelKind::Step ? fn_ : extra_fns_[size_t(kind)];
  }
  /// Looks up another symbol of the loaded object (tests); nullptr if absent.
  void *symbol(const std::string &name) const;

private:
  CpuBundle() = default;
  /// The full path of kernel `k`'s shared object.
  std::string kernelPath(const KernelEntry &k) const;
  /// dlopens kernel `k` into `*handle` (set as soon as it is open, so that
  /// the destructor closes it) and resolves its symbol into `*fn`, checking
  /// its ABI description against the manifest when `checkAbi`.
  Status loadKernel(const KernelEntry &k, bool checkAbi, void **handle,
                    KernelFn *fn) const;
  std::string dir_;
  Manifest manifest_;
  size_t kernel_index_ = 0;
  std::string kernel_path_;
  void *handle_ = nullptr;
  KernelFn fn_ = nullptr;
  /// The accumulation kernels of the chosen flavour (indexed by KernelKind),
  /// each from its own shared object.
  KernelFn extra_fns_[4] = {};
  std::vector<void *> extra_handles_;
};

/// The subdirectories of `dir` that hold a manifest.json (bundle names),
/// sorted; empty when `dir` cannot be read.
std::vector<std::string> list_bundles(const std::string &dir);

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CPUBUNDLE_H
