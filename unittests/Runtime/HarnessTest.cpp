//===- HarnessTest.cpp - Host harness tests ---------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Tests of the host harness (runtime/): manifest validation, bundle loading
/// and CPU selection, the tensor and hyper tables (docs/KERNEL-ABI.md), the
/// state arenas, group-aligned chunking over the thread pool, and the bytes
/// report. The kernel is a hand-written C implementation of the ABI for a
/// trivial SGD-with-momentum spec (Inputs/fake_sgd_kernel.c), built by CMake
/// into a bundle at FLASHOPT_FAKE_SGD_BUNDLE.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/Float16.h"
#include "flashopt/host/CpuOptimizer.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#ifndef FLASHOPT_FAKE_SGD_BUNDLE
#error "FLASHOPT_FAKE_SGD_BUNDLE must name the fake_sgd bundle directory"
#endif

namespace fs = std::filesystem;
using namespace flashopt::host;
using json = nlohmann::json;

namespace {

const std::string kBundle = FLASHOPT_FAKE_SGD_BUNDLE;

/// Loads without looking at FLASHOPT_CPU, so the tests do not depend on the
/// environment they run in.
LoadOptions noEnv(std::string cpu = "") {
  LoadOptions o;
  o.cpu = std::move(cpu);
  o.use_env = false;
  return o;
}

json fakeManifest() {
  std::ifstream in(kBundle + "/manifest.json");
  REQUIRE(in.good());
  return json::parse(in);
}

/// This process's scratch directory, removed at exit.
fs::path scratchDir() {
  struct Scratch {
    fs::path path = fs::temp_directory_path() /
                    ("flashopt-harness-test-" + std::to_string(getpid()));
    ~Scratch() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static Scratch scratch;
  return scratch.path;
}

/// A scratch bundle directory holding `manifest` and copies of the fake
/// kernel objects (unless `withObjects` is false).
std::string makeBundle(const std::string &name, const json &manifest,
                       bool withObjects = true) {
  fs::path dir = scratchDir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "manifest.json") << manifest.dump(2);
  if (withObjects)
    for (const char *f : {"fake_sgd.x86-64-v3.so", "fake_sgd.x86-64.so"})
      fs::copy_file(fs::path(kBundle) / f, dir / f,
                    fs::copy_options::overwrite_existing);
  return dir.string();
}

std::unique_ptr<CpuOptimizer> makeOptimizer(const OptimizerOptions &opts = {},
                                         const std::string &dir = kBundle) {
  auto o = CpuOptimizer::create(dir, noEnv(), opts);
  REQUIRE_MESSAGE(o.ok(), o.error());
  return std::move(o.value());
}

/// The same update in plain C++ (f32, no contraction needed: separate ops).
void referenceStep(std::vector<float> &p, std::vector<float> &m,
                   const std::vector<float> &g, float lr, float momentum) {
  for (size_t i = 0; i < p.size(); ++i) {
    volatile float mi = m[i] * momentum;
    mi = mi + g[i];
    m[i] = mi;
    volatile float u = lr * mi;
    p[i] = p[i] - u;
  }
}

std::vector<float> randomVector(std::mt19937 &rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(rng);
  return v;
}

bool sameBits(const void *a, const void *b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

using CallsFn = int64_t (*)();
using CpuFn = const char *(*)();

/// A manifest shaped like adamw_bf16_m24 (bf16 param + i8 correction, bf16
/// grad, two quantized states with f16 scales), pointing at the fake kernel
/// objects: loadable and measurable, never stepped.
json adamwLikeManifest() {
  json m = fakeManifest();
  m["name"] = "adamw_like";
  m["rule"] = "adamw";
  m["param"] = {{"dtype", "bf16"}, {"correction", "i8"}};
  m["grad"] = "bf16";
  m["hypers"] = json::array({{{"name", "lr"}, {"default", 0.001}},
                             {{"name", "beta1"}, {"default", 0.9}},
                             {{"name", "beta2"}, {"default", 0.999}},
                             {{"name", "eps"}, {"default", 1e-8}},
                             {{"name", "weight_decay"}, {"default", 0.01}}});
  m["states"] = json::array(
      {{{"name", "exp_avg"},
        {"encoding",
         {{"kind", "quantized"}, {"storage", "i8"}, {"group", 32},
          {"compand", "softsign"}, {"scale", "f16"}}}},
       {{"name", "exp_avg_sq"},
        {"encoding",
         {{"kind", "quantized"}, {"storage", "ui8"}, {"group", 32},
          {"compand", "sqrt"}, {"scale", "f16"}}}}});
  auto buf = [](const char *n, const char *d, const char *per, const char *acc) {
    return json{{"name", n}, {"dtype", d}, {"per", per}, {"access", acc}};
  };
  m["buffers"] = json::array(
      {buf("param", "bf16", "element", "readwrite"),
       buf("correction", "i8", "element", "readwrite"),
       buf("grad", "bf16", "element", "read"),
       buf("exp_avg.codes", "i8", "element", "readwrite"),
       buf("exp_avg.scales", "f16", "group", "readwrite"),
       buf("exp_avg_sq.codes", "ui8", "element", "readwrite"),
       buf("exp_avg_sq.scales", "f16", "group", "readwrite")});
  m["table"] = {{"header_words", 4}, {"record_words", 11}};
  m["bytes_per_param"] = {{"param", 2},  {"correction", 1},
                          {"grad", 2},   {"states", 2.125},
                          {"total", 7.125}, {"total_with_grad_release", 5.125}};
  return m;
}

} // namespace

//===----------------------------------------------------------------------===//

TEST_CASE("the fake bundle's manifest parses into the expected model") {
  auto m = load_manifest(kBundle + "/manifest.json");
  REQUIRE_MESSAGE(m.ok(), m.error());
  CHECK(m->name == "fake_sgd");
  CHECK(m->group_size == 32);
  CHECK(m->param == DType::F32);
  CHECK_FALSE(m->correction.has_value());
  CHECK(m->grad == DType::F32);
  REQUIRE(m->hypers.size() == 2);
  CHECK(m->hypers[0].name == "lr");
  CHECK(*m->hypers[0].default_value == doctest::Approx(0.01));
  CHECK(m->hyper_index("momentum") == 1);
  CHECK(m->hyper_index("nope") == -1);
  REQUIRE(m->buffers.size() == 3);
  CHECK(m->buffers[0].role == BufferRole::Param);
  CHECK(m->buffers[1].role == BufferRole::Grad);
  CHECK_FALSE(m->buffers[1].writable);
  CHECK(m->buffers[2].role == BufferRole::State);
  CHECK(m->record_words == 7);
  REQUIRE(m->kernels.size() == 3);
  CHECK(m->kernels[0].target == "sm_90"); // GPU entries are kept, not loaded
  CHECK(m->kernels[1].features.size() == 4);

  auto a = parse_manifest(adamwLikeManifest().dump(), "adamw_like");
  REQUIRE_MESSAGE(a.ok(), a.error());
  CHECK(*a->correction == DType::I8);
  CHECK(a->buffers[4].per == Per::Group);
  CHECK(a->states[1].compand == "sqrt");
  CHECK(a->computed_bytes_per_param().total == doctest::Approx(7.125));
}

TEST_CASE("list_bundles finds the directories holding a manifest.json") {
  namespace fs = std::filesystem;
  fs::path bundle(FLASHOPT_FAKE_SGD_BUNDLE);
  fs::path root = fs::temp_directory_path() /
                  ("flashopt-list-bundles-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "b_second");
  fs::create_directories(root / "a_first");
  fs::create_directories(root / "no_manifest");
  fs::copy_file(bundle / "manifest.json", root / "b_second" / "manifest.json");
  fs::copy_file(bundle / "manifest.json", root / "a_first" / "manifest.json");
  std::ofstream(root / "stray.json") << "{}";
  CHECK(list_bundles(root.string()) ==
        std::vector<std::string>{"a_first", "b_second"});
  CHECK(list_bundles((root / "does_not_exist").string()).empty());
  fs::remove_all(root);
}

TEST_CASE("the tensor table follows the kernel ABI word for word") {
  auto opt = makeOptimizer();
  const Manifest &m = opt->manifest();
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543};
  std::vector<std::vector<float>> params, grads;
  for (int64_t n : sizes) {
    params.emplace_back(size_t(n), 1.0f);
    grads.emplace_back(size_t(n), 0.5f);
  }
  int slot1 = opt->add_param_group();
  CHECK(slot1 == 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto idx = opt->add_param(int(i % 2), params[i].data(), sizes[i],
                              grads[i].data());
    REQUIRE_MESSAGE(idx.ok(), idx.error());
    CHECK(*idx == int64_t(i));
  }
  const std::vector<int64_t> &t = opt->table();
  const int64_t R = m.record_words;
  REQUIRE(int64_t(t.size()) == R * int64_t(sizes.size()));
  int64_t expectFirst = 0;
  uintptr_t stateBase = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t *rec = t.data() + i * size_t(R);
    INFO("tensor " << i << " numel " << sizes[i]);
    CHECK(rec[0] == sizes[i]);
    CHECK(rec[1] == expectFirst); // ordered by word 1 and contiguous
    CHECK(rec[2] == int64_t(i % 2));
    CHECK(rec[3] == 0);
    CHECK(rec[4] == int64_t(reinterpret_cast<intptr_t>(params[i].data())));
    CHECK(rec[5] == int64_t(reinterpret_cast<intptr_t>(grads[i].data())));
    // State slice: 64-byte aligned and at a 64-element boundary of its arena.
    uintptr_t state = uintptr_t(rec[6]);
    CHECK(state % 64 == 0);
    if (i == 0)
      stateBase = state;
    CHECK((state - stateBase) % (64 * sizeof(float)) == 0);
    // Zero-initialized.
    const float *s = reinterpret_cast<const float *>(state);
    bool zero = true;
    for (int64_t k = 0; k < sizes[i]; ++k)
      zero = zero && s[k] == 0.0f && !std::signbit(s[k]);
    CHECK(zero);
    const TensorInfo &ti = opt->tensor(int64_t(i));
    CHECK(ti.first_group == expectFirst);
    CHECK(ti.num_groups == (sizes[i] + 31) / 32);
    expectFirst += (sizes[i] + 31) / 32;
  }
  CHECK(opt->total_groups() == expectFirst);
  CHECK(opt->total_numel() == 1 + 31 + 33 + 1000 + 4097 + 65543);
  // The state accessor agrees with the table.
  auto v = opt->buffer(3, "momentum_buffer");
  REQUIRE(v.ok());
  CHECK(reinterpret_cast<intptr_t>(v->data) == t[3 * size_t(R) + 6]);
  CHECK(v->count == 1000);
  CHECK(v->bytes == 4000);
  CHECK(v->runtime_owned);
  auto pv = opt->buffer(3, "param");
  REQUIRE(pv.ok());
  CHECK(pv->data == params[3].data());
  CHECK_FALSE(pv->runtime_owned);
  auto bad = opt->buffer(3, "exp_avg");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("momentum_buffer") != std::string::npos);
}

