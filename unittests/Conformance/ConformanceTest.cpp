//===- ConformanceTest.cpp - Generated CPU kernels vs the scalar reference -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// For every shipped spec, the CPU kernels that flashopt-gen built (every
/// CPU flavour this machine can run) must match the independent scalar
/// reference (test/reference/flashopt_reference.h, written from
/// docs/NUMERICS.md) bit for bit, over random tensors of awkward sizes, five
/// steps, with zeros, subnormals and magnitudes near the fp16-scale limits
/// mixed in. The kernels are called directly through the kernel ABI
/// (docs/KERNEL-ABI.md), with several tensors in one table, so the table
/// walk and the group-range split are exercised too.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"
#include "flashopt/host/CpuBundle.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace ref = flashopt::ref;
using json = nlohmann::json;

namespace {

using KernelFn = void (*)(const int64_t *, int64_t, const float *, int64_t,
                          int64_t, int64_t);

/// <build>/kernels (the shipped specs), or FLASHOPT_KERNEL_DIR (the
/// variants of test/specs/<folder>, in <build>/kernels-<folder>).
std::string kernelDir() {
  if (const char *dir = std::getenv("FLASHOPT_KERNEL_DIR"))
    return dir;
  const char *bin = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(bin ? bin : ".") + "/kernels";
}

std::vector<fs::path> bundles() {
  std::vector<fs::path> out;
  if (!fs::exists(kernelDir()))
    return out;
  for (auto &e : fs::directory_iterator(kernelDir()))
    if (fs::exists(e.path() / "manifest.json"))
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

json readJson(const fs::path &p) {
  std::ifstream in(p);
  return json::parse(in);
}

int bytesOf(const std::string &dtype) {
  if (dtype == "f32")
    return 4;
  if (dtype == "bf16" || dtype == "f16" || dtype == "i16")
    return 2;
  return 1;
}

/// The packed 4-bit codes (two per byte, docs/KERNEL-ABI.md).
bool isPacked(const std::string &dtype) {
  return dtype == "i4" || dtype == "ui4";
}

/// The bytes `count` elements of `dtype` take; the comparisons below go by
/// byte for packed codes (both nibbles, the pad nibble included).
int64_t storedCount(const std::string &dtype, int64_t count) {
  return isPacked(dtype) ? (count + 1) / 2 : count;
}

ref::DType dtypeOf(const std::string &s) {
  if (s == "bf16")
    return ref::DType::BF16;
  if (s == "f16")
    return ref::DType::F16;
  if (s == "f32")
    return ref::DType::F32;
  if (s == "i8")
    return ref::DType::I8;
  if (s == "ui8")
    return ref::DType::U8;
  if (s == "i16")
    return ref::DType::I16;
  if (s == "i4")
    return ref::DType::I4;
  if (s == "ui4")
    return ref::DType::U4;
  return ref::DType::None;
}

ref::Config configOf(const json &m) {
  ref::Config c;
  c.rule = m["rule"].get<std::string>();
  c.param = dtypeOf(m["param"]["dtype"]);
  c.correction = dtypeOf(m["param"]["correction"]);
  c.grad = dtypeOf(m["grad"]);
  c.group_size = m["group_size"].get<int>();
  c.fast = m.value("arithmetic", std::string("exact")) == "fast";
  c.bounded = m.value("numerics", std::string("flashoptim")) == "bounded";
  for (const json &s : m["states"]) {
    const json &e = s["encoding"];
    ref::StateEncoding se{};
    if (e["kind"] == "quantized") {
      se.quantized = true;
      se.q.isSigned = e["storage"] == "i8" || e["storage"] == "i4";
      se.q.bits = isPacked(e["storage"]) ? 4 : 8;
      std::string comp = e["compand"];
      se.q.compand = comp == "softsign" ? ref::Compand::Softsign
                     : comp == "sqrt"   ? ref::Compand::Sqrt
                     : comp == "e3m4"   ? ref::Compand::E3M4
                     : comp == "e4m4"   ? ref::Compand::E4M4
                     : comp == "e2m1"   ? ref::Compand::E2M1
                     : comp == "e3m0"   ? ref::Compand::E3M0
                     : comp == "e3m1"   ? ref::Compand::E3M1
                     : comp == "e4m0"   ? ref::Compand::E4M0
                                        : ref::Compand::None;
      se.q.scale = dtypeOf(e["scale"]);
      se.q.group = e["group"].get<int>();
    } else {
      se.quantized = false;
      se.plain = dtypeOf(e["storage"]);
    }
    c.states.push_back(se);
  }
  return c;
}

/// An interesting f32: normal spread, zeros, subnormals, fp16-scale edges.
float interestingValue(std::mt19937 &rng, double scale) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind(rng)) {
  case 0:
    return 0.0f;
  case 1:
    return -0.0f;
  case 2:
    return normal(rng) * 1e-39f; // f32 subnormal
  case 3:
    return normal(rng) * 3e-8f; // fp16 scale underflow edge
  case 4:
    return normal(rng) * 6e-5f; // fp16 subnormal / normal edge
  case 5:
    return normal(rng) * 1e-6f;
  default:
    return float(normal(rng) * scale);
  }
}

