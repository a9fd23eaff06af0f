//===- CApiTest.cpp - The libflashopt C ABI (flashopt.h)
//--------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The C ABI on the CPU, for every shipped spec (specs/*.json, bundles in
/// build/kernels): stepping through the ABI equals host::Optimizer stepping
/// identical copies bit for bit; step_param over every parameter equals one
/// step; checkpoints round-trip in both forms; resume is exact; master
/// weights export and import. Then, on adamw_bf16_m24: the memory report and
/// checkpoint size figures, LR schedules, the NaN/Inf policy,
/// check_numerics, one test per error, the C++ wrapper, and the CUDA
/// branch (no driver; a stand-in driver).
///
//===----------------------------------------------------------------------===//

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

namespace {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

std::string sourceDir() {
  const char *s = std::getenv("FLASHOPT_SOURCE_DIR");
  return s ? s : FLASHOPT_TEST_SOURCE_DIR;
}
std::string binaryDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return b ? b : FLASHOPT_TEST_BINARY_DIR;
}
std::string bundleDir(const std::string &spec) {
  return binaryDir() + "/kernels/" + spec;
}

/// The shipped specs: specs/*.json.
std::vector<std::string> shippedSpecs() {
  std::vector<std::string> out;
  for (auto &e : fs::directory_iterator(sourceDir() + "/specs"))
    if (e.path().extension() == ".json")
      out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

std::string lastError() { return flashopt_last_error(); }

/// Whether two master weights agree as export / import guarantees. Exactly,
/// except with an i16 correction: there the correction's resolution equals
/// the f32 ULP of the master, so the one f32 rounding of decode (r + e,
/// docs/NUMERICS.md §1) may move a re-encoded master by 1 ULP.
bool sameMaster(const std::vector<float> &a, const std::vector<float> &b,
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

/// This process's scratch directory, removed at exit.
fs::path scratch() {
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
void storeAs(const std::vector<float> &v, DType dtype, uint8_t *out) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(out + 4 * i, &v[i], 4);
    } else {
      uint16_t h = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
  }
}

std::vector<float> randomValues(std::mt19937 &rng, int64_t n, float scale) {
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
      Buf p(size_t(n * dtype_size(pdt)));
      storeAs(randomValues(rng, n, 1.0f), pdt, p.data());
      params.push_back(p);
      grads.emplace_back(size_t(n * dtype_size(gdt)));
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
std::vector<std::pair<std::string, float>> groupHypers(const Manifest &m,
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
std::unique_ptr<CpuOptimizer> hostOpt(const std::string &spec, Model &model,
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
std::map<std::string, std::vector<uint8_t>> tensorsOf(const std::string &path) {
  Expected<safetensors::File> f = safetensors::File::read(path);
  REQUIRE_MESSAGE(f.ok(), f.error());
  std::map<std::string, std::vector<uint8_t>> out;
  for (auto &kv : f->tensors())
    out[kv.first] =
        std::vector<uint8_t>(kv.second.data, kv.second.data + kv.second.bytes);
  return out;
}

std::string savePath(const std::string &tag) {
  return (scratch() / (tag + ".safetensors")).string();
}

void saveOk(flashopt_optimizer opt, const std::string &path,
            flashopt_checkpoint_format f = FLASHOPT_CHECKPOINT_COMPRESSED) {
  REQUIRE_MESSAGE(flashopt_save_checkpoint(opt, path.c_str(), f) == FLASHOPT_OK,
                  lastError());
}

/// The model's parameters and every state of `opt` are the same as
/// host optimizer `h` holds (through a compressed checkpoint of `opt`).
void checkSameAsHost(flashopt_optimizer opt, const Model &abiModel,
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
void checkSameAsSingles(flashopt_optimizer opt, const Model &abiModel,
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
void checkSameCheckpoint(const std::string &a, const std::string &b) {
  auto ta = tensorsOf(a), tb = tensorsOf(b);
  REQUIRE(ta.size() == tb.size());
  for (auto &kv : ta) {
    REQUIRE_MESSAGE(tb.count(kv.first), kv.first);
    CHECK_MESSAGE(kv.second == tb[kv.first], kv.first << " differs");
  }
}

void stepOk(flashopt_optimizer opt) {
  REQUIRE_MESSAGE(flashopt_step(opt) == FLASHOPT_OK, lastError());
}

} // namespace

//===----------------------------------------------------------------------===//
// Every shipped spec
//===----------------------------------------------------------------------===//

TEST_CASE("every shipped spec has a bundle") {
  std::vector<std::string> specs = shippedSpecs();
  CHECK(specs.size() >= 20);
  for (const std::string &s : specs)
    CHECK_MESSAGE(fs::exists(bundleDir(s) + "/manifest.json"),
                  s << ": no bundle in " << bundleDir(s));
}

TEST_CASE("C ABI on the CPU, every shipped spec") {
  for (const std::string &spec : shippedSpecs()) {
    CAPTURE(spec);
    Expected<Manifest> mOr = load_manifest(bundleDir(spec) + "/manifest.json");
    REQUIRE_MESSAGE(mOr.ok(), mOr.error());
    const Manifest &m = *mOr;
    const int N = 3, M = 2;

    // ABI vs host::Optimizer on identical copies, N steps.
    Model base(m, 7);
    Model ma = base.clone(), mh = base.clone();
    AbiOpt a(spec, ma);
    std::unique_ptr<CpuOptimizer> h = hostOpt(spec, mh);
    flashopt_optimizer_info info{};
    REQUIRE(flashopt_optimizer_get_info(a.opt, &info) == FLASHOPT_OK);
    CHECK(std::string(info.name) == spec);
    CHECK(std::string(info.spec_hash) == m.spec_hash);
    CHECK(info.group_size == m.group_size);
    CHECK(info.device_type == FLASHOPT_DEVICE_CPU);
    {
      // What the bundle is, without an optimizer; its buffers, with one.
      flashopt_bundle_desc d{};
      REQUIRE(flashopt_describe_bundle(bundleDir(spec).c_str(), &d) ==
              FLASHOPT_OK);
      CHECK(std::string(d.name) == spec);
      CHECK(std::string(d.rule) == m.rule);
      CHECK(std::string(d.numerics) == m.numerics);
      CHECK(std::string(d.arithmetic) == m.arithmetic);
      CHECK(d.param_dtype == info.param_dtype);
      CHECK(d.has_correction == info.has_correction);
      int32_t q = 0, p = 0;
      for (const StateSpec &st : m.states) {
        q += st.kind == StateKind::Quantized;
        p += st.kind == StateKind::Plain;
      }
      CHECK(d.quantized_states == q);
      CHECK(d.plain_states == p);
      int32_t nb = -1;
      REQUIRE(flashopt_num_buffers(a.opt, &nb) == FLASHOPT_OK);
      std::vector<std::string> names;
      for (int32_t k = 0; k < nb; ++k) {
        flashopt_buffer_desc b{};
        REQUIRE(flashopt_get_buffer_desc(a.opt, k, &b) == FLASHOPT_OK);
        names.push_back(b.name);
        // Each one reads back at the size its description implies.
        const int64_t n0 = kSizes[0];
        const int64_t count = b.per_group ? (n0 + m.group_size - 1) / m.group_size : n0;
        std::vector<uint8_t> bytes(size_t(count) * flashopt_dtype_size(b.dtype));
        CHECK_MESSAGE(flashopt_read_buffer(a.opt, 0, b.name, bytes.data(),
                                           bytes.size()) == FLASHOPT_OK,
                      b.name << ": " << lastError());
      }
      std::vector<std::string> want;
      if (m.correction)
        want.push_back("correction");
      for (const StateSpec &st : m.states)
        for (const flashopt::abi::StateBuffer &b :
             flashopt::abi::state_buffers(st))
          want.push_back(st.name + b.suffix);
      CHECK(names == want);
      flashopt_buffer_desc none{};
      CHECK(flashopt_get_buffer_desc(a.opt, nb, &none) ==
            FLASHOPT_ERROR_INVALID_ARGUMENT);
    }
    for (int s = 1; s <= N; ++s) {
      ma.fillGrads(s);
      mh.fillGrads(s);
      stepOk(a.opt);
      REQUIRE(h->step().ok());
    }
    int64_t t = -1;
    REQUIRE(flashopt_get_step(a.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == N);
    REQUIRE(flashopt_get_step(a.opt, 2, &t) == FLASHOPT_OK);
    CHECK(t == N);
    CHECK_MESSAGE(!(ma.params[2] == base.params[2]), "the steps moved nothing");
    checkSameAsHost(a.opt, ma, *h, mh, spec + "-vs-host");

    // step_param over every parameter (reverse order) == step, N times.
    Model mp = base.clone();
    AbiOpt p(spec, mp);
    for (int s = 1; s <= N; ++s) {
      mp.fillGrads(s);
      for (int64_t i = int64_t(kSizes.size()) - 1; i >= 0; --i)
        REQUIRE_MESSAGE(flashopt_step_param(p.opt, i) == FLASHOPT_OK,
                        lastError());
    }
    REQUIRE(flashopt_get_step(p.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == 0); // no flashopt_step call
    REQUIRE(flashopt_get_step(p.opt, 0, &t) == FLASHOPT_OK);
    CHECK(t == N);
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mp.params[i] == ma.params[i], "step_param: param " << i);
    std::string pathA = savePath(spec + "-a"), pathP = savePath(spec + "-p");
    saveOk(a.opt, pathA);
    saveOk(p.opt, pathP);
    checkSameCheckpoint(pathA, pathP);

    // Counters that differ: one step_param ahead, then steps. Equals the
    // host optimizer stepping the same tensors with the same t.
    {
      Model mx = base.clone(), my = base.clone();
      AbiOpt x(spec, mx);
      std::unique_ptr<CpuOptimizer> hy = hostOpt(spec, my);
      mx.fillGrads(1);
      my.fillGrads(1);
      REQUIRE(flashopt_step_param(x.opt, 2) == FLASHOPT_OK);
      REQUIRE(hy->step_tensors({2}, 1).ok());
      mx.fillGrads(2);
      my.fillGrads(2);
      stepOk(x.opt); // tensor 2 at t = 2, the others at t = 1
      REQUIRE(hy->step_tensors({0, 1, 3, 4}, 1).ok());
      REQUIRE(hy->step_tensors({2}, 2).ok());
      REQUIRE(flashopt_get_step(x.opt, 2, &t) == FLASHOPT_OK);
      CHECK(t == 2);
      REQUIRE(flashopt_get_step(x.opt, 3, &t) == FLASHOPT_OK);
      CHECK(t == 1);
      checkSameAsHost(x.opt, mx, *hy, my, spec + "-mixed");
      // Independently of step_tensors: one host optimizer per tensor, each
      // stepped with plain step() as often as its counter says.
      Model mz = base.clone();
      std::vector<std::unique_ptr<CpuOptimizer>> singles;
      for (size_t i = 0; i < kSizes.size(); ++i)
        singles.push_back(hostOpt(spec, mz, int(i)));
      mz.fillGrads(1);
      REQUIRE(singles[2]->step().ok());
      mz.fillGrads(2);
      for (auto &o : singles)
        REQUIRE(o->step().ok());
      checkSameAsSingles(x.opt, mx, singles, mz, spec + "-singles");
    }

    // Compressed round trip and exact resume: load into fresh memory,
    // then M more steps on both equal N + M steps.
    Model mr(m, 99); // other values: the load must overwrite them
    AbiOpt r(spec, mr);
    REQUIRE_MESSAGE(flashopt_load_checkpoint(r.opt, pathA.c_str()) ==
                        FLASHOPT_OK,
                    lastError());
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mr.params[i] == ma.params[i], "loaded param " << i);
    REQUIRE(flashopt_get_step(r.opt, -1, &t) == FLASHOPT_OK);
    CHECK(t == N);
    std::string pathR = savePath(spec + "-r");
    saveOk(r.opt, pathR);
    checkSameCheckpoint(pathA, pathR);
    for (int s = N + 1; s <= N + M; ++s) {
      ma.fillGrads(s);
      mr.fillGrads(s);
      stepOk(a.opt);
      stepOk(r.opt);
    }
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK_MESSAGE(mr.params[i] == ma.params[i], "resumed param " << i);
    saveOk(a.opt, pathA);
    saveOk(r.opt, pathR);
    checkSameCheckpoint(pathA, pathR);

    // F32 form: masters and dequantized states; loading it restores the
    // master weights bit for bit and states that dequantize to the same
    // values.
    std::string pathF = savePath(spec + "-f32");
    saveOk(a.opt, pathF, FLASHOPT_CHECKPOINT_F32);
    {
      Expected<safetensors::File> f = safetensors::File::read(pathF);
      REQUIRE_MESSAGE(f.ok(), f.error());
      CHECK(f->metadata().at("checkpoint") == "f32");
      for (auto &kv : f->tensors())
        CHECK_MESSAGE(kv.second.dtype == DType::F32, kv.first);
    }
    Model mf(m, 5);
    AbiOpt fo(spec, mf);
    REQUIRE_MESSAGE(flashopt_load_checkpoint(fo.opt, pathF.c_str()) ==
                        FLASHOPT_OK,
                    lastError());
    std::string pathF2 = savePath(spec + "-f32b");
    saveOk(fo.opt, pathF2, FLASHOPT_CHECKPOINT_F32);
    {
      // States: the same f32 values; masters: as sameMaster says.
      auto ta = tensorsOf(pathF), tb = tensorsOf(pathF2);
      REQUIRE(ta.size() == tb.size());
      for (auto &kv : ta) {
        std::vector<float> x(kv.second.size() / 4), y(x.size());
        REQUIRE(tb[kv.first].size() == kv.second.size());
        std::memcpy(x.data(), kv.second.data(), kv.second.size());
        std::memcpy(y.data(), tb[kv.first].data(), kv.second.size());
        std::string why;
        bool isMaster = kv.first.size() >= 2 &&
                        kv.first.compare(kv.first.size() - 2, 2, ".w") == 0;
        if (isMaster)
          CHECK_MESSAGE(sameMaster(x, y, m, &why), kv.first << ": " << why);
        else
          CHECK_MESSAGE(kv.second == tb[kv.first], kv.first << " differs");
      }
    }

    // Master export / import round trip into a fresh optimizer.
    Model mi(m, 11);
    AbiOpt im(spec, mi);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      std::vector<float> w(size_t(kSizes[i])), back(size_t(kSizes[i]));
      REQUIRE(flashopt_export_master_f32(a.opt, int64_t(i), w.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      REQUIRE(flashopt_import_master_f32(im.opt, int64_t(i), w.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      REQUIRE(flashopt_export_master_f32(im.opt, int64_t(i), back.data(),
                                         kSizes[i]) == FLASHOPT_OK);
      std::string why;
      CHECK_MESSAGE(sameMaster(w, back, m, &why),
                    "master round trip " << i << ": " << why);
      // The parameter is the RTNE narrowing of the imported master.
      Buf narrow(mi.params[i].bytes);
      storeAs(w, m.param, narrow.data());
      CHECK_MESSAGE(mi.params[i] == narrow, "imported param " << i);
    }

    // States one at a time: export == the f32 checkpoint's tensor, and
    // import then export gives the same values (decoded values re-encode
    // to themselves) without touching the parameter or the other states.
    std::map<std::string, std::vector<uint8_t>> f32 = tensorsOf(pathF);
    int32_t stored = 0;
    for (const StateSpec &s : m.states)
      stored += !flashopt::abi::state_buffers(s).empty();
    CHECK(info.num_states == stored);
    for (int32_t k = 0; k < info.num_states; ++k) {
      const char *state = nullptr;
      REQUIRE(flashopt_state_name(a.opt, k, &state) == FLASHOPT_OK);
      for (size_t i = 0; i < kSizes.size(); ++i) {
        flashopt_param_info pi{};
        REQUIRE(flashopt_get_param_info(a.opt, int64_t(i), &pi) ==
                FLASHOPT_OK);
        const std::string key = std::string(pi.name) + "." + state;
        std::vector<float> v(static_cast<size_t>(kSizes[i])), back(v.size());
        REQUIRE_MESSAGE(flashopt_export_state_f32(a.opt, int64_t(i), state,
                                                  v.data(), kSizes[i]) ==
                            FLASHOPT_OK,
                        lastError());
        REQUIRE(f32.count(key));
        CHECK_MESSAGE(std::memcmp(f32[key].data(), v.data(),
                                  v.size() * 4) == 0,
                      key << ": export_state differs from the f32 form");
        Buf paramBefore = mi.params[i];
        REQUIRE_MESSAGE(flashopt_import_state_f32(im.opt, int64_t(i), state,
                                                  v.data(), kSizes[i]) ==
                            FLASHOPT_OK,
                        lastError());
        REQUIRE(flashopt_export_state_f32(im.opt, int64_t(i), state,
                                          back.data(),
                                          kSizes[i]) == FLASHOPT_OK);
        CHECK_MESSAGE(std::memcmp(back.data(), v.data(), v.size() * 4) == 0,
                      key << ": import then export changed it");
        CHECK_MESSAGE(mi.params[i] == paramBefore, key << ": param moved");
      }
    }
    const char *none = nullptr;
    CHECK(flashopt_state_name(a.opt, info.num_states, &none) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    std::vector<float> w0(static_cast<size_t>(kSizes[0]));
    CHECK(flashopt_export_state_f32(a.opt, 0, "no_such_state", w0.data(),
                                    kSizes[0]) ==
          FLASHOPT_ERROR_INVALID_ARGUMENT);
    CHECK(contains(flashopt_last_error(), "'no_such_state'"));
    if (info.num_states > 0) {
      const char *s0 = nullptr;
      REQUIRE(flashopt_state_name(a.opt, 0, &s0) == FLASHOPT_OK);
      CHECK(flashopt_import_state_f32(a.opt, 0, s0, w0.data(),
                                      kSizes[0] + 1) == FLASHOPT_ERROR_SIZE);
    }
  }
}

//===----------------------------------------------------------------------===//
// adamw_bf16_m24: figures, schedules, policies, numerics
//===----------------------------------------------------------------------===//

namespace {
const char *kSpec = "adamw_bf16_m24";

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
    param = Buf(size_t(numel * dtype_size(pdt)));
    grad = Buf(size_t(numel * dtype_size(gdt)));
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
    std::memcpy(grad.data() + i * dtype_size(gdt), tmp.data(),
                size_t(dtype_size(gdt)));
  }
  ~Single() {
    if (opt)
      flashopt_optimizer_destroy(opt);
    if (ctx)
      flashopt_context_destroy(ctx);
  }
};
} // namespace

TEST_CASE("memory report and checkpoint size of adamw_bf16_m24") {
  const int64_t n = int64_t(1) << 20;
  Single s(n);
  flashopt_memory_report r{};
  REQUIRE(flashopt_memory_report_get(s.opt, &r) == FLASHOPT_OK);
  CHECK(r.numel == n);
  CHECK(r.param_bytes == 2 * n);
  CHECK(r.correction_bytes == n);
  CHECK(r.grad_bytes == 2 * n);
  CHECK(r.state_bytes == 2 * n + 2 * (n / 32) * 2);
  CHECK(r.total_bytes ==
        r.param_bytes + r.correction_bytes + r.grad_bytes + r.state_bytes);
  CHECK(r.bytes_per_param == 7.125);
  CHECK(r.bytes_per_param_with_grad_release == 5.125);
  CHECK(r.allocated_bytes >= r.correction_bytes + r.state_bytes);

  REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
  std::string path = savePath("size");
  saveOk(s.opt, path);
  int64_t size = int64_t(fs::file_size(path));
  int64_t data = n * 5 + n / 8; // 5.125 B/param
  CHECK(size >= data + 8);
  CHECK(size - data < 4096); // the JSON header only
  MESSAGE("compressed checkpoint: " << double(size) / double(n) << " B/param");
  // The fp32 form: 4 + 4 + 4 B/param.
  saveOk(s.opt, path, FLASHOPT_CHECKPOINT_F32);
  size = int64_t(fs::file_size(path));
  CHECK(size >= 12 * n);
  CHECK(size - 12 * n < 4096);
}

TEST_CASE("set_hyper takes effect at the next step (LR schedule)") {
  Model base(*load_manifest(bundleDir(kSpec) + "/manifest.json"), 3);
  Model ms = base.clone(), mh = base.clone(), mc = base.clone();
  AbiOpt s(kSpec, ms), c(kSpec, mc);
  std::unique_ptr<CpuOptimizer> h = hostOpt(kSpec, mh);
  const float lrs[3] = {1e-3f, 5e-3f, 2e-2f};
  for (int step = 0; step < 3; ++step) {
    ms.fillGrads(step);
    mh.fillGrads(step);
    mc.fillGrads(step);
    REQUIRE(flashopt_set_hyper(s.opt, -1, "lr", lrs[step]) == FLASHOPT_OK);
    double got = 0;
    REQUIRE(flashopt_get_hyper(s.opt, 1, "lr", &got) == FLASHOPT_OK);
    CHECK(got == double(lrs[step]));
    REQUIRE(h->set_hyper_all("lr", lrs[step]).ok());
    REQUIRE(flashopt_set_hyper(c.opt, -1, "lr", lrs[0]) == FLASHOPT_OK);
    stepOk(s.opt);
    stepOk(c.opt);
    REQUIRE(h->step().ok());
  }
  checkSameAsHost(s.opt, ms, *h, mh, "schedule");
  // A constant lr gives other weights.
  bool differs = false;
  for (size_t i = 0; i < kSizes.size(); ++i)
    differs |= !(ms.params[i] == mc.params[i]);
  CHECK(differs);
}

TEST_CASE("set_grads re-points many gradients in one call, all or nothing") {
  Model base(*load_manifest(bundleDir(kSpec) + "/manifest.json"), 5);
  Model ms = base.clone(), mb = base.clone();
  AbiOpt s(kSpec, ms), b(kSpec, mb);
  const int64_t n = int64_t(kSizes.size());
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i)
    idx.push_back(i);
  for (int step = 0; step < 3; ++step) {
    ms.fillGrads(step);
    // Fresh gradient memory every step (as torch's set_to_none gives).
    Model fresh = ms.clone();
    std::vector<const void *> ptrs;
    for (const Buf &g : fresh.grads)
      ptrs.push_back(g.data());
    REQUIRE_MESSAGE(flashopt_set_grads(b.opt, n, idx.data(), ptrs.data(),
                                       FLASHOPT_BF16) == FLASHOPT_OK,
                    lastError());
    stepOk(s.opt);
    stepOk(b.opt);
    for (size_t i = 0; i < kSizes.size(); ++i)
      CHECK(ms.params[i] == mb.params[i]);
    mb.grads = fresh.grads; // keep them alive like the model's
  }
  // A bad entry (wrong size / misaligned / bad index / bad dtype) changes
  // nothing: the next step still uses the gradients set before.
  Buf odd(4097 * 2 + 64);
  std::vector<const void *> bad = {mb.grads[0].data(), mb.grads[1].data(),
                                   odd.data() + 2, mb.grads[3].data(),
                                   mb.grads[4].data()};
  Buf other(64 * 2);
  std::vector<int64_t> badIdx = idx;
  CHECK(flashopt_set_grads(b.opt, n, idx.data(), bad.data(), FLASHOPT_BF16) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "flashopt_set_grads"));
  CHECK(contains(lastError(), "'layer2.w'"));
  CHECK(contains(lastError(), "aligned"));
  badIdx[1] = n;
  std::vector<const void *> good = {other.data(), other.data(), other.data(),
                                    other.data(), other.data()};
  CHECK(flashopt_set_grads(b.opt, n, badIdx.data(), good.data(),
                           FLASHOPT_BF16) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_set_grads(b.opt, 1, idx.data(), good.data(), FLASHOPT_F32) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(flashopt_set_grads(b.opt, -1, idx.data(), good.data(),
                           FLASHOPT_BF16) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_set_grads(b.opt, 1, nullptr, good.data(), FLASHOPT_BF16) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_set_grads(b.opt, 0, nullptr, nullptr, FLASHOPT_BF16) ==
        FLASHOPT_OK);
  ms.fillGrads(7);
  for (size_t i = 0; i < kSizes.size(); ++i)
    std::memcpy(mb.grads[i].data(), ms.grads[i].data(), ms.grads[i].bytes);
  stepOk(s.opt);
  stepOk(b.opt);
  for (size_t i = 0; i < kSizes.size(); ++i)
    CHECK(ms.params[i] == mb.params[i]);
}

TEST_CASE(
    "nonfinite policy: SKIP changes nothing and counts, PROPAGATE steps") {
  // bf16, f32 and f16 gradients; a tensor scanned in several pieces.
  const int64_t n = 70000;
  for (const char *spec : {"adamw_bf16_m24", "adamw_f32", "adamw_f16_m24"})
    for (int64_t at : {int64_t(77), n - 1})
      for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
        CAPTURE(spec);
        CAPTURE(at);
        CAPTURE(bad);
        Single s(n, 1.0f, 0.01f, spec);
        REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
        s.setGrad(at, bad);
        std::string before = savePath("skip-before"),
                    after = savePath("skip-after");
        saveOk(s.opt, before);
        REQUIRE(flashopt_set_nonfinite_policy(s.opt, FLASHOPT_NONFINITE_SKIP) ==
                FLASHOPT_OK);
        Buf p0 = s.param.clone();
        CHECK(flashopt_step(s.opt) == FLASHOPT_OK);
        CHECK(flashopt_step_param(s.opt, 0) == FLASHOPT_OK);
        int64_t skipped = 0, t = 0;
        REQUIRE(flashopt_get_skipped_steps(s.opt, &skipped) == FLASHOPT_OK);
        CHECK(skipped == 2);
        REQUIRE(flashopt_get_step(s.opt, -1, &t) == FLASHOPT_OK);
        CHECK(t == 1);
        REQUIRE(flashopt_get_step(s.opt, 0, &t) == FLASHOPT_OK);
        CHECK(t == 1);
        CHECK(s.param == p0);
        saveOk(s.opt, after);
        // Parameters, correction and states are as before.
        checkSameCheckpoint(before, after);
        // A finite gradient steps again under SKIP.
        s.setGrad(at, 0.5f);
        CHECK(flashopt_step(s.opt) == FLASHOPT_OK);
        REQUIRE(flashopt_get_step(s.opt, -1, &t) == FLASHOPT_OK);
        CHECK(t == 2);
        CHECK(!(s.param == p0));
        // PROPAGATE: the non-finite value flows into the weights.
        s.setGrad(at, bad);
        REQUIRE(flashopt_set_nonfinite_policy(
                    s.opt, FLASHOPT_NONFINITE_PROPAGATE) == FLASHOPT_OK);
        CHECK(flashopt_step(s.opt) == FLASHOPT_OK);
        REQUIRE(flashopt_get_skipped_steps(s.opt, &skipped) == FLASHOPT_OK);
        CHECK(skipped == 2);
        REQUIRE(flashopt_get_step(s.opt, -1, &t) == FLASHOPT_OK);
        CHECK(t == 3);
        std::vector<float> w(static_cast<size_t>(n));
        REQUIRE(flashopt_export_master_f32(s.opt, 0, w.data(), n) ==
                FLASHOPT_OK);
        CHECK(!std::isfinite(w[size_t(at)]));
        flashopt_numerics_report nr{};
        CHECK(flashopt_check_numerics(s.opt, &nr) == FLASHOPT_ERROR_NUMERICS);
        CHECK(nr.nonfinite_params == 1);
        CHECK(contains(lastError(), "'w'"));
        CHECK(contains(lastError(), "NaN or Inf"));
      }
}

TEST_CASE("buffers and the master codec without an optimizer") {
  Single s(100, 0.5f, 0.01f);
  for (int k = 0; k < 3; ++k)
    stepOk(s.opt);
  // Every buffer reads back in its own dtype and size; a write is read back.
  std::vector<int8_t> corr(100), codes(100);
  std::vector<uint16_t> scales(4);
  REQUIRE(flashopt_read_buffer(s.opt, 0, "correction", corr.data(), 100) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_read_buffer(s.opt, 0, "exp_avg.codes", codes.data(), 100) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_read_buffer(s.opt, 0, "exp_avg.scales", scales.data(), 8) ==
          FLASHOPT_OK);
  CHECK(std::any_of(codes.begin(), codes.end(), [](int8_t c) { return c; }));
  CHECK(flashopt_read_buffer(s.opt, 0, "exp_avg.scales", scales.data(), 6) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(flashopt_read_buffer(s.opt, 0, "param", corr.data(), 200) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(flashopt_last_error(), "'correction', 'exp_avg.codes'"));
  CHECK(flashopt_read_buffer(s.opt, 1, "correction", corr.data(), 100) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  // The codec decodes the parameter and its correction term as the
  // optimizer does.
  std::vector<float> master(100), decoded(100);
  REQUIRE(flashopt_export_master_f32(s.opt, 0, master.data(), 100) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_decode_master_f32(FLASHOPT_BF16, s.param.data(),
                                     FLASHOPT_I8, corr.data(), 100,
                                     decoded.data()) == FLASHOPT_OK);
  CHECK(std::memcmp(master.data(), decoded.data(), 400) == 0);
  // ... and encodes a master into a pair that decodes to it.
  std::vector<uint16_t> p2(100);
  std::vector<int8_t> c2(100);
  REQUIRE(flashopt_encode_master_f32(master.data(), 100, FLASHOPT_BF16,
                                     p2.data(), FLASHOPT_I8,
                                     c2.data()) == FLASHOPT_OK);
  REQUIRE(flashopt_decode_master_f32(FLASHOPT_BF16, p2.data(), FLASHOPT_I8,
                                     c2.data(), 100,
                                     decoded.data()) == FLASHOPT_OK);
  CHECK(std::memcmp(master.data(), decoded.data(), 400) == 0);
  CHECK(flashopt_decode_master_f32(FLASHOPT_F32, p2.data(), FLASHOPT_I8,
                                   c2.data(), 100, decoded.data()) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(flashopt_last_error(), "no master-weight encoding"));
  CHECK(flashopt_encode_master_f32(master.data(), 100, FLASHOPT_BF16,
                                   p2.data(), FLASHOPT_U8, c2.data()) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_decode_master_f32(flashopt_dtype(9), p2.data(), FLASHOPT_I8,
                                   nullptr, 100, decoded.data()) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  // A written correction term is the optimizer's: the master follows it.
  std::vector<int8_t> zero(100, 0);
  REQUIRE(flashopt_write_buffer(s.opt, 0, "correction", zero.data(), 100) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_export_master_f32(s.opt, 0, master.data(), 100) ==
          FLASHOPT_OK);
  std::vector<float> plain(100);
  for (size_t i = 0; i < plain.size(); ++i) {
    uint16_t h = 0;
    std::memcpy(&h, s.param.data() + 2 * i, 2);
    plain[i] = bf16_to_f32(h);
  }
  CHECK(master == plain);
  CHECK(flashopt_write_buffer(s.opt, 0, "correction", zero.data(), 99) ==
        FLASHOPT_ERROR_SIZE);
}

TEST_CASE("check_numerics flags a tiny lr and passes a normal one") {
  Single s(1000, 1.0f); // max |w| in [1, 2)
  flashopt_numerics_report r{};
  REQUIRE(flashopt_set_hyper(s.opt, 0, "lr", 1e-3) == FLASHOPT_OK);
  CHECK_MESSAGE(flashopt_check_numerics(s.opt, &r) == FLASHOPT_OK, lastError());
  CHECK(r.params_checked == 1);
  CHECK(r.params_too_small == 0);
  CHECK(r.first_param == -1);
  REQUIRE(flashopt_set_hyper(s.opt, 0, "lr", 1e-4) == FLASHOPT_OK);
  CHECK(flashopt_check_numerics(s.opt, &r) == FLASHOPT_ERROR_NUMERICS);
  CHECK(r.params_too_small == 1);
  CHECK(r.first_param == 0);
  CHECK(r.first_group == 0);
  CHECK(r.max_abs >= 1.0);
  CHECK(r.max_abs < 2.0);
  CHECK(std::fabs(r.lr - 1e-4) < 1e-9);
  // numerics.md §4.3: bf16 + 24-bit master, Adam(W), max|w| ~ 1: 6.23e-4.
  CHECK(r.min_lr == doctest::Approx(6.23e-4).epsilon(0.005));
  std::string e = lastError();
  CHECK(contains(e, "flashopt_check_numerics"));
  CHECK(contains(e, "'w'"));
  CHECK(contains(e, "0.00062")); // the min lr, 6.228e-4
  CHECK(flashopt_check_numerics(s.opt, nullptr) == FLASHOPT_ERROR_NUMERICS);
}

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

TEST_CASE("errors: dtype, device, size") {
  Single s(64);
  Buf p(128 * 4), g(128 * 4);
  int64_t idx = -1;
  // Wrong param dtype.
  CHECK(flashopt_add_param(s.opt, 0, "f32w", p.data(), FLASHOPT_F32, 64,
                           g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "flashopt_add_param"));
  CHECK(contains(lastError(), "'f32w'"));
  CHECK(contains(lastError(), "f32"));
  CHECK(contains(lastError(), "bf16"));
  // Wrong grad dtype.
  CHECK(flashopt_add_param(s.opt, 0, "g16", p.data(), FLASHOPT_BF16, 64,
                           g.data(), FLASHOPT_F16,
                           &idx) == FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'g16'"));
  CHECK(contains(lastError(), "grad dtype is f16"));
  CHECK(flashopt_set_grad(s.opt, 0, g.data(), FLASHOPT_F32, 64) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'w'"));
  // Wrong size.
  CHECK(flashopt_set_grad(s.opt, 0, g.data(), FLASHOPT_BF16, 65) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "flashopt_set_grad"));
  CHECK(contains(lastError(), "65"));
  CHECK(contains(lastError(), "'w'"));
  std::vector<float> w(10);
  CHECK(flashopt_export_master_f32(s.opt, 0, w.data(), 10) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'w'"));
  CHECK(flashopt_add_param(s.opt, 0, "empty", p.data(), FLASHOPT_BF16, 0,
                           nullptr, FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'empty'"));

  // DLPack: a kDLCUDA tensor on a CPU context.
  int64_t shape[2] = {4, 16};
  DLTensor t{};
  t.data = p.data();
  t.device = {kDLCUDA, 0};
  t.ndim = 2;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "cuda_w", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "'cuda_w'"));
  CHECK(contains(lastError(), "kDLCUDA"));
  CHECK(contains(lastError(), "CPU context"));
  // DLPack: a wrong dtype, lanes, strides.
  t.device = {kDLCPU, 0};
  t.dtype = {kDLFloat, 64, 1};
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "f64", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "'f64'"));
  t.dtype = {kDLBfloat, 16, 2};
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "lanes", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_DTYPE);
  CHECK(contains(lastError(), "lanes"));
  t.dtype = {kDLBfloat, 16, 1};
  int64_t strides[2] = {1, 4}; // column-major
  t.strides = strides;
  CHECK(flashopt_add_param_dlpack(s.opt, 0, "colmajor", &t, nullptr, &idx) ==
        FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "row-major"));
  // A good one: compact strides, byte_offset honoured, shape kept.
  int64_t good[2] = {16, 1};
  t.strides = good;
  t.data = p.data() - 64;
  t.byte_offset = 64;
  DLTensor gt = t;
  gt.data = g.data();
  gt.byte_offset = 0;
  REQUIRE_MESSAGE(flashopt_add_param_dlpack(s.opt, 1 - 1, "dl", &t, &gt,
                                            &idx) == FLASHOPT_OK,
                  lastError());
  flashopt_param_info pi{};
  REQUIRE(flashopt_get_param_info(s.opt, idx, &pi) == FLASHOPT_OK);
  CHECK(pi.ndim == 2);
  CHECK(pi.shape[0] == 4);
  CHECK(pi.shape[1] == 16);
  CHECK(pi.numel == 64);
  CHECK(std::string(pi.name) == "dl");
  // set_grad_dlpack with the wrong size.
  int64_t small[1] = {10};
  DLTensor st{};
  st.data = g.data();
  st.device = {kDLCPU, 0};
  st.ndim = 1;
  st.dtype = {kDLBfloat, 16, 1};
  st.shape = small;
  CHECK(flashopt_set_grad_dlpack(s.opt, idx, &st) == FLASHOPT_ERROR_SIZE);
  CHECK(contains(lastError(), "'dl'"));
}

TEST_CASE("errors: use after destroy") {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &opt) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_destroy(opt) == FLASHOPT_OK);
  CHECK(flashopt_step(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_step"));
  CHECK(contains(lastError(), "not a live optimizer"));
  int64_t n = 0;
  CHECK(flashopt_num_params(opt, &n) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_optimizer_destroy(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_optimizer_destroy"));
  // An optimizer handle is not a context handle and vice versa.
  CHECK(flashopt_context_set_threads(reinterpret_cast<flashopt_context>(opt),
                                     1) == FLASHOPT_ERROR_INVALID_HANDLE);
  // An optimizer keeps working after its context handle is destroyed.
  REQUIRE(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &opt) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_context_destroy(ctx) == FLASHOPT_OK);
  CHECK(flashopt_num_params(opt, &n) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(ctx) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_context_destroy"));
  CHECK(contains(lastError(), "not a live context"));
  flashopt_optimizer other = nullptr;
  CHECK(flashopt_optimizer_create(ctx, bundleDir(kSpec).c_str(), &other) ==
        FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(contains(lastError(), "flashopt_optimizer_create"));
  CHECK(flashopt_optimizer_destroy(opt) == FLASHOPT_OK);
  // Handles are never reused.
  flashopt_optimizer again = nullptr;
  flashopt_context ctx2 = nullptr;
  REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx2) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_optimizer_create(ctx2, bundleDir(kSpec).c_str(), &again) ==
          FLASHOPT_OK);
  CHECK(again != opt);
  CHECK(reinterpret_cast<void *>(ctx2) != reinterpret_cast<void *>(ctx));
  CHECK(flashopt_step(opt) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_optimizer_destroy(again) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(ctx2) == FLASHOPT_OK);
  // A handle never created, and NULL.
  CHECK(flashopt_step(reinterpret_cast<flashopt_optimizer>(
            uintptr_t(0xdead))) == FLASHOPT_ERROR_INVALID_HANDLE);
  CHECK(flashopt_step(nullptr) == FLASHOPT_ERROR_INVALID_HANDLE);
  // A success clears the last error.
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) == FLASHOPT_OK);
  CHECK(lastError().empty());
  CHECK(flashopt_context_destroy(ctx) == FLASHOPT_OK);
}

TEST_CASE("errors: double registration, unknown names, missing gradient") {
  Single s(64);
  Buf p(256), g(256);
  int64_t idx = -1;
  // The same param memory under another name.
  CHECK(flashopt_add_param(s.opt, 0, "again", s.param.data(), FLASHOPT_BF16, 64,
                           g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'again'"));
  CHECK(contains(lastError(), "'w'"));
  // Overlapping memory.
  CHECK(flashopt_add_param(s.opt, 0, "overlap", s.param.data() + 32,
                           FLASHOPT_BF16, 64, g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "overlaps"));
  // The same name.
  CHECK(flashopt_add_param(s.opt, 0, "w", p.data(), FLASHOPT_BF16, 64, g.data(),
                           FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'w'"));
  CHECK(contains(lastError(), "already registered"));
  // A name that clashes with a checkpoint tensor of another parameter.
  CHECK(flashopt_add_param(s.opt, 0, "w.correction", p.data(), FLASHOPT_BF16,
                           64, g.data(), FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(contains(lastError(), "'w.correction'"));
  // Unknown hyper-parameter.
  CHECK(flashopt_set_hyper(s.opt, 0, "momentum", 0.9) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "flashopt_set_hyper"));
  CHECK(contains(lastError(), "'momentum'"));
  CHECK(contains(lastError(), "adamw_bf16_m24"));
  double v = 0;
  CHECK(flashopt_get_hyper(s.opt, 0, "nope", &v) == FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "'nope'"));
  CHECK(flashopt_set_hyper(s.opt, 0, "lr", NAN) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "'lr'"));
  CHECK(flashopt_set_hyper(s.opt, 5, "lr", 1e-3) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "param group 5"));
  // Unknown parameter and index.
  CHECK(flashopt_find_param(s.opt, "nope", &idx) == FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "'nope'"));
  CHECK(flashopt_step_param(s.opt, 7) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "index 7"));
  // A parameter without gradient: STATE, nothing changed.
  REQUIRE(flashopt_add_param(s.opt, 0, "nograd", p.data(), FLASHOPT_BF16, 64,
                             nullptr, FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  Buf before = s.param.clone();
  CHECK(flashopt_step(s.opt) == FLASHOPT_ERROR_STATE);
  CHECK(contains(lastError(), "'nograd'"));
  CHECK(contains(lastError(), "no gradient"));
  CHECK(s.param == before);
  int64_t t = -1;
  REQUIRE(flashopt_get_step(s.opt, 0, &t) == FLASHOPT_OK);
  CHECK(t == 0);
  REQUIRE(flashopt_set_grad(s.opt, idx, g.data(), FLASHOPT_BF16, 64) ==
          FLASHOPT_OK);
  CHECK(flashopt_step(s.opt) == FLASHOPT_OK);
  // Unknown bundle directory.
  flashopt_optimizer o2 = nullptr;
  CHECK(flashopt_optimizer_create(s.ctx, "/nonexistent/bundle", &o2) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "/nonexistent/bundle"));
}

TEST_CASE("errors: checkpoints") {
  Single s(100);
  REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
  std::string good = savePath("err-good");
  saveOk(s.opt, good);
  Buf before = s.param.clone();

  // Unknown file.
  std::string missing = (scratch() / "missing.safetensors").string();
  CHECK(flashopt_load_checkpoint(s.opt, missing.c_str()) ==
        FLASHOPT_ERROR_NOT_FOUND);
  CHECK(contains(lastError(), "missing.safetensors"));
  CHECK(contains(lastError(), "flashopt_load_checkpoint"));

  // Truncated and corrupted files.
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  std::string truncated = savePath("err-truncated");
  std::ofstream(truncated, std::ios::binary)
      << bytes.substr(0, bytes.size() - 10);
  CHECK(flashopt_load_checkpoint(s.opt, truncated.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-truncated"));
  std::string corrupt = savePath("err-corrupt");
  std::string c = bytes;
  c[12] = '#'; // inside the JSON header
  std::ofstream(corrupt, std::ios::binary) << c;
  CHECK(flashopt_load_checkpoint(s.opt, corrupt.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-corrupt"));
  std::string shortFile = savePath("err-short");
  std::ofstream(shortFile, std::ios::binary) << "abc";
  CHECK(flashopt_load_checkpoint(s.opt, shortFile.c_str()) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "err-short"));
  CHECK(s.param == before);

  // A checkpoint of another spec.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx,
                                      bundleDir("adamw_bf16_m32").c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(200), g(200), corr(400);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "w", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-otherspec");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "adamw_bf16_m32"));
    CHECK(contains(lastError(), "adamw_bf16_m24"));
    flashopt_optimizer_destroy(other);
  }
  // A checkpoint of the same rule in the other numerics (docs/NUMERICS.md
  // §8): refused by name before anything else, nothing loaded.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(
                s.ctx, bundleDir(std::string(kSpec) + "_flashoptim").c_str(),
                &other) == FLASHOPT_OK);
    Buf p(200), g(200);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "w", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-othernumerics");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "written with the 'flashoptim' numerics"));
    CHECK(contains(lastError(), "runs the 'bounded' numerics"));
    CHECK(contains(lastError(), "nothing was loaded"));
    // And the other way round.
    CHECK(flashopt_load_checkpoint(other, good.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "written with the 'bounded' numerics"));
    CHECK(p == Buf(200));
    flashopt_optimizer_destroy(other);
  }
  // A checkpoint with another shape (same numel) and another size.
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx, bundleDir(kSpec).c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(256), g(256);
    int64_t shape[2] = {10, 10};
    DLTensor t{};
    t.data = p.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLBfloat, 16, 1};
    t.shape = shape;
    int64_t idx = -1;
    REQUIRE(flashopt_add_param_dlpack(other, 0, "w", &t, nullptr, &idx) ==
            FLASHOPT_OK);
    std::string path = savePath("err-shape");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "[10, 10]"));
    CHECK(contains(lastError(), "[100]"));
    CHECK(contains(lastError(), "'w'"));
    flashopt_optimizer_destroy(other);
  }
  {
    flashopt_optimizer other = nullptr;
    REQUIRE(flashopt_optimizer_create(s.ctx, bundleDir(kSpec).c_str(),
                                      &other) == FLASHOPT_OK);
    Buf p(256), g(256);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(other, 0, "v", p.data(), FLASHOPT_BF16, 100,
                               g.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    std::string path = savePath("err-names");
    saveOk(other, path);
    CHECK(flashopt_load_checkpoint(s.opt, path.c_str()) ==
          FLASHOPT_ERROR_MISMATCH);
    CHECK(contains(lastError(), "'v'"));
    flashopt_optimizer_destroy(other);
  }
  CHECK(s.param == before);
  // The good one still loads; saving is atomic (a failed save keeps it).
  CHECK(flashopt_load_checkpoint(s.opt, good.c_str()) == FLASHOPT_OK);
  std::string dirPath = (scratch() / "no-such-dir" / "x.safetensors").string();
  CHECK(flashopt_save_checkpoint(s.opt, dirPath.c_str(),
                                 FLASHOPT_CHECKPOINT_COMPRESSED) ==
        FLASHOPT_ERROR_IO);
  CHECK(contains(lastError(), "no-such-dir"));
}

//===----------------------------------------------------------------------===//
// Embedded bundles and the C++ wrapper
//===----------------------------------------------------------------------===//

TEST_CASE("embedded bundle") {
  std::vector<std::string> names, contents;
  for (auto &e : fs::directory_iterator(bundleDir(kSpec))) {
    std::string n = e.path().filename().string();
    if (n != "manifest.json" && e.path().extension() != ".so")
      continue;
    std::ifstream in(e.path(), std::ios::binary);
    names.push_back(n);
    contents.emplace_back((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  }
  std::vector<flashopt_bundle_file> files;
  for (size_t i = 0; i < names.size(); ++i)
    files.push_back({names[i].c_str(), contents[i].data(), contents[i].size()});
  flashopt_embedded_bundle b{FLASHOPT_ABI_VERSION, kSpec, files.size(),
                             files.data()};
  auto tempBundles = [] {
    int n = 0;
    for (auto &e : fs::directory_iterator(fs::temp_directory_path()))
      n += e.path().filename().string().rfind("flashopt-bundle-", 0) == 0;
    return n;
  };
  int before = tempBundles();
  flashopt::Context ctx = flashopt::Context::cpu(1);
  flashopt::Optimizer opt(ctx, b);
  CHECK(tempBundles() <= before); // the private directory is gone
  CHECK(std::string(opt.info().name) == kSpec);
  Buf p(128), g(128);
  opt.add_param("x", p.data(), FLASHOPT_BF16, 64, g.data(), FLASHOPT_BF16);
  opt.step();
  CHECK(opt.step_count() == 1);
  b.abi_version = 99;
  flashopt_optimizer raw = nullptr;
  CHECK(flashopt_optimizer_create_embedded(ctx.get(), &b, &raw) ==
        FLASHOPT_ERROR_UNSUPPORTED);
  CHECK(contains(lastError(), kSpec));
  CHECK(contains(lastError(), "99"));
}

TEST_CASE("parameter info strings stay valid while the optimizer lives") {
  Single s(64);
  flashopt_param_info first{};
  REQUIRE(flashopt_get_param_info(s.opt, 0, &first) == FLASHOPT_OK);
  std::vector<Buf> more;
  for (int i = 0; i < 200; ++i) {
    more.emplace_back(128);
    int64_t idx = -1;
    REQUIRE(flashopt_add_param(s.opt, 0, nullptr, more.back().data(),
                               FLASHOPT_BF16, 64, nullptr, FLASHOPT_BF16,
                               &idx) == FLASHOPT_OK);
    CHECK(idx == i + 1);
  }
  CHECK(std::string(first.name) == "w");
  CHECK(first.shape[0] == 64);
  int64_t idx = -1;
  REQUIRE(flashopt_find_param(s.opt, "p17", &idx) == FLASHOPT_OK);
  CHECK(idx == 17);
  const char *h = nullptr;
  REQUIRE(flashopt_hyper_name(s.opt, 0, &h) == FLASHOPT_OK);
  CHECK(std::string(h) == "lr");
  CHECK(flashopt_hyper_name(s.opt, 99, &h) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(flashopt_status_name(FLASHOPT_ERROR_MISMATCH)) ==
        "FLASHOPT_ERROR_MISMATCH");
  CHECK(std::string(flashopt_dtype_name(FLASHOPT_U8)) == "ui8");
  CHECK(flashopt_dtype_size(FLASHOPT_I16) == 2);
  CHECK(flashopt_abi_version() == FLASHOPT_ABI_VERSION);
}

TEST_CASE("threads: distinct optimizers at once, thread-local last error") {
  std::string errA, errB;
  auto work = [](std::string *err, bool fail) {
    Single s(5000);
    for (int i = 0; i < 20; ++i)
      if (flashopt_step(s.opt) != FLASHOPT_OK)
        *err = "step failed: " + lastError();
    if (fail)
      flashopt_set_hyper(s.opt, 0, "no_such_hyper", 1.0);
    else
      flashopt_set_hyper(s.opt, 0, "lr", 1e-3);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (fail && !contains(lastError(), "'no_such_hyper'"))
      *err += "lost its error: '" + lastError() + "'";
    if (!fail && !lastError().empty())
      *err += "saw an error: '" + lastError() + "'";
  };
  std::thread a(work, &errA, true), b(work, &errB, false);
  a.join();
  b.join();
  CHECK_MESSAGE(errA.empty(), errA);
  CHECK_MESSAGE(errB.empty(), errB);
}

extern "C" int flashopt_c_smoke(const char *bundle_dir, const char *ckpt,
                                char *why, size_t why_size);

TEST_CASE("the C ABI from C") {
  char why[512] = "";
  std::string ckpt = savePath("from-c");
  int line = flashopt_c_smoke(bundleDir("adamw_f32").c_str(), ckpt.c_str(), why,
                              sizeof why);
  CHECK_MESSAGE(line == 0, "CApiC.c:" << line << ": " << why);
  CHECK(fs::exists(ckpt));
}

TEST_CASE("C++ wrapper") {
  flashopt::Context ctx = flashopt::Context::cpu(2);
  flashopt::Optimizer opt(ctx, bundleDir(kSpec));
  CHECK(opt.num_param_groups() == 1);
  CHECK(opt.add_param_group() == 1);
  opt.set_hyper("lr", 2e-3);
  CHECK(opt.get_hyper(1, "lr") == double(2e-3f));
  std::vector<std::string> hn = opt.hyper_names();
  CHECK(hn.front() == "lr");
  std::vector<flashopt::bf16> w(100, flashopt::bf16{f32_to_bf16(1.0f)}),
      g(100, flashopt::bf16{f32_to_bf16(0.1f)});
  int64_t i = opt.add_param("w", w.data(), 100, g.data(), 1);
  CHECK(i == 0);
  CHECK(opt.find_param("w") == 0);
  CHECK(opt.param_info(0).group == 1);
  opt.step();
  opt.step_param(0);
  CHECK(opt.step_count() == 1);
  CHECK(opt.step_count(0) == 2);
  std::vector<float> m = opt.export_master_f32(0);
  CHECK(m.size() == 100);
  opt.import_master_f32(0, m);
  CHECK(opt.memory_report().numel == 100);
  std::string msg;
  opt.set_hyper("lr", 1e-9);
  flashopt_numerics_report r = opt.check_numerics(&msg);
  CHECK(r.params_too_small == 1);
  CHECK(contains(msg, "'w'"));
  std::string path = savePath("wrapper");
  opt.save_checkpoint(path);
  opt.load_checkpoint(path);
  try {
    opt.set_hyper("momentum", 0.9);
    FAIL("no exception");
  } catch (const flashopt::Error &e) {
    CHECK(e.status() == FLASHOPT_ERROR_NOT_FOUND);
    CHECK(contains(e.what(), "'momentum'"));
    CHECK(std::string(e.status_name()) == "FLASHOPT_ERROR_NOT_FOUND");
  }
  flashopt::Optimizer moved = std::move(opt);
  CHECK(!opt);
  CHECK(moved.num_params() == 1);
  CHECK_THROWS_AS(flashopt::Optimizer(ctx, "/nonexistent"), flashopt::Error);
}

//===----------------------------------------------------------------------===//
// CUDA contexts
//===----------------------------------------------------------------------===//

TEST_CASE("CUDA context without a driver") {
  setenv("FLASHOPT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  flashopt_context ctx = nullptr;
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &ctx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "flashopt_context_create"));
  CHECK(contains(lastError(), "CUDA device 0"));
  CHECK(contains(lastError(), "NVIDIA driver"));
  unsetenv("FLASHOPT_CUDA_DRIVER");
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 1, &ctx) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "device_id"));
}