TEST_CASE("per-group buffers get their own 64-entry aligned, zeroed slices") {
  std::string dir = makeBundle("adamw_like_layout", adamwLikeManifest());
  auto opt = makeOptimizer({}, dir);
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543};
  std::vector<std::vector<uint16_t>> params, grads;
  for (int64_t n : sizes) {
    params.emplace_back(size_t(n), uint16_t(0x3F80));
    grads.emplace_back(size_t(n), uint16_t(0));
    REQUIRE(opt->add_param(0, params.back().data(), n, grads.back().data()).ok());
  }
  const int64_t R = opt->manifest().record_words;
  CHECK(R == 11);
  for (const char *name : {"correction", "exp_avg.codes", "exp_avg.scales",
                           "exp_avg_sq.codes", "exp_avg_sq.scales"}) {
    int b = opt->manifest().buffer_index(name);
    REQUIRE(b >= 0);
    int width = dtype_size(opt->manifest().buffers[size_t(b)].dtype);
    uintptr_t base = uintptr_t(opt->table()[size_t(4 + b)]);
    int64_t prevEnd = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO(name << " tensor " << i);
      uintptr_t a = uintptr_t(opt->table()[i * size_t(R) + size_t(4 + b)]);
      CHECK(a % 64 == 0);
      CHECK((a - base) % uintptr_t(64 * width) == 0);
      int64_t entry = int64_t(a - base) / width;
      CHECK(entry >= prevEnd); // slices never overlap
      auto v = opt->buffer(int64_t(i), name);
      REQUIRE(v.ok());
      prevEnd = entry + v->count;
      std::vector<uint8_t> zeros(size_t(v->bytes), 0);
      CHECK(sameBits(v->data, zeros.data(), size_t(v->bytes)));
      CHECK(v->count == (std::string(name).find(".scales") != std::string::npos
                             ? (sizes[i] + 31) / 32
                             : sizes[i]));
    }
  }
}

