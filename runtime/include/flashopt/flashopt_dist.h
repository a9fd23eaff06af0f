/*===- flashopt_dist.h - The libflashopt C ABI: data parallelism ---*- C -*-===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * Communicators (an engine's collectives as a table of functions), attaching
 * one to an optimizer (replicated or sharded), and gradient buckets. Part of
 * the C ABI of flashopt.h, which includes this header: include that one.
 * The engines: flashopt_mpi.h (MPI, host buffers) and flashopt_nccl.h (NCCL,
 * device buffers).
 *
 *===----------------------------------------------------------------------===*/

#ifndef FLASHOPT_DIST_H
#define FLASHOPT_DIST_H

#include "flashopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/*===----------------------------------------------------------------------===*
 * Data parallelism
 *===----------------------------------------------------------------------===*/

/** A communicator: the collectives of an existing engine (MPI:
 *  flashopt_mpi.h; NCCL on device buffers: flashopt_nccl.h; or a
 *  framework's own process group through the same table), as a table of
 *  functions. libflashopt builds every reduction
 *  of data-parallel training on these few primitives; it moves no bytes of
 *  its own. */
typedef struct flashopt_comm_s *flashopt_comm;

/** The engine behind a communicator. Every function returns 0 on success
 *  or an engine error code (described by `error_string`), and is called by
 *  every rank in the same order (a collective). Buffers are host memory
 *  (except reduce_mean_device's). Zero-initialize the table: the optional
 *  entries, appended over time, are absent when NULL. */
typedef struct flashopt_comm_backend {
  /** FLASHOPT_ABI_VERSION of the header the backend was built against. */
  int32_t abi_version;
  /** "mpi", "nccl", ...: for messages. */
  const char *name;
  /** This process's rank and the number of ranks. */
  int32_t rank, size;
  /** The engine's state, passed to every function. */
  void *self;
  /** recv[r * bytes ...] = rank r's `send` (`bytes` each), for every r. */
  int (*all_gather)(void *self, const void *send, void *recv, size_t bytes);
  /** Block r of `send` (`bytes` each) goes to rank r; block r of `recv`
   *  comes from rank r. */
  int (*all_to_all)(void *self, const void *send, void *recv, size_t bytes);
  /** `bytes` of `buf` on rank `root` are copied to `buf` on every rank. */
  int (*broadcast)(void *self, void *buf, size_t bytes, int32_t root);
  /** Optional (may be NULL): recv = the sum over ranks of block `rank` of
   *  `send` (`count` floats per block), in the engine's own order. Used by
   *  FLASHOPT_REDUCE_FAST only. */
  int (*reduce_scatter_f32)(void *self, const float *send, float *recv,
                            size_t count);
  /** Text for an error code (may be NULL). */
  const char *(*error_string)(void *self, int code);
  /** Releases `self` (may be NULL), called once by flashopt_comm_destroy. */
  void (*destroy)(void *self);
  /** Optional (may be NULL; NCCL: flashopt_nccl.h): averages gradients in
   *  CUDA device memory, in place, over the ranks. `pieces[i]` is a device
   *  pointer to `counts[i]` elements of `dtype` (a flashopt_dtype); `mode`
   *  is a flashopt_reduce_mode with the same contract as the host path:
   *  fp32 sums of the W contributions (in rank order for DETERMINISTIC),
   *  divided by W and rounded once to `dtype`, each element reduced once by
   *  its owner and gathered, the elements taken in piece order. When set,
   *  optimizers on FLASHOPT_DEVICE_CUDA contexts reduce through it and their
   *  gradients never leave the device; the other functions above still get
   *  host memory. */
  int (*reduce_mean_device)(void *self, void *const *pieces,
                            const int64_t *counts, size_t num_pieces,
                            int32_t dtype, int32_t mode);
} flashopt_comm_backend;

