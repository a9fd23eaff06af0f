//===- StateHazardsTest.cpp - 8-bit state hazards, reproduced and bounded -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The hazards of 8-bit optimizer states (docs/NUMERICS.md §8), each run
/// on the scalar reference twice: in FlashOptim's numerics, where the test
/// checks that the hazard happens (so the scenario really reaches it), and
/// in the bounded numerics, where it checks the bound. The measured factors
/// against fp32 states are printed (`NumericsTests -tc="state hazard*" -s`).
/// The kernels compute the same bits (ConformanceTests, PtxEmulatorTests);
/// bindings/python/tests/test_state_hazards.py runs the same hazards on them.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace flashopt::ref;

namespace {

/// One tensor of f32 parameters and its states, stepped by the reference.
struct Run {
  Config cfg;
  std::map<std::string, float> hypers;
  int64_t numel;
  std::vector<float> param, grad;
  std::vector<std::vector<uint8_t>> codes;  // per quantized state
  std::vector<std::vector<uint16_t>> scales; // f16 bits per group
  std::vector<std::vector<float>> plain;    // per plain state
  int64_t t = 0;

  Run(const std::string &rule, bool quantized, bool bounded, int64_t n,
      std::map<std::string, float> h)
      : hypers(std::move(h)), numel(n), param(size_t(n), 0.0f),
        grad(size_t(n), 0.0f) {
    cfg.rule = rule;
    cfg.param = DType::F32;
    cfg.correction = DType::None;
    cfg.grad = DType::F32;
    cfg.bounded = bounded;
    std::vector<Compand> companders = {Compand::Softsign};
    if (rule == "adam" || rule == "adamw")
      companders.push_back(Compand::Sqrt);
    int64_t groups = (n + 31) / 32;
    for (Compand c : companders) {
      StateEncoding e;
      e.quantized = quantized;
      e.plain = DType::F32;
      e.q = QuantEncoding{c == Compand::Softsign, c, DType::F16, 32};
      cfg.states.push_back(e);
      codes.emplace_back(size_t(n), 0);
      scales.emplace_back(size_t(groups), 0);
      plain.emplace_back(size_t(n), 0.0f);
    }
  }

  void step() {
    ++t;
    std::vector<void *> bufs = {param.data(), grad.data()};
    for (size_t k = 0; k < cfg.states.size(); ++k) {
      if (cfg.states[k].quantized) {
        bufs.push_back(codes[k].data());
        bufs.push_back(scales[k].data());
      } else {
        bufs.push_back(plain[k].data());
      }
    }
    reference_step(cfg, hypers, t, numel, bufs);
  }

  /// The decoded state k of element i.
  float state(size_t k, int64_t i) const {
    if (!cfg.states[k].quantized)
      return plain[k][size_t(i)];
    const QuantEncoding &q = cfg.states[k].q;
    int32_t code = q.isSigned ? int32_t(int8_t(codes[k][size_t(i)]))
                              : int32_t(codes[k][size_t(i)]);
    return dequantize(code, scales[k][size_t(i / 32)], q);
  }
};

enum class Mode { FlashOptim, Bounded, F32 };
const char *name(Mode m) {
  return m == Mode::FlashOptim ? "FlashOptim" : m == Mode::Bounded ? "bounded"
                                                                   : "fp32";
}
Run make(const std::string &rule, Mode m, int64_t n,
         std::map<std::string, float> h) {
  return Run(rule, m != Mode::F32, m == Mode::Bounded, n, std::move(h));
}

/// Adam's update bound in units of lr at step t (docs/NUMERICS.md §8).
float adamBound(int64_t t, float beta1 = 0.9f, float beta2 = 0.999f) {
  Rule r("adam", {{"lr", 1.0f}, {"beta1", beta1}, {"beta2", beta2}}, t);
  return r.maxUpd;
}

/// The single-element probe (shared/reference/state-hazards.md): elements
/// 1..4095 get N(0,1) gradients every step, element 0 gets `g0` at step 201
/// only. Returns element 0's largest |update| / lr over steps 202..260.
double probe(Mode m, float g0) {
  const int64_t n = 4096;
  const float lr = 1e-3f;
  Run r = make("adam", m, n, {{"lr", lr}});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst = 0;
  for (int s = 1; s <= 260; ++s) {
    for (int64_t i = 1; i < n; ++i)
      r.grad[size_t(i)] = normal(rng);
    r.grad[0] = s == 201 ? g0 : 0.0f;
    float before = r.param[0];
    r.step();
    if (s >= 202)
      worst = std::max(worst, std::fabs(double(r.param[0]) - before) / lr);
  }
  return worst;
}

/// Weights whose gradient stops: every element gets N(0, 1) gradients for
/// 200 steps, then elements 0, 64, 128, ... (one per two groups, beside 31
/// still active ones) get 0 for `after` steps. Returns each stopped
/// element's cumulative move over those steps.
std::vector<double> stoppedMoves(const std::string &rule, Mode m,
                                 std::map<std::string, float> h,
                                 int after = 1000) {
  const int64_t n = 4096;
  Run r = make(rule, m, n, std::move(h));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start;
  for (int s = 1; s <= 200 + after; ++s) {
    for (int64_t i = 0; i < n; ++i)
      r.grad[size_t(i)] = normal(rng);
    if (s > 200)
      for (int64_t i = 0; i < n; i += 64)
        r.grad[size_t(i)] = 0.0f;
    if (s == 201)
      start = r.param;
    r.step();
  }
  std::vector<double> out;
  for (int64_t i = 0; i < n; i += 64)
    out.push_back(std::fabs(double(r.param[size_t(i)]) - start[size_t(i)]));
  return out;
}

/// The largest and the median ratio of `x` to `ref`, element by element.
std::pair<double, double> ratios(const std::vector<double> &x,
                                 const std::vector<double> &ref) {
  std::vector<double> q;
  for (size_t i = 0; i < x.size(); ++i)
    q.push_back(x[i] / std::max(ref[i], 1e-30));
  std::sort(q.begin(), q.end());
  return {q.back(), q[q.size() / 2]};
}

} // namespace