TEST_CASE("step runs the kernel: results match a scalar reference") {
  auto opt = makeOptimizer();
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {1, 31, 33, 1000};
  std::vector<std::vector<float>> p, g, refP, refM;
  for (int64_t n : sizes) {
    p.push_back(randomVector(rng, size_t(n)));
    g.push_back(randomVector(rng, size_t(n)));
    refP.push_back(p.back());
    refM.emplace_back(size_t(n), 0.0f);
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(opt->add_param(0, p[i].data(), sizes[i], g[i].data()).ok());
  REQUIRE(opt->set_hyper(0, "lr", 0.05f).ok());
  CHECK(opt->step_count() == 0);
  for (int s = 1; s <= 4; ++s) {
    REQUIRE(opt->step().ok());
    CHECK(opt->step_count() == s);
    for (size_t i = 0; i < sizes.size(); ++i)
      referenceStep(refP[i], refM[i], g[i], 0.05f, 0.9f);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("tensor " << i);
    CHECK(sameBits(p[i].data(), refP[i].data(), p[i].size() * 4));
    auto m = opt->buffer(int64_t(i), "momentum_buffer");
    REQUIRE(m.ok());
    CHECK(sameBits(m->data, refM[i].data(), refM[i].size() * 4));
  }
}

TEST_CASE("group-aligned chunking over 1..7 threads matches one thread") {
  const std::vector<int64_t> sizes = {1, 31, 33, 1000, 4097, 65543, 31, 1, 4097};
  auto run = [&](int threads, std::vector<std::vector<float>> &p,
                 std::vector<std::vector<float>> &mOut, int64_t *calls) {
    OptimizerOptions o;
    o.threads = threads;
    o.min_groups_per_chunk = 1; // use every thread even on these sizes
    auto opt = makeOptimizer(o);
    std::mt19937 rng(42);
    std::vector<std::vector<float>> g;
    p.clear();
    for (int64_t n : sizes) {
      p.push_back(randomVector(rng, size_t(n)));
      g.push_back(randomVector(rng, size_t(n)));
    }
    int s1 = opt->add_param_group();
    REQUIRE(opt->set_hyper(s1, "lr", 0.003f).ok());
    REQUIRE(opt->set_hyper(s1, "momentum", 0.5f).ok());
    for (size_t i = 0; i < sizes.size(); ++i)
      REQUIRE(opt->add_param(int(i % 2), p[i].data(), sizes[i], g[i].data()).ok());
    std::vector<Chunk> chunks = opt->plan_chunks();
    // Chunks cover [0, total) in order, each nonempty.
    REQUIRE(!chunks.empty());
    CHECK(chunks.front().begin == 0);
    CHECK(chunks.back().end == opt->total_groups());
    for (size_t c = 0; c + 1 < chunks.size(); ++c)
      CHECK(chunks[c].end == chunks[c + 1].begin);
    CHECK(int(chunks.size()) == threads);
    auto callsFn = reinterpret_cast<CallsFn>(opt->bundle().symbol("fake_sgd_calls"));
    REQUIRE(bool(callsFn));
    int64_t before = callsFn();
    for (int s = 0; s < 3; ++s) {
      REQUIRE(opt->step().ok());
      for (auto &gv : g) // new gradients between steps
        for (float &x : gv)
          x = x * 0.5f + 0.25f;
    }
    *calls = callsFn() - before;
    mOut.clear();
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto v = opt->buffer(int64_t(i), "momentum_buffer");
      REQUIRE(v.ok());
      const float *d = static_cast<const float *>(v->data);
      mOut.emplace_back(d, d + sizes[i]);
    }
  };
  std::vector<std::vector<float>> p1, m1;
  int64_t calls1 = 0;
  run(1, p1, m1, &calls1);
  CHECK(calls1 == 3);
  for (int threads = 2; threads <= 7; ++threads) {
    std::vector<std::vector<float>> pn, mn;
    int64_t calls = 0;
    run(threads, pn, mn, &calls);
    CHECK(calls == 3 * threads);
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO("threads " << threads << ", tensor " << i << " (numel " << sizes[i]
                      << ")");
      CHECK(sameBits(pn[i].data(), p1[i].data(), p1[i].size() * 4));
      CHECK(sameBits(mn[i].data(), m1[i].data(), m1[i].size() * 4));
    }
  }
}

