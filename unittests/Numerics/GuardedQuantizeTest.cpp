//===- GuardedQuantizeTest.cpp - flashopt-guarded-quantize's guard --------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-guarded-quantize computes the 8-bit softsign and sqrt codes with
/// approximate reciprocals and square roots (rcp.approx.ftz: within 1 ulp;
/// sqrt.approx.ftz: within a relative 2^-23, subnormal operands flushed) and
/// keeps them (rint(y')) only where the guard |y' - rint(y')| <= 0.5 - delta
/// holds; docs/NUMERICS.md §2c proves that the code then equals the exact
/// IEEE code. These tests run both chains on the host, the approximations
/// at the worst their bounds allow (each approximate result either faithful
/// rounding of the exact value, every combination), and check: wherever the
/// guard holds the codes agree; the guard fails for NaN and out-of-range
/// scales; the sqrt path's absmax (a root of the group's largest radicand by
/// bit order) equals the exact one bit for bit, negatives, -0 and NaN
/// included; and the guard fails rarely on ordinary data. Inputs include
/// values built to land on a code boundary and at about the guard's margin
/// from one, where the guard must do the work.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

using flashopt::ref::bitsOf;
using flashopt::ref::floatOf;

namespace {

float ftz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

/// The two faithful roundings of 1/d (rcp.approx.ftz, d and the result
/// normal or flushed): `pick` 0 = the correctly rounded one, 1 = the other.
float rcpApprox(float d, int pick) {
  d = ftz(d);
  float rn = 1.0f / d;
  if (pick == 0 || !std::isfinite(rn) || rn == 0.0f)
    return ftz(rn);
  float e = std::fma(-d, rn, 1.0f); // exact residual
  if (e == 0.0f)
    return rn;
  // e > 0: rn * d < 1, rn below 1/d (for d > 0; the other way for d < 0).
  bool below = (e > 0) == (d > 0);
  return ftz(std::nextafter(rn, below ? INFINITY : -INFINITY));
}

/// The two faithful roundings of sqrt(z) (sqrt.approx.ftz).
float sqrtApprox(float z, int pick) {
  z = ftz(z);
  float rn = std::sqrt(z);
  if (pick == 0 || !std::isfinite(rn) || rn == 0.0f)
    return rn;
  float e = std::fma(-rn, rn, z);
  if (e == 0.0f)
    return rn;
  return std::nextafter(rn, e > 0 ? INFINITY : -INFINITY);
}

float codeOf(float w) {
  float f = std::floor(w);
  return std::isnan(f) ? 0.0f : f;
}

/// The exact softsign code (flashopt-expand-encodings, N = 127).
float softsignExact(float x, float a) {
  float n = x / a;
  float t = (2.0f * n) / (1.0f + std::fabs(n));
  return codeOf(t * 127.0f + 0.5f);
}

struct Fast {
  float code;
  bool ok;
};

/// code' = rint(y') (floor(y' + 0.5) but at the half-integers, which the
/// guard excludes), kept where |y' - rint(y')| <= limit.
Fast guarded(float y, float limit) {
  float f = std::nearbyint(y); // round half to even in the default mode
  float slack = std::fabs(y - f);
  return {std::isnan(f) ? 0.0f : f, slack <= limit};
}

/// The fast mode's softsign code (NUMERICS §7): the quotient
/// t = x / fma(|x|, 0.5, a * 0.5) IEEE, floor(fma(t, 127, 0.5)).
float softsignFastModeExact(float x, float a) {
  float t = x / std::fma(std::fabs(x), 0.5f, a * 0.5f);
  return codeOf(std::fma(t, 127.0f, 0.5f));
}

/// Its guarded form: the same divisor, one approximate reciprocal; N is
/// NaN for a >= 2^126 (the reciprocal would not be normal).
Fast softsignFastModeGuarded(float x, float a, int pick) {
  float den = std::fma(std::fabs(x), 0.5f, a * 0.5f);
  float n = a < 0x1p126f ? 127.0f : NAN;
  float y = (x * n) * rcpApprox(den, pick);
  return guarded(y, 0.5f - 0x1p-13f);
}

/// The guarded softsign code, `picks` choosing each approximation's
/// rounding (bit 0: R = rcp(a), bit 1: rcp(1 + |n'|)).
Fast softsignFast(float x, float a, int picks, float limit = 0.5f - 0x1p-13f) {
  float r = a < 0x1p126f ? rcpApprox(a, picks & 1) : NAN;
  float n = x * r;
  float den = 1.0f + std::fabs(n);
  float y = (n * 254.0f) * rcpApprox(den, (picks >> 1) & 1);
  return guarded(y, limit);
}

/// The exact sqrt code (N = 255) for an absmax `a` of the roots.
float sqrtExact(float v, float a) {
  float y = std::sqrt(v);
  return codeOf((y / a) * 255.0f + 0.5f);
}

Fast sqrtFast(float v, float a, int picks) {
  float k = 255.0f * rcpApprox(a, picks & 1);
  float s = a < 0x1p60f ? k * k : NAN;
  float y = sqrtApprox(v * s, (picks >> 1) & 1);
  return guarded(y, 0.5f - 0x1p-12f);
}

/// max(group_max(|sqrt(v)|), 1e-12) as the kernels computed it before.
float absmaxExact(const std::vector<float> &v) {
  uint32_t m = 0;
  for (float x : v)
    m = std::max(m, bitsOf(std::fabs(std::sqrt(x))));
  float g = floatOf(m);
  return std::isnan(g) ? g : std::max(g, 1e-12f);
}

/// max(sqrt(group_max(v + 0.0) {bits}), 1e-12): the guarded form.
float absmaxGuarded(const std::vector<float> &v) {
  uint32_t m = 0;
  for (float x : v)
    m = std::max(m, bitsOf(x + 0.0f));
  float g = std::sqrt(floatOf(m));
  return std::isnan(g) ? g : std::max(g, 1e-12f);
}

struct Tally {
  long cases = 0, guarded = 0, wrong = 0;
};

/// One input: every rounding choice of the approximations; a wrong code
/// wherever the guard holds fails the test.
template <typename FastFn>
void tally(Tally &t, const char *what, float x, float a, float exact,
           int choices, FastFn fast) {
  for (int picks = 0; picks < choices; ++picks) {
    Fast f = fast(picks);
    ++t.cases;
    if (!f.ok)
      continue;
    ++t.guarded;
    if (f.code != exact && ++t.wrong < 5)
      FAIL_CHECK(what << " x=" << x << " a=" << a << " picks=" << picks << ": "
                      << f.code << " vs " << exact);
  }
}

void checkSoftsign(float x, float a, Tally &t) {
  tally(t, "softsign", x, a, softsignExact(x, a), 4,
        [&](int p) { return softsignFast(x, a, p); });
}

void checkSoftsignFastMode(float x, float a, Tally &t) {
  tally(t, "fast-mode softsign", x, a, softsignFastModeExact(x, a), 2,
        [&](int p) { return softsignFastModeGuarded(x, a, p); });
}

void checkSqrt(float v, float a, Tally &t) {
  tally(t, "sqrt", v, a, sqrtExact(v, a), 4,
        [&](int p) { return sqrtFast(v, a, p); });
}

/// A float moved by k ulps.
float ulps(float x, int k) {
  uint32_t u = bitsOf(x);
  return floatOf(uint32_t(int64_t(u) + k));
}

} // namespace

