//===- Minifloat.h - the minifloat state codes ------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The minifloat codes of quantized states (docs/NUMERICS.md §2d): one
/// format model for the compiler (the decode and encode IR) and the
/// runtime's codec, MLIR-free.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_MINIFLOAT_H
#define FLASHOPT_ABI_MINIFLOAT_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace flashopt::abi {

/// The values of one minifloat format (docs/NUMERICS.md §2d): magnitude code
/// c = e·2^M + f decodes, for e ≥ 1, to 2^(e − emax)·(1 + f/2^M) with
/// emax = 2^E − 1, the top code to 2 − 2^-M. Codes with e = 0 are
/// subnormals, f·2^(1 − emax − M), in a format that has them; otherwise they
/// decode to 0 (signed codes) or, zero-free, to 2^-emax, half the smallest
/// normal (unsigned codes). Unsigned codes are zero-free: with subnormals,
/// code 0 decodes to half the smallest subnormal.
struct MinifloatFormat {
  int exponentBits, mantissaBits;
  bool isSigned;
  bool subnormals;

  int emax() const { return (1 << exponentBits) - 1; }
  /// The width of a code: exponent, mantissa and (signed) a sign bit.
  int codeBits() const {
    return exponentBits + mantissaBits + (isSigned ? 1 : 0);
  }
  /// The largest magnitude code.
  int32_t topCode() const { return (1 << (exponentBits + mantissaBits)) - 1; }
  /// The smallest magnitude code of a normal value (e = 1).
  int32_t firstNormalCode() const { return 1 << mantissaBits; }
  /// What a magnitude code's bits add to the f32 exponent field, in the
  /// code's units: (127 − emax)·2^M.
  int32_t exponentBias() const { return (127 - emax()) << mantissaBits; }
  /// The f32 value of the top code, 2 − 2^-M.
  double topValue() const { return 2.0 - std::ldexp(1.0, -mantissaBits); }
  /// The smallest normal value, 2^(1 − emax).
  double smallestNormal() const { return std::ldexp(1.0, 1 - emax()); }
  /// What rounds a positive f32's bits up to the least power of two at least
  /// its value over topValue() (then masked with 0xFF800000): 2^23 less the
  /// top value's mantissa bits, less 1.
  int32_t scaleRoundUpAddend() const {
    return 0x7FFFFF - (((1 << mantissaBits) - 1) << (23 - mantissaBits));
  }
  /// The exponents a group scale 2^E may take in a scale type whose normal
  /// exponents are [lo, hi]: at most emax + 22, so that 2^(emax − 127 − E)
  /// (the encode's factor) stays an f32 (subnormal at worst).
  std::pair<int, int> scaleExponentRange(int lo, int hi) const {
    return {lo, std::min(hi, emax() + 22)};
  }
  /// The value of magnitude code c (0 ≤ c ≤ topCode()).
  double value(int32_t c) const {
    int e = c >> mantissaBits, f = c & ((1 << mantissaBits) - 1);
    if (e > 0)
      return std::ldexp(1.0 + std::ldexp(double(f), -mantissaBits), e - emax());
    if (subnormals && (f != 0 || isSigned))
      return std::ldexp(double(f), 1 - emax() - mantissaBits);
    if (subnormals) // zero-free: half the smallest subnormal
      return std::ldexp(1.0, -emax() - mantissaBits);
    return isSigned ? 0.0 : std::ldexp(1.0, -emax());
  }
};

/// The format of a minifloat compander, or nullopt for the linear
/// companders. 8-bit codes: "e3m4" (signed, subnormals), "e4m4" (unsigned,
/// zero-free, subnormals). 4-bit codes (docs/NUMERICS.md §2e): "e2m1"
/// (signed, subnormals: ±{0, 1/8, 1/4, 3/8, 1/2, 3/4, 1, 3/2}), "e3m0"
/// (signed, no subnormals: ±{0, 2^-6, ..., 1/2, 1}), "e3m1" (unsigned,
/// zero-free, subnormals: {2^-8, 2^-7, 2^-6, 3·2^-7, ..., 1, 3/2}), "e4m0"
/// (unsigned, zero-free, no subnormals: {2^-15, 2^-14, ..., 1}).
inline std::optional<MinifloatFormat>
minifloat_format(std::string_view compand) {
  if (compand == "e3m4")
    return MinifloatFormat{3, 4, true, true};
  if (compand == "e4m4")
    return MinifloatFormat{4, 4, false, true};
  if (compand == "e2m1")
    return MinifloatFormat{2, 1, true, true};
  if (compand == "e3m0")
    return MinifloatFormat{3, 0, true, false};
  if (compand == "e3m1")
    return MinifloatFormat{3, 1, false, true};
  if (compand == "e4m0")
    return MinifloatFormat{4, 0, false, false};
  return std::nullopt;
}

} // namespace flashopt::abi

#endif // FLASHOPT_ABI_MINIFLOAT_H
