//===- cpu_bench.cpp - CPU optimizer step benchmark
//--------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-cpu-bench --kernels DIR [--sizes 1e6,1e8] [--threads N]
///  [--only NAME]... [--min-time S] [--cold [ROUNDS]]`
///
/// Steps every bundle of DIR (one tensor of each size) with its CPU kernel on
/// 1 thread and on all threads, and prints one markdown table: ms/step,
/// parameters/s, effective GB/s (bytes moved per parameter from the
/// manifest: every buffer read, every writable one written, scales
/// amortized) and, next to it, the bandwidth of a memcpy moving the same
/// number of bytes (copying half of them: each is read once and written
/// once) on as many threads, timed in the same run. Sizes that fit in the
/// caches make both numbers cache bandwidths. `--cold` times each step (and
/// each copy) right after streaming a buffer twice the last-level cache
/// through the cache, as an optimizer step runs after a backward pass: the
/// median of ROUNDS (default 9) such steps, each from DRAM. A benchmark, not
/// a test: nothing is checked.
///
//===----------------------------------------------------------------------===//

#include "BenchCommon.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <unistd.h>

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
  const int w = dtype_bits(t) / 8; // parameters and gradients: whole bytes
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

/// Bytes of the last-level cache (L3, else L2; 0 when sysconf does not know).
int64_t lastLevelCacheBytes() {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0)
    llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::max<int64_t>(0, llc);
}

/// Thread i's share [begin, end) of `bytes` copied by `threads` threads:
/// 64-byte aligned pieces, the last thread taking the rest.
std::pair<int64_t, int64_t> copyShare(int64_t bytes, int threads, int i) {
  int64_t chunk = (bytes / threads + 63) / 64 * 64;
  int64_t b = std::min<int64_t>(bytes, i * chunk);
  int64_t e = i == threads - 1 ? bytes : std::min<int64_t>(bytes, b + chunk);
  return {b, std::max(b, e)};
}

/// A buffer twice the last-level cache (64 MiB to 2 GiB), written and read
/// back before each cold measurement so that nothing of the step's data is
/// left in any cache.
class Evictor {
public:
  Evictor() {
    bytes_ = std::clamp<int64_t>(2 * lastLevelCacheBytes(), 64 << 20,
                                 int64_t(2) << 30);
    buf_ = allocateHost(bytes_);
    if (buf_)
      std::memset(buf_.get(), 0, size_t(bytes_));
  }
  bool ok() const { return bool(buf_); }
  int64_t bytes() const { return bytes_; }
  void run() {
    ++pass_;
    std::memset(buf_.get(), int(pass_ & 0xff), size_t(bytes_));
    uint64_t sum = 0;
    const uint64_t *w = reinterpret_cast<const uint64_t *>(buf_.get());
    for (int64_t i = 0; i < bytes_ / 8; i += 8)
      sum += w[i];
    sink_ += sum;
  }

private:
  HostBuffer buf_;
  int64_t bytes_ = 0;
  uint64_t pass_ = 0;
  volatile uint64_t sink_ = 0;
};