TEST_CASE("flashopt-guarded-quantize: softsign codes where the guard holds "
          "are exact (exact and fast mode)") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  Tally random, edge, fastRandom, fastEdge;
  for (int i = 0; i < 1500000; ++i) {
    float a = std::ldexp(1.0f + std::fabs(unit(rng)), int(rng() % 200) - 100);
    a = std::max(a, 1e-12f);
    float x = unit(rng) * a;
    checkSoftsign(x, a, random);
    checkSoftsignFastMode(x, a, fastRandom);
    if (i % 8 == 0)
      checkSoftsign(a, a, random), checkSoftsign(-a, a, random);
  }
  // Near every code boundary: y = k + 0.5 exactly in reals, then a few ulps
  // of x either way.
  // ... and at about the guard's margin from it (y = k + 0.5 + m delta).
  for (int k = -127; k <= 126; ++k) {
    for (double m : {0.0, 0.5, -0.5, 0.9, -0.9, 1.1, -1.1, 2.0, -2.0}) {
      double tt = (k + 0.5 + m * 0x1p-13) / 127.0;
      if (std::fabs(tt) > 1.0)
        continue;
      double n = tt / (2.0 - std::fabs(tt));
      for (int s = 0; s < 40; ++s) {
        float a =
            std::ldexp(1.0f + std::fabs(unit(rng)), int(rng() % 120) - 60);
        float x0 = float(n * a);
        for (int d = -3; d <= 3; ++d) {
          checkSoftsign(ulps(x0, d), a, edge);
          checkSoftsignFastMode(ulps(x0, d), a, fastEdge);
        }
      }
    }
  }
  CHECK(random.wrong == 0);
  CHECK(edge.wrong == 0);
  CHECK(fastRandom.wrong == 0);
  CHECK(fastEdge.wrong == 0);
  CHECK(fastEdge.cases - fastEdge.guarded > fastEdge.cases / 4);
  CHECK(fastEdge.guarded > fastEdge.cases / 4);
  CHECK(1.0 - double(fastRandom.guarded) / double(fastRandom.cases) < 1e-3);
  // The guard fails rarely on spread-out data (about 2 delta = 2^-12 of
  // the codes), and does its work at the boundaries.
  double rate = 1.0 - double(random.guarded) / double(random.cases);
  MESSAGE("softsign: " << random.cases << " random cases, fallback rate "
                       << rate << "; " << edge.cases << " near boundaries, "
                       << edge.cases - edge.guarded << " fell back");
  CHECK(rate < 1e-3);
  CHECK(edge.cases - edge.guarded > edge.cases / 4);
  CHECK(edge.guarded > edge.cases / 4);
}

