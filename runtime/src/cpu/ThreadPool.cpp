//===- ThreadPool.cpp - The CPU backend's persistent threads --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//

#include "ThreadPool.h"

#include <algorithm>

namespace flashopt::host {

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(std::min<unsigned>(n, 1024));
}

} // namespace flashopt::host
