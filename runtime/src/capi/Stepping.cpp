//===- Stepping.cpp - The checks and failures of a step
//--------------------===//
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

#include <cmath>

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

std::vector<float> applyClipping(OptObj &o, bool accumulated) {
  if (o.maxGradNorm <= 0.0)
    return {};
  const char *gs = flashopt::abi::kGradScaleHyper;
  std::vector<int64_t> all(o.params.size());
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = int64_t(i);
  Expected<std::vector<double>> ss = accumulated
                                         ? o.opt->accumulator_sum_squares(all)
                                         : o.opt->grad_sum_squares(all);
  if (!ss)
    fail(FLASHOPT_ERROR_UNSUPPORTED, ss.error());
  const int groups = o.opt->num_param_groups();
  std::vector<float> scales(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    Expected<float> v = o.opt->hyper(g, gs);
    if (!v)
      fail(FLASHOPT_ERROR_UNSUPPORTED,
           "gradient clipping needs the kernels' \"grad_scale\" (rebuild the "
           "bundle with this flashopt-gen): " +
               v.error());
    scales[size_t(g)] = *v;
  }
  double total = 0.0; // in tensor order
  for (size_t i = 0; i < all.size(); ++i) {
    double s = double(scales[size_t(o.params[i].group)]);
    total += (*ss)[i] * s * s;
  }
  const double norm = std::sqrt(total);
  o.lastGradNorm = norm;
  if (!(norm > o.maxGradNorm)) // also when the norm is NaN
    return {};
  const float clip = float(o.maxGradNorm / (norm + 1e-6));
  for (int g = 0; g < groups; ++g) {
    Status st = o.opt->set_hyper(g, gs, scales[size_t(g)] * clip);
    if (!st)
      fail(FLASHOPT_ERROR_INTERNAL, st.message());
  }
  return scales;
}

void restoreGradScales(OptObj &o, const std::vector<float> &saved) {
  for (size_t g = 0; g < saved.size(); ++g)
    (void)o.opt->set_hyper(int(g), flashopt::abi::kGradScaleHyper, saved[g]);
}

} // namespace flashopt::capi