/// Fills one buffer with random contents suitable for its role.
void fillBuffer(std::mt19937 &rng, const json &buf, void *data, int64_t count,
                bool positiveState) {
  std::string dtype = buf["dtype"];
  std::string name = buf["name"];
  bool isScale = name.size() > 7 && name.substr(name.size() - 7) == ".scales";
  if (isPacked(dtype)) {
    // Every nibble pattern, -8 (never written) and the pad nibble included:
    // the kernels decode them all alike and write the pad nibble as 0.
    std::uniform_int_distribution<int> d(0, 255);
    for (int64_t i = 0; i < storedCount(dtype, count); ++i)
      static_cast<uint8_t *>(data)[i] = uint8_t(d(rng));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == "i8") {
      std::uniform_int_distribution<int> d(-127, 127);
      static_cast<int8_t *>(data)[i] = int8_t(name == "correction" || true ? d(rng) : 0);
    } else if (dtype == "ui8") {
      std::uniform_int_distribution<int> d(0, 255);
      static_cast<uint8_t *>(data)[i] = uint8_t(d(rng));
    } else if (dtype == "i16") {
      std::uniform_int_distribution<int> d(-32767, 32767);
      static_cast<int16_t *>(data)[i] = int16_t(d(rng));
    } else {
      float v;
      if (isScale) {
        std::uniform_int_distribution<int> k(0, 9);
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        int kk = k(rng);
        v = kk == 0 ? 0.0f : kk == 1 ? 6e-8f * (1 + u(rng)) : kk == 2 ? 3e4f * u(rng)
                                    : std::pow(10.0f, -4.0f * u(rng));
      } else {
        v = interestingValue(rng, name == "param" ? 1.0 : 0.1);
        if (name == "param") {
          // The top of the bf16 range (exponent fields 253, 254), where
          // the master weight's correction scaling is at its limits, and
          // infinities (field 255).
          std::uniform_int_distribution<int> top(0, 39);
          std::uniform_real_distribution<float> u(1.0f, 1.99f);
          int t = top(rng);
          float sign = (t & 1) ? -1.0f : 1.0f;
          if (t < 2)
            v = sign * u(rng) * 0x1p126f;
          else if (t < 4)
            v = sign * u(rng) * 0x1p127f;
          else if (t < 5)
            v = sign * std::numeric_limits<float>::infinity();
        }
        if (positiveState)
          v = std::fabs(v);
      }
      if (dtype == "f32")
        static_cast<float *>(data)[i] = v;
      else if (dtype == "bf16")
        static_cast<uint16_t *>(data)[i] = ref::f32_to_bf16(v);
      else
        static_cast<uint16_t *>(data)[i] = ref::f32_to_f16(v);
    }
  }
}

