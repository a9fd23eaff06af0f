/*===- flashopt.h - The libflashopt C ABI ------------------------*- C -*-===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * libflashopt runs the optimizer kernels flashopt-gen generates (a "bundle":
 * manifest.json plus CPU shared objects and PTX/cubins) on parameters the
 * caller owns. It contains no MLIR or LLVM.
 *
 *   flashopt_context    a device: the CPU (a thread pool) or CUDA device n.
 *   flashopt_optimizer  one bundle on one context: param groups with their
 *                       own hyper-parameters, registered parameters and
 *                       gradients (caller-owned), and the optimizer state the
 *                       library owns (codes, scales, correction terms).
 *
 * A typical life:
 *
 *   flashopt_context ctx;  flashopt_optimizer opt;  int64_t w;
 *   flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx);
 *   flashopt_optimizer_create(ctx, "build/kernels/adamw_bf16_m24", &opt);
 *   flashopt_set_hyper(opt, 0, "lr", 1e-3);
 *   flashopt_add_param(opt, 0, "fc1.weight", w_ptr, FLASHOPT_BF16, n,
 *                      g_ptr, FLASHOPT_BF16, &w);
 *   for (...) { backward(); flashopt_step(opt); }
 *   flashopt_save_checkpoint(opt, "ckpt.safetensors", FLASHOPT_CHECKPOINT_COMPRESSED);
 *   flashopt_optimizer_destroy(opt);  flashopt_context_destroy(ctx);
 *
 * Conventions
 *  - Every function returns a flashopt_status; FLASHOPT_OK is 0. On failure
 *    nothing was changed (unless the function says otherwise) and
 *    flashopt_last_error() describes what was wrong and where.
 *  - Handles are opaque and never reused: a destroyed handle, or one that was
 *    never created, is reported (FLASHOPT_ERROR_INVALID_HANDLE) rather than
 *    dereferenced.
 *  - Hyper-parameter values cross the ABI as double and are stored, as the
 *    kernels use them, as float (round to nearest even); non-finite values
 *    are rejected.
 *  - Parameters and gradients live on the context's device: host memory for
 *    FLASHOPT_DEVICE_CPU, device memory (CUdeviceptr cast to void*) for
 *    FLASHOPT_DEVICE_CUDA. The library never frees them; they must stay
 *    valid while registered.
 *  - A single optimizer must not be used from two threads at once; distinct
 *    optimizers may.
 *  - DLPack: the *_dlpack functions take a `const DLTensor *` from
 *    <dlpack/dlpack.h> (any version with the v0.6+ layout), passed as
 *    `const void *`: this header does not include dlpack.h, and DLPack
 *    declares DLTensor as a typedef of an unnamed struct, which cannot be
 *    forward-declared.
 *
 *===----------------------------------------------------------------------===*/

#ifndef FLASHOPT_H
#define FLASHOPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#if defined(FLASHOPT_BUILDING_LIBRARY)
#define FLASHOPT_API __declspec(dllexport)
#else
#define FLASHOPT_API __declspec(dllimport)
#endif
#else
#define FLASHOPT_API __attribute__((visibility("default")))
#endif

/** Bumped on every incompatible change of this header (3: the packed 4-bit
 *  dtypes FLASHOPT_I4/U4 and flashopt_bundle_desc.state_bits). */
#define FLASHOPT_ABI_VERSION 3

/*===----------------------------------------------------------------------===*
 * Status and errors
 *===----------------------------------------------------------------------===*/

