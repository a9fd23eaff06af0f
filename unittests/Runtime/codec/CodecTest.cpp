//===- CodecTest.cpp - Host codec tests -------------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Tests of runtime/src/codec/Codec.cpp (docs/NUMERICS.md §1, §2): bit-for-bit
/// agreement with the independent scalar reference (test/reference/
/// flashopt_reference.h) of widen / narrow, the master-weight split
/// (decode / encode, bf16/f16 x i8/i16) and the group quantization (every
/// compander x code dtype x scale dtype), plus properties that do not rely
/// on the reference: the encode/decode round-trip bound, the worked
/// examples of shared/reference/numerics.md, quantization accuracy,
/// zero / NaN / Inf groups and tail groups.
///
/// Built with -ffp-contract=off, like the library and the reference.
///
//===----------------------------------------------------------------------===//

#include "codec/Codec.h"

#include "flashopt/abi/Minifloat.h"
#include "flashopt/host/Float16.h"
#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <string>
#include <vector>

using flashopt::host::DType;
namespace codec = flashopt::host::codec;
namespace ref = flashopt::ref;
namespace abi = flashopt::abi;

namespace {

uint32_t bits(float f) { return ref::bitsOf(f); }
float fromBits(uint32_t u) { return ref::floatOf(u); }

/// Bit-identical, or both NaN with the same sign (NaN payloads are not part
/// of the contract: the reference does not quiet f16 NaNs when widening,
/// Float16.h does).
bool sameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  return bits(a) == bits(b);
}

ref::DType toRef(DType t) {
  switch (t) {
  case DType::BF16:
    return ref::DType::BF16;
  case DType::F16:
    return ref::DType::F16;
  case DType::F32:
    return ref::DType::F32;
  case DType::I8:
    return ref::DType::I8;
  case DType::U8:
    return ref::DType::U8;
  case DType::I16:
    return ref::DType::I16;
  }
  return ref::DType::None;
}

std::string name(DType t) {
  switch (t) {
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::F32:
    return "f32";
  case DType::I8:
    return "i8";
  case DType::U8:
    return "u8";
  case DType::I16:
    return "i16";
  }
  return "?";
}

/// Every f32 exponent (both signs, subnormals, inf/NaN included) with
/// mantissas at the edges, at the bf16 and f16 rounding ties and their
/// neighbours, and random ones.
std::vector<float> binadeSweep(int randomPerBinade, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v;
  const uint32_t fixed[] = {0,       1,       2,        3,        0x7FFFFF,
                            0x7FFFFE, 0x400000, 0x200000, 0x7FFF,   0x8000,
                            0x8001,   0x18000,  0x17FFF,  0x18001,  0xFFF,
                            0x1000,   0x1001,   0x3000,   0x2FFF,   0x3001,
                            0x7FF000, 0x7FE000, 0x7F8000, 0x7F0000};
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e <= 255; ++e) {
      for (uint32_t m : fixed)
        v.push_back(fromBits(sign | (e << 23) | m));
      for (int i = 0; i < randomPerBinade; ++i)
        v.push_back(fromBits(sign | (e << 23) | (rng() & 0x7FFFFFu)));
    }
  // Near the top of each narrow type: f16 max 65504, the f16 overflow
  // threshold 65520, bf16 max and its overflow threshold.
  for (float x : {65504.0f, 65519.0f, 65519.99f, 65520.0f, 65536.0f,
                  fromBits(0x7F7F0000u), fromBits(0x7F7F7FFFu),
                  fromBits(0x7F7F8000u), fromBits(0x7F7FFFFFu)}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

} // namespace

//===----------------------------------------------------------------------===//
// widen / narrow
//===----------------------------------------------------------------------===//

