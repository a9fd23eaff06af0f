//===- AccumulateApi.cpp - The C ABI: gradient accumulation ---------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_accumulate / flashopt_accumulate_param (the bundle's generated
/// accumulate kernel: accum = encode(decode(accum) + grad)), the
/// normalizer, and the step that ends an accumulation: flashopt_step then
/// runs the fused step kernel, which adds this last micro-batch's gradient
/// to the accumulator in registers, scales it once by 1/N (or 1/normalizer)
/// through "grad_scale", steps, and zeroes the accumulator
/// (docs/RUNTIME.md "Gradient accumulation").
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Errors.h"
#include "Handles.h"
#include "Objects.h"
#include "Stepping.h"

#include <cmath>
#include <map>
#include <vector>

using namespace flashopt::capi;

namespace {

/// Why accumulation cannot run on `o` now, or nothing.
void checkCanAccumulate(OptObj &o) {
  if (!o.m->accumulator)
    fail(FLASHOPT_ERROR_UNSUPPORTED,
         o.m->name + " has no gradient accumulator: its spec has no "
                     "\"accumulator\" (add \"accumulator\": \"f32\", "
                     "\"bf16+i8\" or \"bf16\" and regenerate the bundle; "
                     "docs/SPEC.md)");
  if (o.isGpu())
    fail(FLASHOPT_ERROR_UNSUPPORTED,
         "gradient accumulation is not supported on CUDA contexts yet (the "
         "bundle has the GPU kernels; the CUDA runtime does not load them "
         "yet)");
  if (o.dp)
    fail(FLASHOPT_ERROR_UNSUPPORTED,
         "gradient accumulation together with replicated data parallelism is "
         "not supported yet (the reduction would have to reduce the "
         "accumulator)");
  if (o.maxGradNorm > 0.0)
    fail(FLASHOPT_ERROR_UNSUPPORTED,
         "gradient accumulation together with gradient-norm clipping is not "
         "supported yet (the norm would have to be of the accumulated "
         "gradient)");
  if (o.policy == FLASHOPT_NONFINITE_SKIP)
    fail(FLASHOPT_ERROR_UNSUPPORTED,
         "gradient accumulation together with FLASHOPT_NONFINITE_SKIP is not "
         "supported yet (the scan would have to be of the accumulated "
         "gradient)");
}

void accumulate(OptObj &o, const std::vector<int64_t> &idx) {
  checkCanAccumulate(o);
  checkStepReady(o, idx);
  Status s = o.opt->accumulate_tensors(idx);
  if (!s)
    stepFailure(o, s);
  for (int64_t i : idx)
    ++o.params[size_t(i)].accumulated;
}

} // namespace

namespace flashopt::capi {

bool accumulationPending(const OptObj &o) {
  for (const ParamRec &p : o.params)
    if (p.accumulated > 0)
      return true;
  return false;
}

void stepAccumulated(OptObj &o) {
  checkCanAccumulate(o);
  std::vector<int64_t> all(o.params.size());
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = int64_t(i);
  // One scale for everything: every parameter must have the same number of
  // micro-batches.
  const int64_t n = o.params.front().accumulated;
  for (size_t i = 1; i < o.params.size(); ++i)
    if (o.params[i].accumulated != n)
      fail(FLASHOPT_ERROR_STATE,
           o.describe(int64_t(i)) + " has " +
               std::to_string(o.params[i].accumulated) +
               " accumulated micro-batches but " + o.describe(0) + " has " +
               std::to_string(n) +
               ": flashopt_step needs the same number for every parameter");
  checkStepReady(o, all);
  // This step's gradient is micro-batch n + 1.
  const double normalizer =
      o.accumNormalizer > 0.0 ? o.accumNormalizer : double(n + 1);
  const float factor = float(1.0 / normalizer);
  const int groups = o.opt->num_param_groups();
  std::vector<float> saved(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    Expected<float> v = o.opt->hyper(g, flashopt::abi::kGradScaleHyper);
    if (!v)
      fail(FLASHOPT_ERROR_INTERNAL, v.error());
    saved[size_t(g)] = *v;
    Status st =
        o.opt->set_hyper(g, flashopt::abi::kGradScaleHyper, *v * factor);
    if (!st)
      fail(FLASHOPT_ERROR_INTERNAL, st.message());
  }
  std::map<int64_t, std::vector<int64_t>> byStep;
  for (size_t i = 0; i < o.params.size(); ++i)
    byStep[o.params[i].step].push_back(int64_t(i));
  for (const auto &kv : byStep) {
    Status s = o.opt->step_tensors(kv.second, kv.first + 1,
                                   flashopt::abi::KernelKind::StepFused);
    if (!s) {
      restoreGradScales(o, saved);
      stepFailure(o, s);
    }
  }
  restoreGradScales(o, saved);
  // The fused kernel zeroed the accumulators.
  for (ParamRec &p : o.params) {
    ++p.step;
    p.accumulated = 0;
  }
  ++o.globalStep;
  o.opt->set_step_count(o.globalStep);
}

} // namespace flashopt::capi

extern "C" {

flashopt_status flashopt_accumulate(flashopt_optimizer opt) {
  return guard("flashopt_accumulate", [&] {
    Locked o(opt);
    std::vector<int64_t> all(o->params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    accumulate(*o, all);
  });
}

flashopt_status flashopt_accumulate_param(flashopt_optimizer opt,
                                          int64_t index) {
  return guard("flashopt_accumulate_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    accumulate(*o, {index});
  });
}

flashopt_status flashopt_set_accumulation_normalizer(flashopt_optimizer opt,
                                                     double normalizer) {
  return guard("flashopt_set_accumulation_normalizer", [&] {
    Locked o(opt);
    if (!std::isfinite(normalizer) || normalizer < 0.0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "normalizer must be finite and >= 0 (0: the number of "
           "micro-batches), got " +
               fmt(normalizer));
    o->accumNormalizer = normalizer;
  });
}

flashopt_status flashopt_get_accumulated(flashopt_optimizer opt, int64_t index,
                                         int64_t *out) {
  return guard("flashopt_get_accumulated", [&] {
    needOut(out, "out");
    Locked o(opt);
    checkIndex(*o, index);
    *out = o->params[size_t(index)].accumulated;
  });
}

} // extern "C"
