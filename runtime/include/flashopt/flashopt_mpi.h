/*===- flashopt_mpi.h - MPI communicators for libflashopt -------*- C -*-===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * libflashopt_mpi (CMake: flashopt::mpi) turns an MPI communicator into a
 * flashopt_comm for data-parallel training on host buffers; libflashopt
 * itself has no MPI dependency. Launch with mpirun:
 *
 *   MPI_Init(&argc, &argv);
 *   flashopt_comm comm;
 *   flashopt_comm_create_mpi(MPI_COMM_WORLD, &comm);
 *   ... register every parameter of `opt` ...
 *   flashopt_optimizer_attach_comm(opt, comm, FLASHOPT_REDUCE_DETERMINISTIC, 0);
 *   for (...) { backward(); flashopt_step(opt); }   // gradients averaged
 *   flashopt_optimizer_destroy(opt); flashopt_comm_destroy(comm);
 *   MPI_Finalize();
 *
 *===----------------------------------------------------------------------===*/

#ifndef FLASHOPT_MPI_H
#define FLASHOPT_MPI_H

#include "flashopt/flashopt.h"

/* Only MPI's C API is used: skip the deprecated C++ bindings. */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A communicator over a duplicate of `comm` (so flashopt's traffic never
 *  mixes with the caller's), whose errors are returned, not fatal. MPI must
 *  be initialized; destroy the flashopt_comm (and the optimizers using it)
 *  before MPI_Finalize. */
FLASHOPT_API flashopt_status flashopt_comm_create_mpi(MPI_Comm comm,
                                                      flashopt_comm *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHOPT_MPI_H */
