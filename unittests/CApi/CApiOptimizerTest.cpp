//===- CApiOptimizerTest.cpp - One optimizer: figures, schedules, buffers
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// On adamw_bf16_m24: the memory report and checkpoint size figures, LR
/// schedules, set_grads, the NaN/Inf policy, buffers and the master codec,
/// check_numerics.
///
//===----------------------------------------------------------------------===//

#include "CApiTestSupport.h"

using namespace capitest;

//===----------------------------------------------------------------------===//
// adamw_bf16_m24: figures, schedules, policies, numerics
//===----------------------------------------------------------------------===//


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
