//===- accum_error.cpp - Error of gradient accumulators ---------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-accum-error: how far N accumulated micro-batch gradients drift
/// from their exact sum, for three accumulator encodings:
///   f32        acc = acc + g (fp32, round to nearest even);
///   bf16+i8    the master-weight split of docs/NUMERICS.md §1 applied to
///              the accumulator: decode (bf16 + i8 correction) -> add g in
///              fp32 -> encode (3 bytes per element);
///   bf16       acc = bf16(acc + g) (2 bytes per element).
/// The micro-batch gradients are bf16 (what a model's backward pass writes),
/// drawn per element from a normal around a per-element mean (a shared
/// signal plus noise, as real micro-batches are), 1e6 elements; the exact
/// sum is in double. Printed per N: the relative RMS error
/// (||acc - exact|| / ||exact||) and the share of elements whose error is
/// larger than half a bf16 ulp of the exact sum (worse than one rounding of
/// the exact sum to bf16).
///
///   build/bin/flashopt-accum-error [elements] [seed]
///
//===----------------------------------------------------------------------===//

#include "codec/Codec.h"
#include "flashopt/host/Float16.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using namespace flashopt::host;

namespace {

struct Errors {
  double rms = 0;   ///< ||acc - exact|| / ||exact||
  double worse = 0; ///< share of elements off by more than half a bf16 ulp
};

/// The bf16 ulp at |x| (x != 0).
double bf16Ulp(double x) {
  int e;
  std::frexp(x, &e);
  return std::ldexp(1.0, e - 8);
}

Errors compare(const std::vector<float> &got, const std::vector<double> &exact) {
  double num = 0, den = 0;
  size_t worse = 0, counted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = double(got[i]) - exact[i];
    num += d * d;
    den += exact[i] * exact[i];
    if (exact[i] != 0.0) {
      ++counted;
      worse += std::fabs(d) > 0.5 * bf16Ulp(exact[i]);
    }
  }
  return {std::sqrt(num / den), double(worse) / double(counted)};
}

} // namespace

int main(int argc, char **argv) {
  const size_t n = argc > 1 ? size_t(std::atof(argv[1])) : 1000000;
  const unsigned seed = argc > 2 ? unsigned(std::atoi(argv[2])) : 1;
  std::mt19937 rng(seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> mean(n), spread(n);
  for (size_t i = 0; i < n; ++i) {
    mean[i] = unit(rng) * 1e-3f;
    spread[i] = std::fabs(unit(rng)) * 2e-3f;
  }
  std::printf("flashopt-accum-error: %zu elements, bf16 micro-batch gradients "
              "(seed %u)\n",
              n, seed);
  std::printf("| N | f32: rel. RMS | f32: > 1/2 bf16 ulp | bf16+i8: rel. RMS "
              "| bf16+i8: > 1/2 bf16 ulp | bf16: rel. RMS | bf16: > 1/2 bf16 "
              "ulp |\n"
              "|---:|---:|---:|---:|---:|---:|---:|\n");
  const int Ns[] = {2, 4, 8, 16, 32, 64};
  std::vector<double> exact(n);
  std::vector<float> f32(n), plain(n), wide(n), g(n);
  std::vector<uint16_t> hi(n), gb(n);
  std::vector<int8_t> lo(n);
  int done = 0;
  for (int N : Ns) {
    std::fill(exact.begin(), exact.end(), 0.0);
    std::fill(f32.begin(), f32.end(), 0.0f);
    std::fill(plain.begin(), plain.end(), 0.0f);
    std::fill(hi.begin(), hi.end(), 0);
    std::fill(lo.begin(), lo.end(), 0);
    for (int k = 0; k < N; ++k) {
      for (size_t i = 0; i < n; ++i) {
        gb[i] = f32_to_bf16(mean[i] + spread[i] * unit(rng));
        g[i] = bf16_to_f32(gb[i]);
        exact[i] += double(g[i]);
        f32[i] = f32[i] + g[i];
        plain[i] = bf16_to_f32(f32_to_bf16(plain[i] + g[i]));
      }
      // The split accumulator: decode, add in fp32, encode.
      codec::decode_master(hi.data(), DType::BF16, lo.data(), DType::I8,
                           int64_t(n), wide.data());
      for (size_t i = 0; i < n; ++i)
        wide[i] = wide[i] + g[i];
      codec::encode_master(wide.data(), int64_t(n), hi.data(), DType::BF16,
                           lo.data(), DType::I8);
    }
    codec::decode_master(hi.data(), DType::BF16, lo.data(), DType::I8,
                         int64_t(n), wide.data());
    Errors a = compare(f32, exact), b = compare(wide, exact),
           c = compare(plain, exact);
    std::printf("| %d | %.2e | %.4f%% | %.2e | %.4f%% | %.2e | %.2f%% |\n", N,
                a.rms, 100 * a.worse, b.rms, 100 * b.worse, c.rms,
                100 * c.worse);
    ++done;
  }
  return done == int(sizeof Ns / sizeof Ns[0]) ? 0 : 1;
}
