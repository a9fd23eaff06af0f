//===- ReferenceTest.cpp - The scalar reference against FlashOptim ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The independent scalar reference (test/reference/flashopt_reference.h)
/// checked against the worked examples of the FlashOptim numerics
/// (shared/reference/numerics.md §1.8, §2.8), hardware conversions, and the
/// properties of FlashOptim's own test suite (§8). The generated kernels are
/// checked bit for bit against this reference in unittests/Conformance, so
/// these tests tie the kernels to FlashOptim's numbers.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"
#include "group_division.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <immintrin.h>
#include <random>
#include <vector>

using namespace flashopt::ref;

namespace {

struct Ecc {
  uint16_t narrow;
  int32_t rho;
  float decoded;
};

Ecc roundTrip(float x, DType p, DType c) {
  Ecc r;
  ecc_encode(x, p, c, &r.narrow, &r.rho);
  r.decoded = ecc_decode(r.narrow, r.rho, p, c);
  return r;
}

__attribute__((target("f16c"))) uint16_t hardwareF16(float f) {
  return uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

double cosSim(const std::vector<double> &a, const std::vector<double> &b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  if (aa == 0 && bb == 0)
    return 1.0;
  return ab / std::sqrt(aa * bb);
}

} // namespace

TEST_CASE("ECC worked examples (numerics.md 1.8): bf16 + i8 at 0.1") {
  Ecc r = roundTrip(0.1f, DType::BF16, DType::I8);
  CHECK(bf16_to_f32(r.narrow) == 0.10009765625f);
  CHECK(r.rho == -51);
  CHECK(double(r.decoded) == 0.09999961405992508);
}

TEST_CASE("ECC worked examples: bf16 + i16 at 0.1 is exact") {
  Ecc r = roundTrip(0.1f, DType::BF16, DType::I16);
  CHECK(bf16_to_f32(r.narrow) == 0.10009765625f);
  CHECK(r.rho == -13107);
  CHECK(r.decoded == 0.1f);
}

TEST_CASE("ECC worked examples: fp16 + i8 at 0.1") {
  Ecc r = roundTrip(0.1f, DType::F16, DType::I8);
  CHECK(f16_to_f32(r.narrow) == 0.0999755859375f);
  CHECK(r.rho == 102);
  CHECK(double(r.decoded) == 0.10000009834766388);
}

TEST_CASE("ECC worked examples: 65519 rounds up to a power of two") {
  Ecc r8 = roundTrip(65519.0f, DType::BF16, DType::I8);
  CHECK(bf16_to_f32(r8.narrow) == 65536.0f);
  CHECK(r8.rho == -8);
  CHECK(r8.decoded == 65519.875f);
  Ecc r16 = roundTrip(65519.0f, DType::BF16, DType::I16);
  CHECK(r16.rho == -2176);
  CHECK(r16.decoded == 65519.0f);
  Ecc h8 = roundTrip(65519.0f, DType::F16, DType::I8);
  CHECK(f16_to_f32(h8.narrow) == 65504.0f);
  CHECK(h8.rho == 119);
  CHECK(h8.decoded == 65518.9921875f);
}

TEST_CASE("ECC worked examples: tiny values and subnormal narrow values") {
  Ecc r = roundTrip(5.9e-8f, DType::BF16, DType::I8);
  CHECK(double(bf16_to_f32(r.narrow)) == 5.8906152844429016e-08);
  CHECK(r.rho == 102);
  CHECK(double(r.decoded) == 5.899965316302769e-08);
  Ecc h = roundTrip(1e-10f, DType::F16, DType::I16);
  CHECK(f16_to_f32(h.narrow) == 0.0f);
  CHECK(h.rho == 110);
  CHECK(double(h.decoded) == 1.0004747030833983e-10);
}

TEST_CASE("ECC overflow: fp16 65520 becomes inf with rho = -127") {
  Ecc r = roundTrip(65520.0f, DType::F16, DType::I8);
  CHECK(std::isinf(f16_to_f32(r.narrow)));
  // e = 65520 - inf = -inf, clamped to -1: rho = -N, as in FlashOptim.
  CHECK(r.rho == -127);
  CHECK(std::isinf(r.decoded));
  CHECK(r.decoded > 0);
  // A NaN master weight has a NaN error term: rho = 0 (docs/NUMERICS.md §1).
  Ecc n = roundTrip(std::nanf(""), DType::BF16, DType::I8);
  CHECK(n.rho == 0);
  CHECK(std::isnan(n.decoded));
}

TEST_CASE("quantization worked example (numerics.md 2.8): softsign momentum") {
  std::vector<float> m(32, 0.0f);
  float in[5] = {1.0f, -0.5f, 0.25f, 0.0f, -0.1f};
  std::copy(in, in + 5, m.begin());
  QuantEncoding enc{true, Compand::Softsign, DType::F16, 32};
  std::vector<int32_t> codes(32);
  uint32_t scale = quantize_group(m.data(), 32, enc, codes.data());
  CHECK(f16_to_f32(uint16_t(scale)) == 1.0f);
  int32_t want[5] = {127, -85, 51, 0, -23};
  double deq[5] = {1.0, -0.502959, 0.251232, 0.0, -0.099567};
  for (int i = 0; i < 5; ++i) {
    CHECK(codes[i] == want[i]);
    CHECK(dequantize(codes[i], scale, enc) == doctest::Approx(deq[i]).epsilon(2e-6));
  }
  for (int i = 5; i < 32; ++i)
    CHECK(codes[i] == 0);
}

TEST_CASE("quantization worked example: sqrt-companded variance") {
  std::vector<float> v(32, 0.0f);
  float in[5] = {4.0f, 1.0f, 0.25f, 0.0f, 0.01f};
  std::copy(in, in + 5, v.begin());
  QuantEncoding enc{false, Compand::Sqrt, DType::F16, 32};
  std::vector<int32_t> codes(32);
  uint32_t scale = quantize_group(v.data(), 32, enc, codes.data());
  CHECK(f16_to_f32(uint16_t(scale)) == 2.0f);
  int32_t want[5] = {255, 128, 64, 0, 13};
  double deq[5] = {4.0, 1.007859, 0.251965, 0.0, 0.010396};
  for (int i = 0; i < 5; ++i) {
    CHECK(codes[i] == want[i]);
    CHECK(dequantize(codes[i], scale, enc) == doctest::Approx(deq[i]).epsilon(2e-6));
  }
}

TEST_CASE("state codes round half up: floor(x*N + 0.5)") {
  // t*127 = 2.5 exactly needs n = 2.5/127: use linear signed codes.
  QuantEncoding enc{true, Compand::None, DType::F32, 32};
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f; // absmax 127: n = x/127, code = floor(x + 0.5)
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49999997f;
  std::vector<int32_t> c(32);
  quantize_group(x.data(), 32, enc, c.data());
  CHECK(c[1] == 3);
  CHECK(c[2] == -2);
  // fl32(0.49999997 + 0.5) is a tie that rounds to 1.0: the code is 1
  // (FlashOptim's quirk, numerics.md 2.3).
  CHECK(c[3] == 1);
}

TEST_CASE("f16 conversion: every half round-trips, and f32->f16 matches F16C") {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f))
      continue;
    REQUIRE(f32_to_f16(f) == h);
  }
  if (!__builtin_cpu_supports("f16c"))
    return;
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  int mismatches = 0;
  for (int i = 0; i < 4000000; ++i) {
    uint32_t u = bits(rng);
    // Bias toward the f16 range and its edges.
    if (i % 2)
      u = (u & 0x807FFFFFu) | ((100u + (u >> 24) % 50u) << 23);
    float f = floatOf(u);
    if (std::isnan(f))
      continue;
    mismatches += f32_to_f16(f) != hardwareF16(f);
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 conversion: ties to even, NaN stays NaN, inf and subnormals") {
  CHECK(f32_to_bf16(floatOf(0x3F808000u)) == 0x3F80); // tie, even stays
  CHECK(f32_to_bf16(floatOf(0x3F818000u)) == 0x3F82); // tie, odd rounds up
  CHECK(f32_to_bf16(floatOf(0x3F808001u)) == 0x3F81);
  CHECK(f32_to_bf16(INFINITY) == 0x7F80);
  CHECK(f32_to_bf16(floatOf(0x7F7FFFFFu)) == 0x7F80); // max f32 -> inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(f32_to_bf16(floatOf(0x00000001u)) == 0x0000); // tiny subnormal
  CHECK(f32_to_bf16(floatOf(0x00018000u)) == 0x0002);
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f))
      REQUIRE(f32_to_bf16(f) == h);
  }
}

