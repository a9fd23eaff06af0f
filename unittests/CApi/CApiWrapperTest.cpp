//===- CApiWrapperTest.cpp - Embedded bundles, C, C++ wrapper, threads
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Embedded bundles, the lifetime of info strings, threads with a
/// thread-local last error, the ABI from C, and the C++ wrapper.
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

using namespace capitest;

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
  CHECK(flashopt_dtype_bits(FLASHOPT_I16) == 16);
  CHECK(flashopt_dtype_bits(FLASHOPT_F32) == 32);
  CHECK(flashopt_dtype_bits(FLASHOPT_U8) == 8);
  // The packed 4-bit codes: no whole bytes per element.
  CHECK(std::string(flashopt_dtype_name(FLASHOPT_I4)) == "i4");
  CHECK(std::string(flashopt_dtype_name(FLASHOPT_U4)) == "ui4");
  CHECK(flashopt_dtype_size(FLASHOPT_I4) == 0);
  CHECK(flashopt_dtype_size(FLASHOPT_U4) == 0);
  CHECK(flashopt_dtype_bits(FLASHOPT_I4) == 4);
  CHECK(flashopt_dtype_bits(FLASHOPT_U4) == 4);
  CHECK(flashopt_dtype_bits(flashopt_dtype(8)) == 0);
  CHECK(flashopt_dtype_name(flashopt_dtype(8)) == nullptr);
  // flashopt_buffer_size is the size read/write_buffer take.
  for (const char *b : {"correction", "exp_avg.codes", "exp_avg.scales",
                        "exp_avg_sq.codes", "exp_avg_sq.scales"}) {
    CAPTURE(b);
    size_t bytes = 0;
    REQUIRE(flashopt_buffer_size(s.opt, 17, b, &bytes) == FLASHOPT_OK);
    std::vector<uint8_t> v(bytes);
    CHECK(flashopt_read_buffer(s.opt, 17, b, v.data(), bytes) == FLASHOPT_OK);
    CHECK(flashopt_read_buffer(s.opt, 17, b, v.data(), bytes + 1) ==
          FLASHOPT_ERROR_SIZE);
  }
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