typedef enum flashopt_status {
  FLASHOPT_OK = 0,
  /** A null pointer, an out-of-range index or value, a bad enum. */
  FLASHOPT_ERROR_INVALID_ARGUMENT = 1,
  /** A handle that was destroyed or never created. */
  FLASHOPT_ERROR_INVALID_HANDLE = 2,
  /** A tensor of the wrong dtype. */
  FLASHOPT_ERROR_DTYPE = 3,
  /** A tensor on the wrong device, or a device that is not available. */
  FLASHOPT_ERROR_DEVICE = 4,
  /** A tensor or buffer of the wrong size or layout. */
  FLASHOPT_ERROR_SIZE = 5,
  /** An unknown name: hyper-parameter, parameter, file. */
  FLASHOPT_ERROR_NOT_FOUND = 6,
  /** A name or tensor that is already registered. */
  FLASHOPT_ERROR_ALREADY_EXISTS = 7,
  /** The call is not valid now (a gradient is missing, a hyper-parameter
   *  without default was never set, ...). */
  FLASHOPT_ERROR_STATE = 8,
  /** A bad bundle, manifest or checkpoint file (content, not I/O). */
  FLASHOPT_ERROR_FORMAT = 9,
  /** A checkpoint of another spec, or of other parameters; ranks that
   *  registered different layouts. */
  FLASHOPT_ERROR_MISMATCH = 10,
  /** Reading or writing a file failed. */
  FLASHOPT_ERROR_IO = 11,
  FLASHOPT_ERROR_OUT_OF_MEMORY = 12,
  /** The operation is not supported on this device or by this bundle. */
  FLASHOPT_ERROR_UNSUPPORTED = 13,
  /** check_numerics found a problem (see flashopt_numerics_report). */
  FLASHOPT_ERROR_NUMERICS = 14,
  /** A CUDA driver call failed. */
  FLASHOPT_ERROR_CUDA = 15,
  FLASHOPT_ERROR_INTERNAL = 16,
  /** A communicator's collective failed (the engine's message follows). */
  FLASHOPT_ERROR_COMM = 17
} flashopt_status;

/** What went wrong in the calling thread's most recent failed call (a
 *  function name, the object and the reason), or "" if its most recent call
 *  succeeded. Valid until the thread's next call into the library. */
FLASHOPT_API const char *flashopt_last_error(void);
/** "FLASHOPT_OK", "FLASHOPT_ERROR_DTYPE", ... ("unknown" otherwise). */
FLASHOPT_API const char *flashopt_status_name(flashopt_status status);
/** The library version ("0.1.0"). */
FLASHOPT_API const char *flashopt_version(void);
/** FLASHOPT_ABI_VERSION of the library actually loaded. */
FLASHOPT_API int flashopt_abi_version(void);

/*===----------------------------------------------------------------------===*
 * Dtypes and devices
 *===----------------------------------------------------------------------===*/

typedef enum flashopt_dtype {
  FLASHOPT_BF16 = 0,
  FLASHOPT_F16 = 1,
  FLASHOPT_F32 = 2,
  FLASHOPT_I8 = 3,
  FLASHOPT_U8 = 4,
  FLASHOPT_I16 = 5,
  /** 4-bit state codes, packed two per byte, the even element in the low
   *  nibble (signed i4, unsigned ui4); only optimizer states have them. */
  FLASHOPT_I4 = 6,
  FLASHOPT_U4 = 7
} flashopt_dtype;

/** "bf16", "f16", "f32", "i8", "ui8", "i16", "i4", "ui4" (NULL for other
 *  values). */
FLASHOPT_API const char *flashopt_dtype_name(flashopt_dtype dtype);
/** Bytes per element; 0 for FLASHOPT_I4/U4, which have no whole bytes per
 *  element (use flashopt_dtype_bits, or flashopt_buffer_size for a
 *  buffer), and for other values. */
FLASHOPT_API size_t flashopt_dtype_size(flashopt_dtype dtype);
/** Bits per element: 4 for FLASHOPT_I4/U4 (n codes take (n + 1) / 2 bytes,
 *  the last byte's high nibble 0 when n is odd), else 8, 16 or 32; 0 for
 *  other values. */
FLASHOPT_API size_t flashopt_dtype_bits(flashopt_dtype dtype);

/** Device types; the values are DLPack's DLDeviceType (kDLCPU, kDLCUDA). */
typedef enum flashopt_device_type {
  FLASHOPT_DEVICE_CPU = 1,
  FLASHOPT_DEVICE_CUDA = 2
} flashopt_device_type;

/*===----------------------------------------------------------------------===*
 * Contexts
 *===----------------------------------------------------------------------===*/