TEST_CASE("ECC invariants over whole binades (numerics.md 8)") {
  // e0/e8/e16: absolute error of no correction / i8 / i16 master weights.
  // FlashOptim's invariants: e0 = 0 => e8 = 0; e0 = 0 => e16 = 0;
  // e8 = 0 => e16 = 0; e16 <= e8; with the exception counts its test allows
  // per (sign, exponent): 32 in bf16 normal binades (values next to the
  // half-ULP ties), 16383 in fp16 denormal ones.
  struct Binade {
    DType p;
    int exp; // unbiased f32 exponent; all 2^23 mantissas, both signs
    long allowed;
  };
  const Binade binades[] = {{DType::BF16, 0, 32},    {DType::BF16, -20, 32},
                            {DType::BF16, 37, 32},   {DType::BF16, -126, 32},
                            {DType::F16, 0, 0},      {DType::F16, -10, 0},
                            {DType::F16, 14, 0},     {DType::F16, -20, 16383}};
  for (const Binade &b : binades)
    for (uint32_t sign : {0u, 0x80000000u}) {
      long zeroViolations = 0, e16GtE8 = 0, worse = 0;
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        float x = floatOf(sign | uint32_t(b.exp + 127) << 23 | m);
        uint16_t nb = b.p == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        float r = widenBits(b.p, nb);
        if (std::isinf(r))
          continue;
        double e0 = std::fabs(double(r) - x);
        double e8 = std::fabs(double(roundTrip(x, b.p, DType::I8).decoded) - x);
        double e16 =
            std::fabs(double(roundTrip(x, b.p, DType::I16).decoded) - x);
        zeroViolations += (e0 == 0 && (e8 != 0 || e16 != 0)) ||
                          (e8 == 0 && e16 != 0);
        e16GtE8 += e16 > e8;
        worse += e8 > e0;
      }
      std::string what = std::string(b.p == DType::BF16 ? "bf16" : "f16") +
                         " binade 2^" + std::to_string(b.exp) +
                         (sign ? " negative" : " positive");
      INFO(what);
      CHECK(zeroViolations <= b.allowed);
      CHECK(e16GtE8 <= b.allowed);
      CHECK(worse <= b.allowed);
    }
}

