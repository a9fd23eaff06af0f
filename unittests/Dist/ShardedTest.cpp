//===- ShardedTest.cpp - Sharded data parallelism over real MPI ranks -----===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Run under mpirun (ctest registers -np 2 and 3): sharded data parallelism
/// (ZeRO-1, flashopt_optimizer_attach_comm_sharded) checked against
/// replicated mode on the same ranks and gradients:
///  - sharded == replicated bit for bit (parameters and fp32 masters) after
///    every step, deterministic reduction, SGD, SGD + momentum, AdamW-24,
///    Lion-24; tensor sizes 1, 31, 33, 65, 100, 4097 (divisible neither by W
///    nor by 32, some smaller than W x 32: ranks that own nothing of them);
///    several buckets, one reduced early; replicas identical in fast mode;
///  - clipping under sharding: the same norm and parameters as replicated;
///  - a NaN on one rank: every rank skips, nothing changes;
///  - the memory report: the ranks' correction + state bytes sum to the
///    replicated (single-process) bytes, each rank holds less;
///  - checkpoints: saved sharded at 2 ranks is byte-identical to the file a
///    replicated run writes; loaded at 1, 2 and 3 ranks it continues bit for
///    bit like a single process that loads it and averages the same
///    gradients in rank order;
///  - a rank attaching sharded while another attaches replicated is
///    FLASHOPT_ERROR_MISMATCH on every rank within seconds; gradient release
///    is refused.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"
#include "flashopt/host/Float16.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace flashopt::host;

#include "DistTestSupport.h"

