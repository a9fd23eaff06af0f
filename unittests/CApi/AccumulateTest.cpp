//===- AccumulateTest.cpp - Gradient accumulation through the C ABI -------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_accumulate / flashopt_step with the generated accumulation
/// kernels (bundles of unittests/CApi/Inputs/accumulate in
/// <build>/kernels-accumulate):
///  - N micro-batches then a step equal, bit for bit, the same optimizer
///    reading f32 gradients stepped once on the host's same-order sum of
///    the micro-batch gradients through the same accumulator encoding, with
///    grad_scale = 1/N (SGD, which exposes scale bugs, AdamW, Lion; the
///    f32, bf16 + i8 and bf16 accumulators), and stay within a tolerance of
///    the true big batch;
///  - the fused last step equals accumulating the last micro-batch too and
///    stepping on the accumulator (host::Optimizer, step_accumulated);
///  - the normalizer, the memory report, and misuse refused.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "codec/Codec.h"
#include "flashopt/host/CpuOptimizer.h"
#include "flashopt/host/Float16.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

using flashopt::host::bf16_to_f32;
using flashopt::host::f32_to_bf16;
namespace codec = flashopt::host::codec;
using flashopt::host::DType;

namespace {

std::string accumDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : FLASHOPT_TEST_BINARY_DIR) + "/kernels-accumulate/";
}

/// Tensors not a multiple of the group size, one smaller than a group.
const std::vector<int64_t> kSizes = {1000, 77, 5};

enum class Acc { F32, BF16I8, BF16 };

/// One optimizer over kSizes, parameters of `pdt`, gradients of `gdt`.
struct Run {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  flashopt_dtype pdt, gdt;
  std::vector<std::vector<uint8_t>> p, g;
  Run(const std::string &bundle, flashopt_dtype pdt_, flashopt_dtype gdt_)
      : pdt(pdt_), gdt(gdt_) {
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE(flashopt_context_set_threads(ctx, 2) == FLASHOPT_OK);
    INFO(flashopt_last_error());
    REQUIRE(flashopt_optimizer_create(ctx, (accumDir() + bundle).c_str(),
                                      &opt) == FLASHOPT_OK);
    REQUIRE(flashopt_set_hyper(opt, -1, "lr", 0.01) == FLASHOPT_OK);
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t n : kSizes) {
      std::vector<float> w(static_cast<size_t>(n));
      for (float &x : w)
        x = d(rng);
      p.push_back(encode(w, pdt));
      g.emplace_back(size_t(n) * (gdt == FLASHOPT_F32 ? 4 : 2));
      int64_t idx;
      REQUIRE(flashopt_add_param(opt, 0, nullptr, p.back().data(), pdt, n,
                                 g.back().data(), gdt, &idx) == FLASHOPT_OK);
    }
  }
  ~Run() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  static std::vector<uint8_t> encode(const std::vector<float> &v,
                                     flashopt_dtype dt) {
    std::vector<uint8_t> out(v.size() * (dt == FLASHOPT_F32 ? 4 : 2));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == FLASHOPT_F32) {
        std::memcpy(out.data() + 4 * i, &v[i], 4);
      } else {
        uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    return out;
  }
  /// Overwrites gradient t in place (the optimizer holds its address).
  void setGrad(size_t t, const std::vector<float> &v) {
    std::vector<uint8_t> bytes = encode(v, gdt);
    REQUIRE(bytes.size() == g[t].size());
    std::memcpy(g[t].data(), bytes.data(), bytes.size());
  }
  std::vector<float> master(size_t t) {
    std::vector<float> out(size_t(kSizes[t]));
    REQUIRE(flashopt_export_master_f32(opt, int64_t(t), out.data(),
                                       kSizes[t]) == FLASHOPT_OK);
    return out;
  }
};