TEST_CASE("ECC error bound: |decode(encode(x)) - x| <= ULP/(4N) + half an f32 ulp") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (DType c : {DType::I8, DType::I16}) {
    double n = c == DType::I8 ? 127.0 : 32767.0;
    double worst = 0;
    for (int i = 0; i < 200000; ++i) {
      float x = std::ldexp(u(rng), int(u(rng) * 10));
      Ecc r = roundTrip(x, DType::BF16, c);
      double ulp = std::ldexp(1.0, ell(r.narrow, DType::BF16) + 1);
      double halfF32 = std::ldexp(1.0, std::ilogb(x) - 24);
      double err = std::fabs(double(r.decoded) - x);
      worst = std::max(worst, err / (ulp / (4 * n) + halfF32));
    }
    CHECK(worst <= 1.0);
  }
}

TEST_CASE("quantize/dequantize round trip (numerics.md 8, test_compression)") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const int sizes[] = {5, 12, 16, 17, 32, 544, 16384};
  const QuantEncoding modes[] = {{true, Compand::None, DType::F16, 32},
                                 {true, Compand::Softsign, DType::F16, 32},
                                 {false, Compand::None, DType::F16, 32},
                                 {false, Compand::Sqrt, DType::F16, 32}};
  for (const QuantEncoding &enc : modes)
    for (int n : sizes)
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<float> x(n);
        for (int i = 0; i < n; ++i) {
          float v = kind == 0 ? normal(rng)
                    : kind == 1 ? uni(rng) * 0.01f
                    : kind == 2 ? normal(rng) * std::pow(10.0f, float(i % 5) - 2)
                                : 1.0f;
          x[i] = enc.isSigned ? v : std::fabs(v);
        }
        std::vector<double> a, b;
        double mae = 0, absmax = 0;
        for (int g0 = 0; g0 < n; g0 += 32) {
          int m = std::min(32, n - g0);
          std::vector<int32_t> codes(m);
          uint32_t s = quantize_group(x.data() + g0, m, enc, codes.data());
          for (int i = 0; i < m; ++i) {
            double d = dequantize(codes[i], s, enc);
            a.push_back(x[g0 + i]);
            b.push_back(d);
            mae += std::fabs(d - x[g0 + i]);
            absmax = std::max(absmax, double(std::fabs(x[g0 + i])));
          }
        }
        mae /= n;
        INFO("n " << n << " kind " << kind << " signed " << enc.isSigned
                  << " compand " << int(enc.compand));
        CHECK(cosSim(a, b) > 0.9999);
        CHECK(mae <= 1.6 * absmax / 255.0);
      }
}