TEST_CASE("split_groups: boundaries are group- and 64-element aligned") {
  // Tensors of 1, 31, 33, 1000, 4097, 65543 elements with G = 32.
  std::vector<int64_t> first;
  int64_t total = 0;
  for (int64_t n : {1, 31, 33, 1000, 4097, 65543}) {
    first.push_back(total);
    total += (n + 31) / 32;
  }
  for (int n = 1; n <= 16; ++n) {
    auto chunks = split_groups(total, first, n, 1, /*align_groups=*/2);
    INFO(n << " chunks");
    REQUIRE(!chunks.empty());
    CHECK(int(chunks.size()) <= n);
    CHECK(chunks.front().begin == 0);
    CHECK(chunks.back().end == total);
    for (size_t c = 0; c < chunks.size(); ++c) {
      CHECK(chunks[c].end > chunks[c].begin);
      if (c + 1 < chunks.size()) {
        CHECK(chunks[c].end == chunks[c + 1].begin);
        int64_t b = chunks[c].end;
        size_t t = size_t(std::upper_bound(first.begin(), first.end(), b) -
                          first.begin() - 1);
        CHECK((b - first[t]) % 2 == 0); // tensor-local 64-element boundary
      }
    }
  }
  // Small problems use one chunk; the minimum chunk size caps the count.
  CHECK(split_groups(10, {0}, 8, 1024, 1).size() == 1);
  CHECK(split_groups(4096, {0}, 8, 1024, 1).size() == 4);
  CHECK(split_groups(0, {}, 8, 1, 1).empty());
  // More threads than groups: one group per chunk at most.
  CHECK(split_groups(3, {0, 1, 2}, 8, 1, 2).size() == 3);
}

TEST_CASE("default chunking keeps small problems on one thread") {
  OptimizerOptions o;
  o.threads = 4;
  auto opt = makeOptimizer(o);
  CHECK(opt->threads() == 4);
  std::vector<float> p(1000, 1.0f), g(1000, 1.0f);
  REQUIRE(opt->add_param(0, p.data(), 1000, g.data()).ok());
  CHECK(opt->plan_chunks().size() == 1);
  std::vector<float> big(1 << 20, 1.0f), bigG(1 << 20, 0.0f);
  REQUIRE(opt->add_param(0, big.data(), int64_t(big.size()), bigG.data()).ok());
  CHECK(opt->plan_chunks().size() == 4);
  REQUIRE(opt->step().ok());
  CHECK(p[0] == doctest::Approx(1.0f - 0.01f));
  REQUIRE(opt->set_threads(1).ok());
  CHECK(opt->plan_chunks().size() == 1);
  REQUIRE(opt->step().ok());
  OptimizerOptions d; // default: hardware concurrency
  auto opt2 = makeOptimizer(d);
  CHECK(opt2->threads() >= 1);
}