TEST_CASE("widen: every bf16 and f16 bit pattern matches the reference") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i)
    all[i] = uint16_t(i);
  std::vector<float> out(65536);
  for (DType t : {DType::BF16, DType::F16}) {
    CAPTURE(name(t));
    codec::widen(all.data(), t, 65536, out.data());
    int64_t mismatches = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      float want = ref::widenBits(toRef(t), uint16_t(i));
      if (!sameFloat(out[i], want) && mismatches++ < 5)
        FAIL_CHECK("pattern 0x" << std::hex << i << ": got 0x" << bits(out[i])
                                << ", want 0x" << bits(want));
      // Widening then narrowing is the identity (NaN payloads aside).
      if (!std::isnan(want))
        CHECK_EQ(ref::narrowBits(toRef(t), out[i]), uint16_t(i));
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("widen / narrow: f32 is a copy") {
  std::vector<float> in = {1.5f, -0.0f, fromBits(1), INFINITY,
                           std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> out(in.size()), back(in.size());
  codec::widen(in.data(), DType::F32, int64_t(in.size()), out.data());
  codec::narrow(out.data(), int64_t(out.size()), DType::F32, back.data());
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK(bits(out[i]) == bits(in[i]));
    CHECK(bits(back[i]) == bits(in[i]));
  }
}

TEST_CASE("narrow: f32 binade sweep matches the reference bit for bit") {
  std::vector<float> xs = binadeSweep(400, 1);
  std::vector<uint16_t> out(xs.size());
  for (DType t : {DType::BF16, DType::F16}) {
    CAPTURE(name(t));
    codec::narrow(xs.data(), int64_t(xs.size()), t, out.data());
    int64_t mismatches = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      uint16_t want = ref::narrowBits(toRef(t), xs[i]);
      if (out[i] != want && mismatches++ < 5)
        FAIL_CHECK("x = 0x" << std::hex << bits(xs[i]) << ": got 0x" << out[i]
                            << ", want 0x" << want);
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("narrow: RTNE, overflow, subnormals, NaN") {
  auto bf = [](float x) {
    uint16_t h;
    codec::narrow(&x, 1, DType::BF16, &h);
    return h;
  };
  auto hf = [](float x) {
    uint16_t h;
    codec::narrow(&x, 1, DType::F16, &h);
    return h;
  };
  // bf16: 1 + 2^-8 is a tie between 1 (even) and 1 + 2^-7.
  CHECK(bf(fromBits(0x3F808000u)) == 0x3F80);
  CHECK(bf(fromBits(0x3F818000u)) == 0x3F82); // tie to even upwards
  CHECK(bf(fromBits(0x3F808001u)) == 0x3F81);
  CHECK(bf(fromBits(0x7F7FFFFFu)) == 0x7F80); // rounds to inf
  CHECK(bf(fromBits(0x00000001u)) == 0x0000); // smallest f32 subnormal
  CHECK(bf(fromBits(0x00010000u)) == 0x0001); // bf16 subnormal kept
  CHECK(bf(-0.0f) == 0x8000);
  uint16_t bn = bf(std::numeric_limits<float>::quiet_NaN());
  CHECK((bn & 0x7F80) == 0x7F80);
  CHECK((bn & 0x7F) != 0);
  // f16.
  CHECK(hf(65504.0f) == 0x7BFF);
  CHECK(hf(65519.99f) == 0x7BFF);
  CHECK(hf(65520.0f) == 0x7C00);
  CHECK(hf(-65520.0f) == 0xFC00);
  CHECK(hf(fromBits(0x33800000u)) == 0x0001); // 2^-24: smallest subnormal
  CHECK(hf(fromBits(0x33000000u)) == 0x0000); // 2^-25: tie to even (0)
  CHECK(hf(fromBits(0x33000001u)) == 0x0001); // just above the tie
  CHECK(hf(fromBits(0x33C00000u)) == 0x0002); // 1.5 * 2^-24: tie to even (2)
  CHECK(hf(1.0f + 1.0f / 2048.0f) == 0x3C00); // tie to even (1.0)
  CHECK(hf(1.0f + 3.0f / 2048.0f) == 0x3C02);
  uint16_t hn = hf(-std::numeric_limits<float>::quiet_NaN());
  CHECK((hn & 0x7C00) == 0x7C00);
  CHECK((hn & 0x3FF) != 0);
  CHECK((hn & 0x8000) != 0);
}

//===----------------------------------------------------------------------===//
// Master weights (§1)
//===----------------------------------------------------------------------===//

namespace {

struct MasterConfig {
  DType param, corr;
};
const MasterConfig kMasterConfigs[] = {{DType::BF16, DType::I8},
                                       {DType::BF16, DType::I16},
                                       {DType::F16, DType::I8},
                                       {DType::F16, DType::I16}};

int32_t maxCode(DType c) { return c == DType::I8 ? 127 : 32767; }

/// Runs encode_master on `xs`, returning the narrow bits and the codes.
void encodeAll(const std::vector<float> &xs, const MasterConfig &c,
               std::vector<uint16_t> &param, std::vector<int32_t> &rho) {
  size_t n = xs.size();
  param.assign(n, 0);
  rho.assign(n, 0);
  std::vector<int8_t> c8(n);
  std::vector<int16_t> c16(n);
  void *corr = c.corr == DType::I8 ? static_cast<void *>(c8.data())
                                   : static_cast<void *>(c16.data());
  codec::encode_master(xs.data(), int64_t(n), param.data(), c.param, corr,
                       c.corr);
  for (size_t i = 0; i < n; ++i)
    rho[i] = c.corr == DType::I8 ? c8[i] : c16[i];
}

std::vector<float> decodeAll(const std::vector<uint16_t> &param,
                             const std::vector<int32_t> &rho,
                             const MasterConfig &c) {
  size_t n = param.size();
  std::vector<int8_t> c8(n);
  std::vector<int16_t> c16(n);
  for (size_t i = 0; i < n; ++i) {
    c8[i] = int8_t(rho[i]);
    c16[i] = int16_t(rho[i]);
  }
  const void *corr = c.corr == DType::I8 ? static_cast<const void *>(c8.data())
                                         : static_cast<const void *>(c16.data());
  std::vector<float> out(n);
  codec::decode_master(param.data(), c.param, corr, c.corr, int64_t(n),
                       out.data());
  return out;
}

/// ULP of a narrow value (2^(ℓ+1)), in f64.
double narrowUlp(uint16_t nb, DType p) {
  int m = p == DType::BF16 ? 7 : 10, bias = p == DType::BF16 ? 127 : 15;
  int field = (nb & 0x7FFF) >> m;
  int e = field == 0 ? 1 - bias : field - bias;
  return std::ldexp(1.0, e - m);
}

} // namespace

TEST_CASE("decode_master: every narrow pattern x code sample matches the "
          "reference") {
  std::vector<uint16_t> param;
  for (uint32_t i = 0; i < 65536; ++i)
    param.push_back(uint16_t(i));
  for (const MasterConfig &c : kMasterConfigs) {
    CAPTURE(name(c.param));
    CAPTURE(name(c.corr));
    int32_t N = maxCode(c.corr);
    std::mt19937 rng(7);
    std::vector<int32_t> codes = {-N, -N + 1, -N / 2, -1, 0, 1, 2, N / 2 + 1,
                                  N - 1, N};
    for (int k = 0; k < 4; ++k)
      codes.push_back(int32_t(rng() % uint32_t(2 * N + 1)) - N);
    if (c.corr == DType::I8)
      codes.push_back(-128); // never produced, but a valid stored byte
    else
      codes.push_back(-32768);
    int64_t mismatches = 0, checked = 0;
    for (int32_t code : codes) {
      std::vector<int32_t> rho(param.size(), code);
      std::vector<float> got = decodeAll(param, rho, c);
      for (size_t i = 0; i < param.size(); ++i, ++checked) {
        float want = ref::ecc_decode(param[i], code, toRef(c.param),
                                     toRef(c.corr));
        if (!sameFloat(got[i], want) && mismatches++ < 5)
          FAIL_CHECK("narrow 0x" << std::hex << param[i] << std::dec
                                 << ", rho " << code << ": got 0x" << std::hex
                                 << bits(got[i]) << ", want 0x" << bits(want));
      }
    }
    CHECK(mismatches == 0);
    CHECK(checked == int64_t(codes.size()) * 65536);
  }
}

TEST_CASE("encode_master: binade sweep matches the reference bit for bit") {
  std::vector<float> xs = binadeSweep(300, 2);
  for (const MasterConfig &c : kMasterConfigs) {
    CAPTURE(name(c.param));
    CAPTURE(name(c.corr));
    std::vector<uint16_t> param;
    std::vector<int32_t> rho;
    encodeAll(xs, c, param, rho);
    int64_t mismatches = 0;
    int32_t N = maxCode(c.corr);
    for (size_t i = 0; i < xs.size(); ++i) {
      uint16_t wantP;
      int32_t wantR;
      ref::ecc_encode(xs[i], toRef(c.param), toRef(c.corr), &wantP, &wantR);
      if ((param[i] != wantP || rho[i] != wantR) && mismatches++ < 5)
        FAIL_CHECK("x = 0x" << std::hex << bits(xs[i]) << ": got (0x"
                            << param[i] << ", " << std::dec << rho[i]
                            << "), want (0x" << std::hex << wantP << ", "
                            << std::dec << wantR << ")");
      CHECK(std::abs(rho[i]) <= N); // -128 / -32768 are never produced
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("encode_master / decode_master: special values") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const MasterConfig &c : kMasterConfigs) {
    CAPTURE(name(c.param));
    CAPTURE(name(c.corr));
    int32_t N = maxCode(c.corr);
    float overflow = c.param == DType::F16 ? 65520.0f : fromBits(0x7F7FFFFFu);
    std::vector<float> xs = {0.0f, -0.0f, inf, -inf, nan, overflow, -overflow};
    std::vector<uint16_t> param;
    std::vector<int32_t> rho;
    encodeAll(xs, c, param, rho);
    std::vector<float> back = decodeAll(param, rho, c);
    uint16_t pinf = c.param == DType::F16 ? 0x7C00 : 0x7F80;
    // ±0: θ' = ±0, ρ = 0, decoded +0 (-0 + +0).
    CHECK(param[0] == 0x0000);
    CHECK(param[1] == 0x8000);
    CHECK(rho[0] == 0);
    CHECK(rho[1] == 0);
    CHECK(bits(back[0]) == 0u);
    CHECK(bits(back[1]) == 0u);
    // ±inf and NaN: e = NaN, so ρ = 0; the decoded value is the same.
    CHECK(param[2] == pinf);
    CHECK(param[3] == uint16_t(pinf | 0x8000));
    CHECK(rho[2] == 0);
    CHECK(rho[3] == 0);
    CHECK(rho[4] == 0);
    CHECK(back[2] == inf);
    CHECK(back[3] == -inf);
    CHECK(std::isnan(back[4]));
    // A finite overflow: θ' = ±inf, e = ∓inf clamped, ρ = ∓N.
    CHECK(param[5] == pinf);
    CHECK(rho[5] == -N);
    CHECK(param[6] == uint16_t(pinf | 0x8000));
    CHECK(rho[6] == N);
    CHECK(back[5] == inf);
    CHECK(back[6] == -inf);
  }
}

TEST_CASE("encode_master: worked examples of the FlashOptim numerics") {
  struct Example {
    DType p, c;
    float x;
    float narrowValue; // θ'
    int32_t rho;
    double decoded;
  };
  const Example ex[] = {
      {DType::BF16, DType::I8, 0.1f, 0.10009765625f, -51,
       0.09999961405992508},
      {DType::BF16, DType::I16, 0.1f, 0.10009765625f, -13107,
       0.10000000149011612},
      {DType::F16, DType::I8, 0.1f, 0.0999755859375f, 102,
       0.10000009834766388},
      {DType::BF16, DType::I8, 65519.0f, 65536.0f, -8, 65519.875},
      {DType::BF16, DType::I16, 65519.0f, 65536.0f, -2176, 65519.0},
      {DType::BF16, DType::I8, 5.9e-8f, 5.8906152844429016e-08f, 102,
       5.899965316302769e-08},
      {DType::F16, DType::I8, 65519.0f, 65504.0f, 119, 65518.9921875},
      {DType::F16, DType::I16, 1e-10f, 0.0f, 110, 1.0004747030833983e-10},
  };
  for (const Example &e : ex) {
    MasterConfig c{e.p, e.c};
    CAPTURE(name(e.p));
    CAPTURE(name(e.c));
    CAPTURE(e.x);
    std::vector<uint16_t> param;
    std::vector<int32_t> rho;
    encodeAll({e.x}, c, param, rho);
    float nv;
    codec::widen(param.data(), e.p, 1, &nv);
    CHECK(nv == e.narrowValue);
    CHECK(rho[0] == e.rho);
    std::vector<float> back = decodeAll(param, rho, c);
    CHECK(back[0] == float(e.decoded));
  }
}

TEST_CASE("encode_master then decode_master: round trip within the bound") {
  // §1.6: |decoded - x| <= ULP(θ')/(4N) plus the fp32 rounding of the final
  // add (half an ulp of the result); the slack term covers the roundings of
  // ρ/N and of the two scalings (each a relative 2^-24 of |e| <= ULP/2) and
  // the f32-subnormal granularity of tiny corrections.
  std::vector<float> xs = binadeSweep(300, 3);
  for (const MasterConfig &c : kMasterConfigs) {
    CAPTURE(name(c.param));
    CAPTURE(name(c.corr));
    std::vector<uint16_t> param;
    std::vector<int32_t> rho;
    encodeAll(xs, c, param, rho);
    std::vector<float> back = decodeAll(param, rho, c);
    double N = maxCode(c.corr);
    double worstRatio = 0; // max |err| / (ULP / 4N) over normal narrow values
    int64_t checked = 0, violations = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      float x = xs[i];
      float nv;
      codec::widen(&param[i], c.param, 1, &nv);
      if (!std::isfinite(x) || !std::isfinite(nv))
        continue;
      ++checked;
      double u = narrowUlp(param[i], c.param);
      double err = std::fabs(double(back[i]) - double(x));
      double halfUlp32 =
          std::fabs(double(std::nextafter(back[i], INFINITY)) - back[i]) / 2;
      double bound = u / (4 * N) + halfUlp32 + u * std::ldexp(1.0, -23) +
                     std::ldexp(1.0, -149);
      if (err > bound && violations++ < 5)
        FAIL_CHECK("x = " << x << " (0x" << std::hex << bits(x) << std::dec
                          << "): decoded " << back[i] << ", error " << err
                          << " > bound " << bound);
      if (std::fabs(nv) >= 1e-3f && std::fabs(nv) <= 1e3f)
        worstRatio = std::max(worstRatio, err / (u / (4 * N)));
      // With i8, the stored value is a fixed point of the codec (value
      // level), except at the ties |ρ| = N (θ' ± ULP/2 may narrow the other
      // way). With i16 the f32 grid of the decoded value is about as coarse
      // as the ρ grid, so re-encoding may move ρ by one.
      if (c.corr != DType::I8 || std::abs(rho[i]) == maxCode(c.corr))
        continue;
      std::vector<uint16_t> p2;
      std::vector<int32_t> r2;
      encodeAll({back[i]}, c, p2, r2);
      std::vector<float> back2 = decodeAll(p2, r2, c);
      if (bits(back2[0]) != bits(back[i]) && violations++ < 5)
        FAIL_CHECK("x = " << x << ": re-encoding the decoded " << back[i]
                          << " gives " << back2[0]);
    }
    CHECK(violations == 0);
    CHECK(checked > 90000);
    // The bound is nearly attained for i8 (so the test can tell a coarser
    // encoding from the right one); i16 is limited by f32 resolution.
    if (c.corr == DType::I8) {
      CHECK(worstRatio > 0.9);
      CHECK(worstRatio <= 1.01);
    }
  }
}

TEST_CASE("encode_master / decode_master: no correction and f32 params") {
  std::vector<float> xs = binadeSweep(10, 4);
  size_t n = xs.size();
  for (DType p : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> viaCodec(n), viaNarrow(n);
    codec::encode_master(xs.data(), int64_t(n), viaCodec.data(), p, nullptr,
                         std::nullopt);
    codec::narrow(xs.data(), int64_t(n), p, viaNarrow.data());
    CHECK(viaCodec == viaNarrow);
    std::vector<float> d1(n), d2(n);
    codec::decode_master(viaCodec.data(), p, nullptr, std::nullopt,
                         int64_t(n), d1.data());
    codec::widen(viaCodec.data(), p, int64_t(n), d2.data());
    CHECK(std::memcmp(d1.data(), d2.data(), n * 4) == 0);
  }
  std::vector<float> p32(n), d32(n);
  codec::encode_master(xs.data(), int64_t(n), p32.data(), DType::F32, nullptr,
                       std::nullopt);
  codec::decode_master(p32.data(), DType::F32, nullptr, std::nullopt,
                       int64_t(n), d32.data());
  CHECK(std::memcmp(p32.data(), xs.data(), n * 4) == 0);
  CHECK(std::memcmp(d32.data(), xs.data(), n * 4) == 0);
}

TEST_CASE("valid_master_encoding / valid_quant_encoding") {
  CHECK(codec::valid_master_encoding(DType::BF16, DType::I8));
  CHECK(codec::valid_master_encoding(DType::F16, DType::I16));
  CHECK(codec::valid_master_encoding(DType::F32, std::nullopt));
  CHECK_FALSE(codec::valid_master_encoding(DType::F32, DType::I8));
  CHECK_FALSE(codec::valid_master_encoding(DType::BF16, DType::U8));
  CHECK_FALSE(codec::valid_master_encoding(DType::I8, std::nullopt));
  CHECK(codec::valid_quant_encoding(DType::I8, DType::F16, "softsign", 32));
  CHECK(codec::valid_quant_encoding(DType::U8, DType::F32, "sqrt", 7));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I16, DType::F16, "none", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I8, DType::I8, "none", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I8, DType::F16, "log", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I8, DType::F16, "none", 0));
}

//===----------------------------------------------------------------------===//
// Quantized states (§2)
//===----------------------------------------------------------------------===//

namespace {

struct QuantConfig {
  std::string compand;
  DType code, scale;
  int64_t group = 32;
};

ref::QuantEncoding toRef(const QuantConfig &c) {
  ref::QuantEncoding e;
  e.isSigned = c.code == DType::I8;
  e.compand = c.compand == "softsign" ? ref::Compand::Softsign
              : c.compand == "sqrt"   ? ref::Compand::Sqrt
              : c.compand == "e3m4"   ? ref::Compand::E3M4
              : c.compand == "e4m4"   ? ref::Compand::E4M4
                                      : ref::Compand::None;
  e.scale = toRef(c.scale);
  e.group = int(c.group);
  return e;
}

std::vector<QuantConfig> allQuantConfigs() {
  std::vector<QuantConfig> v;
  for (const char *cp : {"none", "softsign", "sqrt"})
    for (DType code : {DType::I8, DType::U8})
      for (DType scale : {DType::F16, DType::BF16, DType::F32})
        v.push_back({cp, code, scale, 32});
  // The minifloat codes (docs/NUMERICS.md §2d), each with its own
  // signedness.
  for (DType scale : {DType::F16, DType::BF16, DType::F32}) {
    v.push_back({"e3m4", DType::I8, scale, 32});
    v.push_back({"e4m4", DType::U8, scale, 32});
  }
  return v;
}

int64_t numGroups(int64_t n, int64_t g) { return (n + g - 1) / g; }

/// The result of codec::quantize, with canaries after the last code and
/// scale to catch writes past the end.
struct Quantized {
  std::vector<uint8_t> codes;  // raw bytes (i8 or u8)
  std::vector<uint8_t> scales; // raw bytes (2 or 4 per scale)
  int scaleBytes = 2;
  int64_t n = 0, groups = 0;

  int32_t code(int64_t i, DType t) const {
    return t == DType::I8 ? int32_t(int8_t(codes[size_t(i)]))
                          : int32_t(codes[size_t(i)]);
  }
  uint32_t scaleBits(int64_t g) const {
    uint32_t b = 0;
    std::memcpy(&b, &scales[size_t(g * scaleBytes)], size_t(scaleBytes));
    return b;
  }
};

constexpr int kCanary = 16;

Quantized quantizeAll(const std::vector<float> &x, const QuantConfig &c) {
  Quantized q;
  q.n = int64_t(x.size());
  q.groups = numGroups(q.n, c.group);
  q.scaleBytes = c.scale == DType::F32 ? 4 : 2;
  q.codes.assign(size_t(q.n + kCanary), 0xA5);
  q.scales.assign(size_t(q.groups * q.scaleBytes + kCanary), 0xA5);
  codec::quantize(x.data(), q.n, c.group, c.compand, q.codes.data(), c.code,
                  q.scales.data(), c.scale);
  for (int i = 0; i < kCanary; ++i) {
    CHECK(q.codes[size_t(q.n + i)] == 0xA5);
    CHECK(q.scales[size_t(q.groups * q.scaleBytes + i)] == 0xA5);
  }
  return q;
}

std::vector<float> dequantizeAll(const Quantized &q, const QuantConfig &c) {
  std::vector<float> out(size_t(q.n) + 1, 12345.0f);
  codec::dequantize(q.codes.data(), c.code, q.scales.data(), c.scale,
                    c.compand, c.group, q.n, out.data());
  CHECK(out[size_t(q.n)] == 12345.0f);
  out.pop_back();
  return out;
}

/// Data exercising a config: signed gaussian for none/softsign, non-negative
/// (squared gaussian) for sqrt; heavy tails, an all-zero group, tiny and
/// large groups.
std::vector<float> quantData(int64_t n, const QuantConfig &c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    int64_t g = i / c.group;
    if (g % 7 == 3)
      v = v * v * v * 10.0f; // heavy tailed
    if (g % 11 == 5)
      v = v * 1e-6f; // small scales: f16 subnormal range
    if (g % 13 == 6)
      v = 0.0f; // an all-zero group
    if (c.compand == "sqrt" || c.compand == "e4m4")
      v = v * v;
    x[size_t(i)] = v;
  }
  return x;
}

void compareWithReference(const std::vector<float> &x, const QuantConfig &c) {
  CAPTURE(std::string(c.compand));
  CAPTURE(name(c.code));
  CAPTURE(name(c.scale));
  CAPTURE(c.group);
  CAPTURE(x.size());
  Quantized q = quantizeAll(x, c);
  ref::QuantEncoding enc = toRef(c);
  int64_t n = q.n, G = c.group, mismatches = 0;
  std::vector<int32_t> want(static_cast<size_t>(G));
  for (int64_t g = 0; g < q.groups; ++g) {
    int m = int(std::min(G, n - g * G));
    uint32_t wantScale =
        ref::quantize_group(x.data() + g * G, m, enc, want.data());
    if (q.scaleBits(g) != wantScale && mismatches++ < 5)
      FAIL_CHECK("group " << g << ": scale 0x" << std::hex << q.scaleBits(g)
                          << ", want 0x" << wantScale);
    for (int i = 0; i < m; ++i)
      if (q.code(g * G + i, c.code) != want[size_t(i)] && mismatches++ < 5)
        FAIL_CHECK("element " << g * G + i << " (x = " << x[size_t(g * G + i)]
                              << "): code " << q.code(g * G + i, c.code)
                              << ", want " << want[size_t(i)]);
  }
  std::vector<float> d = dequantizeAll(q, c);
  for (int64_t i = 0; i < n; ++i) {
    float w = ref::dequantize(q.code(i, c.code), q.scaleBits(i / G), enc);
    if (!sameFloat(d[size_t(i)], w) && mismatches++ < 5)
      FAIL_CHECK("dequantized element " << i << ": 0x" << std::hex
                                        << bits(d[size_t(i)]) << ", want 0x"
                                        << bits(w));
  }
  CHECK(mismatches == 0);
}

} // namespace

