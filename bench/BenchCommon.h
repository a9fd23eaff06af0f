//===- BenchCommon.h - Shared helpers of the benchmarks ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Helpers shared by flashopt-cpu-bench and flashopt-gpu-bench: listing the
/// bundles of a kernels directory, parsing size lists ("1e6,1e8"), the
/// bytes one step moves per parameter, and filling buffers with data.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_BENCH_BENCHCOMMON_H
#define FLASHOPT_BENCH_BENCHCOMMON_H

#include "flashopt/host/Float16.h"
#include "flashopt/host/CpuOptimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace flashopt::bench {

using namespace flashopt::host;

/// The bundles of a kernels directory (subfolders holding a manifest.json),
/// sorted by name.
inline std::vector<std::string> listBundles(const std::string &dir) {
  std::vector<std::string> out;
  if (DIR *d = opendir(dir.c_str())) {
    while (dirent *e = readdir(d)) {
      std::string n = e->d_name;
      struct stat st;
      if (n != "." && n != ".." &&
          stat((dir + "/" + n + "/manifest.json").c_str(), &st) == 0 &&
          S_ISREG(st.st_mode))
        out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Parses "1e6,1e8,250000" into element counts; false on a bad entry.
inline bool parseSizes(const std::string &s, std::vector<int64_t> &out) {
  out.clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char *end = nullptr;
    double v = std::strtod(item.c_str(), &end);
    if (!end || *end || !(v >= 1) || v > 1e13)
      return false;
    out.push_back(int64_t(std::llround(v)));
  }
  return !out.empty();
}

/// "1e+06" -> "1e6", 300 * 65536 -> "19660800".
inline std::string sizeName(int64_t n) {
  int e = 0;
  int64_t m = n;
  while (m >= 10 && m % 10 == 0) {
    m /= 10;
    ++e;
  }
  if (e >= 3)
    return std::to_string(m) + "e" + std::to_string(e);
  return std::to_string(n);
}

/// Bytes one step moves per parameter: every buffer read once and every
/// writable one written once; per-group buffers amortized over the group.
inline double bytesMovedPerParam(const Manifest &m) {
  double b = 0;
  for (const BufferSpec &buf : m.buffers) {
    double per = buf.per == Per::Group
                     ? double(dtype_bits(buf.dtype)) / 8 / double(m.group_size)
                     : double(dtype_bits(buf.dtype)) / 8;
    b += per * (buf.writable ? 2 : 1);
  }
  return b;
}

/// Fills `n` elements of float dtype `t` at `dst` with values of magnitude
/// about `scale` (a fixed pseudo-random pattern).
inline void fillFloats(DType t, void *dst, int64_t n, float scale,
                       uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float v = scale * (float(int64_t(s % 2001) - 1000) / 1000.0f);
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
      static_cast<uint8_t *>(dst)[i] = uint8_t(s);
      break;
    }
  }
}

} // namespace flashopt::bench

#endif // FLASHOPT_BENCH_BENCHCOMMON_H