TEST_CASE("flashopt-guarded-quantize: sqrt codes where the guard holds are "
          "exact") {
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Tally random, edge;
  for (int i = 0; i < 1500000; ++i) {
    float a = std::ldexp(1.0f + unit(rng), int(rng() % 110) - 55);
    a = std::max(a, 1e-12f);
    // v up to a^2 (the absmax's radicand), often tiny (squared states).
    float r = unit(rng);
    if (i % 3 == 0)
      r = std::ldexp(r, -int(rng() % 40));
    float v = (r * a) * (r * a);
    checkSqrt(v, a, random);
    if (i % 8 == 0) {
      float vmax = a * a;
      checkSqrt(vmax, std::max(std::sqrt(vmax), 1e-12f), random);
    }
  }
  for (int k = 0; k <= 254; ++k) {
    for (double m : {0.0, 0.5, -0.5, 0.9, -0.9, 1.1, -1.1, 2.0, -2.0}) {
      double z = (k + 0.5 + m * 0x1p-12) / 255.0;
      if (z > 1.0)
        continue;
      for (int s = 0; s < 40; ++s) {
        float a = std::ldexp(1.0f + unit(rng), int(rng() % 80) - 40);
        float v0 = float((z * a) * (z * a));
        for (int d = -3; d <= 3; ++d)
          checkSqrt(ulps(v0, d), a, edge);
      }
    }
  }
  CHECK(random.wrong == 0);
  CHECK(edge.wrong == 0);
  double rate = 1.0 - double(random.guarded) / double(random.cases);
  MESSAGE("sqrt: " << random.cases << " random cases, fallback rate " << rate
                   << "; " << edge.cases << " near boundaries, "
                   << edge.cases - edge.guarded << " fell back");
  CHECK(rate < 1e-3);
  CHECK(edge.cases - edge.guarded > edge.cases / 4);
  CHECK(edge.guarded > edge.cases / 4);
}

