//===- CpuBundleTest.cpp - CPU bundle loading ----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/src/cpu/CpuBundle.cpp: bundle discovery, bad bundles (missing
/// manifest, object or symbol), and the choice of CPU flavour (best
/// supported, forced by option or by FLASHOPT_CPU).
///
//===----------------------------------------------------------------------===//

#include "RuntimeTestSupport.h"

#include <cmath>
#include <set>
#include <string_view>

using namespace flashopt::testing;

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

TEST_CASE("bad bundles: missing manifest, missing object, missing symbol") {
  // No manifest at all.
  auto b = CpuBundle::load("/nonexistent/flashopt/bundle", noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("/nonexistent/flashopt/bundle/manifest.json: cannot open") !=
        std::string::npos);
  // Invalid manifest through the loader: names the file on disk.
  json bad = fakeManifest();
  bad.erase("kernels");
  std::string dir = makeBundle("no_kernels_field", bad);
  b = CpuBundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find(dir + "/manifest.json: field 'kernels': missing") !=
        std::string::npos);
  // Missing shared object.
  dir = makeBundle("missing_so", fakeManifest(), /*withObjects=*/false);
  b = CpuBundle::load(dir, noEnv("x86-64"));
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("cannot load kernel \"fake_sgd.x86-64.so\"") !=
        std::string::npos);
  // Missing symbol.
  json m = fakeManifest();
  for (json &k : m["kernels"])
    k["symbol"] = "no_such_step";
  dir = makeBundle("missing_symbol", m);
  b = CpuBundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("has no symbol \"no_such_step\"") != std::string::npos);
  // Only GPU kernels.
  m = fakeManifest();
  m["kernels"] = json::array({m["kernels"][0]});
  dir = makeBundle("gpu_only", m);
  b = CpuBundle::load(dir, noEnv());
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().find("no CPU kernel (targets: sm_90)") != std::string::npos);
  // A CPU kernel needing a feature no host has.
  m = fakeManifest();
  m["kernels"] = json::array({m["kernels"][1]});
  m["kernels"][0]["features"] = json::array({"avx2", "quantum-entanglement"});
  dir = makeBundle("unsupported", m);
  b = CpuBundle::load(dir, noEnv());
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

  auto b = CpuBundle::load(kBundle, noEnv());
  REQUIRE_MESSAGE(b.ok(), b.error());
  CHECK((*b)->kernel().cpu == (v3 ? "x86-64-v3" : "x86-64"));
  auto cpu = reinterpret_cast<CpuFn>((*b)->symbol("fake_sgd_cpu"));
  REQUIRE(bool(cpu));
  CHECK(std::string(cpu()) == (*b)->kernel().cpu);

  auto forced = CpuBundle::load(kBundle, noEnv("x86-64"));
  REQUIRE_MESSAGE(forced.ok(), forced.error());
  CHECK((*forced)->kernel().cpu == "x86-64");
  CHECK((*forced)->kernel_path() == kBundle + "/fake_sgd.x86-64.so");
  cpu = reinterpret_cast<CpuFn>((*forced)->symbol("fake_sgd_cpu"));
  REQUIRE(bool(cpu));
  CHECK(std::string(cpu()) == "x86-64");

  auto unknown = CpuBundle::load(kBundle, noEnv("x86-64-v4"));
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().find("no CPU kernel for cpu \"x86-64-v4\"") !=
        std::string::npos);
  CHECK(unknown.error().find("the bundle has: x86-64-v3, x86-64") !=
        std::string::npos);

  // The environment variable, and the option winning over it.
  ::setenv("FLASHOPT_CPU", "x86-64", 1);
  auto env = CpuBundle::load(kBundle);
  ::setenv("FLASHOPT_CPU", "nonsense", 1);
  auto envBad = CpuBundle::load(kBundle);
  CpuLoadOptions opt;
  opt.cpu = v3 ? "x86-64-v3" : "x86-64";
  auto optWins = CpuBundle::load(kBundle, opt);
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