bool isNaNBits(const std::string &dtype, const uint8_t *p) {
  if (dtype == "f32") {
    float f;
    std::memcpy(&f, p, 4);
    return std::isnan(f);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == "bf16")
    return (h & 0x7F80) == 0x7F80 && (h & 0x7F);
  if (dtype == "f16")
    return (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
  return false;
}

/// Compares two buffers bit for bit (any NaN equals any NaN); returns the
/// index of the first mismatch or -1.
int64_t firstMismatch(const std::string &dtype, const uint8_t *a,
                      const uint8_t *b, int64_t count) {
  int w = bytesOf(dtype);
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t *x = a + i * w, *y = b + i * w;
    if (std::memcmp(x, y, w) == 0)
      continue;
    if (isNaNBits(dtype, x) && isNaNBits(dtype, y))
      continue;
    return i;
  }
  return -1;
}

std::string describeElement(const std::string &dtype, const uint8_t *p) {
  char buf[64];
  if (dtype == "f32") {
    float f;
    std::memcpy(&f, p, 4);
    uint32_t u;
    std::memcpy(&u, p, 4);
    std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", f, u);
  } else if (dtype == "bf16" || dtype == "f16") {
    uint16_t h;
    std::memcpy(&h, p, 2);
    float f = dtype == "bf16" ? ref::bf16_to_f32(h) : ref::f16_to_f32(h);
    std::snprintf(buf, sizeof buf, "%.9g (0x%04x)", f, h);
  } else if (dtype == "i16") {
    int16_t v;
    std::memcpy(&v, p, 2);
    std::snprintf(buf, sizeof buf, "%d", v);
  } else if (dtype == "ui8") {
    std::snprintf(buf, sizeof buf, "%u", *p);
  } else if (isPacked(dtype)) {
    std::snprintf(buf, sizeof buf, "byte 0x%02x (nibbles %u, %u)", *p, *p & 15u,
                  unsigned(*p) >> 4);
  } else {
    std::snprintf(buf, sizeof buf, "%d", int8_t(*p));
  }
  return buf;
}

struct Tensor {
  int64_t numel;
  std::vector<std::vector<uint8_t>> buffers; // in manifest order
};

/// The element offset (table word 3) of tensor `ti`: 0 for the first,
/// then offsets that cross 2^32 (the dither takes the index modulo 2^32).
int64_t elementOffsetOf(size_t ti) {
  static const int64_t offsets[] = {0, 1000003, (int64_t(1) << 32) - 17,
                                    (int64_t(5) << 32) + 12345, 7};
  return offsets[ti % 5];
}