typedef struct flashopt_context_handle *flashopt_context;

/** Creates a context. CPU: `device_id` must be 0; steps use every hardware
 *  thread (see flashopt_context_set_threads). CUDA: device `device_id`
 *  through the driver API (libcuda.so.1, loaded at run time); without a
 *  driver or GPU this fails with FLASHOPT_ERROR_DEVICE. */
FLASHOPT_API flashopt_status flashopt_context_create(flashopt_device_type type,
                                                     int device_id,
                                                     flashopt_context *out);
/** CPU contexts: the threads a step uses, the calling one included (0 = all
 *  hardware threads; at most 1024, more is FLASHOPT_ERROR_INVALID_ARGUMENT). Applies to optimizers created afterwards and to
 *  existing ones. */
FLASHOPT_API flashopt_status flashopt_context_set_threads(flashopt_context ctx,
                                                          int threads);
/** Releases the handle. Optimizers created on it keep the device alive until
 *  they are destroyed. */
FLASHOPT_API flashopt_status flashopt_context_destroy(flashopt_context ctx);

/*===----------------------------------------------------------------------===*
 * Optimizers
 *===----------------------------------------------------------------------===*/

typedef struct flashopt_optimizer_handle *flashopt_optimizer;

/** One file of an embedded bundle (`path` relative to the bundle). */
typedef struct flashopt_bundle_file {
  const char *path;
  const void *data;
  size_t size;
} flashopt_bundle_file;

/** A bundle compiled into the program (flashopt_add_kernels(... EMBED)):
 *  manifest.json and the kernel files. */
typedef struct flashopt_embedded_bundle {
  uint32_t abi_version; /* FLASHOPT_ABI_VERSION */
  const char *name;
  size_t num_files;
  const flashopt_bundle_file *files;
} flashopt_embedded_bundle;

/** Creates an optimizer from the bundle directory `bundle_dir` (holding
 *  manifest.json). It starts with one param group (0) holding the
 *  manifest's default hyper-parameters. */
FLASHOPT_API flashopt_status flashopt_optimizer_create(flashopt_context ctx,
                                                       const char *bundle_dir,
                                                       flashopt_optimizer *out);
/** Same, from a bundle embedded in the program. */
FLASHOPT_API flashopt_status
flashopt_optimizer_create_embedded(flashopt_context ctx,
                                   const flashopt_embedded_bundle *bundle,
                                   flashopt_optimizer *out);
/** Frees the optimizer and its state (not the caller's tensors). */
FLASHOPT_API flashopt_status flashopt_optimizer_destroy(flashopt_optimizer opt);

typedef struct flashopt_optimizer_info {
  const char *name;      /* the spec's name, e.g. "adamw_bf16_m24" */
  const char *rule;      /* "adamw", or a custom rule's name */
  const char *spec_hash; /* the manifest's spec hash */
  flashopt_dtype param_dtype;
  flashopt_dtype grad_dtype;
  int has_correction;              /* 1 when the master weight is split */
  flashopt_dtype correction_dtype; /* I8 or I16 when has_correction */
  int64_t group_size;              /* elements per quantization group */
  int32_t num_hypers;
  int32_t num_states;
  flashopt_device_type device_type;
  int32_t device_id;
} flashopt_optimizer_info;

/** Fills `out`; its strings stay valid while the optimizer lives. */
FLASHOPT_API flashopt_status
flashopt_optimizer_get_info(flashopt_optimizer opt, flashopt_optimizer_info *out);
/** The name of hyper-parameter `index` (0 <= index < num_hypers), in the
 *  manifest's order. */
FLASHOPT_API flashopt_status flashopt_hyper_name(flashopt_optimizer opt,
                                                 int32_t index,
                                                 const char **out);

/** What a bundle computes, read from its manifest.json without creating an
 *  optimizer, so that a binding chooses a bundle by what it is, not by its
 *  name. Strings are NUL-terminated; a manifest whose name or rule does not
 *  fit is a FLASHOPT_ERROR_FORMAT. */
