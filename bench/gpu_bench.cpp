//===- gpu_bench.cpp - GPU optimizer step benchmark
//--------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-gpu-bench --kernels DIR [--bundle NAME[,NAME...]|all]
///  [--sizes 1e6,1e8,1e9] [--no-small] [--device N] [--iters N] [--warmup N]
///  [--driver LIBCUDA]`
///
/// Times the GPU step of each named bundle (default adamw_bf16_m24; `all`:
/// every bundle with a kernel for the device) with CUDA events on the
/// optimizer's stream:
///
///  - one tensor of each size (a size that does not fit in free device
///    memory is skipped): ms/step and effective GB/s (bytes moved per
///    parameter from the manifest: every buffer read, every writable one
///    written, scales amortized), next to a cuMemcpyDtoD moving the same
///    number of bytes (copying half of them: each is read and written once)
///    timed in the same run, and the ratio;
///  - many small tensors (300 of 65536): one multi-tensor launch against one
///    launch per tensor (300 optimizers); not with --no-small.
///
/// scripts/sass-cost.py --measured reads the table to set the static
/// issue-cost model's predictions beside the measured times.
///
/// Prints one markdown table. Exit status 77 with "no NVIDIA GPU/driver:
/// <reason>" when CUDA is unavailable. A benchmark, not a test.
///
//===----------------------------------------------------------------------===//

#include "BenchCommon.h"

#include "flashopt/host/CudaOptimizer.h"

#include <cstdio>
#include <functional>
#include <sstream>
#include <memory>

using namespace flashopt::bench;
using namespace flashopt::host;
using namespace flashopt::host::cu;

