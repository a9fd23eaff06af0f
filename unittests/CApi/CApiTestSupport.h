//===- CApiTestSupport.h - Helpers of the C ABI tests -----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What the C ABI tests share (CApiTest.cpp and the files beside it, one
/// per API area): bundle paths, byte buffers, a model of five parameters
/// for every spec (Model, AbiOpt), checkpoint readers, and one
/// adamw_bf16_m24 parameter with gradients (Single).
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_CAPI_CAPITESTSUPPORT_H
#define FLASHOPT_UNITTESTS_CAPI_CAPITESTSUPPORT_H

#include "flashopt/flashopt.h"
#include "flashopt/flashopt.hpp"

#include "safetensors/Safetensors.h"
#include "flashopt/host/CudaOptimizer.h"
#include "flashopt/host/Float16.h"
#include "flashopt/host/CpuOptimizer.h"

#include <dlpack/dlpack.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using namespace flashopt::host;


namespace capitest {


//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

inline std::string sourceDir() {
  const char *s = std::getenv("FLASHOPT_SOURCE_DIR");
  return s ? s : FLASHOPT_TEST_SOURCE_DIR;
}
inline std::string binaryDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return b ? b : FLASHOPT_TEST_BINARY_DIR;
}
inline std::string bundleDir(const std::string &spec) {
  return binaryDir() + "/kernels/" + spec;
}

/// The shipped specs: specs/*.json.
inline std::vector<std::string> shippedSpecs() {
  std::vector<std::string> out;
  for (auto &e : fs::directory_iterator(sourceDir() + "/specs"))
    if (e.path().extension() == ".json")
      out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

inline std::string lastError() { return flashopt_last_error(); }

/// Whether two master weights agree as export / import guarantees. Exactly,
/// except with an i16 correction: there the correction's resolution equals
/// the f32 ULP of the master, so the one f32 rounding of decode (r + e,
/// docs/NUMERICS.md §1) may move a re-encoded master by 1 ULP.
inline bool sameMaster(const std::vector<float> &a, const std::vector<float> &b,
                const Manifest &m, std::string *why) {
  bool oneUlp = m.correction && *m.correction == DType::I16;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x = f32_bits(a[i]), y = f32_bits(b[i]);
    if (x == y)
      continue;
    int64_t d = int64_t(x) - int64_t(y);
    if (oneUlp && (x >> 31) == (y >> 31) && (d == 1 || d == -1))
      continue;
    *why = "element " + std::to_string(i) + ": " + std::to_string(a[i]) +
           " vs " + std::to_string(b[i]);
    return false;
  }
  return true;
}

#ifdef FLASHOPT_MOCK_CUDA
/// A CUDA context over the PTX-interpreting stand-in driver of
/// unittests/Runtime (compute capability 9.0, the shipped kernels; no GPU
/// needed). The environment it sets stays set.
inline flashopt_context mockCudaContext() {
  setenv("FLASHOPT_CUDA_DRIVER", FLASHOPT_MOCK_CUDA, 1);
  setenv("FLASHOPT_MOCK_CUDA_CC", "9.0", 1);
  const std::string kernels = binaryDir() + "/kernels";
  setenv("FLASHOPT_MOCK_CUDA_KERNELS", kernels.c_str(), 1);
  flashopt_context ctx = nullptr;
  REQUIRE_MESSAGE(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &ctx) ==
                      FLASHOPT_OK,
                  lastError());
  return ctx;
}
#endif

/// This process's scratch directory, removed at exit.
inline fs::path scratch() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() /
                    ("flashopt-capi-test-" + std::to_string(getpid()));
    Scratch() { fs::create_directories(path); }
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Scratch s;
  return s.path;
}

/// 64-byte aligned zeroed bytes.
struct Buf {
  std::shared_ptr<uint8_t> mem;
  size_t bytes = 0;
  Buf() = default;
  explicit Buf(size_t n) : bytes(n) {
    void *p = nullptr;
    REQUIRE(posix_memalign(&p, 64, std::max<size_t>(64, (n + 63) / 64 * 64)) ==
            0);
    std::memset(p, 0, std::max<size_t>(64, (n + 63) / 64 * 64));
    mem.reset(static_cast<uint8_t *>(p), [](uint8_t *q) { std::free(q); });
  }
  uint8_t *data() const { return mem.get(); }
  Buf clone() const {
    Buf b(bytes);
    std::memcpy(b.data(), data(), bytes);
    return b;
  }
  bool operator==(const Buf &o) const {
    return bytes == o.bytes && std::memcmp(data(), o.data(), bytes) == 0;
  }
};

