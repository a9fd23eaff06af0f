//===- flashopt-gpu-check.cpp - GPU kernels == CPU kernels, bit for bit
//-----===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-gpu-check --kernels DIR [--device N] [--only NAME]... [--seed S]
///  [--driver LIBCUDA] [--multi-max-numel N]` (--driver loads another driver
/// library than libcuda.so.1: a dry run with the tests' stand-in, or the
/// PTX interpreter with unittests' flashopt_emulated_cuda; --multi-max-numel
/// bounds the sizes of the 300-tensor test, 70000 by default).
///
/// For every bundle under DIR that has a GPU kernel for the device:
///
///  1. CPU == GPU: one table of tensors of 1, 31, 33, 1000, 4097 and 65543
///     elements (tails of every kind) plus an all-zero tensor and one of
///     subnormals, in two param groups, stepped 5 times (a hyper-parameter
///     changes before step 4) by the host Optimizer with the bundle's CPU
///     kernel and by two CudaOptimizers: one with the default records and
///     one with records capped at 64 groups, so that large tensors are split
///     as a tensor over 2^31 elements would be. Every buffer of every tensor
///     must be bit-identical, NaNs included (from step 2 one tensor's
///     gradients hold a NaN and infinities; both back ends store the
///     canonical NaN). A plain step must not re-upload the tensor or hyper
///     table.
///  2. multi-tensor == per-tensor: 300 tensors of random sizes up to 70000
///     stepped twice in one launch, against one CudaOptimizer per tensor.
///
/// Prints one line per bundle and a summary. Exit status: 0 when everything
/// is identical, 1 on any mismatch or error, 2 on bad usage, 77 (with "no
/// NVIDIA GPU/driver: <reason>") when CUDA is unavailable.
///
//===----------------------------------------------------------------------===//

#include "GpuCheckData.h"

#include "flashopt/host/CudaOptimizer.h"
#include "flashopt/host/Float16.h"
#include "flashopt/host/CpuOptimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <memory>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

using namespace flashopt::host;
using namespace flashopt::gpucheck;