namespace {

/// CUDA events on the legacy stream (where the optimizers run).
class Timer {
public:
  explicit Timer(const CudaContext &ctx) : ctx_(ctx), d_(ctx.driver()) {
    CudaContext::Scope s(ctx_);
    ok_ = s.ok() &&
          d_.cuEventCreate(&start_, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
          d_.cuEventCreate(&stop_, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
  }
  ~Timer() {
    CudaContext::Scope s(ctx_);
    if (start_)
      d_.cuEventDestroy(start_);
    if (stop_)
      d_.cuEventDestroy(stop_);
  }
  /// Milliseconds per call of `fn` over `iters` calls after `warmup`; a
  /// negative value when fn or the driver failed (`error` says why, and
  /// failure() is that failure).
  double msPerCall(const std::function<Status()> &fn, int warmup, int iters,
                   std::string &error) {
    if (!ok_) {
      failure_ = Status::error(Code::Cuda, "cuEventCreate failed");
      error = failure_.message();
      return -1;
    }
    for (int i = 0; i < warmup; ++i) {
      Status s = fn();
      if (!s) {
        failure_ = s;
        error = s.message();
        return -1;
      }
    }
    CudaContext::Scope scope(ctx_);
    Status s = d_.check(d_.cuEventRecord(start_, nullptr), "cuEventRecord");
    for (int i = 0; s && i < iters; ++i)
      s = fn();
    if (s)
      s = d_.check(d_.cuEventRecord(stop_, nullptr), "cuEventRecord");
    if (s)
      s = d_.check(d_.cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    if (s)
      s = d_.check(d_.cuEventElapsedTime(&ms, start_, stop_),
                   "cuEventElapsedTime");
    if (!s) {
      failure_ = s;
      error = s.message();
      return -1;
    }
    return double(ms) / iters;
  }
  /// The last failure of msPerCall.
  const Status &failure() const { return failure_; }

private:
  const CudaContext &ctx_;
  const CudaDriver &d_;
  CUevent start_ = nullptr, stop_ = nullptr;
  bool ok_ = false;
  Status failure_;
};

/// Fills a device buffer of `n` elements of `t`: a 1M-element host pattern,
/// uploaded once and doubled on the device.
Status fillDevice(const CudaContext &ctx, CUdeviceptr dst, DType t, int64_t n,
                  float scale, uint64_t seed) {
  const int w = dtype_bits(t) / 8; // parameters and gradients: whole bytes
  const int64_t block = std::min<int64_t>(n, 1 << 20);
  std::vector<uint8_t> host(size_t(block * w));
  fillFloats(t, host.data(), block, scale, seed);
  Status s = ctx.upload(dst, host.data(), block * w);
  CudaContext::Scope scope(ctx);
  const CudaDriver &d = ctx.driver();
  for (int64_t done = block; s && done < n; done *= 2) {
    int64_t count = std::min(done, n - done);
    s = d.check(
        d.cuMemcpyDtoD(dst + uint64_t(done * w), dst, size_t(count * w)),
        "cuMemcpyDtoD");
  }
  return s;
}

struct Row {
  std::string name, params, tensors, launches;
  double ms = -1, gbs = 0, copyGbs = 0;
  std::string note;
};

void printRow(const Row &r) {
  if (r.ms < 0) {
    std::printf("| %s | %s | %s | %s | - | - | - | - | %s |\n", r.name.c_str(),
                r.params.c_str(), r.tensors.c_str(), r.launches.c_str(),
                r.note.c_str());
  } else {
    std::printf(
        "| %s | %s | %s | %s | %.4f | %.1f | %s | %s | %s |\n", r.name.c_str(),
        r.params.c_str(), r.tensors.c_str(), r.launches.c_str(), r.ms, r.gbs,
        r.copyGbs > 0 ? std::to_string(int(r.copyGbs + 0.5)).c_str() : "-",
        r.copyGbs > 0
            ? (std::to_string(int(100 * r.gbs / r.copyGbs + 0.5)) + "%").c_str()
            : "-",
        r.note.c_str());
  }
  std::fflush(stdout);
}

int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "flashopt-gpu-bench: %s\n", msg);
  std::fprintf(stderr,
               "usage: flashopt-gpu-bench --kernels DIR "
               "[--bundle NAME[,NAME...]|all] [--sizes 1e6,1e8,1e9] "
               "[--no-small] [--device N] [--iters N] [--warmup N] "
               "[--driver LIBCUDA]\n");
  return 2;
}

struct Options {
  std::string kernels;
  std::vector<int64_t> sizes = {1000000, 100000000, 1000000000};
  int iters = 0, warmup = 3;
  bool small = true;
};

/// Times one bundle: a row per size and (unless --no-small) the 300-tensor
/// pair. Returns the number of errors.
int benchBundle(const std::shared_ptr<CudaContext> &ctx, Timer &timer,
                const Options &o, const std::string &bundleName) {
  const CudaDriver &d = ctx->driver();
  int errors = 0;
  auto bundle = CudaBundle::load(ctx, o.kernels + "/" + bundleName);
  if (!bundle) {
    Row r;
    r.name = bundleName;
    r.note = "error: " + bundle.error();
    printRow(r);
    return 1;
  }
  const Manifest &m = (*bundle)->manifest();
  const double moved = bytesMovedPerParam(m);
  const int pw = dtype_bits(m.param) / 8, gw = dtype_bits(m.grad) / 8;
  const double statePerParam = m.computed_bytes_per_param().correction +
                               m.computed_bytes_per_param().states;
  const std::string kernelNote =
      std::to_string((*bundle)->registers()) + " regs, " +
      std::to_string(m.group_size) + "/group, " +
      std::to_string(moved).substr(0, 6) + " B/param";
  const int warmup = o.warmup;

  // Times a device-to-device copy moving `bytes` bytes (bytes / 2 copied).
  auto copyGbs = [&](int64_t bytes, int its, std::string &err) -> double {
    int64_t half = std::max<int64_t>(16, bytes / 2);
    auto src = DeviceBuffer::allocate(ctx, half);
    auto dst = DeviceBuffer::allocate(ctx, half);
    if (!src || !dst) {
      err = !src ? src.error() : dst.error();
      return -1;
    }
    {
      CudaContext::Scope scope(*ctx);
      d.cuMemsetD8(src->ptr(), 1, size_t(half));
    }
    double ms = timer.msPerCall(
        [&] {
          CudaContext::Scope scope(*ctx);
          return d.check(d.cuMemcpyDtoDAsync(dst->ptr(), src->ptr(),
                                             size_t(half), nullptr),
                         "cuMemcpyDtoDAsync");
        },
        warmup, its, err);
    return ms < 0 ? -1 : 2.0 * double(half) / (ms * 1e-3) / 1e9;
  };

  // ---- one tensor of each size ---------------------------------------------
  for (int64_t n : o.sizes) {
    Row row;
    row.name = bundleName;
    row.params = sizeName(n);
    row.tensors = "1";
    row.launches = "1";
    int its = o.iters > 0      ? o.iters
              : n <= 10000000  ? 200
              : n <= 200000000 ? 50
                               : 20;
    // Params, grads, state, and the copy's two halves.
    double need =
        double(n) * (pw + gw + statePerParam + moved) * 1.05 + (64 << 20);
    int64_t freeBytes = 0;
    if (!ctx->memory_info(&freeBytes, nullptr) || need > double(freeBytes)) {
      row.note = "skipped: needs " + std::to_string(int(need / (1 << 30) + 1)) +
                 " GiB, " + std::to_string(freeBytes >> 30) + " GiB free";
      printRow(row);
      continue;
    }
    std::string err;
    {
      auto p = DeviceBuffer::allocate(ctx, n * pw);
      auto g = DeviceBuffer::allocate(ctx, n * gw);
      auto opt = CudaOptimizer::create(*bundle);
      Status s = !p     ? p.status()
                 : !g   ? g.status()
                 : !opt ? opt.status()
                        : Status();
      if (s)
        s = fillDevice(*ctx, p->ptr(), m.param, n, 1.0f, 1);
      if (s)
        s = fillDevice(*ctx, g->ptr(), m.grad, n, 1e-2f, 2);
      if (s) {
        auto idx = (*opt)->add_param(0, p->ptr(), n, g->ptr());
        s = idx ? (*opt)->allocate() : idx.status();
      }
      if (s) {
        CudaOptimizer &opt1 = **opt;
        row.ms =
            timer.msPerCall([&] { return opt1.step(); }, warmup, its, err);
        if (row.ms < 0)
          s = timer.failure();
        else
          row.note = "grid " + std::to_string(opt1.launch_config().grid) +
                     ", " + std::to_string(its) + " steps, " + kernelNote;
      }
      if (!s) {
        row.ms = -1;
        row.note = "error: " + s.message();
        ++errors;
        printRow(row);
        continue;
      }
    }
    row.gbs = moved * double(n) / (row.ms * 1e-3) / 1e9;
    row.copyGbs = copyGbs(int64_t(moved * double(n)), its, err);
    if (row.copyGbs < 0)
      row.note += "; copy failed: " + err;
    printRow(row);
  }
  if (!o.small)
    return errors;

  // ---- many small tensors ---------------------------------------------------
  const int NT = 300;
  const int64_t each = 65536, n = NT * each;
  int its = o.iters > 0 ? o.iters : 100;
  auto p = DeviceBuffer::allocate(ctx, n * pw);
  auto p2 = DeviceBuffer::allocate(ctx, n * pw);
  auto g = DeviceBuffer::allocate(ctx, n * gw);
  Status s = !p ? p.status() : !p2 ? p2.status() : !g ? g.status() : Status();
  if (s)
    s = fillDevice(*ctx, p->ptr(), m.param, n, 1.0f, 3);
  if (s)
    s = fillDevice(*ctx, p2->ptr(), m.param, n, 1.0f, 3);
  if (s)
    s = fillDevice(*ctx, g->ptr(), m.grad, n, 1e-2f, 4);
  auto multi = CudaOptimizer::create(*bundle);
  if (s && !multi)
    s = multi.status();
  std::vector<std::unique_ptr<CudaOptimizer>> singles;
  for (int i = 0; s && i < NT; ++i) {
    uint64_t po = uint64_t(i * each * pw), go = uint64_t(i * each * gw);
    auto a = (*multi)->add_param(0, p->ptr() + po, each, g->ptr() + go);
    auto one = CudaOptimizer::create(*bundle);
    if (!a || !one) {
      s = !a ? a.status() : one.status();
      break;
    }
    auto b = (*one)->add_param(0, p2->ptr() + po, each, g->ptr() + go);
    if (!b)
      s = b.status();
    else
      s = (*one)->allocate();
    singles.push_back(std::move(*one));
  }
  if (s)
    s = (*multi)->allocate();
  Row rm, rs;
  rm.name = bundleName + " multi-tensor";
  rs.name = bundleName + " per-tensor";
  rm.params = rs.params = std::to_string(NT) + "x" + std::to_string(each);
  rm.tensors = rs.tensors = std::to_string(NT);
  rm.launches = "1";
  rs.launches = std::to_string(NT);
  std::string err;
  if (s) {
    rm.ms = timer.msPerCall([&] { return (*multi)->step(); }, warmup, its, err);
    rs.ms = timer.msPerCall(
        [&] {
          for (auto &one : singles) {
            Status st = one->step();
            if (!st)
              return st;
          }
          return Status::success();
        },
        warmup, its, err);
    if (rm.ms < 0 || rs.ms < 0)
      s = timer.failure();
  }
  if (!s) {
    rm.ms = rs.ms = -1;
    rm.note = rs.note = "error: " + s.message();
    ++errors;
  } else {
    double c = copyGbs(int64_t(moved * double(n)), its, err);
    for (Row *r : {&rm, &rs}) {
      r->gbs = moved * double(n) / (r->ms * 1e-3) / 1e9;
      r->copyGbs = c;
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.2fx faster than per-tensor, grid %lld",
                  rs.ms / rm.ms, (long long)(*multi)->launch_config().grid);
    rm.note = buf;
  }
  printRow(rm);
  printRow(rs);
  return errors;
}

} // namespace

int main(int argc, char **argv) {
  Options o;
  std::string bundleArg = "adamw_bf16_m24";
  int device = 0;
  std::string driverPath;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--kernels" && v)
      o.kernels = argv[++i];
    else if (a == "--bundle" && v)
      bundleArg = argv[++i];
    else if (a == "--sizes" && v) {
      if (!parseSizes(argv[++i], o.sizes))
        return usage("bad --sizes (e.g. 1e6,1e8,1e9)");
    } else if (a == "--device" && v)
      device = std::atoi(argv[++i]);
    else if (a == "--iters" && v)
      o.iters = std::max(1, std::atoi(argv[++i]));
    else if (a == "--driver" && v)
      driverPath = argv[++i];
    else if (a == "--warmup" && v)
      o.warmup = std::max(0, std::atoi(argv[++i]));
    else if (a == "--no-small")
      o.small = false;
    else
      return usage(("unknown or incomplete argument: " + a).c_str());
  }
  if (o.kernels.empty())
    return usage("--kernels DIR is required");