TEST_CASE("zeros stay exactly zero, and zero gradients keep states zero") {
  for (const char *rule : {"sgd", "sgdw", "adam", "adamw", "lion"}) {
    Config cfg;
    cfg.rule = rule;
    cfg.param = DType::BF16;
    cfg.correction = DType::I8;
    cfg.grad = DType::BF16;
    for (std::string s : state_names(rule)) {
      StateEncoding e;
      e.quantized = true;
      e.q = s == "exp_avg_sq" ? QuantEncoding{false, Compand::Sqrt, DType::F16, 32}
                              : QuantEncoding{true, Compand::Softsign, DType::F16, 32};
      cfg.states.push_back(e);
    }
    const int64_t n = 100;
    std::vector<uint16_t> p(n), g(n, 0);
    std::vector<int8_t> corr(n, 0);
    std::vector<std::vector<uint8_t>> codes(cfg.states.size(), std::vector<uint8_t>(n, 0));
    std::vector<std::vector<uint16_t>> scales(cfg.states.size(), std::vector<uint16_t>(4, 0));
    for (int64_t i = 0; i < n; ++i)
      p[i] = f32_to_bf16(0.01f * float(i) - 0.5f);
    std::vector<uint16_t> p0 = p;
    std::vector<void *> bufs = {p.data(), corr.data(), g.data()};
    for (size_t k = 0; k < cfg.states.size(); ++k) {
      bufs.push_back(codes[k].data());
      bufs.push_back(scales[k].data());
    }
    std::map<std::string, float> h = {{"lr", 0.1f}, {"weight_decay", 0.0f},
                                      {"momentum", 0.9f}};
    for (int t = 1; t <= 5; ++t)
      reference_step(cfg, h, t, n, bufs);
    INFO(rule);
    for (auto &c : codes)
      CHECK(std::all_of(c.begin(), c.end(), [](uint8_t v) { return v == 0; }));
    CHECK(p == p0);
    CHECK(std::all_of(corr.begin(), corr.end(), [](int8_t v) { return v == 0; }));
  }
}