/// Runs `steps` steps of the kernel on `tensors` (one table, split into
/// `chunks` calls over the group range) and of the reference on a copy;
/// checks bit-identity after every step. Steps count from `firstStep`.
void checkSpec(const fs::path &bundle, const json &manifest,
               const json &kernelEntry, const std::vector<int64_t> &sizes,
               const std::map<std::string, float> &hypers, uint32_t seed,
               int steps, int chunks, bool nonFinite = false,
               int64_t firstStep = 1) {
  std::string file = (bundle / kernelEntry["file"].get<std::string>()).string();
  void *lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(lib != nullptr, "dlopen " << file << ": " << dlerror());
  auto fn = reinterpret_cast<KernelFn>(
      dlsym(lib, kernelEntry["symbol"].get<std::string>().c_str()));
  REQUIRE(reinterpret_cast<void *>(fn) != nullptr);

  const json &bufs = manifest["buffers"];
  int64_t groupSize = manifest["group_size"];
  ref::Config config = configOf(manifest);
  std::mt19937 rng(seed);

  std::vector<Tensor> kernelSide, refSide;
  for (int64_t n : sizes) {
    Tensor t;
    t.numel = n;
    int64_t groups = (n + groupSize - 1) / groupSize;
    for (const json &b : bufs) {
      int64_t count = b["per"] == "group" ? groups : n;
      std::vector<uint8_t> data(
          size_t(storedCount(b["dtype"], count) * bytesOf(b["dtype"])) + 64);
      std::string name = b["name"];
      bool positive = name.rfind("exp_avg_sq", 0) == 0;
      fillBuffer(rng, b, data.data(), count, positive);
      t.buffers.push_back(std::move(data));
    }
    if (nonFinite && n > 3) {
      // NaN and Inf gradients (docs/NUMERICS.md §5): they propagate to the
      // element and its group's states; kernels and reference agree on how.
      size_t g = 2; // the grad buffer follows param (and correction)
      if (manifest["param"]["correction"] != "none")
        g = 2;
      else
        g = 1;
      std::string gd = bufs[g]["dtype"];
      float bad[2] = {std::nanf(""), INFINITY};
      int64_t at[2] = {n / 2, n / 3};
      for (int k = 0; k < 2; ++k) {
        if (gd == "f32")
          reinterpret_cast<float *>(t.buffers[g].data())[at[k]] = bad[k];
        else if (gd == "bf16")
          reinterpret_cast<uint16_t *>(t.buffers[g].data())[at[k]] =
              ref::f32_to_bf16(bad[k]);
        else
          reinterpret_cast<uint16_t *>(t.buffers[g].data())[at[k]] =
              ref::f32_to_f16(bad[k]);
      }
    }
    kernelSide.push_back(t);
    refSide.push_back(t);
  }

  // Hyper table (one slot): manifest order, defaults overridden.
  std::vector<float> hyperTable;
  std::map<std::string, float> full;
  for (const json &h : manifest["hypers"]) {
    std::string name = h["name"];
    float v = h["default"].is_null() ? 0.0f : float(h["default"].get<double>());
    auto it = hypers.find(name);
    if (it != hypers.end())
      v = it->second;
    hyperTable.push_back(v);
    full[name] = v;
  }

  int64_t recordWords = 4 + int64_t(bufs.size());
  std::vector<int64_t> table;
  int64_t totalGroups = 0;
  for (size_t ti = 0; ti < kernelSide.size(); ++ti) {
    Tensor &t = kernelSide[ti];
    table.push_back(t.numel);
    table.push_back(totalGroups);
    table.push_back(0);
    table.push_back(elementOffsetOf(ti));
    for (auto &b : t.buffers)
      table.push_back(reinterpret_cast<int64_t>(b.data()));
    totalGroups += (t.numel + groupSize - 1) / groupSize;
  }
  REQUIRE(int64_t(table.size()) == recordWords * int64_t(kernelSide.size()));

  for (int64_t step = firstStep; step < firstStep + steps; ++step) {
    for (int c = 0; c < chunks; ++c) {
      int64_t lo = totalGroups * c / chunks, hi = totalGroups * (c + 1) / chunks;
      fn(table.data(), int64_t(kernelSide.size()), hyperTable.data(), step, lo,
         hi);
    }
    for (size_t ti = 0; ti < refSide.size(); ++ti) {
      Tensor &t = refSide[ti];
      std::vector<void *> ptrs;
      for (auto &b : t.buffers)
        ptrs.push_back(b.data());
      ref::reference_step(config, full, step, t.numel, ptrs,
                          elementOffsetOf(ti));
    }
    for (size_t ti = 0; ti < kernelSide.size(); ++ti) {
      int64_t n = kernelSide[ti].numel;
      int64_t groups = (n + groupSize - 1) / groupSize;
      for (size_t bi = 0; bi < bufs.size(); ++bi) {
        std::string dtype = bufs[bi]["dtype"];
        int64_t count =
            storedCount(dtype, bufs[bi]["per"] == "group" ? groups : n);
        const uint8_t *k = kernelSide[ti].buffers[bi].data();
        const uint8_t *r = refSide[ti].buffers[bi].data();
        int64_t bad = firstMismatch(dtype, k, r, count);
        int w = bytesOf(dtype);
        INFO("spec " << manifest["name"].get<std::string>() << ", cpu "
                     << kernelEntry["cpu"].get<std::string>() << ", step "
                     << step << ", tensor " << ti << " (numel " << n
                     << "), buffer " << bufs[bi]["name"].get<std::string>()
                     << std::string(isPacked(dtype) ? ", byte " : ", element ")
                     << bad);
        if (bad >= 0)
          FAIL_CHECK("kernel " << describeElement(dtype, k + bad * w)
                               << " != reference "
                               << describeElement(dtype, r + bad * w));
        else
          CHECK(bad == -1);
      }
    }
  }
  dlclose(lib);
}

