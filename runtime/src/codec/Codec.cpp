//===- Codec.cpp - Host-side encodings of docs/NUMERICS.md ----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// widen / narrow (f32 <-> bf16 / f16, Float16.h), the master-weight split
/// (docs/NUMERICS.md §1) and the group quantization of optimizer states (§2).
///
/// This file is compiled with -ffp-contract=off and every f32 operation is
/// its own statement, in the order the contract writes it, so that each one
/// is exactly one IEEE rounding and the results agree bit for bit with the
/// generated kernels and with the test reference (test/reference/).
/// min/max are the NaN-propagating `maximumf` / `minimumf` of the contract,
/// not std::fmin / std::fmax (which ignore NaN).
///
//===----------------------------------------------------------------------===//

#include "Codec.h"

#include "flashopt/abi/Minifloat.h"
#include "flashopt/host/Float16.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace flashopt::host::codec {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// NaN-propagating max (arith.maximumf): NaN if either is NaN; +0 > -0.
float maximumf(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return kNaN;
  if (a == 0.0f && b == 0.0f)
    return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

/// NaN-propagating min (arith.minimumf): NaN if either is NaN; -0 < +0.
float minimumf(float a, float b) {
  if (std::isnan(a) || std::isnan(b))
    return kNaN;
  if (a == 0.0f && b == 0.0f)
    return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

/// 2^k for an integer k in [-126, 127], exact (§1).
float pow2(int32_t k) {
  assert(k >= -126 && k <= 127 && "pow2 exponent out of the normal range");
  return f32_from_bits(uint32_t(k + 127) << 23);
}

bool isNarrowFloat(DType t) { return t == DType::BF16 || t == DType::F16; }
bool isFloat(DType t) { return isNarrowFloat(t) || t == DType::F32; }

float widenBits(DType t, uint16_t bits) {
  return t == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}
uint16_t narrowBits(DType t, float v) {
  return t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}

/// ℓ of a narrow value (2^ℓ = ULP(θ')/2), from its bits; no branch on the
/// value class (inf/NaN use the all-ones exponent field).
int32_t scaleExponent(uint16_t narrow, DType p) {
  const int32_t m = p == DType::BF16 ? 7 : 10;
  const int32_t bias = p == DType::BF16 ? 127 : 15;
  const int32_t bits = int32_t(narrow & 0x7FFFu);
  const int32_t field = bits >> m;
  const int32_t e = field == 0 ? 1 - bias : field - bias;
  return e - m - 1;
}

int32_t correctionMax(DType c) { return c == DType::I8 ? 127 : 32767; }

int32_t loadCorrection(const void *corr, DType c, int64_t i) {
  if (c == DType::I8)
    return int32_t(static_cast<const int8_t *>(corr)[i]);
  return int32_t(static_cast<const int16_t *>(corr)[i]);
}

void storeCorrection(void *corr, DType c, int64_t i, int32_t rho) {
  if (c == DType::I8)
    static_cast<int8_t *>(corr)[i] = int8_t(rho);
  else
    static_cast<int16_t *>(corr)[i] = int16_t(rho);
}

/// §1.4 decode of one element.
float decodeOne(uint16_t narrow, int32_t rho, DType p, DType c) {
  const float r = widenBits(p, narrow);
  const int32_t l = scaleExponent(narrow, p);
  const float rhoF = float(rho);              // exact: |rho| <= 32768
  const float nF = float(correctionMax(c));   // exact
  const float cc = rhoF / nF;
  const int32_t h = l >> 1;                   // arithmetic shift: floor(l / 2)
  const float e1 = cc * pow2(h);
  const float e = e1 * pow2(l - h);
  const float theta = r + e;
  return theta;
}

/// §1.3 encode of one element.
void encodeOne(float theta, DType p, DType c, uint16_t *narrowOut,
               int32_t *rhoOut) {
  const uint16_t nb = narrowBits(p, theta);
  const float r = widenBits(p, nb);
  const float e = theta - r;
  const int32_t a = -scaleExponent(nb, p);
  const int32_t h = a >> 1;
  const float en1 = e * pow2(h);
  const float en = en1 * pow2(a - h);
  const float lo = maximumf(en, -1.0f);
  const float ec = minimumf(lo, 1.0f);
  const float nF = float(correctionMax(c));
  const float s = ec * nF;
  float rho = 0.0f;
  if (!std::isnan(s)) {
    const float mag = std::fabs(s);
    const float half = mag + 0.5f;
    const float fl = std::floor(half);
    rho = std::copysign(fl, s); // round half away from zero
  }
  *narrowOut = nb;
  *rhoOut = int32_t(rho); // exact: |rho| <= N
}

enum class Compand { None, Softsign, Sqrt, Minifloat };

bool parseCompand(std::string_view s, Compand *out) {
  if (s == "none")
    *out = Compand::None;
  else if (s == "softsign")
    *out = Compand::Softsign;
  else if (s == "sqrt")
    *out = Compand::Sqrt;
  else if (abi::minifloat_format(s))
    *out = Compand::Minifloat;
  else
    return false;
  return true;
}

/// The f32 value of a minifloat code (§2d): sign · V(|c|).
float minifloatValue(const abi::MinifloatFormat &f, int32_t c) {
  const int32_t mag = c < 0 ? -c : c;
  float v = float(f.value(0));
  if (f.subnormals && mag != 0)
    v = float(mag) * float(f.value(1));
  if (mag >= f.firstNormalCode())
    v = f32_from_bits(uint32_t(mag + f.exponentBias())
                      << (23 - f.mantissaBits));
  return c < 0 ? -v : v;
}

/// The scale a minifloat group stores for its absmax `a` (§2d): the least
/// power of two 2^E with 2^E * V_top >= a, E in the scale type's normal
/// exponents and at most emax + 22; +inf and NaN as they are. `*e` is E.
float minifloatScale(const abi::MinifloatFormat &f, float a, DType t, int *e) {
  auto [lo, hi] = f.scaleExponentRange(t == DType::F16 ? -14 : -126,
                                       t == DType::F16 ? 15 : 127);
  const float top = float(f.topValue());
  int k = lo;
  while (k < hi && !(std::ldexp(top, k) >= a)) // +inf and NaN: hi
    ++k;
  *e = k;
  if (std::isnan(a) || std::isinf(a))
    return a;
  return std::ldexp(1.0f, k);
}

/// The code of x against a scale 2^E (§2d): |x| * 2^(emax - 127 - E), whose
/// bits plus the dither word's part moved to the code's last place, shifted
/// down to the code's place (at most top), with x's sign for signed codes.
/// `word` is h << 18 (2^31 - 1 rounds to nearest, ties down).
int32_t minifloatCode(const abi::MinifloatFormat &f, float x, int e,
                      uint32_t word) {
  const float r = std::fabs(x) * std::ldexp(1.0f, f.emax() - 127 - e);
  const int shift = 23 - f.mantissaBits;
  uint32_t q = (f32_bits(r) + (word >> (32 - shift))) >> shift;
  q = std::min<uint32_t>(q, uint32_t(f.topCode()));
  return f.isSigned && x < 0.0f ? -int32_t(q) : int32_t(q);
}

bool signedCodes(DType t) { return t == DType::I8 || t == DType::I4; }

/// Code i of a code buffer: a byte (i8, ui8) or a nibble (i4, ui4: two per
/// byte, element 2k in byte k's low nibble). Signed nibbles are two's
/// complement, -8..7 (-8 is never written; it decodes by the formula).
int32_t loadCode(const void *codes, DType t, int64_t i) {
  switch (t) {
  case DType::I8:
    return static_cast<const int8_t *>(codes)[i];
  case DType::I4:
  case DType::U4: {
    const uint8_t b = static_cast<const uint8_t *>(codes)[i >> 1];
    const int32_t nib = (i & 1) ? b >> 4 : b & 0x0F;
    return t == DType::I4 ? (nib ^ 8) - 8 : nib;
  }
  default:
    return static_cast<const uint8_t *>(codes)[i];
  }
}

/// Stores code q (in the dtype's range) as code i of a code buffer; a
/// nibble keeps its byte's other nibble.
void storeCode(void *codes, DType t, int64_t i, int32_t q) {
  switch (t) {
  case DType::I8:
    static_cast<int8_t *>(codes)[i] = int8_t(q);
    return;
  case DType::I4:
  case DType::U4: {
    uint8_t &b = static_cast<uint8_t *>(codes)[i >> 1];
    const int sh = (i & 1) ? 4 : 0;
    b = uint8_t((b & ~(0x0F << sh)) | ((uint32_t(q) & 0x0F) << sh));
    return;
  }
  default:
    static_cast<uint8_t *>(codes)[i] = uint8_t(q);
  }
}

/// The pad nibble of an odd number of packed codes (the last byte's high
/// nibble) is 0 (docs/KERNEL-ABI.md "Packed buffers").
void clearPadNibble(void *codes, DType t, int64_t n) {
  if (abi::dtype_is_packed(t) && n % 2 != 0)
    static_cast<uint8_t *>(codes)[n >> 1] &= 0x0F;
}

float loadScale(const void *scales, DType t, int64_t g) {
  if (t == DType::F32)
    return static_cast<const float *>(scales)[g];
  return widenBits(t, static_cast<const uint16_t *>(scales)[g]);
}

void storeScale(void *scales, DType t, int64_t g, float a) {
  if (t == DType::F32)
    static_cast<float *>(scales)[g] = a;
  else
    static_cast<uint16_t *>(scales)[g] = narrowBits(t, a);
}

} // namespace

//===----------------------------------------------------------------------===//
// Validity of encodings
//===----------------------------------------------------------------------===//

bool valid_master_encoding(DType param_dtype,
                           std::optional<DType> correction) {
  if (!isFloat(param_dtype))
    return false;
  if (!correction)
    return true;
  return isNarrowFloat(param_dtype) &&
         (*correction == DType::I8 || *correction == DType::I16);
}

bool valid_quant_encoding(DType code_dtype, DType scale_dtype,
                          std::string_view compand, int64_t group) {
  Compand c;
  // A minifloat's width and signedness are its own (i8: e3m4, ui8: e4m4,
  // i4: e2m1/e3m0, ui4: e3m1/e4m0); the linear codes are 8-bit.
  if (auto f = abi::minifloat_format(compand)) {
    if (f->isSigned != signedCodes(code_dtype) ||
        f->codeBits() != abi::dtype_bits(code_dtype))
      return false;
  } else if (code_dtype != DType::I8 && code_dtype != DType::U8) {
    return false;
  }
  return (code_dtype == DType::I8 || code_dtype == DType::U8 ||
          code_dtype == DType::I4 || code_dtype == DType::U4) &&
         isFloat(scale_dtype) && parseCompand(compand, &c) && group > 0;
}

//===----------------------------------------------------------------------===//
// widen / narrow
//===----------------------------------------------------------------------===//

void widen(const void *in, DType dtype, int64_t n, float *out) {
  assert(isFloat(dtype) && "widen: dtype must be BF16, F16 or F32");
  if (n <= 0)
    return;
  if (dtype == DType::F32) {
    std::memmove(out, in, size_t(n) * sizeof(float));
    return;
  }
  if (!isNarrowFloat(dtype)) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = kNaN;
    return;
  }
  const auto *src = static_cast<const uint16_t *>(in);
  for (int64_t i = 0; i < n; ++i)
    out[i] = widenBits(dtype, src[i]);
}

