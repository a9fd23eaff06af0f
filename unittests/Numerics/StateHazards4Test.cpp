//===- StateHazards4Test.cpp - the state hazards at 4 bits -----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every hazard scenario of StateHazardsTest.cpp with 4-bit states
/// (docs/NUMERICS.md §2e: e2m1 m, zero-free e3m1 v, bf16 power-of-two scales,
/// independent dither streams), on the scalar reference: each run with the
/// codes rounded to nearest and no bound ("nearest 4-bit", to show that the
/// scenario reaches a 4-bit hazard) and in the bounded numerics (the
/// shipped 4-bit bundles; ConformanceTests and PtxEmulatorTests pin that
/// they compute these bits). The factors against fp32 states are printed
/// (`NumericsTests -tc="4-bit*" -s`); the bars are those of the 8-bit
/// tests where 4-bit codes meet them, and otherwise the 4-bit ones written
/// at each case (docs/NUMERICS.md §8.7 has these numbers; §8.1's scorecard the
/// kernels' through the binding).
///
//===----------------------------------------------------------------------===//

#include "StateHazardRuns.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace flashopt::ref;
using namespace flashopt::ref::hazards;

TEST_CASE("4-bit state hazard: v code 0 while m keeps a code (Adam)") {
  // The zero-free v (e3m1: V(0) = 2^-8 of the scale) has no code 0 to
  // divide by: even rounded to nearest, the update stays finite. Adam's
  // bound holds the bounded codes.
  double fp32 = probe(Mode::F32, 3e-2f);
  double nearest = probe(Mode::Nearest4, 3e-2f);
  double bounded = probe(Mode::Bounded4, 3e-2f);
  MESSAGE("4-bit probe g0 = 3e-2, largest |update| / lr: fp32 "
          << fp32 << ", nearest 4-bit " << nearest << " (" << nearest / fp32
          << "x), bounded 4-bit " << bounded << " (" << bounded / fp32
          << "x)");
  CHECK(std::isfinite(nearest));
  CHECK(bounded <= adamBound(260) * (1 + 1e-6));
}

TEST_CASE("4-bit state hazard: Adam's bound holds on every probe") {
  for (float g0 : {1.0f, 1e-1f, 1e-2f, 1e-3f}) {
    double bounded = probe(Mode::Bounded4, g0);
    INFO("g0 = " << g0 << ": bounded 4-bit " << bounded);
    CHECK(bounded <= adamBound(260) * (1 + 1e-6));
  }
}

TEST_CASE("4-bit state hazard: sticky codes after a gradient stops (Adam, "
          "SGD momentum)") {
  // Rounded to nearest, a 4-bit code of a stopped weight re-encodes to
  // itself (0.9 x code rounds back up) and keeps pushing; dithered, it
  // decays as fp32's in expectation (the median), with the noise of a
  // 4-bit decision per step (the largest).
  for (const StoppedCase &c : stoppedCases()) {
    std::vector<double> ref = stoppedMoves(c.rule, Mode::F32, c.h);
    std::vector<double> nearest = stoppedMoves(c.rule, Mode::Nearest4, c.h);
    std::vector<double> bounded = stoppedMoves(c.rule, Mode::Bounded4, c.h);
    auto nr = ratios(nearest, ref), br = ratios(bounded, ref);
    double worstOver = 0; // the largest move beyond fp32's, in lr
    for (size_t i = 0; i < ref.size(); ++i)
      worstOver = std::max(worstOver, (bounded[i] - ref[i]) / c.lr);
    MESSAGE(c.rule << " at 4 bits: cumulative move over 1000 steps after the "
                      "gradient stops, vs fp32 states: nearest largest "
                   << nr.first << "x (median " << nr.second
                   << "x), bounded largest " << br.first << "x (median "
                   << br.second << "x), at most " << worstOver
                   << " lr beyond fp32's");
    CHECK(nr.second > 2.0); // the hazard, reached: sticky codes keep pushing
    // Bounded: unbiased decay (the median within [0.8, 1.25] of fp32's).
    CHECK(br.second >= 0.8);
    CHECK(br.second <= 1.25);
  }
}

TEST_CASE("4-bit state hazard: Lion's momentum freezes after its gradient "
          "stops") {
  auto ref = lionReversal(Mode::F32);
  auto nearest = lionReversal(Mode::Nearest4);
  auto bounded = lionReversal(Mode::Bounded4);
  MESSAGE("Lion at 4 bits, 300 steps of a small reversed gradient after 300 "
          "paused steps: weights still moving against it (of 64) and mean "
          "move along it in lr: fp32 "
          << ref.first << ", " << ref.second << "; nearest 4-bit "
          << nearest.first << ", " << nearest.second << "; bounded 4-bit "
          << bounded.first << ", " << bounded.second);
  CHECK(ref.first == 0);
  CHECK(nearest.first >= 10); // stale momentum wins
  CHECK(bounded.first == 0);  // the momentum decayed: the gradient wins
  CHECK(bounded.second >= 0.9 * ref.second);
}

