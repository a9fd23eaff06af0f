/*===- CApiC.c - flashopt.h from C ------------------------------------------===*
 *
 * Part of flashopt.
 *
 *===----------------------------------------------------------------------===*
 *
 * Compiled as C99 with -Wall -Wextra -Wstrict-prototypes -pedantic: the
 * header is valid C and the library is usable from C. CApiTest.cpp calls
 * flashopt_c_smoke.
 *
 *===----------------------------------------------------------------------===*/

#include "flashopt/flashopt.h"

#include <dlpack/dlpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One life of an f32 optimizer (bundle_dir: an adamw_f32 bundle) from C:
 * returns 0, or the line of the first failure (its message in `why`). */
int flashopt_c_smoke(const char *bundle_dir, const char *ckpt, char *why,
                     size_t why_size);

#define CHECK_OK(call)                                                         \
  do {                                                                         \
    if ((call) != FLASHOPT_OK) {                                               \
      snprintf(why, why_size, "%s: %s", #call, flashopt_last_error());         \
      return __LINE__;                                                         \
    }                                                                          \
  } while (0)

int flashopt_c_smoke(const char *bundle_dir, const char *ckpt, char *why,
                     size_t why_size) {
  flashopt_context ctx;
  flashopt_optimizer opt;
  flashopt_optimizer_info info;
  flashopt_memory_report report;
  DLTensor param, grad;
  int64_t shape[2] = {8, 16};
  int64_t index = -1, step = 0;
  float *w = NULL, *g = NULL;
  float master[128];
  int i;

  if (posix_memalign((void **)&w, 64, 128 * sizeof(float)) != 0 ||
      posix_memalign((void **)&g, 64, 128 * sizeof(float)) != 0) {
    snprintf(why, why_size, "out of memory");
    return __LINE__;
  }
  for (i = 0; i < 128; ++i) {
    w[i] = 1.0f + (float)i / 128.0f;
    g[i] = 0.01f * (float)(i % 5);
  }
  memset(&param, 0, sizeof param);
  param.data = w;
  param.device.device_type = kDLCPU;
  param.device.device_id = 0;
  param.ndim = 2;
  param.dtype.code = kDLFloat;
  param.dtype.bits = 32;
  param.dtype.lanes = 1;
  param.shape = shape;
  grad = param;
  grad.data = g;

  CHECK_OK(flashopt_context_create(FLASHOPT_DEVICE_CPU, 0, &ctx));
  CHECK_OK(flashopt_optimizer_create(ctx, bundle_dir, &opt));
  CHECK_OK(flashopt_optimizer_get_info(opt, &info));
  if (info.param_dtype != FLASHOPT_F32 || info.has_correction) {
    snprintf(why, why_size, "%s is not an f32 spec", info.name);
    return __LINE__;
  }
  CHECK_OK(flashopt_set_hyper(opt, -1, "lr", 1e-2));
  CHECK_OK(flashopt_add_param_dlpack(opt, 0, "w", &param, &grad, &index));
  CHECK_OK(flashopt_step(opt));
  CHECK_OK(flashopt_step_param(opt, index));
  CHECK_OK(flashopt_get_step(opt, index, &step));
  if (step != 2 || w[5] == 1.0f + 5.0f / 128.0f) {
    snprintf(why, why_size, "the steps did not happen");
    return __LINE__;
  }
  CHECK_OK(flashopt_memory_report_get(opt, &report));
  CHECK_OK(flashopt_export_master_f32(opt, index, master, 128));
  if (memcmp(master, w, sizeof master) != 0) {
    snprintf(why, why_size, "f32 master != parameter");
    return __LINE__;
  }
  CHECK_OK(flashopt_save_checkpoint(opt, ckpt, FLASHOPT_CHECKPOINT_COMPRESSED));
  CHECK_OK(flashopt_load_checkpoint(opt, ckpt));
  if (flashopt_step(NULL) != FLASHOPT_ERROR_INVALID_HANDLE ||
      strstr(flashopt_last_error(), "flashopt_step") == NULL) {
    snprintf(why, why_size, "a NULL handle was not reported");
    return __LINE__;
  }
  CHECK_OK(flashopt_optimizer_destroy(opt));
  CHECK_OK(flashopt_context_destroy(ctx));
  free(w);
  free(g);
  return 0;
}