TEST_CASE("quantize / dequantize: every config and size matches the "
          "reference") {
  int configs = 0;
  for (const QuantConfig &c : allQuantConfigs()) {
    for (int64_t n : {1, 31, 33, 1000, 4097}) {
      compareWithReference(quantData(n, c, uint32_t(n)), c);
      // Signed data through the unsigned / sqrt encodings too (clamping at
      // 0, NaN from sqrt of negatives).
      std::vector<float> s = quantData(n, {"none", c.code, c.scale, 32}, 99);
      compareWithReference(s, c);
    }
    ++configs;
  }
  CHECK(configs == 24);
  // Other group sizes, including a non-power of two.
  for (int64_t G : {16, 128, 7})
    for (const QuantConfig &c0 : allQuantConfigs()) {
      QuantConfig c = c0;
      c.group = G;
      compareWithReference(quantData(1000, c, 5), c);
    }
}

TEST_CASE("quantize / dequantize: rounding ties and edge codes match the "
          "reference") {
  // Values chosen so that t * N lands on and around k + 0.5.
  std::vector<float> x;
  for (int k = -127; k <= 127; ++k) {
    float base = (float(k) + 0.5f) / 127.0f;
    x.push_back(base);
    x.push_back(std::nextafter(base, 2.0f));
    x.push_back(std::nextafter(base, -2.0f));
  }
  x.push_back(1.0f); // absmax of its group keeps the scale at 1
  for (const QuantConfig &c0 : allQuantConfigs()) {
    QuantConfig c = c0;
    std::vector<float> xx = x;
    if (c.compand == "sqrt")
      for (float &v : xx)
        v = v * v;
    compareWithReference(xx, c);
  }
}