TEST_CASE("param groups are hyper slots with their own values") {
  auto opt = makeOptimizer();
  CHECK(opt->num_param_groups() == 1);
  int s1 = opt->add_param_group();
  int s2 = opt->add_param_group();
  CHECK(s1 == 1);
  CHECK(s2 == 2);
  REQUIRE(opt->set_hyper(1, "lr", 0.5f).ok());
  REQUIRE(opt->set_hyper(2, "momentum", 0.0f).ok());
  const std::vector<float> &h = opt->hyper_table(); // slot-major, H = 2
  REQUIRE(h.size() == 6);
  CHECK(h[0] == 0.01f);
  CHECK(h[1] == 0.9f);
  CHECK(h[2] == 0.5f);
  CHECK(h[3] == 0.9f);
  CHECK(h[4] == 0.01f);
  CHECK(h[5] == 0.0f);
  CHECK(*opt->hyper(1, "lr") == 0.5f);

  std::vector<float> p0(40, 1.0f), p1(40, 1.0f), p2(40, 1.0f), g(40, 1.0f);
  REQUIRE(opt->add_param(0, p0.data(), 40, g.data()).ok());
  REQUIRE(opt->add_param(1, p1.data(), 40, g.data()).ok());
  REQUIRE(opt->add_param(2, p2.data(), 40, g.data()).ok());
  REQUIRE(opt->step().ok());
  REQUIRE(opt->step().ok());
  // m1 = 1, m2 = m1 * momentum + 1; p = 1 - lr * (m1 + m2).
  CHECK(p0[39] == doctest::Approx(1.0 - 0.01 * (1 + 1.9)));
  CHECK(p1[39] == doctest::Approx(1.0 - 0.5 * (1 + 1.9)));
  CHECK(p2[39] == doctest::Approx(1.0 - 0.01 * 2));
  // An LR schedule: one number in the table changes, the next step sees it.
  REQUIRE(opt->set_hyper_all("lr", 0.0f).ok());
  float before = p1[0];
  REQUIRE(opt->step().ok());
  CHECK(p1[0] == before);
}

TEST_CASE("set_hyper rejects unknown names, bad groups and bad values") {
  auto opt = makeOptimizer();
  Status s = opt->set_hyper(0, "learning_rate", 0.1f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("unknown hyper-parameter \"learning_rate\"") !=
        std::string::npos);
  CHECK(s.message().find("lr, momentum") != std::string::npos);
  s = opt->set_hyper(1, "lr", 0.1f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("param group 1 does not exist") != std::string::npos);
  CHECK_FALSE(opt->set_hyper(-1, "lr", 0.1f).ok());
  CHECK_FALSE(opt->set_hyper(0, "lr", std::nanf("")).ok());
  CHECK_FALSE(opt->set_hyper(0, "lr", INFINITY).ok());
  CHECK_FALSE(opt->set_hyper_all("beta1", 0.1f).ok());
  CHECK_FALSE(opt->hyper(0, "beta1").ok());
  CHECK(*opt->hyper(0, "lr") == 0.01f); // unchanged by the failures
}

TEST_CASE("hypers without default and elided states are enforced") {
  json m = fakeManifest();
  m["hypers"][0]["default"] = nullptr; // lr must be given
  auto opt = makeOptimizer({}, makeBundle("no_default", m));
  std::vector<float> p(8, 1.0f), g(8, 1.0f);
  REQUIRE(opt->add_param(0, p.data(), 8, g.data()).ok());
  Status s = opt->step();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("\"lr\" has no default") != std::string::npos);
  CHECK(opt->step_count() == 0);
  REQUIRE(opt->set_hyper(0, "lr", 0.1f).ok());
  CHECK(opt->step().ok());

  // A bundle whose momentum buffer is elided: momentum must stay 0.
  json e = fakeManifest();
  e["hypers"][1]["default"] = 0.0;
  e["states"][0]["encoding"] = {{"kind", "elided"}};
  e["states"][0]["elidable_if_zero"] = "momentum";
  e["buffers"].erase(2);
  e["table"]["record_words"] = 6;
  e["bytes_per_param"]["states"] = 0;
  e["bytes_per_param"]["total"] = 8;
  e["bytes_per_param"]["total_with_grad_release"] = 4;
  auto opt2 = makeOptimizer({}, makeBundle("elided", e));
  CHECK(opt2->set_hyper(0, "momentum", 0.0f).ok());
  s = opt2->set_hyper(0, "momentum", 0.9f);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("elided") != std::string::npos);
}

