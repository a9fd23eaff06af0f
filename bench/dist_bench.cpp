//===- dist_bench.cpp - Where a data-parallel step spends its time
//----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt-dist-bench: run under mpirun; every rank registers one tensor of
/// N parameters of a bundle (default adamw_bf16_m24, N = 1e7, CPU context
/// with one thread per rank) with an MPI communicator attached, and times,
/// median of R repetitions, in the same run:
///   reduce   the gradient average (every bucket, flashopt_reduce_bucket),
///   step     the fused step alone (the same optimizer, buckets reduced),
///   memcpy   a copy of the gradient bytes (the machine's bandwidth anchor),
/// printing each as ms and as a ratio to the step.
///
///   mpirun -np 2 build/bin/flashopt-dist-bench build/kernels [N] [spec] [reps]
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

#define CHECK_OK(call)                                                         \
  do {                                                                         \
    if ((call) != FLASHOPT_OK) {                                               \
      std::fprintf(stderr, "%s: %s\n", #call, flashopt_last_error());          \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpirun -np W flashopt-dist-bench KERNELS "
                           "[N] [spec] [reps]\n");
    MPI_Finalize();
    return 2;
  }
  const std::string kernels = argv[1];
  const int64_t n = argc > 2 ? int64_t(std::atof(argv[2])) : 10000000;
  const std::string spec = argc > 3 ? argv[3] : "adamw_bf16_m24";
  const int reps = argc > 4 ? std::atoi(argv[4]) : 7;

  flashopt_comm comm;
  CHECK_OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));
  flashopt_context ctx;
  flashopt_optimizer opt;
  CHECK_OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
  CHECK_OK(flashopt_context_set_threads(ctx, 1));
  CHECK_OK(
      flashopt_optimizer_create(ctx, (kernels + "/" + spec).c_str(), &opt));
  flashopt_optimizer_info info{};
  CHECK_OK(flashopt_optimizer_get_info(opt, &info));
  const size_t pb = flashopt_dtype_size(info.param_dtype),
               gb = flashopt_dtype_size(info.grad_dtype);
  std::vector<unsigned char> p(size_t(n) * pb, 0), g(size_t(n) * gb, 0);
  // Small finite values in every dtype (0x3c00 is 1.0 in f16, ~1 in bf16).
  for (size_t i = 0; i < g.size(); i += gb)
    g[i + gb - 1] = 0x3c;
  int64_t idx;
  CHECK_OK(flashopt_add_param(opt, 0, "w", p.data(), info.param_dtype, n,
                              g.data(), info.grad_dtype, &idx));
  CHECK_OK(flashopt_optimizer_attach_comm(opt, comm,
                                          FLASHOPT_REDUCE_DETERMINISTIC, 0));
  int32_t buckets = 0;
  CHECK_OK(flashopt_num_buckets(opt, &buckets));
  std::vector<unsigned char> copy(g.size());
  std::vector<double> tReduce, tStep, tCopy;
  for (int r = 0; r < reps + 1; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    for (int32_t b = 0; b < buckets; ++b)
      CHECK_OK(flashopt_reduce_bucket(opt, b));
    double t1 = now();
    CHECK_OK(flashopt_step(opt)); // every bucket reduced: the step alone
    double t2 = now();
    std::memcpy(copy.data(), g.data(), g.size());
    double t3 = now();
    if (r == 0)
      continue; // warm-up
    tReduce.push_back(t1 - t0);
    tStep.push_back(t2 - t1);
    tCopy.push_back(t3 - t2);
  }
  if (rank == 0) {
    double mr = median(tReduce) * 1e3, ms = median(tStep) * 1e3,
           mc = median(tCopy) * 1e3;
    std::printf("flashopt-dist-bench: %s, %lld params per rank, %d ranks, %d "
                "buckets, median of %d (1 thread per rank)\n",
                spec.c_str(), (long long)n, world, buckets, reps);
    std::printf("| phase | ms | x step |\n|---|---:|---:|\n");
    std::printf("| reduce (average of the gradients) | %.2f | %.2f |\n", mr,
                mr / ms);
    std::printf("| step (fused kernel) | %.2f | 1.00 |\n", ms);
    std::printf("| memcpy of the gradient bytes | %.2f | %.2f |\n", mc,
                mc / ms);
  }
  flashopt_optimizer_destroy(opt);
  flashopt_context_destroy(ctx);
  flashopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