TEST_CASE("state hazard: v code 0 while m keeps a code (Adam)") {
  // g0 = 3e-2 in a group of N(0,1): v rounds to code 0 (v / v_max below
  // (0.5/255)^2), m does not, and the next steps divide m by eps.
  double fp32 = probe(Mode::F32, 3e-2f);
  double flash = probe(Mode::FlashOptim, 3e-2f);
  double bounded = probe(Mode::Bounded, 3e-2f);
  MESSAGE("probe g0 = 3e-2, largest |update| / lr: fp32 " << fp32
          << ", FlashOptim " << flash << " (" << flash / fp32
          << "x), bounded " << bounded << " (" << bounded / fp32 << "x)");
  CHECK(flash > 1e4 * fp32); // the hazard, reproduced
  CHECK(bounded <= adamBound(260) * (1 + 1e-6));
}

TEST_CASE("state hazard: Adam's bound holds on every probe, fp32 never "
          "touches it") {
  for (float g0 : {1.0f, 1e-1f, 1e-2f, 1e-3f}) {
    double fp32 = probe(Mode::F32, g0);
    double bounded = probe(Mode::Bounded, g0);
    INFO("g0 = " << g0 << ": fp32 " << fp32 << ", bounded " << bounded);
    CHECK(bounded <= adamBound(260) * (1 + 1e-6));
    CHECK(fp32 < adamBound(202));
  }
  // The bound at the start of training, and its limit: K sqrt(bc2) / bc1
  // with K^2 = (1 - b1)^2 S_t / (1 - b2).
  CHECK(adamBound(1) == doctest::Approx(1.0 * 1.00390625).epsilon(1e-5));
  CHECK(adamBound(100000) ==
        doctest::Approx(0.1 / std::sqrt(0.001 * (1 - 0.81 / 0.999)) *
                        1.00390625)
            .epsilon(1e-4));
}

TEST_CASE("state hazard: sticky codes after a gradient stops (Adam, SGD "
          "momentum)") {
  // 0.9 x (a small code) re-encodes to the same code while other elements
  // hold the group's scale: FlashOptim's momentum stays, and the weight is
  // pushed by the same amount every step, where fp32's update decays.
  struct Case {
    std::string rule;
    std::map<std::string, float> h;
    float lr;
  } cases[] = {{"adam", {{"lr", 1e-3f}}, 1e-3f},
               {"adamw", {{"lr", 1e-3f}, {"weight_decay", 0.0f}}, 1e-3f},
               {"sgd", {{"lr", 1e-2f}, {"momentum", 0.9f}}, 1e-2f}};
  for (const Case &c : cases) {
    std::vector<double> ref = stoppedMoves(c.rule, Mode::F32, c.h);
    std::vector<double> flash = stoppedMoves(c.rule, Mode::FlashOptim, c.h);
    std::vector<double> bounded = stoppedMoves(c.rule, Mode::Bounded, c.h);
    auto fr = ratios(flash, ref), br = ratios(bounded, ref);
    MESSAGE(c.rule << ": cumulative move over 1000 steps after the gradient "
                      "stops, vs fp32 states: FlashOptim largest "
                   << fr.first << "x (median " << fr.second
                   << "x), bounded largest " << br.first << "x (median "
                   << br.second << "x)");
    CHECK(fr.second > 2.0); // sticky codes keep pushing
    // Bounded: at most twice fp32's move, up to one lr (an 8-bit code's
    // resolution for weights fp32 barely moves).
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO(c.rule << " weight " << i * 64 << ": fp32 " << ref[i]
                  << ", bounded " << bounded[i]);
      CHECK(bounded[i] <= std::max(2.0 * ref[i], ref[i] + c.lr));
    }
  }
}