TEST_CASE("quantize: worked examples of the FlashOptim numerics") {
  // One group of 32, the remaining 27 elements zero.
  std::vector<float> m(32, 0.0f), v(32, 0.0f);
  const float mv[] = {1.0f, -0.5f, 0.25f, 0.0f, -0.1f};
  const float vv[] = {4.0f, 1.0f, 0.25f, 0.0f, 0.01f};
  for (int i = 0; i < 5; ++i) {
    m[size_t(i)] = mv[i];
    v[size_t(i)] = vv[i];
  }
  QuantConfig cm{"softsign", DType::I8, DType::F16};
  Quantized qm = quantizeAll(m, cm);
  const int32_t wantM[] = {127, -85, 51, 0, -23};
  for (int i = 0; i < 5; ++i)
    CHECK(qm.code(i, DType::I8) == wantM[i]);
  CHECK(qm.scaleBits(0) == 0x3C00); // 1.0
  std::vector<float> dm = dequantizeAll(qm, cm);
  const double wantDm[] = {1.0, -0.502959, 0.251232, 0, -0.099567};
  for (int i = 0; i < 5; ++i)
    CHECK(dm[size_t(i)] == doctest::Approx(wantDm[i]).epsilon(1e-5));

  QuantConfig cv{"sqrt", DType::U8, DType::F16};
  Quantized qv = quantizeAll(v, cv);
  const int32_t wantV[] = {255, 128, 64, 0, 13};
  for (int i = 0; i < 5; ++i)
    CHECK(qv.code(i, DType::U8) == wantV[i]);
  CHECK(qv.scaleBits(0) == 0x4000); // 2.0
  std::vector<float> dv = dequantizeAll(qv, cv);
  const double wantDv[] = {4.0, 1.007859, 0.251965, 0, 0.010396};
  for (int i = 0; i < 5; ++i)
    CHECK(dv[size_t(i)] == doctest::Approx(wantDv[i]).epsilon(1e-5));
}

