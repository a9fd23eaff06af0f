//===- FastArithmeticTest.cpp - The fast mode's error bounds --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The portable fast mode (docs/NUMERICS.md §7) against the exact mode, on
/// the scalar reference (the generated fast kernels match the reference bit
/// for bit in unittests/Conformance and unittests/PtxEmulator): how far one
/// replaced division, a quantized state, a decoded master weight and a whole
/// AdamW-24 run drift. The bounds asserted here are the ones §7 states.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace flashopt::ref;

namespace {

/// Distance in units in the last place between two finite floats of one
/// sign (the number of floats between them).
int64_t ulpDistance(float a, float b) {
  auto key = [](float f) {
    int32_t i = int32_t(bitsOf(f));
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  return std::llabs(key(a) - key(b));
}

} // namespace

TEST_CASE("fast mode: the paired softsign decode and Adam update stay within "
          "4 ulp of their quotients (NUMERICS §7 1a)") {
  // r = RN(1 / RN(d0 * d)); the decode RN(q * RN(d * r)), the update
  // RN(x * RN(d0 * r)), for every code and d over the normal range where
  // the pairing is exact to a few ulp ([2^-126, 2^117]).
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-126, 116);
  std::uniform_int_distribution<int> xexp(-60, 60);
  int64_t worstDec = 0, worstUpd = 0;
  long cases = 0;
  for (int code = -128; code <= 127; ++code) {
    float q = float(code), d0 = 254.0f - std::fabs(q);
    for (int i = 0; i < 8000; ++i) {
      float d = std::ldexp(mant(rng), expo(rng));
      float x = std::ldexp(mant(rng), xexp(rng)) * (i & 1 ? -1.0f : 1.0f);
      float r = 1.0f / (d0 * d);
      float dec = q * (d * r), upd = x * (d0 * r);
      worstDec = std::max(worstDec, ulpDistance(dec, q / d0));
      float ieee = x / d;
      if (std::isfinite(ieee) && std::fpclassify(ieee) == FP_NORMAL)
        worstUpd = std::max(worstUpd, ulpDistance(upd, ieee));
      ++cases;
    }
  }
  MESSAGE("paired quotients, " << cases << " cases: decode within " << worstDec
                               << " ulp, update within " << worstUpd
                               << " ulp");
  // Four roundings of at most u each, against the correctly rounded
  // quotient's half ulp: under 4 ulp anywhere in a binade.
  CHECK(worstDec <= 4);
  CHECK(worstUpd <= 4);
  // Outside the range the decode is lost with the update (§7 1a, §5): a
  // zero or infinite denominator makes it NaN, as x / 0 and the NaN scale
  // that v = inf stores make the update and the weight non-finite.
  for (float d : {0.0f, INFINITY}) {
    float r = 1.0f / (254.0f * d);
    CHECK(std::isnan(5.0f * (d * r)));
  }
}

TEST_CASE("fast mode: x * RN(1/d) is within one ulp of the IEEE quotient") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-40, 40);
  int64_t worst = 0, differ = 0;
  const int n = 2000000;
  for (int i = 0; i < n; ++i) {
    float x = std::ldexp(mant(rng), expo(rng)) * (i & 1 ? -1.0f : 1.0f);
    float d = std::ldexp(mant(rng), expo(rng));
    float exact = x / d;
    float fast = divUniform(x, d, true);
    int64_t u = ulpDistance(exact, fast);
    worst = std::max(worst, u);
    differ += u != 0;
  }
  MESSAGE("x*RN(1/d) vs x/d: " << differ << " of " << n << " differ, at most "
                               << worst << " ulp");
  CHECK(worst <= 1);
  CHECK(differ > 0); // the mode does change something
  // Special operands keep IEEE behaviour where it matters for the NaN
  // contract: NaN stays NaN, x/inf is 0, 0 * (1/0) is NaN as 0/0 is.
  CHECK(std::isnan(divUniform(NAN, 2.0f, true)));
  CHECK(std::isnan(divUniform(1.0f, NAN, true)));
  CHECK(divUniform(3.0f, INFINITY, true) == 0.0f);
  CHECK(std::isnan(divUniform(0.0f, 0.0f, true)));
  CHECK(std::isinf(divUniform(1.0f, 0.0f, true)));
}