TEST_CASE("flashopt-guarded-quantize: special values fall back") {
  for (int picks = 0; picks < 4; ++picks) {
    // NaN element, NaN or infinite absmax, an absmax too large for the
    // reciprocal's range: the guard fails, the exact chain decides.
    CHECK_FALSE(softsignFast(NAN, 1.0f, picks).ok);
    CHECK_FALSE(softsignFast(1.0f, NAN, picks).ok);
    CHECK_FALSE(softsignFast(INFINITY, INFINITY, picks).ok);
    CHECK_FALSE(softsignFast(1.0f, INFINITY, picks).ok);
    CHECK_FALSE(softsignFast(1e38f, 0x1p126f, picks).ok);
    // The fast mode's form: the same, and a huge absmax (whose divisor's
    // reciprocal would be subnormal) fails instead of coding 0.
    CHECK_FALSE(softsignFastModeGuarded(NAN, 1.0f, picks & 1).ok);
    CHECK_FALSE(softsignFastModeGuarded(1.0f, NAN, picks & 1).ok);
    CHECK_FALSE(softsignFastModeGuarded(INFINITY, INFINITY, picks & 1).ok);
    CHECK_FALSE(softsignFastModeGuarded(3e38f, 3e38f, picks & 1).ok);
    CHECK_FALSE(softsignFastModeGuarded(1.0f, 0x1p126f, picks & 1).ok);
    CHECK(softsignFastModeExact(3e38f, 3e38f) == 127.0f);
    CHECK(softsignFastModeExact(1.0f, INFINITY) == 0.0f);
    Fast zf = softsignFastModeGuarded(-0.0f, 1e-12f, picks & 1);
    CHECK(zf.ok);
    CHECK(zf.code == 0.0f);
    CHECK_FALSE(sqrtFast(NAN, 1.0f, picks).ok);
    CHECK_FALSE(sqrtFast(1.0f, NAN, picks).ok);
    CHECK_FALSE(sqrtFast(-1.0f, 1.0f, picks).ok);
    CHECK_FALSE(sqrtFast(1.0f, 0x1p61f, picks).ok);
    // Zeros: code 0, guarded (an all-zero group stores codes 0 fast).
    Fast z = softsignFast(0.0f, 1e-12f, picks);
    CHECK(z.ok);
    CHECK(z.code == 0.0f);
    z = sqrtFast(0.0f, 1e-12f, picks);
    CHECK(z.ok);
    CHECK(z.code == 0.0f);
    // Subnormal radicand products (flushed): code 0, as the exact chain.
    z = sqrtFast(0x1p-149f, 1.0f, picks);
    CHECK(z.ok);
    CHECK(z.code == sqrtExact(0x1p-149f, 1.0f));
  }
}

TEST_CASE("flashopt-guarded-quantize: the sqrt absmax from the largest "
          "radicand is the same bits") {
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float specials[] = {0.0f,      -0.0f,   -1.0f,    -0x1p-149f,
                            NAN,       -NAN,    INFINITY, -INFINITY,
                            0x1p-149f, 3.4e38f, 1e-30f};
  long compared = 0;
  for (int g = 0; g < 200000; ++g) {
    std::vector<float> v(32);
    int e = int(rng() % 200) - 100;
    for (float &x : v)
      x = std::ldexp(unit(rng), e);
    if (g % 4 == 0) // a special value or two among ordinary ones
      for (int k = 0; k < 1 + g % 2; ++k)
        v[rng() % 32] = specials[rng() % (sizeof(specials) / sizeof(float))];
    if (g % 16 == 1) // all zero, or all -0
      std::fill(v.begin(), v.end(), g % 32 == 1 ? 0.0f : -0.0f);
    float exact = absmaxExact(v), fast = absmaxGuarded(v);
    ++compared;
    if (std::isnan(exact)) {
      CHECK(std::isnan(fast));
    } else if (bitsOf(exact) != bitsOf(fast)) {
      FAIL_CHECK("group " << g << ": " << exact << " vs " << fast);
      break;
    }
  }
  CHECK(compared == 200000);
}