namespace {
/// The C ABI on CUDA device 0 (the driver CudaDriver::get() loads) against
/// the CPU, for each of `modes`: 0 steps with flashopt_step, 1 with
/// step_param over every parameter, 2 with one step_param ahead on
/// parameter 2 (counters that differ: partial launches).
void gpuVsCpu(const std::vector<int> &modes) {
  Expected<std::shared_ptr<CudaContext>> cc = CudaContext::create(0);
  REQUIRE_MESSAGE(cc.ok(), cc.error());
  std::shared_ptr<CudaContext> dev = *cc;
  Manifest m = *load_manifest(bundleDir(kSpec) + "/manifest.json");
  Model base(m, 31);

  for (int mode : modes) {
    CAPTURE(mode);
    Model mc = base.clone();
    AbiOpt cpu(kSpec, mc);
    std::vector<DeviceBuffer> dparams, dgrads;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      auto p = DeviceBuffer::allocate(dev, int64_t(base.params[i].bytes));
      auto g = DeviceBuffer::allocate(dev, int64_t(base.grads[i].bytes));
      REQUIRE(p.ok());
      REQUIRE(g.ok());
      REQUIRE(p->upload(base.params[i].data(), p->bytes()).ok());
      dparams.push_back(std::move(p.value()));
      dgrads.push_back(std::move(g.value()));
    }
    flashopt_context gctx = nullptr;
    flashopt_optimizer gopt = nullptr;
    REQUIRE_MESSAGE(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &gctx) ==
                        FLASHOPT_OK,
                    lastError());
    REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundleDir(kSpec).c_str(),
                                              &gopt) == FLASHOPT_OK,
                    lastError());
    int32_t grp = -1;
    REQUIRE(flashopt_add_param_group(gopt, &grp) == FLASHOPT_OK);
    for (int g = 0; g < 2; ++g)
      for (auto &kv : groupHypers(m, g))
        REQUIRE(flashopt_set_hyper(gopt, g, kv.first.c_str(), kv.second) ==
                FLASHOPT_OK);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      int64_t idx = -1;
      std::string name = "layer" + std::to_string(i) + ".w";
      REQUIRE_MESSAGE(flashopt_add_param(
                          gopt, int32_t(i % 2), name.c_str(),
                          reinterpret_cast<void *>(uintptr_t(dparams[i].ptr())),
                          FLASHOPT_BF16, kSizes[i],
                          reinterpret_cast<void *>(uintptr_t(dgrads[i].ptr())),
                          FLASHOPT_BF16, &idx) == FLASHOPT_OK,
                      lastError());
    }
    auto uploadGrads = [&] {
      REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
      for (size_t i = 0; i < kSizes.size(); ++i)
        REQUIRE(dgrads[i].upload(mc.grads[i].data(), dgrads[i].bytes()).ok());
    };
    for (int s = 1; s <= 3; ++s) {
      mc.fillGrads(s);
      uploadGrads();
      if (mode == 2 && s == 1) {
        REQUIRE(flashopt_step_param(gopt, 2) == FLASHOPT_OK);
        REQUIRE(flashopt_step_param(cpu.opt, 2) == FLASHOPT_OK);
        continue;
      }
      if (mode == 1) {
        for (int64_t i = int64_t(kSizes.size()) - 1; i >= 0; --i) {
          REQUIRE_MESSAGE(flashopt_step_param(gopt, i) == FLASHOPT_OK,
                          lastError());
          REQUIRE(flashopt_step_param(cpu.opt, i) == FLASHOPT_OK);
        }
      } else {
        REQUIRE_MESSAGE(flashopt_step(gopt) == FLASHOPT_OK, lastError());
        stepOk(cpu.opt);
      }
    }
    REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      Buf got(base.params[i].bytes);
      REQUIRE(dparams[i].download(got.data(), int64_t(got.bytes)).ok());
      CHECK_MESSAGE(got == mc.params[i], "param " << i);
    }
    std::string pg = savePath("gpu-g"), pc = savePath("gpu-c");
    saveOk(gopt, pg);
    saveOk(cpu.opt, pc);
    checkSameCheckpoint(pg, pc);
    REQUIRE(flashopt_optimizer_destroy(gopt) == FLASHOPT_OK);
    REQUIRE(flashopt_context_destroy(gctx) == FLASHOPT_OK);
  }
}
} // namespace

