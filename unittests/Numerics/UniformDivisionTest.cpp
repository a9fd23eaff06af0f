//===- UniformDivisionTest.cpp - flashopt-uniform-division's arithmetic ---===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-uniform-division replaces an f32 division `x / c` by a divisor
/// that is the same for the whole launch with binary64 arithmetic:
/// `R = 1.0 / f64(c)`, `p = f64(x) * R`, the snap
/// `p = copysign((p + K) - K, p)` (K = 1.5 * 2^-124) and `f32(p)`; for a
/// constant |c| < 2 without the snap (docs/NUMERICS.md §3b proves both
/// correctly rounded). These tests run that arithmetic on the host (binary64
/// add, multiply and conversions round to nearest; -ffp-contract=off)
/// against the f32 division, bit for bit: special values, every bias
/// correction of common betas over the first 10^4 steps, random pairs over
/// the whole binary32 range, quotients built to lie near an f32 rounding
/// boundary, and exact f32 ties (subnormal quotients of divisors >= 2),
/// which the multiply alone rounds the wrong way.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

using flashopt::ref::bitsOf;
using flashopt::ref::floatOf;

namespace {

/// What the pass computes, with the reciprocal computed once per divisor.
float uniformDivide(float x, double r, bool snap) {
  volatile double p = static_cast<double>(x) * r;
  if (!snap)
    return static_cast<float>(p);
  const double k = 0x1.8p-124;
  volatile double up = p + k;
  volatile double snapped = up - k;
  return static_cast<float>(std::copysign(snapped, p));
}

struct Tally {
  uint64_t cases = 0, mismatches = 0;
  float badX = 0, badC = 0;
  /// `snap`: the general form; without it only divisors |c| < 2 (the
  /// pass's constant case).
  void check(float x, float c, bool snap = true) {
    volatile float c_ = c;
    double r = 1.0 / static_cast<double>(c_);
    volatile float want = x / c_;
    float got = uniformDivide(x, r, snap);
    ++cases;
    bool same = std::isnan(want) ? std::isnan(got) : bitsOf(want) == bitsOf(got);
    if (!same && mismatches++ == 0) {
      badX = x;
      badC = c;
      std::printf("mismatch: x = %a, c = %a: x / c = %a, got %a\n", x, c,
                  static_cast<double>(want), static_cast<double>(got));
    }
  }
};

} // namespace

TEST_CASE("flashopt-uniform-division: f32(snap(f64(x) * (1/f64(c)))) equals "
          "x / c "
          "(special values, bias corrections, random, near-boundary and "
          "tie cases)") {
  Tally t;
  const float specials[] = {0.0f,          -0.0f,        0x1p-149f,
                            0x1.8p-148f,   0x1p-127f,    0x1p-126f,
                            0x1.fffffep-127f, 1.0f,      0x1.fffffep0f,
                            0x1.000002p0f, 0.1f,         1.0f / 3.0f,
                            0x1p-24f,      1e-3f,        1e-8f,
                            0x1p100f,      0x1p127f,     3.4028235e38f,
                            INFINITY,      NAN};
  for (float c : specials)
    for (float x : specials)
      for (float sx : {x, -x})
        for (float sc : {c, -c}) {
          t.check(sx, sc);
          if (std::fabs(c) < 2.0f && c != 0.0f)
            t.check(sx, sc, false);
        }

  std::mt19937_64 rng(20261205);
  auto anyFinite = [&] {
    for (;;) {
      float f = floatOf(static_cast<uint32_t>(rng()));
      if (std::isfinite(f))
        return f;
    }
  };

  // Adam's divisors: 1 - beta^t, beta^t correctly rounded (NUMERICS §3).
  for (float beta : {0.9f, 0.95f, 0.98f, 0.99f, 0.995f, 0.999f, 0.9995f,
                     0.9999f, 0.5f, 0.0f, 1.0f}) {
    for (int64_t step = 1; step <= 10000; ++step) {
      float c = 1.0f - flashopt::ref::powi(beta, step);
      for (int k = 0; k < 8; ++k)
        t.check(anyFinite(), c);
      t.check(1.0f, c);
      t.check(-0.0f, c);
      t.check(0x1p-149f, c);
    }
  }

  // Random pairs over every binade, subnormals and overflow included; and
  // divisors in (-2, 2) without the snap.
  for (int i = 0; i < 2000000; ++i) {
    float x = anyFinite(), c = anyFinite();
    t.check(x, c);
    float small = std::fmod(c, 2.0f);
    if (small != 0.0f)
      t.check(x, small, false);
  }

  // Exact ties: x = c * M with M an odd multiple of 2^-150 (a midpoint of
  // the subnormal grid), c = C * 2^j with odd C * K < 2^24. Without the
  // snap, f64(x) * R misses the tie and rounds away from even.
  std::uniform_int_distribution<uint32_t> oddK(0, 2047), oddC(0, 4095);
  std::uniform_int_distribution<int> jd(1, 120);
  uint64_t ties = 0, tiesWrongUncorrected = 0;
  for (int i = 0; i < 200000; ++i) {
    double K = 2 * oddK(rng) + 1, C = 2 * oddC(rng) + 1;
    float c = static_cast<float>(std::ldexp(C, jd(rng)));
    double xd = std::ldexp(C * K, 0) * std::ldexp(1.0, std::ilogb(c) -
                                                           std::ilogb(C)) *
                std::ldexp(1.0, -150);
    float x = static_cast<float>(xd);
    if (static_cast<double>(x) != xd || x == 0.0f)
      continue; // not a binary32 number
    ++ties;
    volatile float c_ = c;
    volatile float want = x / c_;
    double r = 1.0 / static_cast<double>(c);
    tiesWrongUncorrected += bitsOf(uniformDivide(x, r, false)) != bitsOf(want);
    t.check(x, c);
  }
  INFO("exact ties: " << ties << ", of which the multiply alone rounds "
                      << tiesWrongUncorrected << " wrong");
  CHECK(ties > 1000);
  CHECK(tiesWrongUncorrected > 0); // the case the snap is there for

  // Quotients next to an f32 rounding boundary: M = an odd multiple of half
  // an ulp (a midpoint), x = RN32(c * M) for random c; x / c then lies
  // within a fraction of an ulp of M, at times much closer. Normal and
  // subnormal M.
  std::uniform_int_distribution<int> expo(-149, 127);
  for (int i = 0; i < 2000000; ++i) {
    float c = anyFinite();
    int e = expo(rng);
    // A 25-bit odd significand times 2^(e - 24): a midpoint of f32 at
    // exponent e (for e < -126 the midpoints of the subnormal grid).
    double m = std::ldexp(static_cast<double>((rng() & 0xffffff) | 1u |
                                              0x1000000u),
                          std::max(e, -126) - 24);
    if (e < -126)
      m = std::ldexp(static_cast<double>((rng() & 0xffff) * 2 + 1), -150);
    float x = static_cast<float>(static_cast<double>(c) * m);
    if (std::isfinite(x))
      t.check(x, c);
  }

  INFO("cases: " << t.cases << ", first mismatch x = " << t.badX
                 << ", c = " << t.badC);
  CHECK(t.cases > 4000000);
  CHECK(t.mismatches == 0);
}
