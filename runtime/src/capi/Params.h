//===- Params.h - Registering parameters and gradients ----------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See Params.cpp.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_PARAMS_H
#define FLASHOPT_CAPI_PARAMS_H

#include "Objects.h"

namespace flashopt::capi {

/// addParam's `elementOffset` for a whole tensor (flashopt_add_param); a
/// piece (flashopt_add_param_piece) passes its offset in the logical tensor.
inline constexpr int64_t kWholeTensor = -1;

/// Registers a parameter after the common checks: a whole tensor, or with
/// `elementOffset` >= 0 a piece of one (a multiple of the group size; its
/// addresses need only the backend's alignment).
void addParam(OptObj &o, int32_t group, const char *cname, void *param,
              flashopt_dtype pdt, int64_t numel, const void *grad,
              flashopt_dtype gdt, std::vector<int64_t> shape,
              int64_t *out_index, int64_t elementOffset = kWholeTensor);

/// Re-points parameter `index`'s gradient after the common checks.
void setGrad(OptObj &o, int64_t index, const void *grad, flashopt_dtype dt,
             int64_t numel);
/// The checks of setGrad alone (nothing changes).
void checkGrad(OptObj &o, int64_t index, const void *grad, flashopt_dtype dt,
               int64_t numel);
/// Re-points parameter `index`'s gradient (checked by checkGrad).
void applyGrad(OptObj &o, int64_t index, const void *grad);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_PARAMS_H
