/*===- flashopt_state.h - The libflashopt C ABI: state in and out --*- C -*-===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * What an optimizer holds, in and out: fp32 master weights and states, raw
 * buffers, the master-weight codec without an optimizer, check_numerics, and
 * checkpoints (safetensors files or bytes). Part of the C ABI of flashopt.h,
 * which includes this header: include that one.
 *
 *===----------------------------------------------------------------------===*/

#ifndef FLASHOPT_STATE_H
#define FLASHOPT_STATE_H

#include "flashopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/*===----------------------------------------------------------------------===*
 * Master weights and numerics
 *===----------------------------------------------------------------------===*/

/** Writes the fp32 master weight of parameter `index` (the parameter plus its
 *  correction term, docs/NUMERICS.md §1.4; the parameter itself when there is
 *  no correction) to `out`, `numel` floats of host memory. */
FLASHOPT_API flashopt_status flashopt_export_master_f32(flashopt_optimizer opt,
                                                        int64_t index,
                                                        float *out,
                                                        int64_t numel);
/** Sets parameter `index` from fp32 master weights in host memory: the
 *  parameter becomes their RTNE narrowing and the correction term encodes the
 *  rest (docs/NUMERICS.md §1.3). States are left alone. */
FLASHOPT_API flashopt_status flashopt_import_master_f32(flashopt_optimizer opt,
                                                        int64_t index,
                                                        const float *in,
                                                        int64_t numel);

/** Writes state `state` (a name flashopt_state_name gives) of parameter
 *  `index`, decoded to fp32 (docs/NUMERICS.md §2: codes times scales,
 *  companded back), to `out`, `numel` floats of host memory: what a
 *  checkpoint's f32 form holds. Nothing is stepped or changed. */
FLASHOPT_API flashopt_status flashopt_export_state_f32(flashopt_optimizer opt,
                                                       int64_t index,
                                                       const char *state,
                                                       float *out,
                                                       int64_t numel);
/** Sets state `state` of parameter `index` from `numel` fp32 values in host
 *  memory, encoded as loading a checkpoint's f32 form encodes them
 *  (quantized states: per-group scales and codes rounded to nearest). The
 *  parameter, its correction term, other states and the step counters are
 *  left alone. */
FLASHOPT_API flashopt_status flashopt_import_state_f32(flashopt_optimizer opt,
                                                       int64_t index,
                                                       const char *state,
                                                       const float *in,
                                                       int64_t numel);

/** The size in bytes of buffer `buffer` of parameter `index` (a name
 *  flashopt_read_buffer takes) into `*bytes`: n elements (one per parameter
 *  element, or per group) of its dtype, (n + 1) / 2 bytes for the packed
 *  4-bit codes (FLASHOPT_I4/U4). The `size` flashopt_read_buffer and
 *  flashopt_write_buffer take. (ABI version 3.) */
FLASHOPT_API flashopt_status flashopt_buffer_size(flashopt_optimizer opt,
                                                  int64_t index,
                                                  const char *buffer,
                                                  size_t *bytes);

/** Copies buffer `buffer` of parameter `index` as the optimizer stores it,
 *  in its own dtype, to `size` bytes of host memory at `out` (`size` must be
 *  the buffer's size): "correction" (the master weight's correction term),
 *  "<state>.codes" and "<state>.scales" (a quantized state), or "<state>"
 *  (an unquantized one): the names of the compressed checkpoint form
 *  without the parameter's name. Nothing is changed. With sharded data
 *  parallelism a collective (the buffer is gathered). */
FLASHOPT_API flashopt_status flashopt_read_buffer(flashopt_optimizer opt,
                                                  int64_t index,
                                                  const char *buffer, void *out,
                                                  size_t size);

/** Overwrites buffer `buffer` of parameter `index` (a name
 *  flashopt_read_buffer takes) with `size` bytes of host memory at `in`, in
 *  the buffer's own dtype (`size` must be the buffer's size): the inverse of
 *  flashopt_read_buffer, e.g. a correction term saved beside its parameter.
 *  The bits are taken as they are, but for the pad nibble of packed 4-bit
 *  codes of odd length (the last byte's high nibble), which is stored as
 *  0. */
FLASHOPT_API flashopt_status flashopt_write_buffer(flashopt_optimizer opt,
                                                   int64_t index,
                                                   const char *buffer,
                                                   const void *in, size_t size);

/** The master-weight codec without an optimizer (docs/NUMERICS.md §1.3,
 *  §1.4), for tools that hold a parameter and its correction term, e.g. an
 *  inference export from a checkpoint: decodes `n` fp32 master weights from
 *  `param` (BF16 or F16; or F32 with no correction) and `correction` (I8 or
 *  I16; NULL, with any `correction_dtype`, for none) to `out`. The same bits
 *  as flashopt_export_master_f32 and the kernels. */
