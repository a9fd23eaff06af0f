//===- CustomRuleTest.cpp - Optimizers that exist only as rule files -------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// examples/custom-rules/ holds two optimizers that no C++ code knows:
/// signSGD and Adam with epsilon inside the square root. flashopt-gen
/// compiled their spec files at build time; these tests step the generated
/// kernels through the host harness and compare with the formulas written
/// out here in the rules' exact f32 operation order.
///
//===----------------------------------------------------------------------===//

#include "flashopt/host/CpuOptimizer.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace flashopt::host;

namespace {

std::string bundleDir(const std::string &name) {
  const char *bin = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(bin ? bin : ".") + "/kernels/" + name;
}

bool sameBits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

} // namespace

TEST_CASE("custom rule file: signSGD steps exactly as written") {
  auto opt = CpuOptimizer::create(bundleDir("sign_sgd_f32"), CpuLoadOptions{},
                               CpuOptimizerOptions{2, 1});
  REQUIRE_MESSAGE(opt.ok(), opt.error());
  Optimizer &o = **opt;
  CHECK(o.manifest().rule == "file:sign_sgd.mlir");
  // The spec's defaults reached the kernel's hyper table.
  CHECK(*o.hyper(0, "lr") == doctest::Approx(0.01f));
  CHECK(*o.hyper(0, "weight_decay") == doctest::Approx(0.1f));

  const int64_t sizes[] = {1, 33, 1000, 4097};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> params, grads, expected;
  for (int64_t n : sizes) {
    params.emplace_back(n);
    grads.emplace_back(n);
    for (int64_t i = 0; i < n; ++i) {
      params.back()[i] = normal(rng);
      grads.back()[i] = (i % 5 == 0) ? 0.0f : normal(rng);
    }
    expected.push_back(params.back());
  }
  for (size_t t = 0; t < params.size(); ++t)
    REQUIRE(o.add_param(0, params[t].data(), sizes[t], grads[t].data()).ok());

  const float lr = 0.01f, wd = 0.1f;
  const float dec = 1.0f - lr * wd;
  for (int step = 0; step < 3; ++step) {
    REQUIRE(o.step().ok());
    for (size_t t = 0; t < params.size(); ++t)
      for (int64_t i = 0; i < sizes[t]; ++i) {
        float g = grads[t][i];
        float s = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
        float decayed = expected[t][i] * dec;
        expected[t][i] = decayed - s * lr;
      }
  }
  int mismatches = 0;
  for (size_t t = 0; t < params.size(); ++t)
    for (int64_t i = 0; i < sizes[t]; ++i)
      mismatches += !sameBits(params[t][i], expected[t][i]);
  CHECK(mismatches == 0);
}

TEST_CASE("custom rule file: Adam with eps inside the sqrt") {
  auto opt = CpuOptimizer::create(bundleDir("adam_eps_inside_f32"), CpuLoadOptions{},
                               CpuOptimizerOptions{1, 1});
  REQUIRE_MESSAGE(opt.ok(), opt.error());
  Optimizer &o = **opt;
  REQUIRE(o.set_hyper(0, "lr", 0.05f).ok());
  REQUIRE(o.set_hyper(0, "eps", 1e-6f).ok());
  const int64_t n = 777;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), g(n), ep(n), m(n, 0.0f), v(n, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    ep[i] = p[i] = normal(rng);
  REQUIRE(o.add_param(0, p.data(), n, g.data()).ok());

  const float lr = 0.05f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f;
  for (int t = 1; t <= 4; ++t) {
    for (int64_t i = 0; i < n; ++i)
      g[i] = normal(rng);
    REQUIRE(o.step().ok());
    // The rule, in its f32 order; flashopt.powi is beta^t correctly rounded
    // to f32 (docs/NUMERICS.md §3): for t <= 4 the binary128 product of
    // 24-bit factors is exact, so one narrowing is the correct rounding.
    auto powi = [](float x, int64_t k) {
      __float128 r = 1;
      for (int64_t i = 0; i < k; ++i)
        r *= __float128(x);
      return float(r);
    };
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    float bc1 = 1.0f - powi(beta1, t), bc2 = 1.0f - powi(beta2, t);
    for (int64_t i = 0; i < n; ++i) {
      float mb = m[i] * beta1;
      float gb = g[i] * omb1;
      m[i] = mb + gb;
      float vb = v[i] * beta2;
      float gg = g[i] * g[i];
      float ggb = gg * omb2;
      v[i] = vb + ggb;
      float mh = m[i] / bc1, vh = v[i] / bc2;
      float num = lr * mh;
      float ve = vh + eps;
      float den = std::sqrt(ve);
      float upd = num / den;
      ep[i] = ep[i] - upd;
    }
  }
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i)
    mismatches += !sameBits(p[i], ep[i]);
  CHECK(mismatches == 0);
  // The states live in the runtime as plain f32 and match too.
  auto mv = o.buffer(0, "m");
  REQUIRE(mv.ok());
  const float *mk = static_cast<const float *>(mv->data);
  int stateMismatches = 0;
  for (int64_t i = 0; i < n; ++i)
    stateMismatches += !sameBits(mk[i], m[i]);
  CHECK(stateMismatches == 0);
}