/// Micro-batch gradients, already representable in `gdt` (bf16: rounded).
std::vector<std::vector<std::vector<float>>>
microBatches(int n, flashopt_dtype gdt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(n));
  for (auto &mb : out)
    for (int64_t size : kSizes) {
      std::vector<float> v(static_cast<size_t>(size));
      for (float &x : v) {
        x = 1e-2f * (0.5f + d(rng));
        if (gdt != FLASHOPT_F32)
          x = bf16_to_f32(f32_to_bf16(x));
      }
      mb.push_back(v);
    }
  return out;
}

/// The host's same-order sum through accumulator encoding `acc`: what the
/// accumulate kernels compute (acc = encode(decode(acc) + g), from 0).
std::vector<float> hostAccumulate(const std::vector<std::vector<float>> &gs,
                                  Acc acc) {
  size_t n = gs.front().size();
  std::vector<float> sum(n, 0.0f);
  std::vector<uint16_t> hi(n, 0);
  std::vector<int8_t> lo(n, 0);
  for (const std::vector<float> &g : gs) {
    for (size_t i = 0; i < n; ++i) {
      float s = sum[i] + g[i];
      sum[i] = acc == Acc::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s;
    }
    if (acc == Acc::BF16I8) {
      codec::encode_master(sum.data(), int64_t(n), hi.data(), DType::BF16,
                           lo.data(), DType::I8);
      codec::decode_master(hi.data(), DType::BF16, lo.data(), DType::I8,
                           int64_t(n), sum.data());
    }
  }
  return sum;
}

/// N micro-batches per step, `steps` steps, through the accumulating bundle
/// and through the reference (f32 gradients = the host's accumulation, with
/// grad_scale 1/N): the master weights must agree bit for bit.
void checkAgainstReference(const std::string &bundle, const std::string &ref,
                           flashopt_dtype pdt, flashopt_dtype gdt, Acc acc,
                           int n, int steps) {
  Run a(bundle, pdt, gdt), r(ref, pdt, FLASHOPT_F32);
  REQUIRE(flashopt_set_hyper(r.opt, -1, "grad_scale", double(float(1.0 / n))) ==
          FLASHOPT_OK);
  for (int s = 0; s < steps; ++s) {
    auto mbs = microBatches(n, gdt, uint32_t(100 + s));
    for (int k = 0; k < n; ++k) {
      for (size_t t = 0; t < kSizes.size(); ++t)
        a.setGrad(t, mbs[size_t(k)][t]);
      if (k + 1 < n) {
        INFO(flashopt_last_error());
        REQUIRE(flashopt_accumulate(a.opt) == FLASHOPT_OK);
        int64_t pending = -1;
        REQUIRE(flashopt_get_accumulated(a.opt, 1, &pending) == FLASHOPT_OK);
        CHECK(pending == k + 1);
      }
    }
    INFO(flashopt_last_error());
    REQUIRE(flashopt_step(a.opt) == FLASHOPT_OK);
    for (size_t t = 0; t < kSizes.size(); ++t) {
      std::vector<std::vector<float>> gs;
      for (int k = 0; k < n; ++k)
        gs.push_back(mbs[size_t(k)][t]);
      r.setGrad(t, hostAccumulate(gs, acc));
    }
    REQUIRE(flashopt_step(r.opt) == FLASHOPT_OK);
    for (size_t t = 0; t < kSizes.size(); ++t) {
      std::vector<float> ma = a.master(t), mr = r.master(t);
      CHECK(std::memcmp(ma.data(), mr.data(), ma.size() * 4) == 0);
    }
  }
  int64_t st = 0;
  REQUIRE(flashopt_get_step(a.opt, -1, &st) == FLASHOPT_OK);
  CHECK(st == steps);
}

} // namespace

TEST_CASE("accumulate: SGD (momentum), f32 accumulator, N = 1..5, bitwise") {
  for (int n : {1, 2, 3, 5}) {
    CAPTURE(n);
    checkAgainstReference("sgd_f32_acc_f32", "sgd_f32_acc_f32", FLASHOPT_F32,
                          FLASHOPT_F32, Acc::F32, n, 3);
  }
}