/// Median seconds of `rounds` calls of `fn`, each right after `evict.run()`.
double coldTime(const std::function<void()> &fn, Evictor &evict, int rounds) {
  fn(); // warm-up: pages touched, states allocated
  std::vector<double> t;
  for (int r = 0; r < std::max(1, rounds); ++r) {
    evict.run();
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// The bandwidth (read + write, GB/s) of memcpy over `threads` threads, each
/// copying its share of `bytes` repeatedly for `minTime` seconds (threads
/// started once, not per copy).
double copyGbs(uint8_t *dst, const uint8_t *src, int64_t bytes, int threads,
               double minTime) {
  threads = std::max(1, threads);
  std::vector<double> gbs(size_t(threads), 0.0);
  std::atomic<int> ready{0};
  auto work = [&](int i) {
    auto [b, e] = copyShare(bytes, threads, i);
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

/// memcpy of `bytes` on `threads` threads (each its share), cold: read +
/// write GB/s of the median of `rounds` copies, each after `evict.run()`.
double coldCopyGbs(uint8_t *dst, const uint8_t *src, int64_t bytes, int threads,
                   Evictor &evict, int rounds) {
  threads = std::max(1, threads);
  auto copy = [&] {
    std::vector<std::thread> pool;
    auto part = [&](int i) {
      auto [b, e] = copyShare(bytes, threads, i);
      if (e > b)
        std::memcpy(dst + b, src + b, size_t(e - b));
    };
    for (int i = 1; i < threads; ++i)
      pool.emplace_back(part, i);
    part(0);
    for (std::thread &t : pool)
      t.join();
  };
  double s = coldTime(copy, evict, rounds);
  return 2.0 * double(bytes) / s / 1e9;
}

/// The CPU model (/proc/cpuinfo) and last-level cache: the host's speed
/// varies between machines far more than between kernel versions.
std::string hostCpu() {
  std::string model = "unknown CPU";
  if (FILE *f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "model name", 10) != 0)
        continue;
      const char *c = std::strchr(line, ':');
      if (c) {
        model = c + 1;
        size_t b = model.find_first_not_of(" \t");
        size_t e = model.find_last_not_of(" \t\n");
        model =
            b == std::string::npos ? "unknown CPU" : model.substr(b, e - b + 1);
      }
      break;
    }
    std::fclose(f);
  }
  if (int64_t llc = lastLevelCacheBytes())
    model += ", last-level cache " + std::to_string(llc >> 20) + " MiB";
  return model;
}

int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "flashopt-cpu-bench: %s\n", msg);
  std::fprintf(stderr,
               "usage: flashopt-cpu-bench --kernels DIR [--sizes 1e6,1e8] "
               "[--threads N] [--only NAME]... [--min-time SECONDS] "
               "[--cold [ROUNDS]]\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  std::string kernels;
  std::vector<int64_t> sizes = {1000000, 100000000};
  std::vector<std::string> only;
  int allThreads = int(std::max(1u, std::thread::hardware_concurrency()));
  double minTime = 0.3;
  int coldRounds = 0; // 0: warm (repeated steps)
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
    else if (a == "--cold") {
      coldRounds = 9;
      if (v && std::isdigit(static_cast<unsigned char>(v[0])))
        coldRounds = std::max(1, std::atoi(argv[++i]));
    } else
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

  std::printf("flashopt-cpu-bench: %s; %zu bundles, sizes", hostCpu().c_str(),
              names.size());
  for (int64_t n : sizes)
    std::printf(" %s", sizeName(n).c_str());
  std::unique_ptr<Evictor> evict;
  if (coldRounds > 0) {
    evict = std::make_unique<Evictor>();
    if (!evict->ok())
      return usage("--cold: cannot allocate the eviction buffer");
    std::printf(", threads 1 and %d, cold: median of %d steps, each after "
                "streaming %.0f MiB through the caches\n\n",
                allThreads, coldRounds, double(evict->bytes()) / (1 << 20));
  } else {
    std::printf(", threads 1 and %d, >= %.2fs per measurement\n\n", allThreads,
                minTime);
  }
  std::printf("| bundle | kernel | params | threads | ms/step | Mparams/s | "
              "B/param | GB/s | memcpy GB/s | %% of memcpy |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  int failures = 0;
  for (const std::string &name : names) {
    CpuLoadOptions lo;
    auto bundle = CpuBundle::load(kernels + "/" + name, lo);
    if (!bundle) {
      std::printf("| %s | error: %s |\n", name.c_str(), bundle.error().c_str());
      ++failures;
      continue;
    }
    const Manifest &m = (*bundle)->manifest();
    const double moved = bytesMovedPerParam(m);
    for (int64_t n : sizes) {
      HostBuffer p = allocateHost(int64_t(dtype_bytes(m.param, uint64_t(n))));
      HostBuffer g = allocateHost(int64_t(dtype_bytes(m.grad, uint64_t(n))));
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
      CpuOptimizerOptions oo;
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
        auto step = [&] {
          Status s = (*opt)->step();
          if (!s)
            stepStatus = s;
        };
        double perStep = evict ? coldTime(step, *evict, coldRounds)
                               : timePerCall(step, minTime);
        if (!stepStatus) {
          std::printf("| %s | | %s | %d | error: %s |\n", name.c_str(),
                      sizeName(n).c_str(), threads,
                      stepStatus.message().c_str());
          ++failures;
          break;
        }
        double gbs = moved * double(n) / perStep / 1e9;
        double copy =
            evict ? coldCopyGbs(cd.get(), cs.get(), copyBytes, threads, *evict,
                                coldRounds)
                  : copyGbs(cd.get(), cs.get(), copyBytes, threads, minTime);
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
