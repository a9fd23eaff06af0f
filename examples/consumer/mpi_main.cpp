// flashopt-consumer-mpi: data parallelism through the installed package
// (flashopt::mpi). Run with mpirun -np 2: every rank holds the same
// parameter, rank r's gradient is r + 1 everywhere, and after one SGD step
// (lr 1, no momentum) the parameter is 1 - mean(1..W) on every rank.
#include <flashopt/flashopt_mpi.h>

#include <cstdio>
#include <vector>

#ifndef CONSUMER_KERNELS_DIR
#error "CONSUMER_KERNELS_DIR must name the consumer's bundle directory"
#endif

#define CHECK_OK(call)                                                         \
  do {                                                                         \
    if ((call) != FLASHOPT_OK) {                                               \
      std::fprintf(stderr, "%s: %s\n", #call, flashopt_last_error());          \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  flashopt_comm comm;
  CHECK_OK(flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm));
  flashopt_context ctx;
  flashopt_optimizer opt;
  CHECK_OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
  CHECK_OK(flashopt_optimizer_create(ctx, CONSUMER_KERNELS_DIR "/consumer_sgd",
                                     &opt));
  CHECK_OK(flashopt_set_hyper(opt, -1, "lr", 1.0));
  CHECK_OK(flashopt_set_hyper(opt, -1, "momentum", 0.0));
  const int64_t n = 100;
  std::vector<float> w(n, float(rank) + 1.0f), g(n, float(rank) + 1.0f);
  int64_t idx;
  CHECK_OK(flashopt_add_param(opt, 0, "w", w.data(), FLASHOPT_F32, n, g.data(),
                              FLASHOPT_F32, &idx));
  // Rank 0's w (all ones) is copied to every rank.
  CHECK_OK(flashopt_optimizer_attach_comm(opt, comm,
                                          FLASHOPT_REDUCE_DETERMINISTIC, 0));
  CHECK_OK(flashopt_step(opt));
  float mean = 0.0f;
  for (int r = 0; r < world; ++r)
    mean += float(r) + 1.0f;
  mean /= float(world);
  int bad = 0;
  for (float x : w)
    bad += x != 1.0f - mean;
  int total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("flashopt-consumer-mpi: %d ranks, w = %g (expected %g), %d "
                "wrong elements\n",
                world, double(w[0]), double(1.0f - mean), total);
  flashopt_optimizer_destroy(opt);
  flashopt_context_destroy(ctx);
  flashopt_comm_destroy(comm);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
