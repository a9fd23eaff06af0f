/*===- flashopt_nccl.h - NCCL communicators for libflashopt ------*- C -*-===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * libflashopt_nccl (CMake: flashopt::nccl) turns an MPI communicator into a
 * flashopt_comm whose gradient reduction runs on CUDA device buffers with
 * NCCL: an optimizer on a FLASHOPT_DEVICE_CUDA context averages its
 * gradients without copying them to host memory. libnccl.so.2 is loaded at
 * run time (dlopen, like libcuda.so.1): nothing links against NCCL, and
 * libflashopt itself depends on neither MPI nor NCCL. Launch with mpirun,
 * one rank per GPU:
 *
 *   MPI_Init(&argc, &argv);
 *   flashopt_comm comm;
 *   flashopt_comm_create_nccl(MPI_COMM_WORLD, local_rank, &comm);
 *   flashopt_context_create(FLASHOPT_DEVICE_CUDA, local_rank, &ctx);
 *   ... create `opt` on ctx, register every parameter (device pointers) ...
 *   flashopt_optimizer_attach_comm(opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
 *   for (...) { backward(); flashopt_step(opt); }   // averaged on the GPU
 *   flashopt_optimizer_destroy(opt); flashopt_comm_destroy(comm);
 *   MPI_Finalize();
 *
 * Rank 0 creates the NCCL unique id and broadcasts it over `comm` (MPI).
 * The start-up traffic (layout check, rank 0's parameters and states, the
 * per-step agreement on the NaN policy and hyper-parameters) goes over MPI
 * in host memory; the gradients go over NCCL in device memory.
 *
 *===----------------------------------------------------------------------===*/

#ifndef FLASHOPT_NCCL_H
#define FLASHOPT_NCCL_H

#include "flashopt/flashopt_mpi.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A communicator over a duplicate of `comm` (for the host-side traffic)
 *  and an NCCL communicator of the same ranks on CUDA device `cuda_device`
 *  (its primary context, the one a FLASHOPT_DEVICE_CUDA context of that
 *  ordinal uses). Collective: every rank of `comm` calls it. MPI must be
 *  initialized. The NCCL library is libnccl.so.2, or the file named by the
 *  FLASHOPT_NCCL_LIBRARY environment variable; the CUDA driver is the one
 *  libflashopt loads (libcuda.so.1 or FLASHOPT_CUDA_DRIVER). A library or
 *  symbol that cannot be loaded is FLASHOPT_ERROR_UNSUPPORTED naming it
 *  (flashopt_last_error); an NCCL failure is FLASHOPT_ERROR_COMM. Either way
 *  every rank gets the error: the ranks agree before returning. */
FLASHOPT_API flashopt_status flashopt_comm_create_nccl(MPI_Comm comm,
                                                       int32_t cuda_device,
                                                       flashopt_comm *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHOPT_NCCL_H */