/** Wraps `backend` (copied) in a communicator handle. */
FLASHOPT_API flashopt_status
flashopt_comm_create(const flashopt_comm_backend *backend, flashopt_comm *out);
/** Destroys a communicator (its backend's destroy runs). Optimizers that use
 *  it must be destroyed first. */
FLASHOPT_API flashopt_status flashopt_comm_destroy(flashopt_comm comm);
/** This process's rank and the world size (either pointer may be NULL). */
FLASHOPT_API flashopt_status flashopt_comm_get_rank(flashopt_comm comm,
                                                    int32_t *rank,
                                                    int32_t *size);

/** How gradients are reduced across ranks. */
typedef enum flashopt_reduce_mode {
  /** Each element's owner rank sums the W contributions in rank order in
   *  fp32: bitwise reproducible, and equal to a single process that sums
   *  the same way. The default. */
  FLASHOPT_REDUCE_DETERMINISTIC = 0,
  /** The engine's own fp32 reduce-scatter (its order). */
  FLASHOPT_REDUCE_FAST = 1
} flashopt_reduce_mode;

/** Replicated data parallelism (DDP semantics) over `comm`, called by every
 *  rank after all parameters are registered: checks that every rank
 *  registered the same layout (spec, parameter names, sizes, dtypes, param
 *  groups; a mismatch is FLASHOPT_ERROR_MISMATCH on every rank, naming the
 *  first difference), then copies parameters, correction terms and states
 *  from rank 0. From then on flashopt_step first averages the gradients
 *  over the ranks (fp32 sums, rounded once to the gradient dtype; each
 *  element reduced once by its owner and then gathered, so the replicas stay
 *  bit-identical by construction), in buckets of at most `bucket_bytes` of
 *  gradient (0: 25 MiB) in registration order, then steps; under
 *  FLASHOPT_NONFINITE_SKIP the ranks agree: a NaN/Inf on any rank skips the
 *  step on all. With gradient accumulation (flashopt_accumulate) the step
 *  reduces the accumulators instead and scales by 1/(N * W) (docs/RUNTIME.md
 *  "Gradient accumulation with data parallelism"). Registering more
 *  parameters afterwards, flashopt_step_param
 *  (gradient release) and a second attach are FLASHOPT_ERROR_STATE. */
FLASHOPT_API flashopt_status
flashopt_optimizer_attach_comm(flashopt_optimizer opt, flashopt_comm comm,
                               flashopt_reduce_mode mode, size_t bucket_bytes);
/** Sharded data parallelism (ZeRO-1) over `comm`: the same checks, copy
 *  from rank 0 and buckets as flashopt_optimizer_attach_comm, but each rank
 *  keeps only its shard of the correction terms and states (every tensor is
 *  cut at quantization-group boundaries into W contiguous ranges, one per
 *  rank; a tensor of fewer than W groups leaves some ranks none of it).
 *  flashopt_step reduce-scatters each bucket's gradients to their owners,
 *  steps the owned ranges and all-gathers the parameters: with
 *  FLASHOPT_REDUCE_DETERMINISTIC the parameters equal replicated mode's bit
 *  for bit after every step. The callers' gradient buffers are left as they
 *  were unless gradient-norm clipping is on (then they receive the averaged
 *  gradients, as in replicated mode, and the norm is the same). The memory
 *  report counts this rank's shard. On CUDA contexts the shards live in
 *  device memory and the collectives stage through host memory
 *  (docs/RUNTIME.md "Sharded mode (ZeRO-1)"). Checkpoints are collective: every
 *  rank calls flashopt_save_checkpoint, rank 0 writes the single-process
 *  format; a load (before or after attaching, at any W) keeps each rank's
 *  shard. Reading correction terms or states (checkpoint save,
 *  flashopt_export_master_f32, flashopt_check_numerics) is collective in
 *  this mode: every rank calls it in the same order. Gradient release is
 *  FLASHOPT_ERROR_STATE. */
FLASHOPT_API flashopt_status
flashopt_optimizer_attach_comm_sharded(flashopt_optimizer opt,
                                       flashopt_comm comm,
                                       flashopt_reduce_mode mode,
                                       size_t bucket_bytes);
