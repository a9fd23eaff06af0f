//===- train_mlp_mpi.cpp - The demo MLP, accumulation x data parallelism --===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The demo model of train_mlp.cpp (mlp_model.h) trained with gradient
/// accumulation on W MPI ranks, over the C ABI (<flashopt/flashopt_mpi.h>):
/// every step's global batch of --batch samples is cut into --micro-batches
/// micro-batches of equal size (the same ones whatever W), rank r takes the
/// r-th contiguous run of M / W of them, adds each one's bf16 gradient (the
/// micro-batch mean) to its f32 accumulator with flashopt_accumulate, and
/// flashopt_step reduces the accumulators over the ranks and steps once
/// with 1/M. So W = 1, 2 and 3 see the same gradients bit for bit and differ
/// only in the order the M micro-batch gradients are summed in f32 (per
/// rank, then over the ranks), and the final losses agree to a tolerance
/// (docs/RUNTIME.md "Gradient accumulation with data parallelism").
///
///   mpirun -np W flashopt-train-mlp-mpi --bundle DIR [--steps 200]
///       [--micro-batches 6] [--batch 96] [--lr 0.01] [--sharded] [--seed 1]
///
/// M must be divisible by W and the batch by M. Rank 0 prints the loss
/// curve and, last, "final train loss: X" (the mean over all training
/// samples); every rank checks that its replica is bit-identical to rank
/// 0's and exits nonzero otherwise.
///
//===----------------------------------------------------------------------===//

#include <flashopt/flashopt_mpi.h>

#include "mlp_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace flashopt_examples;

struct Options {
  std::string bundle;
  int steps = 200, microBatches = 6, batch = 96, printEvery = 50;
  float lr = 0.01f;
  bool sharded = false;
  uint32_t seed = 1;
};

int rank = 0, world = 1;

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "flashopt-train-mlp-mpi (rank %d): error: %s\n", rank,
               what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

/// Checks a flashopt call.
void check(flashopt_status s, const char *call) {
  if (s != FLASHOPT_OK)
    die(std::string(call) + ": " + flashopt_last_error());
}
#define CHECK(call) check((call), #call)

