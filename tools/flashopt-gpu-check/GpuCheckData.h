//===- GpuCheckData.h - Inputs and comparisons of the GPU check -*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The inputs flashopt-gpu-check steps (random, all-zero and subnormal
/// tensors in every dtype, gradients with NaN and infinities) and the
/// bit-for-bit comparison of two back ends' buffers with a readable report
/// of the first mismatches.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_TOOLS_GPUCHECKDATA_H
#define FLASHOPT_TOOLS_GPUCHECKDATA_H

#include "flashopt/host/CpuOptimizer.h"
#include "flashopt/host/Float16.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace flashopt::gpucheck {

using namespace flashopt::host;

//===----------------------------------------------------------------------===//
// Random data
//===----------------------------------------------------------------------===//

/// splitmix64: fast and good enough for test data.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

enum class Fill { Random, Zeros, Subnormals };

/// Bits of a subnormal of `t` (nonzero, random sign).
inline uint32_t subnormalBits(DType t, Rng &r) {
  uint32_t sign = uint32_t(r.next() & 1);
  switch (t) {
  case DType::F32:
    return sign << 31 | uint32_t(1 + r.below(0x7FFFFF));
  case DType::BF16:
    return sign << 15 | uint32_t(1 + r.below(0x7F));
  case DType::F16:
    return sign << 15 | uint32_t(1 + r.below(0x3FF));
  default:
    return 0;
  }
}

inline void storeFloat(DType t, void *dst, int64_t i, float v) {
  switch (t) {
  case DType::F32:
    static_cast<float *>(dst)[i] = v;
    break;
  case DType::BF16:
    static_cast<uint16_t *>(dst)[i] = f32_to_bf16(v);
    break;
  case DType::F16:
    static_cast<uint16_t *>(dst)[i] = f32_to_f16(v);
    break;
  default:
    break;
  }
}

inline void storeBits(DType t, void *dst, int64_t i, uint32_t bits) {
  if (t == DType::F32)
    static_cast<uint32_t *>(dst)[i] = bits;
  else
    static_cast<uint16_t *>(dst)[i] = uint16_t(bits);
}

/// `n` values of float dtype `t`: magnitudes log-uniform over 2^[lo, hi],
/// random signs, with about 2% zeros (some negative), 2% subnormals.
inline std::vector<uint8_t> makeData(DType t, int64_t n, Fill fill, int lo,
                                     int hi, Rng &r) {
  std::vector<uint8_t> out(size_t(dtype_bytes(t, uint64_t(n))), 0);
  for (int64_t i = 0; i < n; ++i) {
    double u = r.uniform();
    if (fill == Fill::Zeros) {
      storeFloat(t, out.data(), i, (r.next() & 1) ? -0.0f : 0.0f);
    } else if (fill == Fill::Subnormals || u < 0.02) {
      storeBits(t, out.data(), i, subnormalBits(t, r));
    } else if (u < 0.04) {
      storeFloat(t, out.data(), i, u < 0.03 ? 0.0f : -0.0f);
    } else {
      double mag =
          std::ldexp(1.0 + r.uniform(), int(lo + r.below(hi - lo + 1)));
      storeFloat(t, out.data(), i, float((r.next() & 1) ? -mag : mag));
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Comparison
//===----------------------------------------------------------------------===//

inline std::string renderValue(DType t, const uint8_t *p, int64_t i) {
  std::ostringstream os;
  switch (t) {
  case DType::F32: {
    float f;
    uint32_t u;
    std::memcpy(&f, p + 4 * i, 4);
    std::memcpy(&u, p + 4 * i, 4);
    os << f << " (0x" << std::hex << u << ")";
    break;
  }
  case DType::BF16:
  case DType::F16: {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    os << (t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h)) << " (0x"
       << std::hex << h << ")";
    break;
  }
  case DType::I16: {
    int16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    os << v;
    break;
  }
  case DType::I8:
    os << int(int8_t(p[i]));
    break;
  case DType::U8:
    os << int(p[i]);
    break;
  }
  return os.str();
}

/// Puts a NaN and a +Inf (and at odd steps a -Inf) into a gradient of
/// dtype `t` (elements 5, 17, 40), so that both back ends store NaNs.
inline void injectNonFinite(DType t, std::vector<uint8_t> &g, int step) {
  auto put = [&](int64_t i, uint32_t f32, uint16_t b16, uint16_t h16) {
    if (t == DType::F32)
      std::memcpy(g.data() + 4 * i, &f32, 4);
    else
      std::memcpy(g.data() + 2 * i, t == DType::BF16 ? &b16 : &h16, 2);
  };
  put(5, 0x7FC00000u, 0x7FC0u, 0x7E00u);  // NaN
  put(17, 0x7F800000u, 0x7F80u, 0x7C00u); // +Inf
  if (step % 2)
    put(40, 0xFF800000u, 0xFF80u, 0xFC00u); // -Inf
}

/// Compares `n` elements of dtype `t`; counts mismatches and describes the
/// first few into `report`. NaNs must match bit for bit too: both back ends
/// store the canonical NaN (docs/NUMERICS.md §5).
inline int64_t compareBuffers(DType t, const uint8_t *want, const uint8_t *got,
                              int64_t n, const std::string &what,
                              std::vector<std::string> &report) {
  if (std::memcmp(want, got, size_t(dtype_bytes(t, uint64_t(n)))) == 0)
    return 0;
  int64_t bad = 0;
  if (dtype_is_packed(t)) {
    // Two codes per byte: compare (and name) bytes, elements 2i and 2i + 1.
    char hex[32];
    for (int64_t i = 0; i < int64_t(dtype_bytes(t, uint64_t(n))); ++i) {
      if (want[i] == got[i])
        continue;
      if (++bad <= 3 && report.size() < 12) {
        std::snprintf(hex, sizeof hex, "0x%02x, got 0x%02x", want[i], got[i]);
        report.push_back(what + " byte " + std::to_string(i) + " (elements " +
                         std::to_string(2 * i) + ", " +
                         std::to_string(2 * i + 1) + "): want " + hex);
      }
    }
    return bad;
  }
  const int w = dtype_bits(t) / 8;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(want + i * w, got + i * w, size_t(w)) == 0)
      continue;
    if (++bad <= 3 && report.size() < 12)
      report.push_back(what + "[" + std::to_string(i) + "]: want " +
                       renderValue(t, want, i) + ", got " +
                       renderValue(t, got, i));
  }
  return bad;
}

} // namespace flashopt::gpucheck

#endif // FLASHOPT_TOOLS_GPUCHECKDATA_H