namespace {

const std::vector<int64_t> kSizes = {1, 31, 33, 65, 100, 4097};

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

void shardedEqualsReplicated(flashopt_comm comm, const std::string &spec,
                             const Hypers &hypers, flashopt_reduce_mode mode,
                             double maxGradNorm = 0.0) {
  std::string what = spec + (mode == FLASHOPT_REDUCE_FAST ? " (fast)" : "") +
                     (maxGradNorm > 0 ? " (clipped)" : "");
  // Different initial values on every rank: attach copies rank 0's.
  Opt rep(spec, 11 + uint64_t(rank), hypers);
  Opt sh(spec, 11 + uint64_t(rank), hypers);
  OK(flashopt_optimizer_attach_comm(rep.opt, comm, mode, 256));
  OK(flashopt_optimizer_attach_comm_sharded(sh.opt, comm, mode, 256));
  int32_t buckets = 0;
  OK(flashopt_num_buckets(sh.opt, &buckets));
  EXPECT(buckets > 1, what + ": several buckets");
  if (maxGradNorm > 0) {
    OK(flashopt_set_max_grad_norm(rep.opt, maxGradNorm));
    OK(flashopt_set_max_grad_norm(sh.opt, maxGradNorm));
  }
  EXPECT(rep.hash() == sh.hash(), what + ": the same start");
  for (int k = 1; k <= 4; ++k) {
    std::vector<Tensor> g = gradsOf(rep.gdt, rank, k);
    rep.setGrads(g);
    sh.setGrads(g);
    if (k == 2) {
      OK(flashopt_reduce_bucket(rep.opt, 0));
      OK(flashopt_reduce_bucket(sh.opt, 0));
    }
    OK(flashopt_step(rep.opt));
    OK(flashopt_step(sh.opt));
    std::string at = what + ", step " + std::to_string(k);
    uint64_t hs = sh.hash();
    EXPECT(sameEverywhere(hs), at + ": sharded replicas identical");
    if (mode != FLASHOPT_REDUCE_DETERMINISTIC)
      continue;
    for (size_t i = 0; i < kSizes.size(); ++i)
      EXPECT(sh.params[i].bytes == rep.params[i].bytes,
             at + ": param " + std::to_string(i) + " sharded == replicated");
    EXPECT(hs == rep.hash(), at + ": masters sharded == replicated");
    if (maxGradNorm > 0) {
      double a = -1, b = -2;
      OK(flashopt_get_grad_norm(sh.opt, &a));
      OK(flashopt_get_grad_norm(rep.opt, &b));
      EXPECT(a == b && a > maxGradNorm, at + ": the same norm, and it clipped");
    }
  }
}

void nanSkipsEverywhere(flashopt_comm comm) {
  Opt sh("adamw_bf16_m24", 5, {{"lr", 1e-2}});
  OK(flashopt_set_nonfinite_policy(sh.opt, FLASHOPT_NONFINITE_SKIP));
  OK(flashopt_optimizer_attach_comm_sharded(sh.opt, comm,
                                            FLASHOPT_REDUCE_DETERMINISTIC, 0));
  sh.setGrads(gradsOf(sh.gdt, rank, 1));
  OK(flashopt_step(sh.opt));
  uint64_t before = sh.hash();
  sh.setGrads(gradsOf(sh.gdt, rank, 2));
  if (rank == world - 1)
    sh.grads[4].set(7, std::nanf(""));
  OK(flashopt_step(sh.opt));
  int64_t skipped = -1, steps = -1;
  OK(flashopt_get_skipped_steps(sh.opt, &skipped));
  OK(flashopt_get_step(sh.opt, -1, &steps));
  EXPECT(skipped == 1, "sharded: every rank skipped the step");
  EXPECT(steps == 1, "sharded: no step counter advanced");
  EXPECT(sh.hash() == before, "sharded: nothing changed");
  // And the next finite step runs everywhere.
  sh.setGrads(gradsOf(sh.gdt, rank, 3));
  OK(flashopt_step(sh.opt));
  EXPECT(sh.hash() != before && sameEverywhere(sh.hash()),
         "sharded: stepping again after the skip");
}

void memoryIsSharded(flashopt_comm comm) {
  Opt rep("adamw_bf16_m24", 5, {});
  Opt sh("adamw_bf16_m24", 5, {});
  flashopt_memory_report full{}, mine{};
  OK(flashopt_memory_report_get(rep.opt, &full));
  OK(flashopt_optimizer_attach_comm_sharded(sh.opt, comm,
                                            FLASHOPT_REDUCE_DETERMINISTIC, 0));
  OK(flashopt_memory_report_get(sh.opt, &mine));
  int64_t held[2] = {mine.correction_bytes, mine.state_bytes}, sum[2] = {};
  MPI_Allreduce(held, sum, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT(sum[0] == full.correction_bytes && sum[1] == full.state_bytes,
         "the shards' correction and state bytes add up to the whole");
  EXPECT(mine.correction_bytes < full.correction_bytes &&
             mine.state_bytes < full.state_bytes,
         "each rank holds less than the whole");
  EXPECT(mine.param_bytes == full.param_bytes &&
             mine.grad_bytes == full.grad_bytes,
         "parameters and gradients stay whole");
  EXPECT(mine.total_bytes == mine.param_bytes + mine.grad_bytes +
                                 mine.correction_bytes + mine.state_bytes,
         "the total adds up");
}

void misuseIsRefused(flashopt_comm comm) {
  Opt sh("sgd_bf16_m24", 3, {{"momentum", 0.9}});
  OK(flashopt_optimizer_attach_comm_sharded(sh.opt, comm,
                                            FLASHOPT_REDUCE_DETERMINISTIC, 0));
  EXPECT(flashopt_step_param(sh.opt, 0) == FLASHOPT_ERROR_STATE,
         "gradient release with sharded data parallelism");
  EXPECT(std::string(flashopt_last_error()).find("sharded") !=
             std::string::npos,
         "the message says sharded");
  EXPECT(flashopt_optimizer_attach_comm(sh.opt, comm,
                                        FLASHOPT_REDUCE_DETERMINISTIC,
                                        0) == FLASHOPT_ERROR_STATE,
         "a second attach");
}

void modeMismatchFailsEverywhere(flashopt_comm comm) {
  Opt o("sgd_f32", 3, {});
  double t0 = MPI_Wtime();
  flashopt_status s = rank == 1
                          ? flashopt_optimizer_attach_comm_sharded(
                                o.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0)
                          : flashopt_optimizer_attach_comm(
                                o.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
  double seconds = MPI_Wtime() - t0;
  std::string msg = flashopt_last_error();
  EXPECT(s == FLASHOPT_ERROR_MISMATCH, "sharded on one rank only");
  EXPECT(msg.find("rank 1 has 'sharded, reduce deterministic") !=
             std::string::npos,
         "the message names the rank and the mode: " + msg);
  EXPECT(seconds < 10.0, "no hang");
}

/// Steps `o` with the rank-order average of ranks [0, W)'s gradients of
/// step k (a single-process reference of a W-rank deterministic step).
void stepReference(Opt &o, int W, int k) {
  std::vector<std::vector<Tensor>> all;
  for (int r = 0; r < W; ++r)
    all.push_back(gradsOf(o.gdt, r, k));
  for (size_t i = 0; i < kSizes.size(); ++i)
    for (int64_t e = 0; e < kSizes[i]; ++e) {
      float s = all[0][i].get(e);
      for (int r = 1; r < W; ++r)
        s = s + all[size_t(r)][i].get(e);
      o.grads[i].set(e, s / float(W));
    }
  OK(flashopt_step(o.opt));
}

/// Trains sharded on ranks {0, 1}, saves, and resumes at 1 rank (every rank
/// on its own), at 2 ranks (load after attaching) and, at -np 3, at 3 ranks.
void checkpointsReshard(flashopt_comm world2, const std::string &spec,
                        const Hypers &hypers) {
  const std::string dir =
      "/tmp/flashopt-sharded-test-" + std::to_string(getppid());
  const std::string path = dir + "-" + spec + ".safetensors";
  const std::string repPath = dir + "-" + spec + "-rep.safetensors";
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
  if (rank < 2) {
    flashopt_comm c2 = nullptr;
    OK(flashopt_comm_create_mpi(pair, &c2));
    Opt sh(spec, 11, hypers), rep(spec, 11, hypers);
    OK(flashopt_optimizer_attach_comm_sharded(
        sh.opt, c2, FLASHOPT_REDUCE_DETERMINISTIC, 256));
    OK(flashopt_optimizer_attach_comm(rep.opt, c2,
                                      FLASHOPT_REDUCE_DETERMINISTIC, 256));
    for (int k = 1; k <= 3; ++k) {
      sh.setGrads(gradsOf(sh.gdt, rank, k));
      rep.setGrads(gradsOf(rep.gdt, rank, k));
      OK(flashopt_step(sh.opt));
      OK(flashopt_step(rep.opt));
    }
    OK(flashopt_save_checkpoint(sh.opt, path.c_str(),
                                FLASHOPT_CHECKPOINT_COMPRESSED));
    if (rank == 0)
      OK(flashopt_save_checkpoint(rep.opt, repPath.c_str(),
                                  FLASHOPT_CHECKPOINT_COMPRESSED));
    OK(flashopt_comm_destroy(c2));
    MPI_Comm_free(&pair);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT(!fileBytes(path).empty() && fileBytes(path) == fileBytes(repPath),
         spec + ": the sharded checkpoint is the replicated (single-process) "
                "file, byte for byte");
  // Every continuation is compared with a single process that loads the
  // file and averages the same ranks' gradients in rank order.
  auto resume = [&](int W, flashopt_comm c, bool loadFirst) {
    std::string what = spec + ": saved at 2, resumed at " + std::to_string(W);
    Opt ref(spec, 99, {}), sh(spec, 1234 + uint64_t(rank), {});
    OK(flashopt_load_checkpoint(ref.opt, path.c_str()));
    if (c && loadFirst)
      OK(flashopt_load_checkpoint(sh.opt, path.c_str()));
    if (c)
      OK(flashopt_optimizer_attach_comm_sharded(
          sh.opt, c, FLASHOPT_REDUCE_DETERMINISTIC, 256));
    if (!loadFirst || !c)
      OK(flashopt_load_checkpoint(sh.opt, path.c_str()));
    int64_t steps = -1;
    OK(flashopt_get_step(sh.opt, -1, &steps));
    EXPECT(steps == 3, what + ": the step counter");
    for (int k = 4; k <= 6; ++k) {
      sh.setGrads(gradsOf(sh.gdt, c ? rank : 0, k));
      OK(flashopt_step(sh.opt));
      stepReference(ref, W, k);
      for (size_t i = 0; i < kSizes.size(); ++i)
        EXPECT(sh.params[i].bytes == ref.params[i].bytes,
               what + ": param " + std::to_string(i) + ", step " +
                   std::to_string(k));
      EXPECT(sh.hash() == ref.hash(),
             what + ": masters, step " + std::to_string(k));
    }
  };
  resume(1, nullptr, false);
  if (world == 2)
    resume(2, world2, /*loadFirst=*/false);
  if (world == 3)
    resume(3, world2, /*loadFirst=*/true);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::remove(path.c_str());
    std::remove(repPath.c_str());
  }
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np N ShardedTests <build>/kernels\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  kernels = argv[1];
  flashopt_comm comm = nullptr;
  OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));

  const auto det = FLASHOPT_REDUCE_DETERMINISTIC;
  shardedEqualsReplicated(comm, "sgd_f32", {}, det);
  shardedEqualsReplicated(comm, "sgd_bf16_m24", {{"momentum", 0.9}}, det);
  shardedEqualsReplicated(comm, "adamw_bf16_m24",
                          {{"lr", 1e-2}, {"weight_decay", 0.1}}, det);
  shardedEqualsReplicated(comm, "lion_bf16_m24", {{"lr", 1e-3}}, det);
  shardedEqualsReplicated(comm, "adamw_bf16_m24", {{"lr", 1e-2}},
                          FLASHOPT_REDUCE_FAST);
  shardedEqualsReplicated(comm, "sgd_bf16_m24", {{"momentum", 0.9}}, det,
                          /*maxGradNorm=*/1.0);
  nanSkipsEverywhere(comm);
  memoryIsSharded(comm);
  misuseIsRefused(comm);
  if (world > 1) {
    modeMismatchFailsEverywhere(comm);
    checkpointsReshard(comm, "adamw_bf16_m24", {{"lr", 1e-2}});
    checkpointsReshard(comm, "lion_bf16_m24", {{"lr", 1e-3}});
  }

  OK(flashopt_comm_destroy(comm));
  int total = 0, totalChecks = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &totalChecks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("ShardedTests at %d ranks: %d checks, %d failed\n", world,
                totalChecks, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
