//===- main.cpp - A program using an installed libflashopt ----------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Uses only the public API (<flashopt/flashopt.hpp> over <flashopt/flashopt.h>)
/// and the bundles flashopt_add_kernels() built from this directory's specs:
///
///  - consumer_adamw, embedded in the executable (EMBED);
///  - consumer_sgd, loaded from <build>/kernels (or the directory given as
///    the first argument).
///
/// Each optimizer gets a CPU context and two parameters (1000 and 37
/// elements: full and partial quantization groups) and minimizes the
/// quadratic loss 0.5 * |w - target|^2 (gradient w - target) for 150 steps.
/// Exits 0 when, for both, the loss fell below 1 % of its start, the memory
/// report adds up, and a bad bundle path is reported as an error; 1
/// otherwise.
///
//===----------------------------------------------------------------------===//

#include <flashopt/flashopt.hpp>

#include "flashopt_bundle_consumer_adamw.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#ifndef CONSUMER_KERNELS_DIR
#define CONSUMER_KERNELS_DIR "kernels"
#endif

namespace {

int failures = 0;

void expect(bool ok, const std::string &what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

// f32 <-> bf16 / f16 storage (round to nearest even).
uint16_t toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float fromBf16(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// A host buffer of `numel` elements of `dtype`, 64-byte aligned.
struct Buffer {
  flashopt_dtype dtype;
  int64_t numel;
  std::unique_ptr<void, void (*)(void *)> mem{nullptr, std::free};

  Buffer(flashopt_dtype t, int64_t n) : dtype(t), numel(n) {
    size_t bytes = (size_t(n) * flashopt_dtype_size(t) + 63) / 64 * 64;
    mem.reset(std::aligned_alloc(64, bytes));
    if (!mem)
      throw std::bad_alloc();
    std::memset(mem.get(), 0, bytes);
  }
  float get(int64_t i) const {
    if (dtype == FLASHOPT_F32)
      return static_cast<const float *>(mem.get())[i];
    return fromBf16(static_cast<const uint16_t *>(mem.get())[i]);
  }
  void set(int64_t i, float v) {
    if (dtype == FLASHOPT_F32)
      static_cast<float *>(mem.get())[i] = v;
    else
      static_cast<uint16_t *>(mem.get())[i] = toBf16(v);
  }
};

/// Trains two parameters with `opt` on the quadratic loss.
void train(flashopt::Optimizer &opt, const char *label) {
  flashopt_optimizer_info info = opt.info();
  std::printf("%s: spec %s (rule %s, param %s, grad %s)\n", label, info.name,
              info.rule, flashopt_dtype_name(info.param_dtype),
              flashopt_dtype_name(info.grad_dtype));
  expect(info.param_dtype == FLASHOPT_F32 || info.param_dtype == FLASHOPT_BF16,
         std::string(label) + ": this example stores f32 or bf16 parameters");

  const int64_t sizes[2] = {1000, 37};
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<Buffer> params, grads;
  std::vector<std::vector<float>> targets;
  for (int k = 0; k < 2; ++k) {
    params.emplace_back(info.param_dtype, sizes[k]); // w = 0
    grads.emplace_back(info.grad_dtype, sizes[k]);
    targets.emplace_back(size_t(sizes[k]));
    for (float &t : targets.back())
      t = nd(rng);
    opt.add_param("w" + std::to_string(k), params[size_t(k)].mem.get(),
                  info.param_dtype, sizes[k], grads[size_t(k)].mem.get(),
                  info.grad_dtype);
  }

  auto lossAndGrad = [&]() {
    double loss = 0;
    for (size_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < sizes[k]; ++i) {
        float d = params[k].get(i) - targets[k][size_t(i)];
        loss += 0.5 * double(d) * double(d);
        grads[k].set(i, d);
      }
    return loss;
  };

  const int steps = 150;
  double first = 0, last = 0;
  for (int s = 1; s <= steps; ++s) {
    double loss = lossAndGrad();
    if (s == 1)
      first = loss;
    if (s == 1 || s % 50 == 0)
      std::printf("  step %3d  loss %10.4f\n", s, loss);
    opt.step();
  }
  last = lossAndGrad();
  std::printf("  after %d steps: loss %.4f (%.3f%% of the start)\n", steps,
              last, 100.0 * last / first);
  expect(std::isfinite(last) && last < 0.01 * first,
         std::string(label) + ": the loss did not fall below 1% of its start");
  expect(opt.step_count() == steps, std::string(label) + ": step count");

  flashopt_memory_report r = opt.memory_report();
  const int64_t n = sizes[0] + sizes[1];
  const int64_t ps = int64_t(flashopt_dtype_size(info.param_dtype));
  const int64_t gs = int64_t(flashopt_dtype_size(info.grad_dtype));
  const int64_t cs =
      info.has_correction ? int64_t(flashopt_dtype_size(info.correction_dtype)) : 0;
  std::printf("  memory: %lld params, %.4f B/param (%.4f with gradient "
              "release): param %lld + correction %lld + grad %lld + states "
              "%lld bytes; %lld allocated\n",
              (long long)r.numel, r.bytes_per_param,
              r.bytes_per_param_with_grad_release, (long long)r.param_bytes,
              (long long)r.correction_bytes, (long long)r.grad_bytes,
              (long long)r.state_bytes, (long long)r.allocated_bytes);
  std::string m = std::string(label) + ": memory report: ";
  expect(r.numel == n, m + "numel");
  expect(r.param_bytes == n * ps, m + "param bytes");
  expect(r.grad_bytes == n * gs, m + "grad bytes");
  expect(r.correction_bytes == n * cs, m + "correction bytes");
  expect(r.state_bytes > 0 && r.state_bytes < n * 8, m + "state bytes");
  expect(r.total_bytes ==
             r.param_bytes + r.correction_bytes + r.grad_bytes + r.state_bytes,
         m + "total != sum of the categories");
  expect(r.total_bytes_with_grad_release == r.total_bytes - r.grad_bytes,
         m + "total with gradient release");
  expect(std::fabs(r.bytes_per_param - double(r.total_bytes) / double(n)) < 1e-9,
         m + "bytes per param");
  expect(r.allocated_bytes >= r.correction_bytes + r.state_bytes,
         m + "allocated < correction + states");
  if (std::string(info.name) == "consumer_adamw") // bf16 + i8 + bf16 grad + 8-bit m, v
    expect(r.bytes_per_param > 7.12 && r.bytes_per_param < 7.2,
           m + "AdamW bf16 + 24-bit master should be ~7.125 B/param");
}

} // namespace

int main(int argc, char **argv) {
  const std::string kernels = argc > 1 ? argv[1] : CONSUMER_KERNELS_DIR;
  std::printf("libflashopt %s (ABI %d)\n", flashopt::version(),
              flashopt::abi_version());
  try {
    flashopt::Context ctx = flashopt::Context::cpu();

    flashopt::Optimizer adamw(ctx, flashopt_bundle_consumer_adamw);
    train(adamw, "embedded");

    flashopt::Optimizer sgd(ctx, kernels + "/consumer_sgd");
    train(sgd, "directory");

    // Errors are reported, not fatal.
    try {
      flashopt::Optimizer missing(ctx, kernels + "/no_such_bundle");
      expect(false, "a missing bundle directory was accepted");
    } catch (const flashopt::Error &e) {
      std::printf("a missing bundle is reported: %s\n", e.what());
      expect(e.status() != FLASHOPT_OK && std::strlen(e.what()) > 0,
             "the error for a missing bundle");
    }
  } catch (const flashopt::Error &e) {
    std::fprintf(stderr, "FAIL: flashopt error: %s\n", e.what());
    return 1;
  }
  if (failures) {
    std::fprintf(stderr, "flashopt-consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("flashopt-consumer: ok\n");
  return 0;
}