TEST_CASE("flashopt-guarded-quantize: how often an Adam trajectory falls "
          "back") {
  // 20 AdamW steps of 4096 groups of 32 with 8-bit states (decoded,
  // updated, re-encoded exactly), gradients N(0, s) with s per group over
  // 2^-20..2^0 and 10 % exact zeros; every element's two codes under the
  // kernels' shared guard (0.5 - 2^-12), the approximations correctly
  // rounded. The rate sets the fallback's expected cost (NUMERICS §2c).
  std::mt19937_64 rng(14);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int groups = 4096, steps = 20;
  const float b1 = 0.9f, b2 = 0.999f;
  std::vector<float> mCode(groups * 32, 0.0f), vCode(groups * 32, 0.0f);
  std::vector<float> mScale(groups, 0.0f), vScale(groups, 0.0f);
  std::vector<float> sigma(groups);
  for (float &x : sigma)
    x = std::ldexp(1.0f, -int(rng() % 21));
  long elements = 0, fellBack = 0, kept = 0, wrong = 0;
  for (int t = 0; t < steps; ++t) {
    for (int g = 0; g < groups; ++g) {
      float m[32], v[32], am = 0.0f, vmax = 0.0f;
      for (int i = 0; i < 32; ++i) {
        int k = g * 32 + i;
        float grad = rng() % 10 == 0 ? 0.0f : normal(rng) * sigma[g];
        float tm = mCode[k] / 127.0f, tv = vCode[k] / 255.0f;
        float md = tm / (2.0f - std::fabs(tm)) * mScale[g];
        float vd = (tv * vScale[g]) * (tv * vScale[g]);
        m[i] = md * b1 + grad * (1.0f - b1);
        v[i] = vd * b2 + (grad * grad) * (1.0f - b2);
        am = std::max(am, std::fabs(m[i]));
        vmax = std::max(vmax, v[i]);
      }
      am = std::max(am, 1e-12f);
      float av = std::max(std::sqrt(vmax), 1e-12f);
      for (int i = 0; i < 32; ++i) {
        int k = g * 32 + i;
        float cm = softsignExact(m[i], am), cv = sqrtExact(v[i], av);
        // The kernels' merged guard: both codes against 0.5 - 2^-12.
        Fast fm = softsignFast(m[i], am, 0, 0.5f - 0x1p-12f);
        Fast fv = sqrtFast(v[i], av, 0);
        wrong += (fm.ok && fm.code != cm) + (fv.ok && fv.code != cv);
        ++elements;
        fellBack += !(fm.ok && fv.ok);
        kept += fm.ok && fv.ok && (cm != 0.0f || cv != 0.0f);
        mCode[k] = cm;
        vCode[k] = cv;
      }
      mScale[g] = am;
      vScale[g] = av;
    }
  }
  double rate = double(fellBack) / double(elements);
  MESSAGE("Adam trajectory: " << elements << " elements, fallback rate " << rate
                              << " (a warp of 256 elements: "
                              << 1.0 - std::pow(1.0 - rate, 256) << ")");
  CHECK(wrong == 0);
  CHECK(rate < 2e-3);
  CHECK(kept > elements / 2); // most codes are non-zero and kept
}