TEST_CASE("accumulate: AdamW m24, f32 / bf16+i8 / bf16 accumulators, bitwise") {
  checkAgainstReference("adamw_m24_acc_f32", "adamw_m24_gradf32", FLASHOPT_BF16,
                        FLASHOPT_BF16, Acc::F32, 4, 3);
  checkAgainstReference("adamw_m24_acc_bf16_i8", "adamw_m24_gradf32",
                        FLASHOPT_BF16, FLASHOPT_BF16, Acc::BF16I8, 4, 3);
  checkAgainstReference("adamw_m24_acc_bf16", "adamw_m24_gradf32",
                        FLASHOPT_BF16, FLASHOPT_BF16, Acc::BF16, 4, 3);
}

TEST_CASE("accumulate: Lion, bf16+i8 accumulator, N = 8, bitwise") {
  checkAgainstReference("lion_bf16_acc_bf16_i8", "lion_bf16_gradf32",
                        FLASHOPT_BF16, FLASHOPT_BF16, Acc::BF16I8, 8, 2);
}

TEST_CASE("accumulate: SGD, N micro-batches = one big batch (the mean)") {
  // Plain SGD on f32: the step after N micro-batches moves every weight by
  // lr * mean(g) up to f32 rounding of the sum (relative 1e-6 here), so a
  // missing or doubled 1/N fails.
  const int n = 4;
  Run a("sgd_f32_acc_f32", FLASHOPT_F32, FLASHOPT_F32);
  REQUIRE(flashopt_set_hyper(a.opt, -1, "momentum", 0.0) == FLASHOPT_OK);
  std::vector<std::vector<float>> before;
  for (size_t t = 0; t < kSizes.size(); ++t)
    before.push_back(a.master(t));
  auto mbs = microBatches(n, FLASHOPT_F32, 9);
  for (int k = 0; k < n; ++k) {
    for (size_t t = 0; t < kSizes.size(); ++t)
      a.setGrad(t, mbs[size_t(k)][t]);
    REQUIRE((k + 1 < n ? flashopt_accumulate(a.opt) : flashopt_step(a.opt)) ==
            FLASHOPT_OK);
  }
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<float> after = a.master(t);
    for (size_t i = 0; i < after.size(); ++i) {
      double mean = 0;
      for (int k = 0; k < n; ++k)
        mean += double(mbs[size_t(k)][t][i]);
      mean /= n;
      double want = double(before[t][i]) - 0.01 * mean;
      CHECK(std::fabs(double(after[i]) - want) <=
            1e-6 * std::fabs(want) + 1e-9);
    }
  }
}