TEST_CASE("bad manifests give errors naming the file and the field") {
  auto expectError = [](const json &m, const std::string &needle) {
    auto r = parse_manifest(m.dump(), "/some/bundle/manifest.json");
    REQUIRE_FALSE(r.ok());
    INFO(r.error());
    CHECK(r.error().rfind("/some/bundle/manifest.json: ", 0) == 0);
    CHECK(r.error().find(needle) != std::string::npos);
  };
  json m = fakeManifest();
  { json x = m; x.erase("group_size");
    expectError(x, "field 'group_size': missing"); }
  { json x = m; x["format"] = "flashopt-bundle";
    expectError(x, "field 'format': expected \"flashopt-manifest\""); }
  { json x = m; x["format_version"] = 2;
    expectError(x, "field 'format_version': unsupported version 2"); }
  { json x = m; x["group_size"] = 48;
    expectError(x, "field 'group_size': expected a power of two"); }
  { json x = m; x["param"]["dtype"] = "f64";
    expectError(x, "field 'param.dtype': expected one of bf16, f16, f32, got \"f64\""); }
  { json x = m; x["param"]["correction"] = "i8";
    expectError(x, "field 'param.correction': an f32 parameter takes no correction"); }
  { json x = m; x["hypers"][1].erase("name");
    expectError(x, "field 'hypers[1].name': missing"); }
  { json x = m; x["hypers"][1]["default"] = "0.9";
    expectError(x, "field 'hypers[1].default': expected a number or null"); }
  { json x = m; x["states"][0]["encoding"]["storage"] = "i8";
    expectError(x, "field 'states[0].encoding.storage': expected one of f32, bf16, f16"); }
  { json x = m; x["buffers"][2]["dtype"] = "bf16";
    expectError(x, "field 'buffers[2]': expected buffer \"momentum_buffer\" (f32"); }
  { json x = m; std::swap(x["buffers"][0], x["buffers"][1]);
    expectError(x, "field 'buffers[0]': expected buffer \"param\""); }
  { json x = m; x["buffers"].erase(2);
    expectError(x, "field 'buffers': has 2 entries, expected 3"); }
  { json x = m; x["table"]["record_words"] = 10;
    expectError(x, "field 'table.record_words': expected 7"); }
  { json x = m; x["bytes_per_param"]["states"] = 2.125;
    expectError(x, "field 'bytes_per_param.states': is 2.125 but the buffers give 4"); }
  { json x = m; x["kernels"][1].erase("symbol");
    expectError(x, "field 'kernels[1].symbol': missing"); }
  { json x = m; x["kernels"][2]["features"] = "avx2";
    expectError(x, "field 'kernels[2].features': expected an array"); }
  { json x = adamwLikeManifest(); x["states"][0]["encoding"]["group"] = 64;
    expectError(x, "field 'states[0].encoding.group': is 64 but group_size is 32"); }
  { json x = adamwLikeManifest(); x["states"][1]["encoding"]["compand"] = "softsign";
    expectError(x, "softsign needs i8 storage"); }
  auto r = parse_manifest("{\"format\": ", "broken.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().rfind("broken.json: invalid JSON", 0) == 0);
  r = parse_manifest("[1, 2]", "array.json");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("top level") != std::string::npos);
}

TEST_CASE("bad bundles: missing manifest, missing object, missing symbol") {
  // No manifest at all.
  auto b = Bundle::load("/nonexistent/flashopt/bundle", noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("/nonexistent/flashopt/bundle/manifest.json: cannot open") !=
        std::string::npos);
  // Invalid manifest through the loader: names the file on disk.
  json bad = fakeManifest();
  bad.erase("kernels");
  std::string dir = makeBundle("no_kernels_field", bad);
  b = Bundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find(dir + "/manifest.json: field 'kernels': missing") !=
        std::string::npos);
  // Missing shared object.
  dir = makeBundle("missing_so", fakeManifest(), /*withObjects=*/false);
  b = Bundle::load(dir, noEnv("x86-64"));
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("cannot load kernel \"fake_sgd.x86-64.so\"") !=
        std::string::npos);
  // Missing symbol.
  json m = fakeManifest();
  for (json &k : m["kernels"])
    k["symbol"] = "no_such_step";
  dir = makeBundle("missing_symbol", m);
  b = Bundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("has no symbol \"no_such_step\"") != std::string::npos);
  // Only GPU kernels.
  m = fakeManifest();
  m["kernels"] = json::array({m["kernels"][0]});
  dir = makeBundle("gpu_only", m);
  b = Bundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("no CPU kernel (targets: sm_90)") != std::string::npos);
  // A CPU kernel needing a feature no host has.
  m = fakeManifest();
  m["kernels"] = json::array({m["kernels"][1]});
  m["kernels"][0]["features"] = json::array({"avx2", "quantum-entanglement"});
  dir = makeBundle("unsupported", m);
  b = Bundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("no CPU kernel runs on this host; x86-64-v3 needs "
                       "quantum-entanglement") != std::string::npos);
  // CpuOptimizer::create passes the error through.
  auto o = CpuOptimizer::create(dir, noEnv());
  REQUIRE_FALSE(o.ok());
  CHECK(o.error().find("quantum-entanglement") != std::string::npos);
}