namespace {

//===----------------------------------------------------------------------===//
// The checks
//===----------------------------------------------------------------------===//

struct Outcome {
  int64_t mismatches = 0;
  std::vector<std::string> report; ///< mismatch and error details
  std::string summary;
  void error(const std::string &e) {
    ++mismatches;
    report.push_back(e);
  }
};

#define CHECK_OK(expr, what)                                                   \
  do {                                                                         \
    Status s_ = (expr);                                                        \
    if (!s_) {                                                                 \
      out.error(std::string(what) + ": " + s_.message());                      \
      return;                                                                  \
    }                                                                          \
  } while (0)

/// Gives slot 1 of `o` different hypers than slot 0 where the bundle
/// allows it: half the learning rate, and a different weight decay.
template <typename Opt> void configureSlots(Opt &o) {
  int slot = o.add_param_group();
  (void)slot;
  if (auto lr = o.hyper(0, "lr"))
    (void)o.set_hyper(1, "lr", *lr * 0.5f);
  if (auto wd = o.hyper(0, "weight_decay"))
    (void)o.set_hyper(1, "weight_decay", *wd == 0.0f ? 0.0f : *wd * 3.0f);
}

/// Test 1: the CPU kernel and the GPU kernel (default and split records).
void checkCpuVsGpu(const std::string &dir,
                   const std::shared_ptr<CudaBundle> &gb, uint64_t seed,
                   Outcome &out) {
  const std::shared_ptr<CudaContext> &ctx = gb->context();
  const Manifest &m = gb->manifest();
  CpuLoadOptions lo;
  lo.use_env = false;
  auto cpu = CpuOptimizer::create(dir, lo);
  if (!cpu) {
    out.error("CPU optimizer: " + cpu.error());
    return;
  }
  CudaOptimizerOptions splitOpts;
  splitOpts.max_record_elements = 64 * m.group_size;
  auto gpu = CudaOptimizer::create(gb);
  auto split = CudaOptimizer::create(gb, splitOpts);
  if (!gpu || !split) {
    out.error("GPU optimizer: " + (gpu ? split.error() : gpu.error()));
    return;
  }
  Optimizer &C = **cpu;
  CudaOptimizer &G1 = **gpu, &G2 = **split;
  configureSlots(C);
  configureSlots(G1);
  configureSlots(G2);

  struct T {
    int64_t n;
    Fill fill;
  };
  const std::vector<T> tensors = {{1, Fill::Random},    {31, Fill::Random},
                                  {33, Fill::Random},   {1000, Fill::Random},
                                  {4097, Fill::Random}, {65543, Fill::Random},
                                  {100, Fill::Zeros},   {77, Fill::Subnormals}};
  const size_t NT = tensors.size();
  Rng rng(seed);
  const int pw = dtype_bits(m.param) / 8, gw = dtype_bits(m.grad) / 8;
  std::vector<std::vector<uint8_t>> hp(NT), hg(NT);
  std::vector<DeviceBuffer> dp1(NT), dp2(NT), dg(NT);
  for (size_t i = 0; i < NT; ++i) {
    int64_t n = tensors[i].n;
    hp[i] = makeData(m.param, n, tensors[i].fill, -3, 1, rng);
    hg[i].assign(size_t(n * gw), 0);
    auto a = DeviceBuffer::allocate(ctx, n * pw);
    auto b = DeviceBuffer::allocate(ctx, n * pw);
    auto c = DeviceBuffer::allocate(ctx, n * gw);
    if (!a || !b || !c) {
      out.error("allocating test tensors: " + (!a   ? a.error()
                                               : !b ? b.error()
                                                    : c.error()));
      return;
    }
    dp1[i] = std::move(*a);
    dp2[i] = std::move(*b);
    dg[i] = std::move(*c);
    CHECK_OK(dp1[i].upload(hp[i].data(), n * pw), "upload");
    CHECK_OK(dp2[i].upload(hp[i].data(), n * pw), "upload");
    int slot = int(i % 2);
    auto x = C.add_param(slot, hp[i].data(), n, hg[i].data());
    auto y = G1.add_param(slot, dp1[i].ptr(), n, dg[i].ptr());
    auto z = G2.add_param(slot, dp2[i].ptr(), n, dg[i].ptr());
    if (!x || !y || !z) {
      out.error("add_param: " + (!x ? x.error() : !y ? y.error() : z.error()));
      return;
    }
  }
  const int steps = 5;
  // Before step 4 slot 0's lr changes: the hyper table is re-uploaded once.
  const bool changesLr = m.hyper_index("lr") >= 0 && *C.hyper(0, "lr") != 0.0f;
  for (int s = 1; s <= steps; ++s) {
    for (size_t i = 0; i < NT; ++i) {
      int64_t n = tensors[i].n;
      hg[i] = makeData(m.grad, n, tensors[i].fill, -14, 2, rng);
      if (i == 3 && s >= 2) // NaN and Inf gradients in the 1000-element one
        injectNonFinite(m.grad, hg[i], s);
      CHECK_OK(C.set_grad(int64_t(i), hg[i].data()), "set_grad");
      // The GPU reads the grads asynchronously: the uploads below are
      // ordered after the previous step on the legacy stream.
      CHECK_OK(dg[i].upload(hg[i].data(), n * gw), "upload grad");
    }
    if (s == 4 && changesLr) {
      float lr = *C.hyper(0, "lr") * 0.75f;
      CHECK_OK(C.set_hyper(0, "lr", lr), "set_hyper");
      CHECK_OK(G1.set_hyper(0, "lr", lr), "set_hyper");
      CHECK_OK(G2.set_hyper(0, "lr", lr), "set_hyper");
    }
    CHECK_OK(C.step(), "CPU step " + std::to_string(s));
    CHECK_OK(G1.step(), "GPU step " + std::to_string(s));
    CHECK_OK(G2.step(), "GPU (split records) step " + std::to_string(s));
  }
  CHECK_OK(G1.synchronize(), "synchronize");
  CHECK_OK(G2.synchronize(), "synchronize");

  int64_t expectHyperUploads = changesLr ? 2 : 1;
  if (G1.table_uploads() != 1 || G1.hyper_uploads() != expectHyperUploads)
    out.error("uploads: tensor table " + std::to_string(G1.table_uploads()) +
              " (want 1), hyper table " + std::to_string(G1.hyper_uploads()) +
              " (want " + std::to_string(expectHyperUploads) + ") in " +
              std::to_string(steps) + " steps");
  if (G2.num_records() <= int64_t(NT))
    out.error("the split-records optimizer has " +
              std::to_string(G2.num_records()) + " records for " +
              std::to_string(NT) + " tensors");

  for (size_t i = 0; i < NT; ++i)
    for (const BufferSpec &b : m.buffers) {
      auto want = C.buffer(int64_t(i), b.name);
      if (!want) {
        out.error(want.error());
        return;
      }
      const uint8_t *w = static_cast<const uint8_t *>(want->data);
      for (CudaOptimizer *g : {&G1, &G2}) {
        auto got = g->read_buffer(int64_t(i), b.name);
        if (!got) {
          out.error(got.error());
          return;
        }
        std::string what = std::string(g == &G1 ? "gpu" : "gpu-split") +
                           " tensor " + std::to_string(i) + " (numel " +
                           std::to_string(tensors[i].n) + ") " + b.name;
        out.mismatches += compareBuffers(b.dtype, w, got->data(), want->count,
                                         what, out.report);
      }
    }
  std::ostringstream os;
  os << "cpu==gpu " << NT << " tensors x " << steps << " steps ("
     << G2.num_records() << " split records)";
  out.summary = os.str();
}

/// Test 2: one multi-tensor launch == one launch per tensor.
void checkMultiVsSingle(const std::shared_ptr<CudaBundle> &gb, uint64_t seed,
                        int64_t maxNumel, Outcome &out) {
  const std::shared_ptr<CudaContext> &ctx = gb->context();
  const Manifest &m = gb->manifest();
  const int NT = 300, steps = 2;
  Rng rng(seed);
  std::vector<int64_t> sizes(NT), offs(NT);
  int64_t total = 0; // elements, each tensor at a 64-element boundary
  for (int i = 0; i < NT; ++i) {
    sizes[size_t(i)] = 1 + rng.below(maxNumel);
    offs[size_t(i)] = total;
    total += (sizes[size_t(i)] + 63) / 64 * 64;
  }
  const int pw = dtype_bits(m.param) / 8, gw = dtype_bits(m.grad) / 8;
  auto pm = DeviceBuffer::allocate(ctx, total * pw);
  auto ps = DeviceBuffer::allocate(ctx, total * pw);
  auto dg = DeviceBuffer::allocate(ctx, total * gw);
  if (!pm || !ps || !dg) {
    out.error("allocating: " + (!pm   ? pm.error()
                                : !ps ? ps.error()
                                      : dg.error()));
    return;
  }
  {
    std::vector<uint8_t> p = makeData(m.param, total, Fill::Random, -3, 1, rng);
    CHECK_OK(pm->upload(p.data(), total * pw), "upload");
    CHECK_OK(ps->upload(p.data(), total * pw), "upload");
  }
  auto multi = CudaOptimizer::create(gb);
  if (!multi) {
    out.error(multi.error());
    return;
  }
  CudaOptimizer &M = **multi;
  configureSlots(M);
  std::vector<std::unique_ptr<CudaOptimizer>> singles;
  for (int i = 0; i < NT; ++i) {
    auto s = CudaOptimizer::create(gb);
    if (!s) {
      out.error(s.error());
      return;
    }
    int slot = i % 2;
    for (const HyperSpec &h : m.hypers)
      CHECK_OK((*s)->set_hyper(0, h.name, *M.hyper(slot, h.name)), "set_hyper");
    auto a = M.add_param(slot, pm->ptr() + uint64_t(offs[size_t(i)] * pw),
                         sizes[size_t(i)],
                         dg->ptr() + uint64_t(offs[size_t(i)] * gw));
    auto b = (*s)->add_param(0, ps->ptr() + uint64_t(offs[size_t(i)] * pw),
                             sizes[size_t(i)],
                             dg->ptr() + uint64_t(offs[size_t(i)] * gw));
    if (!a || !b) {
      out.error("add_param: " + (!a ? a.error() : b.error()));
      return;
    }
    singles.push_back(std::move(*s));
  }
  for (int s = 1; s <= steps; ++s) {
    std::vector<uint8_t> g = makeData(m.grad, total, Fill::Random, -14, 2, rng);
    CHECK_OK(dg->upload(g.data(), total * gw), "upload grad");
    CHECK_OK(M.step(), "multi-tensor step");
    for (auto &o : singles)
      CHECK_OK(o->step(), "single-tensor step");
  }
  CHECK_OK(M.synchronize(), "synchronize");
  if (M.launch_config().grid < 1)
    out.error("no grid");

  for (int i = 0; i < NT; ++i)
    for (const BufferSpec &b : m.buffers) {
      if (b.role == BufferRole::Grad)
        continue; // shared
      auto want = singles[size_t(i)]->read_buffer(0, b.name);
      auto got = M.read_buffer(i, b.name);
      if (!want || !got) {
        out.error(!want ? want.error() : got.error());
        return;
      }
      std::string what = "multi tensor " + std::to_string(i) + " (numel " +
                         std::to_string(sizes[size_t(i)]) + ") " + b.name;
      out.mismatches += compareBuffers(
          b.dtype, want->data(), got->data(),
          int64_t(want->size()) * 8 / dtype_bits(b.dtype), what, out.report);
    }
  std::ostringstream os;
  os << "multi==single " << NT << " tensors (" << M.total_numel()
     << " params, grid " << M.launch_config().grid << ") x " << steps
     << " steps";
  out.summary = os.str();
}

#undef CHECK_OK

int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "flashopt-gpu-check: %s\n", msg);
  std::fprintf(stderr, "usage: flashopt-gpu-check --kernels DIR [--device N] "
                       "[--only NAME]... [--seed S] [--driver LIBCUDA] "
                       "[--multi-max-numel N]\n");
  return 2;
}

} // namespace

