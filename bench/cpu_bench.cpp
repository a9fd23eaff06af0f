//===- cpu_bench.cpp - CPU optimizer step benchmark
//--------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-cpu-bench --kernels DIR [--sizes 1e6,1e8] [--threads N]
///  [--only NAME]... [--min-time S]`
///
/// Steps every bundle of DIR (one tensor of each size) with its CPU kernel on
/// 1 thread and on all threads, and prints one markdown table: ms/step,
/// parameters/s, effective GB/s (bytes moved per parameter from the
/// manifest: every buffer read, every writable one written, scales
/// amortized) and, next to it, the bandwidth of a memcpy moving the same
/// number of bytes (copying half of them: each is read once and written
/// once) on as many threads, timed in the same run. Sizes that fit in the
/// caches make both numbers cache bandwidths. A benchmark, not a
/// test: nothing is checked.
///
//===----------------------------------------------------------------------===//

#include "BenchCommon.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

using namespace flashopt::bench;
using namespace flashopt::host;

namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(void *p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

HostBuffer allocateHost(int64_t bytes) {
  void *p = nullptr;
  if (posix_memalign(&p, 64, size_t(std::max<int64_t>(64, bytes))) != 0)
    return nullptr;
  return HostBuffer(static_cast<uint8_t *>(p));
}

/// Fills `n` elements of dtype `t`: a 1M-element pattern, repeated.
void fill(DType t, uint8_t *dst, int64_t n, float scale, uint64_t seed) {
  const int64_t block = std::min<int64_t>(n, 1 << 20);
  const int w = dtype_size(t);
  fillFloats(t, dst, block, scale, seed);
  for (int64_t at = block; at < n; at += block)
    std::memcpy(dst + at * w, dst, size_t(std::min(block, n - at) * w));
}

/// Seconds per call of `fn`: warm-up once, then repeat until `minTime`
/// seconds (at least 3 calls).
double timePerCall(const std::function<void()> &fn, double minTime) {
  fn();
  int64_t calls = 0;
  auto t0 = Clock::now();
  double elapsed = 0;
  while (calls < 3 || elapsed < minTime) {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return elapsed / double(calls);
}

/// The bandwidth (read + write, GB/s) of memcpy over `threads` threads, each
/// copying its share of `bytes` repeatedly for `minTime` seconds (threads
/// started once, not per copy).
double copyGbs(uint8_t *dst, const uint8_t *src, int64_t bytes, int threads,
               double minTime) {
  threads = std::max(1, threads);
  int64_t chunk = (bytes / threads + 63) / 64 * 64;
  std::vector<double> gbs(size_t(threads), 0.0);
  std::atomic<int> ready{0};
  auto work = [&](int i) {
    int64_t b = std::min<int64_t>(bytes, i * chunk);
    int64_t e = i == threads - 1 ? bytes : std::min<int64_t>(bytes, b + chunk);
    if (e > b)
      std::memcpy(dst + b, src + b, size_t(e - b)); // warm-up
    ready.fetch_add(1);
    while (ready.load() < threads) {
    }
    if (e <= b)
      return;
    int64_t copies = 0;
    auto t0 = Clock::now();
    double elapsed = 0;
    while (copies < 3 || elapsed < minTime) {
      std::memcpy(dst + b, src + b, size_t(e - b));
      ++copies;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    gbs[size_t(i)] = 2.0 * double(e - b) * double(copies) / elapsed / 1e9;
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i)
    pool.emplace_back(work, i);
  work(0);
  for (std::thread &t : pool)
    t.join();
  double total = 0;
  for (double g : gbs)
    total += g;
  return total;
}

int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "flashopt-cpu-bench: %s\n", msg);
  std::fprintf(stderr,
               "usage: flashopt-cpu-bench --kernels DIR [--sizes 1e6,1e8] "
               "[--threads N] [--only NAME]... [--min-time SECONDS]\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  std::string kernels;
  std::vector<int64_t> sizes = {1000000, 100000000};
  std::vector<std::string> only;
  int allThreads = int(std::max(1u, std::thread::hardware_concurrency()));
  double minTime = 0.3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--kernels" && v)
      kernels = argv[++i];
    else if (a == "--sizes" && v) {
      if (!parseSizes(argv[++i], sizes))
        return usage("bad --sizes (e.g. 1e6,1e8)");
    } else if (a == "--threads" && v)
      allThreads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && v)
      only.push_back(argv[++i]);
    else if (a == "--min-time" && v)
      minTime = std::atof(argv[++i]);
    else
      return usage(("unknown or incomplete argument: " + a).c_str());
  }
  if (kernels.empty())
    return usage("--kernels DIR is required");
  std::vector<std::string> names = list_bundles(kernels);
  if (!only.empty()) {
    std::vector<std::string> keep;
    for (const std::string &n : names)
      if (std::find(only.begin(), only.end(), n) != only.end())
        keep.push_back(n);
    names = keep;
  }
  if (names.empty()) {
    std::fprintf(stderr, "flashopt-cpu-bench: no bundles under %s\n",
                 kernels.c_str());
    return 1;
  }
  std::vector<int> threadCounts = {1};
  if (allThreads > 1)
    threadCounts.push_back(allThreads);

  std::printf("flashopt-cpu-bench: %zu bundles, sizes", names.size());
  for (int64_t n : sizes)
    std::printf(" %s", sizeName(n).c_str());
  std::printf(", threads 1 and %d, >= %.2fs per measurement\n\n", allThreads,
              minTime);
  std::printf("| bundle | kernel | params | threads | ms/step | Mparams/s | "
              "B/param | GB/s | memcpy GB/s | %% of memcpy |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  int failures = 0;
  for (const std::string &name : names) {
    LoadOptions lo;
    auto bundle = Bundle::load(kernels + "/" + name, lo);
    if (!bundle) {
      std::printf("| %s | error: %s |\n", name.c_str(), bundle.error().c_str());
      ++failures;
      continue;
    }
    const Manifest &m = (*bundle)->manifest();
    const double moved = bytesMovedPerParam(m);
    for (int64_t n : sizes) {
      HostBuffer p = allocateHost(n * dtype_size(m.param));
      HostBuffer g = allocateHost(n * dtype_size(m.grad));
      int64_t copyBytes = int64_t(moved * double(n) / 2);
      HostBuffer cs = allocateHost(copyBytes), cd = allocateHost(copyBytes);
      if (!p || !g || !cs || !cd) {
        std::printf("| %s | | %s | | out of host memory |\n", name.c_str(),
                    sizeName(n).c_str());
        continue;
      }
      fill(m.param, p.get(), n, 1.0f, 1);
      fill(m.grad, g.get(), n, 1e-2f, 2);
      std::memset(cs.get(), 1, size_t(copyBytes));
      std::memset(cd.get(), 0, size_t(copyBytes));
      OptimizerOptions oo;
      oo.threads = 1;
      auto opt = CpuOptimizer::create(*bundle, oo);
      if (!opt) {
        std::printf("| %s | error: %s |\n", name.c_str(), opt.error().c_str());
        ++failures;
        continue;
      }
      auto idx = (*opt)->add_param(0, p.get(), n, g.get());
      if (!idx) {
        std::printf("| %s | | %s | | error: %s |\n", name.c_str(),
                    sizeName(n).c_str(), idx.error().c_str());
        ++failures;
        continue;
      }
      for (int threads : threadCounts) {
        Status st = (*opt)->set_threads(threads);
        (void)st;
        Status stepStatus;
        double perStep = timePerCall(
            [&] {
              Status s = (*opt)->step();
              if (!s)
                stepStatus = s;
            },
            minTime);
        if (!stepStatus) {
          std::printf("| %s | | %s | %d | error: %s |\n", name.c_str(),
                      sizeName(n).c_str(), threads,
                      stepStatus.message().c_str());
          ++failures;
          break;
        }
        double gbs = moved * double(n) / perStep / 1e9;
        double copy = copyGbs(cd.get(), cs.get(), copyBytes, threads, minTime);
        std::printf("| %s | %s | %s | %d | %.3f | %.1f | %.3f | %.2f | %.2f | "
                    "%.0f%% |\n",
                    name.c_str(), (*bundle)->kernel().cpu.c_str(),
                    sizeName(n).c_str(), threads, perStep * 1e3,
                    double(n) / perStep / 1e6, moved, gbs, copy,
                    100.0 * gbs / copy);
        std::fflush(stdout);
      }
    }
  }
  return failures ? 1 : 0;
}