TEST_CASE("state hazard: Lion's momentum freezes after its gradient stops") {
  // beta2 = 0.99: a code k re-encodes to itself while 0.01 k < 1/2, so a
  // paused weight's momentum freezes at a few codes of its group's scale,
  // where fp32's decays 0.99^t. When the weight's gradient returns small
  // and of the other sign, no increment of 0.01 g registers: FlashOptim
  // keeps moving the weight the old way for good.
  const int64_t n = 4096;
  auto run = [&](Mode m) {
    Run r = make("lion", m, n, {{"lr", 1e-3f}});
    std::mt19937 rng(13);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> sign, start;
    for (int s = 1; s <= 800; ++s) {
      for (int64_t i = 0; i < n; ++i)
        r.grad[size_t(i)] = normal(rng);
      if (s == 200)
        for (int64_t i = 0; i < n; i += 64)
          sign.push_back(r.grad[size_t(i)] > 0 ? 1.0f : -1.0f);
      if (s > 200)
        for (int64_t i = 0, k = 0; i < n; i += 64, ++k)
          r.grad[size_t(i)] = s <= 500 ? 0.0f : -0.01f * sign[size_t(k)];
      if (s == 501)
        start = r.param;
      r.step();
    }
    // The move over the 300 steps of the reversed gradient, along it.
    std::vector<double> along;
    for (int64_t i = 0, k = 0; i < n; i += 64, ++k)
      along.push_back((double(r.param[size_t(i)]) - start[size_t(i)]) *
                      sign[size_t(k)] / 1e-3);
    return along;
  };
  auto summary = [](const std::vector<double> &x) {
    int against = 0;
    double sum = 0;
    for (double v : x) {
      against += v < 0;
      sum += v;
    }
    return std::make_pair(against, sum / double(x.size()));
  };
  auto ref = summary(run(Mode::F32));
  auto flash = summary(run(Mode::FlashOptim));
  auto bounded = summary(run(Mode::Bounded));
  MESSAGE("Lion, 300 steps of a small reversed gradient after 300 paused "
          "steps: weights still moving against it (of 64) and mean move "
          "along it in lr: fp32 "
          << ref.first << ", " << ref.second << "; FlashOptim " << flash.first
          << ", " << flash.second << "; bounded " << bounded.first << ", "
          << bounded.second);
  CHECK(ref.first == 0);
  CHECK(flash.first >= 10);  // stale momentum wins
  CHECK(bounded.first == 0); // the momentum decayed: the gradient wins
  CHECK(bounded.second >= 0.9 * ref.second);
}

TEST_CASE("state hazard: an f16 scale that overflows (a finite gradient "
          "spike)") {
  // One element's gradient of 1e6 makes its group's momentum absmax 1e5,
  // beyond f16: FlashOptim stores an inf scale, and at the next step all
  // 32 weights of the group decode inf or NaN (code 0 times inf).
  for (Mode m : {Mode::FlashOptim, Mode::Bounded}) {
    Run r = make("adam", m, 64, {{"lr", 1e-3f}});
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int nonFinite = 0;
    for (int s = 1; s <= 3; ++s) {
      for (int64_t i = 0; i < 64; ++i)
        r.grad[size_t(i)] = normal(rng);
      if (s == 1)
        r.grad[5] = 1e6f;
      r.step();
    }
    for (int64_t i = 0; i < 64; ++i)
      nonFinite += !std::isfinite(r.param[size_t(i)]);
    INFO(name(m) << ": " << nonFinite << " of 64 weights not finite");
    if (m == Mode::FlashOptim)
      CHECK(nonFinite >= 31);
    else
      CHECK(nonFinite == 0);
  }
}