void narrow(const float *in, int64_t n, DType dtype, void *out) {
  assert(isFloat(dtype) && "narrow: dtype must be BF16, F16 or F32");
  if (n <= 0)
    return;
  if (dtype == DType::F32) {
    std::memmove(out, in, size_t(n) * sizeof(float));
    return;
  }
  if (!isNarrowFloat(dtype))
    return;
  auto *dst = static_cast<uint16_t *>(out);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = narrowBits(dtype, in[i]);
}

//===----------------------------------------------------------------------===//
// Master weights (§1)
//===----------------------------------------------------------------------===//

void decode_master(const void *param, DType param_dtype, const void *corr,
                   std::optional<DType> correction, int64_t n, float *out) {
  assert(valid_master_encoding(param_dtype, correction) &&
         "decode_master: invalid parameter / correction dtypes");
  if (!correction || !isNarrowFloat(param_dtype) ||
      !valid_master_encoding(param_dtype, correction)) {
    widen(param, param_dtype, n, out);
    return;
  }
  const auto *p = static_cast<const uint16_t *>(param);
  for (int64_t i = 0; i < n; ++i)
    out[i] = decodeOne(p[i], loadCorrection(corr, *correction, i),
                       param_dtype, *correction);
}

void encode_master(const float *in, int64_t n, void *param, DType param_dtype,
                   void *corr, std::optional<DType> correction) {
  assert(valid_master_encoding(param_dtype, correction) &&
         "encode_master: invalid parameter / correction dtypes");
  if (!correction || !isNarrowFloat(param_dtype) ||
      !valid_master_encoding(param_dtype, correction)) {
    narrow(in, n, param_dtype, param);
    return;
  }
  auto *p = static_cast<uint16_t *>(param);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t nb;
    int32_t rho;
    encodeOne(in[i], param_dtype, *correction, &nb, &rho);
    p[i] = nb;
    storeCorrection(corr, *correction, i, rho);
  }
}

