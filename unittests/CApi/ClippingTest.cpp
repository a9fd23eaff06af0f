//===- ClippingTest.cpp - Gradient-norm clipping through the C ABI
//----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_set_max_grad_norm: the global norm (double, fixed order, any
/// thread count), the clip factor folded into the kernels' grad_scale for
/// one step (bit for bit the same as setting grad_scale by hand), nothing
/// changed below the threshold, grad_scale restored, and misuse refused.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

std::string kernelsDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : FLASHOPT_TEST_BINARY_DIR) + "/kernels/";
}

struct Sgd {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<std::vector<float>> p, g;
  explicit Sgd(const std::vector<int64_t> &sizes, int threads = 1,
               uint32_t seed = 7) {
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE(flashopt_context_set_threads(ctx, threads) == FLASHOPT_OK);
    REQUIRE(flashopt_optimizer_create(ctx, (kernelsDir() + "sgd_f32").c_str(),
                                      &opt) == FLASHOPT_OK);
    REQUIRE(flashopt_set_hyper(opt, -1, "lr", 0.5) == FLASHOPT_OK);
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < sizes.size(); ++i) {
      p.emplace_back(size_t(sizes[i]), 1.0f);
      g.emplace_back(size_t(sizes[i]));
      for (float &x : g.back())
        x = d(rng);
      int64_t idx;
      REQUIRE(flashopt_add_param(opt, 0, nullptr, p[i].data(), FLASHOPT_F32,
                                 sizes[i], g[i].data(), FLASHOPT_F32,
                                 &idx) == FLASHOPT_OK);
    }
  }
  ~Sgd() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  double norm() const {
    double s = 0.0;
    for (const auto &t : g) {
      double st = 0.0;
      for (float x : t)
        st += double(x) * double(x);
      s += st;
    }
    return std::sqrt(s);
  }
};

} // namespace

TEST_CASE("clipping: the factor is folded into grad_scale for one step") {
  const std::vector<int64_t> sizes = {1, 33, 1000};
  Sgd a(sizes), b(sizes);
  const double norm = a.norm();
  const double maxNorm = norm / 4.0;
  REQUIRE(flashopt_set_max_grad_norm(a.opt, maxNorm) == FLASHOPT_OK);
  double got = 0.0;
  REQUIRE(flashopt_get_grad_norm(a.opt, &got) == FLASHOPT_OK);
  CHECK(got == -1.0); // nothing computed yet
  REQUIRE(flashopt_step(a.opt) == FLASHOPT_OK);
  REQUIRE(flashopt_get_grad_norm(a.opt, &got) == FLASHOPT_OK);
  CHECK(got == norm); // one piece per tensor: the same order as here
  // By hand: grad_scale = float(max / (norm + 1e-6)).
  const float clip = float(maxNorm / (norm + 1e-6));
  REQUIRE(flashopt_set_hyper(b.opt, -1, "grad_scale", double(clip)) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_step(b.opt) == FLASHOPT_OK);
  for (size_t i = 0; i < sizes.size(); ++i)
    CHECK(std::memcmp(a.p[i].data(), b.p[i].data(), a.p[i].size() * 4) == 0);
  // The scale was restored, and the update really is smaller.
  double gs = 0.0;
  REQUIRE(flashopt_get_hyper(a.opt, 0, "grad_scale", &gs) == FLASHOPT_OK);
  CHECK(gs == 1.0);
  CHECK(std::fabs(a.p[2][5] - 1.0f) <
        std::fabs(0.5f * a.g[2][5]) + 1e-7f); // |lr * g * clip| < |lr * g|
}

TEST_CASE("clipping: below the threshold nothing changes") {
  const std::vector<int64_t> sizes = {31, 4097};
  Sgd a(sizes), b(sizes);
  REQUIRE(flashopt_set_max_grad_norm(a.opt, a.norm() * 2.0) == FLASHOPT_OK);
  REQUIRE(flashopt_step(a.opt) == FLASHOPT_OK);
  REQUIRE(flashopt_step(b.opt) == FLASHOPT_OK);
  for (size_t i = 0; i < sizes.size(); ++i)
    CHECK(std::memcmp(a.p[i].data(), b.p[i].data(), a.p[i].size() * 4) == 0);
}

TEST_CASE("clipping: the norm has the same bits for any thread count") {
  const std::vector<int64_t> sizes = {300000, 70000, 5};
  Sgd one(sizes, 1), two(sizes, 2);
  REQUIRE(flashopt_set_max_grad_norm(one.opt, 1.0) == FLASHOPT_OK);
  REQUIRE(flashopt_set_max_grad_norm(two.opt, 1.0) == FLASHOPT_OK);
  REQUIRE(flashopt_step(one.opt) == FLASHOPT_OK);
  REQUIRE(flashopt_step(two.opt) == FLASHOPT_OK);
  double n1 = 0, n2 = 0;
  REQUIRE(flashopt_get_grad_norm(one.opt, &n1) == FLASHOPT_OK);
  REQUIRE(flashopt_get_grad_norm(two.opt, &n2) == FLASHOPT_OK);
  CHECK(std::memcmp(&n1, &n2, sizeof n1) == 0);
  CHECK(n1 == doctest::Approx(one.norm()).epsilon(1e-12));
  for (size_t i = 0; i < sizes.size(); ++i)
    CHECK(std::memcmp(one.p[i].data(), two.p[i].data(), one.p[i].size() * 4) ==
          0);
}

TEST_CASE("clipping: misuse is refused and changes nothing") {
  Sgd a({64});
  CHECK(flashopt_set_max_grad_norm(a.opt, -1.0) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_set_max_grad_norm(a.opt, NAN) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  REQUIRE(flashopt_set_max_grad_norm(a.opt, 1.0) == FLASHOPT_OK);
  CHECK(flashopt_step_param(a.opt, 0) == FLASHOPT_ERROR_STATE);
  CHECK(std::string(flashopt_last_error()).find("clipping") !=
        std::string::npos);
  CHECK(a.p[0][0] == 1.0f);
  REQUIRE(flashopt_set_max_grad_norm(a.opt, 0.0) == FLASHOPT_OK); // off
  CHECK(flashopt_step_param(a.opt, 0) == FLASHOPT_OK);
}