TEST_CASE("f32 parameters with plain f32 states track textbook formulas (100 steps)") {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char *rule : {"sgd", "sgdw", "adam", "adamw", "lion"}) {
    Config cfg;
    cfg.rule = rule;
    cfg.param = DType::F32;
    cfg.grad = DType::F32;
    for (size_t k = 0; k < state_names(rule).size(); ++k)
      cfg.states.push_back(StateEncoding{false, DType::F32, {}});
    const int64_t n = 64;
    std::vector<float> p(n), g(n);
    std::vector<std::vector<float>> st(cfg.states.size(), std::vector<float>(n, 0));
    for (auto &v : p)
      v = normal(rng);
    std::vector<double> dp(p.begin(), p.end()), m(n, 0), v2(n, 0);
    // The textbook in double, with the hyper-parameters the kernels see (f32).
    const double lr = 0.01f, wd = 0.1f, b1 = 0.9f, b2 = 0.999f, mu = 0.9f,
                 eps = 1e-8f;
    const double lb1 = 0.9f, lb2 = 0.99f;
    // The decoupled decay factor is a per-step f32 scalar (NUMERICS.md §3).
    const double dec = double(1.0f - 0.1f * 0.01f);
    std::map<std::string, float> h = {{"lr", float(lr)}, {"weight_decay", float(wd)},
                                      {"momentum", float(mu)}};
    double worst = 0;
    for (int t = 1; t <= 100; ++t) {
      for (int64_t i = 0; i < n; ++i)
        g[i] = normal(rng);
      std::vector<void *> bufs = {p.data(), g.data()};
      for (auto &s : st)
        bufs.push_back(s.data());
      reference_step(cfg, h, t, n, bufs);
      for (int64_t i = 0; i < n; ++i) {
        double gi = g[i];
        std::string r = rule;
        if (r == "adam" || r == "adamw") {
          if (r == "adam")
            gi += wd * dp[i];
          else
            dp[i] *= dec;
          m[i] = b1 * m[i] + (1 - b1) * gi;
          v2[i] = b2 * v2[i] + (1 - b2) * gi * gi;
          double mh = m[i] / (1 - std::pow(b1, t)), vh = v2[i] / (1 - std::pow(b2, t));
          dp[i] -= lr * mh / (std::sqrt(vh) + eps);
        } else if (r == "sgd" || r == "sgdw") {
          if (r == "sgd")
            gi += wd * dp[i];
          else
            dp[i] *= dec;
          m[i] = mu * m[i] + gi;
          dp[i] -= lr * m[i];
        } else {
          double c = lb1 * m[i] + (1 - lb1) * gi;
          double u = c > 0 ? 1 : (c < 0 ? -1 : 0);
          m[i] = lb2 * m[i] + (1 - lb2) * gi;
          dp[i] = dp[i] * dec - lr * u;
        }
      }
    }
    // Relative difference of the parameter vectors (f32 vs double textbook).
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      diff += (p[i] - dp[i]) * (p[i] - dp[i]);
      norm += dp[i] * dp[i];
    }
    worst = std::sqrt(diff / norm);
    std::string name = rule;
    INFO(name << ": relative difference " << worst);
    CHECK(worst <= 1e-6);
  }
}

TEST_CASE("32-bit master weights track an fp32 master within 1 f32 ulp") {
  // One step from the same master value: decode(bf16 + i16) then the update
  // and encode vs the fp32 update. Errors do not accumulate because each
  // step starts from the decoded value it stored.
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int n = 200000;
  int within = 0;
  for (int i = 0; i < n; ++i) {
    float master = normal(rng);
    Ecc stored = roundTrip(master, DType::BF16, DType::I16);
    float updated = stored.decoded - 0.001f * normal(rng);
    Ecc again = roundTrip(updated, DType::BF16, DType::I16);
    float ulp = std::nextafter(std::fabs(updated), INFINITY) - std::fabs(updated);
    within += std::fabs(again.decoded - updated) <= ulp;
  }
  CHECK(double(within) / n >= 0.99);
}