TEST_CASE("quantize / dequantize: accuracy on random data") {
  struct Case {
    QuantConfig c;
    bool nonNegative;
  };
  std::vector<Case> cases;
  for (DType s : {DType::F16, DType::BF16, DType::F32}) {
    cases.push_back({{"none", DType::I8, s}, false});
    cases.push_back({{"softsign", DType::I8, s}, false});
    cases.push_back({{"none", DType::U8, s}, true});
    cases.push_back({{"sqrt", DType::U8, s}, true});
  }
  for (const Case &k : cases) {
    CAPTURE(k.c.compand);
    CAPTURE(name(k.c.code));
    CAPTURE(name(k.c.scale));
    for (int64_t n : {1000, 4097, 65536}) {
      CAPTURE(n);
      std::mt19937 rng(uint32_t(n) + 11);
      std::normal_distribution<float> normal(0.0f, 0.01f);
      std::vector<float> x(static_cast<size_t>(n));
      for (float &v : x) {
        v = normal(rng);
        if (k.nonNegative)
          v = v * v;
      }
      Quantized q = quantizeAll(x, k.c);
      std::vector<float> d = dequantizeAll(q, k.c);
      double dot = 0, nx = 0, nd = 0, sumAbs = 0, absmax = 0;
      for (int64_t i = 0; i < n; ++i) {
        double a = x[size_t(i)], b = d[size_t(i)];
        dot += a * b;
        nx += a * a;
        nd += b * b;
        sumAbs += std::fabs(a - b);
        absmax = std::max(absmax, std::fabs(a));
      }
      double cos = dot / std::sqrt(nx * nd);
      double mae = sumAbs / double(n);
      CHECK(cos > 0.9999);
      CHECK(mae <= 1.6 * absmax / 255.0);
      // Each group's absmax element maps to the extreme code.
      for (int64_t g = 0; g < q.groups; ++g) {
        int64_t best = g * 32;
        for (int64_t i = g * 32; i < std::min(n, g * 32 + 32); ++i)
          if (std::fabs(x[size_t(i)]) > std::fabs(x[size_t(best)]))
            best = i;
        int32_t want = k.c.code == DType::I8 ? 127 : 255;
        CHECK(std::abs(q.code(best, k.c.code)) == want);
      }
    }
  }
}