/// Stores f32 values as `dtype` (BF16, F16 or F32).
inline void storeAs(const std::vector<float> &v, DType dtype, uint8_t *out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(out + 4 * i, &v[i], 4);
    } else {
      uint16_t h = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

inline std::vector<float> randomValues(std::mt19937 &rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float &x : v)
    x = d(rng);
  return v;
}

const std::vector<int64_t> kSizes = {1, 33, 4097, 300, 64};

/// The parameters and gradients of one model, owned by the test.
struct Model {
  DType pdt = DType::F32, gdt = DType::F32;
  std::vector<Buf> params, grads;

  Model(const Manifest &m, uint32_t seed) : pdt(m.param), gdt(m.grad) {
    std::mt19937 rng(seed);
    for (int64_t n : kSizes) {
      Buf p(size_t(dtype_bytes(pdt, uint64_t(n))));
      storeAs(randomValues(rng, n, 1.0f), pdt, p.data());
      params.push_back(p);
      grads.emplace_back(size_t(dtype_bytes(gdt, uint64_t(n))));
    }
  }
  /// Fresh gradients for step `step` (the same in every model).
  void fillGrads(int step) {
    std::mt19937 rng(1000u + unsigned(step));
    for (size_t i = 0; i < grads.size(); ++i)
      storeAs(randomValues(rng, kSizes[i], 0.1f), gdt, grads[i].data());
  }
  Model clone() const {
    Model c = *this;
    for (Buf &b : c.params)
      b = b.clone();
    for (Buf &b : c.grads)
      b = b.clone();
    return c;
  }
};

/// Hyper-parameters exercised on both groups: a second group with another
/// lr, momentum and weight decay where the rule has them.
inline std::vector<std::pair<std::string, float>> groupHypers(const Manifest &m,
                                                       int group) {
  std::vector<std::pair<std::string, float>> out;
  float lr = m.hyper_index("lr") >= 0
                 ? *m.hypers[size_t(m.hyper_index("lr"))].default_value
                 : 0.0f;
  if (m.hyper_index("lr") >= 0)
    out.push_back({"lr", group == 0 ? lr * 10.0f : lr * 3.0f});
  if (m.hyper_index("momentum") >= 0)
    out.push_back({"momentum", 0.9f});
  if (m.hyper_index("weight_decay") >= 0)
    out.push_back({"weight_decay", group == 0 ? 0.01f : 0.0f});
  return out;
}

/// An ABI optimizer with the model's parameters registered (alternating
/// param groups), names "layer<i>.w".
struct AbiOpt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  AbiOpt(const std::string &spec, Model &model, int threads = 2) {
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE(flashopt_context_set_threads(ctx, threads) == FLASHOPT_OK);
    REQUIRE_MESSAGE(flashopt_optimizer_create(ctx, bundleDir(spec).c_str(),
                                              &opt) == FLASHOPT_OK,
                    lastError());
    int32_t g = -1;
    REQUIRE(flashopt_add_param_group(opt, &g) == FLASHOPT_OK);
    REQUIRE(g == 1);
    flashopt_optimizer_info info{};
    REQUIRE(flashopt_optimizer_get_info(opt, &info) == FLASHOPT_OK);
    Expected<Manifest> m = load_manifest(bundleDir(spec) + "/manifest.json");
    REQUIRE(m.ok());
    for (int grp = 0; grp < 2; ++grp)
      for (auto &kv : groupHypers(*m, grp))
        REQUIRE_MESSAGE(flashopt_set_hyper(opt, grp, kv.first.c_str(),
                                           kv.second) == FLASHOPT_OK,
                        lastError());
    for (size_t i = 0; i < model.params.size(); ++i) {
      int64_t idx = -1;
      std::string name = "layer" + std::to_string(i) + ".w";
      REQUIRE_MESSAGE(flashopt_add_param(opt, int32_t(i % 2), name.c_str(),
                                         model.params[i].data(),
                                         info.param_dtype, kSizes[i],
                                         model.grads[i].data(), info.grad_dtype,
                                         &idx) == FLASHOPT_OK,
                      lastError());
      REQUIRE(idx == int64_t(i));
    }
  }
  ~AbiOpt() {
    if (opt)
      flashopt_optimizer_destroy(opt);
    if (ctx)
      flashopt_context_destroy(ctx);
  }
  AbiOpt(const AbiOpt &) = delete;
  AbiOpt &operator=(const AbiOpt &) = delete;
};