TEST_CASE("GPU: C ABI step, step_param and mixed counters match the CPU "
          "(GPU only)") {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    MESSAGE("skipped: needs the NVIDIA driver");
    return;
  }
  dlclose(lib);
  unsetenv("FLASHOPT_CUDA_DRIVER");
  gpuVsCpu({0, 1, 2});
}

#ifdef FLASHOPT_MOCK_CUDA
namespace {
/// A copy of `host` in the stand-in driver's "device" memory (host memory
/// it tracks; freed through it when the buffer goes).
Buf mockDeviceCopy(const Buf &host) {
  static void *lib = dlopen(FLASHOPT_MOCK_CUDA, RTLD_NOW);
  REQUIRE(lib);
  using Alloc = int (*)(unsigned long long *, size_t);
  auto alloc = reinterpret_cast<Alloc>(dlsym(lib, "cuMemAlloc_v2"));
  bool found = alloc != nullptr;
  REQUIRE(found);
  unsigned long long p = 0;
  REQUIRE(alloc(&p, host.bytes) == 0);
  REQUIRE(p % 16 == 0);
  Buf b;
  b.bytes = host.bytes;
  using Free = int (*)(unsigned long long);
  static Free release = reinterpret_cast<Free>(dlsym(lib, "cuMemFree_v2"));
  bool haveFree = release != nullptr;
  REQUIRE(haveFree);
  b.mem.reset(reinterpret_cast<uint8_t *>(uintptr_t(p)), [](uint8_t *q) {
    release(static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(q)));
  });
  std::memcpy(b.data(), host.data(), host.bytes);
  return b;
}
} // namespace

