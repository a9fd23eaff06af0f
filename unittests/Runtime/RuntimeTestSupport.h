//===- RuntimeTestSupport.h - Shared fixtures of the runtime tests -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The fake bundle every runtime test uses: a hand-written C implementation
/// of the kernel ABI for a trivial SGD-with-momentum spec
/// (Inputs/fake_sgd_kernel.c), built by CMake as two CPU flavours into a
/// bundle at FLASHOPT_FAKE_SGD_BUNDLE; scratch bundles made from its
/// manifest; a plain C++ reference of its update.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_RUNTIMETESTSUPPORT_H
#define FLASHOPT_UNITTESTS_RUNTIMETESTSUPPORT_H

#include "flashopt/host/CpuOptimizer.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

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

namespace flashopt::testing {

namespace fs = std::filesystem;
using namespace flashopt::host;
using json = nlohmann::json;

inline const std::string kBundle = FLASHOPT_FAKE_SGD_BUNDLE;

/// Loads without looking at FLASHOPT_CPU, so the tests do not depend on the
/// environment they run in.
inline CpuLoadOptions noEnv(std::string cpu = "") {
  CpuLoadOptions o;
  o.cpu = std::move(cpu);
  o.use_env = false;
  return o;
}

inline json fakeManifest() {
  std::ifstream in(kBundle + "/manifest.json");
  REQUIRE(in.good());
  return json::parse(in);
}

/// This process's scratch directory, removed at exit.
inline fs::path scratchDir() {
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
inline std::string makeBundle(const std::string &name, const json &manifest,
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

inline std::unique_ptr<CpuOptimizer> makeOptimizer(const CpuOptimizerOptions &opts = {},
                                         const std::string &dir = kBundle) {
  // Other manifests laid over the stand-in kernel (layout tests) do not
  // match its ABI description; the shipped fake bundle does.
  CpuLoadOptions load = noEnv();
  load.check_kernel_abi = dir == kBundle;
  auto o = CpuOptimizer::create(dir, load, opts);
  REQUIRE_MESSAGE(o.ok(), o.error());
  return std::move(o.value());
}

/// The same update in plain C++ (f32, no contraction needed: separate ops).
inline void referenceStep(std::vector<float> &p, std::vector<float> &m,
                   const std::vector<float> &g, float lr, float momentum) {
  for (size_t i = 0; i < p.size(); ++i) {
    volatile float mi = m[i] * momentum;
    mi = mi + g[i];
    m[i] = mi;
    volatile float u = lr * mi;
    p[i] = p[i] - u;
  }
}

inline std::vector<float> randomVector(std::mt19937 &rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = d(rng);
  return v;
}

inline bool sameBits(const void *a, const void *b, size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

using CallsFn = int64_t (*)();
using CpuFn = const char *(*)();

/// A manifest shaped like adamw_bf16_m24 (bf16 param + i8 correction, bf16
/// grad, two quantized states with f16 scales), pointing at the fake kernel
/// objects: loadable and measurable, never stepped.
inline json adamwLikeManifest() {
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

/// adamwLikeManifest with 4-bit states (docs/design/4bit-states.md §1):
/// exp_avg as i4 e2m1 codes, exp_avg_sq as ui4 e3m1 codes, bf16 scales, G =
/// 32 — 6.125 B/param, 4.125 with gradient release. No kernel implements it:
/// a scratch bundle of it (makeBundle, the ABI check off) serves every
/// runtime path but stepping.
inline json adamw4bitLikeManifest() {
  json m = adamwLikeManifest();
  m["name"] = "adamw_like_4bit";
  m["states"][0]["encoding"]["storage"] = "i4";
  m["states"][0]["encoding"]["compand"] = "e2m1";
  m["states"][0]["encoding"]["scale"] = "bf16";
  m["states"][1]["encoding"]["storage"] = "ui4";
  m["states"][1]["encoding"]["compand"] = "e3m1";
  m["states"][1]["encoding"]["scale"] = "bf16";
  m["buffers"][3]["dtype"] = "i4";
  m["buffers"][4]["dtype"] = "bf16";
  m["buffers"][5]["dtype"] = "ui4";
  m["buffers"][6]["dtype"] = "bf16";
  m["bytes_per_param"]["states"] = 1.125;
  m["bytes_per_param"]["total"] = 6.125;
  m["bytes_per_param"]["total_with_grad_release"] = 4.125;
  return m;
}

#ifdef FLASHOPT_TEST_BINARY_DIR
/// Bundle `name` of the build tree's bundle directory `dir` ("kernels",
/// "kernels-accumulate"; the tree is $FLASHOPT_BINARY_DIR when set).
inline std::string builtBundle(const std::string &dir, const std::string &name) {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : FLASHOPT_TEST_BINARY_DIR) + "/" + dir + "/" + name;
}

/// A CPU optimizer over the bundle directory `path` with `threads` threads.
inline std::unique_ptr<CpuOptimizer> loadCpu(const std::string &path,
                                             int threads) {
  CpuOptimizerOptions opts;
  opts.threads = threads;
  auto o = CpuOptimizer::create(path, noEnv(), opts);
  REQUIRE_MESSAGE(o.ok(), o.error());
  return std::move(o.value());
}
#endif

} // namespace flashopt::testing

#endif // FLASHOPT_UNITTESTS_RUNTIMETESTSUPPORT_H
