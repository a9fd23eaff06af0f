//===- CheckpointFuzzer.cpp - Fuzz target: the checkpoint loader -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_load_checkpoint of arbitrary bytes into a live optimizer
/// (adamw_bf16_m24 from FLASHOPT_FUZZ_BUNDLE, two parameters "w" [100] and
/// "b" [32] in two param groups, stepped twice). A rejected file must leave
/// parameters, correction terms, states, scales, step counters and
/// hyper-parameters exactly as they were (asserted: the optimizer's own
/// compressed checkpoint before and after is compared tensor for tensor and
/// field for field), with a status other than OK and a message naming the
/// file. An accepted file is undone by loading the original again.
///
/// FLASHOPT_FUZZ_WRITE_SEEDS=DIR writes the seed checkpoints (compressed and
/// f32) of this optimizer into DIR and exits.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "CheckpointFuzzer: %s (%s)\n", what.c_str(),
               flashopt_last_error());
  std::abort();
}

std::string readFile(const std::string &path) {
  std::string out;
  if (FILE *f = std::fopen(path.c_str(), "rb")) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
      out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

void writeFile(const std::string &path, const uint8_t *data, size_t size) {
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    die("cannot write " + path);
  if (size && std::fwrite(data, 1, size, f) != size)
    die("short write to " + path);
  std::fclose(f);
}

struct Live {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<uint16_t> w, gw, b, gb;
  std::string dir, input, snapA, snapB, original;

  Live() {
    const char *bundle = std::getenv("FLASHOPT_FUZZ_BUNDLE");
    if (!bundle)
      die("set FLASHOPT_FUZZ_BUNDLE to a built adamw_bf16_m24 bundle");
    const char *tmp = std::getenv("TMPDIR");
    // tmpfs when there is one: every iteration saves a small checkpoint.
    dir = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                    : (tmp ? tmp : "/tmp")) +
          "/flashopt-ckpt-fuzz-" + std::to_string(getpid());
    if (system(("mkdir -p '" + dir + "'").c_str()) != 0)
      die("cannot create " + dir);
    input = dir + "/input.safetensors";
    snapA = dir + "/a.safetensors";
    snapB = dir + "/b.safetensors";
    original = dir + "/original.safetensors";
    w.resize(112);
    gw.resize(112);
    b.resize(32);
    gb.resize(32);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = uint16_t(0x3F00 + (i * 37) % 200);
      gw[i] = uint16_t(0x3C00 + (i * 11) % 300) ^ uint16_t((i & 1) << 15);
    }
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = uint16_t(0xBF00 + (i * 13) % 100);
      gb[i] = uint16_t(0x3A00 + i);
    }
    if (flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx) != FLASHOPT_OK ||
        flashopt_context_set_threads(ctx, 1) != FLASHOPT_OK ||
        flashopt_optimizer_create(ctx, bundle, &opt) != FLASHOPT_OK)
      die("cannot create the optimizer");
    int32_t g1 = -1;
    int64_t idx = -1;
    if (flashopt_add_param_group(opt, &g1) != FLASHOPT_OK ||
        flashopt_set_hyper(opt, g1, "lr", 0.01) != FLASHOPT_OK ||
        flashopt_add_param(opt, 0, "w", w.data(), FLASHOPT_BF16, 100, gw.data(),
                           FLASHOPT_BF16, &idx) != FLASHOPT_OK ||
        flashopt_add_param(opt, g1, "b", b.data(), FLASHOPT_BF16, 32, gb.data(),
                           FLASHOPT_BF16, &idx) != FLASHOPT_OK ||
        flashopt_step(opt) != FLASHOPT_OK || flashopt_step(opt) != FLASHOPT_OK)
      die("cannot set the optimizer up");
    save(original);
    if (const char *seeds = std::getenv("FLASHOPT_FUZZ_WRITE_SEEDS")) {
      std::string d = seeds;
      if (flashopt_save_checkpoint(opt, (d + "/compressed.safetensors").c_str(),
                                   FLASHOPT_CHECKPOINT_COMPRESSED) != FLASHOPT_OK ||
          flashopt_save_checkpoint(opt, (d + "/f32.safetensors").c_str(),
                                   FLASHOPT_CHECKPOINT_F32) != FLASHOPT_OK)
        die("cannot write seeds");
      std::exit(0);
    }
  }
  ~Live() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
    (void)system(("rm -rf '" + dir + "'").c_str());
  }
  void save(const std::string &path) {
    if (flashopt_save_checkpoint(opt, path.c_str(),
                                 FLASHOPT_CHECKPOINT_COMPRESSED) != FLASHOPT_OK)
      die("cannot save " + path);
  }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Live live;
  writeFile(live.input, data, size);
  live.save(live.snapA);
  std::string before = readFile(live.snapA);
  // The params the caller owns are part of the state too.
  std::vector<uint16_t> w = live.w, b = live.b;
  flashopt_status s = flashopt_load_checkpoint(live.opt, live.input.c_str());
  if (s == FLASHOPT_OK) {
    // Accepted (a valid checkpoint of this optimizer): back to the original.
    if (flashopt_load_checkpoint(live.opt, live.original.c_str()) != FLASHOPT_OK)
      die("cannot restore the original checkpoint");
    return 0;
  }
  if (!std::strstr(flashopt_last_error(), "input.safetensors"))
    die("the error does not name the file");
  live.save(live.snapB);
  if (readFile(live.snapB) != before || w != live.w || b != live.b)
    die("a rejected checkpoint changed the optimizer");
  return 0;
}