TEST_CASE("CUDA context over a stand-in driver: step == CPU step") {
  setenv("FLASHOPT_CUDA_DRIVER", FLASHOPT_MOCK_CUDA, 1);
  setenv("FLASHOPT_MOCK_CUDA_CC", "9.0", 1);
  std::string kernels = binaryDir() + "/kernels";
  setenv("FLASHOPT_MOCK_CUDA_KERNELS", kernels.c_str(), 1);
  flashopt_context gctx = nullptr;
  REQUIRE_MESSAGE(flashopt_context_create(FLASHOPT_DEVICE_CUDA, 0, &gctx) ==
                      FLASHOPT_OK,
                  lastError());
  flashopt_optimizer gopt = nullptr;
  REQUIRE_MESSAGE(flashopt_optimizer_create(gctx, bundleDir(kSpec).c_str(),
                                            &gopt) == FLASHOPT_OK,
                  lastError());
  flashopt_optimizer_info info{};
  REQUIRE(flashopt_optimizer_get_info(gopt, &info) == FLASHOPT_OK);
  CHECK(info.device_type == FLASHOPT_DEVICE_CUDA);
  Model base(*load_manifest(bundleDir(kSpec) + "/manifest.json"), 21);
  Model mg = base.clone(), mc = base.clone();
  for (Buf &b : mg.params)
    b = mockDeviceCopy(b);
  for (Buf &b : mg.grads)
    b = mockDeviceCopy(b);
  AbiOpt cpu(kSpec, mc);
  int32_t grp = -1;
  REQUIRE(flashopt_add_param_group(gopt, &grp) == FLASHOPT_OK);
  for (int g = 0; g < 2; ++g)
    for (auto &kv :
         groupHypers(*load_manifest(bundleDir(kSpec) + "/manifest.json"), g))
      REQUIRE(flashopt_set_hyper(gopt, g, kv.first.c_str(), kv.second) ==
              FLASHOPT_OK);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    // "Device" memory of the stand-in is host memory: DLPack kDLCUDA.
    DLTensor p{}, gr{};
    p.data = mg.params[i].data();
    p.device = {kDLCUDA, 0};
    p.ndim = 1;
    p.dtype = {kDLBfloat, 16, 1};
    int64_t n = kSizes[i];
    p.shape = &n;
    gr = p;
    gr.data = mg.grads[i].data();
    int64_t idx = -1;
    std::string name = "layer" + std::to_string(i) + ".w";
    REQUIRE_MESSAGE(flashopt_add_param_dlpack(gopt, int32_t(i % 2),
                                              name.c_str(), &p, &gr,
                                              &idx) == FLASHOPT_OK,
                    lastError());
  }
  // A CPU tensor on a CUDA context is a device error.
  DLTensor hostT{};
  int64_t n1 = 1;
  hostT.data = mg.params[0].data();
  hostT.device = {kDLCPU, 0};
  hostT.ndim = 1;
  hostT.dtype = {kDLBfloat, 16, 1};
  hostT.shape = &n1;
  int64_t idx = -1;
  CHECK(flashopt_add_param_dlpack(gopt, 0, "host", &hostT, nullptr, &idx) ==
        FLASHOPT_ERROR_DEVICE);
  CHECK(contains(lastError(), "CUDA context"));
  CHECK(flashopt_set_nonfinite_policy(gopt, FLASHOPT_NONFINITE_SKIP) ==
        FLASHOPT_ERROR_UNSUPPORTED);
  for (int s = 1; s <= 3; ++s) {
    mg.fillGrads(s);
    mc.fillGrads(s);
    REQUIRE_MESSAGE(flashopt_step(gopt) == FLASHOPT_OK, lastError());
    stepOk(cpu.opt);
  }
  REQUIRE(flashopt_synchronize(gopt) == FLASHOPT_OK);
  for (size_t i = 0; i < kSizes.size(); ++i)
    CHECK_MESSAGE(mg.params[i] == mc.params[i], "param " << i);
  std::string pg = savePath("cuda-g"), pc = savePath("cuda-c");
  saveOk(gopt, pg);
  saveOk(cpu.opt, pc);
  checkSameCheckpoint(pg, pc);
  // Master export and checkpoint load on the device path.
  std::vector<float> wg(static_cast<size_t>(kSizes[2])), wc(wg.size());
  REQUIRE(flashopt_export_master_f32(gopt, 2, wg.data(), kSizes[2]) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_export_master_f32(cpu.opt, 2, wc.data(), kSizes[2]) ==
          FLASHOPT_OK);
  CHECK(std::memcmp(wg.data(), wc.data(), wg.size() * 4) == 0);
  REQUIRE_MESSAGE(flashopt_load_checkpoint(gopt, pc.c_str()) == FLASHOPT_OK,
                  lastError());
  flashopt_memory_report r{};
  REQUIRE(flashopt_memory_report_get(gopt, &r) == FLASHOPT_OK);
  CHECK(r.numel == 1 + 33 + 4097 + 300 + 64);
  CHECK(flashopt_optimizer_destroy(gopt) == FLASHOPT_OK);
  CHECK(flashopt_context_destroy(gctx) == FLASHOPT_OK);
  // The GPU-only test's plumbing, with full-table launches (the stand-in
  // checks that a launch covers the whole table, so no step_param here).
  gpuVsCpu({0});
  unsetenv("FLASHOPT_CUDA_DRIVER");
}
#endif

