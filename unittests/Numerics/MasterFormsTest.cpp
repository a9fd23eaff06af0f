//===- MasterFormsTest.cpp - The kernels' master-weight forms ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-expand-encodings computes the master weight's correction
/// scaling in fewer operations than docs/NUMERICS.md §1 writes it ("The same
/// bits in fewer operations"). These tests mirror the kernels' forms in
/// scalar C++ and hold them to the reference's (§1's) forms bit for bit:
/// every bf16 pattern with every i8 code and a sweep of i16 codes for the
/// decode, and every bf16/f16 pattern with residuals across and beyond its
/// rounding range (and ±inf, NaN, overflow) for the encode. The kernels
/// themselves are held to the reference by unittests/Conformance.
///
//===----------------------------------------------------------------------===//

#include "flashopt_reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <ios>
#include <limits>
#include <random>

using namespace flashopt::ref;

namespace {

/// The same float, or both NaN.
bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bitsOf(a) == bitsOf(b);
}

/// F' << 23 as the kernels build it: the exponent field in the f32
/// exponent's place, clamped to [1, 254] (bf16) or [1, 31] (f16).
uint32_t fieldAt23(uint16_t narrow, DType p) {
  bool bf = p == DType::BF16;
  uint32_t f = (uint32_t(narrow) & (bf ? 0x7F80u : 0x7C00u)) << (bf ? 16 : 13);
  f = std::max<uint32_t>(f, 1u << 23);
  return bf ? std::min<uint32_t>(f, 254u << 23) : f;
}

/// The kernels' bf16 decode: (c * 2^-8) * 2^(F' - 127).
float decodeBf16Kernel(uint16_t narrow, int32_t rho, DType c) {
  float r = bf16_to_f32(narrow);
  float cc = float(rho) / float(correctionMax(c));
  float c8 = cc * 0x1p-8f;
  float e = c8 * floatOf(fieldAt23(narrow, DType::BF16));
  return r + e;
}

/// The kernels' encode: bf16 clamp((e * 2^(128 - F')) * (2^7 N), -N, N),
/// f16 clamp(e * 2^(26 - F'), -1, 1) * N; the rounding as §1.
void encodeKernel(float theta, DType p, DType c, uint16_t *narrowOut,
                  int32_t *rhoOut) {
  uint16_t nb = narrowBits(p, theta);
  float r = widenBits(p, nb);
  float e = theta - r;
  uint32_t f = fieldAt23(nb, p);
  float n = float(correctionMax(c));
  // bf16: clamp(en, -1, 1) * N as clamp(en * N, -N, N), with the 2^7 in N.
  float s = p == DType::BF16
                ? minimumf(maximumf((e * floatOf(0x7F800000u - f)) * (128.0f * n), -n), n)
                : minimumf(maximumf(e * floatOf((153u << 23) - f), -1.0f), 1.0f) * n;
  float rho = std::isnan(s) ? 0.0f : std::copysign(std::floor(std::fabs(s) + 0.5f), s);
  *narrowOut = nb;
  *rhoOut = int32_t(rho);
}

} // namespace

TEST_CASE("master weight: the kernels' bf16 decode equals NUMERICS §1 for every "
          "bf16 pattern and code") {
  int64_t checked = 0, bad = 0;
  for (uint32_t n = 0; n < 65536; ++n) {
    for (int32_t rho = -128; rho <= 127; ++rho) {
      float want = ecc_decode(uint16_t(n), rho, DType::BF16, DType::I8);
      float got = decodeBf16Kernel(uint16_t(n), rho, DType::I8);
      bad += !same(want, got);
      ++checked;
    }
    for (int32_t rho : {-32768, -32767, -32766, -16384, -255, -1, 0, 1, 2, 127, 255,
                        4097, 16383, 16384, 32766, 32767}) {
      float want = ecc_decode(uint16_t(n), rho, DType::BF16, DType::I16);
      float got = decodeBf16Kernel(uint16_t(n), rho, DType::I16);
      bad += !same(want, got);
      ++checked;
    }
  }
  INFO(checked << " cases");
  CHECK(bad == 0);
  CHECK(checked == 65536LL * (256 + 16));
}

TEST_CASE("master weight: the kernels' encode equals NUMERICS §1 around every "
          "bf16 and f16 pattern, and at the extremes") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  int64_t checked = 0, bad = 0;
  auto check = [&](float theta, DType p, DType c) {
    uint16_t nw, ng;
    int32_t rw, rg;
    ecc_encode(theta, p, c, &nw, &rw);
    encodeKernel(theta, p, c, &ng, &rg);
    bool ok = nw == ng && rw == rg;
    if (!ok && bad < 5)
      MESSAGE("theta " << theta << " (0x" << std::hex << bitsOf(theta) << std::dec
                       << "): narrow " << nw << " vs " << ng << ", rho " << rw
                       << " vs " << rg);
    bad += !ok;
    ++checked;
  };
  for (DType p : {DType::BF16, DType::F16}) {
    for (uint32_t n = 0; n < 65536; ++n) {
      float r = widenBits(p, uint16_t(n));
      if (!std::isfinite(r))
        continue;
      // The rounding range of the narrow value: half its ulp either way
      // (1.5x, to cross into the neighbours), plus single f32 ulps.
      uint16_t up = uint16_t(n + 1);
      float next = widenBits(p, up);
      float half = std::isfinite(next) && next != r ? std::fabs(next - r) : 0x1p-24f;
      for (int k = 0; k < 6; ++k)
        for (DType c : {DType::I8, DType::I16})
          check(r + u(rng) * half, p, c);
      for (int d = -3; d <= 3; ++d)
        check(floatOf(bitsOf(r) + uint32_t(d)), p, DType::I8);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                  0x1.fefffep127f, 0x1.ff0000p127f, 0x1.ff0002p127f, 65519.0f,
                  65520.0f, -65520.0f, 0x1p-149f, -0x1p-149f, 0.0f, -0.0f})
    for (DType p : {DType::BF16, DType::F16})
      for (DType c : {DType::I8, DType::I16})
        check(t, p, c);
  INFO(checked << " cases");
  CHECK(bad == 0);
  CHECK(checked > 2000000);
}