TEST_CASE("state hazard: an f16 scale that underflows (tiny gradients)") {
  // Gradients near 1e-7: sqrt(v) ~ 3e-9 flushes v's f16 scale to 0 while
  // m's (~1e-7, an f16 subnormal) survives: v decodes 0 and the update is
  // m / eps.
  for (Mode m : {Mode::F32, Mode::FlashOptim, Mode::Bounded}) {
    Run r = make("adam", m, 256, {{"lr", 1e-3f}});
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    double worst = 0;
    for (int s = 1; s <= 50; ++s) {
      for (int64_t i = 0; i < 256; ++i)
        r.grad[size_t(i)] = 3e-7f * normal(rng);
      std::vector<float> before = r.param;
      r.step();
      for (int64_t i = 0; i < 256; ++i)
        worst = std::max(worst, std::fabs(double(r.param[size_t(i)]) -
                                          before[size_t(i)]) /
                                    1e-3);
    }
    MESSAGE(std::string(name(m)) << ": largest |update| / lr with gradients ~3e-7: "
                    << worst);
    if (m == Mode::F32)
      CHECK(worst < 7.3);
    else if (m == Mode::FlashOptim)
      CHECK(worst > 10.0);
    else
      CHECK(worst <= adamBound(50) * (1 + 1e-6));
  }
}

TEST_CASE("bounded numerics: the dither is the documented sequence") {
  // u = ((i * 12367 + t * 10125) mod 2^14) / 2^14, i and t modulo 2^32.
  CHECK(dither(0, 0) == 0.0f);
  CHECK(dither(1, 0) == 12367.0f / 16384.0f);
  CHECK(dither(0, 1) == 10125.0f / 16384.0f);
  CHECK(dither(int64_t(1) << 32, 1) == dither(0, 1));
  CHECK(dither(3, (int64_t(1) << 32) + 2) == dither(3, 2));
  // Over any 2^14 consecutive steps an element sees every offset once:
  // its rounding is unbiased over time.
  std::vector<int> seen(16384, 0);
  for (int64_t t = 1000; t < 1000 + 16384; ++t)
    ++seen[size_t(dither(77, t) * 16384.0f)];
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  // Neighbouring elements at one step are spread over [0, 1): the largest
  // gap among 32 is 0.13 (a uniform random draw: about 0.15).
  std::vector<float> u;
  for (int64_t i = 0; i < 32; ++i)
    u.push_back(dither(i, 5));
  std::sort(u.begin(), u.end());
  for (size_t k = 1; k < u.size(); ++k)
    CHECK(u[k] - u[k - 1] < 0.15f);
}

TEST_CASE("bounded numerics: with fp32 states Adam's bound never acts") {
  // The clamp B_t = |lr| (1 + 2^-8) K_t sits above everything exact Adam
  // can reach, rounding included: fp32-state Adam computes the same bits
  // with and without it. The gradients include the case where the
  // Cauchy-Schwarz bound is tight (each step's gradient beta2 / beta1 times
  // the last, so that m_hat / sqrt(v_hat) approaches K_t), heavy tails,
  // zero streaks and sign flips.
  const std::vector<std::pair<float, float>> betas = {
      {0.9f, 0.999f}, {0.9f, 0.95f}, {0.99f, 0.9f}, {0.5f, 0.999f}};
  for (auto [b1, b2] : betas)
    for (const char *rule : {"adam", "adamw"}) {
      std::map<std::string, float> h = {
          {"lr", 1e-3f}, {"beta1", b1}, {"beta2", b2}, {"eps", 0.0f}};
      Run clamped(rule, false, true, 64, h), free(rule, false, false, 64, h);
      std::mt19937 rng(3);
      std::cauchy_distribution<float> cauchy(0.0f, 1.0f);
      double closest = 0;
      for (int s = 1; s <= 400; ++s) {
        for (int64_t i = 0; i < 64; ++i) {
          float g;
          if (i < 16) // tight: geometric growth, restarted every 50 steps
            g = (i % 2 ? -1.0f : 1.0f) * std::pow(b2 / b1, float(s % 50)) *
                (1.0f + float(i) / 16.0f);
          else if (i < 32) // heavy tails
            g = cauchy(rng);
          else if (i < 48) // a burst, then zeros
            g = (s % 100) < 3 ? 1e3f * float(i) : 0.0f;
          else // sign flips
            g = (s % 2 ? 1.0f : -1.0f) * float(i - 47);
          clamped.grad[size_t(i)] = free.grad[size_t(i)] = g;
        }
        std::vector<float> before = free.param;
        clamped.step();
        free.step();
        for (int64_t i = 0; i < 64 && s > 1; ++i) // at t = 1, K_1 = 1 is exact
          closest = std::max(
              closest, std::fabs(double(free.param[size_t(i)]) -
                                 before[size_t(i)]) /
                           double(adamBound(s, b1, b2) * 1e-3f / 1.00390625f));
        REQUIRE(clamped.param == free.param);
      }
      INFO(std::string(rule) << " betas " << b1 << ", " << b2);
      MESSAGE(std::string(rule) << " betas (" << b1 << ", " << b2
                   << "): largest fp32 update / K_t lr = " << closest);
      // The tight gradients really approach the bound after the first step
      // (so the test can see a margin that is too small).
      CHECK(closest > 0.9);
    }
}
