//===- StepApi.cpp - The C ABI: stepping ----------------------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// flashopt_step, flashopt_step_param (gradient release), clipping, counters
/// and the non-finite policy: each one call on the optimizer's
/// train::Stepper (train/Stepper.h, where a step's semantics live); and
/// synchronize and the memory report.
///
//===----------------------------------------------------------------------===//

#include "flashopt/flashopt.h"

#include "Errors.h"
#include "Handles.h"
#include "Objects.h"

using namespace flashopt::capi;

extern "C" {

// ---- stepping -----------------------------------------------------------

flashopt_status flashopt_step(flashopt_optimizer opt) {
  return guard("flashopt_step", [&] {
    Locked o(opt);
    o->check(o->stepper->step());
  });
}

flashopt_status flashopt_step_external(flashopt_optimizer opt,
                                       const int64_t *indices, int64_t count,
                                       const int64_t *param_ids,
                                       int64_t num_param_ids, int32_t found_inf,
                                       flashopt_status error_status,
                                       const char *error, int32_t *stepped) {
  return guard("flashopt_step_external", [&] {
    Locked o(opt);
    std::vector<int64_t> idx;
    if (indices) {
      if (count < 0)
        fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
             "count must be >= 0, got " + std::to_string(count));
      idx.assign(indices, indices + count);
      for (int64_t i : idx)
        checkIndex(*o, i);
    } else {
      for (int64_t i = 0; i < int64_t(o->params.size()); ++i)
        idx.push_back(i);
    }
    flashopt::train::Stepper::ExternalStep mine;
    mine.found_inf = found_inf != 0;
    if (num_param_ids < 0 || (num_param_ids > 0 && !param_ids))
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "param_ids must hold num_param_ids >= 0 ids, got " +
               std::to_string(num_param_ids));
    if (num_param_ids > 0)
      mine.params.assign(param_ids, param_ids + num_param_ids);
    if (error_status != FLASHOPT_OK)
      mine.error = flashopt::abi::Status::error(
          flashopt::abi::Code(int(error_status)),
          error ? std::string(error) : std::string("no reason given"));
    Expected<bool> r = o->stepper->step_external(idx, mine);
    if (!r)
      o->check(r.status());
    if (stepped)
      *stepped = *r ? 1 : 0;
  });
}

flashopt_status flashopt_get_external_step(flashopt_optimizer opt,
                                           int64_t param_id, int64_t *out) {
  return guard("flashopt_get_external_step", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->stepper->external_step(param_id);
  });
}

flashopt_status flashopt_set_external_step(flashopt_optimizer opt,
                                           int64_t param_id, int64_t step) {
  return guard("flashopt_set_external_step", [&] {
    if (step < 0)
      fail(FLASHOPT_ERROR_INVALID_ARGUMENT,
           "step must be >= 0, got " + std::to_string(step));
    Locked o(opt);
    o->stepper->set_external_step(param_id, step);
  });
}

flashopt_status flashopt_step_param(flashopt_optimizer opt, int64_t index) {
  return guard("flashopt_step_param", [&] {
    Locked o(opt);
    checkIndex(*o, index);
    o->check(o->stepper->step_tensor(index));
  });
}

flashopt_status flashopt_set_max_grad_norm(flashopt_optimizer opt,
                                           double max_norm) {
  return guard("flashopt_set_max_grad_norm", [&] {
    Locked o(opt);
    o->check(o->stepper->set_max_grad_norm(max_norm));
  });
}

flashopt_status flashopt_get_grad_norm(flashopt_optimizer opt, double *out) {
  return guard("flashopt_get_grad_norm", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->stepper->last_grad_norm();
  });
}

flashopt_status flashopt_get_step(flashopt_optimizer opt, int64_t index,
                                  int64_t *out) {
  return guard("flashopt_get_step", [&] {
    needOut(out, "out");
    Locked o(opt);
    if (index == -1) {
      *out = o->stepper->step_count();
      return;
    }
    checkIndex(*o, index);
    *out = o->stepper->tensor_step(index);
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
    o->check(o->stepper->set_nonfinite_policy(
        policy == FLASHOPT_NONFINITE_SKIP
            ? flashopt::train::NonFinitePolicy::Skip
            : flashopt::train::NonFinitePolicy::Propagate));
  });
}

flashopt_status flashopt_get_skipped_steps(flashopt_optimizer opt,
                                           int64_t *out) {
  return guard("flashopt_get_skipped_steps", [&] {
    needOut(out, "out");
    Locked o(opt);
    *out = o->stepper->skipped_steps();
  });
}

flashopt_status flashopt_synchronize(flashopt_optimizer opt) {
  return guard("flashopt_synchronize", [&] {
    Locked o(opt);
    o->check(o->opt->synchronize());
  });
}

// ---- memory report ------------------------------------------------------

flashopt_status flashopt_memory_report_get(flashopt_optimizer opt,
                                           flashopt_memory_report *out) {
  return guard("flashopt_memory_report_get", [&] {
    needOut(out, "out");
    Locked o(opt);
    BytesReport b = o->opt->bytes();
    if (o->dp() && o->dp()->sharded()) {
      // This rank's shard of the correction terms and states.
      BytesReport s = o->dp()->shard_bytes();
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