int main(int argc, char **argv) {
  std::string kernels;
  int device = 0;
  uint64_t seed = 20240601;
  std::vector<std::string> only;
  std::string driverPath;
  int64_t multiMaxNumel = 70000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char * {
      return i + 1 < argc ? argv[++i] : nullptr;
    };
    const char *v = nullptr;
    if (a == "--kernels" && (v = value()))
      kernels = v;
    else if (a == "--device" && (v = value()))
      device = std::atoi(v);
    else if (a == "--only" && (v = value()))
      only.push_back(v);
    else if (a == "--driver" && (v = value()))
      driverPath = v;
    else if (a == "--multi-max-numel" && (v = value()) && std::atoll(v) > 0)
      multiMaxNumel = std::atoll(v);
    else if (a == "--seed" && (v = value()))
      seed = std::strtoull(v, nullptr, 10);
    else if (a == "-h" || a == "--help") {
      usage(nullptr);
      return 0;
    } else
      return usage(("unknown or incomplete argument: " + a).c_str());
  }
  if (kernels.empty())
    return usage("--kernels DIR is required");

  // --driver: another driver library (a dry run with a stand-in).
  std::unique_ptr<CudaDriver> driver;
  Expected<std::shared_ptr<CudaContext>> ctx =
      Status::error(Code::Device, "no driver loaded");
  if (driverPath.empty()) {
    ctx = CudaContext::create(device);
  } else if (auto d = CudaDriver::load(driverPath)) {
    driver = std::move(d.value());
    ctx = CudaContext::create(*driver, device);
  } else {
    ctx = d.status();
  }
  if (!ctx) {
    std::printf("no NVIDIA GPU/driver: %s\n", ctx.error().c_str());
    return 77;
  }
  const CudaDeviceInfo &info = (*ctx)->info();
  std::printf("device %d: %s, sm_%d, %d SMs, %.1f GiB, driver CUDA %s\n",
              info.ordinal, info.name.c_str(), info.chip(), info.sm_count,
              double(info.total_memory) / (1 << 30),
              cuda_version_string(info.driver_version).c_str());

  std::vector<std::string> names = list_bundles(kernels);
  if (!only.empty()) {
    std::vector<std::string> keep;
    for (const std::string &n : names)
      if (std::find(only.begin(), only.end(), n) != only.end())
        keep.push_back(n);
    names = keep;
  }
  if (names.empty()) {
    std::printf("no bundles (manifest.json) under %s\n", kernels.c_str());
    return 1;
  }

  int identical = 0, failed = 0, skipped = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t bi = 0; bi < names.size(); ++bi) {
    const std::string &name = names[bi];
    std::string dir = kernels + "/" + name;
    auto m = load_manifest(dir + "/manifest.json");
    if (!m) {
      std::printf("FAIL %-28s %s\n", name.c_str(), m.error().c_str());
      ++failed;
      continue;
    }
    auto choice = select_gpu_kernel(*m, info.cc_major, info.cc_minor);
    if (!choice) {
      std::printf("SKIP %-28s %s\n", name.c_str(), choice.error().c_str());
      ++skipped;
      continue;
    }
    auto gb = CudaBundle::load(*ctx, dir);
    if (!gb) {
      std::printf("FAIL %-28s cannot load the GPU kernel: %s\n", name.c_str(),
                  gb.error().c_str());
      ++failed;
      continue;
    }
    auto b0 = std::chrono::steady_clock::now();
    Outcome a, b;
    checkCpuVsGpu(dir, *gb, seed + bi, a);
    checkMultiVsSingle(*gb, seed * 7 + bi, multiMaxNumel, b);
    double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - b0)
            .count();
    std::string loaded = (*gb)->loaded().substr(0, (*gb)->loaded().find('\n'));
    bool ok = a.mismatches == 0 && b.mismatches == 0;
    std::printf(
        "%s %-28s %s, %d regs | %s | %s | %.2fs\n", ok ? "PASS" : "FAIL",
        name.c_str(), loaded.c_str(), (*gb)->registers(),
        a.summary.empty() ? "cpu==gpu not run" : a.summary.c_str(),
        b.summary.empty() ? "multi==single not run" : b.summary.c_str(), secs);
    if (!ok) {
      ++failed;
      if (a.mismatches)
        std::printf("     cpu vs gpu: %lld mismatching elements\n",
                    (long long)a.mismatches);
      if (b.mismatches)
        std::printf("     multi vs single: %lld mismatching elements\n",
                    (long long)b.mismatches);
      for (const std::string &r : a.report)
        std::printf("     %s\n", r.c_str());
      for (const std::string &r : b.report)
        std::printf("     %s\n", r.c_str());
    } else {
      ++identical;
    }
    std::fflush(stdout);
  }
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  std::printf("summary: %zu bundles: %d identical, %d mismatched or failed, "
              "%d skipped (no kernel for sm_%d) in %.1fs\n",
              names.size(), identical, failed, skipped, info.chip(), secs);
  return failed ? 1 : 0;
}
