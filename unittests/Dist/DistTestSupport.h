//===- DistTestSupport.h - What the MPI test programs share ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The check counters and macros of the mpirun test programs
/// (DataParallelTest, ShardedTest, NcclTest): each rank counts its checks
/// and failures and prints a failing check with its rank and the library's
/// last error; fnv hashes buffers to compare replicas; Tensor holds a 16-
/// or 32-bit float tensor's host bytes; sameEverywhere compares a hash
/// across the ranks.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H
#define FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H

#include "flashopt/flashopt.h"
#include "flashopt/host/Float16.h"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

int rank = 0, world = 1;
int failures = 0, checks = 0;
std::string kernels;

#define EXPECT(cond, what)                                                     \
  do {                                                                         \
    ++checks;                                                                  \
    if (!(cond)) {                                                             \
      ++failures;                                                              \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", rank, __FILE__,    \
                   __LINE__, #cond, std::string(what).c_str(),                 \
                   flashopt_last_error());                                     \
    }                                                                          \
  } while (0)

#define OK(call) EXPECT((call) == FLASHOPT_OK, #call)

/// The bytes of the file at `path` (empty when it cannot be read).
[[maybe_unused]] std::vector<uint8_t> fileBytes(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

uint64_t fnv(const void *p, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const unsigned char *c = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// Values of a 16-bit or 32-bit float tensor, host bytes.
struct Tensor {
  flashopt_dtype dtype;
  int64_t n;
  std::vector<uint8_t> bytes;
  Tensor(flashopt_dtype d, int64_t n)
      : dtype(d), n(n), bytes(size_t(n) * (d == FLASHOPT_F32 ? 4 : 2)) {}
  void *data() { return bytes.data(); }
  float get(int64_t i) const {
    if (dtype == FLASHOPT_F32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == FLASHOPT_BF16 ? flashopt::host::bf16_to_f32(h)
                                  : flashopt::host::f16_to_f32(h);
  }
  void set(int64_t i, float v) {
    if (dtype == FLASHOPT_F32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      return;
    }
    uint16_t h = dtype == FLASHOPT_BF16 ? flashopt::host::f32_to_bf16(v)
                                        : flashopt::host::f32_to_f16(v);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
};

/// Tensors of `sizes`, normal values of deviation `scale` from `seed`.
std::vector<Tensor> randomTensors(flashopt_dtype d,
                                  const std::vector<int64_t> &sizes,
                                  uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<Tensor> out;
  for (int64_t n : sizes) {
    out.emplace_back(d, n);
    for (int64_t i = 0; i < n; ++i)
      out.back().set(i, dist(rng));
  }
  return out;
}

using Hypers = std::vector<std::pair<const char *, double>>;

/// A CPU optimizer over bundle `bundle` (a path) with one parameter per
/// size ("w0", "w1", ...), random parameters from `seed`, caller-owned
/// gradients.
struct DistOpt {
  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  std::vector<Tensor> params, grads;
  flashopt_dtype pdt = FLASHOPT_F32, gdt = FLASHOPT_F32;

  DistOpt(const std::string &bundle, const std::vector<int64_t> &sizes,
          uint64_t seed, const Hypers &hypers) {
    OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
    OK(flashopt_context_set_threads(ctx, 1));
    OK(flashopt_optimizer_create(ctx, bundle.c_str(), &opt));
    flashopt_optimizer_info info{};
    OK(flashopt_optimizer_get_info(opt, &info));
    pdt = info.param_dtype;
    gdt = info.grad_dtype;
    for (const auto &[name, v] : hypers)
      OK(flashopt_set_hyper(opt, -1, name, v));
    params = randomTensors(pdt, sizes, seed, 1.0f);
    for (int64_t n : sizes)
      grads.emplace_back(gdt, n);
    for (size_t i = 0; i < sizes.size(); ++i) {
      int64_t idx = -1;
      std::string name = "w" + std::to_string(i);
      OK(flashopt_add_param(opt, 0, name.c_str(), params[i].data(), pdt,
                            sizes[i], grads[i].data(), gdt, &idx));
    }
  }
  ~DistOpt() {
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
  }
  DistOpt(const DistOpt &) = delete;
  DistOpt &operator=(const DistOpt &) = delete;
  void setGrads(const std::vector<Tensor> &g) {
    for (size_t i = 0; i < g.size(); ++i)
      grads[i].bytes = g[i].bytes;
  }
  /// Params and fp32 masters, hashed (collective in sharded mode: the
  /// correction terms are gathered).
  uint64_t hash() {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < params.size(); ++i) {
      h = fnv(params[i].bytes.data(), params[i].bytes.size(), h);
      std::vector<float> m(size_t(params[i].n));
      OK(flashopt_export_master_f32(opt, int64_t(i), m.data(), params[i].n));
      h = fnv(m.data(), m.size() * 4, h);
    }
    return h;
  }
};

/// Whether `h` is the same on every rank of `c`.
bool sameEverywhere(uint64_t h, MPI_Comm c = MPI_COMM_WORLD) {
  int n = 0;
  MPI_Comm_size(c, &n);
  std::vector<uint64_t> all(static_cast<size_t>(n));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, c);
  for (uint64_t x : all)
    if (x != all[0])
      return false;
  return true;
}

} // namespace

#endif // FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H