TEST_CASE("fast mode: quantized states move by at most one code") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 5);
  for (Compand comp : {Compand::Softsign, Compand::Sqrt, Compand::None}) {
    QuantEncoding enc;
    enc.isSigned = comp != Compand::Sqrt;
    enc.compand = comp;
    enc.scale = DType::F16;
    int64_t codes = 0, changed = 0, worst = 0;
    double worstDecode = 0;
    std::vector<float> x(32);
    std::vector<int32_t> exact(32), fast(32);
    for (int g = 0; g < 40000; ++g) {
      float scale = std::ldexp(1.0f, expo(rng));
      for (float &v : x) {
        v = normal(rng) * scale;
        if (comp == Compand::Sqrt)
          v = v * v;
      }
      uint32_t se = quantize_group(x.data(), 32, enc, exact.data(), false);
      uint32_t sf = quantize_group(x.data(), 32, enc, fast.data(), true);
      REQUIRE(se == sf); // the scale is the absmax itself, untouched
      for (int i = 0; i < 32; ++i) {
        int64_t d = std::llabs(int64_t(exact[i]) - fast[i]);
        worst = std::max(worst, d);
        changed += d != 0;
        ++codes;
        float de = dequantize(exact[i], se, enc, false);
        // As the fast rules see it: the code's reciprocal and the scale
        // folded into one factor (linear, sqrt), the square after it.
        float df = dequantizeLazy(exact[i], se, enc, true).value();
        if (de != 0.0f)
          worstDecode = std::max(worstDecode, std::fabs(double(df) - de) /
                                                  std::fabs(double(de)));
      }
    }
    MESSAGE("compand " << int(comp) << ": " << changed << " of " << codes
                       << " codes differ (at most " << worst
                       << "); decoded values within " << worstDecode
                       << " relative");
    CHECK(worst <= 1);
    CHECK(double(changed) / double(codes) < 1e-3);
    // t = q * RN(1/N) is at most one ulp (2^-23 relative) off q / N, and
    // q * RN(RN(1/N) * s) two roundings more than (q / N) * s; the softsign
    // inverse t / (2 - |t|) at most doubles a relative error of t (|t| <= 1),
    // and so does the square of the sqrt compander; the operations after it
    // add a few half-ulp roundings: under 8u.
    CHECK(worstDecode <= 8.0 * 0x1p-24);
  }
}

TEST_CASE("fast mode: the decoded master weight is within one f32 ulp") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> bits(0, 0x7F7F);
  std::uniform_int_distribution<int> rho(-127, 127);
  int64_t worst = 0, differ = 0;
  for (int i = 0; i < 1000000; ++i) {
    uint16_t nb = uint16_t(bits(rng));
    int32_t r = rho(rng);
    float e = ecc_decode(nb, r, DType::BF16, DType::I8, false);
    float f = ecc_decode(nb, r, DType::BF16, DType::I8, true);
    int64_t u = ulpDistance(e, f);
    worst = std::max(worst, u);
    differ += u != 0;
  }
  MESSAGE("bf16 + i8 decode: " << differ << " of 1e6 differ, at most " << worst
                               << " f32 ulp");
  CHECK(worst <= 1);
}

TEST_CASE("fast mode: 200 AdamW-24 steps stay within the exact run's noise") {
  // One tensor of 4096 elements, bf16 + i8 master weights, 8-bit states, the
  // same random gradients for both modes; compare the decoded weights.
  Config cfg;
  cfg.rule = "adamw";
  cfg.param = DType::BF16;
  cfg.correction = DType::I8;
  cfg.grad = DType::BF16;
  StateEncoding m{true, DType::F32, {true, Compand::Softsign, DType::F16, 32}};
  StateEncoding v{true, DType::F32, {false, Compand::Sqrt, DType::F16, 32}};
  cfg.states = {m, v};
  const int64_t n = 4096, G = 32;
  struct Run {
    std::vector<uint16_t> p;
    std::vector<int8_t> c, mc;
    std::vector<uint8_t> vc;
    std::vector<uint16_t> ms, vs;
  };
  auto make = [&]() {
    Run r;
    r.p.resize(n);
    r.c.assign(n, 0);
    r.mc.assign(n, 0);
    r.vc.assign(n, 0);
    r.ms.assign(n / G, 0);
    r.vs.assign(n / G, 0);
    std::mt19937 rng(5);
    std::normal_distribution<float> w(0.0f, 0.05f);
    for (auto &x : r.p)
      x = f32_to_bf16(w(rng));
    return r;
  };
  Run exact = make(), fast = make();
  std::mt19937 rng(9);
  std::normal_distribution<float> gd(0.0f, 1e-2f);
  std::vector<uint16_t> grad(n);
  std::map<std::string, float> hypers = {{"lr", 1e-3f}};
  for (int64_t t = 1; t <= 200; ++t) {
    for (auto &x : grad)
      x = f32_to_bf16(gd(rng));
    for (Run *r : {&exact, &fast}) {
      Config c = cfg;
      c.fast = r == &fast;
      reference_step(c, hypers, t, n,
                     {r->p.data(), r->c.data(), grad.data(), r->mc.data(),
                      r->ms.data(), r->vc.data(), r->vs.data()});
    }
  }
  double num = 0, den = 0, moved = 0;
  int64_t paramsDiffer = 0;
  std::mt19937 rng0(5);
  std::normal_distribution<float> w0(0.0f, 0.05f);
  for (int64_t i = 0; i < n; ++i) {
    double e = ecc_decode(exact.p[i], exact.c[i], DType::BF16, DType::I8);
    double f = ecc_decode(fast.p[i], fast.c[i], DType::BF16, DType::I8);
    double start = bf16_to_f32(f32_to_bf16(w0(rng0)));
    num += (e - f) * (e - f);
    den += (e - start) * (e - start);
    moved += std::fabs(e - start);
    paramsDiffer += exact.p[i] != fast.p[i];
  }
  double rel = std::sqrt(num / den);
  MESSAGE("after 200 steps: |fast - exact| / |exact - start| = "
          << rel << " (RMS); bf16 parameters differ in " << paramsDiffer
          << " of " << n);
  // The two modes agree far better than either agrees with an fp32 master
  // (numerics.md §8 allows NMSE 0.05 against fp32).
  CHECK(rel < 1e-2);
  CHECK(moved > 0);
}
