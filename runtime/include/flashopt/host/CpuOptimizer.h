//===- CpuOptimizer.h - The optimizer on the host CPU -----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The optimizer core (Optimizer.h) over the CPU backend: a bundle's CPU
/// kernel (CpuBundle.h) run on a persistent thread pool over group-aligned
/// chunks of the global group range, with host arenas for the state (64-byte
/// aligned, each tensor's slice at a 64-entry boundary, zeroed). Params and
/// grads are host pointers.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_HOST_CPUOPTIMIZER_H
#define FLASHOPT_HOST_CPUOPTIMIZER_H

#include "flashopt/host/CpuBundle.h"
#include "flashopt/host/Optimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::host {

/// The most threads a CPU optimizer runs a step on (set_threads refuses
/// more: a thread pool of 100000 threads only thrashes the machine).
inline constexpr int kMaxCpuThreads = 1024;

struct CpuOptimizerOptions {
  /// Threads taking part in a step (the calling thread included); 0 means
  /// std::thread::hardware_concurrency(); at most kMaxCpuThreads.
  int threads = 0;
  /// A step uses at most total_groups / min_groups_per_chunk threads (at
  /// least one); 0 means about 32768 elements' worth of groups.
  int64_t min_groups_per_chunk = 0;
};

/// A group range one kernel call covers.
struct Chunk {
  int64_t begin = 0, end = 0;
};

/// Splits [0, total_groups) into at most `max_chunks` chunks for tensors
/// whose first groups are `first_groups` (sorted, first_groups[0] == 0):
/// near-equal sizes, at least `min_groups` groups each, and every interior
/// boundary rounded down so that it starts a tensor-local group index that
/// is a multiple of `align_groups` (a 64-element boundary), unless that
/// would empty a chunk. Exposed for tests.
std::vector<Chunk> split_groups(int64_t total_groups,
                                const std::vector<int64_t> &first_groups,
                                int max_chunks, int64_t min_groups,
                                int64_t align_groups);

class CpuBackend;

class CpuOptimizer : public Optimizer {
public:
  /// An optimizer over a loaded bundle. It starts with one param group
  /// (slot 0) holding the manifest's defaults.
  static Expected<std::unique_ptr<CpuOptimizer>>
  create(std::shared_ptr<CpuBundle> bundle, const CpuOptimizerOptions &opts = {});
  /// Loads `bundle_dir` and creates an optimizer over it.
  static Expected<std::unique_ptr<CpuOptimizer>>
  create(const std::string &bundle_dir, const CpuLoadOptions &load = {},
         const CpuOptimizerOptions &opts = {});
  ~CpuOptimizer() override;

  /// The same bundle, threads and chunking (Optimizer::create_sibling).
  Expected<std::unique_ptr<Optimizer>> create_sibling() const override;

  const CpuBundle &bundle() const;

  /// Threads taking part in a step.
  int threads() const;
  /// Resizes the thread pool (0 = hardware concurrency; more than
  /// kMaxCpuThreads or fewer than 0 is an error). On failure to start
  /// threads, steps run on the calling thread and an error is returned.
  Status set_threads(int threads);
  /// The chunks the next step() will use.
  std::vector<Chunk> plan_chunks() const;

private:
  friend class Optimizer; // create_over
  explicit CpuOptimizer(std::unique_ptr<CpuBackend> backend);
  CpuBackend *cpu_; ///< the backend, owned by the core
};

} // namespace flashopt::host

#endif // FLASHOPT_HOST_CPUOPTIMIZER_H
