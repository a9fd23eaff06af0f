//===- mlp_model.h - The demo model of the examples -------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The 2-layer MLP the C++ examples train (64 -> 128 -> 10, tanh, softmax
/// cross-entropy) on labels of a random teacher network, its f32 forward /
/// backward, and storage of its tensors in a bundle's dtypes (bf16, f16,
/// f32). Shared by train_mlp.cpp and train_mlp_mpi.cpp; plain C++ over the
/// C ABI's dtype names only.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_EXAMPLES_MLP_MODEL_H
#define FLASHOPT_EXAMPLES_MLP_MODEL_H

#include <flashopt/flashopt.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace flashopt_examples {

constexpr int kIn = 64, kHidden = 128, kClasses = 10, kTeacherHidden = 32;
constexpr int kTrain = 16384, kTest = 2048;

//===----------------------------------------------------------------------===//
// The model: parameters as four tensors in one flat f32 vector.
//===----------------------------------------------------------------------===//

struct Layout {
  // W1 [kHidden][kIn], b1 [kHidden], W2 [kClasses][kHidden], b2 [kClasses]
  static constexpr int64_t sizes[4] = {int64_t(kHidden) * kIn, kHidden,
                                       int64_t(kClasses) * kHidden, kClasses};
  static constexpr int64_t offsets[4] = {0, sizes[0], sizes[0] + sizes[1],
                                         sizes[0] + sizes[1] + sizes[2]};
  static constexpr int64_t total = offsets[3] + sizes[3];
  static constexpr bool isBias[4] = {false, true, false, true};
};

struct Data {
  std::vector<float> x; // [n][kIn]
  std::vector<int> y;
};

