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
/// last error; fnv hashes buffers to compare replicas.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H
#define FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H

#include "flashopt/flashopt.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

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

uint64_t fnv(const void *p, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const unsigned char *c = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

} // namespace

#endif // FLASHOPT_UNITTESTS_DIST_DISTTESTSUPPORT_H