//===----------------------------------------------------------------------===//
// Quantized states (§2)
//===----------------------------------------------------------------------===//

void dequantize(const void *codes, DType code_dtype, const void *scales,
                DType scale_dtype, std::string_view compand, int64_t group,
                int64_t n, float *out) {
  Compand c = Compand::None;
  const bool valid = valid_quant_encoding(code_dtype, scale_dtype, compand,
                                          group) &&
                     parseCompand(compand, &c);
  assert(valid && "dequantize: invalid quantized encoding");
  if (!valid) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = kNaN;
    return;
  }
  const bool isSigned = signedCodes(code_dtype);
  const float nMax = isSigned ? 127.0f : 255.0f;
  if (c == Compand::Minifloat) {
    const abi::MinifloatFormat f = *abi::minifloat_format(compand);
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, ++gi) {
      const int64_t end = n - g0 < group ? n : g0 + group;
      const float scale = loadScale(scales, scale_dtype, gi);
      for (int64_t i = g0; i < end; ++i)
        out[i] = minifloatValue(f, loadCode(codes, code_dtype, i)) * scale;
    }
    return;
  }
  for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, ++gi) {
    const int64_t end = n - g0 < group ? n : g0 + group;
    const float scale = loadScale(scales, scale_dtype, gi);
    for (int64_t i = g0; i < end; ++i) {
      const int32_t q = loadCode(codes, code_dtype, i);
      const float t = float(q) / nMax;
      float v = t;
      if (c == Compand::Softsign) {
        const float at = std::fabs(t);
        const float den = 2.0f - at;
        v = t / den;
      }
      float x = v * scale;
      if (c == Compand::Sqrt)
        x = x * x;
      out[i] = x;
    }
  }
}

