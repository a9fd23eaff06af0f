//===- DataParallelTest.cpp - Data parallelism over real MPI ranks
//----------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Run under mpirun (ctest registers -np 1, 2 and 3): every rank trains the
/// same parameters on its own gradients through flashopt_step with an MPI
/// communicator attached, and checks
///  - replicas bit-identical after every step (hashes all-gathered), in
///    both reduce modes, starting from different initial values (rank 0's
///    are copied to all);
///  - deterministic mode bit-identical to one process that averages the
///    same gradients in rank order in fp32 (SGD, SGD + momentum, AdamW-24,
///    Lion-24; sizes 1, 31, 33, 100, 4097: divisible neither by W nor by
///    32, some smaller than W x 32; several buckets, one reduced early);
///  - gradient-norm clipping: the same global norm on every rank, equal to
///    the reference's;
///  - a NaN on one rank skips the step on every rank (SKIP policy);
///  - a layout that differs on one rank is FLASHOPT_ERROR_MISMATCH on every
///    rank, naming the rank and the line, and so are a step whose
///    hyper-parameters or NaN policy differ on one rank; registering,
///    gradient release and a second attach afterwards are refused.
/// Failures are counted per rank and summed, so every rank exits with the
/// same status.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"
#include "flashopt/host/Float16.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace flashopt::host;

#include "DistTestSupport.h"