FLASHOPT_API flashopt_status flashopt_decode_master_f32(
    flashopt_dtype param_dtype, const void *param,
    flashopt_dtype correction_dtype, const void *correction, int64_t n,
    float *out);
/** Encodes `n` fp32 master weights into a parameter (their RTNE narrowing)
 *  and its correction term (NULL for none), as flashopt_import_master_f32. */
FLASHOPT_API flashopt_status flashopt_encode_master_f32(
    const float *in, int64_t n, flashopt_dtype param_dtype, void *param,
    flashopt_dtype correction_dtype, void *correction);

/** What check_numerics found for one parameter (docs/NUMERICS.md §4.3). */
typedef struct flashopt_numerics_report {
  int64_t params_checked;   /* parameters looked at */
  int64_t params_too_small; /* ... whose lr cannot move their largest weight */
  /* The first offending parameter (-1 when none), its param group, its
   * max |weight|, its lr, and the smallest lr that would move it. */
  int64_t first_param;
  int32_t first_group;
  double max_abs;
  double lr;
  double min_lr;
  int64_t nonfinite_params; /* parameters holding NaN or Inf */
} flashopt_numerics_report;

/** Checks that each param group's lr can still move the largest weight of
 *  each of its parameters given the master-weight precision. Fills `out`
 *  (may be NULL) and returns FLASHOPT_ERROR_NUMERICS, with a message naming
 *  the parameter, when some cannot (or a parameter holds NaN/Inf). */
FLASHOPT_API flashopt_status flashopt_check_numerics(flashopt_optimizer opt,
                                                     flashopt_numerics_report *out);

/*===----------------------------------------------------------------------===*
 * Checkpoints (safetensors)
 *===----------------------------------------------------------------------===*/

typedef enum flashopt_checkpoint_format {
  /** Native dtypes: parameters, correction terms, codes and scales as the
   *  optimizer holds them (AdamW bf16 + 24-bit master: 5.125 B/param). */
  FLASHOPT_CHECKPOINT_COMPRESSED = 0,
  /** Interoperable: fp32 master weights and fp32 (dequantized) states. */
  FLASHOPT_CHECKPOINT_F32 = 1
} flashopt_checkpoint_format;

/** Writes a safetensors file: tensors "<param>", "<param>.correction",
 *  "<param>.<state>.codes", "<param>.<state>.scales", "<param>.<state>"
 *  (COMPRESSED) or "<param>" (F32 master) and "<param>.<state>" (F32), with
 *  the spec hash, steps and hyper-parameters in __metadata__. Atomic: a
 *  temporary file in the same directory, fsync, rename; on failure the
 *  previous file at `path` is untouched. */
FLASHOPT_API flashopt_status
flashopt_save_checkpoint(flashopt_optimizer opt, const char *path,
                         flashopt_checkpoint_format format);
/** Loads a checkpoint written by flashopt_save_checkpoint (either format)
 *  into an optimizer of the same spec with the same parameters registered
 *  (names and sizes). Validates the header, offsets, sizes and dtypes before
 *  changing anything; another spec or other parameters are
 *  FLASHOPT_ERROR_MISMATCH. Restores parameters, correction terms, states,
 *  step counters and hyper-parameters: N steps, save, load, M steps equals
 *  N + M steps bit for bit (COMPRESSED). */
FLASHOPT_API flashopt_status flashopt_load_checkpoint(flashopt_optimizer opt,
                                                      const char *path);

/** The bytes flashopt_save_checkpoint would write to a file, in memory
 *  (no temporary file): `*data` is `*size` bytes the library allocated,
 *  released with flashopt_buffer_free. On failure `*data` and `*size` are
 *  unchanged. With sharded data parallelism every rank calls it (the state
 *  is gathered) and every rank gets the bytes. */
FLASHOPT_API flashopt_status
flashopt_save_checkpoint_buffer(flashopt_optimizer opt,
                                flashopt_checkpoint_format format, void **data,
                                size_t *size);
/** Loads checkpoint bytes in memory (`size` bytes at `data`, which the
 *  caller keeps: they are copied), as flashopt_load_checkpoint loads a
 *  file: the same validation, and nothing changed unless all of it fits. */
FLASHOPT_API flashopt_status
flashopt_load_checkpoint_buffer(flashopt_optimizer opt, const void *data,
                                size_t size);
/** Releases a buffer the library allocated (flashopt_save_checkpoint_buffer);
 *  NULL is ignored. */
FLASHOPT_API void flashopt_buffer_free(void *data);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHOPT_STATE_H */