TEST_CASE("4-bit state hazard: a gradient spike and tiny gradients keep "
          "every weight finite and bounded") {
  // bf16 scales (4-bit codes refuse f16 ones): a spike of 1e6 is in range,
  // and gradients near 3e-7 neither flush a scale nor leave v at its
  // floor under a live m beyond the bound.
  {
    Run r = make("adam", Mode::Bounded4, 64, {{"lr", 1e-3f}});
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int s = 1; s <= 3; ++s) {
      for (int64_t i = 0; i < 64; ++i)
        r.grad[size_t(i)] = normal(rng);
      if (s == 1)
        r.grad[5] = 1e6f;
      r.step();
    }
    int nonFinite = 0;
    for (int64_t i = 0; i < 64; ++i)
      nonFinite += !std::isfinite(r.param[size_t(i)]);
    CHECK(nonFinite == 0);
  }
  Run r = make("adam", Mode::Bounded4, 256, {{"lr", 1e-3f}});
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
  MESSAGE("bounded 4-bit: largest |update| / lr with gradients ~3e-7: "
          << worst);
  CHECK(worst <= adamBound(50) * (1 + 1e-6));
}

TEST_CASE("4-bit state hazard: an outlier channel (AdamW)") {
  auto ref = outlierChannel(Mode::F32);
  auto nearest = outlierChannel(Mode::Nearest4);
  auto bounded = outlierChannel(Mode::Bounded4);
  MESSAGE("outlier channel at 4 bits, small elements over 1000 steps (lr "
          "units): mean signed move fp32 "
          << ref.first << ", nearest 4-bit " << nearest.first
          << ", bounded 4-bit " << bounded.first << "; largest move fp32 "
          << ref.second << ", nearest 4-bit " << nearest.second << " ("
          << nearest.second / ref.second << "x), bounded 4-bit "
          << bounded.second << " (" << bounded.second / ref.second << "x)");
  // Bounded: no drift beyond +-5 lr, no element moved 3 times as far as
  // fp32's farthest (the 8-bit bars are 2 lr and 2x).
  CHECK(std::fabs(bounded.first) <= 5.0);
  CHECK(bounded.second <= 3.0 * ref.second);
}

TEST_CASE("4-bit state hazard: absent tokens (AdamW)") {
  for (float beta2 : {0.99f, 0.999f, 0.9999f}) {
    int absent = int(std::min(3000.0, std::ceil(std::log(1e-6) /
                                                std::log(double(beta2)))));
    auto ref = absentTokens(Mode::F32, beta2, absent);
    auto nearest = absentTokens(Mode::Nearest4, beta2, absent);
    auto bounded = absentTokens(Mode::Bounded4, beta2, absent);
    double vb = bounded.first / ref.first, ub = bounded.second / ref.second;
    double vn = nearest.first / ref.first, un = nearest.second / ref.second;
    MESSAGE("absent tokens at 4 bits, beta2 "
            << beta2 << ", " << absent
            << " absent steps: decoded v / fp32's: nearest 4-bit " << vn
            << ", bounded 4-bit " << vb
            << "; update on return / fp32's: nearest 4-bit " << un
            << ", bounded 4-bit " << ub);
    CHECK(vb >= 0.8);
    CHECK(vb <= 1.25);
    CHECK(ub >= 0.8);
    CHECK(ub <= 1.5);
  }
}

TEST_CASE("4-bit dither streams: one element's two states round "
          "independently at every pair of fractions") {
  // A 4-bit optimizer's k-th state dithers on its own stream, H(t + k *
  // 0x9E3779B9) at phase 0 (docs/NUMERICS.md §2e); 8-bit states share H(t)
  // at phases 3462 apart, which decorrelates their rounding errors only
  // averaged over fractions. Over 2^16 steps of one element, at each of 9 x
  // 9 fixed fractions (phi_m, phi_v), the correlation of the two states'
  // rounding errors (round up with probability phi) must stay below 0.02:
  // five standard errors of an estimate from 2^16 independent pairs
  // (1 / 2^8), so 81 cells of independent streams pass, while the shared
  // hash with the phase is far beyond it.
  auto correlation = [](double pm, double pv, bool streams) {
    const int64_t steps = 1 << 16;
    double sm = 0, sv = 0, smm = 0, svv = 0, smv = 0;
    for (int64_t t = 1; t <= steps; ++t) {
      double um = dither(12345, streams ? streamStep(t, 0) : t, 0);
      double uv = streams ? dither(12345, streamStep(t, 1), 0)
                          : dither(12345, t, statePhase(1));
      double em = (um + pm >= 1.0 ? 1.0 : 0.0) - pm; // rounding error
      double ev = (uv + pv >= 1.0 ? 1.0 : 0.0) - pv;
      sm += em;
      sv += ev;
      smm += em * em;
      svv += ev * ev;
      smv += em * ev;
    }
    double n = double(steps);
    double cov = smv / n - (sm / n) * (sv / n);
    double vm = smm / n - (sm / n) * (sm / n), vv = svv / n - (sv / n) * (sv / n);
    return cov / std::sqrt(vm * vv);
  };
  double worstStreams = 0, worstPhase = 0;
  for (int a = 1; a <= 9; ++a)
    for (int b = 1; b <= 9; ++b) {
      double pm = a / 10.0, pv = b / 10.0;
      double c = correlation(pm, pv, true);
      INFO("phi_m " << pm << ", phi_v " << pv << ": correlation " << c);
      CHECK(std::fabs(c) < 0.02);
      worstStreams = std::max(worstStreams, std::fabs(c));
      worstPhase = std::max(worstPhase, std::fabs(correlation(pm, pv, false)));
    }
  MESSAGE("largest |correlation| of one element's rounding errors over 9 x 9 "
          "fractions: independent streams "
          << worstStreams << ", shared hash with the 3462 phase "
          << worstPhase);
  CHECK(worstPhase > 0.1); // what the streams avoid
}