TEST_CASE("quantize / dequantize: zero groups stay exactly zero") {
  for (const QuantConfig &c : allQuantConfigs()) {
    CAPTURE(std::string(c.compand));
    CAPTURE(name(c.code));
    CAPTURE(name(c.scale));
    std::vector<float> x(70, 0.0f);
    x[40] = -0.0f;
    x[69] = 0.5f; // the tail group is not zero
    Quantized q = quantizeAll(x, c);
    const bool minifloat = c.compand == "e3m4" || c.compand == "e4m4";
    // Linear codes: the scale narrow_S(1e-12), 0 for f16. Minifloat codes
    // (§2d): the smallest power of two of the range, 2^lo_S.
    uint32_t wantZeroScale =
        minifloat ? (c.scale == DType::F16    ? 0x0400u
                     : c.scale == DType::BF16 ? 0x0080u
                                              : 0x00800000u)
        : c.scale == DType::F16  ? 0u
        : c.scale == DType::BF16 ? ref::f32_to_bf16(1e-12f)
                                 : bits(1e-12f);
    CHECK(q.scaleBits(0) == wantZeroScale);
    CHECK(q.scaleBits(1) == wantZeroScale);
    for (int i = 0; i < 69; ++i)
      CHECK(q.code(i, c.code) == 0);
    std::vector<float> d = dequantizeAll(q, c);
    // Zero stays exactly +0, except in a zero-free code (e4m4, §2d), whose
    // code 0 is 2^-(emax + M) = 2^-19 of the scale: 2^-33 with f16 scales,
    // 2^-145 (an f32 subnormal) with bf16 and f32 scales. The tail group's
    // zeros (scale 0.5 / 1.9375 rounded up to 2^-1) are 2^-20.
    const bool zeroFree = c.compand == "e4m4";
    uint32_t wantZero = !zeroFree                ? 0u
                        : c.scale == DType::F16 ? bits(std::ldexp(1.0f, -33))
                                                : bits(std::ldexp(1.0f, -145));
    for (int i = 0; i < 64; ++i)
      CHECK(bits(d[size_t(i)]) == wantZero);
    for (int i = 64; i < 69; ++i)
      CHECK(bits(d[size_t(i)]) ==
            (zeroFree ? bits(std::ldexp(1.0f, -20)) : 0u));
    CHECK(d[69] == doctest::Approx(0.5).epsilon(0.01));
  }
}

