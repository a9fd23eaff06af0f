//===- PieceTest.cpp - flashopt_add_param_piece
//-----------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Pieces of a logical tensor (flashopt_add_param_piece, what the PyTorch
/// binding registers for an FSDP2 shard): pieces at their element offsets
/// step exactly as the whole tensor does, bit for bit, from parameter and
/// gradient memory at any address on the CPU; the offset is what makes it so
/// (the same piece at offset 0 steps differently in the bounded numerics);
/// bad offsets are refused and change nothing.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"
#include "flashopt/host/Float16.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace flashopt::host;

namespace {

std::string binaryDir() {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return b ? b : FLASHOPT_TEST_BINARY_DIR;
}

std::string lastError() { return flashopt_last_error(); }

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

/// 64-byte aligned zeroed bytes; `at(k)` is the address k bytes in.
struct Bytes {
  std::shared_ptr<uint8_t> mem;
  explicit Bytes(size_t n) {
    void *p = nullptr;
    size_t rounded = (n + 64 + 63) / 64 * 64;
    REQUIRE(posix_memalign(&p, 64, rounded) == 0);
    std::memset(p, 0, rounded);
    mem.reset(static_cast<uint8_t *>(p), [](uint8_t *q) { std::free(q); });
  }
  uint8_t *at(size_t k) const { return mem.get() + k; }
};

struct Opt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  explicit Opt(const std::string &spec) {
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE_MESSAGE(flashopt_optimizer_create(
                        ctx, (binaryDir() + "/kernels/" + spec).c_str(),
                        &opt) == FLASHOPT_OK,
                    lastError());
    REQUIRE(flashopt_set_hyper(opt, 0, "lr", 1e-2) == FLASHOPT_OK);
  }
  ~Opt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  flashopt_optimizer_info info() const {
    flashopt_optimizer_info i;
    REQUIRE(flashopt_optimizer_get_info(opt, &i) == FLASHOPT_OK);
    return i;
  }
};

/// Element k of a tensor of `dtype` (bf16 or f32) at `p`, as float.
float get(const uint8_t *p, flashopt_dtype dtype, int64_t k) {
  if (dtype == FLASHOPT_F32) {
    float f;
    std::memcpy(&f, p + 4 * k, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * k, 2);
  return bf16_to_f32(h);
}

void put(uint8_t *p, flashopt_dtype dtype, int64_t k, float v) {
  if (dtype == FLASHOPT_F32) {
    std::memcpy(p + 4 * k, &v, 4);
    return;
  }
  uint16_t h = f32_to_bf16(v);
  std::memcpy(p + 2 * k, &h, 2);
}

/// The logical tensor: N elements, stepped whole (optimizer `whole`) and as
/// pieces [0, cut) and [cut, N) at odd addresses (optimizer `pieces`, the
/// second piece at `secondOffset`, the right one being `cut`).
struct Run {
  static constexpr int64_t N = 32 * 5 + 7;
  flashopt_dtype pdt, gdt;
  size_t pes, ges;
  Opt whole, pieces;
  Bytes wp, wg, pp, pg;
  int64_t cut;
  // The pieces' memory starts `skew` bytes past an aligned address.
  size_t skew;

  Run(const std::string &spec, int64_t cut, int64_t secondOffset)
      : whole(spec), pieces(spec), wp(N * 4), wg(N * 4), pp(N * 4 + 64),
        pg(N * 4 + 64), cut(cut) {
    flashopt_optimizer_info i = whole.info();
    pdt = i.param_dtype;
    gdt = i.grad_dtype;
    pes = flashopt_dtype_size(pdt);
    ges = flashopt_dtype_size(gdt);
    skew = pes; // one element: never 16-byte aligned
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int64_t k = 0; k < N; ++k) {
      float v = n(rng);
      put(wp.at(0), pdt, k, v);
      put(pp.at(skew), pdt, k, v);
    }
    int64_t idx;
    REQUIRE_MESSAGE(flashopt_add_param(whole.opt, 0, "w", wp.at(0), pdt, N,
                                       wg.at(0), gdt, &idx) == FLASHOPT_OK,
                    lastError());
    REQUIRE_MESSAGE(flashopt_add_param_piece(pieces.opt, 0, "w.a", pp.at(skew),
                                             pdt, cut, pg.at(ges), gdt, 0,
                                             &idx) == FLASHOPT_OK,
                    lastError());
    REQUIRE_MESSAGE(flashopt_add_param_piece(
                        pieces.opt, 0, "w.b", pp.at(skew + size_t(cut) * pes),
                        pdt, N - cut, pg.at(ges + size_t(cut) * ges), gdt,
                        secondOffset, &idx) == FLASHOPT_OK,
                    lastError());
  }

  /// One step of both with the same gradients (seeded by `step`).
  void step(int step) {
    std::mt19937 rng(100 + step);
    std::normal_distribution<float> n(0.f, 1e-2f);
    for (int64_t k = 0; k < N; ++k) {
      float v = n(rng);
      put(wg.at(0), gdt, k, v);
      put(pg.at(ges), gdt, k, v);
    }
    REQUIRE_MESSAGE(flashopt_step(whole.opt) == FLASHOPT_OK, lastError());
    REQUIRE_MESSAGE(flashopt_step(pieces.opt) == FLASHOPT_OK, lastError());
  }

  /// The first element where the two disagree (-1: none), bit for bit.
  int64_t firstDifference() const {
    for (int64_t k = 0; k < N; ++k)
      if (std::memcmp(wp.at(size_t(k) * pes), pp.at(skew + size_t(k) * pes),
                      pes) != 0)
        return k;
    return -1;
  }
};

} // namespace

