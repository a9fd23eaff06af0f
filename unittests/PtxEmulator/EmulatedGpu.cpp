//===- EmulatedGpu.cpp - Shipped PTX on the interpreter vs the CPU --------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "EmulatedGpu.h"

#include "flashopt/host/Float16.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <sstream>

namespace fs = std::filesystem;
using namespace flashopt::host;

namespace flashopt::emutest {

std::string kernelsDir() {
  if (const char *k = std::getenv("FLASHOPT_KERNELS_DIR"))
    return k;
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : ".") + "/kernels";
}

std::vector<std::string> shippedSpecs() {
  std::vector<std::string> out;
  const char *s = std::getenv("FLASHOPT_SOURCE_DIR");
  fs::path dir = fs::path(s ? s : FLASHOPT_SOURCE_DIR_DEFAULT) / "specs";
  // A folder of variants (test/specs/<folder>) with FLASHOPT_KERNELS_DIR.
  if (const char *v = std::getenv("FLASHOPT_SPECS_DIR"))
    dir = v;
  for (auto &e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json")
      out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

const CudaDriver &emulatedDriver() {
  static std::unique_ptr<CudaDriver> d = [] {
    auto r = CudaDriver::load(FLASHOPT_EMULATED_CUDA);
    REQUIRE_MESSAGE(r.ok(), r.error());
    return std::move(r.value());
  }();
  return *d;
}

std::shared_ptr<CudaContext> emulatedContext(int chip, int smCount) {
  std::string cc = std::to_string(chip / 10) + "." + std::to_string(chip % 10);
  setenv("FLASHOPT_MOCK_CUDA_CC", cc.c_str(), 1);
  setenv("FLASHOPT_MOCK_CUDA_SMS", std::to_string(smCount).c_str(), 1);
  auto ctx = CudaContext::create(emulatedDriver(), 0);
  REQUIRE_MESSAGE(ctx.ok(), ctx.error());
  return *ctx;
}

std::string lastDriverError() {
  void *h = dlopen(FLASHOPT_EMULATED_CUDA, RTLD_NOW | RTLD_NOLOAD);
  if (!h)
    return "";
  using Fn = const char *(*)();
  auto fn = reinterpret_cast<Fn>(dlsym(h, "mockcuda_last_error"));
  std::string s = fn ? fn() : "";
  dlclose(h);
  return s;
}

namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
};

void store(DType t, std::vector<uint8_t> &buf, int64_t i, float v) {
  switch (t) {
  case DType::F32:
    std::memcpy(buf.data() + 4 * i, &v, 4);
    break;
  case DType::BF16: {
    uint16_t h = f32_to_bf16(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
    break;
  }
  case DType::F16: {
    uint16_t h = f32_to_f16(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
    break;
  }
  default:
    FAIL("not a float dtype");
  }
}

/// Log-uniform magnitudes over 2^[lo, hi], random signs, ~2% zeros.
std::vector<uint8_t> data(DType t, int64_t n, int lo, int hi, Rng &r,
                          bool nonFinite) {
  std::vector<uint8_t> out(size_t(dtype_bytes(t, uint64_t(n))));
  for (int64_t i = 0; i < n; ++i) {
    double u = r.uniform();
    float v = u < 0.02 ? 0.0f
                       : float(std::ldexp(1.0 + r.uniform(),
                                          lo + int(r.uniform() * (hi - lo))));
    if (r.next() & 1)
      v = -v;
    if (nonFinite) {
      uint64_t k = r.next() % 64;
      if (k == 0)
        v = NAN;
      else if (k == 1)
        v = INFINITY;
      else if (k == 2)
        v = -INFINITY;
    }
    store(t, out, i, v);
  }
  return out;
}

std::string hexOf(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  std::memcpy(&v, p, size_t(bytes));
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

bool isNaN(DType t, const uint8_t *p) {
  if (t == DType::F32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
  }
  if (t == DType::BF16 || t == DType::F16) {
    uint16_t u;
    std::memcpy(&u, p, 2);
    return t == DType::BF16 ? (u & 0x7FFFu) > 0x7F80u : (u & 0x7FFFu) > 0x7C00u;
  }
  return false;
}

/// Per param group 1: different hyper-parameters (where the spec has them).
void groupOneHypers(Optimizer &o) {
  const Manifest &m = o.manifest();
  auto set = [&](const char *name, float v) {
    if (m.hyper_index(name) >= 0)
      (void)o.set_hyper(1, name, v);
  };
  set("lr", 0.02f);
  set("weight_decay", 0.05f);
  set("momentum", 0.9f);
  set("nesterov", 1.0f);
  set("dampening", 0.1f);
}

} // namespace

Outcome compare(const std::string &dir, int chip, const Run &run) {
  Outcome out;
  auto ctx = emulatedContext(chip, run.smCount);
  CudaOptimizerOptions so;
  so.max_record_elements = run.maxRecordElements;
  auto gpuOr = CudaOptimizer::create(ctx, dir, so);
  if (!gpuOr.ok()) {
    out.error = "CudaOptimizer::create: " + gpuOr.error() + " / " +
                lastDriverError();
    return out;
  }
  CudaOptimizer &gpu = **gpuOr;
  if (gpu.bundle().choice().chip != chip) {
    out.error = "the runtime chose " + gpu.bundle().choice().target +
                " for sm_" + std::to_string(chip);
    return out;
  }
  CpuLoadOptions lo;
  lo.use_env = false;
  auto cpuOr = CpuOptimizer::create(dir, lo);
  if (!cpuOr.ok()) {
    out.error = "CpuOptimizer::create: " + cpuOr.error();
    return out;
  }
  Optimizer &cpu = **cpuOr;
  const Manifest &m = cpu.manifest();
  REQUIRE(gpu.add_param_group() == 1);
  REQUIRE(cpu.add_param_group() == 1);
  groupOneHypers(gpu);
  groupOneHypers(cpu);

  Rng rng(run.seed);
  const size_t n = run.sizes.size();
  std::vector<std::vector<uint8_t>> hp(n), hg(n);
  std::vector<DeviceBuffer> dp, dg;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = run.sizes[i];
    bool nf = std::find(run.nonFiniteTensors.begin(), run.nonFiniteTensors.end(),
                        int64_t(i)) != run.nonFiniteTensors.end();
    hp[i] = data(m.param, numel, -6, 1, rng, false);
    hg[i] = data(m.grad, numel, -12, 0, rng, nf);
    auto p = DeviceBuffer::allocate(ctx, int64_t(hp[i].size()));
    auto g = DeviceBuffer::allocate(ctx, int64_t(hg[i].size()));
    REQUIRE(p.ok());
    REQUIRE(g.ok());
    REQUIRE(p->upload(hp[i].data(), int64_t(hp[i].size())).ok());
    REQUIRE(g->upload(hg[i].data(), int64_t(hg[i].size())).ok());
    auto a = gpu.add_param(int(i % 2), p->ptr(), numel, g->ptr());
    REQUIRE_MESSAGE(a.ok(), a.error());
    auto c = cpu.add_param(int(i % 2), hp[i].data(), numel, hg[i].data());
    REQUIRE_MESSAGE(c.ok(), c.error());
    dp.push_back(std::move(*p));
    dg.push_back(std::move(*g));
  }
  int64_t launches0 = 0;
  for (int s = 0; s < run.steps; ++s) {
    if (s == 3) { // an LR schedule: one number of the hyper table changes
      REQUIRE(gpu.set_hyper(0, "lr", 0.003f).ok());
      REQUIRE(cpu.set_hyper(0, "lr", 0.003f).ok());
    }
    Status gs;
    if (run.microBatches > 0) {
      std::vector<int64_t> all(n);
      for (size_t i = 0; i < n; ++i)
        all[i] = int64_t(i);
      const bool fused = s % 2 == 0;
      for (int mb = 0; mb < run.microBatches; ++mb) {
        for (size_t i = 0; i < n; ++i) { // fresh gradients, both sides
          // In place: the CPU optimizer holds hg[i]'s address.
          std::vector<uint8_t> fresh =
              data(m.grad, run.sizes[i], -12, 0, rng, false);
          std::memcpy(hg[i].data(), fresh.data(), fresh.size());
          REQUIRE(dg[i].upload(hg[i].data(), int64_t(hg[i].size())).ok());
        }
        const bool last = mb + 1 == run.microBatches;
        if (last && fused) {
          gs = gpu.step_tensors(all, s + 1, abi::KernelKind::StepFused);
          Status cs = cpu.step_tensors(all, s + 1, abi::KernelKind::StepFused);
          REQUIRE_MESSAGE(cs.ok(), cs.message());
          break;
        }
        gs = gpu.accumulate_tensors(all);
        Status cs = cpu.accumulate_tensors(all);
        REQUIRE_MESSAGE(cs.ok(), cs.message());
        if (!gs.ok())
          break;
        if (last) {
          gs = gpu.step_tensors(all, s + 1, abi::KernelKind::StepAccumulated);
          cs = cpu.step_tensors(all, s + 1, abi::KernelKind::StepAccumulated);
          REQUIRE_MESSAGE(cs.ok(), cs.message());
        }
      }
    } else if (run.partialSteps.empty()) {
      gs = gpu.step();
    } else {
      for (const auto &part : run.partialSteps) {
        gs = gpu.step_tensors(part, s + 1);
        if (!gs.ok())
          break;
      }
    }
    if (!gs.ok()) {
      out.error = "GPU step " + std::to_string(s + 1) + ": " + gs.message() +
                  " / " + lastDriverError();
      return out;
    }
    launches0 += run.partialSteps.empty() ? 1 : int64_t(run.partialSteps.size());
    Status cs = run.microBatches > 0 ? Status::success() : cpu.step();
    if (!cs.ok()) {
      out.error = "CPU step: " + cs.message();
      return out;
    }
  }
  REQUIRE(gpu.synchronize().ok());
  out.ran = true;
  out.launches = launches0;
  out.grid = gpu.launch_config().grid;
  for (size_t i = 0; i < n; ++i)
    for (const BufferSpec &b : m.buffers) {
      auto got = gpu.read_buffer(int64_t(i), b.name);
      REQUIRE_MESSAGE(got.ok(), got.error());
      auto want = cpu.buffer(int64_t(i), b.name);
      REQUIRE_MESSAGE(want.ok(), want.error());
      REQUIRE(int64_t(got->size()) == want->bytes);
      out.compared_bytes += want->bytes;
      // A packed buffer (two 4-bit codes per byte) is compared byte by byte.
      const int es = std::max(1, dtype_bits(b.dtype) / 8);
      const uint8_t *w = static_cast<const uint8_t *>(want->data);
      if (std::memcmp(got->data(), w, got->size()) == 0)
        continue;
      for (int64_t e = 0; e * es < want->bytes; ++e) {
        const uint8_t *x = got->data() + e * es, *y = w + e * es;
        if (std::memcmp(x, y, size_t(es)) == 0)
          continue;
        ++out.mismatches;
        if (isNaN(b.dtype, x) && isNaN(b.dtype, y)) {
          ++out.nan_payload_only;
          if (out.nan_buffers.find(" " + b.name + " ") == std::string::npos &&
              (" " + out.nan_buffers + " ").find(" " + b.name + " ") ==
                  std::string::npos)
            out.nan_buffers += (out.nan_buffers.empty() ? "" : " ") + b.name;
        }
        if (out.first.empty()) {
          std::ostringstream os;
          os << fs::path(dir).filename().string() << " sm_" << chip
             << ": tensor " << i << " (numel " << run.sizes[i] << ") buffer "
             << b.name << " (" << dtype_name(b.dtype)
             << ") element " << e << ": GPU " << hexOf(x, es) << ", CPU "
             << hexOf(y, es);
          out.first = os.str();
        }
      }
    }
  return out;
}

} // namespace flashopt::emutest