typedef struct flashopt_bundle_desc {
  char name[128];
  char rule[128]; /* "adamw", or a custom rule's name */
  flashopt_dtype param_dtype;
  int32_t has_correction;          /* 1 when the master weight is split */
  flashopt_dtype correction_dtype; /* I8 or I16 when has_correction */
  int32_t quantized_states;        /* states stored as 8- or 4-bit codes */
  int32_t plain_states;            /* states stored as fp32 */
  char arithmetic[16];             /* "exact" or "fast" */
  char numerics[16];               /* "bounded" or "flashoptim" */
  /* The widest code of the quantized states: 8 (i8/ui8 codes) or 4 (packed
   * i4/ui4 codes); 0 when no state is quantized. (ABI version 3.) */
  int32_t state_bits;
} flashopt_bundle_desc;

/** Fills `out` from `bundle_dir`/manifest.json (validated as
 *  flashopt_optimizer_create validates it). */
FLASHOPT_API flashopt_status flashopt_describe_bundle(const char *bundle_dir,
                                                      flashopt_bundle_desc *out);

/** One library-owned buffer of every parameter: its name as
 *  flashopt_read_buffer takes it ("correction", "<state>.codes",
 *  "<state>.scales", or an unquantized state's name), whether it holds one
 *  element per quantization group (else one per parameter element), and
 *  its dtype. `name` stays valid while the optimizer lives. */
typedef struct flashopt_buffer_desc {
  const char *name;
  int32_t per_group;
  flashopt_dtype dtype;
} flashopt_buffer_desc;

/** The number of library-owned buffers of each parameter. */
FLASHOPT_API flashopt_status flashopt_num_buffers(flashopt_optimizer opt,
                                                  int32_t *out);
/** Buffer `index` (0 <= index < flashopt_num_buffers), in the manifest's
 *  order. */
FLASHOPT_API flashopt_status
flashopt_get_buffer_desc(flashopt_optimizer opt, int32_t index,
                         flashopt_buffer_desc *out);

/** The name of stored state `index` (0 <= index < num_states: the states
 *  with buffers, elided ones left out), in the manifest's order, e.g.
 *  "exp_avg" then "exp_avg_sq"; torch.optim's names for the shipped rules. */
FLASHOPT_API flashopt_status flashopt_state_name(flashopt_optimizer opt,
                                                 int32_t index,
                                                 const char **out);

/*===----------------------------------------------------------------------===*
 * Param groups and hyper-parameters
 *===----------------------------------------------------------------------===*/

/** Adds a param group holding the manifest's defaults; `*out_group` is its
 *  index (groups are numbered 0, 1, ...). */
FLASHOPT_API flashopt_status flashopt_add_param_group(flashopt_optimizer opt,
                                                      int32_t *out_group);
FLASHOPT_API flashopt_status flashopt_num_param_groups(flashopt_optimizer opt,
                                                       int32_t *out);
/** Sets hyper-parameter `name` ("lr", "beta1", "beta2", "eps",
 *  "weight_decay", "momentum", "dampening", "nesterov", "decouple_lr",
 *  "initial_lr", ...: whatever the rule declares) of param group `group`, or
 *  of every group when `group` is -1. Takes effect at the next step (LR
 *  schedules need no rebuild). Unknown names (FLASHOPT_ERROR_NOT_FOUND),
 *  non-finite values, and a nonzero value for a hyper-parameter whose state
 *  the spec elided (e.g. momentum of an SGD spec without momentum buffer)
 *  are rejected. */
FLASHOPT_API flashopt_status flashopt_set_hyper(flashopt_optimizer opt,
                                                int32_t group, const char *name,
                                                double value);
FLASHOPT_API flashopt_status flashopt_get_hyper(flashopt_optimizer opt,
                                                int32_t group, const char *name,
                                                double *out);

/*===----------------------------------------------------------------------===*
 * Parameters and gradients
 *===----------------------------------------------------------------------===*/

