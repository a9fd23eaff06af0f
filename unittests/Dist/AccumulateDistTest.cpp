//===- AccumulateDistTest.cpp - Accumulation x data parallelism, MPI ------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Run under mpirun (ctest registers -np 2 and 3) over the accumulation
/// bundles of unittests/CApi/Inputs/accumulate (<build>/kernels-accumulate):
/// every rank accumulates N micro-batches of its own and steps, with an
/// MPI communicator attached, replicated and sharded (ZeRO-1), and checks
///  - W ranks x N micro-batches equal, bit for bit, one process on the
///    concatenated batch accumulated in the same order: each rank's
///    micro-batches summed through the accumulator encoding, the W sums
///    added in rank order in f32, encoded once more, stepped with
///    grad_scale 1/(N * W) by the same optimizer reading f32 gradients
///    (SGD + momentum with an f32 accumulator, AdamW-24 with f32, bf16 + i8
///    and bf16 accumulators, Lion-24 with bf16 + i8); parameters and fp32
///    masters after every step, tensor sizes 1, 31, 33, 65, 100, 4097
///    (divisible neither by W nor by 32, some smaller than W x 32: ranks that
///    own nothing of them), several buckets;
///  - replicas bit-identical after every step, sharded == replicated, also
///    in fast mode (replicas only);
///  - a NaN in one micro-batch of one rank: every rank skips, nothing
///    changes, no counter advances, the accumulator is zeroed (the next step
///    equals the reference without those micro-batches);
///  - clipping: the norm of the reduced accumulated gradient, the same on
///    every rank and equal to the reference's, parameters bit for bit;
///  - misuse: a spec without an accumulator asked to accumulate is
///    FLASHOPT_ERROR_UNSUPPORTED on every rank, naming "accumulator"; ranks
///    with different numbers of micro-batches are FLASHOPT_ERROR_MISMATCH on
///    every rank within seconds (nothing changes); flashopt_reduce_bucket
///    while accumulating and gradient release are refused.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt_mpi.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "DistTestSupport.h"

