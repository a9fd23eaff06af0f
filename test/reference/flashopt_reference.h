//===- flashopt_reference.h - Independent scalar reference ------*- C++ -*-===//
//
// Part of flashopt (test code only).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A scalar implementation of docs/NUMERICS.md, written from the contract
/// and sharing nothing with the compiler or the rule text. Every f32
/// operation is one IEEE rounding in the documented order; compile with
/// -ffp-contract=off. Buffers are laid out as the kernel ABI's
/// (docs/KERNEL-ABI.md), so generated kernels can be compared bit for bit.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TEST_REFERENCE_FLASHOPT_REFERENCE_H
#define FLASHOPT_TEST_REFERENCE_FLASHOPT_REFERENCE_H

// Built with -ffp-contract=off (see the CMake targets that include it).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace flashopt::ref {

/// I4 and U4: 4-bit codes, two per byte, the even element in the low nibble
/// (docs/KERNEL-ABI.md).
enum class DType { BF16, F16, F32, I8, U8, I16, None, I4, U4 };
/// The linear codes (None, Softsign, Sqrt: docs/NUMERICS.md §2), the 8-bit
/// minifloat codes (E3M4 signed, E4M4 unsigned: §2d) and the 4-bit ones
/// (E2M1, E3M0 signed; E3M1, E4M0 unsigned: §2e).
enum class Compand { None, Softsign, Sqrt, E3M4, E4M4, E2M1, E3M0, E3M1, E4M0 };

struct QuantEncoding {
  bool isSigned = true;
  Compand compand = Compand::None;
  DType scale = DType::F16;
  int group = 32;
  /// The code width: 8 (i8, ui8, one per byte) or 4 (i4, ui4, packed).
  int bits = 8;
};

struct StateEncoding {
  bool quantized = false;
  DType plain = DType::F32;
  QuantEncoding q;
};

struct Config {
  std::string rule;
  DType param = DType::BF16;
  DType correction = DType::None;
  DType grad = DType::BF16;
  std::vector<StateEncoding> states;
  int group_size = 32;
  /// The portable fast mode (docs/NUMERICS.md §7): "arithmetic": "fast".
  bool fast = false;
  /// The bounded numerics (docs/NUMERICS.md §8, the default): dithered state
  /// codes and Adam's update bound; false: FlashOptim's numerics.
  bool bounded = true;
};

//===----------------------------------------------------------------------===//
// Bit-level conversions (RTNE)
//===----------------------------------------------------------------------===//

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) // NaN: keep sign, quiet it.
    return uint16_t((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7FFFu + lsb) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return floatOf(uint32_t(h) << 16); }