namespace {

const std::vector<int64_t> kSizes = {1, 31, 33, 100, 4097};

/// Rank r's gradients at step k.
std::vector<Tensor> gradsOf(flashopt_dtype d, int r, int k) {
  return randomTensors(d, kSizes,
                       7919u * uint64_t(r + 1) + 104729u * uint64_t(k),
                       0.5f + 0.25f * float(r));
}

struct Opt : DistOpt {
  Opt(const std::string &spec, uint64_t seed, const Hypers &hypers)
      : DistOpt(kernels + "/" + spec, kSizes, seed, hypers) {}
};

void replicatedEqualsReference(
    flashopt_comm comm, const std::string &spec,
    const std::vector<std::pair<const char *, double>> &hypers,
    flashopt_reduce_mode mode, double maxGradNorm = 0.0) {
  std::string what = spec + (mode == FLASHOPT_REDUCE_FAST ? " (fast)" : "") +
                     (maxGradNorm > 0 ? " (clipped)" : "");
  // Different initial values on every rank: attach copies rank 0's.
  Opt dp(spec, 11 + uint64_t(rank), hypers);
  OK(flashopt_optimizer_attach_comm(dp.opt, comm, mode, /*bucket_bytes=*/256));
  int32_t buckets = 0;
  OK(flashopt_num_buckets(dp.opt, &buckets));
  EXPECT(buckets > 1, what + ": several buckets");
  EXPECT(sameEverywhere(dp.hash()), what + ": rank 0's state everywhere");
  // One process with rank 0's initial values and the rank-order average.
  Opt ref(spec, 11, hypers);
  if (maxGradNorm > 0) {
    OK(flashopt_set_max_grad_norm(dp.opt, maxGradNorm));
    OK(flashopt_set_max_grad_norm(ref.opt, maxGradNorm));
  }
  EXPECT(ref.hash() == dp.hash() || rank != 0, what + ": same start");
  for (int k = 1; k <= 4; ++k) {
    std::vector<Tensor> mine = gradsOf(dp.gdt, rank, k);
    for (size_t i = 0; i < mine.size(); ++i)
      dp.grads[i].bytes = mine[i].bytes;
    if (k == 2)
      OK(flashopt_reduce_bucket(dp.opt, 0)); // early, as a backward hook would
    OK(flashopt_step(dp.opt));
    EXPECT(sameEverywhere(dp.hash()),
           what + ": replicas identical after step " + std::to_string(k));
    if (mode != FLASHOPT_REDUCE_DETERMINISTIC)
      continue;
    std::vector<std::vector<Tensor>> all;
    for (int r = 0; r < world; ++r)
      all.push_back(gradsOf(ref.gdt, r, k));
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (int64_t e = 0; e < kSizes[i]; ++e) {
        float s = all[0][i].get(e);
        for (int r = 1; r < world; ++r)
          s = s + all[size_t(r)][i].get(e);
        ref.grads[i].set(e, s / float(world));
      }
    OK(flashopt_step(ref.opt));
    for (size_t i = 0; i < kSizes.size(); ++i) {
      EXPECT(dp.grads[i].bytes == ref.grads[i].bytes,
             what + ": averaged gradient " + std::to_string(i) + ", step " +
                 std::to_string(k));
      EXPECT(dp.params[i].bytes == ref.params[i].bytes,
             what + ": param " + std::to_string(i) + " after step " +
                 std::to_string(k) + " equals the single-process reference");
    }
    EXPECT(dp.hash() == ref.hash(), what + ": masters equal the reference");
    if (maxGradNorm > 0) {
      double a = -1, b = -2;
      OK(flashopt_get_grad_norm(dp.opt, &a));
      OK(flashopt_get_grad_norm(ref.opt, &b));
      EXPECT(a == b && a > maxGradNorm,
             what + ": the same global norm on every rank, and it clipped");
      uint64_t bits;
      std::memcpy(&bits, &a, sizeof bits);
      EXPECT(sameEverywhere(bits), what + ": the norm agrees across ranks");
    }
  }
}

void nanOnOneRankSkipsEverywhere(flashopt_comm comm) {
  Opt dp("adamw_bf16_m24", 5, {});
  OK(flashopt_set_nonfinite_policy(dp.opt, FLASHOPT_NONFINITE_SKIP));
  OK(flashopt_optimizer_attach_comm(dp.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC,
                                    0));
  std::vector<Tensor> g = gradsOf(dp.gdt, rank, 1);
  for (size_t i = 0; i < g.size(); ++i)
    dp.grads[i].bytes = g[i].bytes;
  OK(flashopt_step(dp.opt));
  uint64_t before = dp.hash();
  g = gradsOf(dp.gdt, rank, 2);
  for (size_t i = 0; i < g.size(); ++i)
    dp.grads[i].bytes = g[i].bytes;
  if (rank == world - 1)
    dp.grads[3].set(7, std::nanf(""));
  OK(flashopt_step(dp.opt));
  int64_t skipped = -1, steps = -1;
  OK(flashopt_get_skipped_steps(dp.opt, &skipped));
  OK(flashopt_get_step(dp.opt, -1, &steps));
  EXPECT(skipped == 1, "every rank skipped the step");
  EXPECT(steps == 1, "no step counter advanced");
  EXPECT(dp.hash() == before, "nothing changed");
  EXPECT(sameEverywhere(dp.hash()), "replicas identical");
}

void misuseIsRefused(flashopt_comm comm) {
  Opt dp("sgd_f32", 3, {});
  OK(flashopt_optimizer_attach_comm(dp.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC,
                                    0));
  EXPECT(flashopt_optimizer_attach_comm(dp.opt, comm,
                                        FLASHOPT_REDUCE_DETERMINISTIC,
                                        0) == FLASHOPT_ERROR_STATE,
         "a second attach");
  Tensor extra(FLASHOPT_F32, 8), eg(FLASHOPT_F32, 8);
  int64_t idx = -1;
  EXPECT(flashopt_add_param(dp.opt, 0, "late", extra.data(), FLASHOPT_F32, 8,
                            eg.data(), FLASHOPT_F32,
                            &idx) == FLASHOPT_ERROR_STATE,
         "registering after attach");
  EXPECT(flashopt_step_param(dp.opt, 0) == FLASHOPT_ERROR_STATE,
         "gradient release with data parallelism");
}

void disagreementFailsEverywhere(flashopt_comm comm) {
  Opt dp("sgd_f32", 3, {});
  OK(flashopt_optimizer_attach_comm(dp.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC,
                                    0));
  std::vector<Tensor> g = gradsOf(dp.gdt, rank, 1);
  for (size_t i = 0; i < g.size(); ++i)
    dp.grads[i].bytes = g[i].bytes;
  uint64_t before = dp.hash();
  // Rank 1 forgot the learning-rate schedule: every rank refuses the step.
  if (rank == 1)
    OK(flashopt_set_hyper(dp.opt, -1, "lr", 0.25));
  EXPECT(flashopt_step(dp.opt) == FLASHOPT_ERROR_MISMATCH,
         "different hyper-parameters");
  EXPECT(std::string(flashopt_last_error())
                 .find("rank 1 differs from rank 0 "
                       "in the hyper-parameters") != std::string::npos,
         std::string("the message names the rank: ") + flashopt_last_error());
  EXPECT(dp.hash() == before, "nothing changed");
  // Back in agreement, one rank with another NaN policy: refused too.
  if (rank == 1)
    OK(flashopt_set_hyper(dp.opt, -1, "lr", 1e-3));
  if (rank == world - 1)
    OK(flashopt_set_nonfinite_policy(dp.opt, FLASHOPT_NONFINITE_SKIP));
  EXPECT(flashopt_step(dp.opt) == FLASHOPT_ERROR_MISMATCH,
         "different NaN policies");
  EXPECT(std::string(flashopt_last_error()).find("the NaN policy") !=
             std::string::npos,
         std::string("names the policy: ") + flashopt_last_error());
  OK(flashopt_set_nonfinite_policy(dp.opt, FLASHOPT_NONFINITE_SKIP));
  OK(flashopt_step(dp.opt)); // agreed again
  EXPECT(sameEverywhere(dp.hash()), "replicas identical");
}

void mismatchedLayoutFailsEverywhere(flashopt_comm comm) {
  flashopt_context ctx;
  flashopt_optimizer opt;
  OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
  OK(flashopt_optimizer_create(ctx, (kernels + "/sgd_f32").c_str(), &opt));
  // Rank 1 registers one element more.
  int64_t n = 64 + (rank == 1 ? 1 : 0);
  std::vector<float> p(size_t(n), 1.0f), g(size_t(n), 0.0f);
  int64_t idx;
  OK(flashopt_add_param(opt, 0, "w", p.data(), FLASHOPT_F32, n, g.data(),
                        FLASHOPT_F32, &idx));
  double t0 = MPI_Wtime();
  flashopt_status s = flashopt_optimizer_attach_comm(
      opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
  double seconds = MPI_Wtime() - t0;
  std::string msg = flashopt_last_error();
  EXPECT(s == FLASHOPT_ERROR_MISMATCH, "a mismatched layout");
  EXPECT(msg.find("rank 1 has 'parameter 0 'w': numel 65") != std::string::npos,
         "the message names the rank and the line: " + msg);
  EXPECT(seconds < 10.0, "no hang");
  // Still usable alone.
  OK(flashopt_step(opt));
  flashopt_optimizer_destroy(opt);
  flashopt_context_destroy(ctx);
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np N DistTests <build>/kernels\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  kernels = argv[1];
  flashopt_comm comm = nullptr;
  OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));
  int32_t r = -1, w = -1;
  OK(flashopt_comm_get_rank(comm, &r, &w));
  EXPECT(r == rank && w == world, "rank and size");

