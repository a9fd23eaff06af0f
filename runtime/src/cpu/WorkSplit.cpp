//===- WorkSplit.cpp - Group-aligned chunks for the CPU threads -----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "flashopt/host/CpuOptimizer.h"

#include <algorithm>

namespace flashopt::host {

std::vector<Chunk> split_groups(int64_t total,
                                const std::vector<int64_t> &first_groups,
                                int max_chunks, int64_t min_groups,
                                int64_t align_groups) {
  std::vector<Chunk> out;
  if (total <= 0)
    return out;
  min_groups = std::max<int64_t>(1, min_groups);
  align_groups = std::max<int64_t>(1, align_groups);
  int64_t n =
      std::max<int64_t>(1, std::min<int64_t>(max_chunks, total / min_groups));
  int64_t prev = 0;
  for (int64_t i = 1; i <= n; ++i) {
    // total * i / n without overflow: (q n + r) i / n = q i + r i / n.
    int64_t b = i == n ? total : (total / n) * i + (total % n) * i / n;
    if (i < n && !first_groups.empty()) {
      // Round down to a 64-element boundary of the tensor holding b.
      auto it = std::upper_bound(first_groups.begin(), first_groups.end(), b);
      int64_t first = it == first_groups.begin() ? 0 : *(it - 1);
      int64_t aligned = first + (b - first) / align_groups * align_groups;
      if (aligned > prev)
        b = aligned;
    }
    if (b > prev) {
      out.push_back({prev, b});
      prev = b;
    }
  }
  return out;
}

} // namespace flashopt::host
