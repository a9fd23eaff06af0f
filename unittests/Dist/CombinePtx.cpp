//===- CombinePtx.cpp - Prints the NCCL combine kernels' PTX --------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Writes runtime/nccl's combine kernels (ReduceKernels.h) to stdout, so
/// that ctest assembles them with ptxas for every chip the bundles target
/// (the PTX interpreter runs them in the NCCL tests; the driver JIT-compiles
/// them on a GPU).
///
//===----------------------------------------------------------------------===//

#include "ReduceKernels.h"

#include <cstdio>

int main() {
  return std::fputs(flashopt::nccl::combine_kernels_ptx().c_str(), stdout) < 0;
}