TEST_CASE("accumulate: the normalizer replaces N") {
  // Normalizer 10 over 2 micro-batches: the reference steps the sum with
  // grad_scale 1/10.
  Run a("sgd_f32_acc_f32", FLASHOPT_F32, FLASHOPT_F32),
      r("sgd_f32_acc_f32", FLASHOPT_F32, FLASHOPT_F32);
  REQUIRE(flashopt_set_accumulation_normalizer(a.opt, 10.0) == FLASHOPT_OK);
  REQUIRE(flashopt_set_hyper(r.opt, -1, "grad_scale", double(float(0.1))) ==
          FLASHOPT_OK);
  auto mbs = microBatches(2, FLASHOPT_F32, 5);
  for (size_t t = 0; t < kSizes.size(); ++t)
    a.setGrad(t, mbs[0][t]);
  REQUIRE(flashopt_accumulate(a.opt) == FLASHOPT_OK);
  for (size_t t = 0; t < kSizes.size(); ++t)
    a.setGrad(t, mbs[1][t]);
  REQUIRE(flashopt_step(a.opt) == FLASHOPT_OK);
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<std::vector<float>> gs = {mbs[0][t], mbs[1][t]};
    r.setGrad(t, hostAccumulate(gs, Acc::F32));
  }
  REQUIRE(flashopt_step(r.opt) == FLASHOPT_OK);
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<float> ma = a.master(t), mr = r.master(t);
    CHECK(std::memcmp(ma.data(), mr.data(), ma.size() * 4) == 0);
  }
  CHECK(flashopt_set_accumulation_normalizer(a.opt, -1.0) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("accumulate: fused last step == accumulate, then step on the "
          "accumulator (host::Optimizer), every encoding") {
  using namespace flashopt::host;
  namespace abi = flashopt::abi;
  for (const char *bundle : {"adamw_m24_acc_f32", "adamw_m24_acc_bf16_i8",
                             "adamw_m24_acc_bf16", "lion_bf16_acc_bf16_i8"}) {
    CAPTURE(bundle);
    auto mbs = microBatches(3, FLASHOPT_BF16, 21);
    std::vector<std::vector<uint8_t>> results;
    for (bool fused : {true, false}) {
      auto o = CpuOptimizer::create(accumDir() + bundle);
      REQUIRE(o);
      Optimizer &opt = **o;
      std::vector<std::vector<uint16_t>> p, g;
      std::mt19937 rng(4);
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (int64_t n : kSizes) {
        p.emplace_back(static_cast<size_t>(n));
        for (uint16_t &x : p.back())
          x = f32_to_bf16(d(rng));
        g.emplace_back(static_cast<size_t>(n));
      }
      for (size_t t = 0; t < kSizes.size(); ++t)
        REQUIRE(opt.add_param(0, p[t].data(), kSizes[t], g[t].data()));
      std::vector<int64_t> all = {0, 1, 2};
      for (int step = 1; step <= 2; ++step) {
        for (int k = 0; k < 3; ++k) {
          for (size_t t = 0; t < kSizes.size(); ++t)
            for (size_t i = 0; i < g[t].size(); ++i)
              g[t][i] = f32_to_bf16(mbs[size_t(k)][t][i] * float(step));
          if (k < 2 || !fused)
            REQUIRE(opt.accumulate_tensors(all));
        }
        REQUIRE(opt.step_tensors(all, step,
                                 fused ? abi::KernelKind::StepFused
                                       : abi::KernelKind::StepAccumulated));
      }
      std::vector<uint8_t> bytes;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        const uint8_t *q = reinterpret_cast<const uint8_t *>(p[t].data());
        bytes.insert(bytes.end(), q, q + p[t].size() * 2);
        // Every runtime-owned buffer: correction, states, accumulator.
        for (const abi::BufferSpec &buf : opt.manifest().buffers) {
          if (buf.role == abi::BufferRole::Param ||
              buf.role == abi::BufferRole::Grad)
            continue;
          auto v = opt.read_buffer(int64_t(t), buf.name);
          REQUIRE(v);
          bytes.insert(bytes.end(), v->begin(), v->end());
          // The steps zeroed the accumulator.
          if (buf.role == abi::BufferRole::Accum)
            for (uint8_t x : *v)
              CHECK(x == 0);
        }
      }
      results.push_back(bytes);
    }
    CHECK(results[0] == results[1]);
  }
}

