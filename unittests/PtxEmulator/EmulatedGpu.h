//===- EmulatedGpu.h - Shipped PTX on the interpreter vs the CPU ---*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The comparison the PTX interpreter tests share: the runtime's
/// CudaOptimizer over the PTX-emulating stand-in driver
/// (flashopt_emulated_cuda, a CUDA driver whose device is the interpreter)
/// against the runtime's CPU Optimizer over the same bundle, on identical
/// inputs; every buffer of every tensor compared bit for bit.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_EMULATEDGPU_H
#define FLASHOPT_UNITTESTS_EMULATEDGPU_H

#include "flashopt/host/CpuOptimizer.h"
#include "flashopt/host/CudaOptimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace flashopt::emutest {

/// build/kernels (FLASHOPT_KERNELS_DIR, else FLASHOPT_BINARY_DIR/kernels).
std::string kernelsDir();
/// The shipped specs' names (specs/*.json under FLASHOPT_SOURCE_DIR).
std::vector<std::string> shippedSpecs();
/// The stand-in driver with the interpreter (loaded once).
const host::CudaDriver &emulatedDriver();
/// A context on the stand-in as a device of `chip` (80, 90, 100).
std::shared_ptr<host::CudaContext> emulatedContext(int chip, int smCount = 132);
/// The stand-in's last error (interpreter faults included).
std::string lastDriverError();

struct Run {
  std::vector<int64_t> sizes;
  int steps = 5;
  uint64_t seed = 1;
  /// Tensors whose gradients hold NaN, +Inf and -Inf elements.
  std::vector<int64_t> nonFiniteTensors;
  /// SMs of the emulated device (the grid is at most 8 blocks per SM):
  /// 1 makes large tensors take many grid-stride iterations.
  int smCount = 132;
  /// CudaOptimizerOptions::max_record_elements (0: the default).
  int64_t maxRecordElements = 0;
  /// When not empty, the GPU side makes each step as these step_tensors
  /// calls (together every tensor once) while the CPU calls step().
  std::vector<std::vector<int64_t>> partialSteps;
  /// Gradient accumulation (a bundle with an accumulator): each step is
  /// this many micro-batches, each with fresh gradients; all but the last
  /// go through the accumulate kernel, the last through step_fused on odd
  /// steps and accumulate + step_accumulated on even ones. 0: plain steps.
  int microBatches = 0;
};

struct Outcome {
  bool ran = false;           ///< both sides stepped every step
  std::string error;          ///< why not
  int64_t compared_bytes = 0; ///< bytes compared
  int64_t mismatches = 0;     ///< elements that differ in any bit
  int64_t nan_payload_only = 0; ///< of which both sides are NaN
  std::string first;          ///< the first mismatch, in words
  std::string nan_buffers;    ///< buffers with NaN-payload-only mismatches
  int64_t launches = 0;       ///< GPU launches made (step kernels)
  int64_t grid = 0;           ///< blocks of the last full launch
};

/// Steps bundle `dir` on the emulated chip and on the CPU and compares.
Outcome compare(const std::string &dir, int chip, const Run &run);

} // namespace flashopt::emutest

#endif // FLASHOPT_UNITTESTS_EMULATEDGPU_H
