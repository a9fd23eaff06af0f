//===- group_division_check.cpp - The group division at scale ---------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `flashopt-group-division-check [N] [SEED]`: checks N (default 1e8) random
/// (y, a) pairs, |y| <= a, of the reciprocal-and-two-FMA sequence of
/// flashopt-exact-group-division against the IEEE division
/// (test/reference/group_division.h): quotients in the proven range and the
/// codes of all three quantizations (softsign i8, plain i8, ui8). Prints the
/// counts; exits 1 on any mismatch. Too slow for a unit test at 1e8.
///
//===----------------------------------------------------------------------===//

#include "group_division.h"

#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv) {
  using namespace flashopt::ref;
  uint64_t n = argc > 1 ? uint64_t(std::strtod(argv[1], nullptr)) : 100000000u;
  uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  CaseGenerator gen(seed);
  GroupDivisionResult r;
  for (uint64_t i = 0; i < n; ++i) {
    float y, a;
    gen.pair(y, a);
    checkGroupDivision(y, a, r);
  }
  std::printf("flashopt-group-division-check: %llu cases (seed %llu): %llu "
              "quotient mismatches, %llu code mismatches\n",
              (unsigned long long)r.cases, (unsigned long long)seed,
              (unsigned long long)r.quotientMismatches,
              (unsigned long long)r.codeMismatches);
  return r.quotientMismatches || r.codeMismatches ? 1 : 0;
}