/// host::Optimizer over the model, set up as AbiOpt; with `only` >= 0, over
/// that tensor alone (in its param group).
inline std::unique_ptr<CpuOptimizer> hostOpt(const std::string &spec, Model &model,
                                   int only = -1) {
  CpuOptimizerOptions oo;
  oo.threads = 3; // another split than the ABI's: results must not depend on it
  Expected<std::unique_ptr<CpuOptimizer>> o =
      CpuOptimizer::create(bundleDir(spec), {}, oo);
  REQUIRE_MESSAGE(o.ok(), o.error());
  Optimizer &h = **o;
  REQUIRE(h.add_param_group() == 1);
  for (int grp = 0; grp < 2; ++grp)
    for (auto &kv : groupHypers(h.manifest(), grp))
      REQUIRE(h.set_hyper(grp, kv.first, kv.second).ok());
  for (size_t i = 0; i < model.params.size(); ++i) {
    if (only >= 0 && int(i) != only)
      continue;
    Expected<int64_t> idx = h.add_param(int(i % 2), model.params[i].data(),
                                        kSizes[i], model.grads[i].data());
    REQUIRE(idx.ok());
  }
  return std::move(o.value());
}

/// Every tensor of a safetensors file: name -> bytes.
inline std::map<std::string, std::vector<uint8_t>> tensorsOf(const std::string &path) {
  Expected<safetensors::File> f = safetensors::File::read(path);
  REQUIRE_MESSAGE(f.ok(), f.error());
  std::map<std::string, std::vector<uint8_t>> out;
  for (auto &kv : f->tensors())
    out[kv.first] =
        std::vector<uint8_t>(kv.second.data, kv.second.data + kv.second.bytes);
  return out;
}

inline std::string savePath(const std::string &tag) {
  return (scratch() / (tag + ".safetensors")).string();
}

inline void saveOk(flashopt_optimizer opt, const std::string &path,
            flashopt_checkpoint_format f = FLASHOPT_CHECKPOINT_COMPRESSED) {
  REQUIRE_MESSAGE(flashopt_save_checkpoint(opt, path.c_str(), f) == FLASHOPT_OK,
                  lastError());
}

/// The model's parameters and every state of `opt` are the same as
/// host optimizer `h` holds (through a compressed checkpoint of `opt`).
inline void checkSameAsHost(flashopt_optimizer opt, const Model &abiModel,
                     Optimizer &h, const Model &hostModel,
                     const std::string &tag) {
  for (size_t i = 0; i < abiModel.params.size(); ++i)
    CHECK_MESSAGE(abiModel.params[i] == hostModel.params[i],
                  "param " << i << " differs");
  std::string path = savePath(tag);
  saveOk(opt, path);
  auto tensors = tensorsOf(path);
  const Manifest &m = h.manifest();
  for (size_t i = 0; i < abiModel.params.size(); ++i) {
    std::string name = "layer" + std::to_string(i) + ".w";
    for (const BufferSpec &b : m.buffers) {
      if (b.role == BufferRole::Grad)
        continue;
      std::string key =
          b.role == BufferRole::Param ? name : name + "." + b.name;
      Expected<BufferView> v = h.buffer(int64_t(i), b.name);
      REQUIRE(v.ok());
      REQUIRE_MESSAGE(tensors.count(key), key);
      const std::vector<uint8_t> &got = tensors[key];
      REQUIRE(int64_t(got.size()) == v->bytes);
      CHECK_MESSAGE(std::memcmp(got.data(), v->data, got.size()) == 0,
                    key << " differs from host::Optimizer");
    }
  }
}

