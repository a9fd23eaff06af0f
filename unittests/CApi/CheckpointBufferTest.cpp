//===- CheckpointBufferTest.cpp - Checkpoints in memory through the C ABI -===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_save_checkpoint_buffer / flashopt_load_checkpoint_buffer /
/// flashopt_buffer_free: the bytes are exactly those of the file
/// flashopt_save_checkpoint writes (both forms); a buffer loads as the file
/// does (N steps, save, load, M steps equals N + M steps bit for bit); a
/// rejected buffer changes nothing, with the statuses of a rejected file.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string kernels(const std::string &spec) {
  const char *b = std::getenv("FLASHOPT_BINARY_DIR");
  return std::string(b ? b : FLASHOPT_TEST_BINARY_DIR) + "/kernels/" + spec;
}

std::string lastError() { return flashopt_last_error(); }

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

std::string tempPath(const std::string &tag) {
  return (fs::temp_directory_path() /
          ("flashopt-ckbuf-" + std::to_string(getpid()) + "-" + tag +
           ".safetensors"))
      .string();
}

std::vector<uint8_t> fileBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

/// An adamw_bf16_m24 optimizer (bf16 params, an i8 correction, quantized
/// states) over two parameters of one spec.
struct Opt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<uint16_t> p0, g0, p1, g1;
  explicit Opt(const std::string &spec = "adamw_bf16_m24")
      : p0(1000, 0x3f80), g0(1000), p1(77, 0xbf00), g1(77) {
    for (size_t i = 0; i < g0.size(); ++i)
      g0[i] = uint16_t(0x3c00 + (i % 97));
    for (size_t i = 0; i < g1.size(); ++i)
      g1[i] = uint16_t(0xbc00 + (i % 13));
    REQUIRE(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) ==
            FLASHOPT_OK);
    REQUIRE_MESSAGE(flashopt_optimizer_create(ctx, kernels(spec).c_str(),
                                              &opt) == FLASHOPT_OK,
                    lastError());
    int64_t idx;
    REQUIRE(flashopt_add_param(opt, 0, "w0", p0.data(), FLASHOPT_BF16, 1000,
                               g0.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
    REQUIRE(flashopt_add_param(opt, 0, "w1", p1.data(), FLASHOPT_BF16, 77,
                               g1.data(), FLASHOPT_BF16, &idx) == FLASHOPT_OK);
  }
  ~Opt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  Opt(const Opt &) = delete;
  Opt &operator=(const Opt &) = delete;
  void steps(int n) {
    for (int k = 0; k < n; ++k)
      REQUIRE_MESSAGE(flashopt_step(opt) == FLASHOPT_OK, lastError());
  }
  std::vector<uint8_t> save(flashopt_checkpoint_format f =
                                FLASHOPT_CHECKPOINT_COMPRESSED) {
    void *data = nullptr;
    size_t size = 0;
    REQUIRE_MESSAGE(flashopt_save_checkpoint_buffer(opt, f, &data, &size) ==
                        FLASHOPT_OK,
                    lastError());
    REQUIRE(data != nullptr);
    std::vector<uint8_t> out(static_cast<uint8_t *>(data),
                             static_cast<uint8_t *>(data) + size);
    flashopt_buffer_free(data);
    return out;
  }
};

} // namespace

TEST_CASE("checkpoint buffers hold the bytes of the checkpoint file, and "
          "load as it does") {
  Opt a;
  a.steps(3);
  for (flashopt_checkpoint_format f :
       {FLASHOPT_CHECKPOINT_COMPRESSED, FLASHOPT_CHECKPOINT_F32}) {
    CAPTURE(int(f));
    const std::string path = tempPath("file" + std::to_string(int(f)));
    REQUIRE(flashopt_save_checkpoint(a.opt, path.c_str(), f) == FLASHOPT_OK);
    std::vector<uint8_t> file = fileBytes(path);
    fs::remove(path);
    std::vector<uint8_t> buffer = a.save(f);
    CHECK(buffer.size() == file.size());
    CHECK(buffer == file);
  }

  // 3 steps, save, load into a fresh optimizer, 2 steps == 5 steps.
  std::vector<uint8_t> ckpt = a.save();
  Opt b;
  REQUIRE_MESSAGE(flashopt_load_checkpoint_buffer(b.opt, ckpt.data(),
                                                  ckpt.size()) == FLASHOPT_OK,
                  lastError());
  CHECK(b.p0 == a.p0);
  CHECK(b.p1 == a.p1);
  int64_t step = -1;
  REQUIRE(flashopt_get_step(b.opt, -1, &step) == FLASHOPT_OK);
  CHECK(step == 3);
  a.steps(2);
  b.steps(2);
  CHECK(b.p0 == a.p0);
  CHECK(b.p1 == a.p1);
  CHECK(b.save() == a.save());
}

TEST_CASE("a rejected checkpoint buffer changes nothing") {
  Opt a, b;
  a.steps(2);
  b.steps(1);
  std::vector<uint8_t> good = a.save();
  const std::vector<uint8_t> before = b.save();
  auto load = [&](const std::vector<uint8_t> &bytes) {
    return flashopt_load_checkpoint_buffer(b.opt, bytes.data(), bytes.size());
  };

  // Truncated, a corrupt header, a flipped data bit (the checksum), empty.
  std::vector<uint8_t> truncated(good.begin(), good.end() - 10);
  CHECK(load(truncated) == FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "flashopt_load_checkpoint_buffer"));
  CHECK(contains(lastError(), "checkpoint buffer"));
  std::vector<uint8_t> corrupt = good;
  corrupt[12] = '#';
  CHECK(load(corrupt) == FLASHOPT_ERROR_FORMAT);
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;
  CHECK(load(flipped) == FLASHOPT_ERROR_FORMAT);
  CHECK(contains(lastError(), "checksum"));
  CHECK(flashopt_load_checkpoint_buffer(b.opt, nullptr, 0) ==
        FLASHOPT_ERROR_FORMAT);
  CHECK(flashopt_load_checkpoint_buffer(b.opt, nullptr, 5) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);

  // A checkpoint of another spec.
  Opt other("adamw_bf16_m32");
  CHECK(load(other.save()) == FLASHOPT_ERROR_MISMATCH);
  CHECK(contains(lastError(), "adamw_bf16_m32"));
  CHECK(b.save() == before);

  // Saving: NULL outputs and unknown forms are refused, outputs untouched.
  void *data = &b;
  size_t size = 12345;
  CHECK(flashopt_save_checkpoint_buffer(b.opt, FLASHOPT_CHECKPOINT_F32,
                                        nullptr, &size) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_save_checkpoint_buffer(b.opt, FLASHOPT_CHECKPOINT_F32, &data,
                                        nullptr) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(flashopt_save_checkpoint_buffer(b.opt, flashopt_checkpoint_format(7),
                                        &data, &size) ==
        FLASHOPT_ERROR_INVALID_ARGUMENT);
  CHECK(data == &b);
  CHECK(size == 12345);
  flashopt_buffer_free(nullptr);

  // The good one still loads.
  CHECK(load(good) == FLASHOPT_OK);
  CHECK(b.p0 == a.p0);
}