/** Registers a parameter of `numel` elements in param group `group`.
 *  `param` must have the bundle's param dtype and `grad` (NULL until the
 *  first step is allowed) its grad dtype; both on the context's device,
 *  16-byte aligned. `name` (NULL: "p<index>") names it in checkpoints and
 *  must be unique. The library allocates its zeroed correction and state
 *  slices (so the master weight starts at the parameter's value).
 *  `*out_index` is the parameter's index (0, 1, ... in registration order).
 *  Registering the same `param` memory twice is FLASHOPT_ERROR_ALREADY_EXISTS. */
FLASHOPT_API flashopt_status flashopt_add_param(flashopt_optimizer opt,
                                                int32_t group, const char *name,
                                                void *param,
                                                flashopt_dtype param_dtype,
                                                int64_t numel, const void *grad,
                                                flashopt_dtype grad_dtype,
                                                int64_t *out_index);
/** Same, from DLPack tensors (compact row-major, lanes 1, on the context's
 *  device; `grad` may be NULL). The shape is kept for checkpoints. */
FLASHOPT_API flashopt_status flashopt_add_param_dlpack(
    flashopt_optimizer opt, int32_t group, const char *name,
    const void *param /* const DLTensor * */,
    const void *grad /* const DLTensor *, or NULL */,
    int64_t *out_index);
/** Registers a piece of a larger logical tensor, as flashopt_add_param
 *  does a whole tensor: `numel` elements that are elements
 *  [element_offset, element_offset + numel) of the logical tensor (a shard
 *  of a parameter that another process, or another piece, holds the rest
 *  of). The piece steps exactly as those elements of the whole tensor: the
 *  bounded numerics' dither takes each element's index in the logical
 *  tensor (docs/NUMERICS.md §8.3), and quantization groups start at the
 *  piece's first element, so `element_offset` must be a multiple of the
 *  bundle's group_size (FLASHOPT_ERROR_INVALID_ARGUMENT otherwise). The
 *  piece's parameter and gradient memory need only the alignment the
 *  device's kernels need, here and in later flashopt_set_grad(s) calls: any
 *  on the CPU, 16 bytes on CUDA (a shard of whole rows starts wherever its
 *  first row does). Names, sizes, dtypes and checkpoints are as for
 *  flashopt_add_param; the offset is not saved in checkpoints (whoever
 *  registers the piece gives it again). */
FLASHOPT_API flashopt_status flashopt_add_param_piece(
    flashopt_optimizer opt, int32_t group, const char *name, void *param,
    flashopt_dtype param_dtype, int64_t numel, const void *grad,
    flashopt_dtype grad_dtype, int64_t element_offset, int64_t *out_index);
/** Re-points the gradient of parameter `index` (`numel` must match). */
FLASHOPT_API flashopt_status flashopt_set_grad(flashopt_optimizer opt,
                                               int64_t index, const void *grad,
                                               flashopt_dtype grad_dtype,
                                               int64_t numel);
FLASHOPT_API flashopt_status flashopt_set_grad_dlpack(flashopt_optimizer opt,
                                                      int64_t index,
                                                      const void *grad /* const DLTensor * */);
/** Re-points the gradients of `count` parameters in one call: parameter
 *  `indices[k]` gets `grads[k]` (of `grad_dtype` and that parameter's numel,
 *  like flashopt_set_grad). Every entry is checked before any is applied: on
 *  failure nothing was changed. For bindings that see new gradient memory
 *  every step (PyTorch's zero_grad(set_to_none=True)), so that a step costs a
 *  constant number of calls instead of one per parameter. */
FLASHOPT_API flashopt_status flashopt_set_grads(flashopt_optimizer opt,
                                                int64_t count,
                                                const int64_t *indices,
                                                const void *const *grads,
                                                flashopt_dtype grad_dtype);
FLASHOPT_API flashopt_status flashopt_num_params(flashopt_optimizer opt,
                                                 int64_t *out);
/** The index of the parameter named `name`. */
FLASHOPT_API flashopt_status flashopt_find_param(flashopt_optimizer opt,
                                                 const char *name,
                                                 int64_t *out_index);