TEST_CASE("a manifest that disagrees with the kernel's ABI description is "
          "refused") {
  // The stand-in kernel describes (lr, momentum) and three f32 buffers; a
  // manifest with no hyper-parameters would make it read past the table.
  json m = fakeManifest();
  m["hypers"] = json::array();
  std::string dir = makeBundle("abi_mismatch", m);
  REQUIRE(load_manifest(dir + "/manifest.json").ok()); // well-formed alone
  auto b = CpuBundle::load(dir, noEnv());
  REQUIRE(!b.ok());
  CHECK(b.error().find("the manifest disagrees with kernel") != std::string::npos);
  CHECK(b.error().find("hypers lr,momentum") != std::string::npos);
  // The shipped fake bundle matches.
  CHECK(CpuBundle::load(kBundle, noEnv()).ok());
}

TEST_CASE("select_cpu_kernel: the first flavour the CPU runs, or the forced "
          "one, without a host of each kind") {
  auto entry = [](const char *cpu, std::vector<std::string> features,
                  flashopt::abi::KernelKind kind = flashopt::abi::KernelKind::Step) {
    KernelEntry k;
    k.target = "cpu";
    k.cpu = cpu;
    k.features = std::move(features);
    k.kind = kind;
    k.file = std::string("k.") + cpu + ".so";
    k.symbol = "k";
    return k;
  };
  KernelEntry gpu;
  gpu.target = "sm_90";
  Manifest m;
  m.path = "/bundles/k/manifest.json";
  m.name = "k";
  m.kernels = {gpu, entry("x86-64-v4", {"avx512f", "avx2"}),
               entry("x86-64-v3", {"avx2", "fma"}),
               entry("x86-64-v3", {"avx2", "fma"}, flashopt::abi::KernelKind::Accumulate),
               entry("x86-64", {})};
  auto only = [](std::set<std::string> have) {
    return [have](std::string_view f) { return have.count(std::string(f)) > 0; };
  };

  // The best flavour the CPU has every feature of.
  auto c = select_cpu_kernel(m, "", "", only({"avx512f", "avx2", "fma"}));
  REQUIRE_MESSAGE(c.ok(), c.error());
  CHECK(*c == 1);
  c = select_cpu_kernel(m, "", "", only({"avx2", "fma"}));
  REQUIRE(c.ok());
  CHECK(*c == 2); // the step kernel, not the accumulate one of that flavour
  c = select_cpu_kernel(m, "", "", only({}));
  REQUIRE(c.ok());
  CHECK(*c == 4);

  // Forced: that flavour, if the CPU runs it.
  c = select_cpu_kernel(m, "x86-64", "the test", only({"avx2", "fma"}));
  REQUIRE(c.ok());
  CHECK(*c == 4);
  c = select_cpu_kernel(m, "x86-64-v3", "the test", only({"avx2"}));
  REQUIRE_FALSE(c.ok());
  CHECK(c.code() == Code::Unsupported);
  CHECK(c.error() == "/bundles/k/manifest.json: the \"x86-64-v3\" kernel "
                     "(requested by the test) needs CPU features this host "
                     "lacks: fma");
  c = select_cpu_kernel(m, "arm64", "the test", only({}));
  REQUIRE_FALSE(c.ok());
  CHECK(c.code() == Code::Unsupported);
  CHECK(c.error() == "/bundles/k/manifest.json: no CPU kernel for cpu "
                     "\"arm64\" (requested by the test); the bundle has: "
                     "x86-64-v4, x86-64-v3, x86-64");

  // Nothing runs here: every flavour and what it lacks.
  Manifest newOnly = m;
  newOnly.kernels.pop_back();
  c = select_cpu_kernel(newOnly, "", "", only({"avx2"}));
  REQUIRE_FALSE(c.ok());
  CHECK(c.code() == Code::Unsupported);
  CHECK(c.error() == "/bundles/k/manifest.json: no CPU kernel runs on this "
                     "host; x86-64-v4 needs avx512f; x86-64-v3 needs fma");

  // No CPU kernel at all.
  Manifest gpuOnly = m;
  gpuOnly.kernels.resize(1);
  c = select_cpu_kernel(gpuOnly, "", "", only({}));
  REQUIRE_FALSE(c.ok());
  CHECK(c.code() == Code::Unsupported);
  CHECK(c.error() == "/bundles/k/manifest.json: field 'kernels': no CPU "
                     "kernel (targets: sm_90)");
}