TEST_CASE("quantize / dequantize: NaN and Inf poison only their group") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const QuantConfig &c : allQuantConfigs()) {
    CAPTURE(std::string(c.compand));
    CAPTURE(name(c.code));
    CAPTURE(name(c.scale));
    std::vector<float> x(96);
    for (int i = 0; i < 96; ++i)
      x[size_t(i)] = 0.01f * float(i % 32 + 1);
    x[5] = nan; // group 0
    x[40] = inf; // group 1
    Quantized q = quantizeAll(x, c);
    std::vector<float> d = dequantizeAll(q, c);
    const bool minifloat = c.compand == "e3m4" || c.compand == "e4m4";
    const int32_t top = c.code == DType::I8 ? 127 : 255;
    // NaN: the NaN-propagating absmax makes the scale NaN and every element
    // of the group NaN. Linear codes: every code 0. Minifloat codes (§2d):
    // the codes are taken against the largest scale, the NaN's is top.
    float s0;
    codec::widen(&q.scales[0], c.scale, 1, &s0);
    CHECK(std::isnan(s0));
    for (int i = 0; i < 32; ++i) {
      if (!minifloat)
        CHECK(q.code(i, c.code) == 0);
      CHECK(std::isnan(d[size_t(i)]));
    }
    if (minifloat)
      CHECK(q.code(5, c.code) == top);
    // Inf: scale inf. Linear codes 0 (x / inf = 0, inf / inf = NaN -> 0),
    // and the group decodes to 0 * inf = NaN. Minifloat codes: the inf's
    // code is top and the group decodes to V * inf = +-inf (a signed code 0:
    // NaN). Visible either way, never silently finite.
    float s1;
    codec::widen(&q.scales[size_t(q.scaleBytes)], c.scale, 1, &s1);
    CHECK(s1 == inf);
    for (int i = 32; i < 64; ++i) {
      if (!minifloat) {
        CHECK(q.code(i, c.code) == 0);
        CHECK(std::isnan(d[size_t(i)]));
      } else {
        CHECK_FALSE(std::isfinite(d[size_t(i)]));
      }
    }
    if (minifloat) {
      CHECK(q.code(40, c.code) == top);
      CHECK(d[40] == inf);
    }
    // The last group is untouched.
    for (int i = 64; i < 96; ++i)
      CHECK(std::isfinite(d[size_t(i)]));
    // Linear codes put the absmax at top; a power-of-two scale puts 0.32 at
    // V = 1.28 of 2^-2 (code emax * 16 + 4, 0.3125: within 1/32).
    if (!minifloat)
      CHECK(q.code(95, c.code) == top);
    else
      CHECK(d[95] == doctest::Approx(0.32).epsilon(1.0 / 32));
  }
}

TEST_CASE("quantize: a tail group is computed from its valid elements only") {
  // 33 elements in groups of 32: the second group holds one element and its
  // scale comes from that element alone (as if padded with zeros).
  QuantConfig c{"none", DType::I8, DType::F32};
  std::vector<float> x(33, 100.0f);
  x[32] = -0.25f;
  Quantized q = quantizeAll(x, c);
  CHECK(q.groups == 2);
  CHECK(fromBits(q.scaleBits(0)) == 100.0f);
  CHECK(fromBits(q.scaleBits(1)) == 0.25f);
  CHECK(q.code(32, DType::I8) == -127);
  std::vector<float> d = dequantizeAll(q, c);
  CHECK(d[32] == -0.25f);
}

TEST_CASE("minifloat codes: decoded values encode back to themselves") {
  // docs/NUMERICS.md §2d: the grid of a minifloat times a power of two is the
  // same at every power of two, so the f32 form of a state (a checkpoint's,
  // a state dict's) loads back bit for bit, whichever code the group's
  // largest value had.
  for (const QuantConfig &c : allQuantConfigs()) {
    if (c.compand != "e3m4" && c.compand != "e4m4")
      continue;
    CAPTURE(std::string(c.compand));
    CAPTURE(name(c.scale));
    std::vector<float> x = quantData(4097, c, 17);
    Quantized q = quantizeAll(x, c);
    std::vector<float> d = dequantizeAll(q, c);
    Quantized q2 = quantizeAll(d, c);
    std::vector<float> d2 = dequantizeAll(q2, c);
    int64_t differ = 0;
    for (size_t i = 0; i < d.size(); ++i)
      differ += !sameFloat(d[i], d2[i]);
    CHECK(differ == 0);
  }
  // A code's signedness is the format's: e3m4 in u8 or e4m4 in i8 is no
  // encoding.
  CHECK_FALSE(codec::valid_quant_encoding(DType::U8, DType::BF16, "e3m4", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I8, DType::BF16, "e4m4", 32));
  CHECK(codec::valid_quant_encoding(DType::I8, DType::BF16, "e3m4", 32));
}

//===----------------------------------------------------------------------===//
// 4-bit codes (packed i4/ui4, docs/design/4bit-states.md §6 "The codec")
//===----------------------------------------------------------------------===//

namespace {

struct Code4 {
  const char *compand;
  DType code;
};
const Code4 kCodes4[] = {{"e2m1", DType::I4},
                         {"e3m0", DType::I4},
                         {"e3m1", DType::U4},
                         {"e4m0", DType::U4}};

/// The codes of a packed buffer, one per element (independent of the
/// codec: the even element in the low nibble, signed nibbles two's
/// complement).
int32_t nibbleAt(const std::vector<uint8_t> &bytes, DType t, size_t i) {
  int32_t nib = (bytes[i / 2] >> (i % 2 ? 4 : 0)) & 15;
  return t == DType::I4 && nib >= 8 ? nib - 16 : nib;
}

std::vector<float> decode4(const std::vector<uint8_t> &codes, DType code,
                           const std::vector<uint8_t> &scales, DType scale,
                           const char *compand, int64_t group, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  codec::dequantize(codes.data(), code, scales.data(), scale, compand, group,
                    n, out.data());
  return out;
}

} // namespace

TEST_CASE("4-bit codes: valid encodings are a minifloat of the code's width "
          "and signedness") {
  for (DType scale : {DType::F16, DType::BF16, DType::F32})
    for (const Code4 &c : kCodes4)
      CHECK(codec::valid_quant_encoding(c.code, scale, c.compand, 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::U4, DType::BF16, "e2m1", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I4, DType::BF16, "e3m1", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I8, DType::BF16, "e2m1", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::U8, DType::BF16, "e4m0", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::I4, DType::BF16, "e3m4", 32));
  CHECK_FALSE(codec::valid_quant_encoding(DType::U4, DType::BF16, "e4m4", 32));
  for (const char *linear : {"none", "softsign", "sqrt"}) {
    CHECK_FALSE(codec::valid_quant_encoding(DType::I4, DType::BF16, linear, 32));
    CHECK_FALSE(codec::valid_quant_encoding(DType::U4, DType::BF16, linear, 32));
  }
}