namespace {

/// The bounded numerics (docs/NUMERICS.md §8): codes floor(RN(y + u)) with
/// a dither u = k 2^-14 in [0, 1 - 2^-14]; the guarded form is
/// z = RN(y' + (1 + u)) (1 + u exact), folded into the last multiply as an
/// FMA (softsign) or added (sqrt); the code is the low byte of
/// RD(z + 1.5 * 2^23 - 1) (an add rounded toward -inf, as add.rm.f32 does),
/// kept where -|z - rint(z)| <= -delta.
Fast guardedD(float z, float delta, bool isSigned) {
  const int saved = std::fegetround();
  std::fesetround(FE_DOWNWARD);
  volatile float vz = z, vm = 0x1.8p23f - 1.0f;
  volatile float sum = vz + vm;
  std::fesetround(saved);
  uint32_t byte = bitsOf(float(sum)) & 0xFFu;
  float code = isSigned ? float(int8_t(uint8_t(byte))) : float(byte);
  float r = std::nearbyint(z);
  float slack = -std::fabs(z - r);
  return {code, slack <= -delta};
}

float softsignExactU(float x, float a, float u) {
  float n = x / a;
  float t = (2.0f * n) / (1.0f + std::fabs(n));
  return codeOf(t * 127.0f + u);
}
Fast softsignFastU(float x, float a, float u, int picks,
                   float delta = 0x1p-13f) {
  float r = a < 0x1p126f ? rcpApprox(a, picks & 1) : NAN;
  float n = x * r;
  float den = 1.0f + std::fabs(n);
  float z = std::fma(n * 254.0f, rcpApprox(den, (picks >> 1) & 1), 1.0f + u);
  return guardedD(z, delta, true);
}
float softsignFastModeExactU(float x, float a, float u) {
  float t = x / std::fma(std::fabs(x), 0.5f, a * 0.5f);
  return codeOf(std::fma(t, 127.0f, u));
}
Fast softsignFastModeGuardedU(float x, float a, float u, int pick,
                              float delta = 0x1p-13f) {
  float den = std::fma(std::fabs(x), 0.5f, a * 0.5f);
  float n = a < 0x1p126f ? 127.0f : NAN;
  float z = std::fma(x * n, rcpApprox(den, pick), 1.0f + u);
  return guardedD(z, delta, true);
}
float sqrtExactU(float v, float a, float u) {
  float y = std::sqrt(v);
  return codeOf((y / a) * 255.0f + u);
}
Fast sqrtFastU(float v, float a, float u, int picks,
               float delta = 0x1p-12f) {
  float k = 255.0f * rcpApprox(a, picks & 1);
  float s = a < 0x1p60f ? k * k : NAN;
  float z = sqrtApprox(v * s, (picks >> 1) & 1) + (1.0f + u);
  return guardedD(z, delta, false);
}

/// One dithered input, every rounding choice; the tally counts wrong codes
/// where the guard holds (failing the test unless `expectWrong`).
template <typename FastFn>
void tallyU(Tally &t, bool expectWrong, float exact, int choices,
            FastFn fast) {
  for (int picks = 0; picks < choices; ++picks) {
    Fast f = fast(picks);
    ++t.cases;
    if (!f.ok)
      continue;
    ++t.guarded;
    if (f.code != exact && ++t.wrong < 5 && !expectWrong)
      FAIL_CHECK("wrong dithered code " << f.code << " vs " << exact);
  }
}

/// Dithered softsign, fast-mode softsign and sqrt codes over random inputs
/// and inputs whose y + u lies within a few margins of an integer, with the
/// guard's limit `shrink` times closer to 1/2 (1: the kernels').
void checkDithered(Tally &soft, Tally &fastSoft, Tally &sq, double shrink,
                   bool expectWrong, int rounds) {
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto dither = [&] { return float(rng() % 16384) / 16384.0f; };
  float ls = float(0x1p-13 / shrink), lq = float(0x1p-12 / shrink);
  for (int i = 0; i < rounds; ++i) {
    float u = dither();
    float a = std::ldexp(1.0f + std::fabs(unit(rng)), int(rng() % 160) - 80);
    float x = unit(rng) * a;
    tallyU(soft, expectWrong, softsignExactU(x, a, u), 4,
           [&](int p) { return softsignFastU(x, a, u, p, ls); });
    tallyU(fastSoft, expectWrong, softsignFastModeExactU(x, a, u), 2,
           [&](int p) { return softsignFastModeGuardedU(x, a, u, p, ls); });
    float r = std::fabs(unit(rng));
    float v = (r * a) * (r * a);
    tallyU(sq, expectWrong, sqrtExactU(v, a, u), 4,
           [&](int p) { return sqrtFastU(v, a, u, p, lq); });
    // y + u = k + m delta: a target integer k, m within a few margins.
    double m = double(int(rng() % 9) - 4) * 0.5;
    int k = int(rng() % 254) - 126;
    double tt = (k - u + m * 0x1p-13) / 127.0;
    if (std::fabs(tt) <= 1.0) {
      float xe = float(tt / (2.0 - std::fabs(tt)) * a);
      for (int d = -2; d <= 2; ++d) {
        float xd = ulps(xe, d);
        tallyU(soft, expectWrong, softsignExactU(xd, a, u), 4,
               [&](int p) { return softsignFastU(xd, a, u, p, ls); });
      }
      double tf = (k - u + m * 0x1p-13) / 127.0; // fast mode: t = 2x/(a+|x|)
      float xf = float(tf / (2.0 - std::fabs(tf)) * a);
      for (int d = -2; d <= 2; ++d) {
        float xd = ulps(xf, d);
        tallyU(fastSoft, expectWrong, softsignFastModeExactU(xd, a, u), 2,
               [&](int p) { return softsignFastModeGuardedU(xd, a, u, p, ls); });
      }
    }
    int kq = int(rng() % 255) + 1;
    double z = (kq - u + m * 0x1p-12) / 255.0;
    if (z >= 0.0 && z <= 1.0) {
      float ve = float((z * a) * (z * a));
      for (int d = -2; d <= 2; ++d) {
        float vd = ulps(ve, d);
        tallyU(sq, expectWrong, sqrtExactU(vd, a, u), 4,
               [&](int p) { return sqrtFastU(vd, a, u, p, lq); });
      }
    }
  }
}

} // namespace

