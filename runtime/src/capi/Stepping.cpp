//===- Stepping.cpp - The checks and failures of a step --------------------===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// See Stepping.h.
///
//===----------------------------------------------------------------------===//

#include "Stepping.h"

namespace flashopt::capi {

void checkStepReady(OptObj &o, const std::vector<int64_t> &idx) {
  for (int64_t i : idx)
    if (!o.opt->tensor(i).grad)
      fail(FLASHOPT_ERROR_STATE,
           o.describe(i) + " has no gradient (flashopt_add_param with a "
                           "grad, or flashopt_set_grad)");
  // An empty step checks the hyper table and runs nothing.
  Status s = o.opt->step_tensors({}, 0);
  if (!s)
    stepFailure(o, s);
}

[[noreturn]] void stepFailure(OptObj &o, const Status &s) {
  const std::string &m = s.message();
  if (m.find("never set") != std::string::npos)
    fail(FLASHOPT_ERROR_STATE, m);
  fail(o.deviceError(), m);
}

bool gradsFinite(OptObj &o, const std::vector<int64_t> &idx) {
  Expected<bool> finite = o.opt->grads_finite(idx);
  if (!finite)
    fail(FLASHOPT_ERROR_UNSUPPORTED, finite.error());
  return *finite;
}

} // namespace flashopt::capi