//===----------------------------------------------------------------------===//
// Python interoperability (run by its own ctest entry)
//===----------------------------------------------------------------------===//

TEST_CASE("python interop: safetensors.torch reads a checkpoint" *
          doctest::skip()) {
  std::string python = sourceDir() + "/.venv/bin/python";
  REQUIRE_MESSAGE(fs::exists(python),
                  python << " is missing: run scripts/setup.sh to create the "
                            "virtual environment with safetensors");
  Single s(1000);
  REQUIRE(flashopt_step(s.opt) == FLASHOPT_OK);
  std::string path = savePath("python");
  saveOk(s.opt, path);
  std::string out = (scratch() / "python.txt").string();
  std::string script = "import sys\n"
                       "from safetensors.torch import load_file\n"
                       "from safetensors import safe_open\n"
                       "t = load_file(sys.argv[1])\n"
                       "with open(sys.argv[2], 'w') as f:\n"
                       "    for k in sorted(t):\n"
                       "        f.write('%s %s %s\\n' % (k, str(t[k].dtype), "
                       "list(t[k].shape)))\n"
                       "    with safe_open(sys.argv[1], 'pt') as h:\n"
                       "        m = h.metadata()\n"
                       "        f.write('meta %s %s %s\\n' % (m['format'], "
                       "m['spec'], m['step']))\n";
  std::string scriptPath = (scratch() / "read.py").string();
  std::ofstream(scriptPath) << script;
  std::string cmd = python + " " + scriptPath + " " + path + " " + out;
  REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, cmd);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  MESSAGE(text);
  CHECK(contains(text, "w torch.bfloat16 [1000]\n"));
  CHECK(contains(text, "w.correction torch.int8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg.codes torch.int8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg.scales torch.bfloat16 [32]\n"));
  CHECK(contains(text, "w.exp_avg_sq.codes torch.uint8 [1000]\n"));
  CHECK(contains(text, "w.exp_avg_sq.scales torch.bfloat16 [32]\n"));
  CHECK(contains(text, "meta flashopt.checkpoint adamw_bf16_m24 1\n"));
}