/// Whether this host can run a kernel needing `features`: the runtime's own
/// detection (every feature of abi/CpuFeatures.def, AVX-512 included), so a
/// flavour the host cannot run is skipped rather than run into SIGILL.
bool cpuSupports(const json &features) {
  for (const json &f : features)
    if (!flashopt::host::host_supports_feature(f.get<std::string>()))
      return false;
  return true;
}

std::map<std::string, float> hyperVariant(const std::string &rule, int v) {
  std::map<std::string, float> h;
  if (v == 0) {
    h["lr"] = 0.01f;
    h["weight_decay"] = 0.1f;
    if (rule == "sgd" || rule == "sgdw")
      h["momentum"] = 0.9f;
  } else {
    h["lr"] = 0.003f;
    h["weight_decay"] = 0.02f;
    h["decouple_lr"] = 1.0f;
    h["initial_lr"] = 0.01f;
    h["grad_scale"] = 0.375f; // every kernel's gradient scale
    h["beta1"] = rule == "lion" ? 0.5f : 0.8f;
    h["beta2"] = rule == "lion" ? 0.75f : 0.95f;
    if (rule == "sgd" || rule == "sgdw") {
      h["momentum"] = 0.5f;
      h["nesterov"] = 1.0f;
    }
  }
  return h;
}

} // namespace

TEST_CASE("every shipped spec has a bundle with CPU kernels") {
  auto all = bundles();
  INFO("kernel directory " << kernelDir());
  CHECK(all.size() >= 26);
  for (const fs::path &b : all) {
    json m = readJson(b / "manifest.json");
    int cpuKernels = 0;
    for (const json &k : m["kernels"])
      cpuKernels += k["target"] == "cpu";
    CHECK_MESSAGE(cpuKernels >= 1, b.string());
  }
}

TEST_CASE("CPU kernels match the scalar reference bit for bit") {
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65536 + 7};
  for (const fs::path &b : bundles()) {
    json m = readJson(b / "manifest.json");
    std::string rule = m["rule"];
    if (rule.rfind("file:", 0) == 0)
      continue; // user rules have no reference
    for (const json &k : m["kernels"]) {
      if (k["target"] != "cpu" || !cpuSupports(k["features"]))
        continue;
      SUBCASE((m["name"].get<std::string>() + "/" + k["cpu"].get<std::string>())
                  .c_str()) {
        for (int v = 0; v < 2; ++v)
          checkSpec(b, m, k, sizes, hyperVariant(rule, v), 1234u + v,
                    /*steps=*/5, /*chunks=*/v == 0 ? 1 : 7, false,
                    /*firstStep=*/v == 0 ? 1 : (int64_t(1) << 32) - 2);
        // NaN/Inf gradients in every tensor.
        checkSpec(b, m, k, sizes, hyperVariant(rule, 0), 99u, /*steps=*/3,
                  /*chunks=*/3, /*nonFinite=*/true);
      }
    }
  }
}
