//===- accum_bench.cpp - Bandwidth of the generated accumulate kernel -----===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-accum-bench: the bandwidth of a bundle's generated accumulate
/// kernel (accum = encode(decode(accum) + grad)) on the CPU, as a percentage
/// of memcpy measured in the same run on buffers of the same size. Bytes
/// moved per element: the gradient read, the accumulator read and written.
///
///   build/bin/flashopt-accum-bench BUNDLE_DIR [elements] [threads]
///
/// (bundles with an accumulator: build/kernels-accumulate/*_acc_*).
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CpuOptimizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace flashopt::host;

namespace {
double seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
} // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BUNDLE_DIR [elements] [threads]\n",
                 argv[0]);
    return 2;
  }
  const int64_t n = argc > 2 ? int64_t(std::atof(argv[2])) : int64_t(1) << 24;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  CpuOptimizerOptions oo;
  oo.threads = threads;
  auto opt = CpuOptimizer::create(argv[1], CpuLoadOptions{}, oo);
  if (!opt) {
    std::fprintf(stderr, "%s\n", opt.error().c_str());
    return 1;
  }
  const Manifest &m = (*opt)->manifest();
  if (!m.accumulator) {
    std::fprintf(stderr, "%s has no accumulator\n", m.name.c_str());
    return 1;
  }
  std::vector<uint8_t> param(size_t(dtype_bytes(m.param, uint64_t(n))), 0),
      grad(size_t(dtype_bytes(m.grad, uint64_t(n))), 0x3c);
  if (!(*opt)->add_param(0, param.data(), n, grad.data()) ||
      !(*opt)->allocate()) {
    std::fprintf(stderr, "cannot allocate\n");
    return 1;
  }
  double accBytes = double(dtype_bits(m.accumulator->dtype)) / 8 +
                    (m.accumulator->correction
                         ? double(dtype_bits(*m.accumulator->correction)) / 8
                         : 0.0);
  double moved = double(n) * (double(dtype_bits(m.grad)) / 8 + 2 * accBytes);
  // memcpy of as many bytes (half read, half written).
  std::vector<uint8_t> src(size_t(moved / 2)), dst(size_t(moved / 2));
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 0, dst.size());
  const int reps = 10;
  double bestAcc = 1e30, bestCopy = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = seconds();
    if (!(*opt)->accumulate_tensors({0})) {
      std::fprintf(stderr, "accumulate failed\n");
      return 1;
    }
    double t1 = seconds();
    std::memcpy(dst.data(), src.data(), src.size());
    double t2 = seconds();
    bestAcc = std::min(bestAcc, t1 - t0);
    bestCopy = std::min(bestCopy, t2 - t1);
  }
  double accGBs = moved / bestAcc / 1e9, copyGBs = moved / bestCopy / 1e9;
  std::printf("flashopt-accum-bench: %s, %lld elements, %d thread(s), "
              "accumulator %s%s\n",
              m.name.c_str(), (long long)n, threads,
              dtype_name(m.accumulator->dtype),
              m.accumulator->correction ? "+i8" : "");
  std::printf("accumulate: %.3f ms, %.2f GB/s; memcpy: %.3f ms, %.2f GB/s; "
              "accumulate = %.1f %% of memcpy\n",
              bestAcc * 1e3, accGBs, bestCopy * 1e3, copyGBs,
              100.0 * accGBs / copyGBs);
  return 0;
}
