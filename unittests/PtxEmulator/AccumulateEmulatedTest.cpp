//===- AccumulateEmulatedTest.cpp - GPU accumulation kernels vs the CPU ---===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The generated GPU accumulation kernels (accumulate, step_accumulated,
/// step_fused; docs/KERNEL-ABI.md "Gradient accumulation") loaded by the
/// CUDA runtime and run by the PTX interpreter, against the CPU kernels of
/// the same bundle: three micro-batches per step, the last one fused into
/// the step on odd steps and accumulated then stepped on even ones, every
/// buffer (accumulators included: the steps zero them) compared bit for bit
/// after four steps, for the f32, bf16 + i8 and bf16 accumulators, on sm_80
/// and sm_90. Bundles: Inputs/accumulate -> <build>/kernels-accumulate-gpu.
///
//===----------------------------------------------------------------------===//

#include "EmulatedGpu.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

using namespace flashopt::emutest;
using namespace flashopt::host;
namespace abi = flashopt::abi;

namespace {

std::string accumDir(const std::string &name) {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : ".") + "/kernels-accumulate-gpu/" + name;
}

const char *const kBundles[] = {"adamw_m24_acc_bf16_i8_gpu",
                                "sgd_f32_acc_f32_gpu",
                                "lion_bf16_acc_bf16_gpu"};

} // namespace

TEST_CASE("emulated GPU: the accumulation kernels == CPU, bit for bit") {
  for (const char *name : kBundles)
    for (int chip : {80, 90}) {
      const std::string what = std::string(name) + " sm_" + std::to_string(chip);
      CAPTURE(what);
      {
        // The runtime loads every kind of the chosen target.
        auto ctx = emulatedContext(chip);
        auto gpu = CudaOptimizer::create(ctx, accumDir(name));
        REQUIRE_MESSAGE(gpu.ok(), gpu.error() << " / " << lastDriverError());
        const CudaBundle &b = (*gpu)->bundle();
        for (abi::KernelKind k : abi::kKernelKinds)
          CHECK_MESSAGE(b.function(k) != nullptr,
                        abi::kernel_kind_name(k) << " kernel loaded");
      }
      Run run;
      run.sizes = {33, 1, 4097, 700, 65};
      run.steps = 4;
      run.seed = 21;
      run.microBatches = 3;
      Outcome o = compare(accumDir(name), chip, run);
      REQUIRE_MESSAGE(o.ran, o.error);
      CHECK(o.compared_bytes > 0);
      CHECK_MESSAGE(o.mismatches == 0, o.mismatches
                                           << " elements differ; first: "
                                           << o.first);
      // One micro-batch per step: step_fused alone (odd steps) and
      // accumulate + step_accumulated (even steps) over a zero accumulator.
      Run one = run;
      one.microBatches = 1;
      one.seed = 22;
      Outcome p = compare(accumDir(name), chip, one);
      REQUIRE_MESSAGE(p.ran, p.error);
      CHECK_MESSAGE(p.mismatches == 0, p.mismatches
                                           << " elements differ (N = 1); "
                                              "first: "
                                           << p.first);
    }
}

TEST_CASE("emulated GPU: the accumulation kernels of a bundle without an "
          "accumulator are refused by name") {
  auto ctx = emulatedContext(90);
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  auto gpu = CudaOptimizer::create(
      ctx, std::string(b ? b : ".") + "/kernels/sgd_f32");
  REQUIRE_MESSAGE(gpu.ok(), gpu.error());
  CHECK((*gpu)->bundle().function(abi::KernelKind::Accumulate) == nullptr);
  auto p = DeviceBuffer::allocate(ctx, 4 * 40);
  auto g = DeviceBuffer::allocate(ctx, 4 * 40);
  REQUIRE(p.ok());
  REQUIRE(g.ok());
  REQUIRE((*gpu)->add_param(0, p->ptr(), 40, g->ptr()).ok());
  Status s = (*gpu)->accumulate_tensors({0});
  CHECK_FALSE(s.ok());
  CHECK(s.message().find("sgd_f32") != std::string::npos);
}