void quantize(const float *in, int64_t n, int64_t group,
              std::string_view compand, void *codes, DType code_dtype,
              void *scales, DType scale_dtype) {
  Compand c = Compand::None;
  const bool valid = valid_quant_encoding(code_dtype, scale_dtype, compand,
                                          group) &&
                     parseCompand(compand, &c);
  assert(valid && "quantize: invalid quantized encoding");
  if (!valid)
    return;
  const bool isSigned = signedCodes(code_dtype);
  if (c == Compand::Minifloat) {
    // Rounded to nearest, ties down (the dither word 2^31 - 1), as the
    // FlashOptim numerics round; the kernels' bounded numerics dither
    // instead.
    // Values that a group's codes decoded to (the f32 form of a checkpoint
    // or a state dict) encode back to the same values: the grid of a
    // minifloat times a power of two is the same at every power of two, so
    // a scale chosen from the decoded absmax reproduces them.
    const abi::MinifloatFormat f = *abi::minifloat_format(compand);
    for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, ++gi) {
      const int64_t end = n - g0 < group ? n : g0 + group;
      float a = 0.0f;
      for (int64_t i = g0; i < end; ++i)
        a = maximumf(a, std::fabs(in[i]));
      int e = 0;
      storeScale(scales, scale_dtype, gi,
                 minifloatScale(f, a, scale_dtype, &e));
      for (int64_t i = g0; i < end; ++i)
        storeCode(codes, code_dtype, i,
                  minifloatCode(f, in[i], e, 0x7FFFFFFFu));
    }
    clearPadNibble(codes, code_dtype, n);
    return;
  }
  const float nMax = isSigned ? 127.0f : 255.0f;
  const float lo = isSigned ? -127.0f : 0.0f;
  auto compandIn = [&](float x) {
    if (c == Compand::Sqrt)
      return std::sqrt(x);
    return x;
  };
  for (int64_t g0 = 0, gi = 0; g0 < n; g0 += group, ++gi) {
    // Only the valid elements take part; the zero padding of a tail group
    // cannot raise the absmax (|y| >= 0, and the max starts at +0).
    const int64_t end = n - g0 < group ? n : g0 + group;
    float a = 0.0f;
    for (int64_t i = g0; i < end; ++i) {
      const float y = compandIn(in[i]);
      const float ay = std::fabs(y);
      a = maximumf(a, ay);
    }
    a = maximumf(a, 1e-12f);
    storeScale(scales, scale_dtype, gi, a); // codes use the f32 absmax
    for (int64_t i = g0; i < end; ++i) {
      const float y = compandIn(in[i]);
      const float nn = y / a;
      float t = nn;
      if (c == Compand::Softsign) {
        const float twoN = 2.0f * nn;
        const float an = std::fabs(nn);
        const float den = 1.0f + an;
        t = twoN / den;
      }
      const float scaled = t * nMax;
      const float shifted = scaled + 0.5f;
      const float f = std::floor(shifted);
      float q = 0.0f;
      if (!std::isnan(f)) {
        const float clo = maximumf(f, lo);
        q = minimumf(clo, nMax);
      }
      storeCode(codes, code_dtype, i, int32_t(q));
    }
  }
}

//===----------------------------------------------------------------------===//
// The codec table: one entry per encoding kind
//===----------------------------------------------------------------------===//

void decode_state(const StateSpec &s, const std::vector<const void *> &buffers,
                  int64_t group, int64_t n, float *out) {
  switch (s.kind) {
  case StateKind::Quantized:
    dequantize(buffers[0], s.storage, buffers[1], s.scale, s.compand, group, n,
               out);
    return;
  case StateKind::Plain:
    widen(buffers[0], s.storage, n, out);
    return;
  case StateKind::Elided:
    std::fill(out, out + n, 0.0f);
    return;
  }
}

void encode_state(const StateSpec &s, const float *in, int64_t group,
                  int64_t n, const std::vector<void *> &buffers) {
  switch (s.kind) {
  case StateKind::Quantized:
    quantize(in, n, group, s.compand, buffers[0], s.storage, buffers[1],
             s.scale);
    return;
  case StateKind::Plain:
    narrow(in, n, s.storage, buffers[0]);
    return;
  case StateKind::Elided:
    return;
  }
}

} // namespace flashopt::host::codec