TEST_CASE("bias correction: beta^t rounded once to f32, as the official "
          "kernels (issue 14 item 3)") {
  // beta2 = 0.999f, t = 3: 1 - powi by squaring in f32 gives 0x3b446800;
  // the official 1 - pow(beta2, t) and the correctly rounded beta^t give
  // 0x3b446900.
  CHECK(bitsOf(1.0f - powi(0.999f, 3)) == 0x3b446900u);
  CHECK(bitsOf(1.0f - 0.999f * (0.999f * 0.999f)) == 0x3b446800u);
  Rule adamw("adamw", {}, 3);
  CHECK(bitsOf(adamw.bc2) == 0x3b446900u);
  CHECK(powi(0.5f, 0) == 1.0f);
  CHECK(powi(0.5f, 149) == 0x1p-149f);
  CHECK(powi(0.5f, 150) == 0.0f);
  CHECK(powi(0.9f, 1) == 0.9f);
  CHECK(powi(-0.5f, 3) == -0.125f);
  // Overflow, also through Dekker's split (|x^n| > 2^996): signed infinity.
  CHECK(powi(2.0f, 200) == INFINITY);
  CHECK(powi(1e30f, 40) == INFINITY);
  CHECK(powi(-2.0f, 1001) == -INFINITY);
  CHECK(powi(-2.0f, 1000) == INFINITY);
  CHECK(powi(-1e30f, 41) == -INFINITY);
  CHECK(std::isnan(powi(NAN, 3)));
  CHECK(powi(NAN, 0) == 1.0f);
}

TEST_CASE("bias correction: powi equals the correctly rounded beta^t for "
          "every step until it underflows") {
  // The exact beta^t to 113 bits (binary128, one rounding per step: relative
  // error <= t * 2^-113), rounded once to f32, against the kernels' f64
  // squaring. The betas of common configurations; every t until beta^t
  // underflows f32 (0.9999: about 1.03e6 steps).
  for (float beta : {0.5f, 0.8f, 0.9f, 0.95f, 0.98f, 0.99f, 0.995f, 0.998f,
                     0.999f, 0.9995f, 0.9999f}) {
    __float128 q = 1;
    int64_t mismatches = 0, t = 0;
    while (true) {
      ++t;
      q *= __float128(beta);
      float want = float(q);
      if (powi(beta, t) != want)
        ++mismatches;
      if (want == 0.0f)
        break;
    }
    INFO("beta = " << beta << ", steps checked: " << t);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("flashopt-exact-group-division: reciprocal + two FMA corrections "
          "equal the division (special values, 1e6 random cases)") {
  // The 1e8-case run is build/bin/flashopt-group-division-check.
  GroupDivisionResult r;
  const float specials[] = {0.0f,        -0.0f,         1e-12f,
                            0x1p-149f,   0x1p-126f,     1.0f,
                            0x1.fffffep0f, 0x1p126f,    0x1.000002p126f,
                            0x1p127f,    3.4028235e38f, 0.1f,
                            1.0f / 3.0f, 0x1.800000p-40f};
  for (float a : specials) {
    if (!(a >= 1e-12f))
      continue;
    for (float y : specials)
      for (float sy : {y, -y})
        if (std::fabs(sy) <= a) {
          checkGroupDivision(sy, a, r);
          checkGroupDivision(a, a, r);
          checkGroupDivision(-a, a, r);
          checkGroupDivision(std::nextafter(a, 0.0f), a, r);
        }
  }
  // Non-finite absmax: NaN (a NaN in the group) and inf.
  for (float y : {0.0f, 1.0f, -5.0f, INFINITY, NAN}) {
    checkGroupDivision(y, NAN, r);
    checkGroupDivision(y, INFINITY, r);
  }
  CaseGenerator gen(7);
  for (int i = 0; i < 1000000; ++i) {
    float y, a;
    gen.pair(y, a);
    checkGroupDivision(y, a, r);
  }
  INFO("cases: " << r.cases);
  CHECK(r.quotientMismatches == 0);
  CHECK(r.codeMismatches == 0);
}