TEST_CASE("4-bit codes: every code decodes to its formula value times the "
          "scale and encodes back to itself") {
  // Groups of 16 elements, element k holding nibble k, each group at its
  // own power-of-two scale: the 16 codes of every format at three scales.
  const int64_t G = 16;
  const float kScales[] = {1.0f, 0.125f, 32.0f};
  for (const Code4 &c : kCodes4)
    for (DType scale : {DType::BF16, DType::F16, DType::F32}) {
      CAPTURE(std::string(c.compand));
      CAPTURE(int(scale));
      const abi::MinifloatFormat f = *abi::minifloat_format(c.compand);
      REQUIRE(f.codeBits() == 4);
      const int64_t n = G * 3;
      std::vector<uint8_t> codes(size_t(n / 2));
      for (int64_t i = 0; i < n; i += 2)
        codes[size_t(i / 2)] = uint8_t((i % G) | (((i + 1) % G) << 4));
      std::vector<uint8_t> scales(size_t(3 * 4));
      for (int g = 0; g < 3; ++g) {
        if (scale == DType::F32)
          std::memcpy(scales.data() + 4 * g, &kScales[g], 4);
        else {
          uint16_t h = scale == DType::BF16 ? flashopt::host::f32_to_bf16(kScales[g])
                                            : flashopt::host::f32_to_f16(kScales[g]);
          std::memcpy(scales.data() + 2 * g, &h, 2);
        }
      }
      std::vector<float> d =
          decode4(codes, c.code, scales, scale, c.compand, G, n);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t q = nibbleAt(codes, c.code, size_t(i));
        CAPTURE(q);
        // Signed nibbles are two's complement: 8..15 are -8..-1; -8 is
        // never written but decodes by the formula too.
        CHECK(q == (c.code == DType::I4 && i % G >= 8 ? i % G - 16 : i % G));
        const int32_t mag = q < 0 ? -q : q;
        const float v = float(f.value(mag)) * kScales[i / G];
        CHECK(sameFloat(d[size_t(i)], q < 0 ? -v : v));
      }
      // Every code the encoder writes (-7..7 signed, 0..15 unsigned)
      // encodes back to itself from its decoded value: groups of the
      // written codes, the top code in each (so the scale is the same).
      std::vector<int32_t> written;
      for (int32_t q = c.code == DType::I4 ? -f.topCode() : 0;
           q <= f.topCode(); ++q)
        written.push_back(q);
      REQUIRE(written.size() == (c.code == DType::I4 ? 15u : 16u));
      const int64_t m = int64_t(written.size());
      std::vector<float> x;
      for (float s : kScales)
        for (int32_t q : written) {
          const float v = float(f.value(q < 0 ? -q : q)) * s;
          x.push_back(q < 0 ? -v : v);
        }
      const int64_t nx = int64_t(x.size());
      std::vector<uint8_t> back(size_t(nx / 2 + 1), 0xFF), bs(12, 0);
      codec::quantize(x.data(), nx, m, c.compand, back.data(), c.code,
                      bs.data(), scale);
      for (int64_t i = 0; i < nx; ++i) {
        CAPTURE(i);
        CHECK(nibbleAt(back, c.code, size_t(i)) == written[size_t(i % m)]);
      }
      if (nx % 2)
        CHECK((back[size_t(nx / 2)] >> 4) == 0); // the pad nibble
      std::vector<float> again =
          decode4(back, c.code, bs, scale, c.compand, m, nx);
      for (int64_t i = 0; i < nx; ++i)
        CHECK(sameFloat(again[size_t(i)], x[size_t(i)]));
    }
}

TEST_CASE("4-bit codes: the f32 form of a packed state round-trips, and an "
          "odd length's pad nibble stays 0") {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Code4 &c : kCodes4)
    for (int64_t n : {int64_t(1), int64_t(2), int64_t(33), int64_t(64),
                      int64_t(4097)}) {
      CAPTURE(std::string(c.compand));
      CAPTURE(n);
      abi::StateSpec s;
      s.name = "exp_avg";
      s.kind = abi::StateKind::Quantized;
      s.storage = c.code;
      s.group = 32;
      s.compand = c.compand;
      s.scale = DType::BF16;
      const bool isSigned = c.code == DType::I4;
      std::vector<float> x(static_cast<size_t>(n));
      for (float &v : x) {
        v = normal(rng) * 1e-3f;
        v = isSigned ? v : v * v;
      }
      const size_t bytes = size_t(abi::dtype_bytes(c.code, uint64_t(n)));
      CHECK(bytes == size_t((n + 1) / 2));
      const int64_t ng = (n + 31) / 32;
      // Canaries: bytes past the end, and every nibble pre-set, so a pad
      // nibble left as it was shows.
      std::vector<uint8_t> codes(bytes + 4, 0xAB), scales(size_t(2 * ng) + 4, 0xCD);
      codec::encode_state(s, x.data(), 32, n, {codes.data(), scales.data()});
      for (size_t k = bytes; k < codes.size(); ++k)
        CHECK(codes[k] == 0xAB);
      for (size_t k = size_t(2 * ng); k < scales.size(); ++k)
        CHECK(scales[k] == 0xCD);
      if (n % 2)
        CHECK((codes[bytes - 1] >> 4) == 0);
      std::vector<float> d(static_cast<size_t>(n));
      codec::decode_state(s, {codes.data(), scales.data()}, 32, n, d.data());
      // The decoded values (the f32 form: export_state_f32, a checkpoint's)
      // encode back to the same values: a group whose decoded absmax fell
      // an octave takes half the scale and its codes move one octave of
      // the same grid, and from then on the bytes are fixed.
      std::vector<uint8_t> codes2(bytes, 0x5A), scales2(size_t(2 * ng), 0);
      codec::encode_state(s, d.data(), 32, n, {codes2.data(), scales2.data()});
      if (n % 2)
        CHECK((codes2[bytes - 1] >> 4) == 0);
      std::vector<float> d2(static_cast<size_t>(n));
      codec::decode_state(s, {codes2.data(), scales2.data()}, 32, n, d2.data());
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i)
        differ += !sameFloat(d[size_t(i)], d2[size_t(i)]);
      CHECK(differ == 0);
      std::vector<uint8_t> codes3(bytes, 0xA5), scales3(size_t(2 * ng), 0);
      codec::encode_state(s, d2.data(), 32, n, {codes3.data(), scales3.data()});
      CHECK(std::memcmp(codes3.data(), codes2.data(), bytes) == 0);
      CHECK(std::memcmp(scales3.data(), scales2.data(), size_t(2 * ng)) == 0);
    }
}