TEST_CASE("accumulate: read/write_accumulator (host::Optimizer) round-trip "
          "and refuse ranges outside the tensor") {
  using namespace flashopt::host;
  auto o = CpuOptimizer::create(accumDir() + "adamw_m24_acc_bf16_i8");
  REQUIRE(o);
  Optimizer &opt = **o;
  std::vector<uint16_t> p(77, f32_to_bf16(1.0f)), g(77, 0);
  REQUIRE(opt.add_param(0, p.data(), 77, g.data()));
  // What the accumulator's encoding (bf16 + i8) keeps of `in`: the values
  // read back are those, element for element, at elements 70..73.
  std::vector<float> in = {0.5f, -3.25f, 1.0f / 3, 12345.0f}, out(4), kept(4);
  {
    uint16_t hi[4];
    int8_t lo[4];
    codec::encode_master(in.data(), 4, hi, DType::BF16, lo, DType::I8);
    codec::decode_master(hi, DType::BF16, lo, DType::I8, 4, kept.data());
  }
  CHECK(kept[0] == 0.5f);
  CHECK(kept[2] != in[2]); // 1/3 is not exact in 16 bits: decoded, not copied
  REQUIRE(opt.write_accumulator(0, 70, 4, in.data()));
  REQUIRE(opt.read_accumulator(0, 70, 4, out.data()));
  CHECK(out == kept);
  const int64_t huge = std::numeric_limits<int64_t>::max();
  struct Bad {
    int64_t tensor, offset, count;
    const char *says;
  };
  for (Bad b :
       {Bad{0, 74, 4, "4 elements at offset 74 do not fit tensor 0 (77 elements)"},
        Bad{0, -1, 1, "1 elements at offset -1 do not fit"},
        Bad{0, 0, -1, "-1 elements at offset 0 do not fit"},
        Bad{0, 1, huge, "at offset 1 do not fit tensor 0 (77 elements)"},
        Bad{1, 0, 1, "no tensor 1"}}) {
    CAPTURE(b.offset);
    CAPTURE(b.count);
    Status r = opt.read_accumulator(b.tensor, b.offset, b.count, out.data());
    Status w = opt.write_accumulator(b.tensor, b.offset, b.count, in.data());
    REQUIRE(!r);
    REQUIRE(!w);
    CHECK(r.message().find(b.says) != std::string::npos);
    CHECK(r.message().rfind("read_accumulator: ", 0) == 0);
    CHECK(w.message().rfind("write_accumulator: ", 0) == 0);
  }
  // The refused writes changed nothing: 70..73 as written, 74..76 (which
  // the refused [74, 78) covers in part) still the fresh accumulator's zeros.
  std::vector<float> tail(7, -1.0f);
  REQUIRE(opt.read_accumulator(0, 70, 7, tail.data()));
  CHECK(std::vector<float>(tail.begin(), tail.begin() + 4) == kept);
  CHECK(tail[4] == 0.0f);
  CHECK(tail[5] == 0.0f);
  CHECK(tail[6] == 0.0f);
}