/** Externally reduced data parallelism over `comm`: a framework (FSDP2,
 *  through the PyTorch binding) has reduced the gradients already, and each
 *  rank registered its own parameters (its shards), which need not match
 *  the other ranks' in number or size; `comm` (typically the framework's
 *  process group through a flashopt_comm_backend table) carries only the
 *  steps' agreement. From then on every rank steps with
 *  flashopt_step_external, collectively; flashopt_step and
 *  flashopt_step_param are FLASHOPT_ERROR_STATE. A second attach is
 *  FLASHOPT_ERROR_STATE. */
FLASHOPT_API flashopt_status
flashopt_optimizer_attach_comm_external(flashopt_optimizer opt,
                                        flashopt_comm comm);
/** One step under externally reduced data parallelism, called by every
 *  rank for every step (a collective): this rank's parameters `indices`
 *  (`count` of them; NULL: every parameter, a whole step counted by
 *  flashopt_get_step(-1)), which hold its pieces of the framework's
 *  parameters `param_ids` (`num_param_ids` caller-chosen ids, the same on
 *  every rank: each is counted by flashopt_get_external_step, also on a
 *  rank that holds none of its elements). The ranks agree first:
 *  - `error_status` other than FLASHOPT_OK (with `error`, may be NULL) says
 *    this rank cannot step; this rank's own checks (a gradient missing,
 *    a hyper-parameter never set, micro-batches pending, clipping on) count
 *    alike. Any such error fails the step on every rank with that rank's
 *    status and message ("rank R of W cannot step: ...");
 *  - a different NaN policy, hyper table or `param_ids` is
 *    FLASHOPT_ERROR_MISMATCH on every rank;
 *  - `found_inf` nonzero on any rank (the framework found a non-finite
 *    gradient, e.g. GradScaler), or under FLASHOPT_NONFINITE_SKIP a NaN/Inf
 *    gradient on any rank, skips the step on every rank (counted by
 *    flashopt_get_skipped_steps).
 *  Then each rank steps its parameters `indices`, each with its own step
 *  counter + 1. `*stepped` (may be NULL) is 1 when it stepped, 0 when it
 *  was skipped. Nothing changes on any rank unless every rank steps. */
FLASHOPT_API flashopt_status
flashopt_step_external(flashopt_optimizer opt, const int64_t *indices,
                       int64_t count, const int64_t *param_ids,
                       int64_t num_param_ids, int32_t found_inf,
                       flashopt_status error_status, const char *error,
                       int32_t *stepped);
/** The steps the framework's parameter `param_id` took under
 *  flashopt_step_external (0 before its first). */
FLASHOPT_API flashopt_status flashopt_get_external_step(flashopt_optimizer opt,
                                                        int64_t param_id,
                                                        int64_t *out);
/** Sets it (a framework's checkpoint restored; >= 0). */
FLASHOPT_API flashopt_status flashopt_set_external_step(flashopt_optimizer opt,
                                                        int64_t param_id,
                                                        int64_t step);
/** The number of gradient buckets (1 without a communicator). */
FLASHOPT_API flashopt_status flashopt_num_buckets(flashopt_optimizer opt,
                                                  int32_t *out);
/** The parameters of bucket `bucket`: indices [*first, *first + *count). */
FLASHOPT_API flashopt_status flashopt_bucket_params(flashopt_optimizer opt,
                                                    int32_t bucket,
                                                    int64_t *first,
                                                    int64_t *count);
/** Averages bucket `bucket`'s gradients now, as soon as they are final (to
 *  overlap communication with the rest of the backward pass); every rank
 *  must reduce the same buckets in the same order. flashopt_step reduces
 *  the buckets not reduced yet, in order. */
FLASHOPT_API flashopt_status flashopt_reduce_bucket(flashopt_optimizer opt,
                                                    int32_t bucket);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHOPT_DIST_H */