TEST_CASE("flashopt-guarded-quantize: dithered codes where the guard holds "
          "are exact (bounded numerics)") {
  Tally soft, fastSoft, sq;
  checkDithered(soft, fastSoft, sq, 1.0, false, 1000000);
  MESSAGE("dithered: softsign " << soft.cases << " cases, "
                                << soft.cases - soft.guarded
                                << " fell back; fast-mode softsign "
                                << fastSoft.cases << ", "
                                << fastSoft.cases - fastSoft.guarded
                                << "; sqrt " << sq.cases << ", "
                                << sq.cases - sq.guarded);
  CHECK(soft.wrong == 0);
  CHECK(fastSoft.wrong == 0);
  CHECK(sq.wrong == 0);
  // The boundary cases reach the fallback, and most codes do not.
  CHECK(soft.cases - soft.guarded > soft.cases / 100);
  CHECK(soft.guarded > soft.cases / 2);
  CHECK(sq.cases - sq.guarded > sq.cases / 100);
  // The test can see a margin that is too small: 4 times closer to 1/2,
  // the softsign guard keeps wrong codes.
  Tally s4, f4, q4;
  checkDithered(s4, f4, q4, 4.0, true, 300000);
  MESSAGE("margins / 4: wrong codes kept: softsign " << s4.wrong
                                                      << ", fast-mode "
                                                      << f4.wrong << ", sqrt "
                                                      << q4.wrong);
  CHECK(s4.wrong > 0);
}