/// As checkSameAsHost, against one host optimizer per tensor.
inline void checkSameAsSingles(flashopt_optimizer opt, const Model &abiModel,
                        std::vector<std::unique_ptr<CpuOptimizer>> &singles,
                        const Model &hostModel, const std::string &tag) {
  for (size_t i = 0; i < abiModel.params.size(); ++i)
    CHECK_MESSAGE(abiModel.params[i] == hostModel.params[i],
                  "param " << i << " differs");
  std::string path = savePath(tag);
  saveOk(opt, path);
  auto tensors = tensorsOf(path);
  const Manifest &m = singles[0]->manifest();
  for (size_t i = 0; i < abiModel.params.size(); ++i) {
    std::string name = "layer" + std::to_string(i) + ".w";
    for (const BufferSpec &b : m.buffers) {
      if (b.role == BufferRole::Grad || b.role == BufferRole::Param)
        continue;
      Expected<BufferView> v = singles[i]->buffer(0, b.name);
      REQUIRE(v.ok());
      const std::vector<uint8_t> &got = tensors[name + "." + b.name];
      REQUIRE(int64_t(got.size()) == v->bytes);
      CHECK_MESSAGE(std::memcmp(got.data(), v->data, got.size()) == 0,
                    name << "." << b.name << " differs");
    }
  }
}

/// The tensors of two checkpoints are equal bit for bit.
inline void checkSameCheckpoint(const std::string &a, const std::string &b) {
  auto ta = tensorsOf(a), tb = tensorsOf(b);
  REQUIRE(ta.size() == tb.size());
  for (auto &kv : ta) {
    REQUIRE_MESSAGE(tb.count(kv.first), kv.first);
    CHECK_MESSAGE(kv.second == tb[kv.first], kv.first << " differs");
  }
}

inline void stepOk(flashopt_optimizer opt) {
  REQUIRE_MESSAGE(flashopt_step(opt) == FLASHOPT_OK, lastError());
}


inline const char *kSpec = "adamw_bf16_m24";

/// One adamw_bf16_m24 parameter of n elements with gradients.
struct Single {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  DType pdt = DType::BF16, gdt = DType::BF16;
  Buf param, grad;
  int64_t n;
  explicit Single(int64_t numel, float value = 1.0f, float g = 0.01f,
                  const std::string &spec = kSpec)
      : n(numel) {
    Expected<Manifest> m = load_manifest(bundleDir(spec) + "/manifest.json");
    REQUIRE(m.ok());
    pdt = m->param;
    gdt = m->grad;
    param = Buf(size_t(dtype_bytes(pdt, uint64_t(numel))));
    grad = Buf(size_t(dtype_bytes(gdt, uint64_t(numel))));
    std::vector<float> w(size_t(numel), value), gv(size_t(numel), g);
    for (int64_t i = 0; i < numel; ++i)
      w[size_t(i)] = value * (1.0f + float(i % 7) / 8.0f);
    storeAs(w, pdt, param.data());
    storeAs(gv, gdt, grad.data());
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE(flashopt_optimizer_create(ctx, bundleDir(spec).c_str(), &opt) ==
            FLASHOPT_OK);
    flashopt_optimizer_info info{};
    REQUIRE(flashopt_optimizer_get_info(opt, &info) == FLASHOPT_OK);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(opt, 0, "w", param.data(), info.param_dtype,
                               numel, grad.data(), info.grad_dtype,
                               &idx) == FLASHOPT_OK);
  }
  /// Sets gradient element i.
  void setGrad(int64_t i, float v) {
    std::vector<float> one{v};
    std::vector<uint8_t> tmp(4);
    storeAs(one, gdt, tmp.data());
    const int64_t w = dtype_bits(gdt) / 8; // gradients: whole bytes
    std::memcpy(grad.data() + i * w, tmp.data(), size_t(w));
  }
  ~Single() {
    if (opt)
      flashopt_optimizer_destroy(opt);
    if (ctx)
      flashopt_context_destroy(ctx);
  }
};

} // namespace capitest

#endif // FLASHOPT_UNITTESTS_CAPI_CAPITESTSUPPORT_H