TEST_CASE("accumulate: misuse is refused with a clear error") {
  // A bundle without an accumulator.
  {
    flashopt_context ctx;
    flashopt_optimizer opt;
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE(flashopt_optimizer_create(
                ctx, (accumDir() + "adamw_m24_gradf32").c_str(), &opt) ==
            FLASHOPT_OK);
    std::vector<uint16_t> p(64, 0);
    std::vector<float> g(64, 0.0f);
    int64_t idx;
    REQUIRE(flashopt_add_param(opt, 0, nullptr, p.data(), FLASHOPT_BF16, 64,
                               g.data(), FLASHOPT_F32, &idx) == FLASHOPT_OK);
    CHECK(flashopt_accumulate(opt) == FLASHOPT_ERROR_UNSUPPORTED);
    std::string e = flashopt_last_error();
    CHECK(e.find("adamw_m24_gradf32 has no gradient accumulator") !=
          std::string::npos);
    CHECK(e.find("\"accumulator\"") != std::string::npos);
    CHECK(flashopt_accumulate_param(opt, 0) == FLASHOPT_ERROR_UNSUPPORTED);
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  Run a("sgd_f32_acc_f32", FLASHOPT_F32, FLASHOPT_F32);
  // Gradient release while micro-batches are pending.
  REQUIRE(flashopt_accumulate(a.opt) == FLASHOPT_OK);
  CHECK(flashopt_step_param(a.opt, 0) == FLASHOPT_ERROR_STATE);
  CHECK(std::string(flashopt_last_error()).find("gradient accumulation") !=
        std::string::npos);
  // Parameters with different numbers of micro-batches.
  REQUIRE(flashopt_accumulate_param(a.opt, 1) == FLASHOPT_OK);
  CHECK(flashopt_step(a.opt) == FLASHOPT_ERROR_STATE);
  CHECK(std::string(flashopt_last_error()).find("same number") !=
        std::string::npos);
  REQUIRE(flashopt_accumulate_param(a.opt, 0) == FLASHOPT_OK);
  REQUIRE(flashopt_accumulate_param(a.opt, 2) == FLASHOPT_OK);
  CHECK(flashopt_step(a.opt) == FLASHOPT_OK);
  CHECK(flashopt_accumulate_param(a.opt, 99) != FLASHOPT_OK);
}

TEST_CASE("accumulate + clipping: the norm of the accumulated gradient") {
  // The same clipping on the reference, which steps the host's same-order
  // sum with grad_scale 1/N: the norm is of sum/N, the clip factor the
  // same, the masters bit for bit (f32 and bf16 + i8 accumulators), once
  // clipped (a small threshold) and once not (a large one).
  struct Case {
    const char *bundle, *ref;
    flashopt_dtype pdt;
    Acc acc;
  };
  for (const Case &c :
       {Case{"sgd_f32_acc_f32", "sgd_f32_acc_f32", FLASHOPT_F32, Acc::F32},
        Case{"adamw_m24_acc_bf16_i8", "adamw_m24_gradf32", FLASHOPT_BF16,
             Acc::BF16I8}})
    for (double maxNorm : {0.05, 100.0}) {
      CAPTURE(c.bundle);
      CAPTURE(maxNorm);
      const int n = 3;
      Run a(c.bundle, c.pdt, c.pdt), r(c.ref, c.pdt, FLASHOPT_F32);
      REQUIRE(flashopt_set_hyper(r.opt, -1, "grad_scale",
                                 double(float(1.0 / n))) == FLASHOPT_OK);
      REQUIRE(flashopt_set_max_grad_norm(a.opt, maxNorm) == FLASHOPT_OK);
      REQUIRE(flashopt_set_max_grad_norm(r.opt, maxNorm) == FLASHOPT_OK);
      for (int s = 0; s < 2; ++s) {
        auto mbs = microBatches(n, c.pdt, uint32_t(40 + s));
        for (int k = 0; k < n; ++k) {
          for (size_t t = 0; t < kSizes.size(); ++t)
            a.setGrad(t, mbs[size_t(k)][t]);
          INFO(flashopt_last_error());
          REQUIRE((k + 1 < n ? flashopt_accumulate(a.opt)
                             : flashopt_step(a.opt)) == FLASHOPT_OK);
        }
        for (size_t t = 0; t < kSizes.size(); ++t) {
          std::vector<std::vector<float>> gs;
          for (int k = 0; k < n; ++k)
            gs.push_back(mbs[size_t(k)][t]);
          r.setGrad(t, hostAccumulate(gs, c.acc));
        }
        REQUIRE(flashopt_step(r.opt) == FLASHOPT_OK);
        double na = -1, nr = -2;
        REQUIRE(flashopt_get_grad_norm(a.opt, &na) == FLASHOPT_OK);
        REQUIRE(flashopt_get_grad_norm(r.opt, &nr) == FLASHOPT_OK);
        CHECK(na == nr);
        CHECK(na > 0.0);
        for (size_t t = 0; t < kSizes.size(); ++t) {
          std::vector<float> ma = a.master(t), mr = r.master(t);
          CHECK(std::memcmp(ma.data(), mr.data(), ma.size() * 4) == 0);
        }
        int64_t pending = -1;
        REQUIRE(flashopt_get_accumulated(a.opt, 0, &pending) == FLASHOPT_OK);
        CHECK(pending == 0);
      }
    }
}

TEST_CASE("accumulate + FLASHOPT_NONFINITE_SKIP: decided on the accumulated "
          "gradient") {
  // A NaN in a middle micro-batch, then an Inf in the last one (added by
  // the step itself): each step is skipped, nothing changes, no counter
  // advances, the accumulator is zeroed (the next accumulation starts from
  // nothing: its step equals the reference on those micro-batches alone).
  const int n = 3;
  Run a("adamw_m24_acc_f32", FLASHOPT_BF16, FLASHOPT_BF16),
      r("adamw_m24_gradf32", FLASHOPT_BF16, FLASHOPT_F32);
  REQUIRE(flashopt_set_nonfinite_policy(a.opt, FLASHOPT_NONFINITE_SKIP) ==
          FLASHOPT_OK);
  REQUIRE(flashopt_set_hyper(r.opt, -1, "grad_scale",
                             double(float(1.0 / n))) == FLASHOPT_OK);
  std::vector<std::vector<float>> before;
  for (size_t t = 0; t < kSizes.size(); ++t)
    before.push_back(a.master(t));
  for (int bad : {1, 2}) {
    CAPTURE(bad);
    auto mbs = microBatches(n, FLASHOPT_BF16, uint32_t(60 + bad));
    mbs[size_t(bad)][1][7] = bad == 1 ? NAN : INFINITY;
    for (int k = 0; k < n; ++k) {
      for (size_t t = 0; t < kSizes.size(); ++t)
        a.setGrad(t, mbs[size_t(k)][t]);
      REQUIRE((k + 1 < n ? flashopt_accumulate(a.opt)
                         : flashopt_step(a.opt)) == FLASHOPT_OK);
    }
    int64_t skipped = -1, st = -1, pending = -1;
    REQUIRE(flashopt_get_skipped_steps(a.opt, &skipped) == FLASHOPT_OK);
    CHECK(skipped == bad);
    REQUIRE(flashopt_get_step(a.opt, -1, &st) == FLASHOPT_OK);
    CHECK(st == 0);
    REQUIRE(flashopt_get_accumulated(a.opt, 0, &pending) == FLASHOPT_OK);
    CHECK(pending == 0);
    for (size_t t = 0; t < kSizes.size(); ++t) {
      std::vector<float> m = a.master(t);
      CHECK(std::memcmp(m.data(), before[t].data(), m.size() * 4) == 0);
    }
  }
  auto mbs = microBatches(n, FLASHOPT_BF16, 77);
  for (int k = 0; k < n; ++k) {
    for (size_t t = 0; t < kSizes.size(); ++t)
      a.setGrad(t, mbs[size_t(k)][t]);
    REQUIRE((k + 1 < n ? flashopt_accumulate(a.opt) : flashopt_step(a.opt)) ==
            FLASHOPT_OK);
  }
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<std::vector<float>> gs;
    for (int k = 0; k < n; ++k)
      gs.push_back(mbs[size_t(k)][t]);
    r.setGrad(t, hostAccumulate(gs, Acc::F32));
  }
  REQUIRE(flashopt_step(r.opt) == FLASHOPT_OK);
  for (size_t t = 0; t < kSizes.size(); ++t) {
    std::vector<float> ma = a.master(t), mr = r.master(t);
    CHECK(std::memcmp(ma.data(), mr.data(), ma.size() * 4) == 0);
  }
  int64_t st = -1;
  REQUIRE(flashopt_get_step(a.opt, -1, &st) == FLASHOPT_OK);
  CHECK(st == 1);
}

TEST_CASE("accumulate: the memory report counts the accumulator") {
  for (auto [bundle, bytes] : std::vector<std::pair<const char *, int64_t>>{
           {"adamw_m24_acc_f32", 4},
           {"adamw_m24_acc_bf16_i8", 3},
           {"adamw_m24_acc_bf16", 2}}) {
    CAPTURE(bundle);
    Run a(bundle, FLASHOPT_BF16, FLASHOPT_BF16);
    flashopt_memory_report r;
    REQUIRE(flashopt_memory_report_get(a.opt, &r) == FLASHOPT_OK);
    CHECK(r.accumulator_bytes == bytes * r.numel);
    CHECK(r.total_bytes == r.param_bytes + r.correction_bytes + r.grad_bytes +
                               r.state_bytes + r.accumulator_bytes);
  }
}
