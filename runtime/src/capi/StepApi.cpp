//===- StepApi.cpp - The C ABI: stepping -----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_step (data-parallel agreement and reduction, clipping, one
/// kernel call per distinct step counter), flashopt_step_param (gradient
/// release), clipping, counters, the NaN policy, synchronize and the memory
/// report.
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

namespace flashopt::capi {
/// FNV-1a over the bytes of the hyper table (the ranks compare it).
uint64_t hyperHash(const OptObj &o) {
  const std::vector<float> &v = o.opt->hyper_table();
  uint64_t h = 0xcbf29ce484222325ULL;
  const unsigned char *p = reinterpret_cast<const unsigned char *>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}
} // namespace flashopt::capi

extern "C" {

// ---- stepping
// ------------------------------------------------------------------------

flashopt_status flashopt_step(flashopt_optimizer opt) {
  return guard("flashopt_step", [&] {
    Locked o(opt);
    if (accumulationPending(*o)) {
      stepAccumulated(*o);
      return;
    }
    std::vector<int64_t> all(o->params.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = int64_t(i);
    checkStepReady(*o, all);
    if (o->dp) {
      // Data parallel: the ranks agree on the step (policy, clipping,
      // hyper-parameters, counter) and on skipping it; then the gradients
      // are averaged.
      flashopt::dist::DataParallel::StepView view;
      view.skip_policy = o->policy == FLASHOPT_NONFINITE_SKIP;
      view.finite = !view.skip_policy || gradsFinite(*o, all);
      view.max_grad_norm = o->maxGradNorm;
      view.hyper_hash = hyperHash(*o);
      view.step = o->globalStep;
      view.normalizer = o->accumNormalizer;
      Expected<bool> skip = o->dp->agree(view);
      if (!skip) {
        o->dp->step_done();
        fail(skip.error().find("disagree") != std::string::npos
                 ? FLASHOPT_ERROR_MISMATCH
                 : FLASHOPT_ERROR_COMM,
             skip.error());
      }
      if (*skip) {
        o->dp->step_done();
        ++o->skipped;
        return;
      }
      o->dp->set_full_grads(o->maxGradNorm > 0.0);
      Status r = o->dp->reduce_remaining(*o->opt);
      o->dp->step_done();
      if (!r)
        fail(FLASHOPT_ERROR_COMM, r.message());
    } else if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, all)) {
      ++o->skipped;
      return;
    }
    // Clipping folds its factor into grad_scale for this step only.
    std::vector<float> saved = applyClipping(*o);
    if (o->dp && o->dp->sharded()) {
      // Sharded: the owners step their shards, then the parameters are
      // all-gathered (no gradient release here: one step counter).
      Status s = o->dp->step_shards(*o->opt, o->globalStep + 1);
      restoreGradScales(*o, saved);
      if (!s)
        stepFailure(*o, s);
      for (ParamRec &p : o->params)
        ++p.step;
      ++o->globalStep;
      o->opt->set_step_count(o->globalStep);
      return;
    }
    // One kernel call per distinct step counter (one when all are equal).
    std::map<int64_t, std::vector<int64_t>> byStep;
    for (size_t i = 0; i < o->params.size(); ++i)
      byStep[o->params[i].step].push_back(int64_t(i));
    for (const auto &kv : byStep) {
      Status s = o->opt->step_tensors(kv.second, kv.first + 1);
      if (!s) {
        restoreGradScales(*o, saved);
        stepFailure(*o, s);
      }
    }
    restoreGradScales(*o, saved);
    for (ParamRec &p : o->params)
      ++p.step;
    ++o->globalStep;
    o->opt->set_step_count(o->globalStep);
  });
}

flashopt_status flashopt_step_param(flashopt_optimizer opt, int64_t index) {
  return guard("flashopt_step_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    if (accumulationPending(*o))
      fail(FLASHOPT_ERROR_STATE,
           o->describe(index) + ": gradient release is not possible with "
                                "gradient accumulation (micro-batches are "
                                "accumulated; end them with flashopt_step)");
    if (o->maxGradNorm > 0.0)
      fail(FLASHOPT_ERROR_STATE,
           o->describe(index) + ": gradient release is not possible with "
                                "gradient-norm clipping (it needs every "
                                "gradient first)");
    if (o->dp)
      fail(FLASHOPT_ERROR_STATE,
           o->describe(index) + ": gradient release is not possible with " +
                                std::string(o->dp->sharded() ? "sharded" : "replicated") +
                                " data parallelism (the gradients are averaged "
                                "over the ranks in flashopt_step)");
    std::vector<int64_t> one{index};
    checkStepReady(*o, one);
    if (o->policy == FLASHOPT_NONFINITE_SKIP && !gradsFinite(*o, one)) {
      ++o->skipped;
      return;
    }
    ParamRec &p = o->params[size_t(index)];
    Status s = o->opt->step_tensors(one, p.step + 1);
    if (!s)
      stepFailure(*o, s);
    ++p.step;
  });
}