/** What a registered parameter is. */
typedef struct flashopt_param_info {
  const char *name;     /* valid while the optimizer lives */
  int64_t numel;
  int32_t group;        /* its param group */
  int32_t ndim;         /* 1 for flashopt_add_param: shape = {numel} */
  const int64_t *shape; /* ndim entries, valid while the optimizer lives */
  int64_t step;         /* its step counter (flashopt_get_step) */
} flashopt_param_info;

/** Fills `out` for parameter `index`. */
FLASHOPT_API flashopt_status flashopt_get_param_info(flashopt_optimizer opt,
                                                     int64_t index,
                                                     flashopt_param_info *out);

/*===----------------------------------------------------------------------===*
 * Stepping
 *===----------------------------------------------------------------------===*/

typedef enum flashopt_nonfinite_policy {
  /** Step anyway: NaN/Inf flow through the update as docs/NUMERICS.md §1
   *  and §2 define (the default; no extra pass over the gradients). */
  FLASHOPT_NONFINITE_PROPAGATE = 0,
  /** Before stepping, scan the gradients about to be used; if any element is
   *  NaN or ±Inf, change nothing (parameters, states and step counters stay
   *  as they were), count the skip and return FLASHOPT_OK. */
  FLASHOPT_NONFINITE_SKIP = 1
} flashopt_nonfinite_policy;

/** Steps every parameter: each parameter's step counter t += 1, then the
 *  kernel runs over all of them (one launch per kernel variant on a GPU; on
 *  the CPU, multithreaded over group-aligned chunks). Fails with
 *  FLASHOPT_ERROR_STATE, changing nothing, when a gradient is missing or a
 *  hyper-parameter without default was never set. */
FLASHOPT_API flashopt_status flashopt_step(flashopt_optimizer opt);
/** Steps one parameter (gradient release: call it as soon as its gradient is
 *  ready, then the gradient may be freed). Its own step counter t += 1. A
 *  mix of flashopt_step_param over every parameter once equals one
 *  flashopt_step, bit for bit. */
FLASHOPT_API flashopt_status flashopt_step_param(flashopt_optimizer opt,
                                                 int64_t index);
/** Gradient accumulation (docs/RUNTIME.md "Gradient accumulation"; the
 *  bundle's spec needs an "accumulator", else FLASHOPT_ERROR_UNSUPPORTED
 *  naming it). Adds every parameter's current gradient to its accumulator
 *  (reserved by the runtime, in the spec's encoding: f32, bf16 + i8 or bf16)
 *  with the generated accumulate kernel. The next flashopt_step ends the
 *  accumulation: its fused kernel adds that last gradient, divides the sum
 *  by N (the micro-batches, that one included) or by the normalizer, steps
 *  and zeroes the accumulators — bit-identical to accumulating the last
 *  micro-batch too and stepping on the accumulator. With gradient-norm
 *  clipping, FLASHOPT_NONFINITE_SKIP or a communicator attached, the step
 *  instead accumulates the last gradient, decides on the accumulated
 *  gradient (its norm; its finiteness: a skipped step zeroes the
 *  accumulators and changes nothing else) and, with a communicator, first
 *  sums the ranks' accumulators (decoded to f32, rank order in
 *  deterministic mode) in the gradient buckets, then steps once with
 *  1/(N * W) or 1/normalizer. While micro-batches are pending
 *  flashopt_step_param and flashopt_reduce_bucket are refused
 *  (FLASHOPT_ERROR_STATE). CPU and CUDA contexts (the bundle's generated
 *  kernels for each). */
FLASHOPT_API flashopt_status flashopt_accumulate(flashopt_optimizer opt);
/** flashopt_accumulate for parameter `index` only; every parameter must
 *  have the same number of micro-batches at the next flashopt_step. */
FLASHOPT_API flashopt_status flashopt_accumulate_param(flashopt_optimizer opt,
                                                       int64_t index);
/** What the step after an accumulation divides the summed gradient by
 *  (for example a token count), instead of the number of micro-batches;
 *  0 (the default) means the number of micro-batches. Folded into
 *  "grad_scale" for that step. */