namespace {

const std::vector<int64_t> kSizes = {1, 31, 33, 65, 100, 4097};

enum class Acc { F32, BF16I8, BF16 };
enum class Mode { Replicated, Sharded };

const char *modeName(Mode m) {
  return m == Mode::Sharded ? "sharded" : "replicated";
}

/// decode(encode(x)) through accumulator encoding `acc`.
float roundTrip(float x, Acc acc) {
  if (acc == Acc::F32)
    return x;
  if (acc == Acc::BF16)
    return flashopt::host::bf16_to_f32(flashopt::host::f32_to_bf16(x));
  // The library's master codec (the test links libflashopt, whose
  // internals are hidden: its C ABI).
  uint16_t hi;
  int8_t lo;
  flashopt_encode_master_f32(&x, 1, FLASHOPT_BF16, &hi, FLASHOPT_I8, &lo);
  float y;
  flashopt_decode_master_f32(FLASHOPT_BF16, &hi, FLASHOPT_I8, &lo, 1, &y);
  return y;
}

/// Rank r's micro-batch k of step s.
std::vector<Tensor> microBatch(flashopt_dtype d, int r, int s, int k) {
  return randomTensors(d, kSizes,
                       7919u * uint64_t(r + 1) + 104729u * uint64_t(s) +
                           15485863u * uint64_t(k),
                       0.01f * (1.0f + 0.5f * float(r)));
}

struct Opt : DistOpt {
  Opt(const std::string &bundle, uint64_t seed, const Hypers &hypers)
      : DistOpt(kernels + "/" + bundle, kSizes, seed, hypers) {}
  std::vector<float> master(size_t i) {
    std::vector<float> m(size_t(params[i].n));
    OK(flashopt_export_master_f32(opt, int64_t(i), m.data(), params[i].n));
    return m;
  }
};

/// The reference's gradient of step s: per rank, its N micro-batches summed
/// through the encoding (acc = encode(decode(acc) + g) from 0), the W sums
/// added in rank order in f32, encoded once more (what the reduction writes
/// back into the accumulator).
std::vector<Tensor> referenceGrad(flashopt_dtype gdt, Acc acc, int N, int s) {
  std::vector<Tensor> out;
  for (int64_t n : kSizes)
    out.emplace_back(FLASHOPT_F32, n);
  std::vector<std::vector<float>> total;
  for (int r = 0; r < world; ++r) {
    std::vector<std::vector<float>> sum;
    for (int64_t n : kSizes)
      sum.emplace_back(static_cast<size_t>(n), 0.0f);
    for (int k = 0; k < N; ++k) {
      std::vector<Tensor> g = microBatch(gdt, r, s, k);
      for (size_t i = 0; i < kSizes.size(); ++i)
        for (int64_t e = 0; e < kSizes[i]; ++e)
          sum[i][size_t(e)] = roundTrip(sum[i][size_t(e)] + g[i].get(e), acc);
    }
    if (r == 0) {
      total = sum;
      continue;
    }
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (int64_t e = 0; e < kSizes[i]; ++e)
        total[i][size_t(e)] = total[i][size_t(e)] + sum[i][size_t(e)];
  }
  for (size_t i = 0; i < kSizes.size(); ++i)
    for (int64_t e = 0; e < kSizes[i]; ++e)
      out[i].set(e, roundTrip(total[i][size_t(e)], acc));
  return out;
}

/// Accumulates rank `rank`'s N micro-batches of step s into `o` and steps
/// (the last one through flashopt_step). `nanAt`: micro-batch k that gets a
/// NaN on the last rank (-1: none).
void trainStep(Opt &o, int N, int s, int nanAt = -1) {
  for (int k = 0; k < N; ++k) {
    std::vector<Tensor> g = microBatch(o.gdt, rank, s, k);
    if (k == nanAt && rank == world - 1)
      g[4].set(17, NAN);
    o.setGrads(g);
    OK(k + 1 < N ? flashopt_accumulate(o.opt) : flashopt_step(o.opt));
  }
}

struct Case {
  const char *bundle, *ref;
  Acc acc;
  Hypers hypers;
  int N;
};

/// Replicated and sharded, against the single-process reference, step by
/// step; with `maxGradNorm`, clipped.
void equalsReference(flashopt_comm comm, const Case &c,
                     flashopt_reduce_mode reduce, double maxGradNorm = 0.0) {
  const bool det = reduce == FLASHOPT_REDUCE_DETERMINISTIC;
  std::string what = std::string(c.bundle) + " N=" + std::to_string(c.N) +
                     (det ? "" : " (fast)") +
                     (maxGradNorm > 0 ? " (clipped)" : "");
  // Different initial values on every rank: attach copies rank 0's.
  Opt rep(c.bundle, 11 + uint64_t(rank), c.hypers);
  Opt sh(c.bundle, 11 + uint64_t(rank), c.hypers);
  Opt ref(c.ref, 11, c.hypers);
  OK(flashopt_optimizer_attach_comm(rep.opt, comm, reduce, 256));
  OK(flashopt_optimizer_attach_comm_sharded(sh.opt, comm, reduce, 256));
  int32_t buckets = 0;
  OK(flashopt_num_buckets(rep.opt, &buckets));
  EXPECT(buckets > 1, what + ": several buckets");
  OK(flashopt_set_hyper(ref.opt, -1, "grad_scale",
                        double(float(1.0 / (double(c.N) * world)))));
  if (maxGradNorm > 0)
    for (Opt *o : {&rep, &sh, &ref})
      OK(flashopt_set_max_grad_norm(o->opt, maxGradNorm));
  for (int s = 1; s <= 3; ++s) {
    trainStep(rep, c.N, s);
    trainStep(sh, c.N, s);
    std::string at = what + ", step " + std::to_string(s);
    const uint64_t hr = rep.hash(), hs = sh.hash();
    EXPECT(sameEverywhere(hr), at + ": replicated replicas identical");
    EXPECT(sameEverywhere(hs), at + ": sharded replicas identical");
    for (Opt *o : {&rep, &sh}) {
      int64_t pending = -1, st = -1;
      OK(flashopt_get_accumulated(o->opt, 0, &pending));
      EXPECT(pending == 0, at + ": the accumulation ended");
      OK(flashopt_get_step(o->opt, -1, &st));
      EXPECT(st == s, at + ": the step counter");
    }
    if (!det)
      continue;
    EXPECT(hs == hr, at + ": sharded == replicated");
    ref.setGrads(referenceGrad(rep.gdt, c.acc, c.N, s));
    OK(flashopt_step(ref.opt));
    for (size_t i = 0; i < kSizes.size(); ++i)
      EXPECT(rep.params[i].bytes == ref.params[i].bytes,
             at + ": param " + std::to_string(i) + " == the reference");
    EXPECT(hr == ref.hash(), at + ": masters == the reference");
    if (maxGradNorm > 0) {
      double a = -1, b = -2, r = -3;
      OK(flashopt_get_grad_norm(rep.opt, &a));
      OK(flashopt_get_grad_norm(sh.opt, &b));
      OK(flashopt_get_grad_norm(ref.opt, &r));
      uint64_t bits;
      std::memcpy(&bits, &a, 8);
      EXPECT(sameEverywhere(bits), at + ": the norm on every rank");
      EXPECT(a == r && b == r,
             at + ": the norm == the reference's (" + std::to_string(a) + ", " +
                 std::to_string(b) + ", " + std::to_string(r) + ")");
      EXPECT(r > maxGradNorm, at + ": clipped");
    }
  }
}

/// A NaN in micro-batch 1 of 3 on the last rank, at step 2: every rank
/// skips in both modes; then step 3 equals the reference that never saw
/// step 2.
void nanSkipsEverywhere(flashopt_comm comm, Mode mode) {
  const Case c{"adamw_m24_acc_bf16_i8",
               "adamw_m24_gradf32",
               Acc::BF16I8,
               {{"lr", 1e-2}, {"weight_decay", 0.1}},
               3};
  std::string what = std::string("NaN on one rank, ") + modeName(mode);
  Opt dp(c.bundle, 11 + uint64_t(rank), c.hypers), ref(c.ref, 11, c.hypers);
  if (mode == Mode::Sharded)
    OK(flashopt_optimizer_attach_comm_sharded(
        dp.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 256));
  else
    OK(flashopt_optimizer_attach_comm(dp.opt, comm,
                                      FLASHOPT_REDUCE_DETERMINISTIC, 256));
  OK(flashopt_set_nonfinite_policy(dp.opt, FLASHOPT_NONFINITE_SKIP));
  OK(flashopt_set_hyper(ref.opt, -1, "grad_scale",
                        double(float(1.0 / (double(c.N) * world)))));
  trainStep(dp, c.N, 1);
  ref.setGrads(referenceGrad(dp.gdt, c.acc, c.N, 1));
  OK(flashopt_step(ref.opt));
  const uint64_t before = dp.hash();
  trainStep(dp, c.N, 2, /*nanAt=*/1);
  int64_t skipped = -1, st = -1, pending = -1;
  OK(flashopt_get_skipped_steps(dp.opt, &skipped));
  OK(flashopt_get_step(dp.opt, -1, &st));
  OK(flashopt_get_accumulated(dp.opt, 0, &pending));
  EXPECT(skipped == 1, what + ": skipped on every rank");
  EXPECT(st == 1, what + ": the step counter did not advance");
  EXPECT(pending == 0, what + ": the accumulation was dropped");
  EXPECT(dp.hash() == before, what + ": nothing changed");
  trainStep(dp, c.N, 3);
  ref.setGrads(referenceGrad(dp.gdt, c.acc, c.N, 3));
  OK(flashopt_step(ref.opt));
  EXPECT(dp.hash() == ref.hash(),
         what + ": the next step == the reference without step 2 (the "
                "accumulator was zeroed)");
  OK(flashopt_get_step(dp.opt, -1, &st));
  EXPECT(st == 2, what + ": counted again");
}

void misuseIsRefused(flashopt_comm comm) {
  // A spec without an accumulator: every rank refuses alone (no collective).
  {
    Opt o("adamw_m24_gradf32", 11, {{"lr", 1e-2}});
    OK(flashopt_optimizer_attach_comm(o.opt, comm,
                                      FLASHOPT_REDUCE_DETERMINISTIC, 256));
    flashopt_status s = flashopt_accumulate(o.opt);
    std::string msg = flashopt_last_error();
    EXPECT(s == FLASHOPT_ERROR_UNSUPPORTED, "no accumulator: UNSUPPORTED");
    EXPECT(msg.find("has no gradient accumulator") != std::string::npos &&
               msg.find("\"accumulator\"") != std::string::npos,
           "the message names the spec key: " + msg);
    // Nothing is left half-done: an ordinary step still works everywhere.
    o.setGrads(microBatch(o.gdt, rank, 1, 0));
    OK(flashopt_step(o.opt));
  }
  Opt o("sgd_f32_acc_f32", 11, {});
  OK(flashopt_optimizer_attach_comm(o.opt, comm, FLASHOPT_REDUCE_DETERMINISTIC,
                                    256));
  o.setGrads(microBatch(o.gdt, rank, 1, 0));
  OK(flashopt_accumulate(o.opt));
  EXPECT(flashopt_reduce_bucket(o.opt, 0) == FLASHOPT_ERROR_STATE,
         "reducing a bucket while accumulating");
  EXPECT(flashopt_step_param(o.opt, 0) == FLASHOPT_ERROR_STATE,
         "gradient release while accumulating");
  if (world < 2)
    return;
  // Rank 1 accumulates one more micro-batch than the others.
  if (rank == 1)
    OK(flashopt_accumulate(o.opt));
  const uint64_t before = o.hash();
  auto t0 = std::chrono::steady_clock::now();
  flashopt_status s = flashopt_step(o.opt);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  std::string msg = flashopt_last_error();
  EXPECT(s == FLASHOPT_ERROR_MISMATCH, "different micro-batch counts");
  EXPECT(msg.find("accumulated micro-batches") != std::string::npos &&
             msg.find("rank 1") != std::string::npos,
         "the message names the rank and what differs: " + msg);
  EXPECT(seconds < 10.0, "no hang");
  EXPECT(o.hash() == before, "nothing changed");
  int64_t st = -1;
  OK(flashopt_get_step(o.opt, -1, &st));
  EXPECT(st == 0, "no step counted");
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np N AccumulateDistTests "
                         "<build>/kernels-accumulate\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  kernels = argv[1];
  flashopt_comm comm = nullptr;
  OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));

  const auto det = FLASHOPT_REDUCE_DETERMINISTIC;
  const Hypers adamw = {{"lr", 1e-2}, {"weight_decay", 0.1}};
  const Case sgd{
      "sgd_f32_acc_f32", "sgd_f32_acc_f32", Acc::F32, {{"lr", 0.1}}, 3};
  equalsReference(comm, sgd, det);
  equalsReference(comm, {sgd.bundle, sgd.ref, sgd.acc, sgd.hypers, 2}, det);
  equalsReference(
      comm, {"adamw_m24_acc_f32", "adamw_m24_gradf32", Acc::F32, adamw, 2},
      det);
  equalsReference(
      comm,
      {"adamw_m24_acc_bf16_i8", "adamw_m24_gradf32", Acc::BF16I8, adamw, 4},
      det);
  equalsReference(
      comm, {"adamw_m24_acc_bf16", "adamw_m24_gradf32", Acc::BF16, adamw, 3},
      det);
  equalsReference(comm,
                  {"lion_bf16_acc_bf16_i8",
                   "lion_bf16_gradf32",
                   Acc::BF16I8,
                   {{"lr", 1e-3}},
                   3},
                  det);
  equalsReference(
      comm, {"adamw_m24_acc_f32", "adamw_m24_gradf32", Acc::F32, adamw, 2},
      FLASHOPT_REDUCE_FAST);
  equalsReference(comm, sgd, det, /*maxGradNorm=*/1e-3);
  equalsReference(
      comm,
      {"adamw_m24_acc_bf16_i8", "adamw_m24_gradf32", Acc::BF16I8, adamw, 3},
      det, /*maxGradNorm=*/1e-3);
  nanSkipsEverywhere(comm, Mode::Replicated);
  nanSkipsEverywhere(comm, Mode::Sharded);
  misuseIsRefused(comm);

  OK(flashopt_comm_destroy(comm));
  int total = 0, totalChecks = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&checks, &totalChecks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("AccumulateDistTests at %d ranks: %d checks, %d failed\n",
                world, totalChecks, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