bool parseArgs(int argc, char **argv, Options &o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sharded") {
      o.sharded = true;
      continue;
    }
    if (i + 1 >= argc)
      return false;
    std::string v = argv[++i];
    if (a == "--bundle")
      o.bundle = v;
    else if (a == "--steps")
      o.steps = std::atoi(v.c_str());
    else if (a == "--micro-batches")
      o.microBatches = std::atoi(v.c_str());
    else if (a == "--batch")
      o.batch = std::atoi(v.c_str());
    else if (a == "--lr")
      o.lr = float(std::atof(v.c_str()));
    else if (a == "--seed")
      o.seed = uint32_t(std::atoi(v.c_str()));
    else if (a == "--print-every")
      o.printEvery = std::atoi(v.c_str());
    else
      return false;
  }
  return !o.bundle.empty() && o.steps > 0 && o.microBatches > 0 &&
         o.batch > 0 && o.printEvery > 0 && o.lr > 0;
}

} // namespace

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  Options o;
  if (!parseArgs(argc, argv, o)) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: mpirun -np W flashopt-train-mlp-mpi --bundle DIR "
                   "[--steps N] [--micro-batches M] [--batch B] [--lr X] "
                   "[--sharded] [--seed N] [--print-every N]\n"
                   "  DIR: a bundle with an accumulator, e.g. "
                   "build/kernels-examples/adamw_bf16_m24_acc_f32\n");
    MPI_Finalize();
    return 2;
  }
  if (o.microBatches % world != 0 || o.batch % o.microBatches != 0)
    die("--micro-batches (" + std::to_string(o.microBatches) +
        ") must be divisible by the number of ranks (" + std::to_string(world) +
        ") and --batch (" + std::to_string(o.batch) + ") by --micro-batches");
  const int perRank = o.microBatches / world;
  const int microSize = o.batch / o.microBatches;

  flashopt_context ctx = nullptr;
  flashopt_optimizer opt = nullptr;
  CHECK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
  CHECK(flashopt_context_set_threads(ctx, 1));
  CHECK(flashopt_optimizer_create(ctx, o.bundle.c_str(), &opt));
  flashopt_optimizer_info info{};
  CHECK(flashopt_optimizer_get_info(opt, &info));
  const flashopt_dtype P = info.param_dtype, G = info.grad_dtype;
  CHECK(flashopt_set_hyper(opt, 0, "lr", o.lr));
  int32_t biasGroup = -1;
  CHECK(flashopt_add_param_group(opt, &biasGroup));
  CHECK(flashopt_set_hyper(opt, biasGroup, "lr", o.lr));
  CHECK(flashopt_set_hyper(opt, biasGroup, "weight_decay", 0.0));

  Data train, test;
  makeData(o.seed, train, test);
  // Every rank starts from its own initialization: attaching copies rank
  // 0's.
  std::vector<float> init = initParams(o.seed + uint32_t(rank));
  static const char *const names[4] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                       "fc2.bias"};
  std::vector<Storage> params, grads;
  for (int k = 0; k < 4; ++k) {
    const int64_t n = Layout::sizes[k];
    params.push_back(allocate(n * int64_t(flashopt_dtype_size(P))));
    grads.push_back(allocate(n * int64_t(flashopt_dtype_size(G))));
    if (!params.back() || !grads.back())
      die("out of memory");
    for (int64_t i = 0; i < n; ++i)
      store(P, params.back().get(), i, init[size_t(Layout::offsets[k] + i)]);
    int64_t index = -1;
    CHECK(flashopt_add_param(opt, Layout::isBias[k] ? biasGroup : 0, names[k],
                             params.back().get(), P, n, grads.back().get(), G,
                             &index));
  }
  flashopt_comm comm = nullptr;
  CHECK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));
  if (o.sharded)
    CHECK(flashopt_optimizer_attach_comm_sharded(
        opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0));
  else
    CHECK(flashopt_optimizer_attach_comm(opt, comm,
                                         FLASHOPT_REDUCE_DETERMINISTIC, 0));

  auto widen = [&](std::vector<float> &w) {
    w.resize(size_t(Layout::total));
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < Layout::sizes[k]; ++i)
        w[size_t(Layout::offsets[k] + i)] =
            loadAs(P, params[size_t(k)].get(), i);
  };
  if (rank == 0)
    std::printf("flashopt-train-mlp-mpi: bundle %s, %d rank%s (%s), %d "
                "micro-batches of %d samples per step (%d per rank), %d "
                "steps, lr %g\n%6s  %12s\n",
                info.name, world, world == 1 ? "" : "s",
                o.sharded ? "sharded" : "replicated", o.microBatches, microSize,
                perRank, o.steps, double(o.lr), "step", "batch loss");

  // The same global batches on every rank (one generator, same seed).
  std::mt19937 batchRng(o.seed * 7919u + 5u);
  std::uniform_int_distribution<int> pick(0, kTrain - 1);
  std::vector<int> batch(static_cast<size_t>(o.batch)),
      micro(static_cast<size_t>(microSize));
  std::vector<float> w, g;
  for (int step = 1; step <= o.steps; ++step) {
    for (int &b : batch)
      b = pick(batchRng);
    widen(w);
    double loss = 0; // this rank's micro-batches
    for (int j = 0; j < perRank; ++j) {
      const int m = rank * perRank + j; // the global micro-batch
      std::copy(batch.begin() + m * microSize,
                batch.begin() + (m + 1) * microSize, micro.begin());
      loss += lossAndGrad(w, train, micro, &g);
      for (int k = 0; k < 4; ++k)
        for (int64_t i = 0; i < Layout::sizes[k]; ++i)
          store(G, grads[size_t(k)].get(), i,
                g[size_t(Layout::offsets[k] + i)]);
      // The last micro-batch is added by the step itself, which reduces
      // the accumulators over the ranks and divides by M once.
      if (j + 1 < perRank)
        CHECK(flashopt_accumulate(opt));
    }
    CHECK(flashopt_step(opt));
    double total = 0;
    MPI_Reduce(&loss, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0 && (step == 1 || step % o.printEvery == 0))
      std::printf("%6d  %12.6f\n", step, total / o.microBatches);
  }

  // Every replica is rank 0's, bit for bit.
  std::vector<uint8_t> mine, root;
  for (int k = 0; k < 4; ++k) {
    const uint8_t *p = static_cast<const uint8_t *>(params[size_t(k)].get());
    mine.insert(mine.end(), p,
                p + Layout::sizes[k] * int64_t(flashopt_dtype_size(P)));
  }
  root = mine;
  MPI_Bcast(root.data(), int(root.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = mine == root, allSame = 0;
  MPI_Allreduce(&same, &allSame, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  widen(w);
  std::vector<int> all(static_cast<size_t>(kTrain));
  for (int i = 0; i < kTrain; ++i)
    all[size_t(i)] = i;
  const float finalLoss = lossAndGrad(w, train, all, nullptr);
  if (rank == 0) {
    std::printf("replicas bit-identical: %s\n", allSame ? "yes" : "NO");
    std::printf("final train loss: %.9g\n", double(finalLoss));
  }
  CHECK(flashopt_optimizer_destroy(opt));
  CHECK(flashopt_comm_destroy(comm));
  CHECK(flashopt_context_destroy(ctx));
  MPI_Finalize();
  return allSame && std::isfinite(finalLoss) ? 0 : 1;
}
