//===- Stepping.h - The checks and failures of a step ----------------------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What flashopt_step and flashopt_step_param check before running and how
/// a failed step maps to a status.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_CAPI_STEPPING_H
#define FLASHOPT_CAPI_STEPPING_H

#include "Objects.h"

namespace flashopt::capi {

/// Fails (STATE) unless tensors `idx` have gradients and every hyper
/// without default was set.
void checkStepReady(OptObj &o, const std::vector<int64_t> &idx);

/// Fails with the status of a failed step: STATE for an unset
/// hyper-parameter, else CUDA (GPU) or INTERNAL (CPU).
[[noreturn]] void stepFailure(OptObj &o, const Status &s);

/// With clipping on: the global gradient norm (recorded in
/// o.lastGradNorm) and, when it exceeds the maximum, every param group's
/// grad_scale multiplied by the clip factor; returns the values to restore
/// after the step (empty when nothing changed). `accumulated`: the norm of
/// the decoded accumulators (the accumulated, under data parallelism
/// reduced, gradient) times the grad_scale already set, not of the
/// gradients.
std::vector<float> applyClipping(OptObj &o, bool accumulated = false);
/// Restores the grad_scale values applyClipping returned.
void restoreGradScales(OptObj &o, const std::vector<float> &saved);

/// Whether the gradients of `idx` are all finite (UNSUPPORTED where the
/// backend cannot scan them).
bool gradsFinite(OptObj &o, const std::vector<int64_t> &idx);

/// Whether a parameter has accumulated micro-batches since the last step.
bool accumulationPending(const OptObj &o);
/// The step that ends an accumulation (AccumulateApi.cpp): the fused step
/// kernel over every parameter, the gradient scaled by 1/N or
/// 1/normalizer, the accumulators zeroed. With data parallelism, clipping
/// or the skip policy the last micro-batch is accumulated first, the
/// accumulators reduced over the ranks, the decisions taken on the result,
/// and step_accumulated steps (1/(N * W)).
void stepAccumulated(OptObj &o);
/// A hash of the hyper table, the same on ranks that set the same values.
uint64_t hyperHash(const OptObj &o);

} // namespace flashopt::capi

#endif // FLASHOPT_CAPI_STEPPING_H