inline uint16_t f32_to_f16(float f) {
  uint32_t u = bitsOf(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) // NaN
    return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) // >= 65520 rounds to inf
    return uint16_t(sign | 0x7C00u);
  if (a >= 0x38800000u) { // normal f16 (>= 2^-14)
    uint32_t mant = a & 0x7FFFFFu;
    uint32_t exp = (a >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
      ++h;
    return uint16_t(sign | h);
  }
  if (a < 0x33000000u) // below half the smallest subnormal (2^-25): zero
    return uint16_t(sign);
  // Subnormal f16: value = m * 2^-24.
  uint32_t exp = a >> 23;
  uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126 - exp; // 2^(exp-127) * mant/2^23 / 2^-24
  uint32_t h = mant >> (shift);
  uint32_t rest = mant & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u)))
    ++h;
  return uint16_t(sign | h);
}
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F)
    return floatOf(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    float v = float(mant) * 5.9604644775390625e-8f; // exact: mant * 2^-24
    return sign ? -v : v;
  }
  return floatOf(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/// Widens a narrow storage value (bits in `raw`) to f32.
inline float widen(DType t, const void *p, int64_t i) {
  switch (t) {
  case DType::F32:
    return static_cast<const float *>(p)[i];
  case DType::BF16:
    return bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
  case DType::F16:
    return f16_to_f32(static_cast<const uint16_t *>(p)[i]);
  default:
    return 0.0f;
  }
}
/// A stored NaN is canonical (docs/NUMERICS.md §5): all ones but the sign.
inline uint32_t canonicalF32(uint32_t u) {
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFFFFFu : u;
}
inline uint16_t canonical16(DType t, uint16_t h) {
  uint16_t exp = t == DType::BF16 ? 0x7F80u : 0x7C00u;
  return (h & 0x7FFFu) > exp ? uint16_t(0x7FFFu) : h;
}

/// Narrows an f32 to storage `t` and stores it (NaNs canonical).
inline void narrowStore(DType t, void *p, int64_t i, float v) {
  switch (t) {
  case DType::F32:
    static_cast<float *>(p)[i] = floatOf(canonicalF32(bitsOf(v)));
    break;
  case DType::BF16:
    static_cast<uint16_t *>(p)[i] = canonical16(t, f32_to_bf16(v));
    break;
  case DType::F16:
    static_cast<uint16_t *>(p)[i] = canonical16(t, f32_to_f16(v));
    break;
  default:
    break;
  }
}
inline uint16_t narrowBits(DType t, float v) {
  return t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
inline float widenBits(DType t, uint16_t b) {
  return t == DType::BF16 ? bf16_to_f32(b) : f16_to_f32(b);
}

//===----------------------------------------------------------------------===//
// Master weight (docs/NUMERICS.md §1)
//===----------------------------------------------------------------------===//

/// 2^k for k in [-126, 127], exact.
inline float pow2(int32_t k) { return floatOf(uint32_t(k + 127) << 23); }

/// ℓ with 2^ℓ = ULP(θ')/2, from the narrow value's bits.
inline int32_t ell(uint16_t narrow, DType p) {
  int32_t m = p == DType::BF16 ? 7 : 10;
  int32_t bias = p == DType::BF16 ? 127 : 15;
  int32_t field = int32_t((narrow & 0x7FFFu) >> m);
  int32_t e = field == 0 ? 1 - bias : field - bias;
  return e - m - 1;
}

inline int32_t correctionMax(DType c) { return c == DType::I8 ? 127 : 32767; }

//===----------------------------------------------------------------------===//
// The portable fast mode (docs/NUMERICS.md §7)
//===----------------------------------------------------------------------===//

/// x / d where d is the same for a whole tensor or group (a per-step scalar,
/// a constant, a group's absmax): in fast mode, x times the IEEE reciprocal.
inline float divUniform(float x, float d, bool fast) {
  return fast ? x * (1.0f / d) : x / d;
}

/// A value as the fast mode's contractions see it (docs/NUMERICS.md §7): a
/// product `a * b` not rounded yet, which a later multiply by a uniform value
/// may fold into (when `b` is uniform) or an add may fuse with (one FMA), or
/// a plain value `a`. Every helper takes a Lazy that is used once; a value
/// used twice is rounded first (`value`), as the kernel's pass requires.
struct Lazy {
  float a = 0.0f, b = 1.0f;
  bool product = false;  // a * b, rounded when used
  bool uniformB = false; // b is the same for the whole tensor or group
  /// A fast softsign decode (a = RN(q / d0)): the code and its divisor, for
  /// a rule that pairs the quotient with its own (Rule::apply).
  float code = 0.0f, d0 = 0.0f;
  float value() const { return product ? a * b : a; }
};
inline Lazy plainL(float v) { return Lazy{v, 1.0f, false, false}; }

/// The arithmetic of one mode: exact rounds every operation; fast folds
/// `(x * u1) * u2` into `x * (u1 * u2)` (u1, u2 uniform) and fuses a
/// product used once into the add or subtract that consumes it, the left
/// operand's product first.
struct Arith {
  bool fast = false;
  /// x * u, u uniform.
  Lazy mulU(Lazy x, float u) const {
    if (fast && x.product && x.uniformB)
      return Lazy{x.a, x.b * u, true, true};
    return Lazy{x.value(), u, true, true};
  }
  /// x * y, both per element.
  Lazy mul(float x, float y) const { return Lazy{x, y, true, false}; }
  float add(Lazy l, Lazy r) const {
    if (fast && l.product)
      return std::fma(l.a, l.b, r.value());
    if (fast && r.product)
      return std::fma(r.a, r.b, l.value());
    return l.value() + r.value();
  }
  float sub(Lazy l, Lazy r) const {
    if (fast && l.product)
      return std::fma(l.a, l.b, -r.value());
    if (fast && r.product)
      return std::fma(-r.a, r.b, l.value());
    return l.value() - r.value();
  }
};
inline float ecc_decode(uint16_t narrow, int32_t rho, DType p, DType c,
                        bool fast = false) {
  float r = widenBits(p, narrow);
  int32_t l = ell(narrow, p);
  float cc = divUniform(float(rho), float(correctionMax(c)), fast);
  if (fast) // theta' + cc * 2^l as one FMA (2^l exact, subnormal included)
    return std::fma(cc, std::ldexp(1.0f, l), r);
  int32_t h = l >> 1;
  float e1 = cc * pow2(h);
  float e = e1 * pow2(l - h);
  return r + e;
}

/// NaN-propagating max/min (as arith.maximumf/minimumf).
inline float maximumf(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return NAN;
  if (a == 0.0f && b == 0.0f)
    return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
inline float minimumf(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return NAN;
  if (a == 0.0f && b == 0.0f)
    return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

inline void ecc_encode(float theta, DType p, DType c, uint16_t *narrowOut,
                       int32_t *rhoOut) {
  uint16_t nb = narrowBits(p, theta);
  float r = widenBits(p, nb);
  float e = theta - r;
  int32_t a = -ell(nb, p);
  int32_t h = a >> 1;
  float en1 = e * pow2(h);
  float en = en1 * pow2(a - h);
  float ec = minimumf(maximumf(en, -1.0f), 1.0f);
  float s = ec * float(correctionMax(c));
  float rho;
  if (std::isnan(s)) {
    rho = 0.0f;
  } else {
    float fl = std::floor(std::fabs(s) + 0.5f);
    rho = std::copysign(fl, s);
  }
  *narrowOut = nb;
  *rhoOut = int32_t(rho);
}

//===----------------------------------------------------------------------===//
// States (docs/NUMERICS.md §2)
//===----------------------------------------------------------------------===//

inline float scaleToF32(DType t, uint32_t bits) {
  if (t == DType::F32)
    return floatOf(bits);
  return widenBits(t, uint16_t(bits));
}
inline uint32_t scaleFromF32(DType t, float v) {
  if (t == DType::F32)
    return bitsOf(v);
  return narrowBits(t, v);
}

/// A minifloat format (docs/NUMERICS.md §2d): E exponent bits, M mantissa
/// bits, emax = 2^E - 1; signed codes carry a sign besides; e3m4 has
/// subnormals; unsigned codes (e4m4) are zero-free.
struct Minifloat {
  int E, M;
  bool isSigned, subnormals;
  int emax() const { return (1 << E) - 1; }
  int top() const { return (1 << (E + M)) - 1; }
};
inline bool isMinifloat(Compand c) {
  return c == Compand::E3M4 || c == Compand::E4M4 || c == Compand::E2M1 ||
         c == Compand::E3M0 || c == Compand::E3M1 || c == Compand::E4M0;
}
/// {E, M, signed, subnormals}: e3m4 (signed) and e4m4 (unsigned) with
/// subnormals; at 4 bits e2m1 (signed) and e3m1 (unsigned) with subnormals,
/// e3m0 (signed) and e4m0 (unsigned) without.
inline Minifloat minifloatOf(Compand c) {
  switch (c) {
  case Compand::E3M4:
    return {3, 4, true, true};
  case Compand::E2M1:
    return {2, 1, true, true};
  case Compand::E3M0:
    return {3, 0, true, false};
  case Compand::E3M1:
    return {3, 1, false, true};
  case Compand::E4M0:
    return {4, 0, false, false};
  default:
    return {4, 4, false, true};
  }
}

/// V(c) for a magnitude code c: 2^(e - emax) (1 + f / 2^M) for e = c >> M
/// >= 1; for e = 0, f 2^(1 - emax - M) (subnormals), else 0 (signed) or
/// 2^-emax (unsigned, zero-free). Computed with ldexp from the definition
/// (exact: M + 1 significant bits).
inline float minifloatMagnitude(const Minifloat &f, int32_t c) {
  int e = c >> f.M, m = c & ((1 << f.M) - 1);
  if (e == 0 && f.subnormals && !f.isSigned && m == 0) // zero-free
    return std::ldexp(0.5f, 1 - f.emax() - f.M);
  if (e == 0 && f.subnormals)
    return std::ldexp(float(m), 1 - f.emax() - f.M);
  if (e == 0)
    return f.isSigned ? 0.0f : std::ldexp(1.0f, -f.emax());
  return std::ldexp(1.0f + std::ldexp(float(m), -f.M), e - f.emax());
}

inline float dequantize(int32_t code, uint32_t scaleBits,
                        const QuantEncoding &enc, bool fast = false) {
  if (isMinifloat(enc.compand)) {
    Minifloat f = minifloatOf(enc.compand);
    float v = minifloatMagnitude(f, code < 0 ? -code : code);
    return (code < 0 ? -v : v) * scaleToF32(enc.scale, scaleBits);
  }
  float n_max = enc.isSigned ? 127.0f : 255.0f;
  float t = divUniform(float(code), n_max, fast);
  float n = t;
  if (enc.compand == Compand::Softsign)
    n = t / (2.0f - std::fabs(t));
  float x = n * scaleToF32(enc.scale, scaleBits);
  if (enc.compand == Compand::Sqrt)
    x = x * x;
  return x;
}

/// dequantize() as a Lazy for the rules: in fast mode the code's reciprocal
/// and the group scale fold into one factor (linear), the scale stays a
/// pending uniform factor (softsign), or the square is pending (sqrt).
inline Lazy dequantizeLazy(int32_t code, uint32_t scaleBits,
                           const QuantEncoding &enc, bool fast) {
  if (!fast)
    return plainL(dequantize(code, scaleBits, enc, false));
  if (isMinifloat(enc.compand)) { // V(code) * scale: the scale is pending
    Minifloat f = minifloatOf(enc.compand);
    float v = minifloatMagnitude(f, code < 0 ? -code : code);
    return Lazy{code < 0 ? -v : v, scaleToF32(enc.scale, scaleBits), true,
                true};
  }
  float n_max = enc.isSigned ? 127.0f : 255.0f;
  float r = 1.0f / n_max;
  float sc = scaleToF32(enc.scale, scaleBits);
  float q = float(code);
  if (enc.compand ==
      Compand::Softsign) { // t / (2 - |t|), t = q / N: one quotient
    float d0 = 2.0f * n_max - std::fabs(q);
    return Lazy{q / d0, sc, true, true, q, d0};
  }
  if (enc.compand == Compand::Sqrt) {
    float x1 = q * (r * sc);
    return Lazy{x1, x1, true, false};
  }
  return Lazy{q, r * sc, true, true};
}

/// H(t): the top 14 bits of a 32-bit integer hash of the step count
/// (docs/NUMERICS.md §8.3).
inline uint32_t stepHash(int64_t t) {
  uint32_t x = uint32_t(uint64_t(t));
  x ^= x >> 16;
  x *= 0x21F0AAADu;
  x ^= x >> 15;
  x *= 0x735A2D97u;
  x ^= x >> 15;
  return x >> 18;
}
/// The bounded numerics' rounding offset of element `i` of a tensor at step
/// `t` for the state of phase `phase` (docs/NUMERICS.md §8.3): h = (i *
/// 12367 + H(t) + phase) mod 2^14, i taken modulo 2^32 first.
inline uint32_t ditherH(int64_t i, int64_t t, uint32_t phase = 0) {
  return (uint32_t(uint64_t(i)) * 12367u + stepHash(t) + phase) & 0x3FFFu;
}
/// u = h / 2^14.
inline float dither(int64_t i, int64_t t, uint32_t phase = 0) {
  return float(ditherH(i, t, phase)) / 16384.0f;
}
/// The phase of the k-th quantized state of an optimizer: k * 3462 mod 2^14.
inline uint32_t statePhase(int k) { return (uint32_t(k) * 3462u) & 0x3FFFu; }
/// The step a 4-bit k-th quantized state's dither hashes (its own stream,
/// docs/NUMERICS.md §2e): t + k * 0x9E3779B9, at phase 0.
inline int64_t streamStep(int64_t t, int k) {
  return int64_t(uint64_t(t) + uint64_t(k) * 0x9E3779B9u);
}

/// Reads code `e` of a state's code buffer: an i8/ui8 byte, or a nibble of
/// a packed 4-bit buffer (element 2j in the low, 2j + 1 in the high nibble
/// of byte j), sign-extended for i4.
inline int32_t loadCode(const QuantEncoding &q, const void *buf, int64_t e) {
  const uint8_t *p = static_cast<const uint8_t *>(buf);
  if (q.bits == 8)
    return q.isSigned ? int32_t(int8_t(p[e])) : int32_t(p[e]);
  uint32_t nib = (e & 1) ? uint32_t(p[e >> 1]) >> 4 : uint32_t(p[e >> 1]) & 15u;
  return q.isSigned && nib >= 8 ? int32_t(nib) - 16 : int32_t(nib);
}
/// Writes code `e`: a byte, or a nibble (the other nibble of its byte kept).
inline void storeCode(const QuantEncoding &q, void *buf, int64_t e,
                      int32_t code) {
  uint8_t *p = static_cast<uint8_t *>(buf);
  if (q.bits == 8) {
    p[e] = uint8_t(code);
    return;
  }
  uint8_t nib = uint8_t(code) & 15u;
  uint8_t &byte = p[e >> 1];
  byte = (e & 1) ? uint8_t((byte & 0x0Fu) | (nib << 4))
                 : uint8_t((byte & 0xF0u) | nib);
}

/// Quantizes the first `n` values of a group with a minifloat format
/// (docs/NUMERICS.md §2d); `h` holds each element's dither h in [0, 2^14)
/// (null: round to nearest, ties down: the word 2^31 - 1). Returns the
/// scale bits.
inline uint32_t quantize_minifloat(const float *x, int n,
                                   const QuantEncoding &enc, int32_t *codes,
                                   const uint32_t *h) {
  Minifloat f = minifloatOf(enc.compand);
  float a = 0.0f;
  for (int i = 0; i < n; ++i)
    a = maximumf(a, std::fabs(x[i]));
  // The scale: the least power of two 2^E with 2^E * V_top >= a, E within
  // the scale type's normal exponents and at most emax + 22.
  const float top = 2.0f - std::ldexp(1.0f, -f.M);
  int lo = enc.scale == DType::F16 ? -14 : -126;
  int hi = std::min(enc.scale == DType::F16 ? 15 : 127, f.emax() + 22);
  int e = lo;
  while (e < hi && !(std::ldexp(top, e) >= a)) // +inf and NaN: hi
    ++e;
  float scale = std::ldexp(1.0f, e);
  // +inf and NaN are stored as they are.
  float stored = std::isnan(a) || std::isinf(a) ? a : scale;
  uint32_t scaleBits = enc.scale == DType::F32 ? bitsOf(stored)
                                                : narrowBits(enc.scale, stored);
  // r = |x| * 2^(emax - 127 - E): the code's exponent lands in r's f32
  // exponent field, its subnormals in f32's.
  const float k = std::ldexp(1.0f, f.emax() - 127 - e);
  for (int i = 0; i < n; ++i) {
    float r = std::fabs(x[i]) * k;
    // Rounding r to M mantissa bits with the dither: the f32 bits plus
    // h * 2^(23 - M - 14), then the bits below the code's last place
    // dropped: the code itself (f32's and the code's binades align).
    uint32_t add = h ? h[i] << (23 - f.M - 14) : 0x7FFFFFFFu >> (9 + f.M);
    uint32_t q = (bitsOf(r) + add) >> (23 - f.M);
    q = std::min<uint32_t>(q, uint32_t(f.top())); // a NaN, or beyond range
    codes[i] = f.isSigned && x[i] < 0.0f ? -int32_t(q) : int32_t(q);
  }
  return scaleBits;
}

/// Quantizes the first `n` values of a group; returns the scale bits. With
/// `dithers` (the bounded numerics), element i's code rounds with
/// dithers[i] in place of 1/2.
inline uint32_t quantize_group(const float *x, int n, const QuantEncoding &enc,
                               int32_t *codes, bool fast = false,
                               const float *dithers = nullptr) {
  if (isMinifloat(enc.compand)) {
    std::vector<uint32_t> h(n);
    for (int i = 0; i < n && dithers; ++i)
      h[i] = uint32_t(dithers[i] * 16384.0f);
    return quantize_minifloat(x, n, enc, codes, dithers ? h.data() : nullptr);
  }
  float nmax = enc.isSigned ? 127.0f : 255.0f;
  std::vector<float> y(n);
  float a = -INFINITY;
  for (int i = 0; i < n; ++i) {
    y[i] = enc.compand == Compand::Sqrt ? std::sqrt(x[i]) : x[i];
    a = maximumf(a, std::fabs(y[i]));
  }
  a = maximumf(a, 1e-12f);
  for (int i = 0; i < n; ++i) {
    float nn = divUniform(y[i], a, fast);
    float t = nn;
    if (enc.compand == Compand::Softsign && fast) {
      // 2n / (1 + |n|), n = y / a, as one quotient: y / ((a + |y|) / 2)
      t = y[i] / std::fma(std::fabs(y[i]), 0.5f, a * 0.5f);
    } else if (enc.compand == Compand::Softsign) {
      float two_n = 2.0f * nn;
      float den = 1.0f + std::fabs(nn);
      t = two_n / den;
    }
    float u = dithers ? dithers[i] : 0.5f;
    float f;
    if (!fast)
      f = std::floor(t * nmax + u);
    else if (enc.compand == Compand::Softsign)
      f = std::floor(std::fma(t, nmax, u));
    else // (y * r) * nmax folded: y * (r * nmax), fused with + u
      f = std::floor(std::fma(y[i], (1.0f / a) * nmax, u));
    float q;
    if (std::isnan(f))
      q = 0.0f;
    else
      q = minimumf(maximumf(f, enc.isSigned ? -nmax : 0.0f), nmax);
    codes[i] = int32_t(q);
  }
  // The bounded numerics saturate a finite absmax at the scale type's
  // largest finite value (docs/NUMERICS.md §8).
  if (dithers && enc.scale != DType::F32 && !std::isinf(a)) {
    float maxFinite = enc.scale == DType::F16 ? 65504.0f : 0x1.FEp127f;
    a = minimumf(a, maxFinite);
  }
  return scaleFromF32(enc.scale, a);
}

//===----------------------------------------------------------------------===//
// Rules (docs/NUMERICS.md §3-4)
//===----------------------------------------------------------------------===//

/// Double-double product with f64 multiply, add and subtract only
/// (Dekker), renormalized.
inline void mulDD(double xh, double xl, double yh, double yl, double &h,
                  double &l) {
  auto split = [](double x, double &hi, double &lo) {
    double t = 134217729.0 * x;
    hi = t - (t - x);
    lo = x - hi;
  };
  double p = xh * yh;
  double a, b, c, d;
  split(xh, a, b);
  split(yh, c, d);
  double err = (((a * c - p) + a * d) + b * c) + b * d;
  double cross = xh * yl + xl * yh;
  double e = err + cross;
  h = p + e;
  l = e - (h - p);
}

/// β^n correctly rounded to f32 (docs/NUMERICS.md §3): squaring in
/// double-double, hi rounded to odd with lo as sticky, one RTNE narrowing;
/// a NaN from a non-NaN β (Dekker's split overflowing) is ±inf.
inline float powi(float x, int64_t n) {
  const int64_t n0 = n;
  double rh = 1.0, rl = 0.0, bh = double(x), bl = 0.0;
  while (n > 0) {
    if (n & 1)
      mulDD(rh, rl, bh, bl, rh, rl);
    mulDD(bh, bl, bh, bl, bh, bl);
    n >>= 1;
  }
  uint64_t bits, loBits;
  std::memcpy(&bits, &rh, 8);
  std::memcpy(&loBits, &rl, 8);
  if ((rl < 0.0 || rl > 0.0) && (bits & 1) == 0) // ordered: not for NaN
    bits = int64_t(bits ^ loBits) >= 0 ? bits + 1 : bits - 1;
  double odd;
  std::memcpy(&odd, &bits, 8);
  float r = float(odd);
  if (std::isnan(r) && !std::isnan(x))
    r = (x < 0.0f && (n0 & 1)) ? -INFINITY : INFINITY;
  return r;
}

inline std::vector<std::string> state_names(const std::string &rule) {
  if (rule == "sgd" || rule == "sgdw")
    return {"momentum_buffer"};
  if (rule == "adam" || rule == "adamw")
    return {"exp_avg", "exp_avg_sq"};
  if (rule == "lion")
    return {"exp_avg"};
  return {};
}

inline std::map<std::string, float> default_hypers(const std::string &rule) {
  if (rule == "adam")
    return {{"lr", 1e-3f},
            {"beta1", 0.9f},
            {"beta2", 0.999f},
            {"eps", 1e-8f},
            {"weight_decay", 0.0f}};
  if (rule == "adamw")
    return {{"lr", 1e-3f},           {"beta1", 0.9f},
            {"beta2", 0.999f},       {"eps", 1e-8f},
            {"weight_decay", 1e-2f}, {"decouple_lr", 0.0f},
            {"initial_lr", 1e-3f}};
  if (rule == "sgd")
    return {{"lr", 1e-3f},
            {"momentum", 0.0f},
            {"dampening", 0.0f},
            {"weight_decay", 0.0f},
            {"nesterov", 0.0f}};
  if (rule == "sgdw")
    return {{"lr", 1e-3f},          {"momentum", 0.0f}, {"dampening", 0.0f},
            {"weight_decay", 0.0f}, {"nesterov", 0.0f}, {"decouple_lr", 0.0f},
            {"initial_lr", 1e-3f}};
  if (rule == "lion")
    return {{"lr", 1e-4f},         {"beta1", 0.9f},
            {"beta2", 0.99f},      {"weight_decay", 0.0f},
            {"decouple_lr", 0.0f}, {"initial_lr", 1e-4f}};
  return {};
}

/// Per-step scalars and the element rule of one built-in optimizer.
struct Rule {
  std::string name;
  std::map<std::string, float> h;
  int64_t t = 1;
  float omb1 = 0, omb2 = 0, bc1 = 0, bc2 = 0, dec = 1, omd = 0;
  /// Adam's largest update in the bounded numerics (docs/NUMERICS.md §8).
  float maxUpd = 0;
  bool fast = false, bounded = true;

  Rule(const std::string &rule, const std::map<std::string, float> &hypers,
       int64_t step, bool fastArithmetic = false, bool boundedNumerics = true)
      : name(rule), h(default_hypers(rule)), t(step), fast(fastArithmetic),
        bounded(boundedNumerics) {
    h["grad_scale"] = 1.0f; // every kernel's last hyper-parameter
    for (auto &kv : hypers)
      if (h.count(kv.first))
        h[kv.first] = kv.second;
    if (name == "adam" || name == "adamw") {
      omb1 = 1.0f - h["beta1"];
      omb2 = 1.0f - h["beta2"];
      bc1 = 1.0f - powi(h["beta1"], t);
      bc2 = 1.0f - powi(h["beta2"], t);
      // |m| <= K sqrt(v), K^2 <= (1 - beta1_min)^2 S / (1 - beta2_max), S =
      // sum_{j<t} r^j, r = beta1_max^2 / beta2_min: |update| <= lr K
      // sqrt(bc2) / bc1 (docs/NUMERICS.md §8.4, in the order written there).
      // The envelopes are the betas' extremes over the steps taken; a caller
      // that gives none ran fixed betas.
      auto envelope = [&](const char *name, const char *of) {
        auto it = hypers.find(name);
        return it != hypers.end() ? it->second : h[of];
      };
      const float b1 = envelope("beta1_max", "beta1"),
                  b2 = envelope("beta2_min", "beta2");
      const float b1lo = envelope("beta1_min", "beta1"),
                  b2hi = envelope("beta2_max", "beta2");
      // beta2 - beta1^2: beta1^2 exact in f64, the difference rounded there,
      // then once to f32.
      const float d = float(double(b2) - double(b1) * double(b1));
      const float omr = d / b2;              // 1 - r
      const float p1 = powi(b1, t), p2 = powi(b2, t);
      const double p1w = double(p1), p2w = double(p2);
      float rt = float((p1w * p1w) / p2w); // r^t
      if (p2 == 0.0f)
        rt = d > 0.0f ? 0.0f : INFINITY;
      const float sGeo = (1.0f - rt) / omr;
      const float tf = float(t);
      const float tOmr = tf * std::fabs(omr);
      const float sNear = tf * (d > 0.0f ? 1.0f : 1.015625f);
      float s = tOmr < 0.015625f ? sNear : sGeo;
      if (b1 == 0.0f)
        s = 1.0f;
      const float omb1lo = 1.0f - b1lo, omb2hi = 1.0f - b2hi;
      float k2 = ((omb1lo * omb1lo) * s) / omb2hi;
      float kt = std::sqrt(k2 * bc2) / bc1;
      if (b2 == 0.0f && b1 != 0.0f)
        kt = INFINITY;
      kt = minimumf(kt, 3.40282347e+38f);
      maxUpd = (std::fabs(h["lr"]) * 1.00390625f) * kt;
    }
    if (name == "lion") {
      omb1 = 1.0f - h["beta1"];
      omb2 = 1.0f - h["beta2"];
    }
    if (name == "sgd" || name == "sgdw")
      omd = 1.0f - h["dampening"];
    if (name == "adamw" || name == "sgdw" || name == "lion") {
      float ratio = h["lr"] / h["initial_lr"];
      float wrel = h["weight_decay"] * ratio;
      float wabs = h["weight_decay"] * h["lr"];
      float w = h["decouple_lr"] != 0.0f ? wrel : wabs;
      dec = 1.0f - w;
    }
  }

  /// Updates theta and the states in place. `graw` is the widened gradient
  /// (times grad_scale here); `s` the decoded states, as Lazy values for the
  /// fast mode's contractions; `sqrtState` whether the encoder takes
  /// sqrt(v) (a sqrt-companded second state), which the fast mode shares
  /// with the update's root.
  void apply(float &theta, float graw, std::vector<Lazy> &s,
             std::vector<float> &out, bool sqrtState = false) const {
    auto H = [&](const char *k) { return h.at(k); };
    const Arith A{fast};
    Lazy g = A.mulU(plainL(graw), H("grad_scale"));
    out.assign(s.size(), 0.0f);
    if (name == "adam" || name == "adamw") {
      float gv;
      if (name == "adam")
        gv = A.add(g, A.mulU(plainL(theta), H("weight_decay")));
      else
        gv = g.value();
      float v = A.add(A.mulU(s[1], H("beta2")),
                      A.mulU(plainL(A.mul(gv, gv).value()), omb2));
      float num, den;
      if (fast) {
        float rbc2 = 1.0f / bc2;
        if (sqrtState) // sqrt(v * rbc2) as sqrt(v) * sqrt(rbc2), + eps fused
          den = std::fma(std::sqrt(v), std::sqrt(rbc2), H("eps"));
        else
          den = std::sqrt(v * rbc2) + H("eps");
      } else {
        den = std::sqrt(v / bc2) + H("eps");
      }
      // Fast mode: a softsign-decoded m and the update share one reciprocal
      // (NUMERICS §7): r = 1 / (d0 * den), m = q * (den * r), num * (d0 * r).
      bool paired = fast && s[0].d0 != 0.0f;
      float toNum = 0.0f;
      if (paired) {
        float r = 1.0f / (s[0].d0 * den);
        s[0].a = s[0].code * (den * r);
        toNum = s[0].d0 * r;
      }
      float m = A.add(A.mulU(s[0], H("beta1")), A.mulU(plainL(gv), omb1));
      out[0] = m;
      out[1] = v;
      if (fast)
        num = A.mulU(A.mulU(plainL(m), 1.0f / bc1), H("lr")).value();
      else
        num = H("lr") * (m / bc1);
      // Paired, the update is a product: Adam's theta - upd fuses it
      // (FlashOptim numerics; bounded, the bound takes the product).
      Lazy upd = paired ? A.mul(num, toNum) : plainL(num / den);
      if (bounded)
        upd = plainL(
            minimumf(maximumf(upd.value(), -maxUpd), maxUpd));
      Lazy th = name == "adamw" ? A.mulU(plainL(theta), dec) : plainL(theta);
      theta = A.sub(th, upd);
    } else if (name == "sgd" || name == "sgdw") {
      float gv;
      if (name == "sgd")
        gv = A.add(g, A.mulU(plainL(theta), H("weight_decay")));
      else
        gv = g.value();
      float m = A.add(A.mulU(s[0], H("momentum")), A.mulU(plainL(gv), omd));
      out[0] = m;
      float nest = A.add(plainL(gv), A.mulU(plainL(m), H("momentum")));
      float withM = H("nesterov") != 0.0f ? nest : m;
      float u = H("momentum") == 0.0f ? gv : withM;
      Lazy th = name == "sgdw" ? A.mulU(plainL(theta), dec) : plainL(theta);
      theta = A.sub(th, A.mulU(plainL(u), H("lr")));
    } else if (name == "lion") {
      float gv = g.value();
      float m0 = s[0].value(); // used twice
      float c = A.add(A.mulU(plainL(m0), H("beta1")), A.mulU(plainL(gv), omb1));
      // sign(c) + (c - c): NaN for a NaN or infinite c (docs/NUMERICS.md
      // §5); c - c is +0 for a finite c.
      float s = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
      float cc = c - c;
      float u = s + cc;
      out[0] = A.add(A.mulU(plainL(m0), H("beta2")), A.mulU(plainL(gv), omb2));
      theta = A.sub(A.mulU(plainL(theta), dec), A.mulU(plainL(u), H("lr")));
    }
  }
};

inline int dtypeBytes(DType t) {
  switch (t) {
  case DType::F32:
    return 4;
  case DType::BF16:
  case DType::F16:
  case DType::I16:
    return 2;
  case DType::I8:
  case DType::U8:
    return 1;
  default: // I4, U4: packed, see loadCode
    return 0;
  }
}

/// One step over a whole tensor; `buffers` in kernel ABI order.
inline void reference_step(const Config &cfg,
                           const std::map<std::string, float> &hypers,
                           int64_t t, int64_t numel,
                           const std::vector<void *> &buffers,
                           int64_t elementOffset = 0) {
  Rule rule(cfg.rule, hypers, t, cfg.fast, cfg.bounded);
  size_t bi = 0;
  void *param = buffers[bi++];
  void *corr = cfg.correction != DType::None ? buffers[bi++] : nullptr;
  void *grad = buffers[bi++];
  struct StateBufs {
    void *a = nullptr, *b = nullptr;
  };
  std::vector<StateBufs> sb;
  for (const StateEncoding &s : cfg.states) {
    StateBufs x;
    x.a = buffers[bi++];
    if (s.quantized)
      x.b = buffers[bi++];
    sb.push_back(x);
  }
  int64_t G = cfg.group_size;
  size_t ns = cfg.states.size();
  bool sqrtState = ns > 1 && cfg.states[1].quantized &&
                   cfg.states[1].q.compand == Compand::Sqrt;
  std::vector<float> thetaNew(G);
  std::vector<std::vector<float>> statesNew(ns, std::vector<float>(G));
  for (int64_t g0 = 0; g0 < numel; g0 += G) {
    int n = int(std::min<int64_t>(G, numel - g0));
    int64_t gi = g0 / G;
    for (int i = 0; i < n; ++i) {
      int64_t e = g0 + i;
      float theta;
      if (corr) {
        uint16_t nb = static_cast<uint16_t *>(param)[e];
        int32_t rho = cfg.correction == DType::I8
                          ? int32_t(static_cast<int8_t *>(corr)[e])
                          : int32_t(static_cast<int16_t *>(corr)[e]);
        theta = ecc_decode(nb, rho, cfg.param, cfg.correction, cfg.fast);
      } else {
        theta = widen(cfg.param, param, e);
      }
      float graw = widen(cfg.grad, grad, e);
      std::vector<Lazy> s(ns);
      for (size_t k = 0; k < ns; ++k) {
        const StateEncoding &enc = cfg.states[k];
        if (enc.quantized) {
          int32_t code = loadCode(enc.q, sb[k].a, e);
          uint32_t bits = enc.q.scale == DType::F32
                              ? bitsOf(static_cast<float *>(sb[k].b)[gi])
                              : uint32_t(static_cast<uint16_t *>(sb[k].b)[gi]);
          s[k] = dequantizeLazy(code, bits, enc.q, cfg.fast);
        } else {
          s[k] = plainL(widen(enc.plain, sb[k].a, e));
        }
      }
      std::vector<float> out;
      rule.apply(theta, graw, s, out, sqrtState);
      thetaNew[i] = theta;
      for (size_t k = 0; k < ns; ++k)
        statesNew[k][i] = out[k];
    }
    for (int i = 0; i < n; ++i) {
      int64_t e = g0 + i;
      if (corr) {
        uint16_t nb;
        int32_t rho;
        ecc_encode(thetaNew[i], cfg.param, cfg.correction, &nb, &rho);
        static_cast<uint16_t *>(param)[e] = canonical16(cfg.param, nb);
        if (cfg.correction == DType::I8)
          static_cast<int8_t *>(corr)[e] = int8_t(rho);
        else
          static_cast<int16_t *>(corr)[e] = int16_t(rho);
      } else {
        narrowStore(cfg.param, param, e, thetaNew[i]);
      }
    }
    int quantizedIndex = 0;
    for (size_t k = 0; k < ns; ++k) {
      const StateEncoding &enc = cfg.states[k];
      if (enc.quantized) {
        std::vector<int32_t> codes(n);
        std::vector<float> dithers(n);
        // 8-bit codes: one hash of t, phases k * 3462 apart; 4-bit codes:
        // the k-th state's own stream, phase 0.
        int k4 = quantizedIndex++;
        uint32_t phase = enc.q.bits == 4 ? 0u : statePhase(k4);
        int64_t ts = enc.q.bits == 4 ? streamStep(t, k4) : t;
        for (int i = 0; i < n; ++i)
          dithers[i] = dither(elementOffset + g0 + i, ts, phase);
        uint32_t scale =
            quantize_group(statesNew[k].data(), n, enc.q, codes.data(),
                           cfg.fast, cfg.bounded ? dithers.data() : nullptr);
        if (enc.q.scale == DType::F32)
          static_cast<float *>(sb[k].b)[gi] = floatOf(canonicalF32(scale));
        else
          static_cast<uint16_t *>(sb[k].b)[gi] =
              canonical16(enc.q.scale, uint16_t(scale));
        for (int i = 0; i < n; ++i)
          storeCode(enc.q, sb[k].a, g0 + i, codes[i]);
        // The pad nibble of an odd-length packed buffer is 0.
        if (enc.q.bits == 4 && g0 + n == numel && (numel & 1))
          static_cast<uint8_t *>(sb[k].a)[numel >> 1] &= 0x0Fu;
      } else {
        for (int i = 0; i < n; ++i)
          narrowStore(enc.plain, sb[k].a, g0 + i, statesNew[k][i]);
      }
    }
  }
}

} // namespace flashopt::ref

#endif // FLASHOPT_TEST_REFERENCE_FLASHOPT_REFERENCE_H