TEST_CASE("CPU selection: best supported flavour, forced by option or env") {
  bool v3 = host_supports_feature("avx2") && host_supports_feature("fma") &&
            host_supports_feature("f16c") && host_supports_feature("bmi2");
  CHECK(host_supports_feature("sse2") == true);
  CHECK_FALSE(host_supports_feature("no-such-feature"));

  auto b = Bundle::load(kBundle, noEnv());
  REQUIRE_MESSAGE(b.ok(), b.error());
  CHECK((*b)->kernel().cpu == (v3 ? "x86-64-v3" : "x86-64"));
  auto cpu = reinterpret_cast<CpuFn>((*b)->symbol("fake_sgd_cpu"));
  REQUIRE(bool(cpu));
  CHECK(std::string(cpu()) == (*b)->kernel().cpu);

  auto forced = Bundle::load(kBundle, noEnv("x86-64"));
  REQUIRE_MESSAGE(forced.ok(), forced.error());
  CHECK((*forced)->kernel().cpu == "x86-64");
  CHECK((*forced)->kernel_path() == kBundle + "/fake_sgd.x86-64.so");
  cpu = reinterpret_cast<CpuFn>((*forced)->symbol("fake_sgd_cpu"));
  REQUIRE(bool(cpu));
  CHECK(std::string(cpu()) == "x86-64");

  auto unknown = Bundle::load(kBundle, noEnv("x86-64-v4"));
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().find("no CPU kernel for cpu \"x86-64-v4\"") !=
        std::string::npos);
  CHECK(unknown.error().find("the bundle has: x86-64-v3, x86-64") !=
        std::string::npos);

  // The environment variable, and the option winning over it.
  ::setenv("FLASHOPT_CPU", "x86-64", 1);
  auto env = Bundle::load(kBundle);
  ::setenv("FLASHOPT_CPU", "nonsense", 1);
  auto envBad = Bundle::load(kBundle);
  LoadOptions opt;
  opt.cpu = v3 ? "x86-64-v3" : "x86-64";
  auto optWins = Bundle::load(kBundle, opt);
  ::unsetenv("FLASHOPT_CPU");
  REQUIRE_MESSAGE(env.ok(), env.error());
  CHECK((*env)->kernel().cpu == "x86-64");
  REQUIRE_FALSE(envBad.ok());
  CHECK(envBad.error().find("requested by FLASHOPT_CPU") != std::string::npos);
  REQUIRE(optWins.ok());
  CHECK((*optWins)->kernel().cpu == opt.cpu);

  // An optimizer over the forced baseline steps like any other.
  auto o = CpuOptimizer::create(*forced);
  REQUIRE(o.ok());
  std::vector<float> p(100, 1.0f), g(100, 1.0f);
  REQUIRE((*o)->add_param(0, p.data(), 100, g.data()).ok());
  REQUIRE((*o)->step().ok());
  CHECK(p[99] == 1.0f - 0.01f);
}

TEST_CASE("bytes report: exact sizes by category, per-param as the manifest") {
  auto opt = makeOptimizer();
  std::vector<float> p(1000), g(1000);
  REQUIRE(opt->add_param(0, p.data(), 1000, g.data()).ok());
  BytesReport r = opt->bytes();
  CHECK(r.numel == 1000);
  CHECK(r.param == 4000);
  CHECK(r.correction == 0);
  CHECK(r.grad == 4000);
  CHECK(r.states == 4000);
  CHECK(r.total == 12000);
  CHECK(r.total_with_grad_release == 8000);
  CHECK(r.runtime_allocated >= 4000);
  CHECK(r.runtime_allocated % 64 == 0);
  CHECK(r.per_param.total == 12.0);

  // The AdamW-shaped manifest: quantized states with f16 scales.
  auto a = makeOptimizer({}, makeBundle("adamw_like_bytes", adamwLikeManifest()));
  const int64_t n = 1 << 20; // a multiple of G: per-param is exact
  std::vector<uint16_t> bp(static_cast<size_t>(n)), bg(static_cast<size_t>(n));
  REQUIRE(a->add_param(0, bp.data(), n, bg.data()).ok());
  r = a->bytes();
  CHECK(r.param == 2 * n);
  CHECK(r.correction == n);
  CHECK(r.grad == 2 * n);
  CHECK(r.states == 2 * n + 2 * 2 * (n / 32));
  const BytesPerParam &man = a->manifest().bytes_per_param;
  CHECK(r.per_param.param == man.param);
  CHECK(r.per_param.correction == man.correction);
  CHECK(r.per_param.grad == man.grad);
  CHECK(r.per_param.states == man.states);
  CHECK(r.per_param.total == man.total);
  CHECK(r.per_param.total == 7.125);
  CHECK(r.per_param.total_with_grad_release == 5.125);
  // A small odd tensor: partial groups count whole scales.
  std::vector<uint16_t> sp(33), sg(33);
  REQUIRE(a->add_param(0, sp.data(), 33, sg.data()).ok());
  r = a->bytes();
  CHECK(r.states == 2 * (n + 33) + 2 * 2 * (n / 32 + 2));
}