  replicatedEqualsReference(comm, "sgd_f32", {}, FLASHOPT_REDUCE_DETERMINISTIC);
  replicatedEqualsReference(comm, "sgd_bf16_m24", {{"momentum", 0.9}},
                            FLASHOPT_REDUCE_DETERMINISTIC);
  replicatedEqualsReference(comm, "adamw_bf16_m24", {{"lr", 1e-2}},
                            FLASHOPT_REDUCE_DETERMINISTIC);
  replicatedEqualsReference(comm, "lion_bf16_m24", {{"lr", 1e-3}},
                            FLASHOPT_REDUCE_DETERMINISTIC);
  replicatedEqualsReference(comm, "adamw_bf16_m24", {{"lr", 1e-2}},
                            FLASHOPT_REDUCE_FAST);
  replicatedEqualsReference(comm, "sgd_bf16_m24", {{"momentum", 0.9}},
                            FLASHOPT_REDUCE_DETERMINISTIC, /*maxGradNorm=*/1.0);
  nanOnOneRankSkipsEverywhere(comm);
  misuseIsRefused(comm);
  if (world > 1) {
    mismatchedLayoutFailsEverywhere(comm);
    disagreementFailsEverywhere(comm);
  }

  OK(flashopt_comm_destroy(comm));
  int total = 0, totalChecks = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &totalChecks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("DistTests at %d ranks: %d checks, %d failed\n", world,
                totalChecks, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
