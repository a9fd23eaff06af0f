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
  if (o.dp && o.dp->any_reduced())
    fail(FLASHOPT_ERROR_STATE,
         "a bucket's gradients were already reduced for this step "
         "(flashopt_reduce_bucket); with accumulation flashopt_step reduces "
         "the accumulators instead");
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

namespace {

/// Sets every param group's grad_scale to `factor` times its value;
/// returns the values to restore.
std::vector<float> scaleGradScales(OptObj &o, float factor) {
  const int groups = o.opt->num_param_groups();
  std::vector<float> saved(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    Expected<float> v = o.opt->hyper(g, flashopt::abi::kGradScaleHyper);
    if (!v)
      fail(FLASHOPT_ERROR_INTERNAL, v.error());
    saved[size_t(g)] = *v;
  }
  for (int g = 0; g < groups; ++g) {
    Status st = o.opt->set_hyper(g, flashopt::abi::kGradScaleHyper,
                                 saved[size_t(g)] * factor);
    if (!st) {
      restoreGradScales(o, saved);
      fail(FLASHOPT_ERROR_INTERNAL, st.message());
    }
  }
  return saved;
}

/// The counters after a step that ended an accumulation.
void finishStep(OptObj &o) {
  for (ParamRec &p : o.params) {
    ++p.step;
    p.accumulated = 0;
  }
  ++o.globalStep;
  o.opt->set_step_count(o.globalStep);
}

/// The single-process fast path: the fused step adds this last
/// micro-batch in registers (one pass over memory fewer).
void stepFused(OptObj &o, int64_t n) {
  const double normalizer =
      o.accumNormalizer > 0.0 ? o.accumNormalizer : double(n + 1);
  std::vector<float> saved = scaleGradScales(o, float(1.0 / normalizer));
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
  finishStep(o);
}

/// Zeroes every accumulator (a skipped step): the micro-batches are
/// dropped, nothing else changes.
void dropAccumulation(OptObj &o) {
  Status z = o.dp ? o.dp->zero_accumulators(*o.opt)
                  : o.opt->zero_accumulators();
  if (!z)
    fail(o.deviceError(), "zeroing the accumulators: " + z.message());
  for (ParamRec &p : o.params)
    p.accumulated = 0;
  ++o.skipped;
}

} // namespace

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
  const bool skipPolicy = o.policy == FLASHOPT_NONFINITE_SKIP;
  if (!o.dp && o.maxGradNorm <= 0.0 && !skipPolicy) {
    stepFused(o, n);
    return;
  }
  // Something must be decided over the whole accumulated gradient (its
  // norm, its finiteness) or it must be reduced over the ranks first: this
  // step's gradient, micro-batch n + 1, joins the accumulator before.
  const int64_t N = n + 1;
  if (o.dp) {
    // The ranks agree on the step first (policy, clipping, hypers,
    // counter, micro-batches, normalizer): nothing has changed if not.
    flashopt::dist::DataParallel::StepView view;
    view.skip_policy = skipPolicy;
    view.max_grad_norm = o.maxGradNorm;
    view.hyper_hash = hyperHash(o);
    view.step = o.globalStep;
    view.micro_batches = N;
    view.normalizer = o.accumNormalizer;
    Expected<bool> skip = o.dp->agree(view);
    if (!skip)
      fail(skip.error().find("disagree") != std::string::npos
               ? FLASHOPT_ERROR_MISMATCH
               : FLASHOPT_ERROR_COMM,
           skip.error());
  }
  if (Status s = o.opt->accumulate_tensors(all); !s)
    stepFailure(o, s);
  for (ParamRec &p : o.params)
    p.accumulated = N;
  const int W = o.dp ? o.dp->comm().size() : 1;
  if (o.dp) {
    // Sharded with clipping: every rank gets the whole reduced sum, so the
    // norm is over the same bits as in replicated mode.
    o.dp->set_full_grads(o.maxGradNorm > 0.0);
    Status r = o.dp->reduce_accumulators(*o.opt);
    o.dp->step_done();
    if (!r)
      fail(FLASHOPT_ERROR_COMM, r.message());
  }
  if (skipPolicy) {
    Expected<bool> finite = o.dp ? o.dp->accumulators_finite(*o.opt)
                                 : o.opt->accumulators_finite(all);
    if (!finite)
      fail(o.dp ? FLASHOPT_ERROR_COMM : FLASHOPT_ERROR_UNSUPPORTED,
           finite.error());
    if (!*finite) {
      dropAccumulation(o);
      return;
    }
  }
  const double normalizer = o.accumNormalizer > 0.0
                                ? o.accumNormalizer
                                : double(N) * double(W);
  std::vector<float> saved = scaleGradScales(o, float(1.0 / normalizer));
  // The norm of the accumulated gradient times 1/(N * W): the clip factor
  // joins grad_scale (what applyClipping returns is the scaled values;
  // `saved` restores the caller's).
  (void)applyClipping(o, /*accumulated=*/true);
  if (o.dp && o.dp->sharded()) {
    Status s = o.dp->step_shards(*o.opt, o.globalStep + 1,
                                 flashopt::abi::KernelKind::StepAccumulated);
    restoreGradScales(o, saved);
    if (!s)
      stepFailure(o, s);
    // The owners' kernel zeroed the shards' accumulators; this rank's own
    // sums are zeroed here.
    if (Status z = o.opt->zero_accumulators(); !z)
      fail(o.deviceError(), "zeroing the accumulators: " + z.message());
    finishStep(o);
    return;
  }
  std::map<int64_t, std::vector<int64_t>> byStep;
  for (size_t i = 0; i < o.params.size(); ++i)
    byStep[o.params[i].step].push_back(int64_t(i));
  for (const auto &kv : byStep) {
    Status s = o.opt->step_tensors(kv.second, kv.first + 1,
                                   flashopt::abi::KernelKind::StepAccumulated);
    if (!s) {
      restoreGradScales(o, saved);
      stepFailure(o, s);
    }
  }
  restoreGradScales(o, saved);
  // step_accumulated zeroed the accumulators.
  finishStep(o);
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