FLASHOPT_API flashopt_status
flashopt_set_accumulation_normalizer(flashopt_optimizer opt,
                                     double normalizer);
/** The micro-batches parameter `index` has accumulated since the last
 *  step. */
FLASHOPT_API flashopt_status flashopt_get_accumulated(flashopt_optimizer opt,
                                                      int64_t index,
                                                      int64_t *out);
/** Gradient-norm clipping (torch's clip_grad_norm_ with the L2 norm): before
 *  each flashopt_step, the global norm of the gradients is computed in a
 *  fixed order (in double: the same bits for any thread count; each param
 *  group's gradients counted with its "grad_scale"; after the average over
 *  the ranks when a communicator is attached, so every rank gets the same
 *  norm), and when it exceeds `max_norm` every gradient is scaled by
 *  max_norm / (norm + 1e-6) inside the step kernel (multiplied into
 *  "grad_scale" for that step: no extra pass over memory). A NaN norm clips
 *  nothing (the NaN policy decides). 0 turns it off (the default).
 *  flashopt_step_param is refused while it is on. CPU contexts only so far
 *  (FLASHOPT_ERROR_UNSUPPORTED on CUDA). */
FLASHOPT_API flashopt_status flashopt_set_max_grad_norm(flashopt_optimizer opt,
                                                        double max_norm);
/** The global gradient norm computed by the last flashopt_step (before
 *  clipping), or -1 when clipping is off or no step has run. */
FLASHOPT_API flashopt_status flashopt_get_grad_norm(flashopt_optimizer opt,
                                                    double *out);
/** The step counter of parameter `index`, or with index -1 the number of
 *  flashopt_step calls that stepped (skipped ones excluded). */
FLASHOPT_API flashopt_status flashopt_get_step(flashopt_optimizer opt,
                                               int64_t index, int64_t *out);
/** Sets the NaN/Inf policy (default PROPAGATE). FLASHOPT_NONFINITE_SKIP is
 *  CPU-only for now: on a CUDA context it is FLASHOPT_ERROR_UNSUPPORTED. */
FLASHOPT_API flashopt_status
flashopt_set_nonfinite_policy(flashopt_optimizer opt,
                              flashopt_nonfinite_policy policy);
/** Steps (flashopt_step or flashopt_step_param calls) skipped so far under
 *  FLASHOPT_NONFINITE_SKIP. */
FLASHOPT_API flashopt_status flashopt_get_skipped_steps(flashopt_optimizer opt,
                                                        int64_t *out);
/** Waits until every step issued on a CUDA context has finished (a no-op on
 *  the CPU, whose steps return when done). */
FLASHOPT_API flashopt_status flashopt_synchronize(flashopt_optimizer opt);

/*===----------------------------------------------------------------------===*
 * Memory report
 *===----------------------------------------------------------------------===*/

/** Exact bytes of the registered parameters, by category. Per-group buffers
 *  (scales) count ceil(numel / group_size) entries per parameter. */
typedef struct flashopt_memory_report {
  int64_t numel;
  int64_t param_bytes;
  int64_t correction_bytes;
  int64_t grad_bytes;
  int64_t state_bytes; /* codes, scales and plain states */
  int64_t total_bytes; /* param + correction + grad + state */
  int64_t total_bytes_with_grad_release; /* total - grad */
  /* Bytes the library allocated (correction and states, with alignment
   * padding and spare capacity). */
  int64_t allocated_bytes;
  double bytes_per_param;                    /* total / numel */
  double bytes_per_param_with_grad_release;  /* (total - grad) / numel */
  /* The gradient accumulator (0 without one); included in total_bytes. */
  int64_t accumulator_bytes;
} flashopt_memory_report;

FLASHOPT_API flashopt_status flashopt_memory_report_get(flashopt_optimizer opt,
                                                        flashopt_memory_report *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Master weights, states and buffers, numerics checks, checkpoints. */
#include "flashopt_state.h"
/* Data parallelism: communicators, attaching them, gradient buckets. */
#include "flashopt_dist.h"

#endif /* FLASHOPT_H */