TEST_CASE("grads are re-pointed between steps and errors leave t unchanged") {
  auto opt = makeOptimizer();
  std::vector<float> p(64, 0.0f), g1(64, 1.0f), g2(64, -1.0f);
  auto idx = opt->add_param(0, p.data(), 64, nullptr);
  REQUIRE(idx.ok());
  Status s = opt->step();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("tensor 0 (numel 64) has no gradient") !=
        std::string::npos);
  CHECK(opt->step_count() == 0);
  REQUIRE(opt->set_grad(*idx, g1.data()).ok());
  CHECK(opt->table()[5] == int64_t(reinterpret_cast<intptr_t>(g1.data())));
  REQUIRE(opt->step().ok()); // m = 1, p = -0.01
  REQUIRE(opt->set_grad(*idx, g2.data()).ok());
  REQUIRE(opt->step().ok()); // m = 0.9 - 1 = -0.1, p = -0.01 + 0.001
  CHECK(p[0] == doctest::Approx(-0.009));
  CHECK(opt->step_count() == 2);
  CHECK_FALSE(opt->set_grad(5, g1.data()).ok());
  // set_param re-points the parameter storage too.
  std::vector<float> q(64, 3.0f);
  REQUIRE(opt->set_param(*idx, q.data()).ok());
  REQUIRE(opt->step().ok());
  CHECK(q[0] != 3.0f);
  opt->set_step_count(100);
  REQUIRE(opt->step().ok());
  CHECK(opt->step_count() == 101);
}

TEST_CASE("add_param validates, and arena growth keeps earlier states") {
  auto opt = makeOptimizer();
  std::vector<float> p(100, 1.0f), g(100, 1.0f);
  CHECK_FALSE(opt->add_param(1, p.data(), 100, g.data()).ok());
  CHECK_FALSE(opt->add_param(0, nullptr, 100, g.data()).ok());
  auto zero = opt->add_param(0, p.data(), 0, g.data());
  REQUIRE_FALSE(zero.ok());
  CHECK(zero.error().find("numel must be > 0") != std::string::npos);
  CHECK(opt->num_tensors() == 0);

  REQUIRE(opt->add_param(0, p.data(), 100, g.data()).ok());
  REQUIRE(opt->step().ok());
  std::vector<float> m0;
  {
    auto v = opt->buffer(0, "momentum_buffer");
    REQUIRE(v.ok());
    const float *d = static_cast<const float *>(v->data);
    m0.assign(d, d + 100);
  }
  // Registering big tensors later grows the arena (it moves); the earlier
  // tensor's state is kept and the new one starts at zero.
  std::vector<std::vector<float>> more;
  for (int i = 0; i < 5; ++i) {
    more.emplace_back(size_t(100000), 2.0f);
    REQUIRE(opt->add_param(0, more.back().data(), 100000, g.data()).ok());
  }
  auto v = opt->buffer(0, "momentum_buffer");
  REQUIRE(v.ok());
  CHECK(sameBits(v->data, m0.data(), 400));
  CHECK(opt->table()[6] == int64_t(reinterpret_cast<intptr_t>(v->data)));
  auto w = opt->buffer(5, "momentum_buffer");
  REQUIRE(w.ok());
  std::vector<float> zeros(100000, 0.0f);
  CHECK(sameBits(w->data, zeros.data(), 400000));
  // g is only 100 long: give the big tensors their own gradients.
  std::vector<float> bigG(100000, 0.0f);
  for (int64_t i = 1; i <= 5; ++i)
    REQUIRE(opt->set_grad(i, bigG.data()).ok());
  REQUIRE(opt->step().ok());
  CHECK(more[4][0] == 2.0f);
}

TEST_CASE("bf16 and f16 conversions round to nearest even") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(f32_to_bf16(f32_from_bits(0x3F808000u)) == 0x3F80); // tie -> even
  CHECK(f32_to_bf16(f32_from_bits(0x3F818000u)) == 0x3F82); // tie -> even
  CHECK(f32_to_bf16(f32_from_bits(0x3F808001u)) == 0x3F81);
  CHECK(f32_to_bf16(f32_from_bits(0x7F7FFFFFu)) == 0x7F80); // overflow -> inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(65519.0f) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);
  CHECK(f32_to_f16(-1e9f) == 0xFC00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001); // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000); // tie -> even (zero)
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  // Round trip of every finite f16 and bf16 value.
  bool ok = true;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) != 0x7C00 && f32_to_f16(f16_to_f32(uint16_t(h))) != h)
      ok = false;
    if ((h & 0x7F80) != 0x7F80 && f32_to_bf16(bf16_to_f32(uint16_t(h))) != h)
      ok = false;
  }
  CHECK(ok);
}