  // --driver: another driver library (a dry run with a stand-in).
  std::unique_ptr<CudaDriver> driver;
  Expected<std::shared_ptr<CudaContext>> ctxOr =
      Status::error(Code::Device, "no driver loaded");
  if (driverPath.empty()) {
    ctxOr = CudaContext::create(device);
  } else if (auto dl = CudaDriver::load(driverPath)) {
    driver = std::move(dl.value());
    ctxOr = CudaContext::create(*driver, device);
  } else {
    ctxOr = dl.status();
  }
  if (!ctxOr) {
    std::printf("no NVIDIA GPU/driver: %s\n", ctxOr.error().c_str());
    return 77;
  }
  std::shared_ptr<CudaContext> ctx = *ctxOr;
  const CudaDeviceInfo &info = ctx->info();

  // The bundles: a list, or every one with a kernel for this chip.
  std::vector<std::string> names;
  if (bundleArg == "all") {
    for (const std::string &b : listBundles(o.kernels))
      if (auto cb = CudaBundle::load(ctx, o.kernels + "/" + b))
        names.push_back(b);
    if (names.empty()) {
      std::printf("flashopt-gpu-bench: no bundle under %s has a kernel for "
                  "sm_%d\n",
                  o.kernels.c_str(), info.chip());
      return 1;
    }
  } else {
    std::stringstream ss(bundleArg);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty())
        names.push_back(item);
    if (names.empty())
      return usage("--bundle needs a name");
  }

  std::printf("flashopt-gpu-bench: %zu bundle(s) on %s (sm_%d, %d SMs, %.0f "
              "GiB, driver CUDA %s)\n\n",
              names.size(), info.name.c_str(), info.chip(), info.sm_count,
              double(info.total_memory) / (1 << 30),
              cuda_version_string(info.driver_version).c_str());
  std::printf("| case | params | tensors | launches/step | ms/step | GB/s | "
              "copy GB/s | %% of copy | note |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---|\n");

  Timer timer(*ctx);
  int errors = 0;
  for (const std::string &b : names)
    errors += benchBundle(ctx, timer, o, b);
  std::printf("\nGB/s counts the bytes per param of each bundle's manifest "
              "(every buffer read, every writable one written); copy GB/s "
              "counts read + write of a cuMemcpyDtoD of half as many bytes.\n");
  return errors ? 1 : 0;
}