/// Labels from a random teacher (64 -> 32 tanh -> 10, argmax).
inline void makeData(uint32_t seed, Data &train, Data &test) {
  std::mt19937 rng(seed * 2654435761u + 17u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> t1(size_t(kTeacherHidden) * kIn), t2(size_t(kClasses) * kTeacherHidden);
  for (float &w : t1)
    w = nd(rng) * 0.7f / std::sqrt(float(kIn));
  for (float &w : t2)
    w = nd(rng) * 2.0f / std::sqrt(float(kTeacherHidden));
  auto fill = [&](Data &d, int n) {
    d.x.resize(size_t(n) * kIn);
    d.y.resize(size_t(n));
    for (int s = 0; s < n; ++s) {
      float *x = &d.x[size_t(s) * kIn];
      for (int i = 0; i < kIn; ++i)
        x[i] = nd(rng);
      float h[kTeacherHidden];
      for (int j = 0; j < kTeacherHidden; ++j) {
        float a = 0;
        for (int i = 0; i < kIn; ++i)
          a += t1[size_t(j) * kIn + size_t(i)] * x[i];
        h[j] = std::tanh(a);
      }
      int best = 0;
      float bestV = -INFINITY;
      for (int c = 0; c < kClasses; ++c) {
        float a = 0;
        for (int j = 0; j < kTeacherHidden; ++j)
          a += t2[size_t(c) * kTeacherHidden + size_t(j)] * h[j];
        if (a > bestV) {
          bestV = a;
          best = c;
        }
      }
      d.y[size_t(s)] = best;
    }
  };
  fill(train, kTrain);
  fill(test, kTest);
}

inline std::vector<float> initParams(uint32_t seed) {
  std::mt19937 rng(seed * 40503u + 3u);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(size_t(Layout::total), 0.0f);
  for (int64_t i = 0; i < Layout::sizes[0]; ++i)
    w[size_t(Layout::offsets[0] + i)] = nd(rng) / std::sqrt(float(kIn));
  for (int64_t i = 0; i < Layout::sizes[2]; ++i)
    w[size_t(Layout::offsets[2] + i)] = nd(rng) / std::sqrt(float(kHidden));
  return w; // biases start at 0
}

/// Mean cross-entropy over `idx` (and its gradient into `grad` if non-null);
/// `correct` counts argmax hits.
inline float lossAndGrad(const std::vector<float> &w, const Data &d,
                  const std::vector<int> &idx, std::vector<float> *grad,
                  int *correct = nullptr) {
  const float *W1 = &w[size_t(Layout::offsets[0])];
  const float *b1 = &w[size_t(Layout::offsets[1])];
  const float *W2 = &w[size_t(Layout::offsets[2])];
  const float *b2 = &w[size_t(Layout::offsets[3])];
  float *gW1 = nullptr, *gb1 = nullptr, *gW2 = nullptr, *gb2 = nullptr;
  if (grad) {
    grad->assign(size_t(Layout::total), 0.0f);
    gW1 = &(*grad)[size_t(Layout::offsets[0])];
    gb1 = &(*grad)[size_t(Layout::offsets[1])];
    gW2 = &(*grad)[size_t(Layout::offsets[2])];
    gb2 = &(*grad)[size_t(Layout::offsets[3])];
  }
  const float invB = 1.0f / float(idx.size());
  double loss = 0;
  int hits = 0;
  float h[kHidden], logits[kClasses], dl[kClasses], dh[kHidden];
  for (int s : idx) {
    const float *x = &d.x[size_t(s) * kIn];
    for (int j = 0; j < kHidden; ++j) {
      float a = b1[j];
      const float *row = W1 + size_t(j) * kIn;
      for (int i = 0; i < kIn; ++i)
        a += row[i] * x[i];
      h[j] = std::tanh(a);
    }
    float mx = -INFINITY;
    int arg = 0;
    for (int c = 0; c < kClasses; ++c) {
      float a = b2[c];
      const float *row = W2 + size_t(c) * kHidden;
      for (int j = 0; j < kHidden; ++j)
        a += row[j] * h[j];
      logits[c] = a;
      if (a > mx) {
        mx = a;
        arg = c;
      }
    }
    hits += arg == d.y[size_t(s)];
    double z = 0;
    for (int c = 0; c < kClasses; ++c)
      z += std::exp(double(logits[c] - mx));
    double logZ = std::log(z) + mx;
    loss += logZ - logits[d.y[size_t(s)]];
    if (!grad)
      continue;
    for (int c = 0; c < kClasses; ++c)
      dl[c] = (float(std::exp(double(logits[c]) - logZ)) -
               (c == d.y[size_t(s)] ? 1.0f : 0.0f)) *
              invB;
    for (int j = 0; j < kHidden; ++j)
      dh[j] = 0;
    for (int c = 0; c < kClasses; ++c) {
      gb2[c] += dl[c];
      float *grow = gW2 + size_t(c) * kHidden;
      const float *row = W2 + size_t(c) * kHidden;
      for (int j = 0; j < kHidden; ++j) {
        grow[j] += dl[c] * h[j];
        dh[j] += row[j] * dl[c];
      }
    }
    for (int j = 0; j < kHidden; ++j) {
      float dp = dh[j] * (1.0f - h[j] * h[j]);
      gb1[j] += dp;
      float *grow = gW1 + size_t(j) * kIn;
      for (int i = 0; i < kIn; ++i)
        grow[i] += dp * x[i];
    }
  }
  if (correct)
    *correct = hits;
  return float(loss / double(idx.size()));
}

//===----------------------------------------------------------------------===//
// Storage in the bundle's dtypes.
//===----------------------------------------------------------------------===//

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// f32 -> bf16, round to nearest even (NaN stays NaN).
inline uint16_t toBf16(float f) {
  uint32_t u = bitsOf(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float fromBf16(uint16_t b) { return fromBits(uint32_t(b) << 16); }

/// f32 -> IEEE binary16, round to nearest even (overflow to Inf, subnormals
/// kept).
inline uint16_t toF16(float f) {
  uint32_t x = bitsOf(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) // Inf, NaN
    return uint16_t(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) // >= 65520: rounds to Inf
    return uint16_t(sign | 0x7c00u);
  if (x >= 0x38800000u) { // normal in f16
    uint32_t r = x - 0x38000000u; // rebias the exponent (127 -> 15)
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  if (x < 0x33000000u) // below half the smallest subnormal
    return sign;
  uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; // 14 .. 24
  uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u)))
    ++h;
  return uint16_t(sign | h);
}
inline float fromF16(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu,
           m = h & 0x3ffu;
  if (e == 0x1f)
    return fromBits(sign | 0x7f800000u | (m << 13));
  if (e == 0) // zero or subnormal: m * 2^-24
    return fromBits(sign) + (sign ? -1.0f : 1.0f) * float(m) * 5.9604644775390625e-8f;
  return fromBits(sign | ((e + 112u) << 23) | (m << 13));
}

struct AlignedFree {
  void operator()(void *p) const { std::free(p); }
};
using Storage = std::unique_ptr<void, AlignedFree>;

inline Storage allocate(int64_t bytes) {
  size_t n = size_t((bytes + 63) / 64 * 64);
  void *p = std::aligned_alloc(64, n);
  if (p)
    std::memset(p, 0, n);
  return Storage(p);
}

inline float loadAs(flashopt_dtype t, const void *p, int64_t i) {
  switch (t) {
  case FLASHOPT_F32:
    return static_cast<const float *>(p)[i];
  case FLASHOPT_BF16:
    return fromBf16(static_cast<const uint16_t *>(p)[i]);
  case FLASHOPT_F16:
    return fromF16(static_cast<const uint16_t *>(p)[i]);
  default:
    return NAN;
  }
}

inline void store(flashopt_dtype t, void *p, int64_t i, float v) {
  switch (t) {
  case FLASHOPT_F32:
    static_cast<float *>(p)[i] = v;
    break;
  case FLASHOPT_BF16:
    static_cast<uint16_t *>(p)[i] = toBf16(v);
    break;
  case FLASHOPT_F16:
    static_cast<uint16_t *>(p)[i] = toF16(v);
    break;
  default:
    break;
  }
}

} // namespace flashopt_examples

#endif // FLASHOPT_EXAMPLES_MLP_MODEL_H
