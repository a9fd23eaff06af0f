//===- Float16Test.cpp - Half-precision conversions ----------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// runtime/include/flashopt/host/Float16.h: round to nearest even, overflow,
/// subnormals, NaN, and the round trip of every finite value.
///
//===----------------------------------------------------------------------===//

#include "RuntimeTestSupport.h"
#include "flashopt/host/Float16.h"

#include <cmath>

using namespace flashopt::testing;

TEST_CASE("bf16 and f16 conversions round to nearest even") {
  CHECK(f32_to_bf16(1.0f) == 0x3F80);
  CHECK(bf16_to_f32(0x3F80) == 1.0f);
  CHECK(f32_to_bf16(f32_from_bits(0x3F808000u)) == 0x3F80); // tie -> even
  CHECK(f32_to_bf16(f32_from_bits(0x3F818000u)) == 0x3F82); // tie -> even
  CHECK(f32_to_bf16(f32_from_bits(0x3F808001u)) == 0x3F81);
  CHECK(f32_to_bf16(f32_from_bits(0x7F7FFFFFu)) == 0x7F80); // overflow -> inf
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  CHECK(f32_to_f16(1.0f) == 0x3C00);
  CHECK(f16_to_f32(0x3C00) == 1.0f);
  CHECK(f32_to_f16(65504.0f) == 0x7BFF);
  CHECK(f32_to_f16(65519.0f) == 0x7BFF);
  CHECK(f32_to_f16(65520.0f) == 0x7C00);
  CHECK(f32_to_f16(-1e9f) == 0xFC00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001); // smallest subnormal
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000); // tie -> even (zero)
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_to_f32(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  // Round trip of every finite f16 and bf16 value.
  bool ok = true;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) != 0x7C00 && f32_to_f16(f16_to_f32(uint16_t(h))) != h)
      ok = false;
    if ((h & 0x7F80) != 0x7F80 && f32_to_bf16(bf16_to_f32(uint16_t(h))) != h)
      ok = false;
  }
  CHECK(ok);
}
