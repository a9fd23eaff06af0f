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
/// printing each as ms and as a ratio to the step, for replicated and for
/// sharded (ZeRO-1) mode, and rank 0's memory report in both.
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
  struct Result {
    double reduce, step, copy;
    int32_t buckets;
    flashopt_memory_report mem;
  };
  // One run per mode, each with its own optimizer.
  auto run = [&](bool sharded) {
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
    if (sharded)
      CHECK_OK(flashopt_optimizer_attach_comm_sharded(
          opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0));
    else
      CHECK_OK(flashopt_optimizer_attach_comm(
          opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0));
    Result res{};
    CHECK_OK(flashopt_num_buckets(opt, &res.buckets));
    CHECK_OK(flashopt_memory_report_get(opt, &res.mem));
    std::vector<unsigned char> copy(g.size());
    std::vector<double> tReduce, tStep, tCopy;
    for (int r = 0; r < reps + 1; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now();
      for (int32_t b = 0; b < res.buckets; ++b)
        CHECK_OK(flashopt_reduce_bucket(opt, b));
      double t1 = now();
      // Every bucket reduced: the step alone (sharded: the owners' step
      // and the all-gather of the parameters).
      CHECK_OK(flashopt_step(opt));
      double t2 = now();
      std::memcpy(copy.data(), g.data(), g.size());
      double t3 = now();
      if (r == 0)
        continue; // warm-up
      tReduce.push_back(t1 - t0);
      tStep.push_back(t2 - t1);
      tCopy.push_back(t3 - t2);
    }
    res.reduce = median(tReduce) * 1e3;
    res.step = median(tStep) * 1e3;
    res.copy = median(tCopy) * 1e3;
    flashopt_optimizer_destroy(opt);
    flashopt_context_destroy(ctx);
    return res;
  };
  Result rep = run(false), sh = run(true);
  if (rank == 0) {
    std::printf("flashopt-dist-bench: %s, %lld params per rank, %d ranks, %d "
                "buckets, median of %d (1 thread per rank)\n",
                spec.c_str(), (long long)n, world, rep.buckets, reps);
    std::printf("| phase | replicated ms | x step | sharded ms | x "
                "replicated step |\n|---|---:|---:|---:|---:|\n");
    std::printf("| reduce (average of the gradients) | %.2f | %.2f | %.2f | "
                "%.2f |\n",
                rep.reduce, rep.reduce / rep.step, sh.reduce,
                sh.reduce / rep.step);
    std::printf("| step (fused kernel; sharded: + parameter all-gather) | "
                "%.2f | 1.00 | %.2f | %.2f |\n",
                rep.step, sh.step, sh.step / rep.step);
    std::printf("| memcpy of the gradient bytes | %.2f | %.2f | %.2f | %.2f "
                "|\n",
                rep.copy, rep.copy / rep.step, sh.copy, sh.copy / rep.step);
    std::printf("rank 0 memory report, B/param without gradient (param + "
                "correction + states): replicated %.4f, sharded %.4f; "
                "allocated by the runtime: replicated %lld B, sharded %lld "
                "B\n",
                rep.mem.bytes_per_param_with_grad_release,
                sh.mem.bytes_per_param_with_grad_release,
                (long long)rep.mem.allocated_bytes,
                (long long)sh.mem.allocated_bytes);
  }
  flashopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