flashopt_status flashopt_set_max_grad_norm(flashopt_optimizer opt,
                                           double max_norm) {
  return guard("flashopt_set_max_grad_norm", [&] {
    Locked o(opt);
    if (!std::isfinite(max_norm) || max_norm < 0.0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "max_norm must be finite and >= 0 (0 turns clipping off), got " +
               fmt(max_norm));
    if (max_norm > 0.0 && o->isGpu())
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "gradient-norm clipping is not supported on CUDA contexts yet (it "
           "needs a device-side reduction)");
    if (max_norm > 0.0 &&
        o->m->hyper_index(flashopt::abi::kGradScaleHyper) < 0)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           o->m->name + " has no \"grad_scale\" hyper-parameter (a bundle "
                        "from an older flashopt-gen): regenerate it");
    o->maxGradNorm = max_norm;
    if (max_norm == 0.0)
      o->lastGradNorm = -1.0;
  });
}

flashopt_status flashopt_get_grad_norm(flashopt_optimizer opt, double *out) {
  return guard("flashopt_get_grad_norm", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->lastGradNorm;
  });
}

flashopt_status flashopt_get_step(flashopt_optimizer opt, int64_t index,
                                  int64_t *out) {
  return guard("flashopt_get_step", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index == -1) {
      *out = o->globalStep;
      return;
    }
    checkIndex(*o, index);
    *out = o->params[size_t(index)].step;
  });
}

flashopt_status
flashopt_set_nonfinite_policy(flashopt_optimizer opt,
                              flashopt_nonfinite_policy policy) {
  return guard("flashopt_set_nonfinite_policy", [&] {
    Locked o(opt);
    if (policy != FLASHOPT_NONFINITE_PROPAGATE &&
        policy != FLASHOPT_NONFINITE_SKIP)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "unknown policy " + std::to_string(int(policy)));
    if (policy == FLASHOPT_NONFINITE_SKIP && o->isGpu())
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "FLASHOPT_NONFINITE_SKIP is not supported on CUDA contexts yet "
           "(it needs a device-side gradient scan)");
    o->policy = policy;
  });
}

flashopt_status flashopt_get_skipped_steps(flashopt_optimizer opt,
                                           int64_t *out) {
  return guard("flashopt_get_skipped_steps", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->skipped;
  });
}

flashopt_status flashopt_synchronize(flashopt_optimizer opt) {
  return guard("flashopt_synchronize", [&] {
    Locked o(opt);
    Status s = o->opt->synchronize();
    if (!s)
      fail(o->deviceError(), s.message());
  });
}

// ---- memory report
// ------------------------------------------------------------------

flashopt_status flashopt_memory_report_get(flashopt_optimizer opt,
                                           flashopt_memory_report *out) {
  return guard("flashopt_memory_report_get", [&] {
    needOut(out, "out");
    Locked o(opt);
    BytesReport b = o->opt->bytes();
    if (o->dp && o->dp->sharded()) {
      // This rank's shard of the correction terms and states.
      BytesReport s = o->dp->shard_bytes();
      b.correction += s.correction;
      b.states += s.states;
      b.total += s.correction + s.states;
      b.total_with_grad_release += s.correction + s.states;
      b.runtime_allocated += s.runtime_allocated;
    }
    flashopt_memory_report r{};
    r.numel = b.numel;
    r.param_bytes = b.param;
    r.correction_bytes = b.correction;
    r.grad_bytes = b.grad;
    r.state_bytes = b.states;
    r.total_bytes = b.total;
    r.total_bytes_with_grad_release = b.total_with_grad_release;
    r.allocated_bytes = b.runtime_allocated;
    r.accumulator_bytes = b.accumulator;
    r.bytes_per_param = b.numel ? double(b.total) / double(b.numel) : 0.0;
    r.bytes_per_param_with_grad_release =
        b.numel ? double(b.total_with_grad_release) / double(b.numel) : 0.0;
    *out = r;
  });
}

} // extern "C"