TEST_CASE("flashopt_add_param_piece: pieces at their offsets step as the "
          "whole tensor, bit for bit, at any address on the CPU") {
  for (const char *spec :
       {"adamw_bf16_m24", "adam_f32", "lion_bf16", "sgd_bf16_m24"}) {
    CAPTURE(spec);
    Run r(spec, 64, 64);
    for (int s = 0; s < 12; ++s) {
      r.step(s);
      CAPTURE(s);
      REQUIRE(r.firstDifference() == -1);
    }
    // Re-pointing a piece's gradient at another odd address is accepted.
    int64_t i1 = 1;
    const void *g = r.pg.at(r.ges + size_t(r.cut) * r.ges);
    CHECK_MESSAGE(flashopt_set_grads(r.pieces.opt, 1, &i1, &g, r.gdt) ==
                      FLASHOPT_OK,
                  lastError());
  }
}

TEST_CASE("flashopt_add_param_piece: the offset is what makes a piece step as "
          "its elements of the whole tensor (the dither index)") {
  // The second piece registered at offset 0 instead of 64: the bounded
  // numerics' dither then differs, so its codes (and soon its parameters) do.
  Run r("adamw_bf16_m24", 64, 0);
  int64_t first = -1;
  for (int s = 0; s < 20 && first < 0; ++s) {
    r.step(s);
    first = r.firstDifference();
  }
  CHECK(first >= 64); // the first piece is right, the second is not
}

TEST_CASE("flashopt_add_param_piece: bad offsets are refused and register "
          "nothing") {
  Opt o("adamw_bf16_m24");
  Bytes p(256), g(256);
  int64_t idx = -1, count = -1;
  CHECK(flashopt_add_param_piece(o.opt, 0, "x", p.at(0), FLASHOPT_BF16, 64,
                                 g.at(0), FLASHOPT_BF16, 5,
                                 &idx) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "group size 32"));
  CHECK(flashopt_add_param_piece(o.opt, 0, "x", p.at(0), FLASHOPT_BF16, 64,
                                 g.at(0), FLASHOPT_BF16, -32,
                                 &idx) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(contains(lastError(), "negative"));
  REQUIRE(flashopt_num_params(o.opt, &count) == FLASHOPT_OK);
  CHECK(count == 0);
  // A whole tensor keeps flashopt_add_param's 16-byte rule; a piece at the
  // same odd address is accepted on the CPU.
  CHECK(flashopt_add_param(o.opt, 0, "y", p.at(2), FLASHOPT_BF16, 64, g.at(0),
                           FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_add_param_piece(o.opt, 0, "y", p.at(2), FLASHOPT_BF16, 64,
                                 g.at(2), FLASHOPT_BF16, 96,
                                 &idx) == FLASHOPT_OK);
  CHECK(idx == 0);
  // Its name and memory count as a parameter's.
  CHECK(flashopt_add_param_piece(o.opt, 0, "y", p.at(130), FLASHOPT_BF16, 32,
                                 nullptr, FLASHOPT_BF16, 0,
                                 &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
  CHECK(flashopt_add_param(o.opt, 0, "z", p.at(64), FLASHOPT_BF16, 32, nullptr,
                           FLASHOPT_BF16,
                           &idx) == FLASHOPT_ERROR_ALREADY_EXISTS);
}
